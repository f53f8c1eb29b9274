"""Build one night: load -> plan shards -> reassemble each shard -> verify and publish.

The steps are separate functions because the Airflow DAG runs them as separate tasks
(the shards in parallel, each opening the warehouse read-only); `build_night` runs them
one after the other for the command line. Both paths run exactly this code.
"""
from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Callable

from .checkpoints import checkpoint
from .errors import InputError
from .lock import OutputLock
from .publish import NightNumbers, publish_staged, recover, staging_dir, verify_staged
from .read import MAX_LINE_BYTES, LoadSummary, find_night, load_night
from .rollout import Options
from .shard import ShardResult, run_shard
from .warehouse import DuckDBSettings, clear_dead_spill_folders, connect, sql


def new_run_id(ds: str) -> str:
    return f"cli__{ds}__{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%fZ')}"


def load_step(input_dir, output_dir, ds: str, shards: int = 1,
              settings: DuckDBSettings = DuckDBSettings(), allow_empty: bool = False,
              max_line_bytes: int = MAX_LINE_BYTES, lock_wait: float = 0.0) -> LoadSummary:
    """Replace the night in the warehouse and split its groups into `shards` shards. Under
    the output lock: first finish any interrupted publish, then clean up, then load."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    night = find_night(input_dir, ds)
    with OutputLock(output_dir, ds, "load", lock_wait):
        with connect(output_dir, settings) as con:
            recover(con, Path(output_dir))
            shutil.rmtree(Path(output_dir) / "_staging" / ds, ignore_errors=True)  # earlier failed runs
            clear_dead_spill_folders(output_dir, settings)
            summary = load_night(con, night, allow_empty, max_line_bytes)
            con.execute(sql("plan_shards"), {"ds": ds, "shards": shards})
            checkpoint("loaded")
    return summary


def shard_step(input_dir, output_dir, ds: str, shard: int, run_id: str, options: Options = Options(),
               settings: DuckDBSettings = DuckDBSettings(), log: Callable[[str], None] | None = None,
               batch_rows: int = 4096) -> ShardResult:
    night = find_night(input_dir, ds)
    with connect(output_dir, settings, read_only=True) as con:
        return run_shard(con, night, shard, options, run_id, staging_dir(output_dir, ds, run_id),
                         batch_rows=batch_rows, log=log)


def publish_step(input_dir, output_dir, ds: str, run_id: str, options: Options = Options(),
                 settings: DuckDBSettings = DuckDBSettings(), max_mask_rate: float = 1.0,
                 seconds: float | None = None, lock_wait: float = 0.0) -> NightNumbers:
    staging = staging_dir(output_dir, ds, run_id)
    with OutputLock(output_dir, ds, "publish", lock_wait), connect(output_dir, settings) as con:
        recover(con, Path(output_dir))
        numbers = verify_staged(con, staging, ds, max_mask_rate)
        publish_staged(con, Path(output_dir), staging, ds, run_id, numbers, {
            "input_dir": str(Path(input_dir).resolve()), "mode": options.mode,
            "offchain": options.offchain, "options": json.dumps(asdict(options), sort_keys=True),
            "seconds": seconds,
        })
    return numbers


@dataclass(frozen=True)
class BuildSummary:
    run_id: str
    load: LoadSummary
    numbers: NightNumbers
    seconds: float


def build_night(input_dir, output_dir, ds: str, options: Options = Options(), shards: int = 1,
                settings: DuckDBSettings = DuckDBSettings(), max_mask_rate: float = 1.0,
                run_id: str | None = None, log: Callable[[str], None] | None = None,
                workers: int = 1, allow_empty: bool = False,
                max_line_bytes: int = MAX_LINE_BYTES) -> BuildSummary:
    """`workers` > 1 runs that many shards at once in worker processes (each opens the
    warehouse read-only), as Airflow's mapped tasks do. The output lock is held throughout:
    a second build of the same output fails at once (OutputBusy) and touches nothing."""
    with OutputLock(output_dir, ds, "build"):
        return _build(input_dir, output_dir, ds, options, shards, settings, max_mask_rate, run_id, log,
                      workers, allow_empty, max_line_bytes)


def _build(input_dir, output_dir, ds, options, shards, settings, max_mask_rate, run_id, log, workers,
           allow_empty, max_line_bytes) -> BuildSummary:
    started = time.perf_counter()
    run_id = run_id or new_run_id(ds)
    load = load_step(input_dir, output_dir, ds, shards, settings, allow_empty, max_line_bytes)
    if workers > 1 and shards > 1:
        with ProcessPoolExecutor(max_workers=min(workers, shards), mp_context=get_context("fork")) as pool:
            for done in [pool.submit(shard_step, input_dir, output_dir, ds, k, run_id, options, settings)
                         for k in range(shards)]:
                done.result()  # re-raises a worker's error
    else:
        for k in range(shards):
            shard_step(input_dir, output_dir, ds, k, run_id, options, settings, log)
    seconds = time.perf_counter() - started
    numbers = publish_step(input_dir, output_dir, ds, run_id, options, settings, max_mask_rate, seconds)
    return BuildSummary(run_id, load, numbers, time.perf_counter() - started)


def report_step(output_dir, ds: str | None, settings: DuckDBSettings = DuckDBSettings(), nights: int = 30,
                by: list[str] | None = None) -> Path | None:
    """Write the night's capture-quality report and the index, from the warehouse alone."""
    from .report_html import write_reports

    with connect(output_dir, settings, read_only=True) as con:
        return write_reports(con, output_dir, ds, nights, by)


def gate_step(output_dir, ds: str, run_id: str | None, thresholds, settings: DuckDBSettings = DuckDBSettings(),
              nights: int = 30, by: list[str] | None = None) -> list[dict]:
    """Check the night against `thresholds`, record the verdict in the warehouse and rewrite
    the report so that it shows it; return the breaches (empty: the night passed)."""
    from .quality import gate, night_quality, record_verdict
    from .report_html import write_reports

    with OutputLock(output_dir, ds, "gate", settings.lock_wait_seconds), connect(output_dir, settings) as con:
        quality = night_quality(con, ds, nights, by, traces=False)
        if quality["night"] is None:
            raise InputError(f"{output_dir}: no published night {ds} to check")
        breaches = gate(quality, thresholds)
        record_verdict(con, ds, run_id, breaches)
        write_reports(con, output_dir, ds, nights, by)
    return breaches
