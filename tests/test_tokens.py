"""TokenBatch: the per-token checks computed for many rows at once, written out by hand."""

import numpy as np
import pyarrow as pa

from reassembler.reasons import Reason
from reassembler.verify.tokens import TokenBatch

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


def test_a_batch_in_many_chunks_flattens_as_one():
    """fetch gives a batch as slices of several row groups: flattened, it is the same batch."""
    ids = [[1, 2, 3], [], None, [5, None], [7], [8, 9]]
    mask = [[0, 1, 1], [], None, [0, 1], [1], None]
    lp = [[0, -1, -2], [], None, [0, -1], [-3], [0, 0]]
    whole = batch(ids, mask, lp)
    cut = [slice(0, 2), slice(2, 3), slice(3, 6)]
    chunked = TokenBatch(
        *(pa.chunked_array([pa.array(v[c], t) for c in cut], t) for v, t in ((ids, IDS), (mask, F32), (lp, F32)))
    )
    for name in ("ids", "id_starts", "n_ids", "mask", "n_mask", "lp", "lp_starts", "n_lp", "ones", "zeros"):
        assert np.array_equal(getattr(chunked, name), getattr(whole, name), equal_nan=True), name
    assert [whole.token_fault(r) for r in range(6)] == [chunked.token_fault(r) for r in range(6)]


def test_ids_of_rows_end_to_end_are_the_rows_bytes_joined():
    b = batch(ids=[[1, 2], [3], [], None, [4, 5, 6], [7]], mask=[[0, 1]] * 6, lp=[[0, 0]] * 6)

    def joined(rows):
        return b"".join(bytes(p) for p in b.ids_be_of(rows))

    def one_by_one(rows):
        return b"".join(bytes(b.be_views(r)[0]) for r in rows)

    for rows in ([0, 1], [0, 1, 2, 3, 4], [4, 0], [1, 5], [5], [], [2, 3], [0, 0]):
        assert joined(rows) == one_by_one(rows), rows
    assert len(b.ids_be_of([0, 1, 2, 3, 4])) == 1  # adjacent rows: one slice
    assert joined([0, 1]) == np.array([1, 2, 3], ">u8").tobytes()


def test_a_logprob_under_mask_0_is_counted_in_a_batch_where_another_row_has_unequal_lengths():
    """Unequal mask and logprob lengths in one row (its own length_mismatch) switch the batch
    to row-by-row alignment: every other row is still checked."""
    ids = pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int64()))
    mask = pa.array([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]], pa.list_(pa.float32()))
    lp = pa.array([[0.0], [-1.0, -0.5], [0.0, -0.5]], pa.list_(pa.float32()))
    batch = TokenBatch(ids, mask, lp)
    assert batch.lp_under_zero.tolist() == [0, 1, 0]
    assert batch.token_fault(1) == (Reason.INVALID_LOGPROB, "1 logprobs not 0.0 under mask 0")
    assert batch.token_fault(2) is None
