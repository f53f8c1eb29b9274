"""Parse a night's rollout lines into rollout rows and reject rows, here or in processes of
their own.

A rollout line is parsed in Python through and through: the JSON, then the fingerprint of
every output item (records.parse_rollout), about 1 ms a rollout, all of it holding the
GIL. So a night of more than BACKGROUND_BYTES of rollout lines is parsed by child
processes (`InBackground`, a new interpreter each), started by the night's load as it
begins (load.NightLoad), so that the parse runs beside the imports and the ledger load. A
bigger night is cut between lines into parts of about equal bytes (`split`), one more child
per PART_BYTES, at most one per core. Each child runs exactly `parse_rollouts` over its part
and writes what it gives as pickled chunks to a temporary file; the load then inserts them
part after part, a chunk at a time, so memory is bounded by a chunk on both sides, and a
rollout_id an earlier part holds makes its line the same reject row one child would have
written. A child that cannot start leaves the parse to this process; one that fails
re-raises its error here (an InputError stays an InputError, with the same message).
docs/performance.md has the figures that keep the children (and their parts).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .. import storage
from ..errors import InputError
from ..formats.night import NightFiles
from ..formats.records import RecordError, parse_rollout
from .json_lines import ROLLOUT_DECODER, LineRange, decode, guess_ids, line_ranges, read_file_lines, read_lines, reject

BACKGROUND_BYTES = 1 << 20  # rollout lines of a night above this are parsed by a child process
PART_BYTES = 4 << 20  # and by one more child for each PART_BYTES more, up to one per core
MAX_PARTS = 4
CHUNK = 500  # rows per pickled chunk
# The child: this interpreter, without the working folder on its path (-P: nothing there
# shadows a module), importing this package as this process does, else from the folder
# this file was loaded from (appended, so it never shadows anything either).
CHILD = "import sys; sys.path.append(sys.argv[1]); from reassembler.load.rollout_lines import _child; _child()"


Part = list[tuple[str, LineRange]]  # runs of lines of the night's rollout files, in reading order


def seen_before(rollout_id: str) -> RecordError:
    return RecordError(f"rollout_id {rollout_id} already seen in this night")


def parse_rollouts(
    night: NightFiles, max_line_bytes: int, add: Callable[[dict], None], rejects, part: Part | None = None
) -> int:
    """Every rollout line of the night (`part`: of these runs of lines only), files by path
    then lines: a row for `add`, or a reject row for `rejects.add` (a rollout_id seen before
    keeps the first). Returns the lines read."""
    seen: set[str] = set()

    def parse(value, rel: str) -> dict:
        row = parse_rollout(value, floats_marked=True)
        if row["rollout_id"] in seen:
            raise seen_before(row["rollout_id"])
        seen.add(row["rollout_id"])
        row["rollout_seq"] = len(seen)
        return row

    if part is None:
        return read_lines(night, "rollouts", parse, lambda _, row: add(row), rejects, max_line_bytes)
    number = 0
    for rel, lines in part:
        number = read_file_lines(
            night, "rollouts", rel, number, parse, lambda _, row: add(row), rejects, max_line_bytes, lines
        )
    return number


def split(night: NightFiles, parts: int) -> list[Part]:
    """The night's rollout lines in `parts` runs of about equal bytes, cut between lines
    (fewer when a file has too few lines to cut). Reads the files once."""
    sizes = [storage.size(night.path("rollouts", rel)) for rel in night.rollouts]
    targets = [sum(sizes) * k // parts for k in range(1, parts)]
    out: list[Part] = [[] for _ in range(parts)]
    offset = 0
    for rel, size in zip(night.rollouts, sizes):
        inside = [t - offset for t in targets if offset < t < offset + size]
        for lines in line_ranges(night.path("rollouts", rel), inside):
            out[bisect_right(targets, offset + lines.start)].append((rel, lines))
        offset += size
    return [part for part in out if part]


def rollout_bytes(night: NightFiles) -> int:
    total = 0
    for rel in night.rollouts:
        try:
            total += storage.size(night.path("rollouts", rel))
        except OSError:
            pass  # the parse names the file
    return total


class _Child:
    """One child process running `parse_rollouts` (over `part`, or every line), its results
    pickled in chunks to a temporary file."""

    def __init__(self, night: NightFiles, max_line_bytes: int, part: Part | None):
        self.part = part
        self._out: IO[bytes] = tempfile.TemporaryFile(prefix="reassembler-rollouts-")
        self._err: IO[bytes] = tempfile.TemporaryFile(prefix="reassembler-rollouts-")
        self._proc: subprocess.Popen | None
        ranges = None if part is None else [[rel, r.start, r.end, r.first_line] for rel, r in part]
        with tempfile.TemporaryFile(prefix="reassembler-rollouts-") as args:  # a file: no pipe to break
            what = {"root": night.root, "ds": night.ds, "rollouts": night.rollouts, "ranges": ranges}
            args.write(json.dumps(dict(what, max_line_bytes=max_line_bytes)).encode())
            args.seek(0)
            self._proc = subprocess.Popen(
                [sys.executable, "-P", "-c", CHILD, str(Path(__file__).resolve().parents[2])],
                stdin=args,
                stdout=self._out,
                stderr=self._err,
            )

    def done(self) -> bool:
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


class InBackground:
    """`parse_rollouts` of a night, running in child processes from construction on: one
    per `parts` (runs of lines, in reading order), or one over every line. `results` hands
    their rows over part after part, as one child would: a rollout_id that an earlier part
    holds makes its line a reject row (re-read here, a rare case), and rows are numbered
    across parts."""

    def __init__(self, night: NightFiles, max_line_bytes: int, parts: list[Part] | None = None):
        self.night, self.max_line_bytes = night, max_line_bytes
        self._children: list[_Child] = []
        try:
            whole: list[Part | None] = [None]  # one child over every line
            for part in parts or whole:
                self._children.append(_Child(night, max_line_bytes, part))
        except BaseException:
            self.close()
            raise

    def done(self) -> bool:
        """Whether the children have ended (their results are ready, or their failure)."""
        return all(child.done() for child in self._children)

    def results(self, add: Callable[[dict], None], rejects) -> int:
        """Wait for the children, then hand their rows and reject rows over in order;
        returns the lines read."""
        seen: set[str] = set()
        lines = 0
        for child in self._children:

            def add_row(row: dict, part: Part | None = child.part) -> None:
                rollout_id = row["rollout_id"]
                if rollout_id in seen:  # only when an earlier part holds it
                    self._reject_seen_before(row, part, rejects)
                    return
                seen.add(rollout_id)
                row["rollout_seq"] = len(seen)
                add(row)

            lines += child.results(add_row, rejects)
        return lines

    def _reject_seen_before(self, row: dict, part: Part | None, rejects) -> None:
        """The reject row `parse_rollouts` writes for a repeated rollout_id, for a row whose
        first occurrence sits in an earlier part: its raw line read again."""
        rel, line = row["source_file"], row["source_line"]
        assert part is not None  # one child over every line never repeats an id it kept
        lines = next(r for name, r in part if name == rel)  # a part holds one run of a file
        raw = _line_at(self.night.path("rollouts", rel), lines, line)
        ids = guess_ids(decode(raw, ROLLOUT_DECODER))
        reject(rejects, "rollouts", rel, line, str(seen_before(row["rollout_id"])), raw, *ids)

    def close(self) -> None:
        for child in self._children:
            child.close()


def _line_at(path: str, lines: LineRange, number: int) -> bytes:
    """Line `number` of a file, inside `lines`."""
    with storage.open_input(path) as fh:
        fh.seek(lines.start)
        for _ in range(number - lines.first_line):
            fh.readline()
        return fh.readline()


def start(night: NightFiles, max_line_bytes: int) -> InBackground | None:
    """Child processes parsing the night's rollout lines, if they are worth it: one for more
    than BACKGROUND_BYTES of lines, one more for each PART_BYTES beyond, at most one per
    core (and MAX_PARTS)."""
    size = rollout_bytes(night)
    if size <= BACKGROUND_BYTES or not sys.executable:
        return None
    parts = None
    count = min(MAX_PARTS, os.cpu_count() or 1, size // PART_BYTES)
    if count > 1:
        try:
            parts = split(night, count)
        except OSError:
            parts = None  # a file gone: one child over every line says which
    try:
        return InBackground(night, max_line_bytes, parts if parts and len(parts) > 1 else None)
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


def _parse_to(fd: int, night: NightFiles, max_line_bytes: int, part: Part | None) -> None:
    """The child's work: `parse_rollouts` pickled in chunks to file descriptor `fd`."""
    with os.fdopen(fd, "wb", closefd=False) as out:
        chunks = _Chunks(out)
        try:
            chunks.put("lines", parse_rollouts(night, max_line_bytes, chunks.add_row, chunks, part))
        except InputError as e:
            chunks.put("input_error", str(e))
        except Exception as e:  # noqa: BLE001 - said by the parent, which raises it
            chunks.put("error", f"{type(e).__name__}: {e}")


def _child() -> None:
    args = json.loads(sys.stdin.read())
    night = NightFiles(args["root"], args["ds"], args["rollouts"], [], [])
    ranges = args.get("ranges")
    part = None if ranges is None else [(rel, LineRange(a, b, first)) for rel, a, b, first in ranges]
    _parse_to(sys.stdout.fileno(), night, args["max_line_bytes"], part)
