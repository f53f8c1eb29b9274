"""Locations: where a file is, as a string, local or on object storage.

A location is an absolute local path (`/data/capture/...`) or a URI `s3://bucket/key`.
Locations are never `pathlib.Path` objects: `Path("s3://capture")` is `s3:/capture`.
"""

from __future__ import annotations

import os

from ..errors import InputError

S3 = "s3://"


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


def split(loc: str) -> tuple[str, str]:
    """(bucket, key) of an s3:// location."""
    bucket, _, key = loc[len(S3) :].partition("/")
    return bucket, key
