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


def columns_of(con, table: str) -> set[str]:
    query = "SELECT column_name FROM duckdb_columns() WHERE table_name = ?"
    return {name for (name,) in con.execute(query, [table]).fetchall()}


def back_to_version(con, version: int, tables=("ledger", "token_rows", "rejects")) -> None:
    """A current warehouse as a release of schema `version` left it: before 11, its rollout
    rows holding their items (rollout_items, of the current runs only); before 10, the
    night's rollouts and shard plan as tables of the current run's rows; before 9, also its
    per-call `tables` rows in the file and no night_calls."""
    from reassembler.call_tables import TABLES
    from reassembler.formats.fields import LEDGER, ROLLOUT_ITEMS, ddl
    from reassembler.warehouse import run_statements, sql

    tables_now = {name for (name,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "rollout_runs" in tables_now and "trace" not in columns_of(
        con, "rollout_runs"
    ):  # version 11: the items were beside it
        con.execute("DROP VIEW rollouts")
        con.execute(
            "CREATE TABLE items_old AS SELECT ds, rollout_id, generated_items, model_items, trace FROM rollout_items"
        )
        con.execute(
            "CREATE TABLE rollout_runs_old AS SELECT r.*, i.* EXCLUDE (ds, rollout_id) FROM rollout_runs r "
            "LEFT JOIN items_old i USING (ds, rollout_id)"
        )
        con.execute("DROP TABLE rollout_runs")
        con.execute("DROP TABLE items_old")
        con.execute("ALTER TABLE rollout_runs_old RENAME TO rollout_runs")
        con.execute(
            "CREATE VIEW rollouts AS SELECT r.* EXCLUDE (run) FROM rollout_runs r SEMI JOIN night_calls USING (ds, run)"
        )
    con.execute("DROP VIEW IF EXISTS rollout_items")
    if "rollout_runs" in tables_now and version < 10:  # not taken back before
        for view, table in (("rollouts", "rollout_runs"), ("shard_plan", "shard_plan_runs")):
            con.execute(f"CREATE TABLE {view}_old AS SELECT * FROM {view}")
            con.execute(f"DROP VIEW {view}")
            con.execute(f"DROP TABLE {table}")
            con.execute(f"ALTER TABLE {view}_old RENAME TO {view}")
        con.execute("ALTER TABLE loads DROP COLUMN run")
    con.execute("DELETE FROM schema_version")
    con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [version])
    if version >= 9:
        return
    for table in TABLES:
        con.execute(f"DROP VIEW IF EXISTS {table}")
    run_statements(
        con,
        sql("night_tables", ledger_columns=ddl(LEDGER), items_columns=ddl(ROLLOUT_ITEMS)).replace(
            "CREATE TEMP TABLE", "CREATE TABLE"
        ),
    )
    for table in set(TABLES) - set(tables):
        con.execute(f"DROP TABLE {table}")
    con.execute("DROP TABLE night_calls")
    con.execute("DELETE FROM schema_version")
    con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [version])
