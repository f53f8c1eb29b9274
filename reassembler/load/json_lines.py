"""JSON lines: every non-blank line of a rollout or ledger file decoded, and turned into a
row by the caller's `parse`, or into the reject row that says why not (CONTRACT.md 2).

A line is decoded with duplicate keys refused (at any depth), non-UTF-8 bytes and invalid
JSON refused, and a line longer than `max_bytes` not decoded at all. Each reject row keeps
the line's first RAW_CHARS characters and the ids the line still tells. Nothing here
touches the warehouse: `add` and `rejects.add` receive plain dicts (read.py inserts them,
rollout_lines.py may do this in a process of its own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .. import storage
from ..errors import InputError
from ..formats.items import JsonFloat, UnmarkedFloats
from ..formats.night import NightFiles
from ..formats.records import (
    NotJson,
    RecordError,
    has_surrogate,
    no_duplicate_keys,
    rollout_id_from_path,
    torn_line,
)
from ..settings import MAX_JSON_DEPTH, MAX_LINE_BYTES

RAW_CHARS = 300


@dataclass(frozen=True)
class LineRange:
    """Part of a file, cut between lines: bytes [start, end), whose first line is `first_line`."""

    start: int
    end: int
    first_line: int


def line_ranges(path: str, cuts: list[int]) -> list[LineRange]:
    """The file cut into ranges that start near the byte offsets `cuts` (ascending): each
    cut moves to just after the first newline at or after it (a file with no newline there
    is not cut). Reads the file up to its last cut once, and that span again to count lines."""
    size = storage.size(path)
    ranges: list[LineRange] = []
    start, first_line = 0, 1
    with storage.open_input(path) as fh:
        for target in cuts:
            if target <= start or target >= size:
                continue
            fh.seek(target - 1)  # a newline just before `target` makes it a line's first byte
            cut, at = None, target - 1
            while block := fh.read(1 << 16):
                found = block.find(b"\n")
                if found >= 0:
                    cut = at + found + 1
                    break
                at += len(block)
            if cut is None or cut >= size:
                break
            fh.seek(start)
            newlines, left = 0, cut - start
            while left > 0:
                block = fh.read(min(1 << 20, left))
                newlines, left = newlines + block.count(b"\n"), left - len(block)
            ranges.append(LineRange(start, cut, first_line))
            start, first_line = cut, first_line + newlines
    ranges.append(LineRange(start, size, first_line))
    return ranges


DECODER = json.JSONDecoder(object_pairs_hook=no_duplicate_keys)
_MARKED = json.JSONDecoder(object_pairs_hook=no_duplicate_keys, parse_float=JsonFloat, parse_constant=JsonFloat)


class _RolloutDecoder:
    """Rollout lines: floats marked, so that their items' fingerprints know which hold one
    (items.py); a line carrying token arrays (NeMo Gym's rebuilt lines, CONTRACT.md 9.10)
    with plain floats instead, as items.UnmarkedFloats: marking each log probability would
    be a Python call per token."""

    def decode(self, text: str):
        if '"generation_token_ids"' not in text:
            return _MARKED.decode(text)
        value = DECODER.decode(text)
        return UnmarkedFloats(value) if isinstance(value, dict) else value


ROLLOUT_DECODER = _RolloutDecoder()


def json_lines(path: str, rel: str, max_bytes: int = MAX_LINE_BYTES, decoder=DECODER, lines: LineRange | None = None):
    """(line number, raw bytes, decoded value or the error) of each non-blank line. A line
    longer than `max_bytes` is not decoded: it becomes a reject with its size. `lines`: only
    the lines from byte `start` (a line's first byte, numbered `first_line`) up to byte `end`.
    `decoder`: a json decoder (`decode` below runs it), or a function of the raw line that
    returns the same (value or RecordError)."""
    try:
        fh = storage.open_input(path)
    except OSError as e:
        raise InputError(f"{rel}: cannot open ({e.strerror})") from e
    with fh:
        number, end = 0, None
        if lines is not None:
            fh.seek(lines.start)
            number, end = lines.first_line - 1, lines.end
        while end is None or fh.tell() < end:
            raw = fh.readline(max_bytes + 1)
            if not raw:
                return
            number += 1
            if len(raw) > max_bytes and not raw.endswith(b"\n"):
                size = len(raw)
                while (more := fh.readline(1 << 20)) and not more.endswith(b"\n"):
                    size += len(more)
                size += len(more)
                yield (
                    number,
                    raw[:RAW_CHARS],
                    RecordError(f"line is {size:,} bytes, over the {max_bytes:,}-byte limit (--max-line-bytes)"),
                )
                continue
            if not raw.strip():
                continue
            yield number, raw, decoder(raw) if callable(decoder) else decode(raw, decoder)


# every byte but a quote or a bracket, which `nesting_depth` keeps
_NOT_MARK = bytes(b for b in range(256) if b not in b'"[]{}')


def nesting_depth(raw: bytes) -> int:
    """How deeply a line's objects and arrays nest (brackets inside strings do not count);
    the number of opening brackets when that is within MAX_JSON_DEPTH, which it bounds.

    Past that, in C passes over the bytes rather than a Python step a byte: escaped
    backslashes, then escaped quotes, dropped (left to right, as JSON pairs them), every
    byte but quotes and brackets dropped, what lies between each pair of quotes dropped
    (a string's brackets), and the depth the running sum of what is left."""
    opening = raw.count(b"{") + raw.count(b"[")
    if opening <= MAX_JSON_DEPTH:
        return opening
    import numpy as np  # here: a rollout-line child starts without it

    marks = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_MARK)
    brackets = np.frombuffer(b"".join(marks.split(b'"')[::2]), np.uint8)
    steps = np.where((brackets == ord("{")) | (brackets == ord("[")), 1, -1)
    return int(np.cumsum(steps).max(initial=0))


def too_deep(raw: bytes) -> RecordError | None:
    depth = nesting_depth(raw)
    if depth > MAX_JSON_DEPTH:
        return RecordError(f"objects and arrays nested {depth} deep, over the limit of {MAX_JSON_DEPTH}")
    return None


def decode(raw: bytes, decoder=DECODER):
    """One line's JSON value, or the RecordError that makes it a reject row. A line nested
    deeper than MAX_JSON_DEPTH is not decoded."""
    deep = too_deep(raw)
    if deep is not None:
        return deep
    try:
        return decoder.decode(raw.decode("utf-8"))
    except RecordError as e:
        return e
    except (ValueError, RecursionError) as e:
        return NotJson(f"not valid JSON: {e}")


def raw_text(raw: bytes) -> str:
    return raw[:RAW_CHARS].decode("utf-8", errors="replace").rstrip("\r\n")


def reject(
    rejects, source: str, rel: str, line: int, error: str, raw: bytes, rollout_id=None, model_call_id=None
) -> None:
    rejects.add(
        {
            "source": source,
            "file": rel,
            "line": line,
            "error": error[:500],
            "raw": raw_text(raw),
            "rollout_id": rollout_id,
            "model_call_id": model_call_id,
        }
    )


def guess_ids(value, rel: str | None = None) -> tuple[str | None, str | None]:
    """The ids a rejected line still tells: its own, or (a ledger line of NeMo Gym's
    `<rollout_id>.lineage.jsonl`) the rollout id from the file name."""
    rid = cid = None
    if isinstance(value, dict):
        rid, cid = value.get("rollout_id"), value.get("model_call_id")
        rid = rid if isinstance(rid, str) and rid and not has_surrogate(rid) else None
        cid = cid if isinstance(cid, str) and cid and not has_surrogate(cid) else None
    if rid is None and rel is not None:
        rid = rollout_id_from_path(rel)
    return rid, cid


def seen_before(value: str, what: str = "rollout_id") -> RecordError:
    """A rollout id (or a verifiers Episode id) that an earlier line of the night had."""
    return RecordError(f"{what} {value} already seen in this night")


def read_file_lines(
    night: NightFiles, source: str, rel: str, number: int, parse, add, rejects, max_line_bytes, lines=None
) -> int:
    """Every line of one file of a source ("rollouts" or "ledger"; `lines`: a LineRange of
    it), whose first line read is number + 1: `parse(value, rel)` turns it into a row,
    given to `add(number, row)`, or it raises RecordError and the line becomes a reject
    row. Returns the last number."""
    decoder = ROLLOUT_DECODER if source == "rollouts" else DECODER
    for line, raw, value in json_lines(night.path(source, rel), rel, max_line_bytes, decoder, lines):
        number += 1
        one_line(source, rel, line, raw, value, number, parse, add, rejects)
    return number


def one_line(source: str, rel: str, line: int, raw: bytes, value, number: int, parse, add, rejects) -> None:
    problem = torn_line(value, raw) if isinstance(value, RecordError) else None
    if problem is None:
        try:
            row = parse(value, rel)
        except RecordError as e:
            problem = e.with_traceback(None)  # no cycle through this frame
    if problem is not None:
        ids = guess_ids(value, rel if source == "ledger" else None)
        reject(rejects, source, rel, line, str(problem), raw, *ids)
        return
    row.update(source_file=rel, source_line=line)
    add(number, row)
