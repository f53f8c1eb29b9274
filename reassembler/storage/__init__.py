"""Where the job reads and writes: a local folder or an S3 prefix, through one layer.

Every other module opens, lists and writes through the functions here, with locations
(locations.py: local paths or `s3://bucket/key` URIs), so input and output may each be
either kind. The layer's parts:

- `locations.py`: what a location is; joining and splitting them.
- `local.py`: the local store (listing that skips nothing silently, atomic writes, links).
- `s3.py`: the S3 client (botocore and pyarrow's S3FileSystem from the AWS environment),
  every request through `retry.py`, the one retry policy (backoff with full jitter, a
  longer budget for throttling, REASSEMBLER_S3_RETRY_SECONDS), and every failure one line
  (StoreError, exit code 6); `s3_streams.py`: an object read by retried ranges, and one
  written whole when closed (one PUT, or parts).
- `conditional.py`: conditional writes (the manifest, the output lease).

On object storage, reads of many small files are fetched ahead on threads (`read_many`),
copies run at once (`copy_many`) and deletes go 1,000 keys a request (`delete_tree`), so
that the store's latency is paid by several requests together.
"""

from __future__ import annotations

import io
import os
import shutil

from . import local, retry, s3, s3_streams
from .conditional import Conflict, delete_if, put_if, read_versioned
from .locations import S3, is_remote, join, location, name, parent, relative, split
from .s3 import store_error

__all__ = [
    "S3",
    "Conflict",
    "check_bucket",
    "copy",
    "close_outputs",
    "copy_many",
    "delete",
    "delete_if",
    "delete_many",
    "delete_tree",
    "exists",
    "is_dir",
    "is_remote",
    "join",
    "list_files",
    "location",
    "makedirs",
    "name",
    "open_input",
    "open_output",
    "open_parquet",
    "parent",
    "put_if",
    "read_bytes",
    "map_ahead",
    "read_many",
    "read_parquet",
    "read_ranges",
    "read_text",
    "read_versioned",
    "relative",
    "retry",
    "select",
    "served",
    "size",
    "sizes",
    "split",
    "store_error",
    "write_bytes",
]


# ---------------------------------------------------------------- reading

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


def read_bytes(loc: str) -> bytes:
    """The whole file (an object in one GET)."""
    if not is_remote(loc):
        with open(loc, "rb") as fh:
            return fh.read()
    return s3.get(loc)


def read_many(locations: list[str], window_bytes: int = 64 << 20, threads: int = 32):
    """(location, bytes or the OSError) of each file, in order. On object storage the next
    files are fetched on `threads` threads while the caller works, at most `window_bytes`
    (or `threads` files) ahead: a night of thousands of small capture files would otherwise
    wait one round trip per file. Locally they are read one after the other."""
    if not any(is_remote(loc) for loc in locations):
        for loc in locations:
            try:
                yield loc, read_bytes(loc)
            except OSError as e:
                yield loc, e
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    def fetch(loc: str):
        try:
            return read_bytes(loc)
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


def size(loc: str) -> int:
    if not is_remote(loc):
        return os.stat(loc).st_size
    return _info(loc).size


def _info(loc: str):
    from pyarrow import fs

    info = s3.info(loc)
    if info.type == fs.FileType.NotFound:
        raise FileNotFoundError(2, "No such file", loc)
    return info


def exists(loc: str) -> bool:
    if not is_remote(loc):
        return os.path.exists(loc)
    try:
        _info(loc)
        return True
    except FileNotFoundError:
        return False


def is_file(loc: str) -> bool:
    """A file (locally, links followed), or on object storage an object with that key."""
    if not is_remote(loc):
        return os.path.isfile(loc)
    from pyarrow import fs

    return bool(split(loc)[1]) and s3.info(loc).type == fs.FileType.File


def is_dir(loc: str) -> bool:
    """A folder, or on object storage a prefix holding at least one object."""
    if not is_remote(loc):
        return os.path.isdir(loc)
    from pyarrow import fs

    if not split(loc)[1]:
        check_bucket(loc)
        return True
    return s3.info(loc).type == fs.FileType.Directory


def check_bucket(loc: str) -> None:
    """StoreError unless the bucket of `loc` exists and the credentials may use it."""
    if is_remote(loc):
        s3.head_bucket(loc)


def list_files(
    folder: str, suffix: str | tuple[str, ...], recursive: bool = False, exclude: str | None = None
) -> list[str]:
    """Files ending in `suffix` under `folder` (and its subfolders when `recursive`), as
    sorted relative paths (none when the folder does not exist). Locally, links are followed; a dangling link, an
    unreadable entry, a link loop, or anything but a file or folder (a named pipe, a socket,
    a device: reading it could block) is an InputError naming it: nothing is skipped
    silently."""
    if not is_remote(folder):
        return local.list_files(folder, suffix, recursive, exclude)
    from pyarrow import fs

    path = folder[len(S3) :].rstrip("/")
    files = [info for info in s3.listing(folder, recursive) if info.type == fs.FileType.File]
    _listed_sizes.update((S3 + info.path, info.size) for info in files)
    return select([info.path[len(path) + 1 :] for info in files], suffix, recursive, exclude)


_listed_sizes: dict[str, int] = {}  # the sizes object listings gave, by location


def sizes(locations: list[str], missing: int | None = None) -> list[int]:
    """Each file's size: locally a stat, on object storage what its listing said (a HEAD
    for one not listed), at once. `missing`: the size of a file that cannot be looked at
    (gone since it was listed, unreadable), instead of its OSError."""
    remote = any(is_remote(loc) for loc in locations)

    def one(loc: str) -> int:
        if loc in _listed_sizes:
            return _listed_sizes[loc]
        try:
            return size(loc)
        except OSError:
            if missing is None:
                raise
            return missing

    return list(map_ahead(one, locations, remote))


def select(rels: list[str], suffix: str | tuple[str, ...], recursive: bool, exclude: str | None = None) -> list[str]:
    """Of the relative paths of an object listing (recursive), those `list_files` would give."""
    found = []
    for rel in rels:
        base = rel.rsplit("/", 1)[-1]
        if (recursive or "/" not in rel) and base.endswith(suffix) and not (exclude and base.endswith(exclude)):
            found.append(rel)
    return sorted(found)


# ---------------------------------------------------------------- writing


def makedirs(loc: str) -> None:
    """A local folder (object storage has none to make)."""
    if not is_remote(loc):
        os.makedirs(loc, exist_ok=True)


def open_output(loc: str):
    """A binary stream writing `loc`: a local file, or an object that appears whole when the
    stream is closed (nothing when a `with` block around it ends in an exception)."""
    if not is_remote(loc):
        os.makedirs(os.path.dirname(loc), exist_ok=True)
        return open(loc, "wb")
    return s3_streams.Upload(loc)


def close_outputs(streams: list, ok: bool = True) -> None:
    """Close streams of `open_output`: objects uploaded at once; with `ok` False (the writer
    failed) no object is uploaded."""
    remote = [s for s in streams if isinstance(s, s3_streams.Upload)]
    for stream in streams:
        if not isinstance(stream, s3_streams.Upload):
            stream.close()
        elif not ok:
            stream.discard()
    if ok:
        s3.each(lambda stream: stream.close(), remote, len(remote))


def write_bytes(loc: str, data: bytes) -> None:
    """Write `loc` whole, atomically: a reader sees the old content or the new, never a part."""
    if is_remote(loc):
        s3.put(loc, data)
    else:
        local.write_bytes(loc, data)


def delete(loc: str) -> None:
    """Remove a file or object; a missing one is fine."""
    if is_remote(loc):
        s3.delete(loc)
    else:
        local.delete(loc)


def delete_tree(loc: str) -> None:
    """Remove a folder, or every object under a prefix; a missing one is fine."""
    if not is_remote(loc):
        shutil.rmtree(loc, ignore_errors=True)
        return
    delete_many([join(loc, rel) for rel in list_files(loc, "", recursive=True)])


def delete_many(locations: list[str]) -> None:
    """Remove files or objects (on object storage 1,000 a request, several requests at once)."""
    remote = [loc for loc in locations if is_remote(loc)]
    for loc in locations:
        if not is_remote(loc):
            local.delete(loc)
    by_bucket: dict[str, list[str]] = {}
    for loc in remote:
        bucket, key = split(loc)
        by_bucket.setdefault(bucket, []).append(key)
    for bucket, keys in by_bucket.items():
        s3.delete_keys(f"{S3}{bucket}", keys)


def copy(src: str, dst: str) -> None:
    """`dst` becomes a copy of `src` (locally a hard link: files here are never changed in
    place; on object storage a server-side copy: no byte passes through this process)."""
    if is_remote(src) != is_remote(dst):
        raise ValueError("copy within one store only")
    if is_remote(src):
        s3.copy(src, dst)
    else:
        local.copy(src, dst)


def copy_many(pairs: list[tuple[str, str]], threads: int = 16) -> None:
    """`copy` of each (src, dst); on object storage up to `threads` copies at once."""
    s3.each(lambda pair: copy(*pair), pairs, threads if any(is_remote(s) for s, _ in pairs) else 1)
