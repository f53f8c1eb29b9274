"""Benchmark: the build against the floor (reading and writing the tokens once), and memory.

Prints ratios measured in this one run (nothing here is asserted by the tests). The machine
is shared and noisy, so floor and build runs are interleaved (`--rounds`, 3 by default),
each in a fresh process, and the figures are medians with their spread, as wall time and
as CPU seconds (the whole process, and its main thread alone):

  floor  = pyarrow alone reads the night's token Parquet and writes the three list columns
           once, with the rows' writer settings (no dictionary, no statistics on lists)
  speed  = build / floor, by median wall time (goal <= 1.5) and by CPU seconds (goal <= 2.5);
           also build / floor within each round (median, min, max), which shows the spread
  memory = peak RSS of the one-process build of a ~10M-token night (goal <= 1 GiB) and of a
           night 4x larger (goal: within 20%), medians of `--rounds` builds each; the 4x
           builds are interleaved with floors of the 4x night too, and their ratio printed
           for information (the goals are set on the ~10M-token night)
  against = the throughput goal measured on this machine: the build of revision `--against`
           (a40edc3 by default, the build whose 4.8M tokens/s the goal doubles) and this build,
           interleaved, on one night written by that revision's synth, each the
           `reassembler build` command in a fresh process (goal: this build >= 2x its tokens/s);
           the revision is taken from this clone's git history, skipped when it is not there

Also times the capture-quality report over 30 nights of 10,000 rollouts each, NeMo Gym's
local capture mode against its staged capture (`--local-only`), verifiers traces against NeMo
Gym's rebuilt lines, per token of the rows (`--verifiers-only`), and the night built from and
to a local S3-compatible server against the local build (`--s3-only`: wall and CPU ratios,
peak RSS, bytes read from the store over the token files' size; the load, one shard and the
publish timed on their own), the same with 0, 20 and 100 ms added to every request through
the fault proxy (`--latency-only`: wall ratios and the mean requests in flight), and the
fixed cost of a task under Celery (`--celery-only`), and the load in parts (`--scale-only`:
a part and the merge on the bench shape and on a calls-heavy shape, ~15 tokens a call, one
shard of each, the same from S3, then T(N tokens, W workers) modelled from those slopes for
1B, 10B and 100B tokens on 1, 8, 32 and 64 workers, with issue 34's goals marked).

Usage: python scripts/benchmark.py [--tokens 10e6] [--rounds 3] [--workdir bench-out] [--workers 2]
                                  [--reuse] [--against REV]
                                  [--local-only | --verifiers-only | --envelope-only | --art-only | --s3-only
                                   | --latency-only
                                   | --scale-only]
       python scripts/benchmark.py --report-only
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reassembler.producer.synth import SynthConfig, read_expected, synth_night
from reassembler.settings import DuckDBSettings

DS = "2026-11-28"
T = TypeVar("T")
TOKENS_PER_ROLLOUT = 24_000  # SynthConfig defaults: ~24k tokens per rollout on average

# each measured run is a fresh process that prints wall time, CPU seconds and peak RSS
MEASURE = """
import json, resource, sys, time
wall, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
{body}
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                  "main_cpu": time.thread_time() - main, "rss_mib": usage.ru_maxrss / 1024,
                  "worker_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "child_cpu": resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
                               + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime}}))
"""
# the build as users run it: the `reassembler build` command (reassembler.cli.entry), in-process
BUILD = """
from reassembler.cli import entry
inp, out, ds, shards, workers, memory = sys.argv[1:7]
rc = entry(["build", "--input", inp, "--output", out, "--ds", ds, "--shards", shards, "--workers", workers,
            "--memory-limit", memory])
assert rc == 0, rc
"""
FLOOR = """
from pathlib import Path
import pyarrow.parquet as pq
tokens, scratch = Path(sys.argv[1]), Path(sys.argv[2])
scratch.mkdir(parents=True, exist_ok=True)
for f in sorted(tokens.glob("*.parquet")):
    names = pq.read_schema(f).names
    lp = "generation_logprobs_delta" if "generation_logprobs_delta" in names else "generation_log_probs_delta"
    table = pq.read_table(f, columns=["token_ids_delta", "token_mask_delta", lp])
    pq.write_table(table, scratch / f.name, row_group_size=256, use_dictionary=False, write_statistics=False)
"""


def run(body: str, *args: str) -> dict:
    # -P: the current folder is not put first on the path, so that a revision's tree given
    # by PYTHONPATH (_in_tree) is the one imported even when this runs from a checkout
    res = subprocess.run(
        [sys.executable, "-P", "-c", MEASURE.format(body=body), *map(str, args)], capture_output=True, text=True
    )
    if res.returncode != 0:
        raise SystemExit(f"a measured run failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    m = json.loads(res.stdout.strip().splitlines()[-1])
    m["cpu"] += m["child_cpu"]  # worker processes, when there are any
    return m


def build(root: Path, shards: int, workers: int, memory_limit: str) -> dict:
    return run(BUILD, root / "input", root / "output", DS, shards, workers, memory_limit)


def interleaved(rounds: int, first: Callable[[], T], second: Callable[[], T]) -> tuple[list[T], list[T]]:
    """`rounds` runs of each, interleaved so that the machine's noise hits both alike, and in
    alternate order from round to round (first-second, second-first, ...), so that neither
    always runs right after the other."""
    a: list[T] = []
    b: list[T] = []
    for k in range(rounds):
        if k % 2 == 0:
            a.append(first())
            b.append(second())
        else:
            b.append(second())
            a.append(first())
    return a, b


def floor(root: Path, scratch: Path) -> dict:
    return run(FLOOR, root / "input" / "tokens" / f"ds={DS}", scratch)


def night(
    workdir: Path,
    name: str,
    tokens: float,
    seed: int,
    reuse: bool = False,
    shape: str | None = None,
    delta: float = 0.5,
) -> tuple[Path, dict]:
    """A synthetic night of about `tokens` tokens (`reuse`: the one written before, if its
    size and seed match); `shape`: every group in that producer shape (synth.SHAPES),
    `delta`: the share of local-mode rollouts written with delta prompts."""
    rollouts = max(8, int(tokens / TOKENS_PER_ROLLOUT))
    cfg = SynthConfig(rollouts=rollouts, seed=seed, only_shape=shape, local_delta=delta)
    return _synth(workdir / name, cfg, reuse)


def _synth(root: Path, cfg: SynthConfig, reuse: bool) -> tuple[Path, dict]:
    """The night `cfg` writes under `root` (`reuse`: the one written before, if its size and
    seed match), and its totals."""
    saved = root / "totals.json"
    if reuse and saved.exists():
        kept = json.loads(saved.read_text())
        if kept.get("rollouts") == cfg.rollouts and kept.get("seed") == cfg.seed:
            return root, kept
    shutil.rmtree(root, ignore_errors=True)
    totals = synth_night(root / "input", DS, cfg)
    saved.write_text(json.dumps({**totals, "seed": cfg.seed}, default=str))
    return root, totals


# the calls-heavy shape: ~15 tokens a call (the bench nights carry ~1,000), so that the
# per-call costs show beside the per-token ones (docs/performance.md, issue 34)
CALLS_HEAVY = dict(
    prompt_tokens=(10, 30),
    observation_tokens=(2, 12),
    generated_tokens=(2, 12),
    rollouts_per_ledger_file=500,
    token_rows_per_file=20_000,
)


def calls_night(
    workdir: Path, name: str, rollouts: int, seed: int, reuse: bool = False, deeper: int = 1
) -> tuple[Path, dict]:
    """A synthetic night of the calls-heavy shape (`reuse` as `night`); `deeper` times the
    calls a rollout (the same rollouts, more calls each)."""
    calls = {"min_calls": 5 * deeper, "max_calls": 40 * deeper}
    return _synth(workdir / name, SynthConfig(rollouts=rollouts, seed=seed, **CALLS_HEAVY, **calls), reuse)


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


def _met(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def spread(runs: list[dict], key: str, unit: str = "s", digits: int = 2) -> str:
    values = [r[key] for r in runs]
    return f"{statistics.median(values):.{digits}f} {unit} (min {min(values):.{digits}f}, max {max(values):.{digits}f})"


def paired(builds: list[dict], floors: list[dict], key: str) -> str:
    """build / floor within each interleaved round: median (min, max). A round's build and
    floor ran one after the other, so the machine's drift between rounds cancels out."""
    ratios = [b[key] / f[key] for b, f in zip(builds, floors)]
    return f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})"


REPO = Path(__file__).resolve().parent.parent
AGAINST = "a40edc3"  # README on 2026-11-29: "build 1x (one process) | 2.06 s, 4.8M tokens/s"


def _command(tree: Path | None, *args: str) -> float:
    """Wall seconds of `python -m reassembler.cli ARGS`, from `tree` (a revision's source,
    first on the path) or this checkout."""
    env = dict(os.environ, PYTHONPATH=str(tree)) if tree else None
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "reassembler.cli", *args], cwd=tree or REPO, env=env, capture_output=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"reassembler {args[0]} ({tree or 'this checkout'}) failed: {done.stderr.decode()[-2000:]}")
    return time.perf_counter() - started


def revision_tree(workdir: Path, rev: str) -> Path | None:
    """Revision `rev`'s source, extracted from this clone's history into `workdir` (once);
    None when the history does not hold it."""
    tree = workdir / f"rev-{rev}"
    if not (tree / "reassembler" / "cli.py").is_file():
        try:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True)
        except OSError:  # no git here
            return None
        if archive.returncode != 0:  # not in this history (a shallow clone, an export)
            return None
        partial = tree.with_name(tree.name + ".partial")  # renamed once whole: an interrupted run leaves no half tree
        shutil.rmtree(partial, ignore_errors=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(partial, filter="data")
        shutil.rmtree(tree, ignore_errors=True)
        partial.rename(tree)
    return tree


def against(workdir: Path, rev: str, tokens: float, rounds: int, reuse: bool) -> dict | None:
    """Builds of revision `rev` and of this checkout, interleaved, on a night written by
    `rev`'s synth: their median wall seconds and the night's tokens; None when this clone's
    history does not hold `rev`."""
    workdir = workdir.resolve()  # the commands run in other folders
    tree = revision_tree(workdir, rev)
    if tree is None:
        return None
    root = workdir / f"rev-{rev}-night"
    rollouts = str(max(8, int(tokens / TOKENS_PER_ROLLOUT)))
    written = root / "rollouts.txt"  # the size of the night there, for --reuse
    if not (reuse and written.exists() and written.read_text() == rollouts):
        shutil.rmtree(root, ignore_errors=True)
        _command(tree, "synth", "--output", str(root / "input"), "--ds", DS, "--rollouts", rollouts, "--seed", "1")
        written.write_text(rollouts)
    files = sorted((root / "input" / "tokens" / f"ds={DS}").glob("*.parquet"))
    n_tokens = sum(_tokens(f) for f in files)
    build = ("build", "--input", str(root / "input"), "--ds", DS)
    theirs, ours = interleaved(
        rounds,
        lambda: _command(tree, *build, "--output", str(root / "output-rev")),
        lambda: _command(None, *build, "--output", str(root / "output")),
    )
    return {
        "theirs": statistics.median(theirs),
        "ours": statistics.median(ours),
        "tokens": n_tokens,
        "ratios": sorted(t / o for t, o in zip(theirs, ours)),
    }


def _tokens(path: Path) -> int:
    column = pq.read_table(path, columns=["token_ids_delta"]).column(0)
    return int(pc.sum(pc.list_value_length(column)).as_py() or 0)


def report_seconds(workdir: Path, nights: int = 30, rollouts: int = 10_000, calls: int = 8) -> tuple[float, int]:
    """Time the capture-quality report over `nights` nights of `rollouts` rollouts each,
    written straight into a fresh warehouse (scripts/report_bench.sql): (seconds, HTML bytes)."""
    from reassembler import call_tables
    from reassembler.audit.report_html import write_reports
    from reassembler.warehouse import connect, run_statements

    out = workdir / "report"
    shutil.rmtree(out, ignore_errors=True)
    here = Path(__file__).parent
    with connect(out, DuckDBSettings(memory_limit="1GB")) as con:
        sizes = {"nights": nights, "rollouts": rollouts, "calls": calls}
        run_statements(con, (here / "report_bench.sql").read_text(), sizes)
        schema = call_tables.schemas()["ledger"]
        for (ds,) in con.execute("SELECT DISTINCT CAST(ds AS VARCHAR) FROM rollouts").fetchall():
            ledger = con.sql((here / "report_bench_ledger.sql").read_text(), params={"ds": ds, "calls": calls})
            table = ledger.to_arrow_table()
            columns = [
                table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
                for f in schema
            ]
            rows = pa.table(columns, schema=schema)
            call_tables.write_file(
                str(Path(call_tables.night_folder(out, "ledger", ds, "bench")) / "part-00000.parquet"), schema, [rows]
            )
    with connect(out, read_only=True) as con:
        start = time.perf_counter()
        page = write_reports(con, out, "2026-11-28", nights)
        seconds = time.perf_counter() - start
    assert page is not None
    return seconds, Path(page).stat().st_size


def report_main(workdir: Path) -> None:
    seconds, size = report_seconds(workdir)
    print(
        f"report: 30 nights x 10,000 rollouts, one night's page and the index in {seconds:.2f} s; "
        f"page {size / 1024:.0f} KiB (+ plotly.min.js once beside the pages)"
    )


def local_main(work: Path, tokens: float, rounds: int, reuse: bool, memory_limit: str) -> None:
    """One night in NeMo Gym's staged capture and in its local mode (delta prompts, so the
    same tokens on disk), same seed, builds interleaved (CONTRACT.md 9; issue 24's goal:
    local within 1.5x); the full-prompt form once, for information."""
    staged, ts = night(work, "gym-staged", tokens, seed=1, reuse=reuse, shape="gym")
    local, tl = night(work, "gym-local", tokens, seed=1, reuse=reuse, shape="local", delta=1.0)
    a, b = interleaved(rounds, lambda: build(staged, 1, 1, memory_limit), lambda: build(local, 1, 1, memory_limit))
    full, tf = night(work, "gym-local-full", tokens, seed=1, reuse=reuse, shape="local", delta=0.0)
    bf = build(full, 1, 1, memory_limit)
    sw, lw = statistics.median(r["wall"] for r in a), statistics.median(r["wall"] for r in b)
    sc, lc = statistics.median(r["cpu"] for r in a), statistics.median(r["cpu"] for r in b)
    for name, root in (("staged", staged), ("local", local), ("local full", full)):
        agree, total = outcomes_match(root)
        print(f"night {name}: {agree}/{total} audit rows match the outcomes synth recorded")
    print(
        f"NeMo Gym staged  {ts['rollouts']} rollouts, {ts['tokens'] / 1e6:.1f}M tokens: wall {spread(a, 'wall')}; "
        f"CPU {spread(a, 'cpu')}; peak RSS {spread(a, 'rss_mib', 'MiB', 0)}, "
        f"of a child process {spread(a, 'worker_rss_mib', 'MiB', 0)}"
    )
    print(
        f"NeMo Gym local   {tl['rollouts']} rollouts, {tl['tokens'] / 1e6:.1f}M tokens (delta prompts): wall "
        f"{spread(b, 'wall')}; CPU {spread(b, 'cpu')}; peak RSS {spread(b, 'rss_mib', 'MiB', 0)}, "
        f"of a child process {spread(b, 'worker_rss_mib', 'MiB', 0)}"
    )
    print(
        f"NeMo Gym local, full prompts (input {_size(full / 'input') / 2**20:.0f} MiB against "
        f"{_size(local / 'input') / 2**20:.0f}): wall {bf['wall']:.2f} s, CPU {bf['cpu']:.2f} s, "
        f"peak RSS {bf['rss_mib']:.0f} MiB"
    )
    ratio = lw / sw
    print(f"speed ratio  local / staged, wall      = {ratio:.2f}   (goal <= 1.5)  {_met(ratio <= 1.5)}")
    print(f"             local / staged, CPU       = {lc / sc:.2f}   per round, wall {paired(b, a, 'wall')}")


def _against_rebuilt(shape: str, work: Path, tokens: float, rounds: int, reuse: bool, memory_limit: str):
    """One night of `shape` and one of NeMo Gym's rebuilt lines from the same seed (the same
    rollouts, calls and tokens drawn), loads and builds interleaved; printed per token of the
    rows built (what each producer's night trains on). Returns the two nights and the step."""
    rebuilt, _ = night(work, "gym-rebuilt", tokens, seed=3, reuse=reuse, shape="rebuilt")
    other, _ = night(work, shape, tokens, seed=3, reuse=reuse, shape=shape)
    step = lambda root: run(  # noqa: E731  the load step alone, into a warehouse of its own
        S3_STEP, "load", root / "input", root / "load-output", DS, root / "load-output" / "warehouse.duckdb"
    )
    for root in (rebuilt, other):
        shutil.rmtree(root / "load-output", ignore_errors=True)
    loads_r, loads_o = interleaved(rounds, lambda: step(rebuilt), lambda: step(other))
    builds_r, builds_o = interleaved(
        rounds, lambda: build(rebuilt, 1, 1, memory_limit), lambda: build(other, 1, 1, memory_limit)
    )
    per: dict[str, dict[str, float]] = {}
    nights = (("rebuilt", rebuilt, loads_r, builds_r), (shape, other, loads_o, builds_o))
    for name, root, loads, builds in nights:
        agree, total = outcomes_match(root)
        audit = pq.read_table(root / "output" / "audit" / f"ds={DS}", columns=["n_tokens"])
        n = int(pc.sum(audit.column("n_tokens")).as_py() or 0)
        mib = _size(root / "input") / 2**20
        lw, bw = statistics.median(r["wall"] for r in loads), statistics.median(r["wall"] for r in builds)
        lc = statistics.median(r["cpu"] for r in loads)
        per[name] = {"load": lw / n * 1e6, "build": bw / n * 1e6, "load_cpu": lc / n * 1e6}
        print(
            f"{name:<10}{total} rollouts ({agree} as synth recorded), {n / 1e6:.2f}M tokens in rows, input "
            f"{mib:.0f} MiB: load wall {spread(loads, 'wall')}, CPU {spread(loads, 'cpu')}; "
            f"build wall {spread(builds, 'wall')}; load {lw / mib * 1e3:.1f} ms/MiB"
        )
    for what in ("load", "load_cpu", "build"):
        ratio = per[shape][what] / per["rebuilt"][what]
        print(
            f"per token    {shape} / rebuilt, {what:<9}= {ratio:.2f}  ({per[shape][what]:.2f} against "
            f"{per['rebuilt'][what]:.2f} s per M tokens; goal <= 1.00)  {_met(ratio <= 1.0)}"
        )
    return rebuilt, other, step


def envelope_main(work: Path, tokens: float, rounds: int, reuse: bool, memory_limit: str) -> None:
    """NeMo Gym's compaction-agent lines (contract 11: every call's arrays and its evidence
    digest recomputed) against its rebuilt lines (9.10: no digest), the same seed, per token
    of the rows: what recomputing a SHA-256 per call costs a night."""
    _against_rebuilt("envelope", work, tokens, rounds, reuse, memory_limit)


def verifiers_main(work: Path, tokens: float, rounds: int, reuse: bool, memory_limit: str) -> None:
    """verifiers traces against NeMo Gym's rebuilt lines, per token of the rows (issue 36: a
    verifiers night reads at least as fast per token as a Gym-rebuilt night); then the loads
    of a verifiers night as large in bytes as the rebuilt one, per MiB of input."""
    rebuilt, traces, step = _against_rebuilt("verifiers", work, tokens, rounds, reuse, memory_limit)
    # the same size in bytes: a rebuilt line repeats its prompts, so a verifiers night of as
    # many bytes holds several times its tokens; the loads of the two, interleaved
    scale = _size(rebuilt / "input") / _size(traces / "input")
    same, _ = night(work, "verifiers-same-bytes", tokens * scale, seed=3, reuse=reuse, shape="verifiers")
    shutil.rmtree(same / "load-output", ignore_errors=True)
    loads_r, loads_s = interleaved(rounds, lambda: step(rebuilt), lambda: step(same))
    mib_r, mib_s = _size(rebuilt / "input") / 2**20, _size(same / "input") / 2**20
    median = lambda runs, what, mib: statistics.median(r[what] for r in runs) / mib  # noqa: E731
    wall = median(loads_s, "wall", mib_s) / median(loads_r, "wall", mib_r)
    cpu = median(loads_s, "cpu", mib_s) / median(loads_r, "cpu", mib_r)
    print(
        f"same bytes   verifiers {mib_s:.0f} MiB / rebuilt {mib_r:.0f} MiB, load per MiB: wall {wall:.2f}, "
        f"CPU {cpu:.2f} (goal <= 1.00)  {_met(wall <= 1.0)}; verifiers load wall {spread(loads_s, 'wall')}, "
        f"rebuilt {spread(loads_r, 'wall')}"
    )


ART_BUILD = """
from reassembler.cli import entry
inp, out, ds, memory = sys.argv[1:5]
rc = entry(["build", "--layout", "art", "--input", inp, "--output", out, "--ds", ds, "--memory-limit", memory])
assert rc == 0, rc
"""


def art_main(work: Path, tokens: float, rounds: int, reuse: bool, memory_limit: str) -> None:
    """OpenPipe ART's trajectory Parquet (contract 13) against verifiers traces, per token of
    the rows (issue 62: an ART night costs no more per row token than a verifiers night): a
    synthetic ART model folder of about `tokens` row tokens (chains of 8 calls) and the
    verifiers night of the same tokens, builds interleaved."""
    from reassembler.producer.art import art_model_folder

    traces, _ = night(work, "verifiers", tokens, seed=3, reuse=reuse, shape="verifiers")
    art_root = work / "art"
    model = art_root / ".art" / "bench" / "models" / "bench-run"
    if not (reuse and model.exists()):
        shutil.rmtree(art_root, ignore_errors=True)
        art_model_folder(art_root, DS, max(8, int(tokens / 20_800)), calls=8, tokens_per_call=2600, seed=3)
    art_out = art_root / "output"
    art_build = lambda: run(ART_BUILD, model, art_out, DS, memory_limit)  # noqa: E731
    builds_v, builds_a = interleaved(rounds, lambda: build(traces, 1, 1, memory_limit), art_build)
    per = {}
    for name, out, builds in (("verifiers", traces / "output", builds_v), ("art", art_out, builds_a)):
        audit = pq.read_table(out / "audit" / f"ds={DS}", columns=["n_tokens"])
        n = int(pc.sum(audit.column("n_tokens")).as_py() or 0)
        wall, cpu = statistics.median(r["wall"] for r in builds), statistics.median(r["cpu"] for r in builds)
        per[name] = (wall / n * 1e6, cpu / n * 1e6)
        print(
            f"{name:<10}{n / 1e6:.2f}M tokens in rows: build wall {spread(builds, 'wall')}, CPU {spread(builds, 'cpu')}"
        )
    for k, what in enumerate(("build", "build_cpu")):
        ratio = per["art"][k] / per["verifiers"][k]
        print(
            f"per token    art / verifiers, {what:<9}= {ratio:.2f}  ({per['art'][k]:.2f} against "
            f"{per['verifiers'][k]:.2f} s per M tokens; goal <= 1.00)  {_met(ratio <= 1.0)}"
        )


S3_BUILD = """
from reassembler.cli import entry
inp, out, ds, memory, warehouse = sys.argv[1:6]
rc = entry(["build", "--input", inp, "--output", out, "--ds", ds, "--memory-limit", memory, "--warehouse", warehouse])
assert rc == 0, rc
"""


S3_STEP = """
from reassembler.build import load_step, publish_step, shard_step
from reassembler.merge.night_load import NightLoad
from reassembler.settings import Settings
from reassembler.warehouse import Warehouse
step, inp, out, ds, warehouse = sys.argv[1:6]
settings = Settings()
if step == "load":
    with NightLoad(inp, ds, settings) as night:
        load_step(night, Warehouse(out, settings.duckdb, warehouse), "bench-steps")
elif step == "shard":
    shard_step(out, ds, 0, "bench-steps", settings)
else:
    publish_step(Warehouse(out, settings.duckdb, warehouse), ds, "bench-steps", inp, settings)
"""


def s3_main(work: Path, tokens: float, rounds: int, reuse: bool, memory_limit: str, latency_ms: float = 0.0) -> None:
    """The bench night built from and to a local S3-compatible server (moto's, on 127.0.0.1)
    beside the local build, interleaved (issue 25's goals: S3 within 1.5x by wall; bytes read
    from the store within 1.1x of the token files). Bytes read are counted by a TCP relay
    between one more build and the server: every byte the store sent (bodies, headers,
    listings). `latency_ms`: every build goes through the relay, which delays each request."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from s3server import CountingProxy, S3Server

    root, totals = night(work, "1x", tokens, seed=1, reuse=reuse)
    server = S3Server(work / "moto.log")
    proxy = CountingProxy(server.port, latency_ms / 1000)
    try:
        os.environ.update(server.env)
        bucket_in, bucket_out = server.bucket("bench-in"), server.bucket("bench-out")
        uri_in, uri_out = f"s3://{bucket_in}/capture", f"s3://{bucket_out}/rows"
        server.upload(root / "input", uri_in)
        warehouse = work / "s3-warehouse.duckdb"
        if latency_ms:  # every build through the relay, which delays each request
            os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        local, remote = interleaved(
            rounds,
            lambda: build(root, 1, 1, memory_limit),
            lambda: run(S3_BUILD, uri_in, uri_out, DS, memory_limit, warehouse),
        )
        # bytes read: one more build through the counting relay (relaying costs this
        # process CPU, so the timed builds above go straight to the server)
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        before = proxy.downstream
        run(S3_BUILD, uri_in, uri_out, DS, memory_limit, warehouse)
        read = proxy.downstream - before
        # the parts of a distributed night, each in a fresh process straight to the server:
        # the load (serial, on the warehouse's worker), one shard (any worker), the publish
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        parts = {
            step: statistics.median(run(S3_STEP, step, uri_in, uri_out, DS, warehouse)["wall"] for _ in range(rounds))
            for step in ("load", "shard", "publish")
        }
    finally:
        proxy.close()
        server.stop()
    token_bytes = _size(root / "input" / "tokens")
    input_bytes = _size(root / "input") - _size(root / "input" / "_expected")
    lw, rw = statistics.median(r["wall"] for r in local), statistics.median(r["wall"] for r in remote)
    lc, rc = statistics.median(r["cpu"] for r in local), statistics.median(r["cpu"] for r in remote)
    print(
        f"night 1x on S3 ({totals['tokens'] / 1e6:.1f}M tokens; token files {token_bytes / 2**20:.1f} MiB, "
        f"all input {input_bytes / 2**20:.1f} MiB), {rounds} interleaved rounds, medians (min, max); "
        f"{latency_ms:g} ms added to each request"
    )
    print(
        f"local build  wall {spread(local, 'wall')}; CPU {spread(local, 'cpu')}; "
        f"RSS {spread(local, 'rss_mib', 'MiB', 0)}"
    )
    print(
        f"S3 build     wall {spread(remote, 'wall')}; CPU {spread(remote, 'cpu')}; "
        f"RSS {spread(remote, 'rss_mib', 'MiB', 0)}"
    )
    print(f"speed ratio  S3 / local, wall          = {rw / lw:.2f}   (goal <= 1.5)  {_met(rw / lw <= 1.5)}")
    print(f"             S3 / local, CPU           = {rc / lc:.2f}   per round, wall {paired(remote, local, 'wall')}")
    json_bytes = input_bytes - token_bytes  # rollout, ledger and capture files, each read once
    tokens_read = read - json_bytes
    print(
        f"bytes read   from S3 / all input files = {read / input_bytes:.2f}   ({read / 2**20:.1f} MiB per build, "
        f"headers and listings included)"
    )
    print(
        f"             beyond the JSON / token files = {tokens_read / token_bytes:.2f}   (goal <= 1.1)  "
        f"{_met(tokens_read / token_bytes <= 1.1)}"
    )
    t = totals["tokens"]
    print(
        f"steps on S3  load {parts['load']:.2f} s ({t / parts['load'] / 1e6:.1f}M tokens/s, serial), one shard "
        f"{parts['shard']:.2f} s ({t / parts['shard'] / 1e6:.1f}M tokens/s), publish {parts['publish']:.2f} s; "
        "each a fresh process, medians"
    )


def latency_main(
    work: Path, tokens: float, rounds: int, reuse: bool, memory_limit: str, latencies: tuple[float, ...] = (0, 20, 100)
) -> None:
    """The bench night built from and to the local S3 server through the fault proxy
    (tests/faultproxy.py), which adds `latencies` ms to every request, rounds interleaved
    across the latencies; issue 32's goal: 100 ms a request costs at most 1.5x the build at
    0 ms. Mean requests in flight: the time requests spent in the proxy, summed, over the
    build's wall time. Every build goes through the same proxy, so its cost is in all."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from faultproxy import FaultProxy

    from s3server import S3Server

    root, totals = night(work, "1x", tokens, seed=1, reuse=reuse)
    server = S3Server(work / "moto-latency.log")
    proxy = FaultProxy(server.port)
    runs: dict[float, list[dict]] = {ms: [] for ms in latencies}
    try:
        os.environ.update(server.env)
        uri_in, uri_out = f"s3://{server.bucket('lat-in')}/capture", f"s3://{server.bucket('lat-out')}/rows"
        server.upload(root / "input", uri_in)
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        for k in range(rounds):
            for ms in latencies if k % 2 == 0 else latencies[::-1]:
                proxy.clear()
                proxy.reset_stats()
                if ms:
                    proxy.add("latency", seconds=ms / 1000)
                m = run(S3_BUILD, uri_in, uri_out, DS, memory_limit, work / "latency-warehouse.duckdb")
                m["requests"], m["in_flight"] = proxy.stats.requests, proxy.stats.busy_seconds / m["wall"]
                runs[ms].append(m)
    finally:
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        proxy.close()
        server.stop()
    base = statistics.median(r["wall"] for r in runs[latencies[0]])
    print(
        f"night 1x on S3 through the fault proxy ({totals['tokens'] / 1e6:.1f}M tokens), latency added to every "
        f"request, {rounds} interleaved rounds, medians (min, max)"
    )
    for ms in latencies:
        wall = statistics.median(r["wall"] for r in runs[ms])
        flight = statistics.median(r["in_flight"] for r in runs[ms])
        goal = f"  (goal <= 1.5)  {_met(wall / base <= 1.5)}" if ms == 100 else ""
        print(
            f"latency {ms:>5g} ms  wall {spread(runs[ms], 'wall')}; CPU {spread(runs[ms], 'cpu')}; "
            f"{statistics.median(r['requests'] for r in runs[ms]):.0f} requests, {flight:.1f} in flight on average; "
            f"x{wall / base:.2f} the 0 ms build{goal}"
        )


def celery_main(work: Path, tokens: float, reuse: bool) -> None:
    """The fixed cost of a task under Celery (make airflow-celery's deployment, two workers
    on this machine): a night of the bench size triggered once, each task's wait from queued
    to running and its duration, from the metadata DB."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from celery_deployment import CeleryDeployment

    root, totals = night(work, "1x", tokens, seed=1, reuse=reuse)
    deployment = CeleryDeployment(root / "input", DS, isolate=False, concurrency=2)
    try:
        if deployment.started.returncode != 0:
            raise SystemExit(f"the Celery deployment did not start: {deployment.started.stdout[-1000:]}")
        state = deployment.run_night("bench", {"ds": DS, "shards": 4, **{f"gate_max_{k}": None for k in GATES}})
        rows = deployment.query(
            "SELECT task_id, map_index, extract(epoch FROM start_date - queued_dttm), "
            "extract(epoch FROM end_date - start_date) FROM task_instance WHERE run_id = 'bench' "
            "AND start_date IS NOT NULL ORDER BY start_date"
        )
        [[night_wall]] = deployment.query(
            "SELECT extract(epoch FROM end_date - start_date) FROM dag_run WHERE run_id = 'bench'"
        )
    finally:
        deployment.stop()
    waits = [float(w) for _, _, w, _ in rows if w]
    took = {(t, int(m)): float(d) for t, m, _, d in rows}
    shards = [d for (t, _), d in took.items() if t == "reassemble"]
    print(
        f"Celery, 2 workers x 2 slots, night 1x ({totals['tokens'] / 1e6:.1f}M tokens, 4 shards): {state} in "
        f"{float(night_wall):.1f} s"
    )
    chain = [d for (t, _), d in took.items() if t != "reassemble"] + [
        max(shards)
    ]  # the night's steps, one after another
    gap = (float(night_wall) - sum(chain)) / len(chain)
    print(
        f"task fixed cost  {gap:.2f} s between one step's end and the next one's start (the night's wall less its "
        f"{len(chain)} steps, per step); queued -> running {statistics.median(waits):.2f} s; a trivial task "
        f"(check_input) runs {took.get(('check_input', -1), float('nan')):.2f} s"
    )
    print(
        "task durations   "
        + ", ".join(f"{t} {d:.2f} s" for (t, m), d in took.items() if t != "reassemble")
        + f"; reassemble x{len(shards)} median {statistics.median(shards):.2f} s"
    )


# a load part alone: the whole night as one part (its per-call rows split into `buckets`), into the run's folder
PART = """
from reassembler.formats.night import find_night
from reassembler.load.part_load import load_part
from reassembler.load.parts import plan_parts, write_plan
from reassembler.publish.protocol import staging_dir
from reassembler.settings import DuckDBSettings, Settings
inp, out, ds, run, memory, buckets = sys.argv[1:7]
settings = Settings(duckdb=DuckDBSettings(memory_limit=memory))
folder = staging_dir(out, ds, run)
plan = plan_parts(find_night(inp, ds), 1, int(buckets))
write_plan(folder, plan)
load_part(plan, 0, folder, settings)
"""
# one step of the merge (merge/): the global step, or one key bucket, or one rollout bucket, on any worker
MERGE_STEP = """
from reassembler.load.parts import read_plan
from reassembler.merge import bucket, keys, rollouts
from reassembler.publish.protocol import staging_dir
from reassembler.settings import DuckDBSettings, Settings
out, ds, run, memory, step, b = sys.argv[1:7]
settings = Settings(duckdb=DuckDBSettings(memory_limit=memory))
folder = staging_dir(out, ds, run)
plan = read_plan(folder)
if step == "rollouts":
    rollouts.merge_rollouts(plan, folder, (out, run), settings)
elif step == "keys":
    keys.merge_keys(plan, folder, int(b), (out, run), settings)
else:
    bucket.merge_bucket(plan, folder, int(b), (out, run), settings)
"""
# the warehouse task: the merged night committed into the warehouse, each shard's rollouts written
COMMIT = """
import reassembler.build as build
from reassembler.merge.night_load import PartsLoaded
from reassembler.publish.protocol import staging_dir
from reassembler.settings import DuckDBSettings, Settings
from reassembler.warehouse import Warehouse
out, ds, run, warehouse, memory = sys.argv[1:6]
settings = Settings(duckdb=DuckDBSettings(memory_limit=memory))
build.clear_parts = lambda plan, folder: None  # keep the parts: the next round merges them again
build.load_step(PartsLoaded(staging_dir(out, ds, run), settings), Warehouse(out, settings.duckdb, warehouse), run)
"""
PARTS_BUILD = """
from reassembler.cli import entry
inp, out, ds, parts, workers, memory = sys.argv[1:7]
rc = entry(["build", "--input", inp, "--output", out, "--ds", ds, "--load-parts", parts, "--workers", workers,
            "--memory-limit", memory, "--shards", workers])
assert rc == 0, rc
"""
BUILD_BEFORE = "df050e4"  # the last revision whose merge was one warehouse task writing every call into the file
BENCH_BUCKETS = 4  # the merge's fan-out on the bench: each bucket task measured alone


def _in_tree(tree: Path | None, body: str, *args) -> dict:
    """`run` with revision `tree` first on the path (None: this checkout)."""
    if tree is None:
        return run(body, *args)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)
    try:
        return run(body, *args)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old


SHARD = """
from reassembler.build import shard_step
from reassembler.settings import Settings
out, ds, run = sys.argv[1:4]
shard_step(out, ds, 0, run, Settings())
"""


def _night_steps(inp, out, warehouse: Path, rounds: int, memory_limit: str, shard: bool = False) -> dict:
    """A night's load as one part split into BENCH_BUCKETS buckets, then each step of the
    merge in a fresh process of its own (the global step, every key bucket, every rollout
    bucket, the warehouse task), and one shard of the whole night, `rounds` times:
    {step: [runs]} (the buckets' runs one list per bucket)."""
    runs: dict = {"part": [], "rollouts": [], "commit": [], "shard": []}
    runs.update({f"keys-{b}": [] for b in range(BENCH_BUCKETS)})
    runs.update({f"bucket-{b}": [] for b in range(BENCH_BUCKETS)})
    merge = (
        [("rollouts", 0)] + [("keys", b) for b in range(BENCH_BUCKETS)] + [("bucket", b) for b in range(BENCH_BUCKETS)]
    )
    for _ in range(rounds):
        runs["part"].append(run(PART, inp, out, DS, "bench-scale", memory_limit, BENCH_BUCKETS))
        for step, b in merge:
            name = step if step == "rollouts" else f"{step}-{b}"
            runs[name].append(run(MERGE_STEP, out, DS, "bench-scale", memory_limit, step, b))
        runs["commit"].append(run(COMMIT, out, DS, "bench-scale", warehouse, memory_limit))
        if shard:
            runs["shard"].append(run(SHARD, out, DS, "bench-scale"))
    return runs


def _medians(runs: dict, key: str = "wall") -> dict:
    """Each step's median; `keys` and `bucket`: the sum over the buckets and the largest."""
    med = {name: statistics.median(r[key] for r in rs) for name, rs in runs.items() if rs}
    for step in ("keys", "bucket"):
        each = [med[f"{step}-{b}"] for b in range(BENCH_BUCKETS)]
        med[step] = sum(each)
        med[f"{step}_max"] = max(each)
    return med


def _marginal(small: list, big: list, n_small: float, n_big: float) -> tuple[float, float]:
    """(seconds per unit, fixed seconds) from the medians of the same step on two nights."""
    a, b = statistics.median(r["wall"] for r in small), statistics.median(r["wall"] for r in big)
    return _slope(a, b, n_small, n_big)


def _slope(a: float, b: float, n_small: float, n_big: float) -> tuple[float, float]:
    per = (b - a) / (n_big - n_small)
    return per, a - per * n_small


def per_token_and_call(per_token: float, tokens_a: float, per_call: float, tokens_c: float) -> tuple[float, float]:
    """(seconds a token, seconds a call) of a step whose cost is x tokens + y calls, from its
    slope per token on nights of `tokens_a` tokens a call and its slope per call on nights
    of `tokens_c` tokens a call: per_token = x + y / tokens_a, per_call = x tokens_c + y.
    A negative share (noise) is taken as 0, the other share then the whole slope."""
    x = (per_call - per_token * tokens_a) / (tokens_c - tokens_a)
    y = (per_token - x) * tokens_a
    if x < 0:
        return 0.0, per_call
    if y < 0:
        return per_token, 0.0
    return x, y


TASK_GAP = 0.8  # s between one Celery task's end and the next one's start (docs/performance.md, "Scale, on paper")
TAIL = 6.0  # s: publish, report and gate, one after the other (docs/performance.md, "Scale, on paper")
# the DAG's steps a night, one after the other: check, wait, plan, parts, global step, key
# buckets, rollout buckets, warehouse task, shards, audit checks (publish, report and gate: TAIL)
STEPS = 10


def model_seconds(f: dict, tokens: float, workers: int, tokens_per_call: float) -> dict:
    """The modelled night of `tokens` on `workers` workers (one task slot each; as many
    parts, merge buckets and shards as slots), from the measured figures `f` (scale_main):
    the parts, the buckets and the shards spread over the workers (a bucket's share the
    largest measured, `skew`), the global step and the warehouse task serial, each task's
    fixed gap."""
    calls = tokens / tokens_per_call
    parts = (f["part_token"] * tokens + f["part_call"] * calls) * f["part_s3"] / workers + f["part_fixed"]
    skew = f["skew"] if workers > 1 else 1.0
    buckets = (
        (f["keys_call"] + f["bucket_call"]) * calls * f["merge_s3"] * skew / workers
        + f["keys_fixed"]
        + f["bucket_fixed"]
    )
    serial = (f["global_call"] + f["commit_call"]) * calls + f["global_fixed"] + f["commit_fixed"]
    shards = (f["shard_token"] * tokens + f["shard_call"] * calls) * f["shard_s3"] / workers + f["shard_fixed"]
    fixed = STEPS * TASK_GAP + TAIL
    total = parts + buckets + serial + shards + fixed
    return {"parts": parts, "buckets": buckets, "serial": serial, "shards": shards, "fixed": fixed, "total": total}


def print_model(f: dict, shapes: list[tuple[str, float]]) -> None:
    """T(N tokens, W workers) for 1B, 10B and 100B tokens on 1, 8, 32 and 64 workers, for
    each shape (tokens a call), with issue 48's goals marked."""
    goals = {(10e9, 8): 15 * 60, (100e9, 64): 30 * 60}
    workers = (1, 8, 32, 64)
    for shape, per_call in shapes:
        print(
            f"model        {shape}, {per_call:.0f} tokens a call: minutes "
            "(parts + merge buckets + global and warehouse + shards + fixed)"
        )
        print("             tokens | " + " | ".join(f"{w:>2} workers" for w in workers))
        for tokens in (1e9, 10e9, 100e9):
            cells = []
            for w in workers:
                m = model_seconds(f, tokens, w, per_call)
                cell = f"{m['total'] / 60:8.1f}"
                if (tokens, w) in goals:
                    cell += f" (goal < {goals[tokens, w] // 60}) {_met(m['total'] < goals[tokens, w])}"
                cells.append(cell)
            big = 64 if tokens >= 100e9 else 8
            m = model_seconds(f, tokens, big, per_call)
            print(
                f"             {tokens / 1e9:>4.0f}B  | "
                + " | ".join(cells)
                + f"   [{big} workers: parts {m['parts'] / 60:.1f} + buckets {m['buckets'] / 60:.1f}"
                f" + global/warehouse {m['serial'] / 60:.1f} + shards {m['shards'] / 60:.1f} + {m['fixed'] / 60:.1f}]"
            )


def scale_main(work: Path, tokens: float, rounds: int, reuse: bool, memory_limit: str) -> dict:
    """The load and the merge in parts and buckets, measured for the scale model
    (docs/performance.md, "Scale, on paper"): a part, the global step, each key and rollout bucket, the
    warehouse task and a shard, each in a fresh process, on the 1x and the 4x night of two
    shapes (~1,000 and ~200 tokens a call), so that each step's cost per call is the slope
    between them and the rest a fixed cost; the same from the local S3 server, its factor
    taken from the worker's own CPU time (the server shares this machine's cores: its CPU
    would be charged to wall time); and the one-process build against the revision before
    the buckets, interleaved. Returns the figures the model takes."""
    root, t1 = night(work, "1x", tokens, seed=1, reuse=reuse)
    root4, t4 = night(work, "4x", 4 * tokens, seed=2, reuse=reuse)
    calls_rollouts = max(8, int(tokens / 5_000))  # ~2,000 rollouts, ~47k calls for the 10M-token bench
    rootc, tc = calls_night(work, "calls-1x", calls_rollouts, seed=5, reuse=reuse)
    rootc4, tc4 = calls_night(work, "calls-4x", 4 * calls_rollouts, seed=6, reuse=reuse)
    # the same rollouts as calls 1x, 4x the calls each: what grows with calls alone
    rootd, td = calls_night(work, "calls-deep", calls_rollouts, seed=5, reuse=reuse, deeper=4)
    inp = root / "input"
    steps = {}
    nights = (("1x", root), ("4x", root4), ("calls-1x", rootc), ("calls-4x", rootc4), ("calls-deep", rootd))
    for tag, r in nights:
        out = work / f"scale-{tag}"
        shutil.rmtree(out, ignore_errors=True)
        (work / f"scale-{tag}.duckdb").unlink(missing_ok=True)  # its size after one night is measured
        steps[tag] = _night_steps(
            r / "input", out, work / f"scale-{tag}.duckdb", rounds, memory_limit, shard=tag != "calls-deep"
        )
    tree = revision_tree(work.resolve(), BUILD_BEFORE)
    for name in ("scale-before", "scale-now"):  # each revision's own warehouse (an older one refuses a newer file)
        shutil.rmtree(work / name, ignore_errors=True)
    # the one-process build as users run it, this revision against the one before the buckets
    before, now = interleaved(
        rounds if tree is not None else 0,
        lambda: _in_tree(tree, BUILD, inp, work / "scale-before", DS, 1, 1, memory_limit),
        lambda: run(BUILD, inp, work / "scale-now", DS, 1, 1, memory_limit),
    )
    two_workers = run(PARTS_BUILD, inp, work / "scale-b2w", DS, 2, 2, memory_limit)
    # from the local S3 server: the input and the run's folder on the store
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from s3server import S3Server

    server = S3Server(work / "moto-scale.log")
    try:
        os.environ.update(server.env)
        uri_in, uri_out = f"s3://{server.bucket('scale-in')}/capture", f"s3://{server.bucket('scale-out')}/rows"
        server.upload(inp, uri_in)
        remote = _night_steps(uri_in, uri_out, work / "scale-s3.duckdb", rounds, memory_limit, shard=True)
    finally:
        server.stop()
    c1, c4, n1, n4 = t1["calls"], t4["calls"], t1["tokens"], t4["tokens"]
    cc1, cc4, nc1, nc4 = tc["calls"], tc4["calls"], tc["tokens"], tc4["tokens"]
    med = {tag: _medians(r) for tag, r in steps.items()}
    cpu = {tag: _medians(r, "cpu") for tag, r in steps.items()}
    rcpu, rmed = _medians(remote, "cpu"), _medians(remote)
    print(
        f"scale        nights 1x ({n1 / 1e6:.1f}M tokens, {c1} calls), 4x ({n4 / 1e6:.1f}M, {c4} calls), calls 1x "
        f"({nc1 / 1e6:.1f}M, {cc1} calls), calls 4x ({nc4 / 1e6:.1f}M, {cc4} calls); {rounds} rounds, medians, each "
        f"step a fresh process; the merge in {BENCH_BUCKETS} buckets"
    )
    for tag in steps:
        m = med[tag]
        print(
            f"steps {tag:<8} wall s: part {m['part']:.2f}, global {m['rollouts']:.2f}, keys {m['keys']:.2f} "
            f"(largest {m['keys_max']:.2f}), buckets {m['bucket']:.2f} (largest {m['bucket_max']:.2f}), "
            f"warehouse {m['commit']:.2f}" + (f", one shard {m['shard']:.2f}" if "shard" in m else "")
        )
    slopes = {}
    for step in ("part", "rollouts", "keys", "bucket", "commit"):
        per_b, fixed_b = _slope(med["1x"][step], med["4x"][step], c1, c4)
        per_c, fixed_c = _slope(med["calls-1x"][step], med["calls-4x"][step], cc1, cc4)
        slopes[step] = (per_b, fixed_b, per_c, fixed_c)
        print(
            f"per call     {step:<9} bench shape {per_b * 1e6:6.2f} us (fixed {fixed_b:.2f} s); calls-heavy "
            f"{per_c * 1e6:6.2f} us (fixed {fixed_c:.2f} s)"
        )
    skews = [
        med[tag][f"{step}_max"] / (med[tag][step] / BENCH_BUCKETS) for tag in ("4x", "calls-4x") for step in ("bucket",)
    ]
    skew = max(skews)
    warehouse_slope = max(slopes["commit"][0], slopes["commit"][2])
    cd = td["calls"]
    deep = {step: _slope(med["calls-1x"][step], med["calls-deep"][step], cc1, cd)[0] for step in ("commit", "rollouts")}
    print(
        f"warehouse    the same {calls_rollouts} rollouts with {cc1} and {cd} calls: the warehouse task "
        f"{deep['commit'] * 1e6:.2f} us a call (goal < 0.5)  {_met(deep['commit'] < 0.5e-6)}, the global step "
        f"{deep['rollouts'] * 1e6:.2f} us a call; with the rollouts growing as the calls (above), "
        f"{warehouse_slope * 1e6:.2f} us a call: they grow with rollouts; the largest of {BENCH_BUCKETS} buckets "
        f"{skew:.2f} x the mean"
    )
    size = lambda tag: (work / f"scale-{tag}.duckdb").stat().st_size  # noqa: E731
    print(
        f"warehouse    file size after one night: 1x {size('1x') / 2**20:.1f} MiB, 4x {size('4x') / 2**20:.1f} MiB, "
        f"calls 1x {size('calls-1x') / 2**20:.1f} MiB, calls 4x {size('calls-4x') / 2**20:.1f} MiB, same rollouts "
        f"4x calls {size('calls-deep') / 2**20:.1f} MiB"
    )
    part_s3 = rcpu["part"] / cpu["1x"]["part"]
    merge_s3 = (rcpu["keys"] + rcpu["bucket"]) / (cpu["1x"]["keys"] + cpu["1x"]["bucket"])
    shard_s3 = rcpu["shard"] / cpu["1x"]["shard"]
    wall_merge = (rmed["keys"] + rmed["bucket"]) / (med["1x"]["keys"] + med["1x"]["bucket"])
    print(
        f"S3           from the local S3 server, worker CPU / local CPU (not wall: the server's CPU shares these "
        f"cores): part x{part_s3:.2f}, merge buckets x{merge_s3:.2f}, shard x{shard_s3:.2f}; wall would say "
        f"x{rmed['part'] / med['1x']['part']:.2f}, x{wall_merge:.2f}, "
        f"x{rmed['shard'] / med['1x']['shard']:.2f}"
    )
    per_call_b, per_call_c = n1 / c1, nc1 / cc1  # tokens a call of each shape
    part_per_token = (med["4x"]["part"] - med["1x"]["part"]) / (n4 - n1)
    part_token, part_call = per_token_and_call(part_per_token, per_call_b, slopes["part"][2], per_call_c)
    # a shard's cost split as a part's: per token and per call from the slopes between each
    # shape's 1x and 4x nights, the rest fixed; and, as issue 48 took its 66.8 us, its whole
    # cost on the 1x nights over their tokens and calls (fixed costs included)
    shard_per_token = (med["4x"]["shard"] - med["1x"]["shard"]) / (n4 - n1)
    shard_per_call_c, shard_fixed = _slope(med["calls-1x"]["shard"], med["calls-4x"]["shard"], cc1, cc4)
    shard_token, shard_call = per_token_and_call(shard_per_token, per_call_b, shard_per_call_c, per_call_c)
    whole_token, whole_call = per_token_and_call(
        med["1x"]["shard"] / n1, per_call_b, med["calls-1x"]["shard"] / cc1, per_call_c
    )
    part_whole = per_token_and_call(med["1x"]["part"] / n1, per_call_b, med["calls-1x"]["part"] / cc1, per_call_c)
    print(
        f"per call     shard: {shard_token * 1e9:.0f} ns a token + {shard_call * 1e6:.1f} us a call + "
        f"{max(shard_fixed, 0):.2f} s (slopes 1x -> 4x); whole cost over the 1x nights (fixed included, as issue 48 "
        f"took 61.8 and 66.8 us): a part {part_whole[1] * 1e6:.1f} us a call, a shard {whole_call * 1e6:.1f} us a "
        f"call ({whole_token * 1e9:.0f} ns a token)"
    )
    figures = {
        "part_token": part_token,
        "part_call": part_call,
        "part_fixed": max(slopes["part"][1], 0.0),
        "part_s3": part_s3,
        "global_call": max(slopes["rollouts"][0], slopes["rollouts"][2], 0.0),
        "global_fixed": max(slopes["rollouts"][1], 0.0),
        "keys_call": max(slopes["keys"][0], slopes["keys"][2], 0.0),
        "keys_fixed": max(slopes["keys"][3], 0.0) / BENCH_BUCKETS,
        "bucket_call": max(slopes["bucket"][0], slopes["bucket"][2], 0.0),
        "bucket_fixed": max(slopes["bucket"][3], 0.0) / BENCH_BUCKETS,
        "merge_s3": merge_s3,
        "skew": skew,
        "commit_call": max(warehouse_slope, 0.0),
        "commit_fixed": max(slopes["commit"][1], 0.0),
        "shard_token": shard_token,
        "shard_call": shard_call,
        "shard_fixed": max(shard_fixed, 0.0),
        "shard_s3": shard_s3,
    }
    print(
        f"model parts  a part {part_token * 1e9:.0f} ns a token + {part_call * 1e6:.1f} us a call, x{part_s3:.2f} "
        f"from S3; a shard {shard_token * 1e9:.0f} ns a token + {shard_call * 1e6:.1f} us a call "
        f"+ {figures['shard_fixed']:.2f} s, x{shard_s3:.2f}; "
        f"merge buckets {(figures['keys_call'] + figures['bucket_call']) * 1e6:.1f} us a call in all (x{skew:.2f} "
        f"for the largest, x{merge_s3:.2f} from S3) + {figures['keys_fixed'] + figures['bucket_fixed']:.2f} s a "
        f"bucket; global step and warehouse task {(figures['global_call'] + figures['commit_call']) * 1e6:.2f} us a "
        f"call + {figures['global_fixed'] + figures['commit_fixed']:.2f} s; {STEPS} steps x {TASK_GAP} s under "
        f"Celery, {TAIL:.0f} s of publish, report and gate"
    )
    print_model(
        figures, [("~1,000 tokens a call", 1000.0), ("bench shape", per_call_b), ("calls-heavy shape", per_call_c)]
    )
    if before:
        ratio = statistics.median(r["wall"] for r in now) / statistics.median(r["wall"] for r in before)
        print(
            f"build        one process, 1 shard: {BUILD_BEFORE} wall {spread(before, 'wall')} CPU "
            f"{spread(before, 'cpu')}, this revision wall {spread(now, 'wall')} CPU {spread(now, 'cpu')}; ratio "
            f"now / before = {ratio:.2f}"
            f" per round {paired(now, before, 'wall')}   (goal <= 1.00, noise ~5%)"
        )
    else:
        print(f"build        {BUILD_BEFORE}: not in this history, skipped")
    print(f"build        2 parts in 2 worker processes: wall {two_workers['wall']:.2f} s")
    return figures


GATES = ("mask_rate", "reason_rate", "mask_rate_rise", "rejects")


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=float, default=10e6)
    p.add_argument("--rounds", type=int, default=3, help="interleaved floor/build pairs")
    p.add_argument("--workdir", default="bench-out")
    p.add_argument("--workers", type=int, default=2, help="for the parallel run: shards = workers")
    p.add_argument("--memory-limit", default=DuckDBSettings.memory_limit, help="DuckDB memory_limit of the builds")
    p.add_argument("--report-only", action="store_true", help="only time the capture-quality report")
    p.add_argument(
        "--local-only", action="store_true", help="only compare NeMo Gym's local capture mode with its staged capture"
    )
    p.add_argument(
        "--s3-only", action="store_true", help="only compare the build on a local S3 server with the local build"
    )
    p.add_argument("--celery-only", action="store_true", help="only the fixed cost of a task under Celery")
    p.add_argument(
        "--verifiers-only", action="store_true", help="only verifiers traces against NeMo Gym's rebuilt lines"
    )
    p.add_argument(
        "--envelope-only", action="store_true", help="only NeMo Gym's compaction-agent lines against its rebuilt lines"
    )
    p.add_argument("--art-only", action="store_true", help="only OpenPipe ART's trajectories against verifiers")
    p.add_argument("--scale-only", action="store_true", help="only the load in parts: part, merge, 1 vs 2 parts")
    p.add_argument(
        "--latency-only", action="store_true", help="only the build on S3 with 0, 20 and 100 ms added to each request"
    )
    p.add_argument("--s3-latency-ms", type=float, default=0.0, help="--s3-only: ms added to each request")
    p.add_argument("--reuse", action="store_true", help="reuse the nights of an earlier run in --workdir")
    p.add_argument(
        "--against", default=AGAINST, help="the revision the throughput goal doubles ('' to skip that comparison)"
    )
    args = p.parse_args()
    work = Path(args.workdir)
    if args.report_only:
        return report_main(work)
    if args.local_only:
        return local_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit)
    if args.celery_only:
        return celery_main(work, args.tokens, args.reuse)
    if args.verifiers_only:
        return verifiers_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit)
    if args.envelope_only:
        return envelope_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit)
    if args.art_only:
        return art_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit)
    if args.scale_only:
        scale_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit)
        return
    if args.s3_only:
        return s3_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit, args.s3_latency_ms)
    if args.latency_only:
        return latency_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit)

    root1, t1 = night(work, "1x", args.tokens, seed=1, reuse=args.reuse)
    floors, builds = interleaved(
        args.rounds, lambda: floor(root1, work / "floor"), lambda: build(root1, 1, 1, args.memory_limit)
    )
    root4, t4 = night(work, "4x", 4 * args.tokens, seed=2, reuse=args.reuse)
    floors4, builds4 = interleaved(
        args.rounds, lambda: floor(root4, work / "floor"), lambda: build(root4, 1, 1, args.memory_limit)
    )
    b4 = {k: statistics.median(r[k] for r in builds4) for k in ("wall", "cpu", "rss_mib")}
    bp = build(root1, args.workers, args.workers, args.memory_limit)

    med = {k: statistics.median(r[k] for r in builds) for k in ("wall", "cpu", "main_cpu", "rss_mib")}
    fmed = {k: statistics.median(r[k] for r in floors) for k in ("wall", "cpu")}
    print(f"DuckDB memory_limit {args.memory_limit}; {args.rounds} interleaved rounds, medians (min, max)")
    print(
        f"night 1x: {t1['rollouts']} rollouts, {t1['calls']} calls, {t1['tokens'] / 1e6:.1f}M tokens, "
        f"{t1['token_files']} token files"
    )
    print(f"night 4x: {t4['rollouts']} rollouts, {t4['calls']} calls, {t4['tokens'] / 1e6:.1f}M tokens")
    for name, root in (("1x", root1), ("4x", root4)):
        agree, total = outcomes_match(root)
        print(f"night {name}: {agree}/{total} audit rows match the outcomes synth recorded")
    print(
        f"floor 1x  wall {spread(floors, 'wall')}; CPU {spread(floors, 'cpu')}; "
        f"main thread CPU {spread(floors, 'main_cpu')}"
    )
    print(
        f"build 1x  wall {spread(builds, 'wall')}; CPU {spread(builds, 'cpu')}; "
        f"main thread CPU {spread(builds, 'main_cpu')}; peak RSS {spread(builds, 'rss_mib', 'MiB', 0)}; "
        f"{t1['tokens'] / med['wall'] / 1e6:.1f}M tokens/s"
    )
    print(f"floor 4x  wall {spread(floors4, 'wall')}; CPU {spread(floors4, 'cpu')}")
    print(
        f"build 4x  wall {spread(builds4, 'wall')}; CPU {spread(builds4, 'cpu')}; "
        f"peak RSS {spread(builds4, 'rss_mib', 'MiB', 0)}; {t4['tokens'] / b4['wall'] / 1e6:.1f}M tokens/s"
    )
    print(
        f"build 1x, {args.workers} shards in {args.workers} worker processes: wall {bp['wall']:.2f} s, "
        f"CPU {bp['cpu']:.2f} s; peak RSS {bp['rss_mib']:.0f} MiB main + {bp['worker_rss_mib']:.0f} MiB per worker"
    )
    speed, cpu = med["wall"] / fmed["wall"], med["cpu"] / fmed["cpu"]
    memory, growth = med["rss_mib"], b4["rss_mib"] / med["rss_mib"]
    rate = t1["tokens"] / med["wall"] / 1e6
    print(f"speed ratio  build / floor, wall       = {speed:.2f}   (goal <= 1.5, stretch 1.2)  {_met(speed <= 1.5)}")
    print(f"speed ratio  build / floor, CPU        = {cpu:.2f}   (goal <= 2.5)  {_met(cpu <= 2.5)}")
    print(
        f"             per round, wall {paired(builds, floors, 'wall')}; "
        f"CPU {paired(builds, floors, 'cpu')}  (for the spread; the goals use the ratios above)"
    )
    f4 = {k: statistics.median(r[k] for r in floors4) for k in ("wall", "cpu")}
    print(
        f"speed ratio  build / floor at 4x        = {b4['wall'] / f4['wall']:.2f} wall, "
        f"{b4['cpu'] / f4['cpu']:.2f} CPU  (for information: how the ratio moves on a bigger night; "
        "the goals are set at 1x)"
    )
    print(f"speed ratio  {args.workers} workers / floor, wall   = {bp['wall'] / fmed['wall']:.2f}")
    print(f"memory       peak RSS 1x               = {memory:.0f} MiB (goal <= 1024)  {_met(memory <= 1024)}")
    print(f"memory ratio peak RSS 4x / 1x          = {growth:.2f}   (goal <= 1.20)  {_met(growth <= 1.2)}")
    print(
        f"throughput   one process               = {rate:.1f}M tokens/s (2x the 4.8 of 2026-11-29 is 9.6, on that "
        "day's machine; see the next line)"
    )
    try:
        vs = against(work, args.against, args.tokens, args.rounds, args.reuse) if args.against else None
    except RuntimeError as e:  # the other revision failed: the figures above stand
        print(f"throughput   vs {args.against}: failed ({e})")
    else:
        _print_against(args.against, vs)
    local_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit)
    verifiers_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit)
    s3_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit, args.s3_latency_ms)
    latency_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit)
    scale_main(work, args.tokens, args.rounds, args.reuse, args.memory_limit)
    report_main(work)


def _print_against(rev: str, vs: dict | None) -> None:
    if vs is None:
        print(f"throughput   vs {rev or 'an earlier revision'}: skipped (not asked, or not in this history)")
    else:
        up = vs["theirs"] / vs["ours"]
        print(
            f"throughput   vs {rev}, same night and machine = x{up:.2f} "
            f"({vs['tokens'] / vs['ours'] / 1e6:.1f}M against {vs['tokens'] / vs['theirs'] / 1e6:.1f}M tokens/s; "
            f"per round x{statistics.median(vs['ratios']):.2f}, min {vs['ratios'][0]:.2f}, max {vs['ratios'][-1]:.2f}) "
            f"(goal >= 2)  {_met(up >= 2)}"
        )


if __name__ == "__main__":
    main()
