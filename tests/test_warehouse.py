"""The warehouse lasts: a warehouse written by the previous release opens and upgrades, and
the per-call tables keep only the newest nights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from nights import DS, Night, worked_example
from reassembler.build import build_night
from reassembler.settings import Settings
from reassembler.warehouse import SCHEMA_VERSION, connect, schema_version
from steps import back_to_version, columns_of

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
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
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
        back_to_version(con, 2, ("ledger", "rejects"))
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert schema_version(con) == 2
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    summary = build_night(n.write(), out, DS)
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION == 12
        assert con.execute("SELECT count(*) FROM token_rows").fetchone()[0] == summary.load.tokens.read > 0
    assert summary.numbers.ok_rollouts == 1


def test_a_warehouse_of_release_7_gets_where_rows_came_from_and_its_old_nights_stay_readable(tmp_path):
    """Contract 5.3 (version 5): migration 008 adds rollouts' evidence, env, agent, temperature
    and the audit's capture and evidence; a night published before keeps them null and is
    still reported, a night built after fills them."""
    from reassembler.audit.quality import night_quality

    out = tmp_path / "out"
    old = Night(tmp_path / "old", ds="2026-11-27")
    worked_example(old, "a_g0")
    build_night(old.write(), out, "2026-11-27")
    with connect(out) as con:  # taken back to version 7, as a release before contract 5 left it
        back_to_version(con, 9)  # rollouts a table again
        for table, columns in (
            ("rollouts", ("evidence", "env", "agent", "temperature")),
            ("audit", ("capture", "evidence")),
        ):
            for column in columns:
                con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        back_to_version(con, 7)
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0", metadata={"env": "swe", "agent": "solver"})
    build_night(n.write(), out, DS)
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        audit = dict(con.execute("SELECT CAST(ds AS VARCHAR), capture FROM audit").fetchall())
        env = dict(con.execute("SELECT CAST(ds AS VARCHAR), env FROM rollouts").fetchall())
        assert night_quality(con, "2026-11-27")["night"]["rollouts"] == 1
    assert audit == {"2026-11-27": None, DS: "staged"} and env == {"2026-11-27": None, DS: "swe"}


def test_a_warehouse_of_release_10_moves_its_rollouts_items_to_parquet_and_its_nights_stay_readable(tmp_path, capsys):
    """Version 11: a rollout's fields that grow with its calls (generated_items, model_items,
    trace) leave the rollout rows for the per-call table rollout_items. The migration writes
    a version-10 warehouse's items out per night and run, drops the columns, and explain
    still shows an old night's items."""
    from reassembler.call_tables import root
    from reassembler.cli import main

    out = tmp_path / "out"
    old = Night(tmp_path / "old", ds="2026-11-27")
    worked_example(old, "a_g0")
    build_night(old.write(), out, "2026-11-27")
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        items = sorted(con.execute("SELECT * FROM rollout_items").fetchall())
    assert len(items) == 1 and items[0][2], "the worked example's rollout has generated items"
    with connect(out) as con:  # taken back to version 10: the items in the rollout rows
        back_to_version(con, 10)
        columns = columns_of(con, "rollout_runs")
        assert {"generated_items", "model_items", "trace"} <= columns
    import shutil

    shutil.rmtree(Path(root(out)) / "rollout_items")  # release 10 wrote no Parquet of them
    assert main(["explain", "--output", str(out), "--ds", "2026-11-27", "a_g0"]) == 2  # refused: old version
    capsys.readouterr()
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    build_night(n.write(), out, DS)  # migrates, then loads another night
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION == 12
        columns = columns_of(con, "rollout_runs")
        after = sorted(con.execute("SELECT * FROM rollout_items WHERE ds = '2026-11-27'").fetchall())
        assert con.execute(f"SELECT count(*) FROM rollout_items WHERE ds = '{DS}'").fetchone()[0] == 1
    assert not columns & {"generated_items", "model_items", "trace"} and after == items
    assert main(["explain", "--output", str(out), "--ds", "2026-11-27", "a_g0"]) == 0
    said = capsys.readouterr().out
    assert f"output: {len(items[0][2])} generated items" in said


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
        item_nights = {str(d) for (d,) in con.execute("SELECT DISTINCT ds FROM rollout_items").fetchall()}
        assert token_nights == item_nights == per_call
        kept = {str(d) for (d,) in con.execute("SELECT DISTINCT ds FROM audit").fetchall()}
        assert per_call == set(nights[1:]) and kept == set(nights)  # audit and runs are kept for good
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
    from reassembler.call_tables import nights_on_disk

    assert nights_on_disk(out, "rollout_items") == nights[1:]  # the files go, not only the view's rows
    from reassembler.call_tables import PER_CALL, SCHEMA_DS, SCHEMA_RUN, night_folder

    for table in PER_CALL:  # each table's zero-row schema file is no night: retention leaves it
        assert Path(night_folder(str(out), table, SCHEMA_DS, SCHEMA_RUN), "schema.parquet").is_file(), table


def _wal(out: Path) -> int:
    wal = out / "warehouse.duckdb.wal"
    return wal.stat().st_size if wal.exists() else 0


def test_the_load_step_writes_the_night_into_the_file(tmp_path):
    """The loaded night is checkpointed before the shards read it: the WAL is empty, and a
    reader in another process sees the night."""
    from steps import load

    out = tmp_path / "out"
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    with connect(out) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS i")  # an earlier write, in the WAL of a closed file
    load(n.write(), out, DS)
    assert _wal(out) == 0
    with connect(out, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM rollouts WHERE ds = ?", [DS]).fetchone() == (1,)


def _published(out: Path, ds: str) -> tuple[int, int]:
    import pyarrow.parquet as pq

    return (
        pq.read_table(out / "rows" / f"ds={ds}").num_rows,
        pq.read_table(out / "audit" / f"ds={ds}").num_rows,
    )


def _per_call_nights(out: Path) -> set[str]:
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        return {str(d) for (d,) in con.execute("SELECT DISTINCT ds FROM rollouts").fetchall()}


def test_a_backfill_older_than_the_retention_window_publishes_its_night(tmp_path):
    """Three nights with retention 2, then the night before them: it is built from its own
    rows (not emptied by the retention that follows its load), and the window then applies
    from the newest night on."""
    out = tmp_path / "out"
    inputs = {}
    for ds in ("2026-11-24", "2026-11-25", "2026-11-26", "2026-11-27"):
        n = Night(tmp_path / ds, ds=ds)
        worked_example(n, "a_g0", compaction=True)
        worked_example(n, "b_g0")
        inputs[ds] = n.write()
    for ds in ("2026-11-25", "2026-11-26", "2026-11-27"):
        build_night(inputs[ds], out, ds, Settings(retention_nights=2))
    assert _per_call_nights(out) == {"2026-11-26", "2026-11-27"}
    summary = build_night(inputs["2026-11-24"], out, "2026-11-24", Settings(retention_nights=2))
    alone = build_night(inputs["2026-11-24"], tmp_path / "alone", "2026-11-24")  # the same night, by itself
    assert summary.numbers == alone.numbers and alone.numbers.ok_rollouts == 2
    assert _published(out, "2026-11-24") == _published(tmp_path / "alone", "2026-11-24") == (4, 2)
    assert _per_call_nights(out) == {"2026-11-24", "2026-11-26", "2026-11-27"}  # the one just built stays
    build_night(inputs["2026-11-27"], out, "2026-11-27", Settings(retention_nights=2))  # the next night
    assert _per_call_nights(out) == {"2026-11-26", "2026-11-27"}
    assert _published(out, "2026-11-24") == (4, 2)  # published rows are never touched by retention


def test_a_night_loaded_and_not_published_is_held_against_retention(tmp_path):
    """The DAG loads a night, then other nights load before its shards and publish run: the
    retention of those loads keeps the held night's per-call rows."""
    from steps import load, publish, shard

    out = tmp_path / "out"
    inputs = {}
    for ds in ("2026-11-20", "2026-11-26", "2026-11-27"):
        n = Night(tmp_path / ds, ds=ds)
        worked_example(n, "a_g0")
        inputs[ds] = n.write()
    settings = Settings(retention_nights=1)
    load(inputs["2026-11-20"], out, "2026-11-20", settings, run_id="backfill")
    for ds in ("2026-11-26", "2026-11-27"):
        build_night(inputs[ds], out, ds, settings)
    assert _per_call_nights(out) == {"2026-11-20", "2026-11-27"}
    shard(out, "2026-11-20", 0, "backfill", settings)
    numbers = publish(inputs["2026-11-20"], out, "2026-11-20", "backfill", settings)
    assert (numbers.audit_rows, numbers.ok_rollouts) == (1, 1) and _published(out, "2026-11-20") == (2, 1)
    build_night(inputs["2026-11-27"], out, "2026-11-27", settings)  # published: no longer held
    assert _per_call_nights(out) == {"2026-11-27"}


def test_publish_refuses_a_night_whose_rollouts_left_the_warehouse_after_the_load(tmp_path):
    """Whatever removed them (a retention of another release, a hand-made DELETE), a staged
    night built from fewer rollouts than the load read is not published."""
    from reassembler.errors import AuditCheckFailed
    from steps import load, publish, shard

    out = tmp_path / "out"
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    worked_example(n, "b_g0")
    inp = n.write()
    build_night(inp, out, DS)
    before = _published(out, DS)
    load(inp, out, DS, run_id="r2")
    with connect(out) as con:
        con.execute("DELETE FROM rollout_runs WHERE ds = ? AND run = 'r2'", [DS])
    shard(out, DS, 0, "r2")  # builds what the load planned (its plan, not the warehouse)
    with pytest.raises(AuditCheckFailed, match=r"the load read 2 rollouts but the warehouse holds 0") as e:
        publish(inp, out, DS, "r2")
    assert "rollouts in 0 != audit rows 2" in str(e.value)
    assert _published(out, DS) == before == (4, 2)


def test_publish_refuses_a_night_another_run_loaded_again(tmp_path):
    from reassembler.errors import AuditCheckFailed, InputError
    from steps import load, publish, shard

    out = tmp_path / "out"
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    inp = n.write()
    load(inp, out, DS, run_id="first")
    shard(out, DS, 0, "first")
    load(inp, out, DS, run_id="second")  # while the first run waits to publish
    with pytest.raises(AuditCheckFailed, match="run second loaded it again after run first did"):
        publish(inp, out, DS, "first")
    load(inp, out, DS, run_id="third")  # and a shard of a run loaded over waits in vain
    with pytest.raises(InputError, match="this run's plan is gone: the night was loaded again by another run"):
        shard(out, DS, 0, "second")
    load(inp, out, DS, run_id="second")
    shard(out, DS, 0, "second")
    assert publish(inp, out, DS, "second").ok_rollouts == 1


def _seen(out: Path) -> dict[str, list]:
    """What a reader of the warehouse sees: every view's rows."""
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        return {
            t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
            for t in ("rollouts", "shard_plan", "ledger", "token_rows", "rejects")
        }


def _runs_of(out: Path) -> dict[str, set[str]]:
    """The runs whose rows (rollout_runs) and per-call folders the warehouse keeps."""
    from reassembler.call_tables import root

    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        rows = {r for (r,) in con.execute("SELECT DISTINCT run FROM rollout_runs").fetchall()}
    folders = {p.name.removeprefix("run=") for p in Path(root(out)).glob(f"*/ds={DS}/run=*")}
    return {"rows": rows, "files": folders}


def test_a_rebuild_changes_what_readers_see_only_when_it_publishes(tmp_path, capsys):
    """A rebuild of a published night that loads and then never publishes (a shard or the
    publish failed, the worker died) changes nothing a reader or the report sees: the views
    and `reassembler report` still show the published run, one reject row included. A
    second rebuild replaces the first's rows and files, never the published run's; the run
    that publishes becomes what readers see, and the replaced run's rows and files go."""
    from reassembler.cli import main
    from steps import load, publish, shard

    out = tmp_path / "out"
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    worked_example(n, "b_g0")
    inp = n.write()
    with open(inp / "ledger" / f"ds={DS}" / "ledger.jsonl", "a") as fh:
        fh.write("{not json\n")
    first = build_night(inp, out, DS, run_id="r1")
    assert first.load.n_rejects == 1
    before = _seen(out)
    assert len(before["rollouts"]) == 2 and len(before["rejects"]) == 1 and before["ledger"]
    assert main(["report", "--output", str(out), "--ds", DS]) == 0
    report = capsys.readouterr().out
    assert "rejects" in report

    other = Night(tmp_path / "other")
    worked_example(other, "c_g0")
    rebuilt = other.write()
    load(rebuilt, out, DS, run_id="r2")
    shard(out, DS, 0, "r2")  # ... and it never publishes
    assert _seen(out) == before
    assert main(["report", "--output", str(out), "--ds", DS]) == 0
    assert capsys.readouterr().out == report
    assert _runs_of(out) == {"rows": {"r1", "r2"}, "files": {"r1", "r2"}}

    load(rebuilt, out, DS, run_id="r3")  # another rebuild: the one before it goes, the published run stays
    assert _seen(out) == before
    assert _runs_of(out) == {"rows": {"r1", "r3"}, "files": {"r1", "r3"}}
    shard(out, DS, 0, "r3")
    assert publish(rebuilt, out, DS, "r3").ok_rollouts == 1
    after = _seen(out)
    assert len(after["rollouts"]) == 1 and "c_g0" in after["rollouts"][0]
    assert after["rejects"] == [] and all("c_g0" in row for row in after["ledger"])
    assert _runs_of(out) == {"rows": {"r3"}, "files": {"r3"}}
    assert main(["report", "--output", str(out), "--ds", DS]) == 0
    assert capsys.readouterr().out != report


def test_a_rebuild_left_unpublished_past_the_hold_goes_and_the_published_run_stays(tmp_path):
    """A rebuild of a published night that loaded and was then abandoned holds its rows for
    LOAD_HOLD_DAYS; the retention of a later load then deletes them, never the published
    run's rows, which readers still see."""
    from reassembler.warehouse import LOAD_HOLD_DAYS
    from steps import load

    out = tmp_path / "out"
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    inp = n.write()
    build_night(inp, out, DS, run_id="r1")
    before = _seen(out)
    load(inp, out, DS, run_id="r2")
    later = Night(tmp_path / "later", ds="2026-11-29")
    worked_example(later, "b_g0")
    later_inp = later.write()
    build_night(later_inp, out, "2026-11-29", run_id="l1")
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert {r for (r,) in con.execute("SELECT run FROM rollout_runs WHERE ds = ?", [DS]).fetchall()} == {
            "r1",
            "r2",
        }
    with duckdb.connect(str(out / "warehouse.duckdb")) as con:
        con.execute(f"UPDATE loads SET loaded_at = loaded_at - INTERVAL {LOAD_HOLD_DAYS + 1} DAY")
    build_night(later_inp, out, "2026-11-29", run_id="l2")
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        runs = {r for (r,) in con.execute("SELECT run FROM rollout_runs WHERE ds = ?", [DS]).fetchall()}
        plans = {r for (r,) in con.execute("SELECT run FROM shard_plan_runs WHERE ds = ?", [DS]).fetchall()}
    assert runs == plans == {"r1"}
    now = _seen(out)
    assert {t: [r for r in rows if str(r[0]) == DS] for t, rows in now.items()} == before


def test_an_empty_staged_night_replaces_nothing_without_allow_empty(tmp_path):
    from reassembler.errors import AuditCheckFailed
    from steps import load, publish, shard

    out = tmp_path / "out"
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    inp = n.write()
    build_night(inp, out, DS)
    empty = Night(tmp_path / "empty")
    empty_input = empty.write()
    load(empty_input, out, DS, Settings(allow_empty=True), run_id="r2")
    shard(out, DS, 0, "r2")
    with pytest.raises(AuditCheckFailed, match="no rollout staged"):
        publish(empty_input, out, DS, "r2")
    assert _published(out, DS) == (2, 1)
    assert publish(empty_input, out, DS, "r2", Settings(allow_empty=True)).audit_rows == 0
    assert _published(out, DS) == (0, 0)


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reassembler.cli", *map(str, args)], capture_output=True, text=True)


@pytest.mark.parametrize("command", [["report"], ["report", "--html"], ["explain", "--ds", DS, "a_g0"]])
def test_every_reader_checks_the_schema_version(tmp_path, command):
    out = tmp_path / "out"
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    build_night(n.write(), out, DS)
    with connect(out) as con:
        con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [SCHEMA_VERSION + 1])
    res = _cli(command[0], "--output", out, *command[1:])
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        f"reassembler: error: {out / 'warehouse.duckdb'}: the warehouse is at schema version "
        f"{SCHEMA_VERSION + 1}, newer than this release ({SCHEMA_VERSION}); use the release that wrote it"
    )
    with duckdb.connect(str(out / "warehouse.duckdb")) as con:  # one a version behind: a build brings it forward
        con.execute("DELETE FROM schema_version")
        con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [SCHEMA_VERSION - 1])
    res = _cli(command[0], "--output", out, *command[1:])
    assert res.returncode == 2 and "older than this release" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("keep", [2, 3, 4])
def test_a_damaged_warehouse_is_exit_2_and_the_published_night_stays(tmp_path, keep):
    """The file cut to a half, a third or a quarter: whatever step first reads a lost block
    (the load, the shard, the publish) stops with one line naming the file and what to do,
    before any partition moves; with the file moved aside, the next build starts anew."""
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    inp = n.write()
    first = build_night(inp, out, DS)
    wh = out / "warehouse.duckdb"
    os.truncate(wh, wh.stat().st_size // keep)
    res = _cli("build", "--input", inp, "--output", out, "--ds", DS)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"reassembler: error: {wh}: the warehouse file is damaged (")
    assert "Move the file aside" in res.stderr and res.stderr.count("\n") == 1
    assert set(pq.read_table(out / "audit" / f"ds={DS}").column("run_id").to_pylist()) == {first.run_id}
    wh.rename(out / "warehouse.damaged")
    res = _cli("build", "--input", inp, "--output", out, "--ds", DS)
    assert res.returncode == 0, res.stderr
    assert _published(out, DS) == (2, 1)


def test_spill_cleanup_removes_only_folders_it_made(tmp_path):
    """--temp-directory may be a folder other tools use: only pid-<n>@<host> folders with
    this job's mark, of this host, whose process is gone, are removed."""
    import socket

    from reassembler.settings import DuckDBSettings
    from reassembler.warehouse import SPILL_MARK, clear_dead_spill_folders

    spill = tmp_path / "shared-tmp"
    gone = _dead_pid()
    host = socket.gethostname()
    ours = spill / f"pid-{gone}@{host}"
    theirs = [spill / f"pid-{gone}", spill / f"pid-{gone}@{host}-other", spill / f"pid-{gone + 1}@{host}"]
    for folder in [ours, *theirs]:
        folder.mkdir(parents=True)
        (folder / "data").write_text("x")
    (ours / SPILL_MARK).write_text(json.dumps({"pid": gone, "host": host}))
    (theirs[2] / SPILL_MARK).write_text(json.dumps({"pid": gone, "host": host}))  # the mark names another pid
    alive = spill / f"pid-{os.getpid()}@{host}"
    alive.mkdir()
    (alive / SPILL_MARK).write_text(json.dumps({"pid": os.getpid(), "host": host}))
    clear_dead_spill_folders(tmp_path / "out", DuckDBSettings(temp_directory=str(spill)))
    assert not ours.exists()
    assert all(folder.exists() for folder in [*theirs, alive])


def test_spill_cleanup_also_clears_the_temporary_folders_of_dead_processes(tmp_path, monkeypatch):
    """The steps' scratch DuckDBs and the read-only connections (report, explain) spill into
    the system temp folder, and a one-process build keeps an S3 night's shard plans in its
    scratch folder: a process killed (or a reader that just ended) leaves its folder there,
    which the next build removes, as it does under the output."""
    import socket
    import tempfile

    from reassembler.settings import DuckDBSettings
    from reassembler.warehouse import SPILL_MARK, clear_dead_spill_folders

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "sys-tmp"))
    gone, host = _dead_pid(), socket.gethostname()
    left = [
        tmp_path / "sys-tmp" / "reassembler" / "duckdb" / f"pid-{gone}@{host}" / "plans-x" / "plan",
        tmp_path / "sys-tmp" / "reassembler-duckdb" / f"pid-{gone}@{host}",
    ]
    for folder in left:
        folder.mkdir(parents=True)
        (folder / "data").write_text("x")
        owner = folder if folder.name.startswith("pid-") else folder.parents[1]
        (owner / SPILL_MARK).write_text(json.dumps({"pid": gone, "host": host}))
    clear_dead_spill_folders(tmp_path / "out", DuckDBSettings())
    assert not any(folder.exists() for folder in left)
    assert (tmp_path / "sys-tmp" / "reassembler" / "duckdb").exists()


def _dead_pid() -> int:
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_warehouse_of_release_5_records_the_input_locations_from_then_on(tmp_path):
    """Version 5 kept each run's input root only; the migration adds runs.inputs, null for
    the runs before it, and the next run records the locations it read."""
    out = tmp_path / "out"
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    root = n.write()
    build_night(root, out, DS)
    with connect(out) as con:  # a current warehouse taken back to version 5
        con.execute("ALTER TABLE runs DROP COLUMN inputs")
        back_to_version(con, 5)
    build_night(root, out, DS)
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        runs = con.execute("SELECT input_dir, inputs FROM runs ORDER BY published_at").fetchall()
    assert runs[0] == (str(root), None)
    assert runs[1][0] == str(root) and json.loads(runs[1][1]) == {
        kind: str(root / kind / f"ds={DS}") for kind in ("rollouts", "ledger", "tokens")
    }


def test_a_warehouse_of_release_8_moves_its_per_call_rows_to_parquet_and_its_nights_stay_readable(tmp_path, capsys):
    """Version 8 held ledger, token_rows and rejects in the file; migration 009 writes each
    night's rows as Parquet beside it (run "migrated") and the views show them: explain and
    the report read an old night as before, and the file no longer holds them."""
    from reassembler.call_tables import root
    from reassembler.cli import main

    out = tmp_path / "out"
    old = Night(tmp_path / "old", ds="2026-11-27")
    worked_example(old, "a_g0")
    build_night(old.write(), out, "2026-11-27")
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        before = {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall()) for t in ("ledger", "token_rows", "rejects")}
    assert before["ledger"] and before["token_rows"]
    import datetime

    before["rejects"].append((datetime.date(2026, 11, 27), "ledger", "a.jsonl", 3, "not JSON", "{", None, None))
    with connect(out) as con:  # the rows back in the file, as release 8 held them
        back_to_version(con, 8)
        for table, rows in before.items():
            if rows:
                con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    import shutil

    shutil.rmtree(root(out))  # release 8 wrote no Parquet of them
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    build_night(n.write(), out, DS)  # migrates, then loads another night
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall())
        after = {t: sorted(con.execute(f"SELECT * FROM {t} WHERE ds = '2026-11-27'").fetchall()) for t in before}
    assert {kinds[t] for t in before} == {"VIEW"} and after == before
    assert (Path(root(out)) / "ledger" / "ds=2026-11-27" / "run=migrated").is_dir()
    assert main(["explain", "--output", str(out), "--ds", "2026-11-27", "a_g0"]) == 0
    assert "a_g0" in capsys.readouterr().out
    assert main(["report", "--output", str(out), "--ds", "2026-11-27"]) == 0


def test_a_one_process_build_lets_duckdb_keep_little_while_its_shards_run(tmp_path, monkeypatch):
    """The held warehouse connection's memory_limit is REST_MEMORY while the shards of a
    one-process build run (its cached blocks would otherwise sit beside the shards' memory),
    and the configured limit again for the publish."""
    from reassembler import build
    from reassembler.settings import DuckDBSettings
    from reassembler.warehouse import REST_MEMORY, Warehouse

    def limit(con) -> int:
        [[value]] = con.execute("SELECT value FROM duckdb_settings() WHERE name = 'memory_limit'").fetchall()
        return value

    held: list[Warehouse] = []
    real_held, real_shard, real_publish = Warehouse.held, build.shard_step, build.publish_step
    seen: dict[str, list[str]] = {"shard": [], "publish": []}

    def spy_held(self):
        held.append(self)
        return real_held(self)

    def spy_shard(*a, **k):
        seen["shard"].append(limit(held[0]._held))
        return real_shard(*a, **k)

    def spy_publish(*a, **k):
        seen["publish"].append(limit(held[0]._held))
        return real_publish(*a, **k)

    monkeypatch.setattr(Warehouse, "held", spy_held)
    monkeypatch.setattr(build, "shard_step", spy_shard)
    monkeypatch.setattr(build, "publish_step", spy_publish)
    night = Night(tmp_path / "in")
    worked_example(night, "a_g0")
    worked_example(night, "b_g0")
    settings = Settings(shards=2, duckdb=DuckDBSettings(memory_limit="96MB"))
    build_night(night.write(), tmp_path / "out", DS, settings)
    assert len(seen["shard"]) == 2 and set(seen["shard"]) == {limit_of(REST_MEMORY)}
    assert seen["publish"] == [limit_of("96MB")]


def limit_of(text: str) -> str:
    """How duckdb_settings() shows a memory_limit set as `text`."""
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{text}'")
    [[value]] = con.execute("SELECT value FROM duckdb_settings() WHERE name = 'memory_limit'").fetchall()
    con.close()
    return value


def test_a_one_process_build_gives_freed_memory_back_between_its_steps(tmp_path, monkeypatch):
    """Freed memory is handed back (memory.give_back) after the load, before the shards, and
    in each shard between sorting its calls and running its batches, so that no step starts
    on top of what the one before it freed."""
    from reassembler import build, memory

    events: list[str] = []
    for name in ("build_calls", "run_shard", "load_step"):
        real = getattr(build, name)
        monkeypatch.setattr(build, name, lambda *a, _n=name, _r=real, **k: events.append(_n) or _r(*a, **k))
    real_give = memory.give_back
    monkeypatch.setattr(build, "give_back", lambda: events.append("give_back") or real_give())
    night = Night(tmp_path / "in")
    worked_example(night, "a_g0")
    worked_example(night, "b_g0")
    build_night(night.write(), tmp_path / "out", DS, Settings(shards=2))
    assert events == ["load_step", "give_back"] + ["build_calls", "give_back", "run_shard"] * 2
