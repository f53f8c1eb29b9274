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
- `reads.py`: a location read as a stream, as Parquet, by ranges, whole, or many at once.

On object storage, reads of many small files are fetched ahead on threads (`read_many`),
copies run at once (`copy_many`) and deletes go 1,000 keys a request (`delete_tree`), so
that the store's latency is paid by several requests together.
"""

from __future__ import annotations

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


from .reads import (  # noqa: E402 - after __all__, which names them
    map_ahead,
    open_input,
    open_parquet,
    read_bytes,
    read_many,
    read_parquet,
    read_ranges,
    read_text,
    served,
)


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


def modified(loc: str):
    """When a file or object was last written (a UTC datetime)."""
    from datetime import UTC, datetime

    if not is_remote(loc):
        return datetime.fromtimestamp(os.stat(loc).st_mtime, UTC)
    return _info(loc).mtime.astimezone(UTC)


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
