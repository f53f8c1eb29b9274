"""Read one night of capture (CONTRACT.md section 2) into the DuckDB warehouse.

- rollout JSONL is parsed line by line (records.py); the ledger's files are parsed in
  columns (ledger_columns.py) on a thread of their own meanwhile, and the files and lines
  that path cannot take exactly are parsed line by line like the rollouts; a line that is
  not JSON, or not the shape of its record, becomes a reject row;
- token Parquet is not copied: each file's schema is checked (a missing column or an
  unsupported type stops the night with exit 2); `token_rows_sql` exposes the scalar
  columns to SQL, and token_store.py reads the lists of the rows a shard needs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import InputError
from .fields import LEDGER, ROLLOUT, arrow_schema
from .items import JsonFloat
from .ledger_columns import Chunk, PreparedChunks
from .records import (
    LEDGER_DIGESTS,
    LEDGER_INTS,
    LINEAGE_FIELDS,
    VERSION_DEFAULTS,
    RecordError,
    parse_ledger_row,
    parse_rollout,
    rollout_id_from_path,
)
from .settings import MAX_LINE_BYTES
from .warehouse import run_script, sql

CHUNK_ROWS = 500  # rows buffered before an insert: a rollout row carries its whole output's fingerprints
# NeMo Gym's local capture mode writes TokenEntry records as <rollout_id>.tokens.jsonl beside
# the lineage files: token arrays, not ledger rows (CONTRACT.md 2).
NOT_LEDGER_SUFFIX = ".tokens.jsonl"
RAW_CHARS = 300


@dataclass(frozen=True)
class NightFiles:
    root: Path
    ds: str
    rollouts: list[str]  # paths relative to their partition folder, in reading order
    ledger: list[str]
    tokens: list[str]

    def path(self, kind: str, rel: str) -> Path:
        return self.root / kind / f"ds={self.ds}" / rel


def _list_files(part: Path, suffix: str, recursive: bool, exclude: str | None = None) -> list[str]:
    """Files ending in `suffix` in a partition folder (and its subfolders when `recursive`),
    as sorted relative paths. Symbolic links are followed; a dangling link, an unreadable
    entry or a link loop is an InputError naming it: nothing is skipped silently."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()

    def visit(folder: Path, rel: str) -> None:
        st = folder.stat()
        if (st.st_dev, st.st_ino) in seen:
            raise InputError(f"{folder}: symbolic link loop (this folder is reached twice)")
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise InputError(f"{folder}: cannot list the folder ({e.strerror})") from e
        for entry in entries:
            name = f"{rel}{entry.name}"
            try:
                is_dir, is_file = entry.is_dir(), entry.is_file()
            except OSError as e:
                raise InputError(f"{folder / entry.name}: cannot read ({e.strerror})") from e
            if entry.is_symlink() and not (is_dir or is_file):
                if entry.name.endswith(suffix) or recursive:
                    raise InputError(
                        f"{folder / entry.name}: dangling symbolic link (points to {os.readlink(entry.path)})"
                    )
                continue
            if is_dir:
                if recursive:
                    visit(Path(entry.path), name + "/")
            elif is_file and entry.name.endswith(suffix) and not (exclude and entry.name.endswith(exclude)):
                if not os.access(entry.path, os.R_OK):
                    raise InputError(f"{folder / entry.name}: file is not readable")
                found.append(name)

    visit(part, "")
    return sorted(found)


def find_night(input_dir: str | Path, ds: str) -> NightFiles:
    root = Path(input_dir)
    found = {}
    for kind, suffix, recursive in (
        ("rollouts", ".jsonl", False),
        ("ledger", ".jsonl", True),
        ("tokens", ".parquet", False),
    ):
        part = root / kind / f"ds={ds}"
        if not part.is_dir():
            raise InputError(f"{part}: input partition folder is missing")
        found[kind] = _list_files(part, suffix, recursive, NOT_LEDGER_SUFFIX if kind == "ledger" else None)
    return NightFiles(root, ds, found["rollouts"], found["ledger"], found["tokens"])


# ---------------------------------------------------------------- JSON lines -> warehouse

ROLLOUT_BATCH = arrow_schema(ROLLOUT)
LEDGER_BATCH = arrow_schema(LEDGER)
REJECT_BATCH = pa.schema(
    [
        ("source", pa.string()),
        ("file", pa.string()),
        ("line", pa.int64()),
        ("error", pa.string()),
        ("raw", pa.string()),
        ("rollout_id", pa.string()),
        ("model_call_id", pa.string()),
    ]
)


class _Inserter:
    """Buffers dict rows and inserts them through sql/<statement>.sql, CHUNK_ROWS at a time."""

    def __init__(self, con, statement: str, schema: pa.Schema, ds: str):
        self.con, self.statement, self.schema, self.ds = con, sql(statement), schema, ds
        self.rows: list[dict] = []
        self.count = 0

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if len(self.rows) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.con.register("batch", pa.Table.from_pylist(self.rows, schema=self.schema))
            self.con.execute(self.statement, {"ds": self.ds})
            self.con.unregister("batch")
            self.count += len(self.rows)
            self.rows = []


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RecordError(f"duplicate key {key!r} in a JSON object")
            seen.add(key)
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys)
# rollout lines: floats marked, so that their items' fingerprints know which hold one (items.py)
_ROLLOUT_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicate_keys, parse_float=JsonFloat, parse_constant=JsonFloat
)


def _json_lines(path: Path, rel: str, max_bytes: int = MAX_LINE_BYTES, decoder=_DECODER):
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
            yield number, raw, _decode(raw, decoder)


def _decode(raw: bytes, decoder=_DECODER):
    """One line's JSON value, or the RecordError that makes it a reject row."""
    try:
        return decoder.decode(raw.decode("utf-8"))
    except RecordError as e:
        return e
    except (ValueError, RecursionError) as e:
        return RecordError(f"not valid JSON: {e}")


def _raw_text(raw: bytes) -> str:
    return raw[:RAW_CHARS].decode("utf-8", errors="replace").rstrip("\r\n")


def _reject(
    rejects: _Inserter, source: str, rel: str, line: int, error: str, raw: bytes, rollout_id=None, model_call_id=None
) -> None:
    rejects.add(
        {
            "source": source,
            "file": rel,
            "line": line,
            "error": error[:500],
            "raw": _raw_text(raw),
            "rollout_id": rollout_id,
            "model_call_id": model_call_id,
        }
    )


def _guess_ids(value, rel: str | None = None) -> tuple[str | None, str | None]:
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


@dataclass(frozen=True)
class SourceCount:
    """One input source of a night: every line / token row read is loaded or rejected."""

    read: int
    loaded: int
    rejected: int

    def __str__(self) -> str:
        return f"{self.read} read = {self.loaded} loaded + {self.rejected} rejected"


@dataclass(frozen=True)
class LoadSummary:
    rollouts: SourceCount
    ledger: SourceCount
    tokens: SourceCount
    n_ledger_rows: int  # rows in the warehouse's ledger table (rows of unknown rollouts included)
    n_token_files: int

    @property
    def n_rollouts(self) -> int:
        return self.rollouts.loaded

    @property
    def n_rejects(self) -> int:
        return self.rollouts.rejected + self.ledger.rejected + self.tokens.rejected

    def lines(self) -> list[str]:
        return [
            f"{name:<9}{count}"
            for name, count in (("rollouts", self.rollouts), ("ledger", self.ledger), ("tokens", self.tokens))
        ]


def load_night(
    con: duckdb.DuckDBPyConnection, night: NightFiles, allow_empty: bool = False, max_line_bytes: int = MAX_LINE_BYTES
) -> LoadSummary:
    """Replace the night `night.ds` in the warehouse, in one transaction: clear it, load the
    rollout lines, load the ledger lines, record the rows nobody asks for, count. A night
    from which no rollout could be read is refused (InputError) unless `allow_empty`."""
    ds = night.ds
    tokens = token_rows_sql(night)  # fail on unusable token files before touching anything
    con.execute("BEGIN TRANSACTION")
    try:
        run_script(con, "clear_night", {"ds": ds})
        rejects = _Inserter(con, "insert_rejects", REJECT_BATCH, ds)
        # the ledger files are read and parsed on a thread of their own while the rollouts load
        ledger_files = [(rel, night.path("ledger", rel)) for rel in night.ledger]
        with PreparedChunks(ledger_files, max_line_bytes, LEDGER_IN_COLUMNS) as chunks:
            rollout_lines, rollouts_loaded = _load_rollouts(con, night, rejects, max_line_bytes)
            ledger_lines, ledger_loaded = _load_ledger(con, night, chunks, rejects, max_line_bytes)
        rejects.flush()
        if rollouts_loaded == 0 and not allow_empty:
            raise InputError(
                f"{night.path('rollouts', '')}: no rollout could be read ({len(night.rollouts)} files, "
                f"{rollout_lines} lines); an empty night is published only with --allow-empty"
            )
        _reject_orphans(con, night, tokens)
        counts = dict(con.execute(sql("count_rejects"), {"ds": ds}).fetchall())
        ledger_used, token_rows = con.execute(sql("count_loaded", tokens=tokens), {"ds": ds}).fetchone() or (0, 0)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    summary = LoadSummary(
        rollouts=SourceCount(rollout_lines, rollouts_loaded, counts.get("rollouts", 0)),
        ledger=SourceCount(ledger_lines, ledger_used, counts.get("ledger", 0)),
        tokens=SourceCount(token_rows, token_rows - counts.get("tokens", 0), counts.get("tokens", 0)),
        n_ledger_rows=ledger_loaded,
        n_token_files=len(night.tokens),
    )
    for name in ("rollouts", "ledger", "tokens"):
        c = getattr(summary, name)
        if c.read != c.loaded + c.rejected:  # every line and token row is accounted for
            raise RuntimeError(f"internal: {name} {c}")
    return summary


def _read_lines(night: NightFiles, source: str, parse, add, rejects: _Inserter, max_line_bytes: int) -> int:
    """Every line of a source ("rollouts" or "ledger"), files by path then lines: `parse(value,
    rel)` turns it into a row, given to `add(number, row)` (number: the line's place in
    reading order), or it raises RecordError and the line becomes a reject row. Returns the
    number of lines read."""
    number = 0
    for rel in getattr(night, source):
        number = _read_file_lines(night, source, rel, number, parse, add, rejects, max_line_bytes)
    return number


def _read_file_lines(night: NightFiles, source: str, rel: str, number: int, parse, add, rejects, max_line_bytes) -> int:
    """`_read_lines` for one file, whose first line is number + 1; returns the last number."""
    decoder = _ROLLOUT_DECODER if source == "rollouts" else _DECODER
    for line, raw, value in _json_lines(night.path(source, rel), rel, max_line_bytes, decoder):
        number += 1
        _one_line(source, rel, line, raw, value, number, parse, add, rejects)
    return number


def _one_line(source: str, rel: str, line: int, raw: bytes, value, number: int, parse, add, rejects) -> None:
    problem = value if isinstance(value, RecordError) else None
    if problem is None:
        try:
            row = parse(value, rel)
        except RecordError as e:
            problem = e.with_traceback(None)  # no cycle through this frame
    if problem is not None:
        ids = _guess_ids(value, rel if source == "ledger" else None)
        _reject(rejects, source, rel, line, str(problem), raw, *ids)
        return
    row.update(source_file=rel, source_line=line)
    add(number, row)


def _load_rollouts(con, night: NightFiles, rejects: _Inserter, max_line_bytes: int) -> tuple[int, int]:
    """Every rollout line: a rollout row, or a reject row (a repeated id keeps the first).
    Returns (lines read, rollouts loaded)."""
    rollouts = _Inserter(con, "insert_rollouts", ROLLOUT_BATCH, night.ds)
    seen: set[str] = set()

    def parse(value, rel: str) -> dict:
        row = parse_rollout(value, floats_marked=True)
        if row["rollout_id"] in seen:
            raise RecordError(f"rollout_id {row['rollout_id']} already seen in this night")
        seen.add(row["rollout_id"])
        row["rollout_seq"] = len(seen)
        return row

    lines = _read_lines(night, "rollouts", parse, lambda _, row: rollouts.add(row), rejects, max_line_bytes)
    rollouts.flush()
    return lines, rollouts.count


def _load_ledger(con, night: NightFiles, chunks, rejects: _Inserter, max_line_bytes: int) -> tuple[int, int]:
    """Every ledger line, in capture order (files by path, then lines): a ledger row, or a
    reject row. `chunks`: the files as ledger_columns.PreparedChunks gives them; the ones
    (and the lines) it could not take in columns are read here line by line. Returns
    (lines read, rows loaded)."""
    ledger = _Inserter(con, "insert_ledger", LEDGER_BATCH, night.ds)
    loaded = 0

    def add(capture_seq: int, row: dict) -> None:
        row["capture_seq"] = capture_seq
        ledger.add(row)

    number = 0
    for chunk in chunks:
        columnar = {f.rel: f for f in chunk.columnar}
        bases = []  # the number before each file read in columns
        for rel, _ in chunk.files:
            if rel in columnar:
                bases.append(number)
                number += columnar[rel].n_lines
            else:
                number = _read_file_lines(night, "ledger", rel, number, parse_ledger_row, add, rejects, max_line_bytes)
        if chunk.columnar:
            loaded += _insert_columns(con, night, chunk, bases, add, rejects)
    ledger.flush()
    return number, ledger.count + loaded


LEDGER_IN_COLUMNS = True  # False: every ledger line takes the per-line path (the tests' reference)


def _insert_columns(con, night: NightFiles, chunk: Chunk, bases: list[int], add, rejects: _Inserter) -> int:
    """Insert the rows parsed in columns; the lines ledger_columns.py leaves to the per-line
    path go through it (`add` or a reject row). Returns the rows inserted here."""
    files, table, per_line = chunk.columnar, chunk.table, chunk.per_line
    assert table is not None and per_line is not None
    numbers = np.concatenate([np.arange(base + 1, base + 1 + f.n_lines) for f, base in zip(files, bases)])
    lines = np.concatenate([np.arange(1, f.n_lines + 1) for f in files])
    file_of_row = np.repeat(np.arange(len(files)), [f.n_lines for f in files])
    for k in np.flatnonzero(per_line).tolist():
        f, line = files[file_of_row[k]], int(lines[k])
        raw = f.line(line - 1)
        _one_line("ledger", f.rel, line, raw, _decode(raw), int(numbers[k]), parse_ledger_row, add, rejects)
    keep = pa.array(~per_line)
    rels = pa.array([f.rel for f in files], pa.string())
    table = (
        table.append_column("capture_seq", pa.array(numbers))
        .append_column("source_file", rels.take(pa.array(file_of_row)))
        .append_column("source_line", pa.array(lines))
        .filter(keep)
        .select(LEDGER_BATCH.names)
        .cast(LEDGER_BATCH)
    )
    con.register("batch", table)
    con.execute(sql("insert_ledger"), {"ds": night.ds})
    con.unregister("batch")
    return table.num_rows


def _reject_orphans(con, night: NightFiles, tokens: str) -> None:
    """Ledger rows of no rollout of the night, and token rows no ledger row asks for."""
    con.execute(sql("orphan_ledger_rejects"), {"ds": night.ds})
    con.execute(
        sql("orphan_token_rejects", tokens=tokens),
        {"ds": night.ds, "token_dir": str(night.path("tokens", "")).rstrip("/") + "/"},
    )


# ---------------------------------------------------------------- token Parquet -> SQL

LOGPROB_NAMES = ("generation_logprobs_delta", "generation_log_probs_delta")


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _list_value_type(t: pa.DataType) -> pa.DataType | None:
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return t.value_type
    return None


def check_token_schema(schema: pa.Schema, rel: str) -> None:
    """Check one token file's schema; InputError naming the file and the problem."""

    def need(name: str) -> pa.DataType:
        if name not in schema.names:
            raise InputError(f"{rel}: token file has no column {name}")
        return schema.field(name).type

    def bad(name: str, t, expected: str) -> InputError:
        return InputError(f"{rel}: column {name} has type {t}, expected {expected}")

    for name in ("staging_key",) + LINEAGE_FIELDS:
        t = need(name)
        if not (_is_string(t) or pa.types.is_null(t)):
            raise bad(name, t, "string")
    for name in LEDGER_INTS:
        if name in VERSION_DEFAULTS and name not in schema.names:
            continue  # Gym's StagedCallRecord default (token_store.py fills it in)
        t = need(name)
        if not pa.types.is_integer(t):
            raise bad(name, t, "int64")
    for name in LEDGER_DIGESTS:
        t = need(name)
        if not (_is_string(t) or (pa.types.is_fixed_size_binary(t) and t.byte_width == 32)):
            raise bad(name, t, "string (64 hex) or fixed_size_binary(32)")
    t = need("token_ids_delta")
    if _list_value_type(t) not in (pa.int64(), pa.int32()):
        raise bad("token_ids_delta", t, "list<int64> or list<int32>")
    t = need("token_mask_delta")
    if _list_value_type(t) not in (pa.float32(), pa.bool_(), pa.int8()):
        raise bad("token_mask_delta", t, "list<float32>, list<bool> or list<int8>")
    lp_name = next((n for n in LOGPROB_NAMES if n in schema.names), None)
    if lp_name is None:
        raise InputError(f"{rel}: token file has no column generation_logprobs_delta")
    t = schema.field(lp_name).type
    if _list_value_type(t) not in (pa.float32(), pa.float64()):
        raise bad(lp_name, t, "list<float32> or list<float64>")


def _sql_string(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def token_rows_sql(night: NightFiles) -> str:
    """A SELECT of the keys of all the night's token rows (sql/token_files.sql), after
    checking every file's schema."""
    paths = []
    for rel in night.tokens:
        path = night.path("tokens", rel)
        try:
            schema = pq.read_schema(path)
        except Exception as e:  # pyarrow raises several types for a broken footer
            raise InputError(f"{rel}: unreadable Parquet file ({str(e).splitlines()[0]})") from e
        check_token_schema(schema, rel)
        paths.append(str(path))
    if not paths:
        return sql("token_empty")
    return sql("token_files", files="[" + ", ".join(_sql_string(p) for p in paths) + "]")
