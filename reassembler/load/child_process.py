"""A child process of the load: this interpreter running one module's `_child()`, its results
pickled to a temporary file (rollout_lines.py and capture_children.py start them).

The child is `python -P -c "...; from <module> import _child; _child()" <package folder>`:
this interpreter, without the working folder on its path (-P: nothing there shadows a
module), importing this package as this process does, else from the folder this file was
loaded from (appended, so it never shadows anything either). Its work comes on stdin (given
at the start, or later with `give`), its results go to stdout as pickled `(kind, payload)`
records (`Records`, in the child), and its stderr to a temporary file.

On this side, `records` waits for the child, then yields its records in order until the
caller stops: a child that ended with another exit code than 0 (killed, or failed before it
could say why) is a RuntimeError naming the code and its last stderr line, and nothing it
wrote is used; an "input_error" record is raised as the InputError it was, an "error"
record as a RuntimeError; results cut short are "unreadable results". `close` kills and
reaps a child still running.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from ..errors import InputError

PACKAGE_FOLDER = str(Path(__file__).resolve().parents[2])


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
            f"import sys; sys.path.append(sys.argv[1]); from {module} import _child; _child()",
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

    def records(self) -> Iterator[tuple[str, object]]:
        """Wait for the child, then its records in order (the module docstring)."""
        assert self._proc is not None
        code = self._proc.wait()
        self._proc = None
        if code != 0:
            self._err.seek(0)
            said = self._err.read().decode("utf-8", "replace").strip().splitlines()
            last = said[-1] if said else "no output"
            raise RuntimeError(f"{self.name} process ended with exit code {code}: {last}")
        self._out.seek(0)
        while True:
            try:
                kind, payload = pickle.load(self._out)
            except (EOFError, pickle.UnpicklingError) as e:
                raise RuntimeError(f"{self.name} process left unreadable results ({e})") from None
            if kind == "input_error":
                raise InputError(payload)
            if kind == "error":
                raise RuntimeError(f"{self.name}: {payload}")
            yield kind, payload

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
        pickle.dump((kind, payload), self.out, protocol=pickle.HIGHEST_PROTOCOL)

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
