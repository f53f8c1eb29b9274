"""Fetch given token rows from the night's token files, in canonical types.

The shard query (sql/shard_calls.sql) sorts only the ledger and, for each call, the token
row's file and row number. `TokenStore.fetch` then reads just the row groups those rows
sit in, in the canonical types of formats/token_file.py, and gives the rows back in the
order asked. Decoded row groups are kept in a small LRU cache bounded in bytes: token
files written roughly in rollout order (as capture writes them) are read about once; a
shuffled night is still correct and bounded in memory, only slower (row groups are read
again).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from .. import storage
from ..formats.token_file import CANONICAL, TokenFile
from ..settings import DEFAULTS
from .derived_tokens import read_bound

PREFETCH_THREADS = 4  # a batch's missing row groups fetched at once from object storage
AHEAD_THREADS = 8  # row groups read ahead of the shard at once (bounded in bytes as well)


class TokenStore:
    def __init__(
        self, cache_bytes: int = DEFAULTS.token_cache_bytes, max_row_group_bytes: int = DEFAULTS.max_row_group_bytes
    ):
        self.cache_bytes = cache_bytes
        self.max_row_group_bytes = max_row_group_bytes
        self._files: dict[str, TokenFile] = {}
        self._cache: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
        self._cached = 0
        # read-ahead (object storage): the row groups still to come, those being fetched
        # with their decoded size from the metadata, and those already handed over
        self._plan: deque[tuple[str, int]] = deque()
        self._ahead: dict[tuple[str, int], tuple[Future, int]] = {}
        self._taken: set[tuple[str, int]] = set()
        self._ahead_bytes = 0
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> TokenStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._ahead.clear()
        self._plan.clear()

    def read_ahead(self, groups: list[tuple[str, int]], ahead_bytes: int) -> None:
        """On object storage, fetch these row groups in this order (the shard plan's
        token_groups: the order the shard first needs them) on AHEAD_THREADS threads, at
        most `ahead_bytes` decoded ahead of what the shard has taken: each row group would
        otherwise cost the shard a round trip when it gets there. Locally nothing."""
        remote = [(path, group) for path, group in groups if storage.is_remote(path)]
        if not remote:
            return
        self._open([path for path, _ in remote])  # every footer at once
        self._plan.extend(remote)
        self._ahead_bytes = ahead_bytes
        self._pool = ThreadPoolExecutor(max_workers=AHEAD_THREADS, thread_name_prefix="token-ahead")
        self._schedule()

    def _schedule(self) -> None:
        if self._pool is None:
            return
        held = sum(size for _, size in self._ahead.values())
        while self._plan and (held < self._ahead_bytes or not self._ahead):
            key = self._plan.popleft()
            if key in self._ahead or key in self._taken or key in self._cache:
                continue
            file = self._files[key[0]]
            if key[1] >= len(file.pieces) or file.too_big(key[1]) is not None or not file.whole(key[1]):
                continue  # reject rows (no call asks for them), or a piece read in order by the shard
            size = file.pieces[key[1]].size
            self._ahead[key] = (self._pool.submit(file.read, key[1]), size)
            held += size

    def _open(self, paths: list[str]) -> list[TokenFile]:
        """The files, those not open yet opened at once (on object storage a footer read each)."""
        new = [p for p in dict.fromkeys(paths) if p not in self._files]
        remote = any(storage.is_remote(p) for p in new)
        bound = self.max_row_group_bytes
        for path, file in zip(new, storage.map_ahead(lambda p: TokenFile(p, read_bound(p, bound)), new, remote)):
            self._files[path] = file
        return [self._files[p] for p in paths]

    def _group(self, file: TokenFile, group: int) -> pa.Table:
        key = (file.path, group)
        table = self._cache.get(key)
        if table is not None:
            self._cache.move_to_end(key)
            return table
        fetched = self._ahead.pop(key, None)
        table = fetched[0].result() if fetched is not None else file.read(group)
        if self._pool is not None:
            self._taken.add(key)
            self._schedule()
        self._cache[key] = table
        self._cached += table.nbytes
        while self._cached > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached -= old.nbytes
        return table

    def _prefetch(self, wanted: list[tuple[TokenFile, int]]) -> None:
        """On object storage, read the row groups a fetch needs and the cache lacks at once,
        on PREFETCH_THREADS threads (each one a round trip otherwise); locally nothing."""
        if self._pool is not None:
            return  # read ahead already
        missing = list(
            dict.fromkeys((f, g) for f, g in wanted if f.remote and f.whole(g) and (f.path, g) not in self._cache)
        )
        if len(missing) < 2:
            return
        with ThreadPoolExecutor(max_workers=PREFETCH_THREADS, thread_name_prefix="token-prefetch") as pool:
            tables = list(pool.map(lambda fg: fg[0].read(fg[1]), missing))
        for (file, group), table in zip(missing, tables):
            self._cache[(file.path, group)] = table
            self._cached += table.nbytes
        while self._cached > self.cache_bytes and len(self._cache) > len(missing):
            _, old = self._cache.popitem(last=False)
            self._cached -= old.nbytes

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
        opened = self._open(encoded.dictionary.to_pylist())
        groups = np.zeros(n, dtype=np.int64)
        for code, file in enumerate(opened):
            idx = np.flatnonzero(present & (codes == code))
            groups[idx] = np.searchsorted(file.starts, rows_np[idx], side="right") - 1
        key = np.where(present, (codes << 32) + groups, -1)
        cuts = np.concatenate([[0], np.flatnonzero(np.diff(key)) + 1, [n]])
        self._prefetch([(opened[codes[a]], int(groups[a])) for a in cuts[:-1] if key[a] >= 0])
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
