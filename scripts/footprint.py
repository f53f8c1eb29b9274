"""What a night costs a worker: peak memory, threads and disk of `reassembler build`.

    python scripts/footprint.py --tokens 1e9 --workdir /data/footprint [--workers 2] [--reuse]

Writes a synthetic night of about `--tokens` tokens (the bench shape, ~1,900 tokens a call),
builds it with `--workers W --shards W --load-parts W` (each part and each shard in a worker
process of its own, as the DAG's mapped tasks run them) and samples every process of the
build five times a second: the largest resident set of one process (what one Airflow task
needs), the sum over the processes at once (what one machine running W tasks needs), the
threads of one process and in all, and the disk the output, the warehouse and DuckDB's spill
folder take. docs/deploy.md quotes a run of it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DS = "2026-11-28"
TOKENS_PER_ROLLOUT = 43_000  # the bench shape (scripts/benchmark.py)


def _tree(root: int) -> list[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _status(pid: int) -> tuple[int, int]:
    """(resident bytes, threads) of a process; (0, 0) once it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except OSError:
        return 0, 0
    return int(fields["VmRSS"].split()[0]) * 1024 if "VmRSS" in fields else 0, int(fields["Threads"])


def _pss(pid: int) -> int:
    """Proportional set size: the process's own pages, and its share of those it shares (a
    forked worker's pages inherited from the command count half in each): what it adds."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _role(pid: int, main: int) -> str:
    """What a process of the build is: the command itself, a worker it forked, a load child."""
    if pid == main:
        return "the command"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    return "a load child" if b"-P" in cmdline else "a worker process"


def _du(path: Path) -> int:
    """Bytes of a file, or of every file under a folder (0 when missing), a file with several
    names (the output's hard links) once."""
    if path.is_file():
        return path.stat().st_size
    if not path.exists():
        return 0
    seen = {}
    for p in path.rglob("*"):
        if p.is_file():
            st = p.stat()
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=float, default=1e8)
    p.add_argument("--workdir", default="footprint-out")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--load-parts", type=int, default=None, help="default: as many as --workers")
    p.add_argument("--reuse", action="store_true", help="reuse the night an earlier run wrote in --workdir")
    args = p.parse_args()
    work = Path(args.workdir).absolute()
    inp, out, spill = work / "input", work / "output", work / "spill"
    if not (args.reuse and (inp / "rollouts" / f"ds={DS}").exists()):
        shutil.rmtree(work, ignore_errors=True)
        from reassembler.producer.synth import SynthConfig, synth_night

        started = time.monotonic()
        totals = synth_night(inp, DS, SynthConfig(rollouts=max(8, int(args.tokens / TOKENS_PER_ROLLOUT)), seed=11))
        (work / "totals.json").write_text(json.dumps(totals, default=str))
        print(f"synth: {totals['tokens']:,} tokens, {totals['calls']:,} calls in {time.monotonic() - started:.0f} s")
    totals = json.loads((work / "totals.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(spill, ignore_errors=True)
    w = str(args.workers)
    cmd = [sys.executable, "-m", "reassembler.cli", "build", "--input", str(inp), "--output", str(out), "--ds", DS]
    parts = str(args.load_parts or args.workers)
    cmd += ["--workers", w, "--shards", w, "--load-parts", parts, "--temp-directory", str(spill)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_one = peak_sum = threads_one = threads_all = spill_peak = processes = pss_one = 0
    by_pid: dict[int, tuple[int, str]] = {}  # pid -> (its peak, what it is)
    while proc.poll() is None:
        pids = _tree(proc.pid)
        seen = [_status(pid) for pid in pids]
        for pid, (rss, _) in zip(pids, seen):
            if rss > by_pid.get(pid, (0, ""))[0]:
                by_pid[pid] = (rss, by_pid.get(pid, (0, _role(pid, proc.pid)))[1] or _role(pid, proc.pid))
        for pid in pids:
            pss_one = max(pss_one, _pss(pid))
        processes = max(processes, len(seen))
        peak_one = max(peak_one, *(rss for rss, _ in seen))
        peak_sum = max(peak_sum, sum(rss for rss, _ in seen))
        threads_one = max(threads_one, *(t for _, t in seen))
        threads_all = max(threads_all, sum(t for _, t in seen))
        spill_peak = max(spill_peak, _du(spill))
        time.sleep(0.2)
    wall = time.monotonic() - started
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"build failed ({proc.returncode}): {stderr.strip()[-2000:]}")
    mib = 1 << 20
    report = {
        "tokens": totals["tokens"],
        "calls": totals["calls"],
        "rollouts": totals["rollouts"],
        "workers": args.workers,
        "load_parts": int(parts),
        "wall_s": round(wall, 1),
        "peak_rss_one_process_mib": round(peak_one / mib),
        "peak_rss_all_processes_mib": round(peak_sum / mib),
        "peak_pss_one_process_mib": round(pss_one / mib),
        "processes_at_once": processes,
        "threads_one_process": threads_one,
        "threads_all": threads_all,
        "input_mib": round(_du(inp) / mib),
        "output_mib": round((_du(out) - _du(out / "warehouse.duckdb")) / mib),
        "rows_mib": round(_du(out / "rows") / mib),
        "per_call_tables_mib": round(_du(out / "calls") / mib),
        "warehouse_mib": round(_du(out / "warehouse.duckdb") / mib, 1),
        "warehouse_copies_mib": round(_du(out / "_warehouse") / mib, 1),
        "spill_peak_mib": round(spill_peak / mib),
        "largest_processes_mib": [f"{rss / mib:.0f} {role}" for rss, role in sorted(by_pid.values(), reverse=True)[:4]],
    }
    print(stdout.strip().splitlines()[0])
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
