"""The output lease on object storage (publish/lock.py), as an operator sees it: a build
that outlives a lease period still holds its output; a holder whose lease was taken over
leaves the new holder's lease alone; a lease that cannot be deleted is expired in place,
never an error of the build. Time is the lease's own `until`, not a guess."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from reassembler import storage
from reassembler.publish import lock

TAKE = """
import sys
from reassembler.errors import OutputBusy
from reassembler.publish.lock import OutputLock
try:
    with OutputLock(sys.argv[1], "2026-11-28", "build"):
        sys.exit(0)
except OutputBusy as e:
    print(e)
    sys.exit(3)
"""


def _lease(out: str) -> dict:
    data, _ = storage.read_versioned(f"{out}/_lock")
    return json.loads(data) if data is not None else {}


def test_a_build_that_outlives_its_lease_period_still_holds_the_output(s3, monkeypatch):
    monkeypatch.setattr(lock, "LEASE_SECONDS", 0.9)
    out = f"s3://{s3.bucket('rows')}/nightly"
    with lock.OutputLock(out, "2026-11-28", "build"):
        first = _lease(out)["until"]
        while time.time() < first + 0.5:  # past the first lease's end
            time.sleep(0.05)
        assert _lease(out)["until"] > time.time()  # renewed
        other = subprocess.run(  # another process (within one, the lock is re-entrant)
            [sys.executable, "-c", TAKE, out], capture_output=True, text=True, timeout=60
        )
        assert other.returncode == 3 and "output is busy, held by pid" in other.stdout, other.stderr
    assert storage.read_versioned(f"{out}/_lock") == (None, None)


def test_a_holder_whose_lease_was_taken_over_leaves_the_new_lease_alone(s3, monkeypatch):
    out = f"s3://{s3.bucket('rows')}/nightly"
    held = lock.OutputLock(out, "2026-11-28", "build")
    held.__enter__()
    lease = held._lease
    assert lease is not None
    lease._stop.set()  # the holder stalls: no renewal; another build takes the output over
    data, version = storage.read_versioned(f"{out}/_lock")
    taker = json.dumps({"pid": 1, "host": "other", "token": "new", "until": time.time() + 120}).encode()
    storage.put_if(f"{out}/_lock", taker, version)
    held.__exit__(None, None, None)  # the stalled holder ends
    assert json.loads(storage.read_versioned(f"{out}/_lock")[0])["token"] == "new"


def test_a_lease_that_cannot_be_deleted_is_expired_in_place(s3, monkeypatch, caplog):
    out = f"s3://{s3.bucket('rows')}/nightly"

    def refuse(*_):
        raise storage.s3.store_error(f"{out}/_lock", OSError("AWS Error INTERNAL_FAILURE during DeleteObject"))

    with lock.OutputLock(out, "2026-11-28", "build"):
        monkeypatch.setattr(storage, "delete_if", refuse)
    info = _lease(out)
    assert info["until"] < time.time() and info["released"] is True
    assert "could not be deleted" in caplog.text
    with lock.OutputLock(out, "2026-11-28", "build"):  # the next build takes it at once
        pass


def test_releasing_a_lease_whose_file_is_gone_is_quiet(tmp_path, caplog):
    """A lease deleted under its holder (a clean-up, an operator) is released without a
    word of a takeover: nobody else holds the output. On a local folder, where the
    conditional delete is decided under a lock file (storage/conditional.py)."""
    out = str(tmp_path / "out")
    lease = lock._Lease(lock.OutputLock(out, "2026-11-28", "build"))
    lease.take()
    storage.delete(f"{out}/_lock")
    assert storage.delete_if(f"{out}/_lock", lease.version) is True  # gone counts as deleted
    with caplog.at_level("INFO", logger="reassembler"):
        lease.release()
    assert "taken over" not in caplog.text and "could not be deleted" not in caplog.text
    assert storage.read_versioned(f"{out}/_lock") == (None, None)


def test_a_lease_whose_holder_on_this_host_is_dead_is_taken_over_at_once(s3):
    """A killed build's lease runs on for LEASE_SECONDS; its holder named a process of this
    host that no longer exists, so the rerun takes the output at once. A live holder here, or
    a process on another host, still holds it."""
    import socket

    out = f"s3://{s3.bucket('rows')}/nightly"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    until = time.time() + 600
    for pid, host, free in ((gone.pid, socket.gethostname(), True), (gone.pid, "other-host", False)):
        data, version = storage.read_versioned(f"{out}/_lock")
        held = json.dumps({"pid": pid, "host": host, "command": "build", "token": "old", "until": until}).encode()
        storage.put_if(f"{out}/_lock", held, version)
        other = subprocess.run([sys.executable, "-c", TAKE, out], capture_output=True, text=True, timeout=60)
        assert other.returncode == (0 if free else 3), (host, other.stdout, other.stderr)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        data, version = storage.read_versioned(f"{out}/_lock")
        held = json.dumps({"pid": live.pid, "host": socket.gethostname(), "token": "x", "until": until}).encode()
        storage.put_if(f"{out}/_lock", held, version)
        other = subprocess.run([sys.executable, "-c", TAKE, out], capture_output=True, text=True, timeout=60)
        live.kill()
    assert other.returncode == 3 and f"held by pid {live.pid}" in other.stdout
