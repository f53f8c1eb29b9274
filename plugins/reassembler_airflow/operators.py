"""ReassembleOperator: reassemble one shard of a night with the reassembler core.

Thin on purpose (like the common-sql operators over their hooks): it holds parameters,
logs progress and counts, and calls `reassembler.build.shard_step`, the same function
`reassembler build` runs. All business logic lives in the core package; every setting comes
from `reassembler.settings.Settings.from_params`, as in the DAG's other tasks.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from reassembler_airflow.failures import task_errors


class ReassembleOperator(BaseOperator):
    """Select, cut and finalize the rollouts of shard `shard` of night `ds`.

    Reads the warehouse read-only (several shards run at once) and writes
    `<output_dir>/_staging/<ds>/<run_key>/{rows,audit}/part-<shard>.parquet`; nothing is
    visible to readers until the publish task swaps the partitions in. `settings` is the
    DAG's params (or any mapping of `Settings.from_params` names); missing names take the
    core's defaults.
    """

    template_fields = ("input_dir", "output_dir", "ds", "run_key", "settings")
    ui_color = "#e8f4ea"

    def __init__(
        self, *, input_dir: str, output_dir: str, ds: str, run_key: str, shard: int, settings: Any = None, **kwargs
    ):
        super().__init__(**kwargs)
        self.input_dir, self.output_dir, self.ds, self.run_key = input_dir, output_dir, ds, run_key
        self.shard = shard
        self.settings = settings
        self.group_range = ""

    def execute(self, context: Any) -> dict:
        # imported here so that parsing the DAG file stays light (no DuckDB / Arrow import)
        from reassembler.build import shard_step
        from reassembler.settings import Settings
        from reassembler.warehouse import connect, sql

        settings = Settings.from_params(self.settings or {})
        with task_errors():
            with connect(self.output_dir, settings.duckdb, read_only=True) as con:
                first, last, groups = con.execute(
                    sql("shard_groups"), {"ds": self.ds, "shard": int(self.shard)}
                ).fetchone()
            self.group_range = f"groups {first} .. {last} ({groups})" if groups else "no groups"
            self.log.info("shard %s of ds=%s: %s, from %s", self.shard, self.ds, self.group_range, self.input_dir)
            result = shard_step(self.input_dir, self.output_dir, self.ds, int(self.shard), self.run_key, settings)
        return {
            "shard": result.shard,
            "rollouts": result.n_rollouts,
            "ok": result.n_ok,
            "masked": result.n_masked,
            "rows": result.n_rows,
            "tokens": result.n_tokens,
            "reasons": dict(result.reasons),
        }
