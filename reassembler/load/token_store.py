"""Fetch given token rows from the night's Parquet files, in canonical types.

The shard query (sql/shard_calls.sql) sorts only the ledger and, for each call, the token
row's file and row number. `TokenStore.fetch` then reads just the row groups those rows
sit in and casts every column to the canonical types of CONTRACT.md 2.3: strings, int64,
digests as lowercase hex (fixed_size_binary(32) is hex-encoded), list<int64> ids and
list<float32> mask and logprobs (bool/int8 masks widened, float64 logprobs narrowed with
overflow to +-inf). Rows come back in the order asked.

Decoded row groups are kept in a small LRU cache bounded in bytes. Token files written
roughly in rollout order (as capture writes them) are read about once; a shuffled night is
still correct and bounded in memory, only slower (row groups are read again). A one-process
build also decodes row groups ahead of the shard on a thread of its own (`read_ahead`),
within a budget of bytes decoded and not yet taken: each row group the shard takes makes
room for the next, and the row groups the shard read itself are skipped.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import InputError
from ..formats.records import LEDGER_DIGESTS, LEDGER_INTS, LINEAGE_FIELDS, VERSION_DEFAULTS
from ..settings import DEFAULTS

LOGPROB_NAMES = ("generation_logprobs_delta", "generation_log_probs_delta")  # the contract's, then Gym's
IDS = pa.list_(pa.int64())
FLOATS = pa.list_(pa.float32())
STRINGS, INTS, DIGESTS = LINEAGE_FIELDS, LEDGER_INTS, LEDGER_DIGESTS
LISTS = (
    ("ids", "token_ids_delta", IDS),
    ("mask", "token_mask_delta", FLOATS),
    ("logprobs", "generation_logprobs_delta", FLOATS),
)
CANONICAL = pa.schema(
    [(n, pa.string()) for n in STRINGS]
    + [(n, pa.int64()) for n in INTS]
    + [(n, pa.string()) for n in DIGESTS]
    + [(n, t) for n, _, t in LISTS]
)


def _hex(column: pa.ChunkedArray) -> pa.Array:
    if pa.types.is_fixed_size_binary(column.type):
        return pa.array([None if v is None else v.hex() for v in column.to_pylist()], pa.string())
    return column.cast(pa.string())


# An unsigned 64-bit value past int64 is read as this: no valid ledger value equals it (its
# row fails field_mismatch), and as a token id it is negative (invalid_token).
PAST_INT64 = -(2**63)


def _int64(column: pa.ChunkedArray, canonical: pa.DataType) -> pa.ChunkedArray:
    """An integer column (or list of integers) of any width as int64 (or list<int64>)."""
    if column.type == pa.uint64():
        past = pc.greater(column, pa.scalar(2**63 - 1, pa.uint64()))
        return pc.if_else(past, pa.scalar(PAST_INT64, pa.int64()), column.cast(pa.int64(), safe=False))
    if canonical == IDS and _value_type(column.type) == pa.uint64():
        return column.cast(IDS, safe=False)  # wraps past int64 to negative ids: invalid_token
    return column.cast(canonical)


def _value_type(t: pa.DataType) -> pa.DataType | None:
    return t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else None


# Bytes a token value takes once decoded to the canonical types, per list column (and the
# list offsets, per row and column).
DECODED_WIDTH = {"token_ids_delta": 8, "token_mask_delta": 4, **{name: 4 for name in LOGPROB_NAMES}}


def decoded_bytes(metadata: pq.FileMetaData, group: int) -> int:
    """What row group `group` takes decoded, from the file's metadata alone: its token
    values (leaf values of the list columns, as Parquet counts them) at their canonical
    widths. A file of a few KB can hold a row group of millions of identical tokens."""
    rg = metadata.row_group(group)
    total = 3 * 8 * rg.num_rows
    for i in range(rg.num_columns):
        column = rg.column(i)
        total += column.num_values * DECODED_WIDTH.get(column.path_in_schema.split(".")[0], 0)
    return total


def too_big(path: str, metadata: pq.FileMetaData, group: int, bound: int) -> str | None:
    """Why row group `group` is not decoded (it would take more than `bound` bytes), or None."""
    size = decoded_bytes(metadata, group)
    if size <= bound:
        return None
    return (
        f"row group {group} ({metadata.row_group(group).num_rows} rows) decodes to {size:,} bytes, over the "
        f"{bound:,} the job decodes at once; not read: write token files in smaller row groups"
    )


class _File:
    def __init__(self, path: str, bound: int = DEFAULTS.max_row_group_bytes):
        self.path = path
        self.bound = bound
        self.metadata = pq.read_metadata(path)
        names = self.metadata.schema.to_arrow_schema().names
        lp = next(n for n in LOGPROB_NAMES if n in names)  # the contract's name wins
        self.sources = {n: n for n in STRINGS + INTS + DIGESTS if n in names}
        self.sources.update({name: column for name, column, _ in LISTS}, logprobs=lp)
        sizes = [self.metadata.row_group(i).num_rows for i in range(self.metadata.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def too_big(self, group: int) -> str | None:
        return too_big(self.path, self.metadata, group, self.bound)

    def read(self, group: int) -> pa.Table:
        refused = self.too_big(group)
        if refused is not None:  # the load made its rows reject rows: no call asks for them
            raise InputError(f"{self.path}: {refused}")
        try:
            t = pq.ParquetFile(self.path, metadata=self.metadata).read_row_group(
                group, columns=list(dict.fromkeys(self.sources.values()))
            )
        except (pa.ArrowException, OSError) as e:
            raise InputError(f"{self.path}: unreadable row group {group} ({str(e).splitlines()[0]})") from e
        columns = []
        for field in CANONICAL:
            if field.name not in self.sources:  # a version column the file leaves out
                columns.append(pa.array(np.full(t.num_rows, VERSION_DEFAULTS[field.name]), pa.int64()))
                continue
            col = t.column(self.sources[field.name])
            if field.name in DIGESTS:
                columns.append(_hex(col))
            elif field.name in INTS or field.type == IDS:
                columns.append(_int64(col, field.type))
            else:
                columns.append(col.cast(field.type))
        return pa.table(columns, schema=CANONICAL)


class TokenStore:
    def __init__(
        self, cache_bytes: int = DEFAULTS.token_cache_bytes, max_row_group_bytes: int = DEFAULTS.max_row_group_bytes
    ):
        self.cache_bytes = cache_bytes
        self.max_row_group_bytes = max_row_group_bytes
        self._files: dict[str, _File] = {}
        self._cache: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
        self._cached = 0
        # _files and the read-ahead state, shared with the read-ahead thread: the row groups
        # decoded and not yet taken (`_ahead`, `_held` bytes), the one being decoded
        # (`_reading`), the ones the shard read itself (`_taken`)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._ahead: dict[tuple[str, int], pa.Table] = {}
        self._held = 0
        self._budget = 0
        self._reading: tuple[str, int] | None = None
        self._taken: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _file(self, path: str) -> _File:
        with self._lock:
            file = self._files.get(path)
        if file is None:
            file = _File(path, self.max_row_group_bytes)
            with self._lock:
                file = self._files.setdefault(path, file)
        return file

    def read_ahead(self, paths: list[str], budget_bytes: int, after: Callable[[], bool] | None = None) -> None:
        """Decode the row groups of `paths`, in order, on a thread of its own, for the shard
        that reads them later, holding at most `budget_bytes` of them not yet taken: as the
        shard takes them, the thread decodes the next ones. A one-process build starts this
        before loading the night, so that the decoding runs on the core the load leaves
        idle, then beside the shard's threads. `after`: start only once it returns True
        (polled every 10 ms; a one-process build waits for the rollout child, which the
        load waits for, so that the two do not share the cores). A row group the shard read
        itself is skipped; a file that fails here is left to the shard, which reports it."""

        self._budget = budget_bytes

        def run() -> None:
            while after is not None and not after():
                if self._stop.wait(0.01):
                    return
            for path in paths:
                try:
                    file = self._file(path)
                    for group in range(file.metadata.num_row_groups):
                        key = (path, group)
                        with self._changed:
                            while self._held >= self._budget and not self._stop.is_set():
                                self._changed.wait()
                            if self._stop.is_set():
                                return
                            if key in self._taken or file.too_big(group):
                                continue
                            self._reading = key
                        try:
                            table = file.read(group)
                        except Exception:  # noqa: BLE001 - the shard reads this file again and says what is wrong
                            table = None
                        with self._changed:  # handed over in the same step: a waiting shard finds it
                            self._reading = None
                            if table is not None:
                                self._ahead[key] = table
                                self._held += table.nbytes
                            self._changed.notify_all()
                        if table is None:
                            break  # on to the next file
                except Exception:  # noqa: BLE001 - a file that cannot be opened: the shard says what is wrong
                    continue

        self._thread = threading.Thread(target=run, name="tokens-ahead", daemon=True)
        self._thread.start()

    def keep_ahead(self, budget_bytes: int) -> None:
        """From now on hold at most `budget_bytes` read ahead and not yet taken (the shard
        has started: what it needs next, not the whole budget of the load)."""
        with self._changed:
            self._budget = budget_bytes
            self._changed.notify_all()

    def close(self) -> None:
        """Stop reading ahead and drop what was read ahead and not used."""
        with self._changed:
            self._stop.set()
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._ahead.clear()
            self._held = 0

    def _take_ahead(self, key: tuple[str, int]) -> pa.Table | None:
        """The row group if it was read ahead (waiting for it while it is being decoded);
        else None, and the read-ahead will not decode it."""
        with self._changed:
            while self._reading == key:
                self._changed.wait()
            table = self._ahead.pop(key, None)
            if table is not None:
                self._held -= table.nbytes
                self._changed.notify_all()
            else:
                self._taken.add(key)
            return table

    def _group(self, file: _File, group: int) -> pa.Table:
        key = (file.path, group)
        table = self._cache.get(key)
        if table is not None:
            self._cache.move_to_end(key)
            return table
        table = self._take_ahead(key)
        if table is None:
            table = file.read(group)
        self._cache[key] = table
        self._cached += table.nbytes
        while self._cached > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached -= old.nbytes
        return table

    def fetch(self, files: pa.ChunkedArray, rows: pa.ChunkedArray) -> pa.Table:
        """The token rows at (file, row) pairs, in that order; all null where file is null.

        The positions are cut into runs that read from one row group (or have no token
        row); a run of consecutive rows is a zero-copy slice, anything else a take."""
        n = len(files)
        if n == 0:
            return CANONICAL.empty_table()
        encoded = files.combine_chunks().dictionary_encode()
        present = ~encoded.is_null().to_numpy(zero_copy_only=False)
        codes = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        rows_np = rows.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        opened = [self._file(p) for p in encoded.dictionary.to_pylist()]
        groups = np.zeros(n, dtype=np.int64)
        for code, file in enumerate(opened):
            idx = np.flatnonzero(present & (codes == code))
            groups[idx] = np.searchsorted(file.starts, rows_np[idx], side="right") - 1
        key = np.where(present, (codes << 32) + groups, -1)
        cuts = np.concatenate([[0], np.flatnonzero(np.diff(key)) + 1, [n]])
        pieces = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            if key[a] < 0:
                pieces.append(pa.table([pa.nulls(b - a, f.type) for f in CANONICAL], schema=CANONICAL))
                continue
            file, group = opened[codes[a]], int(groups[a])
            local = rows_np[a:b] - file.starts[group]
            table = self._group(file, group)
            if local[-1] - local[0] == b - a - 1 and np.all(np.diff(local) == 1):
                pieces.append(table.slice(int(local[0]), int(b - a)))  # rows in file order: no copy
            else:
                pieces.append(table.take(pa.array(local)))
        return pa.concat_tables(pieces)
