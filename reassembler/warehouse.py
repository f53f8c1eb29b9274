"""The night's DuckDB warehouse: connection settings and the SQL files of `sql/`."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb

SQL_DIR = Path(os.environ.get("REASSEMBLER_SQL_DIR", Path(__file__).resolve().parent.parent / "sql"))
WAREHOUSE_FILE = "warehouse.duckdb"


@dataclass(frozen=True)
class DuckDBSettings:
    """Resource limits for every DuckDB connection the job opens (set explicitly, always)."""

    memory_limit: str = "128MB"
    threads: int = 2
    temp_directory: str | None = None  # default: <output>/_tmp/duckdb (a pid-<n> folder per process)


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
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = Path(database) if database is not None else output_dir / WAREHOUSE_FILE
    # one spill folder per process: shards run at once, each with its own DuckDB instance
    temp = Path(settings.temp_directory or output_dir / "_tmp" / "duckdb") / f"pid-{os.getpid()}"
    temp.mkdir(parents=True, exist_ok=True)
    if read_only and not path.exists():
        raise FileNotFoundError(f"{path}: no warehouse here; run `reassembler build` first")
    con = duckdb.connect(str(path), read_only=read_only, config={
        "memory_limit": settings.memory_limit,
        "threads": settings.threads,
        "temp_directory": str(temp),
        "preserve_insertion_order": False,
    })
    if not read_only:
        run_script(con, "schema")
    return con
