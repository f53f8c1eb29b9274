"""capture_rows_nightly: one night of agent capture -> verified training rows + audit table.

Runs every day at 02:00 UTC for the previous day's partition (ds = logical date - 1 day;
the `ds` param overrides it for manual runs and backfills).

    check_input -> load_ledger -> reassemble[shard 0..K-1] -> audit_checks -> publish
        -> quality_report -> quality_gate

- check_input:   resolve ds, input and output roots; fail naming what is missing.
- load_ledger:   export the night's ledger and rollouts into the DuckDB warehouse
                 (sql/, idempotent: a rerun replaces the night) and plan K shards.
- reassemble:    ReassembleOperator, mapped over the shards; each streams its rollouts'
                 calls joined with the token Parquet and stages rows and audit files.
- audit_checks:  SQL checks on the staged night (rollouts in = audit rows, ok rollouts =
                 distinct rollouts in rows, mask rate under the limit).
- publish:       swap the rows and audit partitions in whole, record the run, and emit the
                 rows Asset with counts and mask reasons in the event's extra.
- quality_report: write the night's capture-quality report (<output>/reports/ds=<ds>/)
                 and the index over all nights, from the warehouse alone.
- quality_gate:  check the night against the alert thresholds (gate_* params), record the
                 verdict, and fail with every breach listed, so the deployment's failure
                 alerts fire; the rows stay published.
"""
from __future__ import annotations

import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow.sdk import Asset, Metadata, Param, Variable, dag, task

from reassembler_airflow.failures import task_errors
from reassembler_airflow.operators import ReassembleOperator

REPO = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = os.environ.get("REASSEMBLER_INPUT", str(REPO / "data" / "input"))
DEFAULT_OUTPUT = os.environ.get("REASSEMBLER_OUTPUT", str(REPO / "data" / "output"))
ROWS_ASSET = Asset(name="capture_rows", uri=f"file://{DEFAULT_OUTPUT}/rows")


def _setting(name: str, default: str) -> str:
    """Airflow Variable reassembler_<name>, else the environment, else the repo default."""
    return Variable.get(f"reassembler_{name}", default=None) or default


@dag(
    dag_id="capture_rows_nightly",
    schedule="0 2 * * *",
    start_date=datetime(2026, 11, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,  # one writer per warehouse file
    render_template_as_native_obj=True,
    default_args={"retries": int(os.environ.get("REASSEMBLER_TASK_RETRIES", "1")),
                  "retry_delay": timedelta(minutes=5)},
    tags=["capture", "training-data"],
    params={
        "ds": Param(None, type=["null", "string"], pattern=r"^\d{4}-\d{2}-\d{2}$",
                    description="night to build (YYYY-MM-DD); default: the day before the logical date"),
        "shards": Param(4, type="integer", minimum=1, maximum=256),
        "mode": Param("select", enum=["select", "terminal"]),
        "offchain": Param("selected", enum=["selected", "strict"]),
        "std_normalize": Param(True, type="boolean"),
        "leave_one_out": Param(False, type="boolean"),
        "max_mask_rate": Param(0.5, type="number", minimum=0, maximum=1),
        "duckdb_memory_limit": Param("128MB", type="string", pattern=r"^\d+(\.\d+)?\s*([KMGT]i?B|B)$",
                                     description="DuckDB memory_limit of every task (the core's default)"),
        "duckdb_threads": Param(2, type="integer", minimum=1),
        "gate_max_mask_rate": Param(0.2, type=["null", "number"], minimum=0, maximum=1,
                                    description="alert when the night's mask rate is above this (null: off)"),
        "gate_max_reason_rate": Param(0.1, type=["null", "number"], minimum=0, maximum=1,
                                      description="alert when one reason masks more than this share of rollouts"),
        "gate_max_mask_rate_rise": Param(0.05, type=["null", "number"], minimum=0, maximum=1,
                                         description="alert when the mask rate rises more than this over the "
                                                     "trailing 7-night mean"),
        "gate_max_rejects": Param(0, type=["null", "integer"], minimum=0,
                                  description="alert when more input lines than this were rejected"),
        "report_nights": Param(30, type="integer", minimum=1, description="nights shown in the report's trends"),
        "report_by": Param(None, type=["null", "string"],
                           description="rollout metadata keys to break the mask rate down by, comma-separated "
                                       "(default: the keys present on most rollouts)"),
        "duckdb_temp_directory": Param(None, type=["null", "string"], description="DuckDB spill folder; default: <output>/_tmp/duckdb"),
    },
    doc_md=__doc__,
)
def capture_rows_nightly():
    @task(multiple_outputs=True)
    def check_input(params=None, logical_date=None, dag_run=None, run_id=None) -> dict:
        """Resolve the night and check that its input partitions exist."""
        from reassembler.read import find_night

        ds = params.get("ds")
        if not ds:
            anchor = logical_date or dag_run.run_after
            ds = (anchor - timedelta(days=1)).date().isoformat()
        input_dir, output_dir = _setting("input", DEFAULT_INPUT), _setting("output", DEFAULT_OUTPUT)
        with task_errors():
            night = find_night(input_dir, ds)  # raises naming the missing folder
        print(f"ds={ds}: {len(night.rollouts)} rollout files, {len(night.ledger)} ledger files, "
              f"{len(night.tokens)} token files under {input_dir}")
        return {"ds": ds, "input_dir": input_dir, "output_dir": output_dir,
                "run_key": re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)}

    @task
    def load_ledger(input_dir: str, output_dir: str, night_ds: str, params=None) -> list[int]:
        """Export the night's ledger and rollouts into the warehouse; plan the shards.
        Returns the shard numbers, which the reassemble task is mapped over."""
        from reassembler.build import load_step

        shards = int(params["shards"])
        with task_errors():
            summary = load_step(input_dir, output_dir, night_ds, shards, _duckdb(params))
        print(f"loaded ds={night_ds}: " + "; ".join(summary.lines()))
        return list(range(shards))

    @task
    def audit_checks(output_dir: str, night_ds: str, run_key: str, shard_results: list, params=None) -> dict:
        """Check the staged night in SQL before anything is published."""
        from dataclasses import asdict

        from reassembler.publish import staging_dir, verify_staged
        from reassembler.warehouse import connect

        with task_errors(), connect(output_dir, _duckdb(params), read_only=True) as con:
            numbers = verify_staged(con, staging_dir(output_dir, night_ds, run_key), night_ds, float(params["max_mask_rate"]))
        shard_rows = sum(shard_results[i]["rows"] for i in range(len(shard_results)))
        if shard_rows != numbers.n_rows:
            raise RuntimeError(f"shards reported {shard_rows} rows, staged files hold {numbers.n_rows}")
        print(f"audit checks passed for ds={night_ds}: {numbers}")
        return {**asdict(numbers), "shards": len(shard_results)}

    @task(outlets=[ROWS_ASSET])
    def publish(input_dir: str, output_dir: str, night_ds: str, run_key: str, numbers: dict, params=None):
        """Swap the rows and audit partitions in whole; emit the rows asset event."""
        from reassembler.build import publish_step
        from reassembler.rollout import Options

        options = Options(params["mode"], params["offchain"], params["std_normalize"], params["leave_one_out"])
        with task_errors():
            n = publish_step(input_dir, output_dir, night_ds, run_key, options, _duckdb(params),
                             float(params["max_mask_rate"]))
        print(f"published ds={night_ds}: {n.n_rows} rows, {n.ok_rollouts} ok, {n.masked} masked; "
              f"rows in {output_dir}/rows/ds={night_ds}/")
        yield Metadata(ROWS_ASSET, {"ds": night_ds, "partition": f"{output_dir}/rows/ds={night_ds}", "rows": n.n_rows,
                                    "rollouts": n.audit_rows, "ok": n.ok_rollouts, "masked": n.masked,
                                    "mask_rate": round(n.mask_rate, 6), "mask_reasons": n.reasons,
                                    "run_id": run_key})

    @task
    def quality_report(output_dir: str, night_ds: str, published, params=None) -> str:
        """Write the night's capture-quality report and the index page (no token reads)."""
        from reassembler.build import report_step

        with task_errors():
            page = report_step(output_dir, night_ds, _duckdb(params), int(params["report_nights"]), _by(params))
        print(f"capture-quality report of ds={night_ds}: {page}")
        return str(page)

    @task
    def quality_gate(output_dir: str, night_ds: str, run_key: str, report: str, params=None) -> dict:
        """Fail (no retry) listing every breached threshold; the rows stay published."""
        from airflow.sdk.exceptions import AirflowFailException

        from reassembler.build import gate_step
        from reassembler.quality import Thresholds

        thresholds = Thresholds(params["gate_max_mask_rate"], params["gate_max_reason_rate"],
                                params["gate_max_mask_rate_rise"], params["gate_max_rejects"])
        with task_errors():
            breaches = gate_step(output_dir, night_ds, run_key, thresholds, _duckdb(params),
                                 int(params["report_nights"]), _by(params))
        if breaches:
            raise AirflowFailException(f"capture quality of ds={night_ds} breached {len(breaches)} threshold(s): "
                                       + "; ".join(b["message"] for b in breaches) + f" (report: {report})")
        print(f"quality gate passed for ds={night_ds}")
        return {"ds": night_ds, "verdict": "ok"}

    night = check_input()
    loaded = load_ledger(night["input_dir"], night["output_dir"], night["ds"])
    shards = ReassembleOperator.partial(
        task_id="reassemble",
        input_dir=night["input_dir"], output_dir=night["output_dir"], ds=night["ds"],
        run_key=night["run_key"],
        mode="{{ params.mode }}", offchain="{{ params.offchain }}",
        std_normalize="{{ params.std_normalize }}", leave_one_out="{{ params.leave_one_out }}",
        memory_limit="{{ params.duckdb_memory_limit }}", threads="{{ params.duckdb_threads }}",
        temp_directory="{{ params.duckdb_temp_directory }}",
    ).expand(shard=loaded)
    numbers = audit_checks(night["output_dir"], night["ds"], night["run_key"], shards.output)
    published = publish(night["input_dir"], night["output_dir"], night["ds"], night["run_key"], numbers)
    report = quality_report(night["output_dir"], night["ds"], published)
    quality_gate(night["output_dir"], night["ds"], night["run_key"], report)


def _by(params) -> list[str] | None:
    return [k.strip() for k in params["report_by"].split(",") if k.strip()] if params.get("report_by") else None


def _duckdb(params):
    from reassembler.warehouse import DuckDBSettings

    return DuckDBSettings(params["duckdb_memory_limit"], int(params["duckdb_threads"]),
                          params["duckdb_temp_directory"] or None)


capture_rows_nightly()
