"""Where the job reads and writes: a local folder or an S3 prefix, through one layer.

A *location* is a string: an absolute local path (`/data/capture/...`), or a URI
`s3://bucket/key` on AWS S3 or any S3-compatible store (MinIO, Ceph). Locations are never
`pathlib.Path` objects: `Path("s3://capture")` is `s3:/capture`. Every other module opens,
lists and writes through the functions here, so input and output may each be either kind.

Object storage is reached with pyarrow's `S3FileSystem` (reads and writes, by range) and
botocore (the conditional puts of the manifest and the output lease, which pyarrow has
not). Both are configured from the standard AWS environment: `AWS_ENDPOINT_URL` (an
S3-compatible server; path-style addressing is used, as those servers need),
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_DEFAULT_REGION`
(default us-east-1). An unreachable endpoint, refused credentials or a missing bucket is a
StoreError: one line, exit code 6.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import os
import shutil
import stat
import threading
from functools import lru_cache

from .errors import InputError, StoreError

S3 = "s3://"


# ---------------------------------------------------------------- locations


def is_remote(location) -> bool:
    return str(location).startswith(S3)


def location(value) -> str:
    """A user's --input/--output (or a Path) as a location: URIs as they are (no trailing
    '/'), local paths absolute."""
    text = os.fspath(value) if not isinstance(value, str) else value
    if is_remote(text):
        bucket = text[len(S3) :].split("/", 1)[0]
        if not bucket:
            raise InputError(f"{text}: an S3 location needs a bucket: s3://bucket/prefix")
        return text.rstrip("/")
    if "://" in text:
        raise InputError(f"{text}: only local paths and s3:// locations are supported")
    return os.path.abspath(os.path.expanduser(text))


def join(base, *parts: str) -> str:
    out = str(base).rstrip("/")
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}/{part}"
    return out


def relative(base, loc: str) -> str:
    """`loc` as a key relative to `base` (a location inside it)."""
    prefix = str(base).rstrip("/") + "/"
    if not loc.startswith(prefix):
        raise ValueError(f"{loc} is not inside {base}")
    return loc[len(prefix) :]


def parent(loc: str) -> str:
    return loc.rstrip("/").rsplit("/", 1)[0]


def name(loc: str) -> str:
    return loc.rstrip("/").rsplit("/", 1)[-1]


# ---------------------------------------------------------------- object storage clients

_CONNECT_TIMEOUT = 5.0
_REQUEST_TIMEOUT = 60.0


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _region() -> str:
    return os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"


def _environment() -> tuple:
    names = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    return tuple(os.environ.get(k) for k in (*names, "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION"))


@lru_cache(maxsize=4)
def _s3_filesystem(environment: tuple):
    from pyarrow import fs

    endpoint = _endpoint()
    kwargs = {}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs = {"endpoint_override": host or scheme, "scheme": scheme if host else "https"}
    return fs.S3FileSystem(
        region=_region(),
        connect_timeout=_CONNECT_TIMEOUT,
        request_timeout=_REQUEST_TIMEOUT,
        force_virtual_addressing=False,
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=3),
        **kwargs,
    )


@lru_cache(maxsize=4)
def _s3_client(environment: tuple):
    import botocore.config
    import botocore.session

    session = botocore.session.get_session()
    config = botocore.config.Config(
        s3={"addressing_style": "path"},
        connect_timeout=_CONNECT_TIMEOUT,
        read_timeout=_REQUEST_TIMEOUT,
        retries={"max_attempts": 3, "mode": "standard"},
    )
    return session.create_client("s3", region_name=_region(), endpoint_url=_endpoint(), config=config)


def _split(loc: str) -> tuple[str, str]:
    bucket, _, key = loc[len(S3) :].partition("/")
    return bucket, key


def _filesystem(loc: str):
    """(pyarrow filesystem, its path) of a location."""
    if is_remote(loc):
        return _s3_filesystem(_environment()), loc[len(S3) :]
    from pyarrow import fs

    return fs.LocalFileSystem(), loc


def store_error(loc: str, exc: BaseException) -> StoreError | None:
    """One line for an object-storage failure, or None when it is not one."""
    if not is_remote(loc):
        return None
    text = str(exc).replace("\n", " ")
    low = text.lower()
    endpoint = _endpoint() or "AWS S3"
    if "nosuchbucket" in low or "bucket does not exist" in low:
        return _no_bucket(loc)
    if any(
        s in low
        for s in ("invalidaccesskeyid", "signaturedoesnotmatch", "access denied", "accessdenied", "forbidden", "403")
    ):
        return _denied(loc)
    if any(
        s in low
        for s in (
            "couldn't connect",
            "could not connect",
            "connection refused",
            "curlcode: 7",
            "curlcode: 28",
            "couldn't resolve",
            "timed out",
            "connect timeout",
            "endpointconnectionerror",
        )
    ):
        return StoreError(f"{loc}: cannot reach the object store at {endpoint} (set AWS_ENDPOINT_URL?)")
    if "aws error" in low or ("s3" in low and isinstance(exc, OSError)):
        return StoreError(f"{loc}: object storage error ({text[:300]})")
    return None


def _no_bucket(loc: str) -> StoreError:
    return StoreError(f"{loc}: bucket {_split(loc)[0]} does not exist at {_endpoint() or 'AWS S3'}")


def _denied(loc: str) -> StoreError:
    return StoreError(
        f"{loc}: access denied by {_endpoint() or 'AWS S3'} (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
        "and the bucket's policy)"
    )


def _raise_store(loc: str, exc: BaseException):
    found = store_error(loc, exc)
    if found is not None:
        raise found from None
    raise exc


# ---------------------------------------------------------------- reading


class _RawObject(io.RawIOBase):
    """A pyarrow input file (an object read by ranges) as a Python raw stream."""

    def __init__(self, native, loc: str):
        self._f, self._loc = native, loc

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self._f.read(len(buffer))
        except OSError as e:
            _raise_store(self._loc, e)
        n = len(data)
        buffer[:n] = data
        return n

    def readall(self) -> bytes:
        """The rest of the object in one request (io's default reads 8 KiB at a time)."""
        try:
            data = self._f.read()
        except OSError as e:
            _raise_store(self._loc, e)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def close(self) -> None:
        self._f.close()
        super().close()


def open_input(loc: str, buffer_size: int = 1 << 20):
    """A binary file object to read `loc` from (seek, tell, read, readline). Local files are
    Python's own files; an object is read by ranges as it is consumed (never downloaded
    whole first)."""
    if not is_remote(loc):
        return open(loc, "rb")
    filesystem, path = _filesystem(loc)
    try:
        native = filesystem.open_input_file(path)
    except OSError as e:
        _missing_or_store(loc, e)
    return io.BufferedReader(_RawObject(native, loc), buffer_size=buffer_size)


def open_parquet(loc: str):
    """What pyarrow.parquet reads `loc` from: a local path, or an object read by ranges (an
    open object is for one thread at a time)."""
    if not is_remote(loc):
        return loc
    filesystem, path = _filesystem(loc)
    try:
        return filesystem.open_input_file(path)
    except OSError as e:
        _missing_or_store(loc, e)


def _missing_or_store(loc: str, exc: OSError):
    if isinstance(exc, FileNotFoundError) or "path does not exist" in str(exc).lower():
        raise FileNotFoundError(errno.ENOENT, "No such file", loc) from None
    _raise_store(loc, exc)


def read_bytes(loc: str) -> bytes:
    """The whole file (an object in one GET)."""
    if not is_remote(loc):
        with open(loc, "rb") as fh:
            return fh.read()
    bucket, key = _split(loc)
    client = _s3_client(_environment())
    try:  # one GET (pyarrow's streams ask for the size first: a HEAD more per file)
        data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        raise FileNotFoundError(errno.ENOENT, "No such file", loc) from None
    except Exception as e:  # noqa: BLE001
        _raise_store(loc, e)
    return data


def read_many(locations: list[str], window_bytes: int = 64 << 20, threads: int = 16):
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


def read_text(loc: str) -> str:
    return read_bytes(loc).decode()


def size(loc: str) -> int:
    if not is_remote(loc):
        return os.stat(loc).st_size
    return _info(loc).size


def _info(loc: str):
    from pyarrow import fs

    filesystem, path = _filesystem(loc)
    try:
        info = filesystem.get_file_info(path)
    except OSError as e:
        _raise_store(loc, e)
    if info.type == fs.FileType.NotFound:
        raise FileNotFoundError(errno.ENOENT, "No such file", loc)
    return info


def exists(loc: str) -> bool:
    if not is_remote(loc):
        return os.path.exists(loc)
    try:
        _info(loc)
        return True
    except FileNotFoundError:
        return False


def is_dir(loc: str) -> bool:
    """A folder, or on object storage a prefix holding at least one object."""
    if not is_remote(loc):
        return os.path.isdir(loc)
    from pyarrow import fs

    bucket, key = _split(loc)
    if not key:
        check_bucket(loc)
        return True
    filesystem, path = _filesystem(loc)
    try:
        return filesystem.get_file_info(path).type == fs.FileType.Directory
    except OSError as e:
        _raise_store(loc, e)
    return False


def check_bucket(loc: str) -> None:
    """StoreError unless the bucket of `loc` exists and the credentials may use it."""
    if not is_remote(loc):
        return
    bucket = _split(loc)[0]
    try:
        _s3_client(_environment()).head_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001 - botocore's errors, said as one line
        code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise _no_bucket(loc) from None
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise _denied(loc) from None
        found = store_error(loc, e)
        raise found or StoreError(f"{loc}: object storage error ({str(e).splitlines()[0][:300]})") from None


def list_files(
    folder: str, suffix: str | tuple[str, ...], recursive: bool = False, exclude: str | None = None
) -> list[str]:
    """Files ending in `suffix` under `folder` (and its subfolders when `recursive`), as
    sorted relative paths (none when the folder does not exist). Locally, links are followed; a dangling link, an
    unreadable entry, a link loop, or anything but a file or folder (a named pipe, a socket,
    a device: reading it could block) is an InputError naming it: nothing is skipped
    silently."""
    if is_remote(folder):
        return _list_objects(folder, suffix, recursive, exclude)
    if not os.path.isdir(folder):
        return []  # as a prefix holding no object
    return _list_local(folder, suffix, recursive, exclude)


def _list_objects(folder: str, suffix, recursive: bool, exclude: str | None) -> list[str]:
    from pyarrow import fs

    filesystem, path = _filesystem(folder)
    try:
        infos = filesystem.get_file_info(fs.FileSelector(path, recursive=recursive, allow_not_found=True))
    except OSError as e:
        _raise_store(folder, e)
    found = []
    for info in infos:
        if info.type != fs.FileType.File:
            continue
        rel = info.path[len(path.rstrip("/")) + 1 :]
        base = rel.rsplit("/", 1)[-1]
        if base.endswith(suffix) and not (exclude and base.endswith(exclude)):
            found.append(rel)
    return sorted(found)


def _list_local(part: str, suffix, recursive: bool, exclude: str | None) -> list[str]:
    found: list[str] = []
    seen: set[tuple[int, int]] = set()

    def visit(folder: str, rel: str) -> None:
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            raise InputError(f"{folder}: symbolic link loop (this folder is reached twice)")
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise InputError(f"{folder}: cannot list the folder ({e.strerror})") from e
        for entry in entries:
            name = f"{rel}{entry.name}"
            full = os.path.join(folder, entry.name)
            try:
                entry.name.encode("utf-8")
            except UnicodeEncodeError:  # undecodable bytes, kept by Python as lone surrogates
                raise InputError(f"{folder}: the name {ascii(entry.name)} is not valid UTF-8; rename it") from None
            try:
                is_dir, is_file = entry.is_dir(), entry.is_file()
            except OSError as e:
                raise InputError(f"{full}: cannot read ({e.strerror})") from e
            if not (is_dir or is_file):
                try:
                    mode = os.stat(entry.path).st_mode
                except FileNotFoundError:
                    if not (entry.name.endswith(suffix) or recursive):
                        continue  # a link that would not be read either way
                    raise InputError(f"{full}: dangling symbolic link (points to {os.readlink(entry.path)})") from None
                except OSError as e:
                    raise InputError(f"{full}: cannot read ({e.strerror})") from e
                # a FIFO, socket or device: reading it could block or never end
                raise InputError(f"{full}: not a regular file ({_kind(mode)}); only files are read")
            if is_dir:
                if recursive:
                    visit(entry.path, name + "/")
            elif is_file and entry.name.endswith(suffix) and not (exclude and entry.name.endswith(exclude)):
                if not os.access(entry.path, os.R_OK):
                    raise InputError(f"{full}: file is not readable")
                found.append(name)

    visit(part, "")
    return sorted(found)


def _kind(mode: int) -> str:
    for test, label in (
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return label
    return "not a file or folder"


# ---------------------------------------------------------------- writing


def makedirs(loc: str) -> None:
    """A local folder (object storage has none to make)."""
    if not is_remote(loc):
        os.makedirs(loc, exist_ok=True)


def open_output(loc: str):
    """A binary stream writing `loc` (a local file, or an object that appears whole on close)."""
    if not is_remote(loc):
        os.makedirs(os.path.dirname(loc), exist_ok=True)
        return open(loc, "wb")
    filesystem, path = _filesystem(loc)
    try:
        return filesystem.open_output_stream(path)
    except OSError as e:
        _raise_store(loc, e)


def write_bytes(loc: str, data: bytes) -> None:
    """Write `loc` whole, atomically: a reader sees the old content or the new, never a part."""
    if is_remote(loc):
        try:
            _s3_client(_environment()).put_object(Bucket=_split(loc)[0], Key=_split(loc)[1], Body=data)
        except Exception as e:  # noqa: BLE001
            _raise_store(loc, e)
        return
    os.makedirs(os.path.dirname(loc), exist_ok=True)
    tmp = f"{os.path.dirname(loc)}/.{os.path.basename(loc)}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, loc)


def delete(loc: str) -> None:
    """Remove a file or object; a missing one is fine."""
    if not is_remote(loc):
        try:
            os.unlink(loc)
        except FileNotFoundError:
            pass
        return
    bucket, key = _split(loc)
    try:  # botocore, not pyarrow: pyarrow leaves an empty "folder/" object behind
        _s3_client(_environment()).delete_object(Bucket=bucket, Key=key)
    except Exception as e:  # noqa: BLE001
        _raise_store(loc, e)


def delete_tree(loc: str) -> None:
    """Remove a folder, or every object under a prefix; a missing one is fine."""
    if not is_remote(loc):
        shutil.rmtree(loc, ignore_errors=True)
        return
    keys = [_split(join(loc, rel))[1] for rel in list_files(loc, "", recursive=True)]
    bucket = _split(loc)[0]
    for start in range(0, len(keys), 1000):  # S3's DeleteObjects takes up to 1,000 keys
        batch = {"Objects": [{"Key": k} for k in keys[start : start + 1000]], "Quiet": True}
        try:
            _s3_client(_environment()).delete_objects(Bucket=bucket, Delete=batch)
        except Exception as e:  # noqa: BLE001
            _raise_store(loc, e)


def copy(src: str, dst: str) -> None:
    """`dst` becomes a copy of `src` (locally a hard link: files here are never changed in
    place; on object storage a server-side copy: no byte passes through this process)."""
    if is_remote(src) != is_remote(dst):
        raise ValueError("copy within one store only")
    if not is_remote(src):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
        except FileExistsError:
            os.unlink(dst)
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)
        return
    filesystem, _ = _filesystem(src)
    try:
        filesystem.copy_file(src[len(S3) :], dst[len(S3) :])
    except OSError as e:
        _raise_store(src, e)


# ---------------------------------------------------------------- conditional writes


class Conflict(Exception):
    """A conditional write lost: the object is not (or no longer) what the writer read."""


def read_versioned(loc: str) -> tuple[bytes | None, str | None]:
    """The content of `loc` and its version tag (the ETag on S3, a digest locally), or
    (None, None) when it does not exist."""
    if not is_remote(loc):
        try:
            with open(loc, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None, None
        return data, hashlib.sha256(data).hexdigest()
    bucket, key = _split(loc)
    client = _s3_client(_environment())
    try:
        response = client.get_object(Bucket=bucket, Key=key)
    except client.exceptions.NoSuchKey:
        return None, None
    except Exception as e:  # noqa: BLE001
        _raise_store(loc, e)
    return response["Body"].read(), response["ETag"]


def put_if(loc: str, data: bytes, version: str | None) -> str:
    """Write `loc` only if it is still at `version` (None: only if it does not exist), in
    one atomic step; the new version, or Conflict. On S3 a conditional put (If-None-Match:
    * / If-Match: <etag>); locally a rename, decided under a lock file beside it."""
    if is_remote(loc):
        bucket, key = _split(loc)
        client = _s3_client(_environment())
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            response = client.put_object(Bucket=bucket, Key=key, Body=data, **condition)
        except Exception as e:  # noqa: BLE001
            code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                raise Conflict(loc) from None
            if version is not None and code in ("NoSuchKey", "404"):
                raise Conflict(loc) from None
            _raise_store(loc, e)
        return response["ETag"]
    folder = os.path.dirname(loc)
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, f".{os.path.basename(loc)}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if read_versioned(loc)[1] != version:
            raise Conflict(loc)
        write_bytes(loc, data)
        return hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)
