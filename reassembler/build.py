"""Build one night: load -> plan shards -> reassemble each shard -> verify and publish, then
the capture-quality report and gate.

The steps are separate functions because the Airflow DAG runs them as separate tasks
(the shards in parallel, each opening the warehouse read-only); `build_night` runs them
one after the other for the command line, in one process through one warehouse
connection (or with the shards in worker processes, `--workers`). Both paths run exactly
this code, with one `Settings` (settings.py).
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path

import pyarrow as pa

from .errors import InputError
from .formats.night import find_night
from .load.read import LoadSummary, load_night, prepare_ledger
from .load.token_store import TokenStore
from .publish.checkpoints import checkpoint
from .publish.lock import OutputLock
from .publish.protocol import NightNumbers, publish_staged, published_numbers, recover, staging_dir, verify_staged
from .settings import DEFAULTS, Settings
from .verify.shard import ShardResult, run_shard
from .warehouse import BackgroundCheckpoint, apply_retention, clear_dead_spill_folders, connect, run_script, sql

log = logging.getLogger(__name__)


def _steady_memory() -> None:
    """pyarrow's default allocator (mimalloc) hands the pages of each freed batch back to the
    kernel and faults fresh zeroed ones in for the next (10-16% of a shard's CPU under
    `perf`); jemalloc keeps them for reuse. Process-wide, as the build's processes are."""
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # a pyarrow built without jemalloc keeps its default
        pass


@contextmanager
def _step_memory():
    """How a step uses memory: jemalloc for pyarrow (`_steady_memory`), and Python's cycle
    collector run rarely meanwhile (the steps allocate many short-lived containers; at the
    default thresholds it ran often enough to cost ~6% of a shard's CPU). Reference
    counting frees everything else as usual."""
    _steady_memory()
    thresholds = gc.get_threshold()
    gc.set_threshold(STEP_GC_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


STEP_GC_THRESHOLD = 200_000  # container allocations between two young-generation collections
# once the shard runs, the read-ahead keeps a quarter of its budget decoded ahead of it (the
# whole budget held to the end cost 4x nights ~70 MiB of peak memory and no time)
SHARD_READ_AHEAD_SHARE = 4


def new_run_id(ds: str) -> str:
    return f"cli__{ds}__{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}"


def load_step(
    input_dir,
    output_dir,
    ds: str,
    settings: Settings = DEFAULTS,
    lock_wait: float = 0.0,
    rollouts=None,
    con=None,
    ledger=None,
    run_id: str | None = None,
) -> LoadSummary:
    """Replace the night in the warehouse and split its groups into `settings.shards`
    shards. Under the output lock: first finish any interrupted publish, then clean up,
    then load, record the load (`run_id`: the run that will publish it), then drop the
    per-call rows outside the retention (never this night's). `rollouts`: the night's
    rollout lines already being parsed (rollout_lines.InBackground), if any; `ledger`: its
    ledger files already being parsed (read.prepare_ledger), if any; `con`: the warehouse,
    open (a one-process build), else the step opens and closes it."""
    night = find_night(input_dir, ds)
    with (
        OutputLock(output_dir, ds, "load", lock_wait),
        # the ledger is parsed while the warehouse opens
        nullcontext(ledger) if ledger is not None else prepare_ledger(night, settings.max_line_bytes) as ledger,
        nullcontext(con) if con is not None else connect(output_dir, settings.duckdb) as con,
    ):
        finished = recover(con, Path(output_dir))
        if finished:
            log.warning("finished the interrupted publish of %s", ", ".join(finished))
        shutil.rmtree(Path(output_dir) / "_staging" / ds, ignore_errors=True)  # earlier failed runs
        clear_dead_spill_folders(output_dir, settings.duckdb)
        with _step_memory():
            summary = load_night(
                con,
                night,
                settings.allow_empty,
                settings.max_line_bytes,
                rollouts,
                ledger,
                settings.max_row_group_bytes,
            )
        con.execute("BEGIN TRANSACTION")
        run_script(con, "record_load", {"ds": ds, "run_id": run_id, "n_rollouts": summary.rollouts.loaded})
        con.execute(sql("plan_shards"), {"ds": ds, "shards": settings.shards})
        apply_retention(con, ds, settings.retention_nights)
        con.execute("COMMIT")
        checkpoint("loaded")
    log.info("loaded ds=%s: %s", ds, "; ".join(summary.lines()))
    return summary


def shard_step(
    input_dir, output_dir, ds: str, shard: int, run_id: str, settings: Settings = DEFAULTS, store=None, con=None
) -> ShardResult:
    """`store`: a TokenStore that has read ahead (a one-process build); else a fresh one.
    `con`: the warehouse, open (a one-process build reads through a cursor of it), else
    the step opens it read-only."""
    night = find_night(input_dir, ds)
    with (
        con.cursor() if con is not None else connect(output_dir, settings.duckdb, read_only=True) as con,
        _step_memory(),
    ):
        return run_shard(con, night, shard, settings, run_id, staging_dir(output_dir, ds, run_id), store)


def publish_step(
    input_dir,
    output_dir,
    ds: str,
    run_id: str,
    settings: Settings = DEFAULTS,
    seconds: float | None = None,
    lock_wait: float = 0.0,
    con=None,
) -> NightNumbers:
    """`con`: the warehouse, open (a one-process build), else the step opens and closes it."""
    staging = staging_dir(output_dir, ds, run_id)
    options = settings.options
    with (
        OutputLock(output_dir, ds, "publish", lock_wait),
        nullcontext(con) if con is not None else connect(output_dir, settings.duckdb) as con,
    ):
        recover(con, Path(output_dir))
        published = None if staging.exists() else published_numbers(Path(output_dir), ds, run_id)
        if published is not None:  # a retry of this run's publish, which a recovery finished
            log.info("ds=%s was already published by this run (%s)", ds, run_id)
            return published
        numbers = verify_staged(con, staging, ds, settings.max_mask_rate, run_id, settings.allow_empty)
        publish_staged(
            con,
            Path(output_dir),
            staging,
            ds,
            run_id,
            numbers,
            {
                "input_dir": str(Path(input_dir).resolve()),
                "mode": options.mode,
                "offchain": options.offchain,
                "options": json.dumps(asdict(options), sort_keys=True),
                "seconds": seconds,
            },
        )
    log.info("published ds=%s: %d rows, %d ok, %d masked", ds, numbers.n_rows, numbers.ok_rollouts, numbers.masked)
    return numbers


@dataclass(frozen=True)
class BuildSummary:
    run_id: str
    load: LoadSummary
    numbers: NightNumbers
    seconds: float


def build_night(
    input_dir, output_dir, ds: str, settings: Settings = DEFAULTS, run_id: str | None = None, rollouts=None
) -> BuildSummary:
    """Load, reassemble every shard, publish. `settings.workers` > 1 runs that many shards at
    once in worker processes (each opens the warehouse read-only), as Airflow's mapped tasks
    do. The output lock is held throughout: a second build of the same output fails at once
    (OutputBusy) and touches nothing. `rollouts`: the night's rollout lines already being
    parsed (the command starts that before it imports this module; rollout_lines.py)."""
    if settings.workers > 1 and settings.shards > 1:  # worker processes open the warehouse read-only
        with OutputLock(output_dir, ds, "build"):
            started = time.perf_counter()
            run_id = run_id or new_run_id(ds)
            load = load_step(input_dir, output_dir, ds, settings, rollouts=rollouts, run_id=run_id)
            _run_shards(input_dir, output_dir, ds, run_id, settings)
            numbers = publish_step(input_dir, output_dir, ds, run_id, settings, time.perf_counter() - started)
            return BuildSummary(run_id, load, numbers, time.perf_counter() - started)
    # One process: one warehouse connection for the three steps. The shards read the loaded
    # night through cursors of it while it checkpoints on a thread of its own; their first
    # token row groups are decoded ahead during the load, once the rollout child is done.
    with OutputLock(output_dir, ds, "build"):
        started = time.perf_counter()
        run_id = run_id or new_run_id(ds)
        _steady_memory()
        night = find_night(input_dir, ds)
        store = TokenStore(settings.token_cache_bytes, settings.max_row_group_bytes)
        if settings.token_read_ahead_bytes > 0:
            paths = [str(night.path("tokens", rel)) for rel in night.tokens]
            # decoded once the rollout children, which the load waits for, are done with their cores
            store.read_ahead(paths, settings.token_read_ahead_bytes, None if rollouts is None else rollouts.done)
        try:
            with (
                prepare_ledger(night, settings.max_line_bytes) as ledger,  # parsed while the warehouse opens
                connect(output_dir, settings.duckdb) as con,
            ):
                load = load_step(
                    input_dir, output_dir, ds, settings, rollouts=rollouts, con=con, ledger=ledger, run_id=run_id
                )
                flush = BackgroundCheckpoint(con)
                # from here on the read-ahead decodes the next row groups as the shard takes them
                store.keep_ahead(settings.token_read_ahead_bytes // SHARD_READ_AHEAD_SHARE)
                try:
                    _run_shards(input_dir, output_dir, ds, run_id, settings, store, con)
                finally:
                    flush.join()  # before the publish writes, or the connection closes
                    store.close()  # what was read ahead and not used
                numbers = publish_step(
                    input_dir, output_dir, ds, run_id, settings, time.perf_counter() - started, con=con
                )
        finally:
            store.close()  # stops the reading ahead when the load failed (closing twice is harmless)
        return BuildSummary(run_id, load, numbers, time.perf_counter() - started)


def _run_shards(input_dir, output_dir, ds: str, run_id: str, settings: Settings, store=None, con=None) -> None:
    if settings.workers > 1 and settings.shards > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(
            max_workers=min(settings.workers, settings.shards), mp_context=get_context("fork")
        ) as pool:
            for done in [
                pool.submit(shard_step, input_dir, output_dir, ds, k, run_id, settings) for k in range(settings.shards)
            ]:
                done.result()  # re-raises a worker's error
    else:
        for k in range(settings.shards):
            shard_step(input_dir, output_dir, ds, k, run_id, settings, store, con)


def report_step(
    output_dir, ds: str | None, settings: Settings = DEFAULTS, nights: int = 30, by: list[str] | None = None
) -> Path | None:
    """Write the night's capture-quality report and the index, from the warehouse alone."""
    from .audit.report_html import write_reports

    with connect(output_dir, settings.duckdb, read_only=True) as con:
        return write_reports(con, output_dir, ds, nights, by)


def gate_step(
    output_dir,
    ds: str,
    run_id: str | None,
    thresholds,
    settings: Settings = DEFAULTS,
    nights: int = 30,
    by: list[str] | None = None,
) -> list[dict]:
    """Check the night against `thresholds`, record the verdict in the warehouse and rewrite
    the report so that it shows it; return the breaches (empty: the night passed)."""
    from .audit.quality import gate, night_quality, record_verdict
    from .audit.report_html import write_reports

    with (
        OutputLock(output_dir, ds, "gate", settings.duckdb.lock_wait_seconds),
        connect(output_dir, settings.duckdb) as con,
    ):
        quality = night_quality(con, ds, nights, by, traces=False)
        if quality["night"] is None:
            raise InputError(f"{output_dir}: no published night {ds} to check")
        breaches = gate(quality, thresholds)
        record_verdict(con, ds, run_id, breaches)
        write_reports(con, output_dir, ds, nights, by)
    return breaches
