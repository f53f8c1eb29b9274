"""What the merge's steps share: where they write in the run's folder, their markers, the
scratch DuckDB each runs in, and the parts' tables read into it.

    <run folder>/load/part-NNNNN/...          the load parts (load/part_load.py)
    <run folder>/load/merge/rollouts.json     the global step's marker (merge/rollouts.py)
    <run folder>/load/merge/keys-NNNNN.json   a key bucket's (merge/keys.py)
    <run folder>/load/merge/bucket-NNNNN.json a rollout bucket's (merge/bucket.py)

A step's files are written before its marker, and a step reads another's only through its
marker: a step run again (a retried task) rewrites its files whole, and its marker last.

A part's marker records the size and SHA-256 of each file it wrote, and every file the job
writes carries a CRC32 per page (table_file.py). The merge trusts none of them as found: each
step checks the sizes of the part files it reads, the global step the SHA-256 of the
per-rollout files it reads whole, and every page is checked against its CRC as it is read
(the buckets read only their row groups of the per-call files, so no step hashes every file
again). A file damaged, truncated, replaced or edited since its part wrote it, or a marker or
plan that does not parse, is an InputError naming it (exit 2): run the load again.

The merge's own steps hand their files on the same way (`handed`, `check_handed`): the global
step's, the key buckets' and the rollout buckets' markers record each file they wrote (size,
SHA-256, and the SHA-256 of its Parquet footer), and the step that reads one checks it first:
whole when it reads it whole, else its size and footer (another bucket's file, a file of an
earlier run, a truncated one), every page then against its CRC. A marker whose counts are not
counts is refused the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TypeVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..buckets import read_bucket
from ..errors import InputError
from ..load.parts import LoadPlan, part_folder, seal_holds, sealed
from ..settings import DuckDBSettings
from ..table_file import digest, write_table
from ..warehouse import scratch_config
from ..wide_sort import ordered

PART_MARKER = "part.json"
T = TypeVar("T")


def merge_dir(folder: str) -> str:
    return storage.join(folder, "load", "merge")


def marker_path(folder: str, name: str) -> str:
    return storage.join(merge_dir(folder), f"{name}.json")


def write_marker(folder: str, name: str, marker: dict) -> None:
    storage.write_bytes(marker_path(folder, name), sealed(marker))


def read_marker(folder: str, name: str, what: str, plan: LoadPlan) -> dict:
    """A step's marker; RuntimeError naming it when the step has not finished, or ran for
    another load plan; InputError when a count it records is not one."""
    where = marker_path(folder, name)
    marker = _marker_at(where, what, plan)
    counts: dict = {}
    for key in COUNTS & marker.keys():  # a count, or a count by kind ({"ledger": 5892, ...})
        value = marker[key]
        counts.update({f"{key}.{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value})
    for key, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{where}: the marker of {what} records {key} {value!r}, not a count; run the load again")
    return marker


# the counts a merge step's marker records (read_marker checks each is one)
COUNTS = frozenset(
    {"bucket", "ledger_used", "ledger_failed", "ledger_lines", "rows", "token_rows", "in_token_files", "rollout_lines"}
    | {"rollouts_loaded", "repeated_rejects", "shards", "rejects"}
)


def handed(folder: str, names: list[str]) -> dict[str, dict]:
    """What a merge step records of the files it wrote in `folder` (its marker's "files"):
    each one's size, SHA-256 and the SHA-256 of its Parquet footer."""
    import hashlib

    out = {}
    for name in names:
        loc = storage.join(folder, name)
        whole = digest(loc)
        out[name] = {**whole, "footer_sha256": hashlib.sha256(_footer(loc, whole["bytes"])).hexdigest()}
    return out


def _footer(loc: str, size: int) -> bytes:
    """A Parquet file's footer: its metadata, its length and the closing magic."""
    if size < 12:
        return b""
    [tail] = storage.read_ranges(loc, [(size - 8, 8)], size)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or length > size - 12:
        return tail
    [meta] = storage.read_ranges(loc, [(size - 8 - length, length)], size)
    return meta + tail


def check_handed(folder: str, name: str, marker: dict, what: str, whole: bool = False) -> str:
    """The location of file `name` in `folder`, once it is the file the step `what` recorded
    in its `marker` (`whole`: its SHA-256, for a reader of the whole file; else its size and
    footer); InputError naming it otherwise."""
    import hashlib

    loc = storage.join(folder, name)
    wrote = (marker.get("files") or {}).get(name)
    if not isinstance(wrote, dict):
        raise InputError(f"{loc}: the marker of {what} records no such file; run the load again")
    try:
        size = storage.size(loc)
        found = digest(loc) if whole else {"bytes": size, "sha256": wrote.get("sha256")}
        if not whole and size == wrote.get("bytes"):
            found["footer_sha256"] = hashlib.sha256(_footer(loc, size)).hexdigest()
        else:
            found["footer_sha256"] = wrote.get("footer_sha256")
    except FileNotFoundError:
        raise InputError(f"{loc}: written by {what}, now missing; run the load again") from None
    expected = {k: wrote.get(k) for k in ("bytes", "sha256", "footer_sha256")}
    if found != expected:
        raise InputError(
            f"{loc}: not the file {what} wrote ({_file(found, whole)}; it wrote {_file(expected, whole)}); "
            "run the load again"
        )
    return loc


def open_checked(loc: str, damaged: Callable[[str, Exception], InputError] | None = None) -> pq.ParquetFile:
    """A Parquet file the job wrote, opened with every page checked against its CRC as it is
    read (table_file.OPTIONS); a file that does not open is the InputError `damaged` makes
    of it (`damaged_file`: one naming it)."""
    try:
        return pq.ParquetFile(storage.open_parquet(loc), page_checksum_verification=True)
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise (damaged or damaged_file)(loc, e) from None


def read_whole(loc: str, columns: list[str] | None = None) -> pa.Table:
    """A handed-over Parquet file read whole (`columns` of it), every page checked against
    its CRC; a file that does not read is an InputError naming it."""
    file = open_checked(loc)
    try:
        return file.read(columns)
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise damaged_file(loc, e) from None


def damaged_file(loc: str, e: Exception) -> InputError:
    said = " ".join(str(e).split())  # one line
    return InputError(f"{loc}: damaged since it was written ({said}); run the load again")


def read_checked(
    loc: str, pieces: Iterator[T], damaged: Callable[[str, Exception], InputError] | None = None
) -> Iterator[T]:
    """`pieces` (tables or batches) read from the file at `loc`, a page that fails its CRC (or
    does not decode) the InputError `damaged` makes of it (`damaged_file`: one naming the file)."""
    try:
        yield from pieces
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise (damaged or damaged_file)(loc, e) from None


def read_part_markers(plan: LoadPlan, folder: str) -> list[dict]:
    """Each part's marker; a part without one did not finish (RuntimeError naming it)."""
    return [
        _marker_at(storage.join(part_folder(folder, k), PART_MARKER), f"load part {k} of {len(plan.parts)}", plan)
        for k in range(len(plan.parts))
    ]


def _marker_at(where: str, what: str, plan: LoadPlan) -> dict:
    try:
        marker = json.loads(storage.read_bytes(where))
    except FileNotFoundError:
        raise RuntimeError(f"{where}: {what} has not finished") from None
    except ValueError as e:  # not JSON, not UTF-8
        raise InputError(f"{where}: the marker of {what} is unreadable ({e}); run the load again") from None
    if not isinstance(marker, dict):
        raise InputError(f"{where}: the marker of {what} is not a JSON object; run the load again")
    if not seal_holds(marker):
        raise InputError(f"{where}: the marker of {what} was changed since {what} wrote it; run the load again")
    if marker.get("plan") != plan.plan_id:
        raise RuntimeError(f"{where}: {what} ran for another load plan; run it again")
    return marker


def scratch(settings: DuckDBSettings) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB for one step, bounded like the warehouse's (its spill folder local)."""
    return duckdb.connect(config=scratch_config(settings))


def part_files(plan: LoadPlan, folder: str, name: str, markers: list[dict], whole: bool = False) -> list[str]:
    """Each part's file `name`, checked against what its part's marker (`markers`) recorded:
    its size, and (`whole`: the caller reads it whole) its SHA-256; InputError naming a file
    that differs."""
    out = []
    for k, marker in enumerate(markers):
        loc = storage.join(part_folder(folder, k), f"{name}.parquet")
        wrote = (marker.get("files") or {}).get(f"{name}.parquet")
        if not isinstance(wrote, dict):
            raise InputError(f"{loc}: load part {k}'s marker records no such file; run the load again")
        try:
            found = digest(loc) if whole else {"bytes": storage.size(loc), "sha256": wrote.get("sha256")}
        except FileNotFoundError:
            raise InputError(f"{loc}: written by load part {k}, now missing; run the load again") from None
        expected = {"bytes": wrote.get("bytes"), "sha256": wrote.get("sha256")}
        if found != expected:
            raise InputError(
                f"{loc}: not the file load part {k} wrote ({_file(found, whole)}; it wrote "
                f"{_file(expected, whole)}); run the load again"
            )
        out.append(loc)
    return out


def _file(what: dict, sha: bool) -> str:
    size = what["bytes"]
    text = f"{size:,} bytes" if isinstance(size, int) else f"size {size!r}"
    if sha:
        return text + f", SHA-256 {str(what['sha256'])[:16]}..."
    footer = what.get("footer_sha256")
    return text + (f", footer SHA-256 {str(footer)[:16]}..." if footer else "")


def stage(con, table: str, locations: list[str], bucket: int | None = None, with_part: bool = True) -> None:
    """Temporary table `table`: the rows of the Parquet files at `locations` (the parts',
    in part order, each row with its part's number when `with_part`), all of them or those
    of one `bucket` of BucketedFiles, streamed a row group at a time."""
    failed: list[InputError] = []

    def damaged(loc: str, e: Exception) -> InputError:  # kept: DuckDB's scan may wrap it
        failed.append(damaged_file(loc, e))
        return failed[-1]

    files = [open_checked(loc, damaged) for loc in locations]
    schema = files[0].schema_arrow if files else None
    if schema is not None and "bucket" in schema.names:
        schema = schema.remove(schema.get_field_index("bucket"))
    if schema is None:
        raise RuntimeError(f"internal: no files to stage as {table}")
    if with_part:
        schema = schema.append(pa.field("part", pa.int64()))

    def tables() -> Iterator[pa.Table]:
        for k, (loc, file) in enumerate(zip(locations, files)):
            pieces = (
                (file.read_row_group(g) for g in range(file.num_row_groups))
                if bucket is None
                else read_bucket(file, bucket)
            )
            for piece in read_checked(loc, pieces, damaged):
                if "bucket" in piece.column_names:
                    piece = piece.drop_columns(["bucket"])
                if with_part:
                    piece = piece.append_column("part", pa.repeat(pa.scalar(k, pa.int64()), piece.num_rows))
                yield piece.cast(schema)

    def batches() -> Iterator[pa.RecordBatch]:
        for piece in tables():
            yield from piece.to_batches()

    con.register("staged_rows", pa.RecordBatchReader.from_batches(schema, batches()))
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM staged_rows")  # noqa: S608 - fixed names
    except Exception:
        if failed:  # a damaged file, raised inside DuckDB's scan: the error that names it
            raise failed[0] from None
        raise
    finally:
        try:  # on an aborted transaction this fails too: the first error is the one to report
            con.unregister("staged_rows")
        except Exception:  # noqa: BLE001, S110 - the error in flight, if any, is re-raised
            pass


# Rows of wide records (rollout rows: their output items) sorted and handed over at a time.
# DuckDB 2.0 streaming a table of wide rows ORDER BY its key runs out of memory at the
# default 128MB whatever the batch (a night of 160,000 rollouts of ~2 KB stopped at the
# global step), while the same rows in ranges of the key sort in a few MB each.
WIDE_ROWS = 4096


def write_in_order(con, loc: str, table: str, key: str, exclude: str = "ds", rows: int = WIDE_ROWS) -> int:
    """The rows of `table` (but its column `exclude`) into one Parquet file at `loc` (whole
    or absent), in the order of `key`, nulls last, sorted `rows` at a time (wide_sort.py).
    Returns the rows."""
    from ..call_tables import write_file

    schema, tables = ordered(con, table, [key], exclude, rows)
    return write_file(loc, schema, tables)


def write_query(con, loc: str, query: str, params: dict | None = None, schema: pa.Schema | None = None) -> int:
    """The rows of `query` into one Parquet file at `loc` (whole or absent); returns them."""
    from ..call_tables import ROW_GROUP_ROWS, write_file

    reader = con.sql(query, params=params).to_arrow_reader(ROW_GROUP_ROWS)
    return write_file(loc, schema or reader.schema, reader)


def write_bucketed(
    reader: pa.RecordBatchReader, loc: str, key: str, buckets: int, schema: pa.Schema | None = None, direct=False
) -> None:
    """The batches of `reader` into one BucketedFile at `loc`, split by `key` into `buckets`
    (or, `direct`, by the int bucket `key` holds), each batch cast to `schema` if given."""
    write_table(loc, schema or reader.schema, reader, key, buckets, direct)
