"""The night's load and merge in one process (the command line, and `explain`'s tests):
the parts (load/part_load.py), the merge's steps (merge/__init__.py) in worker processes
when there are several to run and workers to run them, then the commit into the warehouse.
The DAG runs the same functions as tasks of their own.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref

from .. import call_tables
from ..formats.night import NightFiles
from ..load import capture_children, rollout_lines
from ..load.part_load import run_parts
from ..load.parts import LoadPlan, plan_parts, write_plan
from ..load.read import LoadSummary
from ..settings import DEFAULTS, Settings
from .bucket import merge_bucket
from .commit import commit_merge
from .keys import merge_keys
from .rollouts import merge_rollouts


def merge_night(plan: LoadPlan, folder: str, calls: tuple[str, str], settings: Settings = DEFAULTS) -> None:
    """The merge's steps of the night of `plan` (its parts done, in `folder`): the global
    step and the key buckets, then the rollout buckets; `settings.workers` at a time in
    worker processes, or one after the other here."""
    if settings.workers <= 1 or plan.buckets <= 1:
        merge_rollouts(plan, folder, calls, settings)
        for b in range(plan.buckets):
            merge_keys(plan, folder, b, calls, settings)
        for b in range(plan.buckets):
            merge_bucket(plan, folder, b, calls, settings)
        return
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from ..load.child_process import worker_start

    with ProcessPoolExecutor(
        max_workers=settings.workers, mp_context=get_context("fork"), initializer=worker_start
    ) as pool:  # a worker ends with its parent
        first = [pool.submit(merge_rollouts, plan, folder, calls, settings)]
        first += [pool.submit(merge_keys, plan, folder, b, calls, settings) for b in range(plan.buckets)]
        for done in first:
            done.result()  # re-raises a worker's error
        for done in [pool.submit(merge_bucket, plan, folder, b, calls, settings) for b in range(plan.buckets)]:
            done.result()


def load_night(
    con,
    night: NightFiles,
    settings: Settings = DEFAULTS,
    background: rollout_lines.InBackground | None = None,
    scratch: str | None = None,
    readers: capture_children.CaptureChildren | None = None,
    plan: LoadPlan | None = None,
    calls: tuple[str, str] | None = None,
) -> LoadSummary:
    """Replace the night `night.ds` in the warehouse behind `con`: cut it into load parts
    (`settings.load_parts`, or `plan`: load/parts.py), parse each, merge them in
    `settings.buckets` buckets, and commit. `scratch`: the run's folder (a temporary folder
    when not given); `calls`: the output and run the per-call files go to (without it, the
    folder of the warehouse file; in-memory, the scratch folder, seen through temporary views). `background`, `readers`:
    child processes merge.night_load.NightLoad started for a night of one part."""
    if scratch is not None:
        return _load(con, night, settings, background, scratch, readers, plan, calls)
    folder = tempfile.mkdtemp(prefix="reassembler-load-")  # goes when done with (nothing left in /tmp)
    try:
        summary = _load(con, night, settings, background, folder, readers, plan, calls)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if calls is None and _warehouse_folder(con) is None:  # the views over it go with the connection
        weakref.finalize(con, shutil.rmtree, folder, True)
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return summary


def _load(con, night, settings, background, folder, readers, plan, calls) -> LoadSummary:
    plan = plan or plan_parts(night, settings.load_parts, settings.buckets, settings.merge_buckets is not None)
    write_plan(folder, plan)
    run_parts(plan, folder, settings, background, readers)
    beside = _warehouse_folder(con)
    own = calls is None and beside is None
    calls = calls or (beside or folder, "load")
    merge_night(plan, folder, calls, settings)
    summary = commit_merge(con, plan, folder, calls)
    if own:  # an in-memory warehouse: the night's per-call rows stay in the scratch folder
        call_tables.ensure_schema_files(folder)
        call_tables.define_views(con, folder, temporary=True)
    return summary


def _warehouse_folder(con) -> str | None:
    """The folder of the warehouse file behind `con` (None: an in-memory database)."""
    import os

    [[path]] = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
    return os.path.dirname(path) if path else None
