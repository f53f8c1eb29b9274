"""ReassembleOperator: reassemble one shard of a night with the reassembler core.

Thin on purpose (like the common-sql operators over their hooks): it holds parameters,
logs progress and counts, and calls `reassembler.build.shard_step`, the same function
`reassembler build` runs. All business logic lives in the core package; every setting comes
from the DAG's params (`reassembler_airflow.warehouse.task_settings`), as in its other tasks.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from reassembler_airflow.failures import task_errors
from reassembler_airflow.warehouse import task_settings


class ReassembleOperator(BaseOperator):
    """Select, cut and finalize the rollouts of shard `shard` of night `ds`.

    Reads its plan and the token files from the output store (never the warehouse: it may
    run on any worker) and writes
    `<output_dir>/_runs/ds=<ds>/<run id, path-safe>/{rows,audit}/part-<shard>.parquet`; nothing is
    visible to readers until the publish task swaps the partitions in. `settings` is the
    DAG's params (or any mapping of `Settings.from_params` names); missing names take the
    core's defaults.
    """

    template_fields = ("output_dir", "ds", "run_id", "settings")
    ui_color = "#e8f4ea"

    def __init__(self, *, output_dir: str, ds: str, run_id: str, shard: int, settings: Any = None, **kwargs):
        super().__init__(**kwargs)
        self.output_dir, self.ds, self.run_id = output_dir, ds, run_id
        self.shard = shard
        self.settings = settings
        self.group_range = ""

    def execute(self, context: Any) -> dict:
        # imported here so that parsing the DAG file stays light (no DuckDB / Arrow import)
        from reassembler.build import shard_step
        from reassembler.load.shard_plan import read_groups
        from reassembler.publish.protocol import staging_dir

        settings = task_settings(self.settings, self.pool)
        with task_errors():
            groups = read_groups(staging_dir(self.output_dir, self.ds, self.run_id), int(self.shard))
            self.group_range = group_label(groups)
            self.log.info("shard %s of ds=%s: %s", self.shard, self.ds, self.group_range)
            result = shard_step(self.output_dir, self.ds, int(self.shard), self.run_id, settings)
        return {
            "shard": result.shard,
            "rollouts": result.n_rollouts,
            "ok": result.n_ok,
            "masked": result.n_masked,
            "rows": result.n_rows,
            "tokens": result.n_tokens,
            "reasons": dict(result.reasons),
        }


def group_label(groups: list[str], most: int = 6) -> str:
    """The groups of a shard as a person reads them: numbers in numeric order with runs
    joined ("16 groups: 4, 6, 32-45"), names as their first and last. (Shards hold
    contiguous ranges of group ids in byte order, as the contract sorts them: "32" .. "6".)"""
    if not groups:
        return "no groups"
    count = f"{len(groups)} group{'s' if len(groups) != 1 else ''}"
    if not all(g.isdigit() and (g == "0" or not g.startswith("0")) for g in groups):
        ordered = sorted(groups)
        return f"{count}: {ordered[0]}" if len(groups) == 1 else f"{count}: {ordered[0]} .. {ordered[-1]}"
    numbers = sorted(int(g) for g in groups)
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    more = f", ... ({len(runs) - most} more ranges)" if len(runs) > most else ""
    return f"{count}: {', '.join(shown[:most])}{more}"
