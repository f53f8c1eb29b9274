"""`reassembler explain` points at the evidence: for every reason code a synth night masks, and
for every masked rollout of the fixture nights the producers wrote, it names the file and line
(or the capture files) an engineer opens, and the value that failed (the detail); and its rows
are the published rows' calls."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from reassembler.audit.explain import explain
from reassembler.build import build_night
from reassembler.producer.config import SynthConfig
from reassembler.producer.synth import synth_night

DATA = Path(__file__).parent / "data"
LOCATED = re.compile(r"^/\S+:\d+ \(|^/\S+ \(NeMo Gym's capture file")


def _check_night(out: Path, ds: str) -> set[str]:
    audit = pq.read_table(out / "audit" / f"ds={ds}").to_pylist()
    rows = pq.read_table(out / "rows" / f"ds={ds}").to_pylist()
    reasons = set()
    for a in audit:
        replay = explain(out, ds, a["rollout_id"])
        if a["status"] == "ok":  # explain and the rows agree, every capture
            want = [r["model_call_ids"] for r in rows if r["rollout_id"] == a["rollout_id"]]
            assert [r["calls"] for r in replay.rows] == want, a["rollout_id"]
            continue
        evidence = replay.result["evidence"]
        assert evidence and all(LOCATED.match(e) for e in evidence), (a["reason"], evidence)
        assert replay.result["detail"] == a["detail"] and "open: " in replay.text()
        reasons.add(a["reason"])
    return reasons


def test_every_reason_of_a_synth_night_names_where_to_look(tmp_path):
    ds = "2026-11-28"
    cfg = SynthConfig(
        rollouts=260,
        seed=11,
        fault_rate=0.5,
        min_calls=5,
        max_calls=10,
        prompt_tokens=(20, 60),
        observation_tokens=(3, 30),
        generated_tokens=(2, 25),
    )
    synth_night(tmp_path / "in", ds, cfg)
    build_night(tmp_path / "in", tmp_path / "out", ds)
    reasons = _check_night(tmp_path / "out", ds)
    assert len(reasons) >= 25, sorted(reasons)  # nearly every code of contract 3.7 is on this night


@pytest.mark.parametrize("fixture", ["gym-0.7.0", "gym-0.7.0-local", "verifiers-0.4.0", "gym-0.7.0-compaction"])
def test_every_masked_rollout_of_each_fixture_names_where_to_look(tmp_path, fixture):
    import json

    ds = json.loads((DATA / fixture / "expected.json").read_text())["ds"]
    build_night(DATA / fixture, tmp_path / "out", ds)
    _check_night(tmp_path / "out", ds)
