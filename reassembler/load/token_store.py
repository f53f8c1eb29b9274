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

from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from ..formats.token_file import CANONICAL, TokenFile
from ..settings import DEFAULTS

PREFETCH_THREADS = 4  # row groups fetched at once from object storage


class TokenStore:
    def __init__(
        self, cache_bytes: int = DEFAULTS.token_cache_bytes, max_row_group_bytes: int = DEFAULTS.max_row_group_bytes
    ):
        self.cache_bytes = cache_bytes
        self.max_row_group_bytes = max_row_group_bytes
        self._files: dict[str, TokenFile] = {}
        self._cache: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
        self._cached = 0

    def _file(self, path: str) -> TokenFile:
        file = self._files.get(path)
        if file is None:
            file = self._files[path] = TokenFile(path, self.max_row_group_bytes)
        return file

    def _group(self, file: TokenFile, group: int) -> pa.Table:
        key = (file.path, group)
        table = self._cache.get(key)
        if table is not None:
            self._cache.move_to_end(key)
            return table
        table = file.read(group)
        self._cache[key] = table
        self._cached += table.nbytes
        while self._cached > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached -= old.nbytes
        return table

    def _prefetch(self, wanted: list[tuple[TokenFile, int]]) -> None:
        """On object storage, read the row groups a fetch needs and the cache lacks at once,
        on PREFETCH_THREADS threads (each one a round trip otherwise); locally nothing."""
        missing = list(dict.fromkeys((f, g) for f, g in wanted if f.remote and (f.path, g) not in self._cache))
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
        opened = [self._file(p) for p in encoded.dictionary.to_pylist()]
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
