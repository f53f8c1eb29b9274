"""The one retry policy of every object-storage request (botocore's and pyarrow's alike).

A request is the whole exchange: a GET and the reading of its body are one request, and a
failure anywhere in it retries all of it. Neither client retries on its own (their retries
are off in s3.py); `call` does, with exponential backoff and full jitter (the wait before
attempt n+1 is uniform in [0, min(cap, base * 2**n))):

- throttling (503 SlowDown, 429, RequestLimitExceeded, ThrottlingException): retried for
  the whole budget, REASSEMBLER_S3_RETRY_SECONDS (default 60 s from the first attempt);
  waits from 0.2 s doubling, capped at 10 s;
- transient (500, 502, 504, InternalError; a connection refused, reset or timed out; an
  incomplete body; pyarrow's NETWORK_CONNECTION and INTERNAL_FAILURE, which is how it says
  that an error body did not fit a short range read): a third of the budget; waits from
  0.05 s doubling, capped at 2 s;
- anything else (403, 404, NoSuchBucket, a failed precondition, a bad request): not retried.

Past the budget the request is a StoreError (exit 6) naming the object, the attempts, the
time and the last error. Cleanup after a failure (releasing the output lease) runs with a
short budget (`short_budget`), so that a store that is down ends the job soon, with the
error that ended it.
"""

from __future__ import annotations

import http.client
import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

from ..errors import ReassemblerError, StoreError
from ..settings import ENV_SECONDS, env_seconds

T = TypeVar("T")
THROTTLE, TRANSIENT = "throttling", "transient"
BACKOFF = {THROTTLE: (0.2, 10.0), TRANSIENT: (0.05, 2.0)}
TRANSIENT_SHARE = 1 / 3  # of the budget, for failures that are not throttling
CLEANUP_SECONDS = 5.0
DEFAULT_BUDGET = ENV_SECONDS["REASSEMBLER_S3_RETRY_SECONDS"]  # seconds

THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
        "ServiceUnavailable",
        "503",
        "429",
    }
)
TRANSIENT_CODES = frozenset(
    {"InternalError", "InternalFailure", "RequestTimeout", "RequestTimeoutException", "500", "502", "504"}
)
# pyarrow's S3 errors are OSErrors whose text carries the AWS SDK's error name
_PYARROW_THROTTLE = (
    "aws error slow_down",
    "aws error throttling",
    "aws error service_unavailable",
    "http status 503",
    "http status 429",
)
_PYARROW_TRANSIENT = (
    "aws error network_connection",
    "aws error internal_failure",
    "aws error request_timeout",
    "http status 500",
    "http status 502",
    "http status 504",
    "curlcode: 28",
    "curlcode: 56",
    "curlcode: 18",
)

log = logging.getLogger("reassembler.storage")
_clock: Callable[[], float] = time.monotonic
_sleep: Callable[[float], None] = time.sleep
_random = random.Random()
_local = threading.local()
_counts_lock = threading.Lock()
counts = {"requests_retried": 0, "retries": 0, "gave_up": 0}


def budget_seconds() -> float:
    override = getattr(_local, "budget", None)
    if override is not None:
        return override
    return env_seconds("REASSEMBLER_S3_RETRY_SECONDS")


@contextmanager
def short_budget(seconds: float = CLEANUP_SECONDS):
    """Requests of this thread, within the block, retry for at most `seconds`."""
    saved = getattr(_local, "budget", None)
    _local.budget = min(seconds, budget_seconds())
    try:
        yield
    finally:
        _local.budget = saved


def classify(exc: BaseException) -> str | None:
    """THROTTLE, TRANSIENT, or None (not to be retried)."""
    if isinstance(exc, (ReassemblerError, FileNotFoundError, PermissionError, KeyboardInterrupt)):
        return None
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:  # botocore's ClientError
        code = str(response.get("Error", {}).get("Code", ""))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in THROTTLE_CODES or status in (429, 503):
            return THROTTLE
        if code in TRANSIENT_CODES or (isinstance(status, int) and status >= 500):
            return TRANSIENT
        return None
    if _botocore_transport(exc):
        return TRANSIENT
    if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout, http.client.HTTPException)):
        return TRANSIENT
    if isinstance(exc, OSError):  # pyarrow's
        low = str(exc).lower()
        if any(s in low for s in _PYARROW_THROTTLE):
            return THROTTLE
        if any(s in low for s in _PYARROW_TRANSIENT):
            return TRANSIENT
    return None


def _botocore_transport(exc: BaseException) -> bool:
    try:
        from botocore import exceptions as be
        from urllib3 import exceptions as ue
    except ImportError:  # pragma: no cover - botocore is in the lock
        return False
    return isinstance(
        exc,
        (
            be.ConnectionError,  # refused, closed, timed out connecting or reading
            be.HTTPClientError,  # a response stream broken mid-body, among others
            be.IncompleteReadError,
            be.ReadTimeoutError,
            ue.ProtocolError,
            ue.ReadTimeoutError,
        ),
    )


def describe(exc: BaseException) -> str:
    """An error in a few words: S3's code, the operation and its message for botocore's
    ClientError (whose own text says "reached max retries: 0", our retries being here)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        error = response["Error"]
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        operation = getattr(exc, "operation_name", None)
        said = f"{error.get('Code') or status}{f' ({status})' if status and error.get('Code') else ''}"
        return f"{said}{f' on {operation}' if operation else ''}: {error.get('Message') or 'no message'}"[:300]
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def call(loc: str, what: str, fn: Callable[[], T]) -> T:
    """`fn()`, retried under the policy; a StoreError naming `loc` once the budget is spent."""
    start = _clock()
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as e:
            kind = classify(e)
            if kind is None:
                raise
            attempt += 1
            elapsed = _clock() - start
            base, cap = BACKOFF[kind]
            limit = budget_seconds() * (1.0 if kind == THROTTLE else TRANSIENT_SHARE)
            delay = _random.uniform(0, min(cap, base * 2 ** (attempt - 1)))
            if elapsed + delay >= limit:
                with _counts_lock:
                    counts["gave_up"] += 1
                raise gave_up(loc, what, e, kind, attempt, elapsed) from None
            with _counts_lock:
                counts["retries"] += 1
                counts["requests_retried"] += attempt == 1
            log.info("%s: %s failed (%s, %s); attempt %d in %.2f s", loc, what, kind, describe(e), attempt + 1, delay)
            _sleep(delay)


def gave_up(loc: str, what: str, exc: BaseException, kind: str, attempts: int, elapsed: float) -> StoreError:
    from .s3 import store_error

    known = store_error(loc, exc)
    said = str(known) if known is not None else f"{loc}: object storage error on {what} ({describe(exc)})"
    return StoreError(
        f"{said}; gave up after {attempts} attempt{'s' * (attempts != 1)} in {elapsed:.1f} s ({kind}; "
        "REASSEMBLER_S3_RETRY_SECONDS sets the budget)"
    )
