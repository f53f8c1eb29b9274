"""Reading through the storage layer (storage/__init__.py): a location opened as a stream
or as Parquet, by ranges, whole, or many at once ahead on threads (object storage pays its
latency per request, so several requests go together; `map_ahead`, `read_many`).
"""

from __future__ import annotations

import io
import os

from . import s3, s3_streams
from .locations import is_remote

STREAM_CHUNK, STREAM_AHEAD = 4 << 20, 3  # a stream read from object storage: 16 MiB in flight at most


def open_input(loc: str, buffer_size: int = 1 << 20):
    """A binary file object to read `loc` from (seek, tell, read, readline). Local files are
    Python's own files; an object is read by ranges as it is consumed (never downloaded
    whole first), each range a retried request, the next ones fetched ahead."""
    if not is_remote(loc):
        return open(loc, "rb")
    return io.BufferedReader(s3_streams.RangeReader(loc, STREAM_CHUNK, STREAM_AHEAD), buffer_size=buffer_size)


def open_parquet(loc: str, size: int | None = None):
    """What pyarrow.parquet reads `loc` from: a local path, or an object read by retried
    ranges (an open object is for one thread at a time; `size`, when known, saves a HEAD)."""
    if not is_remote(loc):
        return loc
    import pyarrow as pa

    return pa.PythonFile(s3_streams.RangeReader(loc, size=size), mode="r")


def read_ranges(loc: str, ranges: list[tuple[int, int]], size: int | None = None) -> list[bytes]:
    """The bytes of each (offset, length) of `loc` (shorter where the file ends first)."""
    if not is_remote(loc):
        with open(loc, "rb") as f:
            return [os.pread(f.fileno(), length, offset) for offset, length in ranges]
    reader = s3_streams.RangeReader(loc, size=size)
    return [reader.read_at(length, offset) for offset, length in ranges]


class _Served(io.RawIOBase):
    """A file read from pieces already in memory ((offset, bytes), sorted), the rest from
    the file itself: what pyarrow decodes once the pieces were checked (parquet_pages)."""

    def __init__(self, loc: str, pieces: list[tuple[int, bytes]], size: int | None):
        self._loc, self._pieces, self._pos = loc, pieces, 0
        self._size = size if size is not None else os.path.getsize(loc)
        self._file: io.BufferedReader | None = None  # the rest, locally
        self._object: s3_streams.RangeReader | None = None  # the rest, on object storage

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: 0, 1: self._pos, 2: self._size}[whence] + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        n = self._size - self._pos if n is None or n < 0 else min(n, self._size - self._pos)
        at = self._pos
        for start, data in self._pieces:
            if start <= at and at + n <= start + len(data):
                self._pos += n
                return data[at - start : at - start + n]
        if is_remote(self._loc):
            if self._object is None:
                self._object = s3_streams.RangeReader(self._loc, size=self._size)
            out = self._object.read_at(n, at)
        else:
            if self._file is None:
                self._file = open(self._loc, "rb")
            out = os.pread(self._file.fileno(), n, at)
        self._pos += len(out)
        return out

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        for rest in (self._file, self._object):
            if rest is not None:
                rest.close()
        super().close()


def served(loc: str, pieces: list[tuple[int, bytes]], size: int | None = None):
    """What pyarrow.parquet reads `loc` from when `pieces` of it are in memory already."""
    import pyarrow as pa

    return pa.PythonFile(_Served(loc, sorted(pieces), size), mode="r")


def read_parquet(loc: str, columns: list[str] | None = None):
    """A Parquet file's columns as one Arrow table. On object storage its row groups are read
    at once, each its own ranged requests (pyarrow would read them one after the other
    through one retried stream)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not is_remote(loc):
        return pq.read_table(loc, columns=columns)
    first = s3_streams.RangeReader(loc)
    size = first.size()
    file = pq.ParquetFile(pa.PythonFile(first, mode="r"))
    groups = list(range(file.metadata.num_row_groups))
    if len(groups) < 2:
        return file.read(columns=columns)

    def group(k: int):
        one = pq.ParquetFile(open_parquet(loc, size), metadata=file.metadata)
        return one.read_row_group(k, columns=columns)

    return pa.concat_tables(list(map_ahead(group, groups, True, threads=8)))


def read_bytes(loc: str, limit: int | None = None) -> bytes:
    """The whole file (an object in one GET); with `limit`, at most its first `limit` + 1
    bytes (a file longer than `limit` is never held whole)."""
    if not is_remote(loc):
        with open(loc, "rb") as fh:
            return fh.read() if limit is None else fh.read(limit + 1)
    return s3.get(loc, limit)


def read_many(locations: list[str], window_bytes: int = 64 << 20, threads: int = 32, limit: int | None = None):
    """(location, bytes or the OSError) of each file, in order. On object storage the next
    files are fetched on `threads` threads while the caller works, at most `window_bytes`
    (or `threads` files) ahead: a night of thousands of small capture files would otherwise
    wait one round trip per file. Locally they are read one after the other. `limit`: as
    read_bytes'."""
    if not any(is_remote(loc) for loc in locations):
        for loc in locations:
            try:
                yield loc, read_bytes(loc, limit)
            except OSError as e:
                yield loc, e
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    def fetch(loc: str):
        try:
            return read_bytes(loc, limit)
        except OSError as e:
            return e

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="store-read") as pool:
        ahead: deque = deque()
        pending = iter(locations)
        held = 0
        while True:
            while len(ahead) < threads and held < window_bytes and (nxt := next(pending, None)) is not None:
                ahead.append((nxt, pool.submit(fetch, nxt)))
            if not ahead:
                return
            loc, future = ahead.popleft()
            data = future.result()
            # what the threads fetched and the caller has not taken yet
            held = sum(len(r) for _, f in ahead if f.done() and isinstance(r := f.result(), bytes))
            yield loc, data


def map_ahead(fn, items: list, remote: bool, threads: int = 16):
    """`fn(item)` of each item, in order; when `remote` (the items are on object storage),
    computed up to `threads` items ahead on threads: what a loop over objects would
    otherwise wait in round trips one after the other. Locally the plain loop. A failure is
    raised when its item is reached."""
    if len(items) < 2 or not remote:
        yield from map(fn, items)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="store-map") as pool:
        ahead: deque = deque()
        pending = iter(items)
        try:
            while True:
                while len(ahead) < threads and (item := next(pending, _END)) is not _END:
                    ahead.append(pool.submit(fn, item))
                if not ahead:
                    return
                yield ahead.popleft().result()
        finally:
            for future in ahead:
                future.cancel()


_END = object()


def read_text(loc: str) -> str:
    return read_bytes(loc).decode()
