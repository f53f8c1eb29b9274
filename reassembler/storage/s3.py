"""The S3 client: every object-storage request, each through the retry policy (retry.py).

Object storage is reached with botocore (whole-object GETs and PUTs, conditional puts,
copies, batched deletes, uploads) and pyarrow's S3FileSystem (ranged reads, listings,
HEADs), both configured from the standard AWS environment: `AWS_ENDPOINT_URL` (an
S3-compatible server; path-style addressing, as those servers need), `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_DEFAULT_REGION` (default us-east-1).
Neither client retries by itself: `retry.call` decides, for the whole request (a GET and
the read of its body together). A failure that is not retried, or outlasts the budget, is
a StoreError: one line naming the object, exit code 6.
"""

from __future__ import annotations

import errno
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from ..errors import StoreError
from . import retry
from .locations import S3, split

_CONNECT_TIMEOUT = 5.0
_REQUEST_TIMEOUT = 60.0
POOL_CONNECTIONS = 64  # botocore's default of 10 would make the read-ahead threads wait their turn
SINGLE_PUT_BYTES = 64 << 20  # an upload above this goes in parts, each retried alone
PART_BYTES = 16 << 20
UPLOAD_THREADS = 4


def endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _region() -> str:
    return os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"


def _environment() -> tuple:
    names = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    return tuple(os.environ.get(k) for k in (*names, "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION"))


def filesystem(attempts: int = 1):
    """pyarrow's S3FileSystem for the current AWS environment: its own retries off (this
    module retries), or `attempts` for a reader this module cannot wrap (the per-call views
    DuckDB scans through pyarrow datasets: call_tables.py)."""
    return _filesystem(_environment(), attempts)


def client():
    """botocore's S3 client for the current AWS environment (its own retries off)."""
    return _client(_environment())


@lru_cache(maxsize=4)
def _filesystem(environment: tuple, attempts: int = 1):
    from pyarrow import fs

    kwargs = {}
    if url := endpoint():
        scheme, _, host = url.partition("://")
        kwargs = {"endpoint_override": host or scheme, "scheme": scheme if host else "https"}
    return fs.S3FileSystem(
        region=_region(),
        connect_timeout=_CONNECT_TIMEOUT,
        request_timeout=_REQUEST_TIMEOUT,
        force_virtual_addressing=False,
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=attempts),
        **kwargs,
    )


@lru_cache(maxsize=4)
def _client(environment: tuple):
    import botocore.config
    import botocore.session

    session = botocore.session.get_session()
    config = botocore.config.Config(
        s3={"addressing_style": "path"},
        connect_timeout=_CONNECT_TIMEOUT,
        read_timeout=_REQUEST_TIMEOUT,
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=POOL_CONNECTIONS,
    )
    return session.create_client("s3", region_name=_region(), endpoint_url=endpoint(), config=config)


# ---------------------------------------------------------------- failures said in one line


def store_error(loc: str, exc: BaseException) -> StoreError | None:
    """One line for an object-storage failure, or None when it is not one."""
    if not loc.startswith(S3):
        return None
    if isinstance(exc, StoreError):
        return exc
    text = " ".join(str(exc).split())
    low = text.lower()
    code = error_code(exc)
    where = endpoint() or "AWS S3"
    if code in ("NoSuchBucket",) or "nosuchbucket" in low or "bucket does not exist" in low or "no_such_bucket" in low:
        return no_bucket(loc)
    denied = ("invalidaccesskeyid", "signaturedoesnotmatch", "access denied", "accessdenied", "access_denied")
    if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or any(s in low for s in denied):
        return denied_error(loc)
    if "unable to locate credentials" in low or type(exc).__name__ == "NoCredentialsError":
        return StoreError(f"{loc}: no AWS credentials found (set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
    unreachable = (
        "couldn't connect",
        "could not connect",
        "connection refused",
        "curlcode: 7,",
        "couldn't resolve",
        "could not resolve",
        "connect timeout",
        "endpointconnectionerror",
        "could not connect to the endpoint url",
    )
    if any(s in low for s in unreachable) or type(exc).__name__ in ("EndpointConnectionError", "ConnectTimeoutError"):
        return StoreError(f"{loc}: cannot reach the object store at {where} (set AWS_ENDPOINT_URL?)")
    if retry.classify(exc) is not None or code or "aws error" in low or type(exc).__module__.startswith("botocore"):
        return StoreError(f"{loc}: object storage error ({retry.describe(exc)})")
    return None


def no_bucket(loc: str) -> StoreError:
    return StoreError(f"{loc}: bucket {split(loc)[0]} does not exist at {endpoint() or 'AWS S3'}")


def denied_error(loc: str) -> StoreError:
    return StoreError(
        f"{loc}: access denied by {endpoint() or 'AWS S3'} (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
        "and the bucket's policy)"
    )


def _missing(loc: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "No such file", loc)


def request(loc: str, what: str, fn):
    """`fn()` under the retry policy; any failure left is a StoreError naming `loc` (a
    missing object stays FileNotFoundError)."""
    try:
        return retry.call(loc, what, fn)
    except StoreError:
        raise
    except FileNotFoundError:
        raise _missing(loc) from None
    except Exception as e:
        if _is_missing(e):
            raise _missing(loc) from None
        found = store_error(loc, e)
        if found is None:
            raise
        raise found from None


def error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ClientError ('' for anything else)."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _is_missing(exc: BaseException) -> bool:
    code = error_code(exc)
    if code in ("NoSuchKey", "404", "NotFound"):
        return True
    return isinstance(exc, OSError) and "path does not exist" in str(exc).lower()


# ---------------------------------------------------------------- requests


def get(loc: str, limit: int | None = None) -> bytes:
    """The whole object in one GET (pyarrow's streams would send a HEAD first); with
    `limit`, at most its first `limit` + 1 bytes (the rest of the body is never read)."""
    bucket, key = split(loc)

    def fetch() -> bytes:
        body = client().get_object(Bucket=bucket, Key=key)["Body"]
        if limit is None:
            return body.read()
        try:
            return body.read(limit + 1)
        finally:
            body.close()

    return request(loc, "GET", fetch)


def get_versioned(loc: str) -> tuple[bytes | None, str | None]:
    """The object and its ETag, or (None, None)."""
    bucket, key = split(loc)

    def fetch():
        response = client().get_object(Bucket=bucket, Key=key)
        return response["Body"].read(), response["ETag"]

    try:
        return request(loc, "GET", fetch)
    except FileNotFoundError:
        return None, None


def put(loc: str, data: bytes, **condition) -> str:
    """PUT the object whole (with a condition: IfNoneMatch / IfMatch); its new ETag."""
    bucket, key = split(loc)
    return request(loc, "PUT", lambda: client().put_object(Bucket=bucket, Key=key, Body=data, **condition)["ETag"])


def info(loc: str):
    """pyarrow's FileInfo of the object or prefix (NotFound when neither)."""
    path = loc[len(S3) :]
    return request(loc, "HEAD", lambda: filesystem().get_file_info(path))


def listing(folder: str, recursive: bool) -> list:
    """pyarrow's FileInfos under a prefix (every page; none when it holds nothing)."""
    from pyarrow import fs

    path = folder[len(S3) :]
    selector = fs.FileSelector(path, recursive=recursive, allow_not_found=True)
    return request(folder, "LIST", lambda: filesystem().get_file_info(selector))


def head_bucket(loc: str) -> None:
    bucket = split(loc)[0]
    try:
        request(loc, "HeadBucket", lambda: client().head_bucket(Bucket=bucket))
    except FileNotFoundError:
        raise no_bucket(loc) from None


def delete(loc: str) -> None:
    """Delete one object (a missing one is fine). botocore, not pyarrow: pyarrow leaves an
    empty "folder/" object behind."""
    bucket, key = split(loc)
    try:
        request(loc, "DELETE", lambda: client().delete_object(Bucket=bucket, Key=key))
    except FileNotFoundError:
        pass


class _BatchFailed(Exception):
    """Some keys of a DeleteObjects batch were not deleted (S3 answers 200 and lists them)."""

    def __init__(self, error: dict):
        super().__init__(f"{error.get('Code')}: {error.get('Message')} ({error.get('Key')})")
        self.response = {"Error": {"Code": error.get("Code", ""), "Message": error.get("Message", "")}}


def delete_keys(root: str, keys: list[str], threads: int = 8) -> None:
    """Delete objects of one bucket, 1,000 a request (S3's limit), the requests at once; a
    key the store could not delete is retried with its batch's others."""
    bucket = split(root)[0]

    def batch(part: list[str]) -> None:
        left = list(part)

        def attempt() -> None:
            nonlocal left
            objects = {"Objects": [{"Key": k} for k in left], "Quiet": True}
            errors = client().delete_objects(Bucket=bucket, Delete=objects).get("Errors", [])
            failed = [e for e in errors if e.get("Code") != "NoSuchKey"]
            if failed:
                left = [e["Key"] for e in failed]
                raise _BatchFailed(failed[0])

        request(f"{S3}{bucket}/{part[0]}", "DeleteObjects", attempt)

    parts = [keys[k : k + 1000] for k in range(0, len(keys), 1000)]
    each(batch, parts, threads)


def copy(src: str, dst: str) -> None:
    """A server-side copy (no byte passes through this process; objects up to 5 GiB)."""
    (sb, sk), (db, dk) = split(src), split(dst)
    request(src, "COPY", lambda: client().copy_object(Bucket=db, Key=dk, CopySource={"Bucket": sb, "Key": sk}))


def each(fn, items: list, threads: int) -> None:
    """`fn(item)` for every item, up to `threads` at once; the first failure is raised
    after the others finished (nothing is left running)."""
    if len(items) <= 1 or threads <= 1:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="store") as pool:
        futures = [pool.submit(fn, item) for item in items]
    for future in futures:
        future.result()
