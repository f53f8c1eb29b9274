"""The first hour, as a new user meets it: `make run` tells the truth about the DAG run,
`make airflow` builds the demo night when triggered with the form's defaults and says in a
waiting run's tab what it waits for, and `make airflow-stop` stops everything it started."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
DS = "2026-11-28"
STOP = [sys.executable, str(REPO / "scripts" / "stop_services.py")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def session_members(sid: int) -> list[int]:
    sys.path.insert(0, str(REPO / "scripts"))
    from stop_services import session_members as members

    return members(sid)


def demo_env(tmp_path: Path, **extra: str) -> dict:
    return dict(
        os.environ,
        AIRFLOW_HOME=str(tmp_path / "airflow"),
        REASSEMBLER_INPUT=str(tmp_path / "input"),
        REASSEMBLER_OUTPUT=str(tmp_path / "output"),
        DS=DS,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        **extra,
    )


# ---------------------------------------------------------------- make run


@pytest.mark.timeout(300)
def test_make_run_reports_a_failed_dag_run_as_failed_and_publishes_nothing(tmp_path):
    """With max_mask_rate 0.01 the audit checks fail the run: make run says which task and
    why, exits 1, and prints no path of a published night."""
    env = demo_env(tmp_path, MAKE_RUN_CONF=json.dumps({"max_mask_rate": 0.01}), ROLLOUTS="24")
    res = subprocess.run(["bash", "scripts/make_run.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAILED (state failed)" in res.stdout and "failed task: audit_checks" in res.stdout
    assert f"its last error: airflow.sdk.exceptions.AirflowFailException: night {DS} not published: mask rate" in (
        res.stdout
    )
    assert f"nothing was published for ds={DS}" in res.stdout
    assert "rows:" not in res.stdout and not (tmp_path / "output" / "rows").exists()


@pytest.mark.timeout(300)
def test_make_run_publishes_and_says_where(tmp_path):
    res = subprocess.run(
        ["bash", "scripts/make_run.sh"], cwd=REPO, env=demo_env(tmp_path), capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = tmp_path / "output"
    assert f"rows:      {out}/rows/ds={DS}/" in res.stdout and (out / "rows" / f"ds={DS}").is_dir()
    assert "  rollouts 240 read = 240 loaded + 0 rejected" in res.stdout  # the load's lines, whole
    assert "== published by manual__" in res.stdout
    assert (out / "reports" / f"ds={DS}" / "index.html").exists()


# ---------------------------------------------------------------- make airflow-stop


def _stubborn(tmp_path: Path, name: str, ignore_term: bool) -> int:
    """A service in a session of its own with a child, as airflow_services.sh starts them."""
    code = (
        "import os, signal, subprocess, sys, time\n"
        + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
        + "child = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setpgid(0, 0); time.sleep(600)'])\n"
        + "time.sleep(600)\n"
    )
    proc = subprocess.Popen(["setsid", sys.executable, "-c", code])
    run = tmp_path / "services"
    run.mkdir(exist_ok=True)
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    started = stat[stat.rindex(")") + 2 :].split()[19]
    (run / f"{name}.pid").write_text(f"{proc.pid} {started}\n")
    deadline = time.monotonic() + 10
    while len(session_members(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.pid


def test_stop_terminates_whole_sessions_escalates_to_kill_and_is_idempotent(tmp_path):
    polite, stubborn = _stubborn(tmp_path, "scheduler", False), _stubborn(tmp_path, "triggerer", True)
    assert len(session_members(polite)) == 2 and len(session_members(stubborn)) == 2  # the child left the group
    port = free_port()
    with socket.socket() as server:  # a port one of them listened on, closed as it stops
        server.bind(("127.0.0.1", port))
        server.listen()
        (tmp_path / "services" / "ports").write_text(f"{port}\n")
        busy = subprocess.run(
            [*STOP, "--run-dir", str(tmp_path / "services"), "--wait", "1"], capture_output=True, text=True
        )
    assert busy.returncode == 1 and f"ports [{port}] still answer" in busy.stderr  # not "stopped" while it listens
    assert session_members(polite) == session_members(stubborn) == []
    assert "still running after 1 s: triggerer; sending SIGKILL" in busy.stdout
    again = subprocess.run([*STOP, "--run-dir", str(tmp_path / "services")], capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.strip() == "no Airflow service of this repo is running"
    assert not list((tmp_path / "services").glob("*"))


def test_stop_never_signals_a_pid_another_program_took_over(tmp_path):
    run = tmp_path / "services"
    run.mkdir()
    other = subprocess.Popen(["setsid", "sleep", "60"])
    try:
        (run / "scheduler.pid").write_text(f"{other.pid} 1\n")  # a start time that is not this process's
        res = subprocess.run([*STOP, "--run-dir", str(run)], capture_output=True, text=True)
        assert res.returncode == 0 and other.poll() is None
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()


# ---------------------------------------------------------------- make airflow


def bound_addresses(port: int) -> set[str]:
    """The local addresses a listening TCP socket on `port` is bound to (/proc/net/tcp, tcp6)."""
    found = set()
    for table, ipv6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            if ipv6:
                found.add("::" if set(address) == {"0"} else address)
            else:
                found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


@pytest.mark.timeout(600)
def test_make_airflow_builds_the_demo_night_from_the_forms_defaults_and_stops_everything(tmp_path):
    ports = {
        "AIRFLOW_PORT": free_port(),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": free_port(),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": free_port(),
    }
    env = demo_env(tmp_path, REASSEMBLER_INPUT_POKE_SECONDS="30", **{k: str(v) for k, v in ports.items()})
    home = tmp_path / "airflow"
    started = subprocess.run(
        ["bash", "scripts/airflow_services.sh", "start"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    sessions = {}
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"Trigger it with the form's defaults to build the demo night ds={DS}" in started.stdout
        assert f"wrote the demo night ds={DS}" in started.stdout  # a fresh clone: make airflow writes it
        sessions = {p.stem: int(p.read_text().split()[0]) for p in (home / "services").glob("*.pid")}
        assert set(sessions) == {"api-server", "scheduler", "dag-processor", "triggerer"}
        base = f"http://127.0.0.1:{ports['AIRFLOW_PORT']}"
        password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        body = json.dumps({"username": "admin", "password": password}).encode()
        token_request = urllib.request.Request(f"{base}/auth/token", body, {"Content-Type": "application/json"})
        token = json.load(urllib.request.urlopen(token_request, timeout=30))["access_token"]

        def api(method: str, path: str, payload: dict | None = None):
            data = None if payload is None else json.dumps(payload).encode()
            request = urllib.request.Request(
                f"{base}/api/v2{path}",
                data,
                {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                method=method,
            )
            with urllib.request.urlopen(request, timeout=30) as res:
                return json.load(res)

        deadline = time.monotonic() + 180
        while _get(f"{base}/api/v2/dags/capture_rows_nightly", token)[0] != 200:
            assert time.monotonic() < deadline, "the DAG was never parsed"
            time.sleep(2)
        # what the trigger form does with its defaults: no conf; the form unpauses the DAG, and the
        # scheduler then also starts the latest scheduled night, whose input never comes
        api("PATCH", "/dags/capture_rows_nightly", {"is_paused": False})
        manual = api("POST", "/dags/capture_rows_nightly/dagRuns", {"logical_date": None})["dag_run_id"]

        def runs() -> dict[str, str]:
            return {r["dag_run_id"]: r["state"] for r in api("GET", "/dags/capture_rows_nightly/dagRuns")["dag_runs"]}

        deadline = time.monotonic() + 300
        while runs().get(manual) not in ("success", "failed"):
            assert time.monotonic() < deadline, f"the triggered run did not finish: {runs()}"
            time.sleep(3)
        assert runs()[manual] == "success"
        assert pq.read_table(tmp_path / "output" / "rows" / f"ds={DS}").num_rows > 0
        status, _ = _get(f"{base}/capture-quality/runs/{manual}", token)
        assert status == 200  # followed to the night's report
        # unpausing also started yesterday's scheduled night: its input cannot come, and the demo
        # says so at once (REASSEMBLER_INPUT_WAIT_HOURS=0) instead of waiting 6 hours
        [scheduled] = [r for r in runs() if r.startswith("scheduled__")]
        deadline = time.monotonic() + 180
        while runs().get(scheduled) != "failed":
            assert time.monotonic() < deadline, f"the scheduled night did not fail at once: {runs()}"
            time.sleep(3)
        page = _get(f"{base}/capture-quality/runs/{scheduled}", token)[1]
        assert "wait_for_input" in page and "published nothing" in page, page
        assert page.startswith("<!doctype html>") and '"detail"' not in page  # a page, never raw JSON
        assert any(len(session_members(sid)) > 1 for sid in sessions.values())  # the executor's workers
        # the api-server listens on loopback only, and nothing listens on the log servers' ports
        assert bound_addresses(ports["AIRFLOW_PORT"]) == {"127.0.0.1"}
        assert not listening(ports["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"])
        runs_table = pq.read_table(tmp_path / "output" / "tables" / "runs.parquet").to_pylist()
        assert runs_table and all(r["seconds"] is not None and 0 < r["seconds"] < 600 for r in runs_table)
    finally:
        stopped = subprocess.run(
            ["bash", "scripts/airflow_services.sh", "stop"], cwd=REPO, env=env, capture_output=True, text=True
        )
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "Airflow services stopped: api-server, dag-processor, scheduler, triggerer" in stopped.stdout
    assert {name: session_members(sid) for name, sid in sessions.items()} == {name: [] for name in sessions}
    assert not any(listening(port) for port in ports.values())
    again = subprocess.run(
        ["bash", "scripts/airflow_services.sh", "stop"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert again.returncode == 0 and "no Airflow service of this repo is running" in again.stdout
