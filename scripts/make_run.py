"""`make run`: a synthetic night with faults, built by the Airflow DAG on the embedded
defaults (SQLite metadata DB in .airflow/, DuckDB warehouse and Parquet under data/).

It tells the truth about the run: the DAG run's state and each task's come from Airflow
(`airflow dags list-runs`, `airflow tasks states-for-dag-run`), never from a grep of the
log. A failed run exits 1 naming the failing task and its last error line; the paths of the
rows, audit and report are printed only for what this run published.

Environment (scripts/make_run.sh sets the embedded defaults): DS, SEED, ROLLOUTS, and
MAKE_RUN_CONF, a JSON object of DAG params added to the run's conf (tests use it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

DAG = "capture_rows_nightly"
AIRFLOW = str(Path(sys.executable).parent / "airflow")
REASSEMBLER = str(Path(sys.executable).parent / "reassembler")
EXCEPTION_LINE = re.compile(r"^[\w.]+(?:Exception|Error|Failed|Breached): .+")


def run(*cmd: str, log: Path | None = None) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if log is not None:
        log.write_text(res.stdout + res.stderr)
    return res


def json_out(*cmd: str):
    """The JSON an `airflow ... -o json` command prints (warnings may come before it)."""
    res = run(*cmd)
    for line in res.stdout.splitlines():
        if line.startswith(("[{", "[]")):
            return json.loads(line)
    return []


def main() -> int:
    home = Path(os.environ["AIRFLOW_HOME"])
    inp, out = os.environ["REASSEMBLER_INPUT"], os.environ["REASSEMBLER_OUTPUT"]
    ds, seed, rollouts = (
        os.environ.get("DS", "2026-11-28"),
        os.environ.get("SEED", "7"),
        os.environ.get("ROLLOUTS", "240"),
    )
    conf = {"ds": ds, **json.loads(os.environ.get("MAKE_RUN_CONF") or "{}")}

    print(f"== airflow db migrate (SQLite at {home}/airflow.db)", flush=True)
    migrated = run(AIRFLOW, "db", "migrate", log=home / "db-migrate.log")
    if migrated.returncode != 0:
        print((migrated.stdout + migrated.stderr)[-3000:])
        return 1

    print(f"== reassembler synth: ds={ds}, {rollouts} rollouts, seed {seed}", flush=True)
    for kind in ("rollouts", "ledger", "tokens", "_expected"):
        subprocess.run(["rm", "-rf", f"{inp}/{kind}/ds={ds}"], check=True)
    synth = run(REASSEMBLER, "synth", "--output", inp, "--ds", ds, "--rollouts", rollouts, "--seed", seed)
    print(synth.stdout.rstrip() or synth.stderr.rstrip(), flush=True)
    if synth.returncode != 0:
        return 1

    # no logical date: the run starts now, so its duration in the UI is the real one; the
    # night comes from the conf (`ds`), as a run triggered by hand takes it
    log = home / "last-run.log"
    print(f"== airflow dags test {DAG} (ds={ds}); log: {log}", flush=True)
    run(AIRFLOW, "dags", "test", DAG, "-c", json.dumps(conf), log=log)
    text = log.read_text()
    named = re.search(r"creating dag run .*?run_id=(\S+)", text)
    runs = json_out(AIRFLOW, "dags", "list-runs", DAG, "-o", "json")
    mine = [r for r in runs if named and r["run_id"] == named.group(1)] or runs[:1]
    if not mine:
        print(f"the DAG run did not start; see {log}")
        print("\n".join(text.strip().splitlines()[-15:]))
        return 1
    dag_run = mine[0]
    states = json_out(AIRFLOW, "tasks", "states-for-dag-run", DAG, dag_run["run_id"], "-o", "json")
    state = {}
    for t in states:
        state.setdefault(t["task_id"], []).append(t["state"])
    for line in text.splitlines():
        if line.startswith(("ds=", "loaded ds=", "  rollouts", "  ledger", "  tokens", "  not read")):
            print(line)
        elif line.startswith(("audit checks passed", "published ds=", "quality gate passed")):
            print(line)

    published = all(s == "success" for s in state.get("publish", ["none"]))
    if dag_run["state"] != "success":
        failed = sorted(t for t, s in state.items() if "failed" in s)
        errors = [line for line in text.splitlines() if EXCEPTION_LINE.match(line)]
        print(f"\n== the DAG run {dag_run['run_id']} FAILED (state {dag_run['state']})")
        print(f"failed task: {', '.join(failed) or '(none recorded)'}")
        print(f"its last error: {errors[-1] if errors else '(none in the log)'}")
        print(f"full log: {log}")
        if published:
            print(f"the rows were published before it failed: {out}/rows/ds={ds}/")
        else:
            print(f"nothing was published for ds={ds}")
        return 1

    print("\n== published by", dag_run["run_id"])
    print(f"rows:      {out}/rows/ds={ds}/")
    print(f"audit:     {out}/audit/ds={ds}/")
    print(f"warehouse: {out}/warehouse.duckdb")
    report = run(REASSEMBLER, "report", "--output", out)
    print(report.stdout.rstrip())
    print("\ncapture-quality report (open it in a browser, no network needed):")
    print(f"  {out}/reports/ds={ds}/index.html")
    print(f"  all nights: {out}/reports/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
