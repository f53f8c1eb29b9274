"""The DAG on a real Celery deployment, as `make airflow-celery` starts it (scripts/
airflow_celery.sh): Redis and PostgreSQL from Debian, moto's S3 server, the scheduler,
dag-processor and api-server, and two Celery workers, each in a mount namespace of its own
where the other worker's folder is an empty tmpfs, so that they cannot share a local file.
A triggered night succeeds; its load parts, merge buckets and shards ran on both workers, every task that opens the
warehouse on the warehouse worker; its rows equal a local build's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from celery_deployment import CeleryDeployment
from s3server import download

REPO = Path(__file__).resolve().parents[1]
DS = "2026-11-28"
WAREHOUSE_TASKS = {"load_ledger", "audit_checks", "publish", "quality_report", "quality_gate"}

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and not os.environ.get("REASSEMBLER_REQUIRE_MOUNTS"),
    reason="the workers' mount namespaces need root",
)


@pytest.mark.timeout(900)
def test_a_night_on_two_celery_workers_that_share_only_object_storage(tmp_path, monkeypatch):
    from reassembler.build import build_night
    from reassembler.producer.synth import SynthConfig, synth_night

    local_input = tmp_path / "input"
    synth_night(local_input, DS, SynthConfig(rollouts=48, seed=11))
    deployment = CeleryDeployment(local_input, DS)
    try:
        started = deployment.started
        assert started.returncode == 0, (started.stdout[-3000:], started.stderr[-3000:])
        assert "Airflow on Celery is up" in started.stdout
        celery_dir = deployment.celery_dir
        # worker-2 cannot see worker-1's folder (where the warehouse is): an empty tmpfs there
        worker2 = int((deployment.home / "services" / "worker-2.pid").read_text().split()[0])
        look = ["nsenter", "-t", str(worker2), "-m", "ls", "-A", str(celery_dir / "worker-1")]
        seen = subprocess.run(look, capture_output=True, text=True)
        assert seen.returncode == 0 and seen.stdout.strip() == "", seen
        conf = {
            "ds": DS,
            "shards": 4,
            "load_parts": 4,
            "merge_buckets": 6,
            "gate_max_mask_rate": None,
            "gate_max_reason_rate": None,
        }
        state = deployment.run_night("celery_night", conf)
        tasks = deployment.query(
            "SELECT task_id, map_index, hostname, queue, state FROM task_instance "
            "WHERE run_id = 'celery_night' ORDER BY task_id, map_index"
        )
        failed = [t for t, *_, st in tasks if st == "failed"]
        logs = [log.read_text()[-2500:] for t in failed for log in deployment.home.rglob(f"task_id={t}/*.log")]
        assert state == "success", (state, tasks, logs)
        shards = {host for task, _, host, _, _ in tasks if task == "reassemble"}
        assert shards == {"worker-1", "worker-2"}, tasks  # the shards ran on both workers
        parts = {host for task, _, host, _, _ in tasks if task == "load_part"}
        assert parts == {"worker-1", "worker-2"}, tasks  # and so did the load's parts
        # and the merge's bucket tasks (key and rollout buckets: which worker takes which is Celery's choice)
        merged = {host for task, _, host, _, _ in tasks if task in ("merge_keys", "merge_bucket")}
        assert merged == {"worker-1", "worker-2"}, tasks
        for task, _, host, queue, _ in tasks:
            if task in WAREHOUSE_TASKS:  # and every task that opens the warehouse on its worker
                assert (host, queue) == ("worker-1", "warehouse"), (task, host, queue)
        assert (celery_dir / "worker-1" / "warehouse.duckdb").exists()
        assert not list((celery_dir / "worker-2").rglob("*.duckdb"))
        # the rows equal a local build's
        mirror = tmp_path / "mirror"
        for name, value in deployment.env.items():
            if name.startswith("AWS_"):
                monkeypatch.setenv(name, value)
        download("s3://rows/nightly", mirror)
        build_night(local_input, tmp_path / "local", DS)
        for kind in ("rows", "audit"):
            a = pq.read_table(tmp_path / "local" / kind / f"ds={DS}", partitioning=None)
            b = pq.read_table(mirror / kind / f"ds={DS}", partitioning=None)
            if kind == "audit":
                a, b = a.drop_columns(["run_id"]), b.drop_columns(["run_id"])
            assert sorted(a.to_pylist(), key=str) == sorted(b.to_pylist(), key=str)
    finally:
        deployment.stop()
