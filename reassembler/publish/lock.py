"""One lock per output folder, taken before anything in it is cleaned or written.

`<output>/_lock` is held with `flock` by the process that builds (the whole `build`; in the
DAG, the load and publish tasks for their duration). The kernel releases it when the
holder dies, so a lock left by a killed process is simply taken over. The file's content
names the holder (pid, host, ds, command, since when) for the one-line error a second
build prints. Shards never take it: they only read the warehouse and write their own
staging folder.

A note for shared filesystems: flock is reliable on local disks and on NFSv4; on others,
run one writer per output (the DAG's pool does).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

from ..errors import OutputBusy

LOCK_FILE = "_lock"


class OutputLock:
    """`with OutputLock(output, ds, "build"):` ... Re-entrant within one process."""

    _held: dict[str, int] = {}  # path -> depth, per process

    def __init__(self, output: str | Path, ds: str, command: str, wait_seconds: float = 0.0):
        self.path = Path(output) / LOCK_FILE
        self.ds, self.command, self.wait_seconds = ds, command, wait_seconds
        self._fd: int | None = None

    def holder(self) -> str:
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            info = {}
        if not info:
            return "another process"
        return (
            f"pid {info.get('pid')} on {info.get('host')} ({info.get('command')} ds={info.get('ds')}) "
            f"since {info.get('since')}"
        )

    def __enter__(self) -> OutputLock:
        key = str(self.path.resolve())
        if self._held.get(key):
            self._held[key] += 1
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise OutputBusy(
                        f"{self.path.parent}: output is busy, held by {self.holder()}; nothing was touched"
                    ) from None
                time.sleep(0.2)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "ds": self.ds,
            "command": self.command,
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        self._held[key] = 1
        return self

    def __exit__(self, *exc) -> None:
        key = str(self.path.resolve())
        self._held[key] -= 1
        if self._held[key] == 0 and self._fd is not None:
            del self._held[key]
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
