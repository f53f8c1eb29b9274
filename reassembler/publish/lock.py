"""One lock per output, taken before anything in it is cleaned or written.

Locally `<output>/_lock` is held with `flock` by the process that builds (the whole
`build`; in the DAG, the load and publish tasks for their duration). The kernel releases it
when the holder dies, so a lock left by a killed process is simply taken over. flock is
reliable on local disks and on NFSv4; on other shared filesystems, run one writer per
output (the DAG's pool does).

On object storage `<output>/_lock` is a **lease**: an object written with a conditional
put (If-None-Match: * to take a free lease, If-Match: <etag> to take over an expired one or
to renew one's own), naming holder, host, ds, command, since and until when. The holder
renews it every LEASE_SECONDS / 3 on a thread; a holder that dies leaves it to expire
after LEASE_SECONDS, and the next build takes it over. Publishing does not rest on the
lease alone: the manifest's own conditional put decides between two publishers.

Either way the content names the holder for the one-line error a second build prints.
Shards never take it: they only read the warehouse and write their own run folder.

A process forked while the lock is held (a `--workers` build's worker processes) closes its
inherited copy of the lock's descriptor at once (`os.register_at_fork`): the lock belongs to
the process that took it, so a killed build frees its output though a worker were still
ending. A lease whose holder is a process of this host that no longer exists is taken over at
once, without waiting for it to expire.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime

from .. import storage
from ..errors import OutputBusy
from ..settings import env_seconds

LOCK_FILE = "_lock"
LEASE_SECONDS = env_seconds("REASSEMBLER_LEASE_SECONDS")
log = logging.getLogger(__name__)


class OutputLock:
    """`with OutputLock(output, ds, "build"):` ... Re-entrant within one process."""

    _held: dict[str, int] = {}  # location -> depth, per process
    _fds: set[int] = set()  # the descriptors of the local locks this process holds

    def __init__(self, output, ds: str, command: str, wait_seconds: float = 0.0):
        self.output = storage.location(output)
        self.path = storage.join(self.output, LOCK_FILE)
        self.ds, self.command, self.wait_seconds = ds, command, wait_seconds
        self._fd: int | None = None
        self._lease: _Lease | None = None

    def _info(self) -> dict:
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "ds": self.ds,
            "command": self.command,
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def holder(self) -> str:
        try:
            info = json.loads(storage.read_bytes(self.path) or b"{}")
        except Exception:  # noqa: BLE001 - unreadable or gone: the busy error stands
            info = {}
        return describe(info)

    def busy(self, info: dict | None = None) -> OutputBusy:
        who = describe(info) if info is not None else self.holder()
        return OutputBusy(f"{self.output}: output is busy, held by {who}; nothing was touched")

    def __enter__(self) -> OutputLock:
        if self._held.get(self.path):
            self._held[self.path] += 1
            return self
        if storage.is_remote(self.output):
            self._lease = _Lease(self)
            self._lease.take()
        else:
            self._take_local()
        self._held[self.path] = 1
        return self

    def _take_local(self) -> None:
        os.makedirs(self.output, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise self.busy() from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self._info()).encode(), 0)
        self._fd = fd
        OutputLock._fds.add(fd)

    def __exit__(self, *exc) -> None:
        self._held[self.path] -= 1
        if self._held[self.path]:
            return
        del self._held[self.path]
        if self._lease is not None:
            self._lease.release(quiet=exc[0] is not None)
            self._lease = None
        elif self._fd is not None:
            OutputLock._fds.discard(self._fd)
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _forget_in_child() -> None:
    """In a forked child: close the inherited descriptors of the parent's locks (closing, never
    unlocking: the parent's own descriptor keeps the lock), and forget the depths."""
    for fd in OutputLock._fds:
        try:
            os.close(fd)
        except OSError:
            pass
    OutputLock._fds = set()
    OutputLock._held = {}


os.register_at_fork(after_in_child=_forget_in_child)


def _holder_gone(info: dict) -> bool:
    """Whether a lease names a process of this host that no longer exists."""
    pid = info.get("pid")
    if info.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, as another user's
    return False


def describe(info: dict) -> str:
    if not info:
        return "another process"
    until = info.get("until")
    lease = ""
    if isinstance(until, (int, float)) and until < 1e11:
        lease = f", its lease runs until {datetime.fromtimestamp(until, UTC).isoformat(timespec='seconds')}"
    return (
        f"pid {info.get('pid')} on {info.get('host')} ({info.get('command')} ds={info.get('ds')}) "
        f"since {info.get('since')}{lease}"
    )


class _Lease:
    """The lease object of an output on object storage (the module docstring)."""

    def __init__(self, lock: OutputLock):
        self.lock = lock
        self.token = uuid.uuid4().hex
        self.version: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def _body(self) -> bytes:
        info = self.lock._info()
        info.update(token=self.token, until=time.time() + LEASE_SECONDS)
        return json.dumps(info).encode()

    def take(self) -> None:
        deadline = time.monotonic() + self.lock.wait_seconds
        while True:
            data, version = storage.read_versioned(self.lock.path)
            info = _parse(data)
            if data is None or info.get("until", 0) < time.time() or _holder_gone(info):
                try:
                    self.version = storage.put_if(self.lock.path, self._body(), version)
                    break
                except storage.Conflict:
                    pass  # another process took it first: look again
            elif time.monotonic() >= deadline:
                raise self.lock.busy(info)
            else:
                time.sleep(0.5)
        self._thread = threading.Thread(target=self._renew, name="output-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_SECONDS / 3):
            with self._guard, storage.retry.short_budget(LEASE_SECONDS / 6):
                try:
                    self.version = storage.put_if(self.lock.path, self._body(), self.version)
                except storage.Conflict:
                    log.error("%s: the output lease was taken over by another process", self.lock.path)
                    return
                except Exception as e:  # noqa: BLE001 - retried at the next renewal
                    log.warning("%s: renewing the output lease failed (%s)", self.lock.path, e)

    def release(self, quiet: bool = False) -> None:
        """Delete the lease if it is still this holder's (a conditional delete: a lease taken
        over by another process is left alone). Never raises: a lease that cannot be
        deleted is expired in place or left to expire, and logged (`quiet`: at INFO, when
        an error already ends the build: its one line is what the operator reads); the
        build's own outcome, or the error that ended it, stands."""
        level = logging.INFO if quiet else logging.WARNING
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        path = self.lock.path
        with self._guard, storage.retry.short_budget():
            try:
                if self.version is None or storage.delete_if(path, self.version):
                    return
                log.log(level, "%s: the output lease was taken over by another process; left to it", path)
                return
            except Exception as e:  # noqa: BLE001 - never replaces the build's outcome
                log.log(level, "%s: the output lease could not be deleted (%s)", path, storage.retry.describe(e))
            # a PUT may pass where the DELETE failed: an expired lease does not make the next
            # build wait; else the lease expires by itself
            info = self.lock._info()
            info.update(token=self.token, until=0, released=True)
            try:
                storage.put_if(path, json.dumps(info).encode(), self.version)
                log.log(level, "%s: the output lease was expired in place instead", path)
            except Exception as e:  # noqa: BLE001
                log.log(level, "%s: left to expire within %g s (%s)", path, LEASE_SECONDS, storage.retry.describe(e))


def _parse(data: bytes | None) -> dict:
    try:
        info = json.loads(data or b"{}")
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}
