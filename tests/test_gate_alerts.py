"""The quality gate as a monitoring system reads it: `reassembler gate --json` (README, Alerts),
the rate checks' minimum night, and a crash-torn final line that is a reject row, not a
failed night. The producers' own sample nights pass the default gate."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from commands import cli
from reassembler.errors import EXIT_GATE

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SAMPLES = ["gym-0.7.0", "gym-0.7.0-local", "gym-0.7.0-compaction", "verifiers-0.4.0"]


def _ds(sample: str) -> str:
    return json.loads((DATA / sample / "expected.json").read_text())["ds"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Each sample night built once (read-only for the tests below)."""
    outs = {}
    for sample in SAMPLES:
        out = tmp_path_factory.mktemp(sample) / "out"
        res = cli("build", "--input", DATA / sample, "--output", out, "--ds", _ds(sample))
        assert res.returncode == 0, res.stderr
        outs[sample] = out
    return outs


def _gate(out: Path, ds: str, *extra: str) -> tuple[int, dict]:
    res = cli("gate", "--output", out, "--ds", ds, "--json", *extra)
    assert res.stderr == "", res.stderr  # the JSON is the whole answer, on stdout
    return res.returncode, json.loads(res.stdout)


@pytest.mark.parametrize("sample", SAMPLES)
def test_the_producers_sample_nights_pass_the_default_gate(built, sample):
    code, doc = _gate(built[sample], _ds(sample))
    assert code == 0 and doc["exit_code"] == 0 and doc["verdict"] in ("ok", "warn")
    assert not [c for c in doc["checks"] if c["level"] == "breach"]


def test_the_json_gives_each_checks_value_limit_level_and_margin_and_the_verdict(built):
    out, ds = built["verifiers-0.4.0"], _ds("verifiers-0.4.0")  # 6 rollouts, 3 masked, a torn final line
    code, doc = _gate(out, ds, "--min-rollouts", "6")
    assert code == EXIT_GATE == doc["exit_code"] and doc["verdict"] == "breached"
    assert (doc["version"], doc["ds"], doc["min_rollouts"]) == (1, ds, 6)
    by = {c["check"]: c for c in doc["checks"]}
    assert set(by) == {
        "mask_rate",
        "reason:length_mismatch",
        "reason:missing_tokens",
        "reason:rollout_failed",
        "rejects",
        "torn_final_lines",
    }
    mask = by["mask_rate"]
    assert (mask["value"], mask["limit"], mask["level"]) == (0.5, 0.2, "breach")
    assert mask["margin"] == pytest.approx(-0.3) and mask["message"] == "mask rate 0.500 (3/6) > 0.200"
    # the torn final line: rejected, counted apart, a warning without a limit
    assert (by["rejects"]["value"], by["rejects"]["level"]) == (0, "ok")
    torn = by["torn_final_lines"]
    assert (torn["value"], torn["limit"], torn["margin"], torn["level"]) == (1, None, None, "warn")
    # the same checks without --json: one line each, the same exit code
    res = cli("gate", "--output", out, "--ds", ds, "--min-rollouts", "6")
    assert res.returncode == EXIT_GATE and res.stderr.startswith("reassembler: quality gate breached")
    assert "warn   torn_final_lines                          1 against limit       -, margin -" in res.stdout


def test_a_rate_over_its_limit_on_a_night_under_the_minimum_warns(built):
    out, ds = built["gym-0.7.0-local"], _ds("gym-0.7.0-local")  # 2 of 6 rollouts masked
    code, doc = _gate(out, ds, "--min-rollouts", "7")
    mask = next(c for c in doc["checks"] if c["check"] == "mask_rate")
    assert code == 0 and doc["verdict"] == "warn" and mask["level"] == "warn"
    assert mask["message"].endswith("(warns only: 6 rollouts, under the gate's minimum of 7)")
    code, doc = _gate(out, ds, "--min-rollouts", "6")  # at the minimum: the rates judge the night
    assert code == EXIT_GATE and doc["verdict"] == "breached"
    assert {c["check"] for c in doc["checks"] if c["level"] == "breach"} == {
        "mask_rate",
        "reason:capture_incomplete",
        "reason:digest_mismatch",
    }


def test_a_crash_torn_final_line_of_a_results_file_is_a_reject_row_not_a_failed_night(built, tmp_path):
    """NeMo Gym's compaction sample: its results file ends mid-line (the producer killed)."""
    out, ds = built["gym-0.7.0-compaction"], _ds("gym-0.7.0-compaction")
    code, doc = _gate(out, ds)
    by = {c["check"]: c for c in doc["checks"]}
    assert code == 0 and by["rejects"]["value"] == 0 and by["torn_final_lines"]["value"] == 1
    # another rejected line (a whole line that is not JSON) still counts against max_rejects
    inp = tmp_path / "in"
    shutil.copytree(DATA / "gym-0.7.0-compaction", inp)
    [results] = (inp / "rollouts").rglob("rollouts.jsonl")
    torn = results.read_bytes()
    cut = torn.rindex(b"\n") + 1
    results.write_bytes(torn[:cut] + b"{not json\n" + torn[cut:])
    res = cli("build", "--input", inp, "--output", tmp_path / "out", "--ds", ds)
    assert res.returncode == 0, res.stderr
    code, doc = _gate(tmp_path / "out", ds)
    by = {c["check"]: c for c in doc["checks"]}
    assert code == EXIT_GATE and (by["rejects"]["value"], by["rejects"]["level"]) == (1, "breach")
    assert by["rejects"]["message"] == "1 rejected input lines (and 1 torn) > 0"
    assert by["torn_final_lines"]["value"] == 1


def test_a_gate_on_an_output_nothing_was_built_into_writes_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    res = cli("gate", "--output", out, "--ds", "2026-11-27")
    assert res.returncode == 2 and res.stderr.strip() == (
        f"reassembler: error: {out / 'warehouse.duckdb'}: no warehouse here; run `reassembler build` first"
    )
    assert list(out.iterdir()) == []  # no warehouse, no per-call folders, no lock


def test_a_check_warns_from_80_percent_of_its_limit_and_breaches_only_past_it():
    """The rejects check against a limit of 10: 7 ok, exactly 8 (80%) warn, 10 (the limit)
    warn, 11 breach; a limit of 0 never warns (0 is ok, 1 breaches)."""
    from reassembler.audit.quality import gate, gate_checks
    from reassembler.settings import Thresholds

    only_rejects = Thresholds(max_mask_rate=None, max_reason_rate=None, max_mask_rate_rise=None, max_rejects=10)
    levels = {}
    for n in (7, 8, 10, 11):
        quality = {"night": {"rollouts": 100, "mask_rate": 0.0, "masked": 0, "rejects": n}, "reasons": []}
        [c] = gate_checks(quality, only_rejects)
        levels[n] = (c["status"], c["margin"])
    assert levels == {7: ("ok", 3), 8: ("warn", 2), 10: ("warn", 0), 11: ("breach", -1)}
    zero = dataclasses.replace(only_rejects, max_rejects=0)
    for n, status in ((0, "ok"), (1, "breach")):
        quality = {"night": {"rollouts": 100, "mask_rate": 0.0, "masked": 0, "rejects": n}, "reasons": []}
        assert [c["status"] for c in gate_checks(quality, zero)] == [status]
        assert len(gate(quality, zero)) == (status == "breach")


def test_a_verdict_recorded_without_statuses_lists_its_checks_as_breaches():
    """A verdict an older release recorded lists only its breaches, without a status: each is
    a breach, never a pass; a recorded ok or warn is not."""
    from reassembler.audit.quality import breaches_of

    old = [{"check": "mask_rate", "value": 0.3, "threshold": 0.2}]
    assert breaches_of(old) == old
    new = [{"check": "a", "status": "ok"}, {"check": "b", "status": "warn"}, {"check": "c", "status": "breach"}]
    assert [c["check"] for c in breaches_of(new)] == ["c"]
