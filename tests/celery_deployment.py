"""The Celery deployment of scripts/airflow_celery.sh, started for a test or the benchmark
in a folder of its own (ports free, PostgreSQL's data reachable by `postgres`)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "airflow_celery.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CeleryDeployment:
    def __init__(self, local_input: Path, ds: str, isolate: bool = True, concurrency: int = 1):
        # PostgreSQL runs as `postgres`, which must reach its data under AIRFLOW_HOME
        self.home = Path(tempfile.mkdtemp(prefix="reassembler-celery-"))
        self.home.chmod(0o755)
        self.ports = {name: str(_free_port()) for name in ("AIRFLOW_PORT", "REDIS_PORT", "PG_PORT", "S3_PORT")}
        self.script_env = {
            **os.environ,
            **self.ports,
            "AIRFLOW_HOME": str(self.home),
            "LOCAL_INPUT": str(local_input),
            "DS": ds,
            "ISOLATE": "1" if isolate else "0",
            "WORKER_CONCURRENCY": str(concurrency),
        }
        self.started = subprocess.run(
            ["bash", str(SCRIPT), "start"], env=self.script_env, capture_output=True, text=True, timeout=300
        )
        self.celery_dir = self.home / "celery"

    @property
    def env(self) -> dict:
        """The environment the script wrote for a shell ($AIRFLOW_HOME/celery/env.sh)."""
        env = dict(os.environ)
        for line in (self.celery_dir / "env.sh").read_text().splitlines():
            if line.startswith("declare -x "):
                name, _, value = line[len("declare -x ") :].partition("=")
                env[name] = shlex.split(value)[0] if value else ""
        env["PATH"] = f"{REPO / '.venv' / 'bin'}:{env['PATH']}"
        return env

    def airflow(self, *args: str) -> str:
        res = subprocess.run(["airflow", *args], env=self.env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, (args, res.stdout[-2000:], res.stderr[-2000:])
        return res.stdout

    def query(self, sql: str) -> list[list[str]]:
        """Rows of the metadata DB, as an operator would look at them."""
        psql = ["psql", "-h", "127.0.0.1", "-p", self.ports["PG_PORT"], "-U", "postgres", "-d", "airflow"]
        out = subprocess.run([*psql, "-At", "-F", "|", "-c", sql], capture_output=True, text=True).stdout
        return [line.split("|") for line in out.split("\n") if line]

    def run_night(self, run_id: str, conf: dict, timeout: float = 600) -> str | None:
        """Trigger a run and wait for its end; its state."""
        self.airflow("dags", "unpause", "capture_rows_nightly")
        self.airflow("dags", "trigger", "capture_rows_nightly", "-c", json.dumps(conf), "-r", run_id)
        deadline, state = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            [[state]] = self.query(f"SELECT state FROM dag_run WHERE run_id = '{run_id}'") or [[None]]
            if state in ("success", "failed"):
                break
            time.sleep(2)
        return state

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=self.script_env, timeout=120, capture_output=True)
        shutil.rmtree(self.home, ignore_errors=True)
