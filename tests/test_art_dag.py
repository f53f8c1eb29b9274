"""OpenPipe ART's model folder read from object storage (CONTRACT.md 13): the command with
--layout art on s3://, and the DAG with layout art as a deployment sets it; both build the
fixture night exactly as expected.json says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_art import DS, EXPECTED, MODEL, _as_expected

from commands import cli
from conftest import read_partition


def _upload(s3) -> str:
    root = f"s3://{s3.bucket('art')}/.art/reassembler-fixture/models/agent-001-run"
    s3.upload(MODEL, root)
    return root


def test_the_command_builds_an_art_model_folder_from_s3(tmp_path, s3):
    root = _upload(s3)
    out = tmp_path / "out"
    res = cli("build", "--layout", "art", "--input", root, "--output", out, "--ds", DS)
    assert res.returncode == 0, res.stderr
    audit = {a["rollout_id"]: a for a in read_partition(out, "audit", DS)}
    _as_expected(audit, read_partition(out, "rows", DS))


@pytest.mark.timeout(600)
def test_the_dag_builds_an_art_model_folder_read_from_s3(tmp_path, s3):
    from test_dag import _airflow, _airflow_env

    root = _upload(s3)
    out, home = tmp_path / "output", tmp_path / "airflow"
    home.mkdir()
    env = _airflow_env(home, Path("/nonexistent"), out)
    env.update(REASSEMBLER_INPUT=root, REASSEMBLER_LAYOUT="art")
    _airflow(env, "db", "migrate")
    relaxed = {"ds": DS, "gate_max_mask_rate": None, "gate_max_reason_rate": None, "gate_max_rejects": None}
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "2026-12-07", "-c", json.dumps(relaxed))
    assert "state=success" in log, log[-3000:]
    audit = {a["rollout_id"]: a for a in read_partition(out, "audit", DS)}
    _as_expected(audit, read_partition(out, "rows", DS))
    assert len(audit) == len(EXPECTED)
    page = (out / "reports" / f"ds={DS}" / "index.html").read_text()
    assert "OpenPipe ART" in page
    assert "1 groups whose rewards are all equal (4 rollouts" in page  # step 1's g2
    assert "1 stored as a duplicate of an earlier trajectory of their group" in page  # step 2's g1/t1
