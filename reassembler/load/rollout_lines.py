"""Parse a night's rollout lines into rollout rows and reject rows, here or in processes of
their own.

A rollout line is parsed in Python through and through: the JSON, then the fingerprint of
every output item (records.parse_rollout), about 1 ms a rollout, all of it holding the
GIL. So a night of more than BACKGROUND_BYTES of rollout lines is parsed by child
processes (`InBackground`, a new interpreter each), started by the night's load as it
begins (load.NightLoad), so that the parse runs beside the imports and the ledger load. A
bigger night is cut between lines into parts of about equal bytes (`split`), one more child
per PART_BYTES, at most one per core. Each child runs exactly `parse_rollouts` over its part
and writes what it gives as pickled chunks (child_process.py); the load then inserts them
part after part, a chunk at a time, so memory is bounded by a chunk on both sides, and a
rollout_id an earlier part holds makes its line the same reject row one child would have
written. A child that cannot start leaves the parse to this process; one that fails
re-raises its error here (an InputError stays an InputError, with the same message).
docs/performance.md has the figures that keep the children (and their parts).
"""

from __future__ import annotations

import json
import os
import sys
from bisect import bisect_right
from collections.abc import Callable

from .. import storage
from ..formats.art_files import is_art_file
from ..formats.gym_envelope import CAPTURE as ENVELOPE
from ..formats.night import NightFiles
from ..formats.records import parse_rollout
from ..formats.verifiers import MAX_ROLLOUT_TOKENS, is_traces_file
from .art_trajectories import CAPTURE as ART
from .art_trajectories import art_calls, read_art_file
from .child_process import ChildProcess, Records
from .derived_calls import REBUILT, CallColumns, DerivedChunk, rebuilt_calls
from .envelope_lines import envelope_calls, envelope_columns
from .json_lines import (
    ROLLOUT_DECODER,
    LineRange,
    decode,
    guess_ids,
    line_ranges,
    read_file_lines,
    reject,
    seen_before,
)
from .verifiers_traces import CAPTURE as VERIFIERS
from .verifiers_traces import read_traces_file, trace_calls

BACKGROUND_BYTES = 1 << 20  # rollout lines of a night above this are parsed by a child process
PART_BYTES = 4 << 20  # and by one more child for each PART_BYTES more, up to one per core
MAX_PARTS = 4
CHUNK = 500  # rows per pickled chunk
CHUNK_TOKENS = 1 << 22  # or fewer: a verifiers or envelope rollout row carries its rows' token arrays


Part = list[tuple[str, LineRange]]  # runs of lines of the night's rollout files, in reading order


def parse_rollouts(
    night: NightFiles,
    max_line_bytes: int,
    add: Callable[[dict], None],
    rejects,
    part: Part | None = None,
    max_rollout_tokens: int = MAX_ROLLOUT_TOKENS,
    calls: CallColumns | None = None,
) -> int:
    """Every rollout line of the night (`part`: of these runs of lines only), files by path
    then lines: a row for `add`, or a reject row for `rejects.add` (a rollout_id seen before
    keeps the first; a verifiers rollout's rows at most `max_rollout_tokens`). The calls a
    row carries go to `calls` before the row goes to `add` (`carried_calls`; None: they are
    dropped). Returns the lines read."""
    seen: set[str] = set()
    episodes: set[str] = set()  # verifiers' Episode ids (load/verifiers_traces.py)

    def add_row(row: dict) -> None:
        carried_calls(row, calls)
        add(row)

    def parse(value, rel: str) -> dict:
        row = parse_rollout(value, floats_marked=True)
        if row["rollout_id"] in seen:
            raise seen_before(row["rollout_id"])
        seen.add(row["rollout_id"])
        row["rollout_seq"] = len(seen)
        return row

    number = 0
    runs = [(rel, None) for rel in night.rollouts] if part is None else part
    for rel, lines in runs:
        if is_art_file(rel):  # OpenPipe ART's trajectory Parquet (CONTRACT.md 13): a file is read whole
            if lines is None or lines.start == 0:
                number = read_art_file(night, rel, number, seen, add_row, rejects)
            continue
        if is_traces_file(rel):  # verifiers' traces.jsonl (CONTRACT.md 10)
            number = read_traces_file(
                night, rel, number, seen, add_row, rejects, max_line_bytes, lines, episodes, max_rollout_tokens
            )
            continue
        number = read_file_lines(
            night, "rollouts", rel, number, parse, lambda _, row: add_row(row), rejects, max_line_bytes, lines
        )
    return number


def carried_calls(row: dict, calls: CallColumns | None) -> None:
    """The calls a parsed rollout row carries (an envelope line's, a verifiers trace's, a
    Gym-rebuilt line's) into `calls` (load/derived_calls.py), and the row left with what
    the load decides with (gym_capture.GymCapture.rollout): an envelope line's capture
    columns under `gym_envelope`, True under `verifiers`, a rebuilt line's verdict under
    `gym_rebuilt`."""
    trace, envelope, gym = row.get("verifiers"), row.get("gym_envelope"), row.get("gym_rebuilt")
    art = row.get("art")
    if art is not None:
        row["art"] = True
        found = art_calls(art)
        capture = ART
    elif envelope is not None:
        row["gym_envelope"] = envelope_columns(envelope)
        found = envelope_calls(envelope)
        capture = ENVELOPE
    elif trace is not None:
        row["verifiers"] = True
        found = trace_calls(trace)
        capture = VERIFIERS
    elif gym is not None:
        built = gym["row"]
        reason = None if built.reason is None else built.reason.value
        verdict = {"reason": reason, "detail": built.detail, "n_items": built.n_items}
        row["gym_rebuilt"] = {"marked": gym["marked"], **verdict}
        found = rebuilt_calls(built)
        capture = REBUILT
    else:
        return
    if calls is not None:
        calls.add(row, capture, found)


def split(night: NightFiles, parts: int) -> list[Part]:
    """The night's rollout lines in `parts` runs of about equal bytes, cut between lines
    (fewer when a file has too few lines to cut). Reads the files once."""
    paths = [night.path("rollouts", rel) for rel in night.rollouts]
    sizes = list(storage.map_ahead(storage.size, paths, night.remote))
    targets = [sum(sizes) * k // parts for k in range(1, parts)]
    out: list[Part] = [[] for _ in range(parts)]
    offset = 0
    for rel, size in zip(night.rollouts, sizes):
        inside = [t - offset for t in targets if offset < t < offset + size]
        if is_art_file(rel):  # Parquet: never cut (a part reads it whole)
            inside = []
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
    pickled in chunks (child_process.py)."""

    def __init__(self, night: NightFiles, max_line_bytes: int, part: Part | None, max_rollout_tokens: int):
        self.part = part
        ranges = None if part is None else [[rel, r.start, r.end, r.first_line] for rel, r in part]
        what = {
            "root": night.root,
            "ds": night.ds,
            "rollouts": night.rollouts,
            "folders": night.folders,
            "ranges": ranges,
            "art_model": night.art_model,
            "art_project": night.art_project,
        }
        work = json.dumps(dict(what, max_line_bytes=max_line_bytes, max_rollout_tokens=max_rollout_tokens)).encode()
        self._proc = ChildProcess(__name__, "rollout parser", work)

    def done(self) -> bool:
        return self._proc.done()

    def results(self, add: Callable[[dict], None], rejects, derived: Callable[[DerivedChunk | None], None]) -> int:
        """Hand the child's rows and reject rows over in order, as it writes them, each
        chunk's carried calls to `derived` after its rows; returns the lines read, once it
        has ended well."""
        for kind, payload in self._proc.records(last="lines"):
            if kind == "lines":  # the last record
                assert isinstance(payload, int)
                return payload
            _hand_over(kind, payload, add, rejects, derived)
        raise AssertionError("unreachable: records end with the last one or raise")

    def close(self) -> None:
        self._proc.close()


class InBackground:
    """`parse_rollouts` of a night, running in child processes from construction on: one
    per `parts` (runs of lines, in reading order), or one over every line. `results` hands
    their rows over part after part, as one child would: a rollout_id that an earlier part
    holds makes its line a reject row (re-read here, a rare case), and rows are numbered
    across parts."""

    def __init__(
        self,
        night: NightFiles,
        max_line_bytes: int,
        parts: list[Part] | None = None,
        max_rollout_tokens: int = MAX_ROLLOUT_TOKENS,
    ):
        self.night, self.max_line_bytes = night, max_line_bytes
        self._children: list[_Child] = []
        try:
            whole: list[Part | None] = [None]  # one child over every line
            for part in parts or whole:
                self._children.append(_Child(night, max_line_bytes, part, max_rollout_tokens))
        except BaseException:
            self.close()
            raise

    def done(self) -> bool:
        """Whether the children have ended (their results are ready, or their failure)."""
        return all(child.done() for child in self._children)

    def results(self, add: Callable[[dict], None], rejects, derived: Callable[[DerivedChunk | None], None]) -> int:
        """Hand the children's rows and reject rows over in order (a child's as it writes
        them, one child after the other), each chunk's carried calls (load/derived_calls.py)
        to `derived` after its rows; returns the lines read. A row refused here (its id in
        an earlier part) never reaches `add`: whoever takes the calls keeps those of the
        rows it took (DerivedChunk.of)."""
        seen: set[str] = set()
        episodes: dict[str, tuple[str, int]] = {}  # a verifiers Episode id: the line that holds it
        lines = 0
        for child in self._children:

            def add_row(row: dict, part: Part | None = child.part) -> None:
                rollout_id = row["rollout_id"]
                episode = row.get("episode") if row.get("capture") == "verifiers" else None
                at = (row["source_file"], row["source_line"])
                if episode is not None and episodes.setdefault(episode, at) != at:  # an earlier part's Episode
                    self._reject_seen_before(row, part, rejects, episode)
                    return
                if rollout_id in seen:  # only when an earlier part holds it
                    self._reject_seen_before(row, part, rejects)
                    return
                seen.add(rollout_id)
                row["rollout_seq"] = len(seen)
                add(row)

            lines += child.results(add_row, rejects, derived)
        return lines

    def _reject_seen_before(self, row: dict, part: Part | None, rejects, episode: str | None = None) -> None:
        """The reject row `parse_rollouts` writes for a repeated rollout_id (or verifiers
        Episode id, `episode`), for a row whose first occurrence sits in an earlier part: its
        raw line read again (a verifiers row names its own id, as load/verifiers_traces.py)."""
        rel, line = row["source_file"], row["source_line"]
        assert part is not None  # one child over every line never repeats an id it kept
        lines = next(r for name, r in part if name == rel)  # a part holds one run of a file
        raw = _line_at(self.night.path("rollouts", rel), lines, line)
        if episode is not None:
            reject(rejects, "rollouts", rel, line, str(seen_before(episode, "Episode id")), raw, episode)
        elif row.get("capture") == "verifiers":
            reject(rejects, "rollouts", rel, line, str(seen_before(row["rollout_id"])), raw, row["rollout_id"])
        else:
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


def start(night: NightFiles, max_line_bytes: int, max_rollout_tokens: int = MAX_ROLLOUT_TOKENS) -> InBackground | None:
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
        return InBackground(night, max_line_bytes, parts if parts and len(parts) > 1 else None, max_rollout_tokens)
    except OSError:
        return None  # parsed in this process instead


def _hand_over(kind: str, payload, add: Callable[[dict], None], rejects, derived) -> None:
    """One record of `_Chunks`: a chunk's rows to `add` and then its carried calls to
    `derived`, or its reject rows to `rejects.add`."""
    if kind == "rows":
        rows, calls = payload
        for row in rows:
            add(row)
        derived(calls)
    else:
        assert kind == "rejects", kind
        for row in payload:
            rejects.add(row)


class _HandedHere:
    """`_Chunks`' records handed over in this process as they are put (`parse_here`)."""

    def __init__(self, add: Callable[[dict], None], rejects, derived: Callable[[DerivedChunk | None], None]):
        self.add, self.rejects, self.derived = add, rejects, derived

    def put(self, kind: str, payload) -> None:
        if kind != "lines":  # the count, returned by parse_here itself
            _hand_over(kind, payload, self.add, self.rejects, self.derived)


class _Chunks:
    """Rows and reject rows put as records (child_process.Records, or `_HandedHere`) in
    chunks, in the order they come: a chunk of rows as (rows, their carried calls: a
    DerivedChunk or None)."""

    def __init__(self, records: Records | _HandedHere):
        self.records = records
        self.rows: list[dict] = []
        self.calls = CallColumns()  # the carried calls of `rows` (parse_rollouts puts them)
        self.rejects: list[dict] = []

    def add_row(self, row: dict) -> None:
        self._flush_rejects()
        self.rows.append(row)
        if len(self.rows) >= CHUNK or self.calls.n_tokens >= CHUNK_TOKENS:
            self._flush_rows()

    def add(self, reject: dict) -> None:
        self._flush_rows()
        self.rejects.append(reject)
        if len(self.rejects) >= CHUNK:
            self._flush_rejects()

    def put(self, kind: str, payload) -> None:
        self._flush_rows()
        self._flush_rejects()
        self.records.put(kind, payload)

    def _flush_rows(self) -> None:
        if self.rows:
            self.records.put("rows", (self.rows, self.calls.take()))
            self.rows = []

    def _flush_rejects(self) -> None:
        if self.rejects:
            self.records.put("rejects", self.rejects)
            self.rejects = []


def parse_here(
    night: NightFiles,
    max_line_bytes: int,
    add: Callable[[dict], None],
    rejects,
    derived: Callable[[DerivedChunk | None], None],
    max_rollout_tokens: int = MAX_ROLLOUT_TOKENS,
) -> int:
    """`parse_rollouts` in this process, in the chunks a child hands over (`_Chunks`): each
    chunk's rows to `add`, then its carried calls to `derived`."""
    chunks = _Chunks(_HandedHere(add, rejects, derived))
    lines = parse_rollouts(night, max_line_bytes, chunks.add_row, chunks, None, max_rollout_tokens, chunks.calls)
    chunks.put("lines", lines)  # the last chunks handed over
    return lines


def _child() -> None:
    """The child's work: `parse_rollouts` over its part, as records."""
    args = json.loads(sys.stdin.read())
    night = NightFiles(
        args["root"],
        args["ds"],
        args["rollouts"],
        [],
        [],
        folders=args["folders"],
        art_model=args.get("art_model"),
        art_project=args.get("art_project"),
    )
    ranges = args.get("ranges")
    part = None if ranges is None else [(rel, LineRange(a, b, first)) for rel, a, b, first in ranges]
    records = Records()
    chunks = _Chunks(records)
    records.run(
        lambda: chunks.put(
            "lines",
            parse_rollouts(
                night, args["max_line_bytes"], chunks.add_row, chunks, part, args["max_rollout_tokens"], chunks.calls
            ),
        )
    )
