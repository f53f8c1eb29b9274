"""The DAG on a real Celery deployment, as `make airflow-celery` starts it (scripts/
airflow_celery.sh): Redis and PostgreSQL from Debian, moto's S3 server, the scheduler,
dag-processor and api-server, and two Celery workers, each in a mount namespace of its own
where the other worker's folder is an empty tmpfs, so that they cannot share a local file.
A triggered night succeeds; its shards ran on both workers, every task that opens the
warehouse on the warehouse worker; its rows equal a local build's."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
DS = "2026-11-28"
WAREHOUSE_TASKS = {"load_ledger", "audit_checks", "publish", "quality_report", "quality_gate"}

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and not os.environ.get("REASSEMBLER_REQUIRE_MOUNTS"),
    reason="the workers' mount namespaces need root",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _deployment_env(celery_dir: Path) -> dict:
    """The environment the script wrote for a shell ($AIRFLOW_HOME/celery/env.sh)."""
    env = dict(os.environ)
    for line in (celery_dir / "env.sh").read_text().splitlines():
        if line.startswith("declare -x "):
            name, _, value = line[len("declare -x ") :].partition("=")
            env[name] = shlex.split(value)[0] if value else ""
    env["PATH"] = f"{REPO / '.venv' / 'bin'}:{env['PATH']}"
    return env


def _airflow(env: dict, *args: str) -> str:
    res = subprocess.run(["airflow", *args], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, (args, res.stdout[-2000:], res.stderr[-2000:])
    return res.stdout


@pytest.mark.timeout(900)
def test_a_night_on_two_celery_workers_that_share_only_object_storage(tmp_path):
    from reassembler.build import build_night
    from reassembler.producer.synth import SynthConfig, synth_night

    # PostgreSQL runs as `postgres`, which must reach its data under AIRFLOW_HOME (pytest's
    # temporary folders are private to root)
    home = Path(tempfile.mkdtemp(prefix="reassembler-celery-"))
    home.chmod(0o755)
    local_input = tmp_path / "input"
    synth_night(local_input, DS, SynthConfig(rollouts=48, seed=11))
    ports = {name: str(_free_port()) for name in ("AIRFLOW_PORT", "REDIS_PORT", "PG_PORT", "S3_PORT")}
    script_env = {
        **os.environ,
        **ports,
        "AIRFLOW_HOME": str(home),
        "LOCAL_INPUT": str(local_input),
        "DS": DS,
        "ISOLATE": "1",
        "WORKER_CONCURRENCY": "1",
    }
    start = subprocess.run(
        ["bash", str(REPO / "scripts" / "airflow_celery.sh"), "start"],
        env=script_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert start.returncode == 0, (start.stdout[-3000:], start.stderr[-3000:])
        assert "Airflow on Celery is up" in start.stdout
        celery_dir = home / "celery"
        env = _deployment_env(celery_dir)
        # worker-2 cannot see worker-1's folder (where the warehouse is): an empty tmpfs there
        worker2 = int((home / "services" / "worker-2.pid").read_text().split()[0])
        seen = subprocess.run(
            ["nsenter", "-t", str(worker2), "-m", "ls", "-A", str(celery_dir / "worker-1")],
            capture_output=True,
            text=True,
        )
        assert seen.returncode == 0 and seen.stdout.strip() == "", seen
        _airflow(env, "dags", "unpause", "capture_rows_nightly")
        conf = {"ds": DS, "shards": 4, "gate_max_mask_rate": None, "gate_max_reason_rate": None}
        _airflow(env, "dags", "trigger", "capture_rows_nightly", "-c", json.dumps(conf), "-r", "celery_night")

        def query(sql: str) -> list[list[str]]:  # the metadata DB, as an operator would look
            psql = ["psql", "-h", "127.0.0.1", "-p", ports["PG_PORT"], "-U", "postgres", "-d", "airflow"]
            out = subprocess.run([*psql, "-At", "-F", "|", "-c", sql], capture_output=True, text=True).stdout
            return [line.split("|") for line in out.split()]

        deadline, state = time.monotonic() + 600, None
        while time.monotonic() < deadline:
            [[state]] = query("SELECT state FROM dag_run WHERE run_id = 'celery_night'") or [[None]]
            if state in ("success", "failed"):
                break
            time.sleep(3)
        tasks = query(
            "SELECT task_id, map_index, hostname, queue, state FROM task_instance "
            "WHERE run_id = 'celery_night' ORDER BY task_id, map_index"
        )
        assert state == "success", (state, tasks)
        shards = {host for task, _, host, _, _ in tasks if task == "reassemble"}
        assert shards == {"worker-1", "worker-2"}, tasks  # the shards ran on both workers
        for task, _, host, queue, _ in tasks:
            if task in WAREHOUSE_TASKS:  # and every task that opens the warehouse on its worker
                assert (host, queue) == ("worker-1", "warehouse"), (task, host, queue)
        assert (celery_dir / "worker-1" / "warehouse.duckdb").exists()
        assert not list((celery_dir / "worker-2").rglob("*.duckdb"))
        # the rows equal a local build's
        mirror = tmp_path / "mirror"
        subprocess.run(
            [sys.executable, "-c", _DOWNLOAD, "s3://rows/nightly", str(mirror)], env=env, check=True, timeout=120
        )
        build_night(local_input, tmp_path / "local", DS)
        for kind in ("rows", "audit"):
            a = pq.read_table(tmp_path / "local" / kind / f"ds={DS}", partitioning=None)
            b = pq.read_table(mirror / kind / f"ds={DS}", partitioning=None)
            if kind == "audit":
                a, b = a.drop_columns(["run_id"]), b.drop_columns(["run_id"])
            assert sorted(a.to_pylist(), key=str) == sorted(b.to_pylist(), key=str)
    finally:
        subprocess.run(["bash", str(REPO / "scripts" / "airflow_celery.sh"), "stop"], env=script_env, timeout=120)
        shutil.rmtree(home, ignore_errors=True)


_DOWNLOAD = """
import sys
from pathlib import Path
from reassembler import storage
uri, folder = sys.argv[1:3]
for rel in storage.list_files(uri, "", recursive=True):
    target = Path(folder) / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(storage.read_bytes(storage.join(uri, rel)))
"""
