"""The Airflow DAG and its operator: import, execute() on a small night, and end-to-end
runs with `airflow dags test` against the recorded outcomes of a synthetic night."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from nights import DS, Night, partition_parts

REPO = Path(__file__).resolve().parents[1]
_HOME = tempfile.mkdtemp(prefix="airflow-home-")
atexit.register(shutil.rmtree, _HOME, True)  # the test process's Airflow home goes with it
os.environ.setdefault("AIRFLOW_HOME", _HOME)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(REPO / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"


@pytest.fixture(params=[None, "reassembler_warehouse"])
def pool(request, monkeypatch):
    """The DAG parsed without and with the warehouse pool (REASSEMBLER_WAREHOUSE_POOL), the
    warehouse's tasks on their own queue."""
    monkeypatch.setenv("REASSEMBLER_WAREHOUSE_QUEUE", "warehouse-host")
    # the DAG module reads them when it is imported: a dag-processor parses in a fresh process
    monkeypatch.delitem(sys.modules, "reassembler_airflow.dag", raising=False)
    if request.param is None:
        monkeypatch.delenv("REASSEMBLER_WAREHOUSE_POOL", raising=False)
    else:
        monkeypatch.setenv("REASSEMBLER_WAREHOUSE_POOL", request.param)
    return request.param


def test_dag_imports_with_the_expected_shape(pool):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["capture_rows_nightly"]
    assert set(dag.task_ids) == {
        "check_input",
        "wait_for_input",
        "plan_load",
        "load_part",
        "merge_rollouts",
        "merge_keys",
        "merge_bucket",
        "load_ledger",
        "reassemble",
        "audit_checks",
        "publish",
        "quality_report",
        "quality_gate",
    }
    assert dag.timetable.expression == "0 2 * * *"
    assert dag.description and dag.max_active_runs > 1  # the pool serialises the writers, not the runs
    assert {
        "ds",
        "shards",
        "mode",
        "offchain",
        "max_mask_rate",
        "duckdb_memory_limit",
        "duckdb_threads",
        "duckdb_temp_directory",
        "input_wait_hours",
    } <= set(dag.params.keys())
    # the trigger form works untouched: every param has a description and a default that validates
    for name in dag.params.keys():
        param = dag.params.get_param(name)
        assert param.description, name
        param.resolve(param.value)
    writers = {"load_ledger", "publish", "quality_gate"}
    for task in dag.tasks:
        if task.task_id in writers | {"audit_checks", "quality_report"}:
            # without a pool: Airflow's default one, and the warehouse's locks serialise the writers
            assert task.pool == (pool or "default_pool"), task.task_id
            assert task.pool_slots == (4 if pool and task.task_id in writers else 1), task.task_id
            assert task.queue == "warehouse-host", task.task_id  # REASSEMBLER_WAREHOUSE_QUEUE
    # open no warehouse: no pool, Airflow's default queue (any worker)
    for name in ("reassemble", "plan_load", "load_part", "merge_rollouts", "merge_keys", "merge_bucket"):
        anywhere = dag.get_task(name)
        assert (anywhere.pool, anywhere.pool_slots, anywhere.queue) == ("default_pool", 1, "default"), name
    assert dag.get_task("load_part").upstream_task_ids == {"plan_load", "check_input"}
    assert dag.get_task("merge_rollouts").upstream_task_ids == {"load_part", "check_input"}
    assert dag.get_task("merge_keys").upstream_task_ids == {"merge_rollouts", "check_input"}
    assert dag.get_task("merge_bucket").upstream_task_ids == {"merge_keys", "merge_rollouts", "check_input"}
    assert dag.get_task("load_ledger").upstream_task_ids == {"merge_bucket", "check_input"}
    assert dag.get_task("plan_load").upstream_task_ids == {"wait_for_input", "check_input"}
    assert dag.get_task("wait_for_input").mode == "reschedule"
    assert dag.get_task("reassemble").upstream_task_ids == {"load_ledger", "check_input"}
    assert dag.get_task("publish").upstream_task_ids >= {"audit_checks"}
    assert [o.name for o in dag.get_task("publish").outlets] == ["capture_rows"]


def test_operator_execute_reassembles_one_shard(tmp_path, night):
    from nights import worked_example
    from reassembler.settings import Settings
    from reassembler_airflow.operators import ReassembleOperator
    from steps import load, publish

    worked_example(night, "a_g0", compaction=True, reward=1.0)
    worked_example(night, "b_g0", compaction=False, reward=0.0)
    inp, out = night.write(), tmp_path / "out"
    load(inp, out, DS, Settings(shards=2), run_id="test_run")
    operators = [
        ReassembleOperator(task_id=f"reassemble_{k}", output_dir=str(out), ds=DS, run_id="test_run", shard=k)
        for k in (0, 1)
    ]
    results = [op.execute(context={}) for op in operators]
    assert [op.group_range for op in operators] == ["1 group: a", "1 group: b"]  # the map index label
    assert [(r["shard"], r["rollouts"], r["ok"], r["rows"]) for r in results] == [(0, 1, 1, 2), (1, 1, 1, 1)]
    staged = out / "_runs" / f"ds={DS}" / "test_run"
    assert sorted(p.name for p in (staged / "rows").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert not (out / "rows").exists()  # nothing visible before publish
    numbers = publish(inp, out, DS, "test_run")
    assert (numbers.n_rows, numbers.ok_rollouts) == (3, 2)


def _airflow_env(home: Path, inp: Path, out: Path) -> dict:
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        REASSEMBLER_INPUT=str(inp),
        REASSEMBLER_OUTPUT=str(out),
        REASSEMBLER_TASK_RETRIES="0",
    )
    return env


def _airflow(env: dict, *args: str, ok: bool = True) -> str:
    airflow = str(Path(sys.executable).parent / "airflow")
    res = subprocess.run([airflow, *args], env=env, capture_output=True, text=True, timeout=300)
    assert (res.returncode == 0) == ok, (res.stdout[-3000:], res.stderr[-3000:])
    return res.stdout + res.stderr


@pytest.mark.timeout(600)
def test_dag_end_to_end_twice_publishes_identical_rows(tmp_path):
    from reassembler.producer.synth import SHAPES, SynthConfig, read_expected, synth_night

    inp, out, home = tmp_path / "input", tmp_path / "output", tmp_path / "airflow"
    home.mkdir()
    synth_night(
        inp,
        DS,
        SynthConfig(
            rollouts=64,
            seed=1,  # a night with a group of every producer shape
            fault_rate=0.5,
            max_calls=10,
            prompt_tokens=(20, 80),
            observation_tokens=(5, 40),
            generated_tokens=(3, 30),
        ),
    )
    env = _airflow_env(home, inp, out)
    _airflow(env, "db", "migrate")
    # ds = logical date - 1 day; half the rollouts carry a fault, so the quality gate fails the
    # run at its last task, after the rows were published and the report written
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "2026-11-29", ok=False)
    assert "DagRun Finished" in log and "state=failed" in log
    assert f"AirflowFailException: capture quality of ds={DS} breached" in log and "mask rate" in log
    assert (out / "reports" / f"ds={DS}" / "index.html").exists() and (out / "reports" / "index.html").exists()
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT verdict FROM quality WHERE ds = ?", [DS]).fetchone() == ("breached",)

    expected = read_expected(inp, DS)
    audit = {a["rollout_id"]: a for a in pq.read_table(out / "audit" / f"ds={DS}").to_pylist()}
    assert set(audit) == set(expected)
    assert set(SHAPES) == {e["shape"] for e in expected.values()}  # verifiers traces, envelope lines too
    for rid, e in expected.items():
        assert (audit[rid]["status"], audit[rid]["reason"]) == (e["select"]["status"], e["select"]["reason"]), rid
    rows_dir = out / "rows" / f"ds={DS}"
    first = partition_parts(rows_dir)
    assert len(first) == 4  # the default of 4 mapped shards
    rows = pq.read_table(rows_dir).to_pylist()
    assert {r["rollout_id"] for r in rows} == {rid for rid, a in audit.items() if a["status"] == "ok"}

    with sqlite3.connect(home / "airflow.db") as db:
        [(extra, partition_key)] = db.execute("SELECT extra, partition_key FROM asset_event").fetchall()
    assert partition_key == DS  # the night is the asset event's partition key
    extra = json.loads(extra)
    masked = sum(a["status"] == "masked" for a in audit.values())
    assert (extra["ds"], extra["rows"], extra["rollouts"], extra["masked"]) == (DS, len(rows), 64, masked)
    assert sum(extra["mask_reasons"].values()) == masked

    relaxed = {"gate_max_mask_rate": None, "gate_max_reason_rate": None, "gate_max_mask_rate_rise": None}
    again = {"ds": DS, "load_parts": 3, "merge_buckets": 2, **relaxed}  # 3 mapped parts, merged in 2 mapped buckets
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "2026-11-30", "-c", json.dumps(again))
    assert "state=success" in log
    assert "in 3 load parts" in log and "from 2 merge buckets" in log
    assert "merge bucket 0:" in log and "merge bucket 1:" in log and "key bucket 1:" in log
    # each task's log says how far it got: each load part in bytes, each shard in tokens
    for k in range(3):
        assert re.search(rf"load part {k}: [\d.]+ [KMG]?B of [\d.]+ [KMG]?B \(100%\), .*\(done in", log), log[-3000:]
    assert re.search(r"shard 0: [\d.]+[kMG]? of [\d.]+[kMG]? tokens \(100%\)", log)
    assert partition_parts(rows_dir) == first

    # the same deployment pointed at NeMo Gym 0.7.0's own capture folder, as it is (another night)
    gym = REPO / "tests" / "data" / "gym-0.7.0"
    gym_expected = json.loads((gym / "expected.json").read_text())
    gym_out = out
    log = _airflow(
        _airflow_env(home, gym, gym_out),
        "dags",
        "test",
        "capture_rows_nightly",
        "2026-12-01",
        "-c",
        json.dumps({"ds": gym_expected["ds"]}),
    )
    assert "state=success" in log
    audit = {a["rollout_id"]: a for a in pq.read_table(gym_out / "audit" / f"ds={gym_expected['ds']}").to_pylist()}
    assert {rid: (a["status"], a["n_segments"]) for rid, a in audit.items()} == {
        e["rollout_id"]: (e["select"]["status"], e["select"]["n_segments"]) for e in gym_expected["rollouts"]
    }

    _check_the_ui_plugin_in_a_running_api_server(env, home, out)


def _check_the_ui_plugin_in_a_running_api_server(env: dict, home: Path, out: Path) -> None:
    """`airflow api-server` with this repo's plugins and the simple auth manager's users:
    anonymous requests get 401 from every route of the plugin, as from Airflow's API; a
    signed-in user without read access to the DAG (a user with no role) gets 403; a viewer,
    signed in through the login form, sees the index over nights in the navigation entry
    and a DAG run's night in its tab (headless Chromium), every chart drawn under the
    pages' Content-Security-Policy with no console error."""
    import shutil
    import socket
    import time
    import urllib.error
    import urllib.request

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import expect, sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({"viewer": "viewer-pw", "nobody": "nobody-pw"}))
    server_env = dict(
        env,
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="viewer:viewer,nobody:",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords),
    )
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "airflow"), "api-server", "--port", str(port)],
        env=server_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def get(path: str, token: str | None = None) -> int:
        request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=30) as res:
                return res.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:  # not listening (yet)
            return 0

    def token(user: str) -> str:
        body = json.dumps({"username": user, "password": f"{user}-pw"}).encode()
        request = urllib.request.Request(f"{base}/auth/token", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as res:
            return json.load(res)["access_token"]

    try:
        deadline = time.monotonic() + 120
        while get("/api/v2/version") != 200:
            assert time.monotonic() < deadline and server.poll() is None, "the API server did not come up"
            time.sleep(1)
        with sqlite3.connect(home / "airflow.db") as db:
            runs = [r for (r,) in db.execute("SELECT run_id FROM dag_run ORDER BY id")]
        paths = [
            "/capture-quality/",
            f"/capture-quality/ds={DS}/index.html",
            f"/capture-quality/data/ds={DS}.json",
            "/capture-quality/plotly.min.js",
            f"/capture-quality/runs/{runs[1]}",
            "/capture-quality/missing",
            "/capture-quality/%00",
        ]
        assert get("/api/v2/dags") == 401
        assert {p: get(p) for p in paths} == {p: 401 for p in paths}  # anonymous
        nobody, viewer = token("nobody"), token("viewer")
        assert get("/api/v2/dags", nobody) == 403
        assert {p: get(p, nobody) for p in paths} == {p: 403 for p in paths}
        assert {p: get(p, "not.a.token") for p in paths} == {p: 403 for p in paths}
        assert [get(p, viewer) for p in paths] == [200, 200, 200, 200, 200, 404, 404]
        plugins = json.load(
            urllib.request.urlopen(
                urllib.request.Request(f"{base}/api/v2/plugins", headers={"Authorization": f"Bearer {viewer}"})
            )
        )
        [plugin] = [p for p in plugins["plugins"] if p["name"] == "capture_quality"]
        assert {v["destination"] for v in plugin["external_views"]} == {"nav", "dag_run"}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            page.goto(f"{base}/plugin/capture-quality")  # the login form first
            page.get_by_label("Username").fill("viewer")
            page.get_by_label("Password").fill("viewer-pw")
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url("**/plugin/capture-quality", timeout=30_000)
            frame = page.frame_locator("iframe")
            assert frame.locator("h1").inner_text(timeout=30_000) == "Capture quality, every night"
            assert frame.locator("table a", has_text=DS).count() == 1
            page.goto(f"{base}/dags/capture_rows_nightly/runs/{runs[1]}/plugin/capture-quality-run")
            frame = page.frame_locator("iframe")
            assert frame.locator("h1").inner_text(timeout=30_000) == f"Capture quality, night {DS}"
            frame.locator("div.js-plotly-plot svg.main-svg").first.wait_for(timeout=30_000)
            if os.environ.get("REASSEMBLER_UPDATE_SCREENSHOT"):
                page.wait_for_timeout(1500)
                page.screenshot(path=str(REPO / "docs" / "airflow-run-view.png"))
            # the first run published the same night before the second one did: its tab says so
            page.goto(f"{base}/dags/capture_rows_nightly/runs/{runs[0]}/plugin/capture-quality-run")
            frame = page.frame_locator("iframe")
            said = frame.locator("#status").inner_text(timeout=30_000)
            assert said.startswith(f"This run published night {DS} on ") and f"A later run, {runs[1]}," in said
            frame.locator("a#report").click()
            expect(frame.locator("h1")).to_have_text(f"Capture quality, night {DS}", timeout=30_000)
            report = context.new_page()  # the same session cookie
            errors: list[str] = []
            report.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            report.goto(f"{base}/capture-quality/ds={DS}/index.html")
            report.locator("div.js-plotly-plot svg.main-svg").first.wait_for(timeout=30_000)
            drawn = report.locator("div.js-plotly-plot").count()
            assert drawn >= 5 and report.locator("div.js-plotly-plot svg.main-svg").count() >= drawn
            assert errors == []  # the policy blocked nothing the page needs
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_check_input_resolves_the_night_and_names_what_is_missing(tmp_path, monkeypatch, night):
    from datetime import datetime
    from types import SimpleNamespace

    from airflow.dag_processing.dagbag import DagBag

    check = DagBag(dag_folder=str(REPO / "dags")).dags["capture_rows_nightly"].get_task("check_input").python_callable
    inp = night.write()  # ds 2026-11-28
    monkeypatch.setenv("AIRFLOW_VAR_REASSEMBLER_INPUT", str(inp))
    monkeypatch.setenv("AIRFLOW_VAR_REASSEMBLER_OUTPUT", str(tmp_path / "out"))
    nightly = datetime(2026, 11, 29, 2, tzinfo=UTC)
    got = check(params={"ds": None, "shards": 2}, logical_date=nightly, dag_run=None)
    assert got == {"ds": DS, "input_dir": str(inp), "output_dir": str(tmp_path / "out")}
    # a manual run without a logical date falls back to run_after
    got = check(params={"ds": None, "shards": 2}, logical_date=None, dag_run=SimpleNamespace(run_after=nightly))
    assert got["ds"] == DS


def test_wait_for_input_waits_then_fails_naming_what_is_missing(tmp_path, night):
    from datetime import datetime, timedelta
    from types import SimpleNamespace

    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import AirflowFailException

    poke = DagBag(dag_folder=str(REPO / "dags")).dags["capture_rows_nightly"].get_task("wait_for_input").python_callable
    inp = night.write()
    now = datetime.now(UTC)
    params = {"input_wait_hours": 6.0, "input_marker": None}
    assert poke(str(inp), DS, params=params, dag_run=SimpleNamespace(start_date=now)).is_done
    # late input: keep waiting (rescheduled, no worker slot held), then fail after the timeout
    assert not poke(str(inp), "2026-11-27", params=params, dag_run=SimpleNamespace(start_date=now)).is_done
    with pytest.raises(AirflowFailException, match=r"within 6.0 hours: .*rollouts/ds=2026-11-27: input partition"):
        poke(str(inp), "2026-11-27", params=params, dag_run=SimpleNamespace(start_date=now - timedelta(hours=7)))
    # a completion marker the capture writes last
    marked = dict(params, input_marker="_SUCCESS")
    assert not poke(str(inp), DS, params=marked, dag_run=SimpleNamespace(start_date=now)).is_done
    (inp / "rollouts" / f"ds={DS}" / "_SUCCESS").touch()
    assert poke(str(inp), DS, params=marked, dag_run=SimpleNamespace(start_date=now)).is_done


@pytest.mark.parametrize("ds", ["2026-02-30", "2026-13-45", "２０２６-11-05", "2026-1-05", ""])
def test_an_impossible_night_is_refused_at_trigger_time(ds):
    """The trigger form's schema (format date, ASCII digits) refuses it before a run starts;
    check_input refuses it again, without retry, should a run carry it."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import AirflowFailException, ParamValidationError

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["capture_rows_nightly"]
    with pytest.raises(ParamValidationError):
        dag.params.get_param("ds").resolve(ds)
    assert dag.params.get_param("ds").resolve("2026-02-28") == "2026-02-28"
    check = dag.get_task("check_input").python_callable
    with pytest.raises(AirflowFailException, match="ds"):
        check(params={"ds": ds or "2026-02-30"}, logical_date=None, dag_run=None)


def test_shard_labels_read_in_the_order_people_expect():
    from reassembler_airflow.operators import group_label

    byte_order = ["32", "33", "34", "35", "36", "37", "38", "39", "4", "40", "41", "42", "43", "44", "45", "5", "6"]
    assert group_label(byte_order) == "17 groups: 4-6, 32-45"
    assert group_label(["grp00028", "grp00007", "grp00033"]) == "3 groups: grp00007 .. grp00033"
    assert group_label(["007", "8"]) == "2 groups: 007 .. 8"  # not plain numbers: as text
    assert group_label([str(n) for n in range(0, 40, 2)]) == "20 groups: 0, 2, 4, 6, 8, 10, ... (14 more ranges)"
    assert group_label([]) == "no groups" and group_label(["3"]) == "1 group: 3"


@pytest.mark.timeout(600)
def test_the_dag_builds_a_night_from_and_to_object_storage(tmp_path, s3):
    """REASSEMBLER_INPUT / _OUTPUT on S3 (moto's server), the warehouse a local file: the DAG
    publishes what a local build publishes, the report lands on the store, and the rows
    Asset's URI is the output's."""
    from nights import worked_example
    from reassembler.build import build_night

    n = Night(tmp_path / "night")
    worked_example(n, "a_g0", compaction=True, reward=1.0)
    worked_example(n, "a_g1", compaction=False, reward=0.0)
    worked_example(n, "b_g0", compaction=False, reward=None, failure_reason="timeout")
    local_in = n.write()
    inp, out = f"s3://{s3.bucket('capture')}/nightly", f"s3://{s3.bucket('rows')}/nightly"
    s3.upload(local_in, inp)
    home = tmp_path / "airflow"
    home.mkdir()
    env = _airflow_env(home, inp, out)
    env.update(s3.env, REASSEMBLER_WAREHOUSE=str(tmp_path / "warehouse.duckdb"))
    _airflow(env, "db", "migrate")
    relaxed = {"ds": DS, "gate_max_mask_rate": None, "gate_max_reason_rate": None}
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "2026-11-29", "-c", json.dumps(relaxed))
    assert "state=success" in log
    build_night(local_in, tmp_path / "local", DS)
    s3.download(out, tmp_path / "mirror")
    for kind in ("rows", "audit"):
        a = pq.read_table(tmp_path / "local" / kind / f"ds={DS}", partitioning=None).drop_columns(
            [c for c in ("run_id",) if kind == "audit"]
        )
        b = pq.read_table(tmp_path / "mirror" / kind / f"ds={DS}", partitioning=None).drop_columns(
            [c for c in ("run_id",) if kind == "audit"]
        )
        assert sorted(a.to_pylist(), key=str) == sorted(b.to_pylist(), key=str)
    assert (tmp_path / "mirror" / "reports" / f"ds={DS}" / "index.html").exists()
    with sqlite3.connect(home / "airflow.db") as db:
        [(uri,)] = db.execute("SELECT uri FROM asset WHERE name = 'capture_rows'").fetchall()
        [(extra,)] = db.execute("SELECT extra FROM asset_event").fetchall()
    assert uri == "reassembler://capture_rows/"  # whatever the output (test_scheduler.py changes it)
    assert json.loads(extra)["partition"] == f"{out}/rows/ds={DS}"


def test_check_input_and_wait_for_input_follow_the_gym_layout(tmp_path, monkeypatch):
    """The layout and templates from the trigger form (or the deployment's settings): the
    sensor waits for Gym's results file, which Gym writes last, then lets the night go."""
    from datetime import datetime, timedelta
    from types import SimpleNamespace

    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import AirflowFailException
    from gym_nights import STAGED_DS, gym_folder

    from reassembler.formats.locations import Inputs

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["capture_rows_nightly"]
    check, poke = dag.get_task("check_input").python_callable, dag.get_task("wait_for_input").python_callable
    night = gym_folder(tmp_path / "gym", "gym-0.7.0", STAGED_DS)
    results = night / "rollouts.jsonl"
    whole = results.read_bytes()
    results.unlink()  # the collection is still running
    monkeypatch.setenv("AIRFLOW_VAR_REASSEMBLER_INPUT", str(tmp_path / "gym" / "{ds}"))
    monkeypatch.setenv("AIRFLOW_VAR_REASSEMBLER_OUTPUT", str(tmp_path / "out"))
    got = check(params={"ds": STAGED_DS, "layout": "gym"}, logical_date=None, dag_run=None)
    assert Inputs.of(got["input_dir"]) == Inputs(str(tmp_path / "gym" / "{ds}"), "gym")
    with pytest.raises(AirflowFailException, match=r"unknown placeholder \{day\}"):
        check(params={"ds": STAGED_DS, "layout": "gym", "tokens": "/dump/{day}"}, logical_date=None, dag_run=None)
    params = {"input_wait_hours": 6.0, "input_marker": None}
    now = SimpleNamespace(start_date=datetime.now(UTC))
    assert not poke(got["input_dir"], STAGED_DS, params=params, dag_run=now).is_done
    with pytest.raises(AirflowFailException, match=rf"{night}: no results file yet"):
        late = SimpleNamespace(start_date=datetime.now(UTC) - timedelta(hours=7))
        poke(got["input_dir"], STAGED_DS, params=params, dag_run=late)
    results.write_bytes(whole[:100])  # being written
    assert not poke(got["input_dir"], STAGED_DS, params=params, dag_run=now).is_done
    results.write_bytes(whole)
    settled = time.time() - 120
    os.utime(results, (settled, settled))
    assert poke(got["input_dir"], STAGED_DS, params=params, dag_run=now).is_done


@pytest.mark.timeout(600)
def test_the_dag_builds_a_gym_night_on_object_storage_with_the_gym_layout(tmp_path, s3):
    """One setting (REASSEMBLER_LAYOUT=gym, the input Gym's own per-night folder on S3): the
    DAG publishes the night the contract's layout gives, with no copy into it."""
    from gym_nights import DATA, STAGED_DS, gym_folder, tables

    from reassembler.build import build_night

    local = gym_folder(tmp_path / "lab", "gym-0.7.0", STAGED_DS)
    root, out = f"s3://{s3.bucket('lab')}/gym", f"s3://{s3.bucket('rows')}/nightly"
    s3.upload(local, f"{root}/{STAGED_DS}")
    home = tmp_path / "airflow"
    home.mkdir()
    env = _airflow_env(home, root + "/{ds}", out)
    # the credentials as Airflow users keep them: a Connection (the aws_conn_id param's
    # default, aws_default), no AWS_* variable on the processes
    env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    connection = {
        "conn_type": "aws",
        "login": s3.env["AWS_ACCESS_KEY_ID"],
        "password": s3.env["AWS_SECRET_ACCESS_KEY"],
        "extra": {"endpoint_url": s3.env["AWS_ENDPOINT_URL"], "region_name": s3.env["AWS_DEFAULT_REGION"]},
    }
    env.update(
        AIRFLOW_CONN_AWS_DEFAULT=json.dumps(connection),
        REASSEMBLER_WAREHOUSE=str(tmp_path / "warehouse.duckdb"),
        REASSEMBLER_LAYOUT="gym",
    )
    _airflow(env, "db", "migrate")
    relaxed = {"ds": STAGED_DS, "gate_max_mask_rate": None, "gate_max_reason_rate": None}
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "2026-11-30", "-c", json.dumps(relaxed))
    assert "state=success" in log
    assert "object storage credentials: the Airflow Connection 'aws_default' (AWS_ACCESS_KEY_ID, " in log
    build_night(DATA / "gym-0.7.0", tmp_path / "contract", STAGED_DS)
    s3.download(out, tmp_path / "mirror")
    assert tables(tmp_path / "mirror", STAGED_DS) == tables(tmp_path / "contract", STAGED_DS)
    manifest = json.loads((tmp_path / "mirror" / "_published" / f"ds={STAGED_DS}.json").read_text())
    assert manifest["run_info"]["inputs"]["ledger"] == f"{root}/{STAGED_DS}/token_id_capture"


@pytest.mark.timeout(300)
def test_a_location_named_in_the_trigger_form_stays_under_the_input_root(tmp_path):
    """Whoever may trigger the DAG cannot make a worker read any file: a `rollouts` param
    outside the deployment's input root fails check_input at once, naming it and the setting
    that allows more; nothing is read, no reject row shows the file's lines."""
    inp, out, home = tmp_path / "input", tmp_path / "output", tmp_path / "airflow"
    home.mkdir()
    (inp / "rollouts" / f"ds={DS}").mkdir(parents=True)
    env = _airflow_env(home, inp, out)
    _airflow(env, "db", "migrate")
    conf = {"ds": DS, "rollouts": "/etc/passwd"}
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "-c", json.dumps(conf), ok=False)
    assert "/etc/passwd: the rollouts location given for this run lies outside the allowed input roots" in log
    assert "REASSEMBLER_ALLOWED_INPUT_ROOTS" in log and not (out / "tables").exists()
    conf = {"ds": DS, "input_marker": "../../../etc/passwd"}
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "-c", json.dumps(conf), ok=False)
    assert "a file name in the night's rollouts folder, not a path" in log
    # a list of rollouts locations: each one confined
    conf = {"ds": DS, "rollouts": [str(inp / "rollouts" / "ds={ds}"), "/etc/passwd"]}
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "-c", json.dumps(conf), ok=False)
    assert "/etc/passwd: the rollouts location given for this run lies outside the allowed input roots" in log
    # a typo in a triggered run's conf fails at once, naming the key and its near miss
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "-c", json.dumps({"ds": DS, "shard": 2}), ok=False)
    assert "conf key 'shard' is no param of capture_rows_nightly; did you mean 'shards'?" in log
    assert not (out / "tables").exists()


def test_check_input_takes_several_rollouts_locations_and_refuses_an_unknown_conf_key(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import AirflowFailException

    from reassembler.formats.night import find_night

    check = DagBag(dag_folder=str(REPO / "dags")).dags["capture_rows_nightly"].get_task("check_input").python_callable
    ds = "2026-12-02"
    gym, runs = tmp_path / "gym" / ds, tmp_path / "runs" / ds / "a"
    shutil.copytree(REPO / "tests" / "data" / "gym-0.7.0-compaction" / "rollouts" / f"ds={ds}", gym)
    runs.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "data" / "verifiers-0.4.0" / "rollouts" / "ds=2026-12-01" / "traces.jsonl", runs)
    monkeypatch.setenv("AIRFLOW_VAR_REASSEMBLER_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("AIRFLOW_VAR_REASSEMBLER_ALLOWED_INPUT_ROOTS", f"{tmp_path / 'gym'},{tmp_path / 'runs'}")
    locations = [str(tmp_path / "gym" / "{ds}"), str(tmp_path / "runs" / "{ds}" / "*" / "traces.jsonl")]
    run = SimpleNamespace(conf={"ds": ds, "rollouts": locations}, run_type="manual")
    got = check(params={"ds": ds, "rollouts": locations}, logical_date=None, dag_run=run)
    night = find_night(got["input_dir"], ds)
    assert night.rollouts == [f"gym/{ds}/rollouts.jsonl", f"runs/{ds}/a/traces.jsonl"]
    # the Variable takes a JSON list, as REASSEMBLER_ROLLOUTS does
    monkeypatch.setenv("AIRFLOW_VAR_REASSEMBLER_ROLLOUTS", json.dumps(locations))
    got = check(params={"ds": ds}, logical_date=None, dag_run=SimpleNamespace(conf={"ds": ds}, run_type="manual"))
    assert find_night(got["input_dir"], ds).rollouts == night.rollouts
    with pytest.raises(
        AirflowFailException, match=r"conf key 'layot' is no param of capture_rows_nightly; did you mean 'layout'\?"
    ):
        check(params={"ds": ds}, logical_date=None, dag_run=SimpleNamespace(conf={"layot": "gym"}, run_type="manual"))


def test_every_file_of_a_location_chosen_in_the_trigger_form_stays_under_the_allowed_roots(tmp_path, monkeypatch):
    """check_input confines a chosen location's folder; plan_load, the first task that lists
    the night, confines every file in it with its links followed: a rollouts file that is a
    link to a file outside, or a link to a secret inside a chosen ledger folder, fails the run
    naming it, before any part reads a line."""
    import shutil as sh

    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import AirflowFailException

    from nights import Night, worked_example

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["capture_rows_nightly"]
    check, plan = (dag.get_task(t).python_callable for t in ("check_input", "plan_load"))
    root, outside = tmp_path / "root", tmp_path / "outside"
    n = Night(root / "input")
    worked_example(n, "a_g0")
    inp = n.write()
    outside.mkdir()
    (outside / "creds.jsonl").write_text('{"secret": "hunter2"}\n')
    sh.copy(inp / "rollouts" / f"ds={DS}" / "rollouts.jsonl", outside / "results.jsonl")
    runs = root / "runs" / DS
    runs.mkdir(parents=True)
    (runs / "results.jsonl").symlink_to(outside / "results.jsonl")
    (inp / "ledger" / f"ds={DS}" / "a.jsonl").symlink_to(outside / "creds.jsonl")
    monkeypatch.setenv("AIRFLOW_VAR_REASSEMBLER_INPUT", str(inp))
    monkeypatch.setenv("AIRFLOW_VAR_REASSEMBLER_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("AIRFLOW_VAR_REASSEMBLER_ALLOWED_INPUT_ROOTS", str(root))
    cases = [
        ({"rollouts": str(root / "runs" / "{ds}" / "results.jsonl")}, runs / "results.jsonl", "rollouts"),
        ({"ledger": str(inp / "ledger" / "ds={ds}")}, inp / "ledger" / f"ds={DS}" / "a.jsonl", "ledger"),
    ]
    for chosen, link, kind in cases:
        params = {"ds": DS, **chosen}
        night = check(params=params, logical_date=None, dag_run=None)  # the folders are inside: passes
        with pytest.raises(AirflowFailException) as raised:
            plan(night["input_dir"], night["output_dir"], DS, params=params, run_id=f"run-{kind}")
        assert str(raised.value) == (
            f"{link}: a file of the {kind} location given for this run resolves to {link.resolve()}, outside the "
            f"allowed input roots ({root})"
        )
    assert not (tmp_path / "out" / "tables").exists()
