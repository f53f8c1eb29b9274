"""The retry policy of every object-storage request (reassembler/storage/retry.py), on a
clock the test controls; every botocore and pyarrow error type a store can raise ends as
exit 6 with one line, never exit 70; batched deletes; conditional writes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore import exceptions as be
from urllib3 import exceptions as ue

from nights import DS
from reassembler import storage
from reassembler.errors import EXIT_STORE, StoreError
from reassembler.storage import retry


class Clock:
    """time.monotonic and time.sleep for the policy: sleeping advances the clock."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(retry, "_clock", c.monotonic)
    monkeypatch.setattr(retry, "_sleep", c.sleep)
    monkeypatch.delenv("REASSEMBLER_S3_RETRY_SECONDS", raising=False)
    return c


def client_error(code: str, status: int, operation: str = "GetObject") -> be.ClientError:
    return be.ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


URL = "http://127.0.0.1:9/b/k"
# every error a store or its clients raise for a passing fault, by the kind the policy gives it
PASSING = {
    "503 SlowDown": (client_error("SlowDown", 503), retry.THROTTLE),
    "429": (client_error("TooManyRequests", 429), retry.THROTTLE),
    "429 without a code": (client_error("", 429), retry.THROTTLE),
    "503 with a code not listed (MinIO's SlowDownWrite)": (client_error("SlowDownWrite", 503), retry.THROTTLE),
    "RequestLimitExceeded": (client_error("RequestLimitExceeded", 400), retry.THROTTLE),
    "HeadBucket 503 (no body)": (client_error("503", 503, "HeadBucket"), retry.THROTTLE),
    "500 InternalError": (client_error("InternalError", 500), retry.TRANSIENT),
    "502": (client_error("502", 502), retry.TRANSIENT),
    "EndpointConnectionError": (be.EndpointConnectionError(endpoint_url=URL), retry.TRANSIENT),
    "ConnectionClosedError": (be.ConnectionClosedError(endpoint_url=URL), retry.TRANSIENT),
    "ReadTimeoutError": (be.ReadTimeoutError(endpoint_url=URL), retry.TRANSIENT),
    "ConnectTimeoutError": (be.ConnectTimeoutError(endpoint_url=URL), retry.TRANSIENT),
    "ResponseStreamingError": (be.ResponseStreamingError(error=ConnectionResetError(104, "reset")), retry.TRANSIENT),
    "IncompleteReadError": (be.IncompleteReadError(actual_bytes=1, expected_bytes=2), retry.TRANSIENT),
    "urllib3 ProtocolError": (ue.ProtocolError("Connection broken"), retry.TRANSIENT),
    "ConnectionResetError": (ConnectionResetError(104, "Connection reset by peer"), retry.TRANSIENT),
    "socket timeout": (TimeoutError("timed out"), retry.TRANSIENT),
    "pyarrow reset": (
        OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 56, Failure when receiving data"),
        retry.TRANSIENT,
    ),
    "pyarrow short range": (
        OSError(
            "AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response stream (eof: 0, bad: 1)"
        ),
        retry.TRANSIENT,
    ),
    "pyarrow SlowDown": (OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce"), retry.THROTTLE),
    "pyarrow HEAD 503": (
        OSError(
            "When reading information for key 'k': AWS Error UNKNOWN (HTTP status 503) during HeadObject operation"
        ),
        retry.THROTTLE,
    ),
    "pyarrow refused": (
        OSError("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect to server"),
        retry.TRANSIENT,
    ),
}
FINAL = {
    "403 AccessDenied": client_error("AccessDenied", 403),
    "NoSuchBucket": client_error("NoSuchBucket", 404),
    "NoCredentialsError": be.NoCredentialsError(),
    "pyarrow ACCESS_DENIED": OSError("AWS Error ACCESS_DENIED during HeadObject operation: Access Denied"),
    "pyarrow 400": OSError("AWS Error UNKNOWN (HTTP status 400) during GetObject operation: Bad Request"),
}


@pytest.mark.parametrize("name", list(PASSING))
def test_a_passing_fault_is_retried_until_the_request_succeeds(clock, name):
    exc, kind = PASSING[name]
    assert retry.classify(exc) == kind
    failures = iter([exc] * 4)

    def request():
        if (e := next(failures, None)) is not None:
            raise e
        return "body"

    assert retry.call("s3://b/k", "GET", request) == "body"
    base, cap = retry.BACKOFF[kind]
    assert len(clock.sleeps) == 4  # full jitter: each wait below its doubling bound
    assert all(0 <= s < min(cap, base * 2**n) for n, s in enumerate(clock.sleeps))


@pytest.mark.parametrize("name", list(PASSING))
def test_a_fault_that_outlasts_the_budget_is_one_store_error_naming_the_object(clock, name):
    exc, kind = PASSING[name]

    def request():
        raise exc

    with pytest.raises(StoreError) as raised:
        retry.call("s3://b/night/k.parquet", "GET", request)
    message = str(raised.value)
    assert message.startswith("s3://b/night/k.parquet: ") and "\n" not in message
    assert "gave up after" in message and kind in message
    budget = 60.0 if kind == retry.THROTTLE else 20.0  # throttling: the whole budget; the rest a third
    assert budget - retry.BACKOFF[kind][1] <= clock.now <= budget


@pytest.mark.parametrize("name", list(FINAL))
def test_a_final_refusal_is_not_retried(clock, name):
    exc = FINAL[name]
    assert retry.classify(exc) is None

    def request():
        raise exc

    with pytest.raises(StoreError) as raised:
        storage.s3.request("s3://b/k", "GET", request)
    assert clock.sleeps == [] and str(raised.value).startswith("s3://b/k: ")


def test_a_two_second_throttling_burst_is_waited_out(clock):
    def request():
        if clock.now < 2.0:
            raise client_error("SlowDown", 503)
        return "ok"

    assert retry.call("s3://b/k", "GET", request) == "ok"
    assert 2.0 <= clock.now < 2.0 + retry.BACKOFF[retry.THROTTLE][1]


def test_the_budget_is_set_by_the_environment_and_shortened_for_cleanup(clock, monkeypatch):
    monkeypatch.setenv("REASSEMBLER_S3_RETRY_SECONDS", "6")

    def throttled():
        raise client_error("SlowDown", 503)

    with pytest.raises(StoreError):
        retry.call("s3://b/k", "GET", throttled)
    assert clock.now <= 6.0
    clock.now = 0.0
    with retry.short_budget(1.0), pytest.raises(StoreError):
        retry.call("s3://b/k", "DELETE", throttled)
    assert clock.now <= 1.0
    monkeypatch.setenv("REASSEMBLER_S3_RETRY_SECONDS", "0.5")  # shorter than the cleanup's own budget
    clock.now = 0.0
    with retry.short_budget(), pytest.raises(StoreError):
        retry.call("s3://b/k", "DELETE", throttled)
    assert clock.now <= 0.5


def test_a_failure_in_one_of_several_parallel_requests_fails_the_step(clock):
    """Copies, uploads and deletes run several at once (storage.s3.each): one that fails is
    raised once the others have finished, never dropped."""
    done: list[int] = []

    def request(k: int) -> None:
        if k == 3:
            raise storage.s3.store_error(f"s3://b/k{k}", client_error("AccessDenied", 403, "CopyObject"))
        done.append(k)

    with pytest.raises(StoreError, match=r"s3://b/k3: "):
        storage.s3.each(request, list(range(8)), threads=4)
    assert sorted(done) == [0, 1, 2, 4, 5, 6, 7]


def test_a_conditional_request_conflict_is_a_conflict_not_a_store_error(clock, monkeypatch):
    """S3 answers a conditional write that races another with 409 ConditionalRequestConflict:
    another writer's object, so the put lost (storage.Conflict), it did not fail (exit 6)."""
    from reassembler.storage import conditional

    class Client:
        def put_object(self, **kw):
            raise client_error("ConditionalRequestConflict", 409, "PutObject")

    monkeypatch.setattr(storage.s3, "client", lambda: Client())
    monkeypatch.setattr(storage.s3, "get_versioned", lambda loc: (b"another writer's", '"e2"'))
    with pytest.raises(storage.Conflict):
        conditional.put_if("s3://b/_lock", b"mine", '"e1"')
    assert clock.sleeps == []


class Raising:
    """A client or filesystem whose every call raises `exc`."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __getattr__(self, name):
        def call(*args, **kwargs):
            raise self.exc

        return call


@pytest.mark.parametrize("client", ["botocore", "pyarrow"])
@pytest.mark.parametrize("name", [*PASSING, *FINAL])
def test_no_store_error_type_ends_in_exit_70(s3, tmp_path, monkeypatch, capsys, client, name):
    """A build whose every request of one client raises this error type: exit 6, one line."""
    from reassembler.cli import main

    exc = PASSING[name][0] if name in PASSING else FINAL[name]
    monkeypatch.setenv("REASSEMBLER_S3_RETRY_SECONDS", "0")
    bucket = s3.bucket("faults")
    storage.write_bytes(f"s3://{bucket}/in/rollouts/ds={DS}/part-000.jsonl", b"{}\n")
    storage.write_bytes(f"s3://{bucket}/in/ledger/ds={DS}/part-000.jsonl", b"{}\n")
    target = "client" if client == "botocore" else "filesystem"
    monkeypatch.setattr(storage.s3, target, lambda: Raising(exc))
    code = main(["build", "--input", f"s3://{bucket}/in", "--output", str(tmp_path / "out"), "--ds", DS])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_STORE, err
    assert err.startswith("reassembler: error: ") and "\n" not in err, err


def test_deleting_a_tree_of_more_than_1000_objects(s3):
    root = f"s3://{s3.bucket()}/tree"
    client, bucket = s3.client(), root[5:].split("/")[0]
    with ThreadPoolExecutor(8) as pool:  # past one DeleteObjects request (1,000 keys)
        list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=f"tree/{k // 100}/{k}", Body=b"x"), range(1234)))
    client.put_object(Bucket=bucket, Key="tree-sibling", Body=b"kept")
    storage.delete_tree(root)
    assert storage.list_files(root, "", recursive=True) == []
    assert storage.read_bytes(f"s3://{root[5:].split('/')[0]}/tree-sibling") == b"kept"


def test_keys_a_batch_delete_could_not_delete_are_deleted_again(s3, monkeypatch):
    """S3 answers a DeleteObjects 200 and lists the keys it did not delete (InternalError,
    SlowDown per key): those are sent again; none is left behind."""
    root = f"s3://{s3.bucket()}/tree"
    for k in range(30):
        storage.write_bytes(f"{root}/{k}", b"x")
    real = storage.s3.client()
    refused = []

    class Flaky:
        def __getattr__(self, name):
            return getattr(real, name)

        def delete_objects(self, Bucket, Delete):
            keys = [o["Key"] for o in Delete["Objects"]]
            if not refused:  # the first answer: a third of the keys not deleted
                refused.extend(keys[::3])
                real.delete_objects(Bucket=Bucket, Delete={"Objects": [{"Key": k} for k in keys if k not in refused]})
                return {"Errors": [{"Key": k, "Code": "InternalError", "Message": "retry"} for k in refused]}
            return real.delete_objects(Bucket=Bucket, Delete=Delete)

    monkeypatch.setattr(storage.s3, "client", lambda: Flaky())
    monkeypatch.setattr(retry, "_sleep", lambda s: None)
    storage.delete_tree(root)
    assert len(refused) == 10
    assert storage.list_files(root, "", recursive=True) == []


@pytest.mark.parametrize("store", ["s3", "local"])
def test_conditional_writes(request, tmp_path, store):
    """A put at the version read wins once; a put on an object changed or deleted since
    it was read loses; a conditional delete leaves another writer's object alone."""
    if store == "s3":
        root = f"s3://{request.getfixturevalue('s3').bucket()}"
    else:
        root = str(tmp_path)
    loc = f"{root}/manifest.json"
    first = storage.put_if(loc, b"one", None)
    with pytest.raises(storage.Conflict):
        storage.put_if(loc, b"two", None)  # it exists now
    second = storage.put_if(loc, b"two", first)
    with pytest.raises(storage.Conflict):
        storage.put_if(loc, b"three", first)  # changed since `first` was read
    assert storage.delete_if(loc, first) is False and storage.read_versioned(loc) == (b"two", second)
    storage.delete(loc)
    with pytest.raises(storage.Conflict):
        storage.put_if(loc, b"four", second)  # deleted since it was read
    assert storage.read_versioned(loc) == (None, None)
    third = storage.put_if(loc, b"five", None)
    assert storage.delete_if(loc, third) is True and storage.read_versioned(loc) == (None, None)
