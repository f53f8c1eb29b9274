"""The DAG under a real scheduler (LocalExecutor, SQLite, this repo's dags/ and plugins/),
not only `airflow dags test`: unpausing starts the latest scheduled night, whose input has
not arrived, and it waits in its sensor holding nothing, while a backfill of three other
nights runs through the warehouse pool to the end."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from reassembler.producer.synth import SynthConfig, synth_night

REPO = Path(__file__).resolve().parents[1]
AIRFLOW = str(Path(sys.executable).parent / "airflow")


@pytest.mark.timeout(1200)
def test_a_backfill_of_three_nights_runs_while_a_late_night_waits(tmp_path):
    home, inp, out = tmp_path / "airflow", tmp_path / "input", tmp_path / "output"
    home.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS="reassembler_airflow.sqlite.CONNECT_ARGS",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://localhost:{port}/execution/",
        AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="2",
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
        REASSEMBLER_INPUT=str(inp),
        REASSEMBLER_OUTPUT=str(out),
        REASSEMBLER_TASK_RETRIES="0",
        REASSEMBLER_INPUT_POKE_SECONDS="30",
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    env.pop("REASSEMBLER_WAREHOUSE_POOL", None)
    # (a poke every 30 s: much shorter pokes race Airflow 3.3's LocalExecutor on SQLite, which then
    # fails the rescheduled sensor; the DAG's default is 300 s)
    # the latest scheduled night is the day before today's (or yesterday's) 02:00 run: no input for it
    now = datetime.now(UTC)
    latest_logical = (now if now.hour >= 2 else now - timedelta(days=1)).date()
    late_ds = (latest_logical - timedelta(days=1)).isoformat()
    backfill_logical = [latest_logical - timedelta(days=k) for k in (12, 11, 10)]
    nights = [(d - timedelta(days=1)).isoformat() for d in backfill_logical]
    for k, ds in enumerate(nights):
        synth_night(
            inp,
            ds,
            SynthConfig(
                rollouts=16,
                seed=40 + k,
                fault_rate=0.0,
                max_calls=6,
                prompt_tokens=(10, 30),
                observation_tokens=(3, 10),
                generated_tokens=(2, 8),
            ),
        )

    def airflow(*args: str) -> str:
        for _ in range(5):  # SQLite, the embedded default, answers "database is locked" under load
            res = subprocess.run([AIRFLOW, *args], env=env, capture_output=True, text=True, timeout=180)
            if res.returncode == 0 or "database is locked" not in res.stderr:
                break
            time.sleep(3)
        assert res.returncode == 0, res.stderr[-2000:]
        return res.stdout

    airflow("db", "migrate")
    # no warehouse pool (REASSEMBLER_WAREHOUSE_POOL unset): the warehouse's locks serialise the
    # writers of the three nights (make airflow, tested in test_demo.py, runs with the pool)
    commands = (["api-server", "--port", str(port)], ["scheduler"], ["dag-processor"])
    service_logs = [home / f"{cmd[0]}.log" for cmd in commands]  # kept to say why one died
    log_files = [log.open("w") for log in service_logs]

    def quiet(fh) -> dict:
        return {"stdout": subprocess.DEVNULL, "stderr": fh}

    def start(cmd: list[str], fh) -> subprocess.Popen:  # a session of its own: stopped with all it starts
        return subprocess.Popen([AIRFLOW, *cmd], env=env, start_new_session=True, **quiet(fh))

    services = [start(cmd, fh) for cmd, fh in zip(commands, log_files)]
    restarted: list[str] = []
    db = home / "airflow.db"

    def query(sql: str, *args) -> list:
        with sqlite3.connect(db, timeout=30) as con:
            return con.execute(sql, args).fetchall()

    def wait_for(condition, what: str, seconds: float = 240):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return
            for k, (p, log) in enumerate(zip(services, service_logs)):
                if p.poll() is None:
                    continue
                said = log.read_text()
                # On SQLite, a CLI command whose transaction is rolled back ("database is
                # locked") can remove a DagRun the scheduler has just read; Airflow's scheduler
                # then exits (ObjectDeletedError), and its supervisor restarts it. Once here.
                if commands[k][0] == "scheduler" and "ObjectDeletedError" in said and not restarted:
                    restarted.append(said)
                    services[k] = start(commands[k], log_files[k])
                    continue
                raise AssertionError(f"Airflow's {log.stem} died: {said[-1500:]}")
            time.sleep(2)
        raise AssertionError(f"timed out waiting for {what}: {query('SELECT run_id, state FROM dag_run')}")

    try:
        wait_for(lambda: query("SELECT 1 FROM dag WHERE dag_id = 'capture_rows_nightly'"), "the DAG to be parsed")
        airflow("dags", "unpause", "capture_rows_nightly")
        wait_for(
            lambda: query(
                "SELECT state FROM task_instance WHERE task_id = 'wait_for_input' AND run_id LIKE "
                "'scheduled__%' AND state = 'up_for_reschedule'"
            ),
            "the late night to wait",
        )
        airflow(
            "backfill",
            "create",
            "--dag-id",
            "capture_rows_nightly",
            "--from-date",  # to-date: up to 00:00
            backfill_logical[0].isoformat(),
            "--to-date",
            (backfill_logical[-1] + timedelta(days=1)).isoformat(),
        )
        wait_for(
            lambda: (
                len(query("SELECT 1 FROM dag_run WHERE run_type = 'backfill' AND state IN ('success', 'failed')")) == 3
            ),
            "the backfill",
        )
        states = dict(query("SELECT run_id, state FROM dag_run WHERE run_type = 'backfill'"))
        assert set(states.values()) == {"success"}, states
        for ds in nights:
            assert pq.read_table(out / "rows" / f"ds={ds}").num_rows > 0
        # the late night is still waiting, not failed, and blocked nothing
        [(state,)] = query("SELECT state FROM dag_run WHERE run_type = 'scheduled'")
        assert state == "running"
        assert not (out / "rows" / f"ds={late_ds}").exists()
        labels = {
            r
            for (r,) in query(
                "SELECT rendered_map_index FROM task_instance WHERE task_id = 'reassemble' AND map_index >= 0"
            )
        }
        assert labels and all(re.fullmatch(r"shard \d+: (no groups|\d+ groups?: .+)", label) for label in labels), (
            labels
        )
        manifest = json.loads((out / "_published" / f"ds={nights[0]}.json").read_text())
        assert manifest["numbers"]["rollouts_in"] == 16

        # The platform engineer changes the output setting on the running deployment (its
        # scheduler and dag-processor restarted with it) while the late night still waits:
        # that run keeps the output it resolved and publishes; a new run takes the new output.
        out2 = tmp_path / "output-2"
        env["REASSEMBLER_OUTPUT"] = str(out2)
        for k, cmd in enumerate(commands):
            if cmd[0] in ("scheduler", "dag-processor"):
                os.killpg(services[k].pid, signal.SIGTERM)
                services[k].wait(timeout=60)
                services[k] = start(cmd, log_files[k])
        synth_night(inp, late_ds, SynthConfig(rollouts=8, seed=50, fault_rate=0.0, max_calls=6))
        wait_for(
            lambda: query("SELECT state FROM dag_run WHERE run_type = 'scheduled' AND state IN ('success', 'failed')"),
            "the late night, once its input came",
            seconds=300,
        )
        [(state,)] = query("SELECT state FROM dag_run WHERE run_type = 'scheduled'")
        failed = query("SELECT task_id FROM task_instance WHERE state = 'failed'")
        assert (state, failed) == ("success", []), failed
        assert pq.read_table(out / "rows" / f"ds={late_ds}").num_rows > 0 and not out2.exists()
        airflow("dags", "trigger", "capture_rows_nightly", "--conf", json.dumps({"ds": nights[0]}))
        wait_for(
            lambda: query("SELECT state FROM dag_run WHERE run_type = 'manual' AND state IN ('success', 'failed')"),
            "a run after the change",
            seconds=300,
        )
        assert query("SELECT state FROM dag_run WHERE run_type = 'manual'") == [("success",)]
        assert pq.read_table(out2 / "rows" / f"ds={nights[0]}").num_rows > 0
        # one asset, every night's event on it, each naming where its rows went
        assert query("SELECT uri FROM asset WHERE name = 'capture_rows'") == [("reassembler://capture_rows/",)]
        assert query("SELECT uri FROM asset_active WHERE name = 'capture_rows'") == [("reassembler://capture_rows/",)]
        partitions = sorted(json.loads(e)["partition"] for (e,) in query("SELECT extra FROM asset_event"))
        assert partitions == sorted(
            [f"{out}/rows/ds={ds}" for ds in [*nights, late_ds]] + [f"{out2}/rows/ds={nights[0]}"]
        )
    finally:
        stop = [sys.executable, str(REPO / "scripts" / "stop_services.py"), "--run-dir", str(home / "services")]
        (home / "services").mkdir(exist_ok=True)
        for cmd, p in zip(commands, services):  # pid and start time, as airflow_services.sh records them
            stat = Path(f"/proc/{p.pid}/stat").read_text() if p.poll() is None else ""
            if stat:
                (home / "services" / f"{cmd[0]}.pid").write_text(f"{p.pid} {stat[stat.rindex(')') + 2 :].split()[19]}")
        subprocess.run(stop, check=False)
        for p in services:
            p.wait(timeout=30)
        for fh in log_files:
            fh.close()
    assert date.fromisoformat(late_ds) > date.fromisoformat(nights[-1])
