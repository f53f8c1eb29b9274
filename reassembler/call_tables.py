"""The warehouse's per-call tables (ledger, token_rows, rejects): Parquet files beside the
warehouse, never rows in its DuckDB file.

    <output>/calls/<table>/ds=<ds>/run=<run>/<piece>.parquet

A load writes a night's rows as immutable files in a folder of its own run, then commits,
in the warehouse's `night_calls` table, which run each night reads (the same transaction
that replaces the night's rollouts). The tables are VIEWs over the files of each night's
current run (sql/call_views.sql): a load that fails leaves files no view shows, and the next
load of the night removes them. Retention deletes a night's folders (warehouse.py), not rows.

- A local output: the views are part of the warehouse file (`duckdb warehouse.duckdb
  "select ... from ledger where ds = ..."` works), over read_parquet of the folder.
- An output on object storage: DuckDB has no httpfs here, so every connection defines
  them as temporary views over pyarrow datasets of the same folders (warehouse.connect).

While a load runs, `open_night` shadows the views of its connection with temporary tables
of the same names (sql/night_tables.sql): the merge's SQL fills them with the night, the
shard plans read them, and `write_bucket` writes them out as the bucket's files.
Each table has a zero-row file of its schema under ds=1970-01-01/run=schema, so that a
view over a warehouse that loaded no night yet has its columns.
"""

from __future__ import annotations

import functools
import logging
import weakref

import duckdb
import pyarrow as pa
from pyarrow import fs as pafs

from . import storage
from .errors import StoreError
from .formats.fields import LEDGER, ROLLOUT_ITEMS, ddl
from .table_file import write_table
from .wide_sort import ordered

log = logging.getLogger(__name__)

TABLES = ("ledger", "token_rows", "rejects", "rollout_items")
PER_CALL = ("ledger", "token_rows", "rollout_items")  # retention deletes these (rejects are kept for good)
SCHEMA_DS, SCHEMA_RUN = "1970-01-01", "schema"  # the zero-row file of each table's schema
ROW_GROUP_ROWS = 65_536
SORT_ROWS = 4096  # rows sorted at a time as a bucket's files are written (wide_sort.py)
PARTITIONS = pa.schema([("ds", pa.date32()), ("run", pa.string())])
# connections whose views are temporary (an output on object storage), with that output:
# their cursors, connections of their own, need the views defined again (`cursor`)
_TEMPORARY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def root(output) -> str:
    return storage.join(storage.location(output), "calls")


def night_folder(output, table: str, ds: str, run: str) -> str:
    return storage.join(root(output), table, f"ds={ds}", f"run={run}")


def _text(name: str, **fragments) -> str:
    from .warehouse import sql  # the warehouse module imports this one

    return sql(name, **fragments)


def _create_night_tables(con) -> None:
    from .warehouse import run_statements

    run_statements(con, _text("night_tables", ledger_columns=ddl(LEDGER), items_columns=ddl(ROLLOUT_ITEMS)))


@functools.cache
def schemas() -> dict[str, pa.Schema]:
    """Each table's Arrow schema without ds, from its DDL (sql/night_tables.sql)."""
    con = duckdb.connect()
    try:
        _create_night_tables(con)
        return {t: con.sql(f"SELECT * EXCLUDE (ds) FROM {t} LIMIT 0").to_arrow_table().schema for t in TABLES}
    finally:
        con.close()


def ensure_schema_files(output) -> None:
    """Write each table's zero-row schema file when it is missing."""
    for table, schema in schemas().items():
        loc = storage.join(night_folder(output, table, SCHEMA_DS, SCHEMA_RUN), "schema.parquet")
        if not storage.exists(loc):
            write_file(loc, schema, [])


def define_views(con, output, temporary: bool) -> None:
    """The views ledger, token_rows and rejects over the output's files (see the module's
    docstring): persistent over read_parquet for a local output, else `temporary` ones over
    pyarrow datasets registered on `con`."""
    where = root(output)
    con.execute("SELECT 1").fetchall()  # no result left unfinished: register() refuses to run beside one
    current = None
    if storage.is_remote(where):  # only the current runs' files: others may be deleted at any time
        rows = con.execute("SELECT CAST(ds AS VARCHAR), run FROM night_calls").fetchall()
        current = {f"ds={ds}/run={run}" for ds, run in rows} | {f"ds={SCHEMA_DS}/run={SCHEMA_RUN}"}
    for table, schema in schemas().items():
        if current is not None:
            import pyarrow.dataset as pads

            base = storage.join(where, table)
            paths = [
                storage.join(base, rel).removeprefix("s3://")
                for rel in storage.list_files(base, ".parquet", recursive=True)
                if rel.rsplit("/", 1)[0] in current
            ]
            sizes = dict(zip(paths, storage.sizes([f"s3://{p}" for p in paths])))
            files = pads.dataset(
                paths,
                filesystem=pafs.PyFileSystem(_Retried(sizes)),
                format="parquet",
                partitioning=pads.partitioning(PARTITIONS, flavor="hive"),
                partition_base_dir=base.removeprefix("s3://"),
                schema=pa.schema([*schema, *PARTITIONS]),
            )
            source = f"{table}_files"
            con.register(source, files)
        else:
            glob = storage.join(where, table, "*", "*", "*.parquet").replace("'", "''")
            source = (
                f"read_parquet('{glob}', hive_partitioning = true, union_by_name = true, "
                "hive_types = {'ds': DATE, 'run': VARCHAR})"
            )
        view = "TEMP VIEW" if temporary else "VIEW"
        con.execute(_text("call_views", view=view, table=table, source=source))
    if temporary:
        _TEMPORARY[con] = output


def is_temporary(con) -> bool:
    """Whether `con`'s views are temporary ones (an output on object storage)."""
    return con in _TEMPORARY


def cursor(con):
    """A cursor of `con` that sees the per-call views: temporary views belong to one
    connection, and a cursor is a connection of its own."""
    cur = con.cursor()
    output = _TEMPORARY.get(con)
    if output is not None:
        define_views(cur, output, temporary=True)
    return cur


class _Retried(pafs.FileSystemHandler):
    """The files of a view on object storage, as pyarrow's dataset reads them: each opened
    through storage.py's retried ranged reads (a fault mid-scan is retried as any read)."""

    def __init__(self, sizes: dict[str, int]):
        super().__init__()
        self.sizes = sizes

    def __eq__(self, other) -> bool:
        return isinstance(other, _Retried) and other.sizes == self.sizes

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def get_type_name(self) -> str:
        return "reassembler-s3"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths):
        return [pafs.FileInfo(p, pafs.FileType.File, size=self.sizes.get(p)) for p in paths]

    def open_input_file(self, path: str):
        return storage.open_parquet(f"s3://{path}", self.sizes.get(path))

    def open_input_stream(self, path: str):
        return self.open_input_file(path)

    def _refused(self, *args, **kwargs):
        raise NotImplementedError("the per-call views only read their files")

    get_file_info_selector = create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _refused
    delete_file = move = copy_file = open_output_stream = open_append_stream = _refused


def open_night(con) -> None:
    """This connection's night tables (temporary, empty), in place of the views."""
    for table in TABLES:
        con.execute(f"DROP VIEW IF EXISTS temp.{table}")
    _create_night_tables(con)


def write_bucket(con, output, ds: str, run: str, piece: str) -> dict[str, int]:
    """Write the night tables of `con` (one bucket's rows) into the run's folders as the
    file `piece` of each table, sorted by rollout (one rollout's rows are found by the row
    groups' statistics); returns the rows of each. The files stay invisible until
    `night_calls` names the run."""
    written = {}
    for table, schema in schemas().items():
        loc = storage.join(night_folder(output, table, ds, run), piece)
        _, tables = ordered(con, f"temp.{table}", ORDER[table], "ds", SORT_ROWS)
        written[table] = write_file(loc, schema, tables)
    return written


ORDER = {  # each per-call table's file order (wide_sort: DuckDB never sorts the wide rows)
    "ledger": ["rollout_id", "capture_seq"],
    "token_rows": ["t_rollout_id", "t_staging_key", "t_file", "t_row"],
    "rejects": ["source", "file", "line", "error"],
    "rollout_items": ["rollout_id"],
}


def write_file(loc: str, schema: pa.Schema, batches) -> int:
    """Record batches (or tables) into one Parquet file at `loc`, whole or absent (a view's
    glob never sees a torn file: table_file.py). Returns the rows."""
    return write_table(loc, schema, batches)


def commit_night(con, ds: str, run: str) -> None:
    """Name `run` the night's current one (inside the caller's transaction)."""
    con.execute("DELETE FROM night_calls WHERE ds = CAST($ds AS DATE)", {"ds": ds})
    con.execute("INSERT INTO night_calls VALUES (CAST($ds AS DATE), $run)", {"ds": ds, "run": run})


def current_runs(con, ds: str) -> list[str]:
    """The night's current run, as `night_calls` names it (none, or one)."""
    rows = con.execute("SELECT run FROM night_calls WHERE ds = CAST($ds AS DATE)", {"ds": ds}).fetchall()
    return [run for (run,) in rows]


def remove_other_runs(output, ds: str, keep: set[str]) -> None:
    """Remove the night's folders of every run not in `keep` (all of them for none): earlier
    loads, failed ones, a published run another replaced. Best effort: a folder left is
    invisible and goes next time."""
    for table in TABLES:
        night = storage.join(root(output), table, f"ds={ds}")
        try:
            runs = {rel.split("/", 1)[0] for rel in storage.list_files(night, "", recursive=True)}
            for folder in sorted(runs - {f"run={run}" for run in keep}):
                storage.delete_tree(storage.join(night, folder))
        except (StoreError, OSError) as e:
            log.info("the earlier per-call files of ds=%s in %s stay for now: %s", ds, night, e)


def nights_on_disk(output, table: str) -> list[str]:
    """The nights with a folder of `table` (the schema file's excepted)."""
    folder = storage.join(root(output), table)
    try:
        rels = storage.list_files(folder, "", recursive=True)
    except FileNotFoundError:
        return []
    found = {rel.split("/", 1)[0].removeprefix("ds=") for rel in rels if rel.startswith("ds=")}
    return sorted(found - {SCHEMA_DS})


MIGRATED = "migrated"  # the run of the rows a warehouse of schema version 8 held


def export_tables(con, output) -> None:
    """Write the rows of the per-call tables a warehouse of version 8 holds in its file as
    the run "migrated" of each of their nights, and name it in night_calls (created here:
    the migration that drops the tables runs next)."""
    con.execute("CREATE TABLE IF NOT EXISTS night_calls (ds DATE NOT NULL, run VARCHAR NOT NULL)")
    nights: set[str] = set()
    for table in ("ledger", "token_rows", "rejects"):  # rollout_items: version 10's rollout rows (export_items)
        for (ds,) in con.execute(f"SELECT DISTINCT ds FROM main.{table} ORDER BY ds").fetchall():  # noqa: S608
            loc = storage.join(night_folder(output, table, str(ds), MIGRATED), "part-00000.parquet")
            _export(con, table, f"main.{table} WHERE ds = CAST($ds AS DATE)", {"ds": str(ds)}, loc)
            nights.add(str(ds))
    for ds in sorted(nights):
        commit_night(con, ds, MIGRATED)


def export_items(con, output) -> None:
    """Write the rollouts' per-call fields a warehouse of version 10 holds in its rollout
    rows (formats/fields.py: ITEMS) as the file `migrated.parquet` of each night and run
    they belong to; the migration that drops the columns runs next."""
    runs = con.execute("SELECT DISTINCT CAST(ds AS VARCHAR), run FROM rollout_runs ORDER BY 1, 2").fetchall()
    for ds, run in runs:
        loc = storage.join(night_folder(output, "rollout_items", ds, run), "migrated.parquet")
        _export(
            con,
            "rollout_items",
            "rollout_runs WHERE ds = CAST($ds AS DATE) AND run = $run",
            {"ds": ds, "run": run},
            loc,
        )


def _export(con, table: str, rows: str, params: dict, loc: str) -> None:
    """The per-call `table`'s columns of `rows` (a FROM ... WHERE clause) into one file at
    `loc`, in the table's order: first held in a temporary table, then sorted a bucket at a
    time (wide_sort.py)."""
    schema = schemas()[table]
    columns = ", ".join(f'"{name}"' for name in schema.names)
    con.execute(f"CREATE OR REPLACE TEMP TABLE export_night AS SELECT {columns} FROM {rows}", params)  # noqa: S608
    _, tables = ordered(con, "temp.export_night", ORDER[table], None, SORT_ROWS)
    write_file(loc, schema, tables)
    con.execute("DROP TABLE temp.export_night")
