"""The DAG on a night NeMo Gym's compaction agent wrote (CONTRACT.md 11), read from object
storage in Gym's own folder layout as a deployment points at it; and the command on the same
files from S3: built as the expected outcome says, explained from there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commands import cli
from conftest import read_partition

FIXTURE = Path(__file__).parent / "data" / "gym-0.7.0-compaction"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
DS = EXPECTED["ds"]
WANT_ROWS = {r["row_id"]: r["input_ids"] for e in EXPECTED["rollouts"] for r in e.get("rows", [])}
WANT_AUDIT = {e["rollout_id"]: (e["status"], e["reason"]) for e in EXPECTED["rollouts"]}


def _upload(s3, tmp_path: Path, torn: bool = True) -> str:
    """Gym's results folder of the night on the S3 server: `<root>/<ds>/rollouts.jsonl` with its
    sidecars; no token_id_capture or staged folder (the compaction agent's lines carry every
    call's tokens). `torn` False: without the torn final line of the crash, as a finished run
    leaves it (the DAG's sensor waits for a results file whose last line is whole)."""
    night = tmp_path / "gym" / DS
    night.mkdir(parents=True)
    for f in (FIXTURE / "rollouts" / f"ds={DS}").iterdir():
        data = f.read_bytes()
        if not torn and f.name == "rollouts.jsonl":
            data = data[: data.rindex(b"\n") + 1]
        (night / f.name).write_bytes(data)
    root = f"s3://{s3.bucket('gym')}/results"
    s3.upload(night, f"{root}/{DS}")
    return root


def test_the_command_builds_an_envelope_night_from_s3_in_gyms_layout(tmp_path, s3):
    root = _upload(s3, tmp_path)
    out = tmp_path / "out"
    res = cli("build", "--layout", "gym", "--input", root + "/{ds}", "--output", out, "--ds", DS)
    assert res.returncode == 0, res.stderr
    assert {r["row_id"]: r["input_ids"] for r in read_partition(out, "rows", DS)} == WANT_ROWS
    audit = {a["rollout_id"]: (a["status"], a["reason"]) for a in read_partition(out, "audit", DS)}
    assert audit == WANT_AUDIT
    res = cli("explain", "--output", out, "--ds", DS, "8-2")
    assert res.returncode == 0, res.stderr
    assert "boundary event" in res.stdout and "result: ok, 3 rows" in res.stdout


@pytest.mark.timeout(600)
def test_the_dag_builds_an_envelope_night_read_from_s3(tmp_path, s3):
    from test_dag import _airflow, _airflow_env

    root = _upload(s3, tmp_path, torn=False)
    out, home = tmp_path / "output", tmp_path / "airflow"
    home.mkdir()
    env = _airflow_env(home, Path("/nonexistent"), out)
    env.update(REASSEMBLER_INPUT=root + "/{ds}", REASSEMBLER_LAYOUT="gym")
    _airflow(env, "db", "migrate")
    relaxed = {"ds": DS, "gate_max_mask_rate": None, "gate_max_reason_rate": None, "gate_max_rejects": None}
    log = _airflow(env, "dags", "test", "capture_rows_nightly", "2026-12-03", "-c", json.dumps(relaxed))
    assert "state=success" in log, log[-3000:]
    rows = read_partition(out, "rows", DS)
    assert {r["row_id"]: r["input_ids"] for r in rows} == WANT_ROWS
    assert {(r["capture"], r["evidence"]) for r in rows} == {("envelope", "digest")}
    audit = {a["rollout_id"]: (a["status"], a["reason"]) for a in read_partition(out, "audit", DS)}
    assert audit == WANT_AUDIT
    page = (out / "reports" / f"ds={DS}" / "index.html").read_text()
    assert "Gym compaction envelope" in page
