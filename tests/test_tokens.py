"""TokenBatch: the per-token checks computed for many rows at once, written out by hand."""

import numpy as np
import pyarrow as pa

from reassembler.reasons import Reason
from reassembler.tokens import TokenBatch

IDS, F32 = pa.list_(pa.int64()), pa.list_(pa.float32())


def batch(ids, mask, lp):
    return TokenBatch(pa.array(ids, IDS), pa.array(mask, F32), pa.array(lp, F32))


def test_each_row_gets_its_own_first_fault():
    b = batch(
        ids=[[1, 2, 3], [], None, [5, -1], [7, 2**31], [1, 2], [1, 2], [1, 2], [1, 2], [3, 4]],
        mask=[[0, 1, 1], [], None, [0, 1], [0, 1], [0, 0.5], [1, 0], [0, 0], [0, 1], [0, 1]],
        lp=[[0, -1, -2], [], None, [0, -1], [0, -1], [0, -1], [-1, 0], [0, 0], [0, np.nan], [-0.25, -1]],
    )
    assert list(b.n_ids) == [3, 0, -1, 2, 2, 2, 2, 2, 2, 2]
    faults = [None if f is None else f[0] for f in map(b.token_fault, range(len(b)))]
    assert faults == [
        None,
        Reason.EMPTY_GENERATION,
        Reason.EMPTY_GENERATION,
        Reason.INVALID_TOKEN,
        Reason.INVALID_TOKEN,
        Reason.INVALID_MASK,
        Reason.INVALID_MASK,
        Reason.EMPTY_GENERATION,
        Reason.INVALID_LOGPROB,
        Reason.INVALID_LOGPROB,
    ]
    assert list(b.zeros) == [1, 0, 0, 1, 1, 1, 1, 2, 1, 1]


def test_null_values_inside_lists_are_faults_not_crashes():
    b = batch(ids=[[1, None]], mask=[[0, None]], lp=[[0, None]])
    assert b.token_fault(0)[0] == Reason.INVALID_TOKEN


def test_gather_joins_rows_end_to_end_and_cuts_training_rows():
    b = batch(ids=[[1, 2], [3], [4, 5, 6]], mask=[[0, 1], [1], [0, 0, 1]], lp=[[0, -1], [-2], [0, 0, -3]])
    offsets, ids, mask, lp = b.gather(np.array([2, 0, 1]), np.array([1, 2]))
    assert offsets.tolist() == [0, 3, 6]
    assert ids.tolist() == [4, 5, 6, 1, 2, 3] and mask.tolist() == [0, 0, 1, 0, 1, 1]
    assert lp.tolist() == [0, 0, -3, 0, -1, -2]
