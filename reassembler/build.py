"""A night, end to end: load -> shards -> publish, then the capture-quality report and gate.

Each step is a function of its own because the Airflow DAG runs them as separate tasks (the
shards in parallel); `build_loaded` runs them one after the other for the command line.
Every step takes the warehouse as one `Warehouse` (warehouse.py): the Airflow tasks open it
per step, a one-process build holds one connection for all of them. The load step takes the
night's `NightLoad` (merge/night_load.py), which owns the helpers the load runs. Both paths
run exactly this code, with one `Settings` (settings.py).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from multiprocessing import get_context

from . import call_tables, progress, storage
from .errors import InputError, StoreError
from .formats.locations import Inputs
from .formats.night import check_output_apart
from .load.child_process import worker_start
from .load.part_load import clear_parts
from .load.parts import STARTED
from .load.read import LoadSummary
from .memory import give_back, step_memory
from .merge.commit import write_shard_rollouts
from .merge.night_load import NightLoad, PartsLoaded
from .merge.pieces import build_calls
from .publish.checkpoints import checkpoint
from .publish.lock import OutputLock
from .publish.protocol import (
    NightNumbers,
    clear_legacy,
    collect_runs,
    path_safe,
    publish_staged,
    published_numbers,
    read_manifest,
    recover,
    staging_dir,
    verify_staged,
)
from .settings import DEFAULTS, REPORT_NIGHTS, Settings
from .verify.shard import ShardResult, run_shard
from .warehouse import (
    Warehouse,
    apply_retention,
    clear_dead_spill_folders,
    drop_call_files,
    run_script,
    scratch_config,
)

log = logging.getLogger(__name__)


def new_run_id(ds: str) -> str:
    return f"cli__{ds}__{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}"


def load_step(
    load: NightLoad | PartsLoaded,
    warehouse: Warehouse,
    run_id: str | None = None,
    lock_wait: float = 0.0,
    plans: str | None = None,
) -> LoadSummary:
    """Replace the night in the warehouse and split its groups into shards. Under the output
    lock: first finish any interrupted publish, then clean up, then load (`load`: the
    night's files, parsed in parts here; or `PartsLoaded`, parts that ran as tasks of their
    own: merged), record the load
    (`run_id`: the run that will publish it) and plan the shards, drop the per-call rows
    outside the retention (never this night's), and write it all into the file; then write
    each shard's plan into the run's folder (or into `plans`: a one-process build's local
    scratch folder)."""
    ds, settings, output = load.ds, load.settings, warehouse.output_dir
    with OutputLock(output, ds, "load", lock_wait), warehouse.writing() as con:
        finished = recover(con, output, ds)
        if finished:
            log.warning("finished the interrupted publish of %s", ", ".join(finished))
        run = run_id or new_run_id(ds)
        collect_runs(output, ds, read_manifest(output, ds)[0], run)  # earlier failed runs, superseded ones
        clear_legacy(output, ds)
        clear_dead_spill_folders(output, settings.duckdb)
        staging = staging_dir(output, ds, run)
        with step_memory():
            summary = load.into(con, staging, (output, path_safe(run)))  # parts, merge, commit
        con.execute("BEGIN TRANSACTION")
        run_script(
            con, "record_load", {"ds": ds, "run_id": run_id, "run": path_safe(run), "n_rollouts": summary.n_rollouts}
        )
        kept = apply_retention(con, ds, settings.retention_nights)
        con.execute("COMMIT")
        con.execute("CHECKPOINT")  # the night into the file
        assert load.plan is not None, "internal: a night loaded without its plan"
        with step_memory():  # what each shard reads instead of the warehouse (it sorts its calls itself)
            write_shard_rollouts(con, load.plan, staging, path_safe(run), settings.shards, plans)
        try:  # loaded: no longer in flight (collect_runs); best effort: left, the run looks in flight a while longer
            storage.delete(storage.join(staging, STARTED))
        except (StoreError, OSError) as e:
            log.info("the in-flight mark of %s stays for now: %s", staging, e)
        # earlier loads of the night, but its current run's (a published night's, until this run publishes)
        call_tables.remove_other_runs(output, ds, {path_safe(run), *call_tables.current_runs(con, ds)})
        drop_call_files(output, kept)
        if call_tables.is_temporary(con):
            call_tables.define_views(con, output, temporary=True)  # the files as they are now
        if not warehouse.is_held():  # a task of its own: the load survives this worker (warehouse/copies.py);
            warehouse.save_copy(con, ds, run_id)  # one process publishes next, and copies then
        checkpoint("loaded")
    if load.plan is not None:
        clear_parts(load.plan, staging)  # merged: the warehouse holds them now
    log.info("loaded ds=%s: %s", ds, "; ".join(summary.lines()))
    return summary


def shard_step(
    output, ds: str, shard: int, run_id: str, settings: Settings = DEFAULTS, plans: str | None = None
) -> ShardResult:
    """Reassemble shard `shard` of the loaded night into the run's folder, from its plan
    there (or in `plans`): it needs the output store only (no warehouse), so it may run on
    any machine."""
    staging = staging_dir(storage.location(output), ds, run_id)
    with step_memory():
        build_calls(staging, shard, plans, settings)  # its calls, out of the merge's buckets
        give_back()  # what sorting them freed, before the batches
        return run_shard(ds, shard, settings, run_id, staging, plans)


def publish_step(
    warehouse: Warehouse,
    ds: str,
    run_id: str,
    inputs,
    settings: Settings = DEFAULTS,
    seconds: float | None = None,
    lock_wait: float = 0.0,
) -> NightNumbers:
    """Check the staged night and publish it (publish/protocol.py); `inputs` (an input root,
    or the run's Inputs: formats/locations.py) is recorded with the run, with the locations
    it resolved to for the night (`reassembler explain` reads the night again from them)."""
    output = warehouse.output_dir
    staging = staging_dir(output, ds, run_id)
    options = settings.options
    read_from = Inputs.of(inputs)
    with OutputLock(output, ds, "publish", lock_wait), warehouse.writing() as con:
        recover(con, output, ds)
        published = published_numbers(output, ds, run_id)
        if published is not None:  # a retry of this run's publish, which a recovery finished
            log.info("ds=%s was already published by this run (%s)", ds, run_id)
            return published
        numbers = verify_staged(con, staging, ds, settings.max_mask_rate, run_id, settings.allow_empty)
        publish_staged(
            con,
            output,
            staging,
            ds,
            run_id,
            numbers,
            {
                "input_dir": read_from.text(),
                "inputs": read_from.wheres(ds),
                "mode": options.mode,
                "offchain": options.offchain,
                "options": json.dumps(asdict(options), sort_keys=True),
                "seconds": seconds,
            },
        )
        warehouse.save_copy(con, ds, run_id)
    log.info("published ds=%s: %d rows, %d ok, %d masked", ds, numbers.n_rows, numbers.ok_rollouts, numbers.masked)
    return numbers


@dataclass(frozen=True)
class BuildSummary:
    run_id: str
    load: LoadSummary
    numbers: NightNumbers
    seconds: float


def build_night(
    input_dir, output_dir, ds: str, settings: Settings = DEFAULTS, run_id: str | None = None, warehouse_file=None
) -> BuildSummary:
    """Load, reassemble every shard, publish: `build_loaded` over the night's NightLoad."""
    with NightLoad(input_dir, ds, settings) as load:
        return build_loaded(load, output_dir, run_id, warehouse_file)


def build_loaded(load: NightLoad, output_dir, run_id: str | None = None, warehouse_file=None) -> BuildSummary:
    """The night of `load`, end to end, under the output lock (a second build of the same
    output fails at once, OutputBusy, touching nothing). One process holds one warehouse
    connection for the three steps; with `settings.workers` > 1 the shards run that many at
    once in worker processes, which read their plans from the output store, as Airflow's
    mapped tasks do."""
    settings, ds = load.settings, load.ds
    warehouse = Warehouse(output_dir, settings.duckdb, warehouse_file)
    check_output_apart(load.night, output_dir, warehouse=warehouse.path, temp_directory=settings.duckdb.temp_directory)
    parallel = settings.workers > 1 and settings.shards > 1
    # the shards run on this machine: on object storage their plans stay on local disk
    # (in this process's scratch folder: a killed build's are removed with it by the next build)
    plans = None
    if storage.is_remote(warehouse.output_dir):
        plans = tempfile.mkdtemp(prefix="plans-", dir=scratch_config(settings.duckdb)["temp_directory"])
    with OutputLock(output_dir, ds, "build"):
        started = time.perf_counter()
        run_id = run_id or new_run_id(ds)
        try:
            if parallel:
                summary = load_step(load, warehouse, run_id, plans=plans)
                _run_shards_in_workers(warehouse, ds, run_id, settings, plans)
                numbers = publish_step(
                    warehouse, ds, run_id, load.night.inputs or load.night.root, settings, time.perf_counter() - started
                )
            else:
                with warehouse.held():
                    summary = load_step(load, warehouse, run_id, plans=plans)
                    with warehouse.resting():  # its cached blocks go while the shards run
                        give_back()  # and what the load freed
                        for k in range(settings.shards):
                            shard_step(warehouse.output_dir, ds, k, run_id, settings, plans)
                    numbers = publish_step(
                        warehouse,
                        ds,
                        run_id,
                        load.night.inputs or load.night.root,
                        settings,
                        time.perf_counter() - started,
                    )
        finally:
            if plans is not None:
                shutil.rmtree(plans, ignore_errors=True)
        return BuildSummary(run_id, summary, numbers, time.perf_counter() - started)


def _run_shards_in_workers(warehouse: Warehouse, ds: str, run_id: str, settings: Settings, plans: str | None) -> None:
    output = warehouse.output_dir
    from concurrent.futures import ProcessPoolExecutor

    context = get_context("fork")
    with (
        progress.worker_bars(context) as relay,
        ProcessPoolExecutor(  # the parent draws the workers' bars; a worker ends with its parent
            max_workers=min(settings.workers, settings.shards),
            mp_context=context,
            initializer=worker_start,
            initargs=(relay,),
        ) as pool,
    ):
        for done in [pool.submit(shard_step, output, ds, k, run_id, settings, plans) for k in range(settings.shards)]:
            done.result()  # re-raises a worker's error


def report_step(
    warehouse: Warehouse, ds: str | None, nights: int = REPORT_NIGHTS, by: list[str] | None = None
) -> str | None:
    """Write the night's capture-quality report and the index, from the warehouse alone."""
    from .audit.report_html import write_reports

    with warehouse.reading() as con:
        return write_reports(con, warehouse.output_dir, ds, nights, by)


def gate_step(
    warehouse: Warehouse,
    ds: str,
    run_id: str | None,
    thresholds,
    nights: int = REPORT_NIGHTS,
    by: list[str] | None = None,
) -> list[dict]:
    """Check the night against `thresholds`, record the verdict in the warehouse and rewrite
    the report so that it shows it; return every check (audit/quality.py's gate_checks: value,
    limit, margin, status); the night passed when none has status `breach`."""
    from .audit.quality import gate_checks, night_quality, record_verdict
    from .audit.report_html import write_reports

    output = warehouse.output_dir
    warehouse.must_exist()  # never an empty warehouse (and per-call folders) made by a gate
    with OutputLock(output, ds, "gate", warehouse.settings.lock_wait_seconds), warehouse.writing() as con:
        quality = night_quality(con, ds, nights, by, traces=False)
        if quality["night"] is None:
            raise InputError(f"{output}: no published night {ds} to check")
        checks = gate_checks(quality, thresholds)
        record_verdict(con, ds, run_id, checks)
        write_reports(con, output, ds, nights, by)
        warehouse.save_copy(con, ds, run_id)
    return checks
