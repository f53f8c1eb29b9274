"""Conditional writes: the one atomic decision between two writers of an object.

`put_if(loc, data, version)` writes only if the object is still at `version` (None: only if
it does not exist). On S3 that is a conditional put (If-None-Match: * / If-Match: <etag>);
locally a rename, decided under a lock file beside the object. The manifest and the output
lease are written this way (publish/).

A put whose answer was lost (a reset, a timeout, a 5xx after the store applied it) is
retried; the retry then fails its precondition against the writer's own object. So a
failed precondition reads the object again, and when it holds exactly the bytes this put
wrote, the put succeeded (every manifest and lease body is unique to its writer: a run id
and a time, a random token). Only a different object is a Conflict.
"""

from __future__ import annotations

import fcntl
import hashlib
import os

from . import local, s3
from .locations import is_remote, split

_CONFLICT_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


class Conflict(Exception):
    """A conditional write lost: the object is not (or no longer) what the writer read."""


def read_versioned(loc: str) -> tuple[bytes | None, str | None]:
    """The content of `loc` and its version tag (the ETag on S3, a digest locally), or
    (None, None) when it does not exist."""
    if is_remote(loc):
        return s3.get_versioned(loc)
    try:
        with open(loc, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None, None
    return data, hashlib.sha256(data).hexdigest()


def put_if(loc: str, data: bytes, version: str | None) -> str:
    """Write `loc` only if it is still at `version`, in one atomic step; the new version,
    or Conflict."""
    if is_remote(loc):
        return _put_if_s3(loc, data, version)
    folder = os.path.dirname(loc)
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, f".{os.path.basename(loc)}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if read_versioned(loc)[1] != version:
            raise Conflict(loc)
        local.write_bytes(loc, data)
        return hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)


def _put_if_s3(loc: str, data: bytes, version: str | None) -> str:
    bucket, key = split(loc)
    condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}

    def attempt() -> str:
        try:
            return s3.client().put_object(Bucket=bucket, Key=key, Body=data, **condition)["ETag"]
        except Exception as e:
            code = s3.error_code(e)
            if code in _CONFLICT_CODES or (version is not None and code in ("NoSuchKey", "404")):
                current, tag = s3.get_versioned(loc)
                if current == data and tag is not None:
                    return tag  # this writer's own earlier attempt landed; its answer was lost
                raise Conflict(loc) from None
            raise

    return s3.request(loc, "PUT (conditional)", attempt)


def delete_if(loc: str, version: str) -> bool:
    """Delete `loc` only if it is still at `version`; False when it is not (another writer's
    now), True when deleted or already gone. On S3 a conditional delete (If-Match)."""
    if is_remote(loc):
        bucket, key = split(loc)

        def attempt() -> bool:
            try:
                s3.client().delete_object(Bucket=bucket, Key=key, IfMatch=version)
                return True
            except Exception as e:
                code = s3.error_code(e)
                if code in ("NoSuchKey", "404"):
                    return True  # gone (an earlier attempt's answer was lost)
                if code in _CONFLICT_CODES:
                    return False
                raise

        return s3.request(loc, "DELETE (conditional)", attempt)
    folder = os.path.dirname(loc)
    fd = os.open(os.path.join(folder, f".{os.path.basename(loc)}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        current = read_versioned(loc)[1]
        if current is not None and current != version:
            return False
        local.delete(loc)
        return True
    finally:
        os.close(fd)
