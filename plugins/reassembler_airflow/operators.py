"""ReassembleOperator: reassemble one shard of a night with the reassembler core.

Thin on purpose (like the common-sql operators over their hooks): it holds parameters,
logs progress and counts, and calls `reassembler.build.shard_step`, the same function
`reassembler build` runs. All business logic lives in the core package.
"""
from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from reassembler_airflow.failures import task_errors


class ReassembleOperator(BaseOperator):
    """Select, cut and finalize the rollouts of shard `shard` of night `ds`.

    Reads the warehouse read-only (several shards run at once) and writes
    `<output_dir>/_staging/<ds>/<run_key>/{rows,audit}/part-<shard>.parquet`; nothing is
    visible to readers until the publish task swaps the partitions in.
    """

    template_fields = ("input_dir", "output_dir", "ds", "run_key", "mode", "offchain", "std_normalize",
                       "leave_one_out", "memory_limit", "threads", "temp_directory")
    ui_color = "#e8f4ea"

    def __init__(self, *, input_dir: str, output_dir: str, ds: str, run_key: str, shard: int,
                 mode: str = "select", offchain: str = "selected", std_normalize: bool = True,
                 leave_one_out: bool = False, memory_limit: str = "128MB", threads: int = 2,
                 temp_directory: str | None = None, batch_rows: int = 4096, **kwargs):
        super().__init__(**kwargs)
        self.input_dir, self.output_dir, self.ds, self.run_key = input_dir, output_dir, ds, run_key
        self.shard = shard
        self.mode, self.offchain = mode, offchain
        self.std_normalize, self.leave_one_out = std_normalize, leave_one_out
        self.memory_limit, self.threads, self.temp_directory = memory_limit, threads, temp_directory
        self.batch_rows = batch_rows

    def execute(self, context: Any) -> dict:
        # imported here so that parsing the DAG file stays light (no DuckDB / Arrow import)
        from reassembler.build import shard_step
        from reassembler.rollout import Options
        from reassembler.warehouse import DuckDBSettings

        options = Options(self.mode, self.offchain, bool(self.std_normalize), bool(self.leave_one_out))
        settings = DuckDBSettings(self.memory_limit, int(self.threads), self.temp_directory or None)
        self.log.info("reassembling shard %s of ds=%s from %s (%s)", self.shard, self.ds, self.input_dir, options)
        with task_errors():
            result = shard_step(self.input_dir, self.output_dir, self.ds, int(self.shard), self.run_key, options,
                                settings, log=self.log.info, batch_rows=self.batch_rows)
        self.log.info("shard %s done: %d rollouts, %d ok, %d masked, %d rows, %d tokens; reasons %s",
                      result.shard, result.n_rollouts, result.n_ok, result.n_masked, result.n_rows,
                      result.n_tokens, dict(result.reasons))
        return {"shard": result.shard, "rollouts": result.n_rollouts, "ok": result.n_ok,
                "masked": result.n_masked, "rows": result.n_rows, "tokens": result.n_tokens,
                "reasons": dict(result.reasons)}
