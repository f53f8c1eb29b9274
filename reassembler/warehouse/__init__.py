"""The night's DuckDB warehouse: connections, the SQL files of `sql/`, the schema version
and its forward migrations, and the retention of the per-call tables.

The SQL files live in the repository's top-level `sql/` folder (the one source); a wheel
ships them as the package data `reassembler.sql` (pyproject.toml), so an installed package
finds them wherever it runs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from .. import call_tables, storage
from ..errors import InputError, OutputBusy, StoreError
from ..formats.fields import ROLLOUT_ROW, ddl
from ..settings import DuckDBSettings
from . import copies

SCHEMA_VERSION = 12  # sql/schema.sql is at this version; sql/migrations/NNN_*.sql lead up to it


def _sql_dir() -> Path:
    """The repository's sql/ in a checkout (and an editable install), else the package data."""
    if os.environ.get("REASSEMBLER_SQL_DIR"):
        return Path(os.environ["REASSEMBLER_SQL_DIR"])
    checkout = Path(__file__).resolve().parents[2] / "sql"
    if (checkout / "schema.sql").exists():
        return checkout
    return Path(__file__).resolve().parents[1] / "sql"  # installed: the wheel's reassembler/sql/


SQL_DIR = _sql_dir()
log = logging.getLogger(__name__)
WAREHOUSE_FILE = "warehouse.duckdb"


def _spill_root(output_dir, settings: DuckDBSettings) -> Path:
    """Spill folders stay on local disk: under a local output, else in the system's temp folder."""
    if settings.temp_directory:
        return Path(settings.temp_directory)
    if storage.is_remote(output_dir):
        return Path(tempfile.gettempdir()) / "reassembler" / "duckdb"
    return Path(storage.location(output_dir)) / "_tmp" / "duckdb"


def warehouse_path(output, explicit=None) -> Path:
    """The warehouse file: `explicit` (--warehouse, REASSEMBLER_WAREHOUSE), else
    <output>/warehouse.duckdb for a local output. An output on object storage needs it
    given: DuckDB writes its file on local disk."""
    explicit = explicit or os.environ.get("REASSEMBLER_WAREHOUSE") or None
    if explicit:
        if storage.is_remote(str(explicit)):
            raise InputError(f"--warehouse {explicit}: the warehouse is a local file; give a local path")
        return Path(explicit).expanduser().absolute()
    if storage.is_remote(output):
        raise InputError(
            f"--output {output} is on object storage: give the warehouse file's local path with --warehouse "
            "(or REASSEMBLER_WAREHOUSE)"
        )
    return Path(storage.location(output)) / WAREHOUSE_FILE


SPILL_MARK = ".reassembler-spill"  # written into every spill folder this job creates


def _spill_name(pid: int) -> str:
    return f"pid-{pid}@{socket.gethostname()}"


def _spill_folder(root: Path) -> Path:
    """This process's spill folder under `root`, created with the mark that proves it ours."""
    folder = root / _spill_name(os.getpid())
    folder.mkdir(parents=True, exist_ok=True)
    mark = folder / SPILL_MARK
    if not mark.exists():
        mark.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    return folder


def _scratch_root(settings: DuckDBSettings) -> Path:
    """Where the in-memory DuckDBs of the steps spill (scratch_config), and a one-process
    build's local shard plans go (build.py): under the process's own folder."""
    return Path(settings.temp_directory or Path(tempfile.gettempdir()) / "reassembler" / "duckdb")


def _reader_root(settings: DuckDBSettings) -> Path:
    """Where a read-only warehouse connection spills (connect)."""
    return Path(settings.temp_directory or Path(tempfile.gettempdir()) / "reassembler-duckdb")


def clear_dead_spill_folders(output_dir: str | Path, settings: DuckDBSettings) -> None:
    """Remove the spill folders of processes of this host that no longer run (the output's,
    the steps' scratch and the readers', each with what a killed process left in it: its
    spill, a one-process build's local shard plans). Only folders
    this job made are touched: named pid-<n>@<this host> and holding the mark naming that
    pid and host (a spill folder may be shared with other tools). Shards of other runs may
    be spilling right now: their folders stay."""
    host = socket.gethostname()
    roots = {_spill_root(output_dir, settings), _scratch_root(settings), _reader_root(settings)}
    for folder in (f for root in sorted(roots) for f in root.glob("pid-*@*")):
        pid, _, on = folder.name[4:].partition("@")
        if on != host or not pid.isdigit() or folder.is_symlink() or not folder.is_dir():
            continue
        try:
            mark = json.loads((folder / SPILL_MARK).read_text())
        except (OSError, ValueError):
            continue  # not provably ours
        if not isinstance(mark, dict) or mark.get("pid") != int(pid) or mark.get("host") != host:
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            continue  # alive, another user's


def sql(name: str, **fragments: str) -> str:
    """The text of sql/<name>.sql, with {placeholders} filled from `fragments`."""
    text = (SQL_DIR / f"{name}.sql").read_text()
    return text.format(**fragments) if fragments else text


def run_script(con, name: str, params: dict | None = None, **fragments: str) -> None:
    """Run every statement of sql/<name>.sql (statements end with ';' at the end of a line)."""
    run_statements(con, sql(name, **fragments), params)


def run_statements(con, text: str, params: dict | None = None) -> None:
    """Run every statement of a SQL script's `text`, each given the `params` it names."""
    for statement in re.split(r";[ \t]*(?:\n|$)", text):
        body = "\n".join(line for line in statement.splitlines() if not line.strip().startswith("--"))
        if body.strip():
            used = {k: v for k, v in (params or {}).items() if re.search(rf"\${k}\b", body)}
            con.execute(body, used)


def scratch_config(settings: DuckDBSettings) -> dict:
    """The configuration of a DuckDB that is not the warehouse (a load part's, in memory):
    the same bounds, its spill folder this process's in the system temp folder (or
    `settings.temp_directory`)."""
    root = _scratch_root(settings)
    return {
        "memory_limit": settings.memory_limit,
        "threads": settings.threads,
        "temp_directory": str(_spill_folder(root)),
        "preserve_insertion_order": False,
    }


def connect(
    output_dir,
    settings: DuckDBSettings = DuckDBSettings(),
    read_only: bool = False,
    database: str | Path | None = None,
) -> duckdb.DuckDBPyConnection:
    """Open the warehouse. Writers create the schema; readers (`read_only`) never write to the
    output folder (their spill folder is in the system temp folder). Another process holding
    the file is waited for up to `settings.lock_wait_seconds`, then OutputBusy names it."""
    path = warehouse_path(output_dir, database)
    copies.restore_missing(output_dir, path)  # a worker's first open: the store's copy, if any
    if read_only:
        if not path.exists():
            raise InputError(f"{path}: no warehouse here; run `reassembler build` first")
        temp = _spill_folder(_reader_root(settings))
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one spill folder per process: shards run at once, each with its own DuckDB instance
        temp = _spill_folder(_spill_root(output_dir, settings))
    config: dict = {
        "memory_limit": settings.memory_limit,
        "threads": settings.threads,
        "temp_directory": str(temp),
        "preserve_insertion_order": False,
    }
    deadline = time.monotonic() + settings.lock_wait_seconds
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only, config=config)
            break
        except duckdb.IOException as e:
            if "Could not set lock" not in str(e):
                raise
            if time.monotonic() >= deadline:
                holder = str(e).split("Conflicting lock is held in", 1)[-1].split(". See", 1)[0].strip()
                raise OutputBusy(
                    f"{path}: locked by another DuckDB client ({holder}) for more than "
                    f"{settings.lock_wait_seconds:g}s; close it, or query the Parquet "
                    "partitions and <output>/tables/ instead (README: querying without "
                    "blocking the job)"
                ) from None
            time.sleep(0.5)
    newer = copies.newer_copy(con, output_dir)
    if newer is not None:  # an older night's file: the store's copy replaces it
        local = copies.generation(con)
        con.close()
        copies.replace_stale(output_dir, path, newer, local)
        return connect(output_dir, settings, read_only, database)
    try:
        if read_only:
            check_version(con, path)
        else:
            migrate(con, path, output_dir)
        if storage.is_remote(call_tables.root(output_dir)):
            call_tables.define_views(con, output_dir, temporary=True)
    except BaseException:
        con.close()
        raise
    return con


def schema_version(con) -> int:
    """0 for an empty database; 1 for a warehouse of the release before versions were kept."""
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    if "schema_version" in tables:
        return con.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
    return 1 if "rollouts" in tables else 0


def _newer(current: int, path) -> InputError:
    return InputError(
        f"{path}: the warehouse is at schema version {current}, newer than this release "
        f"({SCHEMA_VERSION}); use the release that wrote it"
    )


def check_version(con, path) -> None:
    """A reader's check: the warehouse is at this release's schema version (a build
    migrates an older one; nothing reads a newer one)."""
    current = schema_version(con)
    if current > SCHEMA_VERSION:
        raise _newer(current, path)
    if current == 0:
        raise InputError(f"{path}: not a warehouse (no tables); run `reassembler build` first")
    if current < SCHEMA_VERSION:
        raise InputError(
            f"{path}: the warehouse is at schema version {current}, older than this release "
            f"({SCHEMA_VERSION}); the next `reassembler build` (or DAG run) brings it forward"
        )


def migrate(con, path=WAREHOUSE_FILE, output=None) -> None:
    """Bring the warehouse to SCHEMA_VERSION: create it, or apply the migrations it lacks;
    then define the per-call views of a local `output` (call_tables.py)."""
    current = schema_version(con)
    if current > SCHEMA_VERSION:
        raise _newer(current, path)
    if current < SCHEMA_VERSION:
        for step in range(current + 1 if current else SCHEMA_VERSION + 1, SCHEMA_VERSION + 1):
            [migration] = sorted((SQL_DIR / "migrations").glob(f"{step:03d}_*.sql"))
            if step == 9 and output is not None:
                call_tables.export_tables(con, output)  # the rows before the tables go
            if step == 11 and output is not None:
                call_tables.export_items(con, output)  # the columns before they go
            run_script(con, f"migrations/{migration.stem}")
        run_script(con, "schema", rollouts_columns=ddl(ROLLOUT_ROW))  # at the current version
        con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [SCHEMA_VERSION])
    if output is not None:
        call_tables.ensure_schema_files(output)
        if not storage.is_remote(call_tables.root(output)):
            call_tables.define_views(con, output, temporary=False)


# A night loaded and not yet published keeps its per-call rows this long (a build in flight,
# or a failed one that may be retried), whatever the retention window.
LOAD_HOLD_DAYS = 7


def apply_retention(con, ds: str, nights: int) -> list[str]:
    """Keep the per-night tables of the newest `nights` nights, of `ds` (the night just
    loaded, however old) and of the nights loaded and not yet published (sql/retention.sql);
    audit, runs and rejects are kept for good. Returns the nights whose per-call files
    (ledger, token_rows) go: `drop_call_files` deletes them once the caller commits."""
    run_script(con, "retention", {"ds": ds, "nights": nights, "hold_days": LOAD_HOLD_DAYS})
    kept = {str(d) for (d,) in con.execute("SELECT ds FROM kept_nights").fetchall()}
    con.execute("DROP TABLE kept_nights")
    return sorted(kept)


def drop_call_files(output, kept: list[str]) -> None:
    """Delete the ledger, token_rows and rollout_items folders of every night not in `kept`
    (files, not rows: call_tables.py); best effort, a folder left is deleted by the next load."""
    for table in call_tables.PER_CALL:
        for night in call_tables.nights_on_disk(output, table):
            if night not in kept:
                try:
                    storage.delete_tree(storage.join(call_tables.root(output), table, f"ds={night}"))
                except (StoreError, OSError) as e:  # noqa: PERF203 - a night at a time, rare
                    log.info("the %s files of ds=%s stay for now: %s", table, night, e)


REST_MEMORY = "8MB"  # a held connection's memory_limit while it waits (Warehouse.resting)


class Warehouse:
    """The warehouse of one output folder, as a night's steps use it: each step takes its
    connection from here, `writing()` to change it, `reading()` to query it. Outside
    `held()` every step opens the file and closes it again (an Airflow task: DuckDB lets one
    process write the file, and readers in other processes only when no process writes it).
    Inside `held()`, a one-process build's steps share one read-write connection, opened
    once (readers get cursors of it): the file is opened and closed once for the night."""

    def __init__(self, output_dir, settings: DuckDBSettings = DuckDBSettings(), path=None):
        self.output_dir, self.settings = storage.location(output_dir), settings
        self.path = warehouse_path(self.output_dir, path)
        self._held: duckdb.DuckDBPyConnection | None = None

    def is_held(self) -> bool:
        """Whether a one-process build holds the file open for all its steps (`held`)."""
        return self._held is not None

    def must_exist(self) -> None:
        """InputError unless the warehouse is there (restored from the output store if need
        be): for a step that writes into an existing warehouse only (the gate), which must not
        create an empty one, and its per-call folders, in an output nothing was built into."""
        copies.restore_missing(self.output_dir, self.path)
        if not self.path.exists():
            raise InputError(f"{self.path}: no warehouse here; run `reassembler build` first")

    def save_copy(self, con, ds: str | None, run_id: str | None) -> dict:
        """Copy the file into the output store (copies.py), from the writer's connection `con`
        under the output lock: after each step that commits a night's state (load, publish,
        the gate's verdict). Returns the copy's pointer."""
        pointer = copies.save(con, self.path, self.output_dir, ds, run_id, SCHEMA_VERSION)
        log.info("warehouse copied to %s (generation %d)", pointer["file"], pointer["generation"])
        return pointer

    @contextmanager
    def held(self) -> Iterator[Warehouse]:
        with connect(self.output_dir, self.settings, database=self.path) as con:
            self._held = con
            try:
                yield self
            finally:
                self._held = None

    @contextmanager
    def resting(self) -> Iterator[None]:
        """While the held connection waits for other work of this process (a one-process
        build's shards), DuckDB may keep only REST_MEMORY: it otherwise keeps the blocks
        the load read cached up to its memory_limit, beside the shards' own memory (~95 MB
        of a 160,000-rollout build's peak). Its memory_limit comes back after."""
        if self._held is None:
            yield
            return
        self._held.execute(f"SET memory_limit = '{REST_MEMORY}'")
        try:
            yield
        finally:
            self._held.execute(f"SET memory_limit = '{self.settings.memory_limit}'")

    @contextmanager
    def writing(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._held is not None:
            yield self._held
            return
        with connect(self.output_dir, self.settings, database=self.path) as con:
            yield con

    @contextmanager
    def reading(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._held is not None:
            with call_tables.cursor(self._held) as cursor:
                yield cursor
            return
        with connect(self.output_dir, self.settings, read_only=True, database=self.path) as con:
            yield con
