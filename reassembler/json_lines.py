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
from pathlib import Path

from .errors import InputError
from .items import JsonFloat
from .night import NightFiles
from .records import RecordError, rollout_id_from_path
from .settings import MAX_LINE_BYTES

RAW_CHARS = 300


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RecordError(f"duplicate key {key!r} in a JSON object")
            seen.add(key)
    return obj


DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys)
# rollout lines: floats marked, so that their items' fingerprints know which hold one (items.py)
ROLLOUT_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicate_keys, parse_float=JsonFloat, parse_constant=JsonFloat
)


def json_lines(path: Path, rel: str, max_bytes: int = MAX_LINE_BYTES, decoder=DECODER):
    """(line number, raw bytes, decoded value or the error) of each non-blank line. A line
    longer than `max_bytes` is not decoded: it becomes a reject with its size."""
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise InputError(f"{rel}: cannot open ({e.strerror})") from e
    with fh:
        number = 0
        while True:
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
            yield number, raw, decode(raw, decoder)


def decode(raw: bytes, decoder=DECODER):
    """One line's JSON value, or the RecordError that makes it a reject row."""
    try:
        return decoder.decode(raw.decode("utf-8"))
    except RecordError as e:
        return e
    except (ValueError, RecursionError) as e:
        return RecordError(f"not valid JSON: {e}")


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
        rid = rid if isinstance(rid, str) and rid else None
        cid = cid if isinstance(cid, str) and cid else None
    if rid is None and rel is not None:
        rid = rollout_id_from_path(rel)
    return rid, cid


def read_lines(night: NightFiles, source: str, parse, add, rejects, max_line_bytes: int) -> int:
    """Every line of a source ("rollouts" or "ledger"), files by path then lines: `parse(value,
    rel)` turns it into a row, given to `add(number, row)` (number: the line's place in
    reading order), or it raises RecordError and the line becomes a reject row. Returns the
    number of lines read."""
    number = 0
    for rel in getattr(night, source):
        number = read_file_lines(night, source, rel, number, parse, add, rejects, max_line_bytes)
    return number


def read_file_lines(night: NightFiles, source: str, rel: str, number: int, parse, add, rejects, max_line_bytes) -> int:
    """`read_lines` for one file, whose first line is number + 1; returns the last number."""
    decoder = ROLLOUT_DECODER if source == "rollouts" else DECODER
    for line, raw, value in json_lines(night.path(source, rel), rel, max_line_bytes, decoder):
        number += 1
        one_line(source, rel, line, raw, value, number, parse, add, rejects)
    return number


def one_line(source: str, rel: str, line: int, raw: bytes, value, number: int, parse, add, rejects) -> None:
    problem = value if isinstance(value, RecordError) else None
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
