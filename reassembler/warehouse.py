"""The night's DuckDB warehouse: connection settings and the SQL files of `sql/`."""
from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from .errors import InputError, OutputBusy

SQL_DIR = Path(os.environ.get("REASSEMBLER_SQL_DIR", Path(__file__).resolve().parent.parent / "sql"))
WAREHOUSE_FILE = "warehouse.duckdb"


MEMORY_LIMIT = re.compile(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)


@dataclass(frozen=True)
class DuckDBSettings:
    """Resource limits for every DuckDB connection the job opens (set explicitly, always)."""

    memory_limit: str = "128MB"
    threads: int = 2
    temp_directory: str | None = None  # default: <output>/_tmp/duckdb (a folder per process)
    lock_wait_seconds: float = 60.0  # how long to wait for another client of the warehouse file

    def __post_init__(self):
        if not MEMORY_LIMIT.fullmatch(str(self.memory_limit).strip()):
            raise InputError(f"memory limit {self.memory_limit!r} is not a size such as 128MB or 2GB")
        if self.temp_directory and Path(self.temp_directory).exists() and not Path(self.temp_directory).is_dir():
            raise InputError(f"temp directory {self.temp_directory}: is a file, not a folder")


def _spill_root(output_dir: Path, settings: DuckDBSettings) -> Path:
    return Path(settings.temp_directory or output_dir / "_tmp" / "duckdb")


def _spill_name(pid: int) -> str:
    return f"pid-{pid}@{socket.gethostname()}"


def clear_dead_spill_folders(output_dir: str | Path, settings: DuckDBSettings) -> None:
    """Remove the spill folders of processes of this host that no longer run (shards of other
    runs may be spilling right now: their folders stay)."""
    host = socket.gethostname()
    for folder in _spill_root(Path(output_dir), settings).glob("pid-*"):
        pid, _, on = folder.name[4:].partition("@")
        if on not in (host, "") or not pid.isdigit():
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
    text = sql(name, **fragments)
    for statement in re.split(r";[ \t]*(?:\n|$)", text):
        body = "\n".join(line for line in statement.splitlines() if not line.strip().startswith("--"))
        if body.strip():
            used = {k: v for k, v in (params or {}).items() if f"${k}" in body}
            con.execute(body, used)


def connect(output_dir: str | Path, settings: DuckDBSettings = DuckDBSettings(), read_only: bool = False,
            database: str | Path | None = None) -> duckdb.DuckDBPyConnection:
    """Open the warehouse. Writers create the schema; readers (`read_only`) never write to the
    output folder (their spill folder is in the system temp folder). Another process holding
    the file is waited for up to `settings.lock_wait_seconds`, then OutputBusy names it."""
    output_dir = Path(output_dir)
    path = Path(database) if database is not None else output_dir / WAREHOUSE_FILE
    if read_only:
        if not path.exists():
            raise InputError(f"{path}: no warehouse here; run `reassembler build` first")
        temp = Path(settings.temp_directory or Path(tempfile.gettempdir()) / "reassembler-duckdb") / _spill_name(os.getpid())
        temp.parent.mkdir(parents=True, exist_ok=True)
    else:
        output_dir.mkdir(parents=True, exist_ok=True)
        # one spill folder per process: shards run at once, each with its own DuckDB instance
        temp = _spill_root(output_dir, settings) / _spill_name(os.getpid())
        temp.mkdir(parents=True, exist_ok=True)
    config = {"memory_limit": settings.memory_limit, "threads": settings.threads,
              "temp_directory": str(temp), "preserve_insertion_order": False}
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
                raise OutputBusy(f"{path}: locked by another DuckDB client ({holder}) for more than "
                                 f"{settings.lock_wait_seconds:g}s; close it, or query the Parquet "
                                 "partitions and <output>/tables/ instead (README: querying without "
                                 "blocking the job)") from None
            time.sleep(0.5)
    if not read_only:
        run_script(con, "schema")
    return con
