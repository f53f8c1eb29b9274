"""A night written by NeMo Gym 0.7.0's own capture code (tests/data/gym-0.7.0/, see its
README), built as it is in all three builds and compared rollout by rollout with the
expected outcomes shipped beside it: status, reason, audit counters, and every row's
tokens byte for byte through their digests."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import read_partition
from reassembler.build import build_night
from reassembler.settings import Options, Settings

FIXTURE = Path(__file__).parent / "data" / "gym-0.7.0"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
DS = EXPECTED["ds"]
BUILDS = {"select": Options(), "strict": Options(offchain="strict"), "terminal": Options(mode="terminal")}
PACKING = {"input_ids": "<i4", "loss_mask": "<i1", "logprobs": "<f4"}


def _digest(values, dtype: str) -> dict:
    return {"len": len(values), "sha256": hashlib.sha256(np.asarray(values, dtype=dtype).tobytes()).hexdigest()}


@pytest.fixture(scope="module", params=list(BUILDS))
def built(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"gym-{request.param}")
    summary = build_night(FIXTURE, out, DS, Settings(options=BUILDS[request.param]))
    rows = read_partition(out, "rows", DS)
    audit = {a["rollout_id"]: a for a in read_partition(out, "audit", DS)}
    return request.param, summary, rows, audit


def test_the_night_reads_without_conversion(built):
    _, summary, _, audit = built
    assert summary.load.n_rejects == 0
    assert summary.load.n_rollouts == len(EXPECTED["rollouts"]) == len(audit)
    # the flat capture folder: lock files are no ledger files; every lineage row loaded
    n_lines = sum(1 for f in (FIXTURE / "ledger" / f"ds={DS}").glob("*.lineage.jsonl") for _ in open(f))
    assert summary.load.n_ledger_rows == n_lines


@pytest.mark.parametrize("expected", EXPECTED["rollouts"], ids=lambda e: e["rollout_id"])
def test_every_rollout_as_expected(built, expected):
    build, _, rows, audit = built
    want = expected[build]
    got = audit[expected["rollout_id"]]
    assert (got["group_id"], got["slot"], got["reward"]) == (expected["group_id"], expected["slot"], expected["reward"])
    assert got["n_ledger_calls"] == expected["n_ledger_calls"]
    assert got["n_roots"] == expected["n_roots"]
    assert (got["status"], got["reason"]) == (want["status"], want["reason"])
    for key in ("n_selected", "n_segments", "n_offchain", "n_offchain_faults", "n_tokens", "n_generated"):
        if key in want:
            assert got[key] == want[key], key
    if "advantage" in want:
        assert got["advantage"] == pytest.approx(want["advantage"], abs=1e-9)
    mine = [r for r in rows if r["rollout_id"] == expected["rollout_id"]]
    assert len(mine) == len(want.get("rows", []))
    for row, exp in zip(mine, want.get("rows", [])):
        assert row["row_id"] == exp["row_id"]
        assert row["model_call_ids"] == exp["model_call_ids"]
        assert row["prompt_len"] == exp["prompt_len"]
        assert (row["weight_version_min"], row["weight_version_max"]) == (
            exp["weight_version_min"],
            exp["weight_version_max"],
        )
        for column, dtype in PACKING.items():
            assert _digest(row[column], dtype) == exp[column], column


def test_a_local_mode_token_file_beside_the_lineage_is_mixed_capture(tmp_path):
    """Gym never writes <rollout_id>.tokens.jsonl beside a lineage file of the same rollout
    (CONTRACT.md 9.2): a rollout with both is masked mixed_capture and neither is read; a
    companion file beside the lineage (an intents file) changes nothing."""
    copy = tmp_path / "capture"
    shutil.copytree(FIXTURE, copy)
    folder = copy / "ledger" / f"ds={DS}"
    (folder / "0-0.tokens.jsonl").write_text('{"prompt_token_ids": [1, 2]}\n')
    (folder / "0-1.tokens.intents").write_text("whatever\n")
    summary = build_night(copy, tmp_path / "out", DS)
    assert summary.load.n_rejects == 0  # no ledger file either: not a reject
    audit = {a["rollout_id"]: a for a in read_partition(tmp_path / "out", "audit", DS)}
    assert (audit["0-0"]["reason"], audit["0-0"]["detail"]) == (
        "mixed_capture",
        "ledger rows and 0-0.tokens.jsonl: neither is read",
    )
    want = {r["rollout_id"]: r["select"] for r in EXPECTED["rollouts"]}
    for rollout_id, got in audit.items():
        if rollout_id != "0-0":
            assert (got["status"], got["reason"]) == (want[rollout_id]["status"], want[rollout_id]["reason"])
