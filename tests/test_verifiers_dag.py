"""The DAG on a verifiers night (CONTRACT.md 10): the fixture night verifiers wrote, read
from a run folder as a deployment points at it, builds as its expected outcome says."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import read_partition

FIXTURE = Path(__file__).parent / "data" / "verifiers-0.4.0"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
DS = EXPECTED["ds"]


@pytest.mark.timeout(600)
def test_the_dag_builds_a_verifiers_run_pointed_at_by_one_setting(tmp_path):
    """A deployment reading verifiers' run folders as they are: REASSEMBLER_ROLLOUTS names
    their traces files (a glob under the input root); no ledger or tokens folder exists."""
    from test_dag import _airflow, _airflow_env

    runs, out, home = tmp_path / "runs", tmp_path / "output", tmp_path / "airflow"
    home.mkdir()
    (runs / DS / "rl-7f3a").mkdir(parents=True)
    shutil.copy(FIXTURE / "rollouts" / f"ds={DS}" / "traces.jsonl", runs / DS / "rl-7f3a" / "traces.jsonl")
    env = _airflow_env(home, runs, out)
    env["REASSEMBLER_ROLLOUTS"] = "{input}/{ds}/*/traces.jsonl"
    _airflow(env, "db", "migrate")
    relaxed = {"ds": DS, "gate_max_mask_rate": None, "gate_max_reason_rate": None, "gate_max_rejects": None}
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "2026-12-02", "-c", json.dumps(relaxed))
    assert "state=success" in log, log[-3000:]
    audit = {a["rollout_id"]: a for a in read_partition(out, "audit", DS)}
    assert {rid: (a["status"], a["reason"]) for rid, a in audit.items()} == {
        e["rollout_id"]: (e["status"], e["reason"]) for e in EXPECTED["rollouts"]
    }
    rows = read_partition(out, "rows", DS)
    want = {r["row_id"]: r["input_ids"] for e in EXPECTED["rollouts"] for r in e.get("rows", [])}
    assert {r["row_id"]: r["input_ids"] for r in rows} == want
    page = (out / "reports" / f"ds={DS}" / "index.html").read_text()
    assert "verifiers trace" in page and f"{runs}/{DS}/*/traces.jsonl" in page  # the report names where it read
