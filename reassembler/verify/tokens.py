"""The token lists of a batch of call rows, flattened once and checked without Python loops.

A `TokenBatch` holds the three list columns of the token rows of many calls as flat numpy
arrays plus per-row start/length, and computes every per-token check of CONTRACT.md 3.3
for all rows at once (counts per row via cumulative sums). Per-call code then only reads
small per-row numbers and slices of the big-endian byte buffers used for the digests.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..formats.digests import to_be_bytes
from ..reasons import Reason

TOKEN_LIMIT = 2**31


def _flatten(column: pa.ChunkedArray | pa.Array, fill, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat values, row starts, row lengths with -1 for a null list)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    lengths_arrow = pc.list_value_length(column)
    lengths = pc.fill_null(lengths_arrow, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    flat = column.flatten()
    if flat.null_count:
        flat = pc.fill_null(flat, fill)
    values = flat.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    if lengths_arrow.null_count:
        lengths[lengths_arrow.is_null().to_numpy(zero_copy_only=False)] = -1
    return values, starts, lengths


def _per_row(flags: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """How many flags are set inside each row (flags are rare). Rows tile the flat array in
    order, so each set flag belongs to the last row starting at or before it (empty rows
    never do: they are skipped by searchsorted's `right` side)."""
    hits = np.flatnonzero(flags)
    if len(hits) == 0:
        return np.zeros(len(starts), dtype=np.int64)
    rows = np.searchsorted(starts, hits, side="right") - 1
    return np.bincount(rows, minlength=len(starts)).astype(np.int64)


def _row_sums(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each row's sum of `values` (float64), one pass. float32 values are summed as float32
    while every row is shorter than 2**24 values: a sum of 0s and 1s (the only rows whose
    sum is used) is then exact, and no float64 copy of the whole batch is made."""
    out = np.zeros(len(starts), dtype=np.float64)
    filled = lengths > 0
    if filled.any():
        exact = values.dtype == np.float32 and lengths.max() < 2**24
        out[filled] = np.add.reduceat(values, starts[filled], dtype=np.float32 if exact else np.float64)
    return out


class TokenBatch:
    def __init__(self, ids, mask, logprobs):
        self.ids, self.id_starts, self.n_ids = _flatten(ids, -1, np.int64)
        self.mask, self.mask_starts, self.n_mask = _flatten(mask, np.nan, np.float32)
        self.lp, self.lp_starts, self.n_lp = _flatten(logprobs, np.nan, np.float32)
        m, lp, starts = self.mask, self.lp, self.mask_starts

        # ids outside [0, 2**31): negative ids are huge as unsigned
        self.bad_ids = _per_row(self.ids.view(np.uint64) >= TOKEN_LIMIT, self.id_starts)
        zero = m == 0
        self.bad_mask_values = _per_row(~zero & (m != 1), starts)
        # a 1 followed by a 0 inside a row: flag position j when mask[j] < mask[j-1]
        drop = np.zeros(len(m), dtype=bool)
        np.less(m[1:], m[:-1], out=drop[1:])
        drop[starts[self.n_mask > 0]] = False  # the first value of a row has no predecessor
        self.mask_drops = _per_row(drop, starts)
        # ones and zeros: a sum per row where every value is 0 or 1, counted where not
        sums = _row_sums(m, starts, self.n_mask)
        sums[self.bad_mask_values > 0] = 0  # counted one by one below (a NaN would not cast)
        self.ones = sums.astype(np.int64)
        for i in np.flatnonzero(self.bad_mask_values):
            self.ones[i] = np.count_nonzero(m[starts[i] : starts[i] + self.n_mask[i]] == 1)
        self.zeros = np.maximum(self.n_mask, 0) - self.ones - self.bad_mask_values
        self.bad_lp = _per_row(~np.isfinite(lp), self.lp_starts)
        if np.array_equal(starts, self.lp_starts) and np.array_equal(self.n_mask, self.n_lp):
            self.lp_under_zero = _per_row(zero & (lp != 0), starts)
        else:  # rows of unequal lengths fail length_mismatch first; align the others row by row
            self.lp_under_zero = np.zeros(len(self.n_mask), dtype=np.int64)
            for i in np.flatnonzero((self.n_mask == self.n_lp) & (self.n_mask > 0)):
                ms, ls, n = starts[i], self.lp_starts[i], self.n_mask[i]
                self.lp_under_zero[i] = np.count_nonzero(zero[ms : ms + n] & (lp[ls : ls + n] != 0))
        self._be: tuple[memoryview, memoryview, memoryview] | None = None

    def __len__(self) -> int:
        return len(self.n_ids)

    def token_fault(self, row: int) -> tuple[Reason, str] | None:
        """First failing per-token check of one row, in the order of CONTRACT.md 3.3."""
        if self.bad_ids[row]:
            return Reason.INVALID_TOKEN, f"{self.bad_ids[row]} token ids outside [0, 2**31)"
        if self.bad_mask_values[row]:
            return Reason.INVALID_MASK, f"{self.bad_mask_values[row]} mask values other than 0/1"
        if self.mask_drops[row]:
            return Reason.INVALID_MASK, "a mask 1 comes before a mask 0"
        if not self.ones[row]:
            return Reason.EMPTY_GENERATION, "no token has mask 1"
        if self.bad_lp[row]:
            return Reason.INVALID_LOGPROB, f"{self.bad_lp[row]} logprobs not finite"
        if self.lp_under_zero[row]:
            return Reason.INVALID_LOGPROB, f"{self.lp_under_zero[row]} logprobs not 0.0 under mask 0"
        return None

    def be_buffers(self) -> tuple[memoryview, memoryview, memoryview]:
        """The whole batch's big-endian u64 ids, f32 mask and f32 logprobs, as bytes."""
        if self._be is None:
            self._be = to_be_bytes(self.ids, self.mask, self.lp)
        return self._be

    def drop_hash_buffers(self) -> None:
        """Free the big-endian copies once every hash of the batch is done."""
        self._be = None

    def ids_be_of(self, rows: list[int]) -> list[memoryview]:
        """The big-endian u64 ids of `rows`, end to end, in as few slices as the batch
        allows: a row that follows the one before it in the flat array extends its slice
        (a chain's calls are captured, and so stored, one after the other)."""
        ib = self.be_buffers()[0]
        starts, lengths = self.id_starts[rows].tolist(), np.maximum(self.n_ids[rows], 0).tolist()
        parts: list[memoryview] = []
        first = end = -1
        for start, n in zip(starts, lengths):
            if start != end:
                if end >= 0:
                    parts.append(ib[8 * first : 8 * end])
                first = start
            end = start + n
        if end >= 0:
            parts.append(ib[8 * first : 8 * end])
        return parts

    def be_views(self, row: int) -> tuple[memoryview, memoryview, memoryview]:
        """Big-endian u64 ids, f32 mask and f32 logprobs of one row (for the digests)."""
        ib, mb, lb = self.be_buffers()
        i, m, l = self.id_starts[row], self.mask_starts[row], self.lp_starts[row]
        ni, nm, nl = max(self.n_ids[row], 0), max(self.n_mask[row], 0), max(self.n_lp[row], 0)
        return ib[8 * i : 8 * (i + ni)], mb[4 * m : 4 * (m + nm)], lb[4 * l : 4 * (l + nl)]

    def gather(self, rows: np.ndarray, row_lengths: np.ndarray):
        """Join the given token rows end to end, then cut into training rows of `row_lengths`
        segments each: (offsets, ids int32, mask int8, logprobs float32). Rows passed here
        have passed every check, so their three lists have equal lengths. Consecutive rows
        sit next to each other in the flat arrays (a chain is captured in order), so the
        copy is a few slices joined, with the type conversion on the way."""
        lens = self.n_ids[rows]
        seg_ends = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lens, out=seg_ends[1:])
        bounds = np.zeros(len(row_lengths) + 1, dtype=np.int64)
        np.cumsum(row_lengths, out=bounds[1:])
        offsets = seg_ends[bounds].astype(np.int32)
        return (
            offsets,
            _join(self.ids, self.id_starts[rows], lens, np.int32),
            _join(self.mask, self.mask_starts[rows], lens, np.int8),
            _join(self.lp, self.lp_starts[rows], lens, np.float32),
        )


RUN_TOKENS = 64  # runs at least this long on average are copied slice by slice, else gathered


def _join(values: np.ndarray, starts: np.ndarray, lens: np.ndarray, dtype) -> np.ndarray:
    """values[starts[i] : starts[i] + lens[i]] for each i, end to end, as `dtype`; runs of
    adjacent pieces are copied as one slice. Many short runs (the rows of a verifiers fork
    tree or comb: millions of one-token nodes) are gathered by one index array instead, so
    that no Python object is made per run."""
    if len(starts) == 0:
        return np.zeros(0, dtype=dtype)
    ends = starts + lens
    breaks = np.flatnonzero(starts[1:] != ends[:-1]) + 1  # where a piece does not continue the last
    firsts = np.concatenate([[0], breaks])
    lasts = np.concatenate([breaks - 1, [len(starts) - 1]])
    run_starts, run_ends = starts[firsts], ends[lasts]
    run_lens = run_ends - run_starts
    total = int(run_lens.sum())
    if len(firsts) * RUN_TOKENS > total:
        at = np.cumsum(run_lens) - run_lens  # where each run lands in the output
        index = np.arange(total, dtype=np.int64) + np.repeat(run_starts - at, run_lens)
        return values[index].astype(dtype, casting="unsafe")
    pieces = [values[a:b] for a, b in zip(run_starts.tolist(), run_ends.tolist())]
    return np.concatenate(pieces, dtype=dtype, casting="unsafe")
