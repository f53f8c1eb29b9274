"""scripts/benchmark.py's comparison with an earlier revision (the throughput goal): the
revision is taken from git history, writes its own night, and both builds run on it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("benchmark", REPO / "scripts" / "benchmark.py")
assert spec is not None and spec.loader is not None
benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmark)


def _in_history(rev: str) -> bool:
    done = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{rev}^{{commit}}"], capture_output=True)
    return done.returncode == 0


def test_a_revision_not_in_the_history_is_skipped(tmp_path):
    assert benchmark.against(tmp_path, "0" * 40, 1e5, 1, reuse=False) is None
    assert not (tmp_path / f"rev-{'0' * 40}-night").exists()


@pytest.mark.skipif(not _in_history(benchmark.AGAINST), reason="a clone without that revision (shallow)")
def test_both_builds_run_on_the_revisions_own_night(tmp_path):
    vs = benchmark.against(tmp_path, benchmark.AGAINST, 2e5, 1, reuse=False)
    assert vs is not None
    night = tmp_path / f"rev-{benchmark.AGAINST}-night"
    files = sorted((night / "input" / "tokens" / f"ds={benchmark.DS}").glob("*.parquet"))
    assert files and vs["tokens"] == sum(benchmark._tokens(f) for f in files) > 0
    # each build ran from its own source: that revision's warehouse has no column this
    # checkout added since (where the rollout came from, CONTRACT.md 5.3)
    for output, has_evidence in (("output-rev", False), ("output", True)):
        with duckdb.connect(str(night / output / "warehouse.duckdb"), read_only=True) as con:
            columns = {
                name
                for (name,) in con.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE table_name = 'rollouts'"
                ).fetchall()
            }
        assert ("evidence" in columns) == has_evidence
    # both builds published every rollout of that night
    outcomes = night / "input" / "_expected" / f"ds={benchmark.DS}" / "outcomes.jsonl"
    expected = {json.loads(line)["rollout_id"] for line in outcomes.read_text().splitlines()}
    for output in ("output-rev", "output"):
        audit = pq.read_table(night / output / "audit" / f"ds={benchmark.DS}", columns=["rollout_id"])
        assert set(audit.column("rollout_id").to_pylist()) == expected
    assert len(vs["ratios"]) == 1 and vs["theirs"] > 0 and vs["ours"] > 0
    # --reuse keeps a night of the same size, and writes it again for another size
    written = files[0].stat().st_mtime_ns
    benchmark.against(tmp_path, benchmark.AGAINST, 2e5, 1, reuse=True)
    assert files[0].stat().st_mtime_ns == written
    benchmark.against(tmp_path, benchmark.AGAINST, 3e5, 1, reuse=True)
    assert (night / "rollouts.txt").read_text() == "12"


def test_interleaved_runs_alternate_which_goes_first():
    """Each round runs both, back to back, the first one first in even rounds and second in
    odd ones; the results come back per side, in round order."""
    log: list[str] = []

    def run(name: str):
        def one() -> str:
            log.append(name)
            return f"{name}{sum(n == name for n in log)}"

        return one

    floors, builds = benchmark.interleaved(3, run("floor"), run("build"))
    assert log == ["floor", "build", "build", "floor", "floor", "build"]
    assert floors == ["floor1", "floor2", "floor3"] and builds == ["build1", "build2", "build3"]


def test_the_local_mode_comparison_builds_one_night_in_both_of_gyms_forms(tmp_path, capsys):
    """--local-only: the same night (same seed) as NeMo Gym's staged capture and as its local
    mode, built interleaved; every audit row agrees with what synth recorded."""
    benchmark.local_main(tmp_path, 2e5, 1, reuse=False, memory_limit="256MB")
    out = capsys.readouterr().out
    for name in ("staged", "local", "local full"):
        assert f"night {name}: " in out
    agreed = [line.split(": ")[1].split()[0] for line in out.splitlines() if line.startswith("night ")]
    assert all(a.split("/")[0] == a.split("/")[1] for a in agreed), out
    assert "speed ratio  local / staged, wall" in out
    staged = tmp_path / "gym-staged" / "input" / "tokens" / f"ds={benchmark.DS}"
    local = tmp_path / "gym-local" / "input"
    assert list(staged.glob("*.parquet")) and not (local / "tokens").exists()
    assert list((local / "ledger" / f"ds={benchmark.DS}").glob("*.tokens.jsonl"))


def test_the_verifiers_comparison_builds_one_seed_as_traces_and_as_rebuilt_lines(tmp_path, capsys):
    """--verifiers-only: the same seed as verifiers traces and as NeMo Gym's rebuilt lines,
    loaded and built interleaved; every audit row agrees with what synth recorded."""
    benchmark.verifiers_main(tmp_path, 2e5, 1, reuse=False, memory_limit="256MB")
    out = capsys.readouterr().out
    for name in ("rebuilt", "verifiers"):
        line = next(line for line in out.splitlines() if line.startswith(name))
        total, agreed = line.split()[1], line.split("(")[1].split()[0]
        assert total == agreed and int(total) >= 8, line
    for what in ("load", "load_cpu", "build"):
        assert f"per token    verifiers / rebuilt, {what}" in out
    assert "same bytes   verifiers " in out  # a verifiers night as large as the rebuilt one
    assert "same bytes   verifiers " in out  # a verifiers night as large as the rebuilt one
    assert (tmp_path / "verifiers" / "input" / "rollouts" / f"ds={benchmark.DS}" / "traces.jsonl").stat().st_size


def test_the_envelope_comparison_builds_one_seed_as_envelope_and_as_rebuilt_lines(tmp_path, capsys):
    """--envelope-only: the same seed as NeMo Gym's compaction-agent lines and as its rebuilt
    lines; every audit row agrees with what synth recorded; per-token ratios printed."""
    benchmark.envelope_main(tmp_path, 2e5, 1, reuse=False, memory_limit="256MB")
    out = capsys.readouterr().out
    for name in ("rebuilt", "envelope"):
        [line] = [x for x in out.splitlines() if x.startswith(f"{name:<10}")]
        total, agreed = line.split()[1], line.split("(")[1].split()[0]
        assert total == agreed, line
    for what in ("load", "load_cpu", "build"):
        assert f"per token    envelope / rebuilt, {what}" in out


def test_the_report_timing_writes_its_nights_as_a_published_warehouse_holds_them(tmp_path):
    """--report-only's fixture: its nights are what the report reads (each night's current
    run, its ledger rows as the per-call Parquet), so the page shows every night's numbers."""
    seconds, size = benchmark.report_seconds(tmp_path, nights=2, rollouts=40, calls=3)
    assert seconds > 0 and size > 0
    with duckdb.connect(str(tmp_path / "report" / "warehouse.duckdb"), read_only=True) as con:
        per_night = con.execute("SELECT CAST(ds AS VARCHAR), count(*) FROM ledger GROUP BY ALL ORDER BY 1").fetchall()
        assert per_night == [("2026-11-27", 120), ("2026-11-28", 120)]
        assert con.execute("SELECT count(*) FROM rollouts").fetchone()[0] == 80
