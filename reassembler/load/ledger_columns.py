"""The ledger's JSON lines read in columns (CONTRACT.md 2.2), for read.py.

pyarrow's JSON reader parses many whole ledger files at once (`parse_files`), with an
explicit schema for the ledger's fields; every other field is parsed too (`infer`), so a
key given twice anywhere in a line fails the parse just as it fails the per-line decoder.
`ledger_table` then applies parse_ledger_row's rules (records.py) as expressions over the
columns. What it cannot decide exactly goes back to the per-line path of read.py, so rows,
reject rows and their messages are the same either way:

- a whole file (`scan_file`, or the parse failing): a line that does not start with "{"
  and end with "}" (blank lines, arrays, a BOM, ...), a line over the size limit, JSON the
  reader refuses (bad syntax, a duplicate key, a value of another type than the field's,
  invalid UTF-8, a lone surrogate, ...), or more objects than lines;
- one line (`ledger_table`'s `per_line` mask): a value the row cannot do without is
  missing (rollout_id without a `<rollout_id>.lineage.jsonl` file name, model_call_id, or
  a non-poison row's mode, digests and lengths), an output_items entry without a
  fingerprint, or a version field that is null where the line names it (absent means
  NeMo Gym's default, null does not; only the line tells them apart).

A line whose opening brackets are more than MAX_JSON_DEPTH goes the per-line path too,
which rejects it when it nests deeper than that: pyarrow never sees such a line (it
crashes the process on ~50,000 levels).

Since each line starts with "{" and ends with "}", no object can span two lines, so equal
numbers of lines and objects means one object per line, in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from .. import storage
from ..errors import InputError
from ..formats.fields import LEDGER, LEDGER_INTS, VERSION_DEFAULTS, ledger_json
from ..formats.records import rollout_id_from_path
from ..settings import MAX_JSON_DEPTH

JSON_SCHEMA = ledger_json()  # every field of the ledger, typed (formats/fields.py)
OPEN, CLOSE, BRACKET, NEWLINE, CR = ord("{"), ord("}"), ord("["), ord("\n"), ord("\r")


@dataclass(frozen=True)
class ScannedFile:
    rel: str
    data: bytes
    starts: np.ndarray  # byte offset of each line
    ends: np.ndarray  # byte offset of each line's end (its newline, or the end of the file)

    @property
    def n_lines(self) -> int:
        return len(self.starts)

    def line(self, k: int) -> bytes:
        """Line k (0-based) with its newline, as the per-line reader gives it."""
        return self.data[self.starts[k] : self.ends[k] + 1]


def scan_file(rel: str, data: bytes, max_line_bytes: int) -> ScannedFile | None:
    """The file's lines, or None when the file has to be read line by line."""
    if not data:
        return ScannedFile(rel, data, np.zeros(0, np.int64), np.zeros(0, np.int64))
    buf = np.frombuffer(data, np.uint8)
    newlines = np.flatnonzero(buf == NEWLINE)
    ends = newlines if data.endswith(b"\n") else np.append(newlines, len(data))
    starts = np.concatenate([[0], newlines + 1])[: len(ends)]
    if np.any(ends - starts + 1 > max_line_bytes) or np.any(ends == starts):
        return None
    last = ends - 1
    last = np.where((buf[last] == CR) & (last > starts), last - 1, last)  # a \r\n line end
    if np.any(buf[starts] != OPEN) or np.any(buf[last] != CLOSE):
        return None
    # a line that may nest deeper than MAX_JSON_DEPTH never reaches pyarrow's parser (deep
    # enough, it crashes the process): its opening brackets bound its depth
    brackets = np.flatnonzero((buf == OPEN) | (buf == BRACKET))
    if len(brackets) > MAX_JSON_DEPTH:
        per_line = np.bincount(np.searchsorted(starts, brackets, side="right") - 1, minlength=len(starts))
        if per_line.max() > MAX_JSON_DEPTH:
            return None
    return ScannedFile(rel, data, starts, ends)


def parse_files(files: list[ScannedFile]) -> pa.Table | None:
    """The files' lines as one table (row k: the k-th line, files in order), or None when
    pyarrow cannot parse them or finds more objects than lines."""
    n_lines = sum(f.n_lines for f in files)
    if n_lines == 0:
        return None
    blob = b"".join(f.data if f.data.endswith(b"\n") else f.data + b"\n" for f in files if f.data)
    longest = max(int((f.ends - f.starts).max()) for f in files if f.n_lines)
    try:
        table = pj.read_json(
            pa.py_buffer(blob),
            read_options=pj.ReadOptions(block_size=max(1 << 20, 2 * (longest + 2))),
            parse_options=pj.ParseOptions(explicit_schema=JSON_SCHEMA, unexpected_field_behavior="infer"),
        )
    except (pa.ArrowException, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    if table.num_rows != n_lines:
        return None
    return table.select(JSON_SCHEMA.names)


def _nonempty(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The strings that are not empty; "" becomes null."""
    return pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column)


def _np(mask) -> np.ndarray:
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False)


def ledger_table(parsed: pa.Table, files: list[ScannedFile]) -> tuple[pa.Table, np.ndarray]:
    """parse_ledger_row over the columns: (ledger rows in read.py's insert schema, without
    capture_seq, source_file and source_line; per_line: the rows to read line by line)."""
    n = parsed.num_rows
    col = parsed.column
    file_of_row = np.repeat(np.arange(len(files)), [f.n_lines for f in files])
    from_path = pa.array([rollout_id_from_path(f.rel) for f in files], pa.string()).take(pa.array(file_of_row))
    rollout_id = pc.coalesce(_nonempty(col("rollout_id")), from_path)
    model_call_id = _nonempty(col("model_call_id"))
    poison = col("failure_reason").is_valid()
    digest = pc.coalesce(col("staging_digest"), col("digest"))
    per_line = _np(rollout_id.is_null()) | _np(model_call_id.is_null())

    out: dict[str, pa.ChunkedArray | pa.Array] = {
        "rollout_id": rollout_id,
        "model_call_id": model_call_id,
        "parent_call_id": col("parent_call_id"),
        "failure_reason": col("failure_reason"),
        "mode": col("mode"),
        "digest": digest,
    }
    for name in ("extras_digest", "chain_hash", "cumulative_hash"):
        out[name] = col(name)
    required = ["mode", "digest", "extras_digest", "chain_hash", "cumulative_hash"]
    required += [name for name in LEDGER_INTS if name not in VERSION_DEFAULTS]
    not_poison = ~_np(poison)
    for name in required:
        per_line |= not_poison & _np(out[name].is_null() if name in out else col(name).is_null())
    for name in LEDGER_INTS:
        if name not in VERSION_DEFAULTS:
            out[name] = col(name)
            continue
        # null where the file names the field (or could, behind an escape): only the line
        # tells null from absent
        key = f'"{name}"'.encode()
        named = np.array([key in f.data or b"\\" in f.data for f in files], dtype=bool)
        per_line |= _np(col(name).is_null()) & named[file_of_row]
        out[name] = pc.fill_null(col(name), VERSION_DEFAULTS[name])
    out["staging_key"] = pc.coalesce(
        _nonempty(col("staging_key")), pc.binary_join_element_wise(rollout_id, model_call_id, "/")
    )
    out["response_id"] = pc.if_else(poison, _nonempty(col("response_id")), col("response_id"))
    out["admitted_at"] = col("admitted_at")
    items = col("output_items").combine_chunks()
    out["output_items"] = items
    if items.null_count < n:
        flat = items.flatten()
        lacking = pc.or_(flat.is_null(), pc.struct_field(flat, "fingerprint").is_null())
        rows = pc.list_parent_indices(items).filter(pc.fill_null(lacking, True)).to_numpy(zero_copy_only=False)
        per_line[np.unique(rows)] = True
        ids = pc.struct_field(flat, "id")
        if _np(pc.equal(ids, "")).any():  # an empty id counts as none
            lengths = pc.list_value_length(items).fill_null(0).to_numpy(zero_copy_only=False)
            out["output_items"] = pa.ListArray.from_arrays(
                pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)),
                pa.StructArray.from_arrays(
                    [_nonempty(ids), pc.struct_field(flat, "fingerprint")], names=["id", "fingerprint"]
                ),
                mask=items.is_null() if items.null_count else None,
            )
    out["output_fingerprint"] = col("output_fingerprint")
    out["fingerprint_version"] = col("fingerprint_version")
    for f in LEDGER:
        if f.group == "capture":  # a ledger line is staged capture: these stay null
            out[f.name] = pa.nulls(n, pa.string())
    names = [f.name for f in LEDGER if f.name not in ("capture_seq", "source_file", "source_line")]
    table = pa.table({name: out[name] for name in names})
    return table, per_line


# -- whole chunks of files


@dataclass
class Chunk:
    """Consecutive ledger files: (rel, ScannedFile or None: read line by line) each, and
    for the files parsed in columns, their rows (`ledger_table`) and per-line mask."""

    files: list[tuple[str, ScannedFile | None]]
    columnar: list[ScannedFile] = field(default_factory=list)
    table: pa.Table | None = None
    per_line: np.ndarray | None = None


CHUNK_BYTES = 8 << 20


def ledger_chunks(files: list[tuple[str, str]], max_line_bytes: int, in_columns: bool = True) -> Iterator[Chunk]:
    """The files read, scanned and parsed in chunks of about CHUNK_BYTES, in order (pyarrow
    parses a chunk's files at once); `in_columns` False leaves every file to the per-line path."""
    chunk: list[tuple[str, ScannedFile | None]] = []
    size = 0
    names = dict((path, rel) for rel, path in files)
    for path, data in storage.read_many([path for _, path in files]):
        rel = names[path]
        if isinstance(data, OSError):
            raise InputError(f"{rel}: cannot open ({data.strerror})") from data
        chunk.append((rel, scan_file(rel, data, max_line_bytes) if in_columns else None))
        size += len(data)
        if size >= CHUNK_BYTES:
            yield _prepare(chunk)
            chunk, size = [], 0
    if chunk:
        yield _prepare(chunk)


def _prepare(files: list[tuple[str, ScannedFile | None]]) -> Chunk:
    """Parse what can be parsed: all the files at once, or (when that fails) file by file."""
    scanned = [s for _, s in files if s is not None and s.n_lines]
    whole = parse_files(scanned) if scanned else None
    if whole is not None:
        columnar, tables = scanned, [whole]
    else:
        parsed = [(f, parse_files([f])) for f in scanned]
        columnar, tables = [f for f, t in parsed if t is not None], [t for _, t in parsed if t is not None]
    if not columnar:
        return Chunk(files)
    table, per_line = ledger_table(pa.concat_tables(tables), columnar)
    return Chunk(files, columnar, table, per_line)
