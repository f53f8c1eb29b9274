"""A child process of the load: this interpreter running one module's `_child()`, its results
pickled to a temporary file (rollout_lines.py and capture_children.py start them).

The child is `python -P -c "...; from <module> import _child; _child()" <package folder>`
(pandas kept out first: `keep_pandas_out`): this interpreter, without the working folder on
its path (-P: nothing there shadows a module), importing this package as this process does,
else from the folder this file was loaded from (appended, so it never shadows anything
either). Its work comes on stdin (given at the start, or later with `give`), its results go
to stdout as pickled `(kind, payload)` records (`Records`, in the child), and its stderr to
a temporary file.

On this side, `records` yields the child's records in order as the child writes them
(each a length-prefixed pickle, so a record half written is waited for, never read), so
that this process takes a child's first results while it parses the rest. The record the
caller names `last` is given only once the child has ended with exit code 0. A child that
ended with another exit code (killed, or failed before it could say why) is a RuntimeError
naming the code and its last stderr line; the caller has then used part of its results,
and its error fails the load that holds them (a part is rewritten whole: part_load.py). An
"input_error" record is raised as the InputError it was, an "error" record as a
RuntimeError; results cut short are "unreadable results". `close` kills and reaps a child
still running.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from ..errors import InputError

PACKAGE_FOLDER = str(Path(__file__).resolve().parents[2])
FRAME = struct.Struct("<Q")  # a record's length, before its pickle
POLL_FIRST, POLL_MAX = 0.001, 0.02  # s: waits for a record the child is still writing


class _KeepPandasOut:
    """pyarrow and DuckDB import pandas (0.3-0.5 s, most of it CPU) the first time they are
    handed Python objects, only to ask whether those are DataFrames; the command and the
    load's children never hand them one. (A meta path finder: `find_spec` is all the import
    system asks of one.)"""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not used by the reassembler command", name=name)
        return None


PARENT_POLL = 0.25  # s: how often a worker or child looks whether its parent is still there
EXIT_PARENT_GONE = 75  # the exit code of a worker or child whose parent was killed


def watch_parent(interval: float = PARENT_POLL) -> None:
    """In a worker process (`--workers`) or a load child: end this process at once when the
    process that started it is gone (killed: the kernel hands the orphan to another parent),
    so that no worker outlives a killed build, holding its output or writing into its run.
    A daemon thread polls the parent's pid (a prctl death signal would follow the thread
    that forked, not the process)."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def worker_start(relay=None) -> None:
    """The initializer of the job's worker processes (ProcessPoolExecutor): watch the parent,
    and draw progress through the parent's bars (progress.relay_to) when it gives a relay."""
    watch_parent()
    if relay is not None:
        from .. import progress

        progress.relay_to(relay)


def keep_pandas_out() -> None:
    """Keep pandas from being imported in this process: only for a process of the job's own
    (the `reassembler` command, a load child), never one that imports the package (tests,
    an Airflow worker, a notebook), whose own code may want pandas after pyarrow found none."""
    if "pandas" not in sys.modules and not any(isinstance(f, _KeepPandasOut) for f in sys.meta_path):
        sys.meta_path.insert(0, _KeepPandasOut())


class ChildProcess:
    def __init__(self, module: str, name: str, work: bytes | None = None):
        """Start `module`'s `_child()`; `name` says what it is in errors. `work`: its stdin,
        whole; None: a pipe, for `give`."""
        self.name = name
        self._out: IO[bytes] = tempfile.TemporaryFile(prefix="reassembler-child-")
        self._err: IO[bytes] = tempfile.TemporaryFile(prefix="reassembler-child-")
        command = [
            sys.executable,
            "-P",
            "-c",
            "import sys; sys.path.append(sys.argv[1]); from reassembler.load.child_process import keep_pandas_out, "
            f"watch_parent; keep_pandas_out(); watch_parent(); from {module} import _child; _child()",
        ]
        try:
            if work is None:
                self._proc: subprocess.Popen | None = subprocess.Popen(
                    [*command, PACKAGE_FOLDER], stdin=subprocess.PIPE, stdout=self._out, stderr=self._err
                )
            else:
                with tempfile.TemporaryFile(prefix="reassembler-child-") as stdin:  # a file: no pipe to break
                    stdin.write(work)
                    stdin.seek(0)
                    self._proc = subprocess.Popen(
                        [*command, PACKAGE_FOLDER], stdin=stdin, stdout=self._out, stderr=self._err
                    )
        except BaseException:
            self._out.close()
            self._err.close()
            raise

    def give(self, work: bytes) -> None:
        """The work of a child started without it: its whole stdin."""
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(work)
            self._proc.stdin.close()
        except OSError:
            pass  # it has ended already: `records` says how

    def done(self) -> bool:
        return self._proc is None or self._proc.poll() is not None

    def records(self, last: str) -> Iterator[tuple[str, object]]:
        """The child's records in order, as it writes them; the record of kind `last` (its
        final one) once the child has ended well (the module docstring)."""
        assert self._proc is not None
        fd, offset, pause = self._out.fileno(), 0, POLL_FIRST
        while True:
            # fstat and pread, never read: the child writes through the same open file
            end = os.fstat(fd).st_size
            size = FRAME.unpack(os.pread(fd, FRAME.size, offset))[0] if end >= offset + FRAME.size else None
            if size is None or end < offset + FRAME.size + size:  # not all written yet
                if self._proc.poll() is None:
                    time.sleep(pause)
                    pause = min(2 * pause, POLL_MAX)
                    continue
                self._ended()
                if os.fstat(fd).st_size > end:
                    continue  # it wrote more before it ended
                raise RuntimeError(f"{self.name} process left unreadable results (cut short)")
            body = os.pread(fd, size, offset + FRAME.size)
            offset += FRAME.size + len(body)
            pause = POLL_FIRST
            try:
                kind, payload = pickle.loads(body)
            except (pickle.UnpicklingError, EOFError, ValueError) as e:
                raise RuntimeError(f"{self.name} process left unreadable results ({e})") from None
            if kind == "input_error":
                raise InputError(payload)
            if kind == "error":
                raise RuntimeError(f"{self.name}: {payload}")
            if kind == last:
                self._proc.wait()
                self._ended()  # its last record only once it ended well
                yield kind, payload
                return
            yield kind, payload

    def _ended(self) -> None:
        """Raise the child's failure if it ended with another exit code than 0."""
        assert self._proc is not None
        code = self._proc.poll()
        if code is not None and code != 0:
            self._err.seek(0)
            said = self._err.read().decode("utf-8", "replace").strip().splitlines()
            last = said[-1] if said else "no output"
            raise RuntimeError(f"{self.name} process ended with exit code {code}: {last}")

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        self._out.close()
        self._err.close()


class Records:
    """In the child: `(kind, payload)` records pickled to its stdout."""

    def __init__(self) -> None:
        self.out = os.fdopen(sys.stdout.fileno(), "wb", closefd=False)

    def put(self, kind: str, payload) -> None:
        """One record, whole: its length, then its pickle; flushed, so the parent can take it."""
        body = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
        self.out.write(FRAME.pack(len(body)))
        self.out.write(body)
        self.out.flush()

    def run(self, work: Callable[[], None]) -> None:
        """`work()`, its errors made records for the parent, which raises them."""
        try:
            work()
        except InputError as e:
            self.put("input_error", str(e))
        except Exception as e:  # noqa: BLE001 - said by the parent, which raises it
            self.put("error", f"{type(e).__name__}: {e}")
        finally:
            self.out.flush()
