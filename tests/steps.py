"""The night's steps as the Airflow tasks run them, one call each, for tests that stop a
night between its steps: each opens the warehouse for its own step (build.py)."""

from __future__ import annotations

from nights import DS
from reassembler.build import load_step, publish_step, shard_step
from reassembler.merge.night_load import NightLoad
from reassembler.settings import DEFAULTS, Settings
from reassembler.warehouse import Warehouse


def load(inp, out, ds: str = DS, settings: Settings = DEFAULTS, run_id: str | None = None):
    with NightLoad(inp, ds, settings) as night:
        return load_step(night, Warehouse(out, settings.duckdb), run_id)


def shard(out, ds: str, k: int, run_id: str, settings: Settings = DEFAULTS):
    return shard_step(out, ds, k, run_id, settings)


def publish(inp, out, ds: str, run_id: str, settings: Settings = DEFAULTS):
    return publish_step(Warehouse(out, settings.duckdb), ds, run_id, inp, settings)


def back_to_version(con, version: int, tables=("ledger", "token_rows", "rejects")) -> None:
    """A current warehouse as a release of schema `version` (before 9) left it: its
    per-call `tables` rows in the file, no night_calls."""
    from reassembler.call_tables import TABLES
    from reassembler.formats.fields import LEDGER, ddl
    from reassembler.warehouse import run_statements, sql

    for table in TABLES:
        con.execute(f"DROP VIEW IF EXISTS {table}")
    run_statements(con, sql("night_tables", ledger_columns=ddl(LEDGER)).replace("CREATE TEMP TABLE", "CREATE TABLE"))
    for table in set(TABLES) - set(tables):
        con.execute(f"DROP TABLE {table}")
    con.execute("DROP TABLE night_calls")
    con.execute("DELETE FROM schema_version")
    con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [version])
