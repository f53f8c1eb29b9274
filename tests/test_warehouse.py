"""The warehouse lasts: a warehouse written by the previous release opens and upgrades, and
the per-call tables keep only the newest nights."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from nights import DS, Night, worked_example
from reassembler.build import build_night
from reassembler.settings import Settings
from reassembler.warehouse import SCHEMA_VERSION, BackgroundCheckpoint, connect, schema_version

V1_SCHEMA = Path(__file__).parent / "data" / "warehouse_v1_schema.sql"  # sql/schema.sql of release 1


def test_a_warehouse_of_the_previous_release_opens_and_upgrades(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with duckdb.connect(str(out / "warehouse.duckdb")) as con:
        con.execute(V1_SCHEMA.read_text())
        con.execute(
            "INSERT INTO audit (ds, rollout_id, status, run_id, n_roots) "
            "VALUES ('2026-10-01', 'old_g0', 'ok', 'run-v1', 1)"
        )
        con.execute("INSERT INTO runs (run_id, ds, n_rollouts) VALUES ('run-v1', '2026-10-01', 1)")
    with connect(out, read_only=True) as con:
        assert schema_version(con) == 1
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    build_night(n.write(), out, DS)  # loads into the upgraded warehouse (new columns and tables)
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        assert con.execute("SELECT rollout_id FROM audit ORDER BY ds").fetchall() == [("old_g0",), ("a_g0",)]
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
        columns = {
            c for (c,) in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = 'ledger'").fetchall()
        }
        assert {"output_fingerprint", "fingerprint_version"} <= columns
    with connect(out) as con:  # opening again applies nothing twice
        assert con.execute("SELECT count(*) FROM schema_version").fetchone()[0] == 1


def test_a_warehouse_of_release_2_gets_the_token_rows_table(tmp_path):
    """Version 2 kept no token rows (the shards read the token files' keys); the migration
    adds the table, and a night loaded after it fills it."""
    out = tmp_path / "out"
    with connect(out) as con:  # a current warehouse taken back to version 2
        con.execute("DROP TABLE token_rows")
        con.execute("DELETE FROM schema_version")
        con.execute("INSERT INTO schema_version VALUES (2, now()::TIMESTAMP)")
    with connect(out, read_only=True) as con:
        assert schema_version(con) == 2
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    summary = build_night(n.write(), out, DS)
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION == 3
        assert con.execute("SELECT count(*) FROM token_rows").fetchone()[0] == summary.load.tokens.read > 0
    assert summary.numbers.ok_rollouts == 1


def test_a_warehouse_newer_than_this_release_is_refused(tmp_path):
    import pytest

    from reassembler.errors import InputError

    with connect(tmp_path) as con:
        con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [SCHEMA_VERSION + 1])
    with pytest.raises(InputError, match="newer than this release"):
        connect(tmp_path)


def test_retention_keeps_the_per_call_tables_of_the_newest_nights_only(tmp_path):
    out = tmp_path / "out"
    nights = ["2026-11-25", "2026-11-26", "2026-11-27"]
    for ds in nights:
        n = Night(tmp_path / ds, ds=ds)
        worked_example(n, "a_g0")
        build_night(n.write(), out, ds, Settings(retention_nights=2))
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        per_call = {str(d) for (d,) in con.execute("SELECT DISTINCT ds FROM ledger").fetchall()}
        token_nights = {str(d) for (d,) in con.execute("SELECT DISTINCT ds FROM token_rows").fetchall()}
        assert token_nights == per_call
        kept = {str(d) for (d,) in con.execute("SELECT DISTINCT ds FROM audit").fetchall()}
        assert per_call == set(nights[1:]) and kept == set(nights)  # audit and runs are kept for good
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3


def _wal(out: Path) -> int:
    wal = out / "warehouse.duckdb.wal"
    return wal.stat().st_size if wal.exists() else 0


def test_the_checkpoint_after_the_load_runs_beside_reads(tmp_path):
    """A one-process build checkpoints the loaded night on a thread while its shards read it
    through other cursors of the same connection (BackgroundCheckpoint)."""
    out = tmp_path / "out"
    with connect(out) as con:
        con.execute("CREATE TABLE t AS SELECT range AS i FROM range(10)")
        con.execute("CHECKPOINT")
        con.execute("INSERT INTO t SELECT range + 10 FROM range(100000)")  # lands in the WAL
        assert _wal(out) > 0
        reader = con.cursor().sql("SELECT i FROM t ORDER BY i").to_arrow_reader(1000)
        first = reader.read_next_batch()  # a read in progress
        flush = BackgroundCheckpoint(con)
        rest = sum(batch.num_rows for batch in reader)
        flush.join()
        assert first.num_rows + rest == 100010
        assert _wal(out) == 0  # written into the database file
    with connect(out, read_only=True) as con:
        assert con.execute("SELECT count(*), sum(i) FROM t").fetchone() == (100010, sum(range(100010)))


def test_a_checkpoint_that_fails_fails_when_joined():
    """As closing the connection did when it checkpointed: the error reaches the build."""

    class Cursor:
        def execute(self, statement):
            assert statement == "CHECKPOINT"
            raise duckdb.IOException("No space left on device")

        def close(self):
            pass

    class Connection:
        def cursor(self):
            return Cursor()

    flush = BackgroundCheckpoint(Connection())
    with pytest.raises(duckdb.IOException, match="No space left on device"):
        flush.join()
