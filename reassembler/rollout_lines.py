"""Parse a night's rollout lines into rollout rows and reject rows, here or in a process of
their own.

A rollout line is parsed in Python through and through: the JSON, then the fingerprint of
every output item (records.parse_rollout), about 1 ms a rollout, all of it holding the
GIL. So a night of more than BACKGROUND_BYTES of rollout lines is parsed by a child process
(`InBackground`), started before the ledger loads: the parse, the ledger load and the token
read-ahead then run on the cores side by side. The child runs exactly `parse_rollouts` and
writes what it gives as pickled chunks to a temporary file; the load then inserts them a
chunk at a time, so memory is bounded by a chunk on both sides. A child that cannot start
falls back to parsing in this process; one that fails re-raises its error here (an
InputError stays an InputError, with the same message).

`_child` is that child's entry point (see CHILD): it reads its arguments as JSON on stdin.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .errors import InputError
from .json_lines import read_lines
from .night import NightFiles
from .records import RecordError, parse_rollout

BACKGROUND_BYTES = 1 << 20  # rollout lines of a night above this are parsed by a child process
CHUNK = 500  # rows per pickled chunk
# The child: this interpreter, without the working folder on its path (-P: nothing there
# shadows a module), importing this package as this process does, else from the folder
# this file was loaded from (appended, so it never shadows anything either).
CHILD = "import sys; sys.path.append(sys.argv[1]); from reassembler.rollout_lines import _child; _child()"


def parse_rollouts(night: NightFiles, max_line_bytes: int, add: Callable[[dict], None], rejects) -> int:
    """Every rollout line of the night, files by path then lines: a row for `add`, or a reject
    row for `rejects.add` (a rollout_id seen before keeps the first). Returns the lines read."""
    seen: set[str] = set()

    def parse(value, rel: str) -> dict:
        row = parse_rollout(value, floats_marked=True)
        if row["rollout_id"] in seen:
            raise RecordError(f"rollout_id {row['rollout_id']} already seen in this night")
        seen.add(row["rollout_id"])
        row["rollout_seq"] = len(seen)
        return row

    return read_lines(night, "rollouts", parse, lambda _, row: add(row), rejects, max_line_bytes)


def rollout_bytes(night: NightFiles) -> int:
    total = 0
    for rel in night.rollouts:
        try:
            total += night.path("rollouts", rel).stat().st_size
        except OSError:
            pass  # the parse names the file
    return total


class InBackground:
    """`parse_rollouts` of a night, running in a child process from construction on."""

    def __init__(self, night: NightFiles, max_line_bytes: int):
        self.night, self.max_line_bytes = night, max_line_bytes
        self._out: IO[bytes] = tempfile.TemporaryFile(prefix="reassembler-rollouts-")
        self._err: IO[bytes] = tempfile.TemporaryFile(prefix="reassembler-rollouts-")
        with tempfile.TemporaryFile(prefix="reassembler-rollouts-") as args:  # a file: no pipe to break
            what = {"root": str(night.root), "ds": night.ds, "rollouts": night.rollouts}
            args.write(json.dumps(dict(what, max_line_bytes=max_line_bytes)).encode())
            args.seek(0)
            self._proc: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-P", "-c", CHILD, str(Path(__file__).resolve().parent.parent)],
                stdin=args,
                stdout=self._out,
                stderr=self._err,
            )

    def parses(self, night: NightFiles, max_line_bytes: int) -> bool:
        """Whether this child parses exactly these files, with this line limit."""
        return (self.night.root, self.night.ds, self.night.rollouts, self.max_line_bytes) == (
            night.root,
            night.ds,
            night.rollouts,
            max_line_bytes,
        )

    def done(self) -> bool:
        """Whether the child has ended (its results are ready, or its failure)."""
        return self._proc is None or self._proc.poll() is not None

    def results(self, add: Callable[[dict], None], rejects) -> int:
        """Wait for the child, then hand its rows and reject rows over in order; returns the
        lines read."""
        assert self._proc is not None
        code = self._proc.wait()
        self._proc = None
        if code != 0:  # killed, or failed before it could say why: nothing it wrote is used
            self._err.seek(0)
            said = self._err.read().decode("utf-8", "replace").strip().splitlines()
            last = said[-1] if said else "no output"
            raise RuntimeError(f"rollout parser process ended with exit code {code}: {last}")
        self._out.seek(0)
        lines = None
        while lines is None:
            try:
                kind, payload = pickle.load(self._out)
            except (EOFError, pickle.UnpicklingError) as e:
                raise RuntimeError(f"rollout parser process left unreadable results ({e})") from None
            if kind == "rows":
                for row in payload:
                    add(row)
            elif kind == "rejects":
                for row in payload:
                    rejects.add(row)
            elif kind == "input_error":
                raise InputError(payload)
            elif kind == "error":
                raise RuntimeError(f"rollout parser: {payload}")
            else:  # "lines": the last record
                lines = payload
        return lines

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        self._out.close()
        self._err.close()


def start(night: NightFiles, max_line_bytes: int) -> InBackground | None:
    """A child process parsing the night's rollout lines, if they are worth one (more than
    BACKGROUND_BYTES of them)."""
    if not sys.executable or rollout_bytes(night) <= BACKGROUND_BYTES:
        return None
    try:
        return InBackground(night, max_line_bytes)
    except OSError:
        return None  # parsed in this process instead


class _Chunks:
    """Rows and reject rows pickled to `out` in chunks, in the order they come."""

    def __init__(self, out: IO[bytes]):
        self.out = out
        self.rows: list[dict] = []
        self.rejects: list[dict] = []

    def add_row(self, row: dict) -> None:
        self._flush_rejects()
        self.rows.append(row)
        if len(self.rows) >= CHUNK:
            self._flush_rows()

    def add(self, reject: dict) -> None:
        self._flush_rows()
        self.rejects.append(reject)
        if len(self.rejects) >= CHUNK:
            self._flush_rejects()

    def put(self, kind: str, payload) -> None:
        self._flush_rows()
        self._flush_rejects()
        pickle.dump((kind, payload), self.out, protocol=pickle.HIGHEST_PROTOCOL)

    def _flush_rows(self) -> None:
        if self.rows:
            pickle.dump(("rows", self.rows), self.out, protocol=pickle.HIGHEST_PROTOCOL)
            self.rows = []

    def _flush_rejects(self) -> None:
        if self.rejects:
            pickle.dump(("rejects", self.rejects), self.out, protocol=pickle.HIGHEST_PROTOCOL)
            self.rejects = []


def _child() -> None:
    args = json.loads(sys.stdin.read())
    night = NightFiles(Path(args["root"]), args["ds"], args["rollouts"], [], [])
    with os.fdopen(sys.stdout.fileno(), "wb", closefd=False) as out:
        chunks = _Chunks(out)
        try:
            chunks.put("lines", parse_rollouts(night, args["max_line_bytes"], chunks.add_row, chunks))
        except InputError as e:
            chunks.put("input_error", str(e))
        except Exception as e:  # noqa: BLE001 - said by the parent, which raises it
            chunks.put("error", f"{type(e).__name__}: {e}")
