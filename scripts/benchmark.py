"""Benchmark: build speed against a pyarrow read+write baseline, and peak memory at 1x and 4x.

Prints ratios measured in this one run (nothing here is asserted by the tests):
  speed  = build time / time for pyarrow to read the night's token Parquet and write the
           same three list columns once (goal <= 1.5)
  memory = peak RSS of the build process on a ~10M-token night (goal <= 1 GiB), and on a
           night 4x larger (goal: within 20%)

Also times the capture-quality report over 30 nights of 10,000 rollouts each.

Usage: python scripts/benchmark.py [--tokens 10e6] [--workdir bench-out] [--workers 2] [--report-only]
The memory figures are for the one-process build (--shards 1), the default of the CLI.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from reassembler.producer.synth import SynthConfig, read_expected, synth_night
from reassembler.settings import DuckDBSettings

DS = "2026-11-28"
TOKENS_PER_ROLLOUT = 24_000  # SynthConfig defaults: ~24k tokens per rollout on average

CHILD = """
import json, resource, sys, time
from reassembler.build import build_night
from reassembler.settings import DuckDBSettings, Settings
t = time.perf_counter()
s = build_night(sys.argv[1], sys.argv[2], sys.argv[3], Settings(shards=int(sys.argv[4]), workers=int(sys.argv[5]),
                duckdb=DuckDBSettings(memory_limit=sys.argv[6])))
print(json.dumps({"seconds": time.perf_counter() - t, "rows": s.numbers.n_rows,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def baseline_seconds(token_dir: Path, scratch: Path, **write_options) -> float:
    """pyarrow alone: read the three list columns of every token file, write them once."""
    scratch.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    for f in sorted(token_dir.glob("*.parquet")):
        names = pq.read_schema(f).names
        lp = "generation_logprobs_delta" if "generation_logprobs_delta" in names else "generation_log_probs_delta"
        table = pq.read_table(f, columns=["token_ids_delta", "token_mask_delta", lp])
        pq.write_table(table, scratch / f.name, row_group_size=256, **write_options)
    return time.perf_counter() - t


def night(workdir: Path, name: str, tokens: float, seed: int) -> tuple[Path, dict]:
    root = workdir / name
    shutil.rmtree(root, ignore_errors=True)
    rollouts = max(8, int(tokens / TOKENS_PER_ROLLOUT))
    totals = synth_night(root / "input", DS, SynthConfig(rollouts=rollouts, seed=seed))
    return root, totals


def build(root: Path, shards: int, workers: int, memory_limit: str) -> dict:
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(root / "input"),
            str(root / "output"),
            DS,
            str(shards),
            str(workers),
            memory_limit,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def outcomes_match(root: Path) -> tuple[int, int]:
    """Audit rows of a built night that agree with what synth recorded having injected."""
    expected = read_expected(root / "input", DS)
    audit = pq.read_table(root / "output" / "audit" / f"ds={DS}", columns=["rollout_id", "status", "reason"])
    agree = sum(
        (a["status"], a["reason"])
        == (expected[a["rollout_id"]]["select"]["status"], expected[a["rollout_id"]]["select"]["reason"])
        for a in audit.to_pylist()
    )
    return agree, len(expected)


def report_seconds(workdir: Path, nights: int = 30, rollouts: int = 10_000, calls: int = 8) -> tuple[float, int]:
    """Time the capture-quality report over `nights` nights of `rollouts` rollouts each,
    written straight into a fresh warehouse (scripts/report_bench.sql): (seconds, HTML bytes)."""
    from reassembler.report_html import write_reports
    from reassembler.warehouse import connect

    out = workdir / "report"
    shutil.rmtree(out, ignore_errors=True)
    with connect(out, DuckDBSettings(memory_limit="1GB")) as con:
        text = (Path(__file__).parent / "report_bench.sql").read_text()
        for statement in text.split(";\n"):
            body = "\n".join(line for line in statement.splitlines() if not line.startswith("--"))
            if body.strip():
                con.execute(
                    body,
                    {
                        k: v
                        for k, v in {"nights": nights, "rollouts": rollouts, "calls": calls}.items()
                        if f"${k}" in body
                    },
                )
    with connect(out, read_only=True) as con:
        start = time.perf_counter()
        page = write_reports(con, out, "2026-11-28", nights)
        seconds = time.perf_counter() - start
    return seconds, page.stat().st_size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=float, default=10e6)
    p.add_argument("--workdir", default="bench-out")
    p.add_argument("--workers", type=int, default=2, help="for the parallel run: shards = workers")
    p.add_argument("--memory-limit", default=DuckDBSettings.memory_limit, help="DuckDB memory_limit of the builds")
    p.add_argument("--report-only", action="store_true", help="only time the capture-quality report")
    args = p.parse_args()
    work = Path(args.workdir)
    if args.report_only:
        return report_main(work)

    root1, t1 = night(work, "1x", args.tokens, seed=1)
    tokens_dir = root1 / "input" / "tokens" / f"ds={DS}"
    # the baseline writes the lists as the build writes its rows (no dictionary, no statistics);
    # pyarrow's default writer settings are shown too, for reference
    base = baseline_seconds(tokens_dir, work / "baseline", use_dictionary=False, write_statistics=False)
    base_default = baseline_seconds(tokens_dir, work / "baseline-default")
    b1 = build(root1, 1, 1, args.memory_limit)
    bp = build(root1, args.workers, args.workers, args.memory_limit)
    root4, t4 = night(work, "4x", 4 * args.tokens, seed=4)
    b4 = build(root4, 1, 1, args.memory_limit)

    print(f"DuckDB memory_limit {args.memory_limit}")
    print(
        f"night 1x: {t1['rollouts']} rollouts, {t1['calls']} calls, {t1['tokens'] / 1e6:.1f}M tokens, "
        f"{t1['token_files']} token files"
    )
    print(f"night 4x: {t4['rollouts']} rollouts, {t4['calls']} calls, {t4['tokens'] / 1e6:.1f}M tokens")
    for name, root in (("1x", root1), ("4x", root4)):
        agree, total = outcomes_match(root)
        print(f"night {name}: {agree}/{total} audit rows match the outcomes synth recorded")
    print(
        f"build 1x: {b1['seconds']:.2f} s ({t1['tokens'] / b1['seconds'] / 1e6:.1f}M tokens/s), "
        f"{b1['rows']} rows; peak RSS {b1['rss_mib']:.0f} MiB"
    )
    print(
        f"build 4x: {b4['seconds']:.2f} s ({t4['tokens'] / b4['seconds'] / 1e6:.1f}M tokens/s), "
        f"{b4['rows']} rows; peak RSS {b4['rss_mib']:.0f} MiB"
    )
    print(
        f"build 1x, {args.workers} shards in {args.workers} worker processes: {bp['seconds']:.2f} s; "
        f"peak RSS {bp['rss_mib']:.0f} MiB main + {bp['worker_rss_mib']:.0f} MiB per worker"
    )
    print(
        f"pyarrow baseline 1x (read + write the three list columns): {base:.2f} s "
        f"(with pyarrow's default writer settings: {base_default:.2f} s)"
    )
    print(f"speed ratio  build / baseline          = {b1['seconds'] / base:.2f}   (goal <= 1.5)")
    print(f"speed ratio  {args.workers} workers / baseline      = {bp['seconds'] / base:.2f}")
    print(f"speed ratio  build / default-settings baseline = {b1['seconds'] / base_default:.2f}")
    print(f"memory       peak RSS 1x               = {b1['rss_mib']:.0f} MiB (goal <= 1024)")
    print(f"memory ratio peak RSS 4x / 1x          = {b4['rss_mib'] / b1['rss_mib']:.2f}   (goal <= 1.20)")
    report_main(work)


def report_main(workdir: Path) -> None:
    seconds, size = report_seconds(workdir)
    print(
        f"report: 30 nights x 10,000 rollouts, one night's page and the index in {seconds:.2f} s; "
        f"page {size / 1024:.0f} KiB (+ plotly.min.js once beside the pages)"
    )


if __name__ == "__main__":
    main()
