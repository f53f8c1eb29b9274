"""Parse and check one load part (load/parts.py) into Parquet in the run's folder.

A part needs no warehouse, nor any database: its files are parsed with the same code
whatever the part (rollout lines, ledger lines in columns, token keys, NeMo Gym's failures
files, rebuilt lines and local-mode captures), and the rows written as they come, a row
group at a time, to one Parquet file per table of the warehouse's schema in the part's
folder (`load/part-NNNNN/`: load/part_tables.py), and last its marker, `part.json`. The
merge (load/merge.py) reads a part only through its marker. A part run again first removes
its folder: its files are rewritten whole, never appended to. A part's memory is a row
group per table and the batch being parsed, not the part.

What a part decides alone: each line's verdict, a rollout_id repeated inside the part (the
first kept), too-big token row groups. What it leaves to the merge (it needs the whole
night): a rollout_id of an earlier part, ledger and token rows of no rollout, which capture
each rollout is read from, given-up samples, and every sequence number across parts.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..errors import StoreError
from ..formats.night import NightFiles
from ..settings import DEFAULTS, Settings
from ..table_file import digest
from . import capture_children, rollout_lines
from .child_process import worker_start
from .derived_tokens import derived_keys
from .gym_capture import GymCapture
from .inserter import LEDGER_BATCH, PART_ITEMS, PART_ROLLOUTS, REJECT_BATCH, Inserter, RolloutTap
from .part_tables import PartTables, write_table
from .parts import LoadPlan, part_folder, sealed
from .read import InputProgress, load_ledger_lines, load_rollout_lines, token_files, too_big_rejects
from .token_keys import KEYS, key_batches

log = logging.getLogger(__name__)

MARKER = "part.json"

# the tables a part writes beside the warehouse's own (rollouts, ledger, rejects, token_rows)
SAMPLES = pa.schema([("rollout_id", pa.string()), ("task", pa.int64()), ("sample", pa.int64())])
FAILURES = pa.schema(
    [
        ("file", pa.string()),
        ("line", pa.int64()),
        ("key", pa.string()),
        ("task", pa.int64()),
        ("sample", pa.int64()),
        ("terminal", pa.bool_()),
        ("failure_class", pa.string()),
        ("line_order", pa.int64()),
    ]
)
OUTCOMES = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("entries", pa.string()),
        ("n_lines", pa.int64()),
        ("capture_reason", pa.string()),
        ("capture_detail", pa.string()),
        ("capture_call_id", pa.string()),
        ("error", pa.string()),
    ]
)
LEDGER_KEYS = pa.schema([("staging_key", pa.string()), ("rollout_id", pa.string()), ("capture", pa.string())])
# per rollout and capture (null: ledger lines), the part's calls and the tokens they declare
CALLS_BY_ROLLOUT = pa.schema(
    [("rollout_id", pa.string()), ("capture", pa.string()), ("n_calls", pa.int64()), ("delta_sum", pa.int64())]
)
# the part's tables of the warehouse's (their columns but ds), written as rows come, and the
# ledger lines' staging keys; the per-call ones split into the merge's buckets by the key
# named here (merge/: the rollout id, or the staging key a token row is found by)
PART_TABLES = {
    "rollouts": PART_ROLLOUTS,
    "rollout_items": PART_ITEMS,
    "ledger": LEDGER_BATCH,
    "rejects": REJECT_BATCH,
    "token_keys": KEYS,
    "ledger_keys": LEDGER_KEYS,
}
BUCKET_KEYS = {
    "rollout_items": "rollout_id",
    "ledger": "rollout_id",
    "rejects": "rollout_id",
    "token_keys": "t_staging_key",
    "ledger_keys": "staging_key",
    "derived_keys": "t_staging_key",
}


class LedgerTap:
    """The part's ledger table, as the parsers write to it: each batch also gives its
    calls' staging keys (ledger_keys, with their capture: null for ledger lines) and counts
    per rollout (CALLS_BY_ROLLOUT)."""

    def __init__(self, tables: PartTables):
        self.ledger, self.keys = tables["ledger"], tables["ledger_keys"]
        self._counts: list[pa.Table] = []

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        if not table.num_rows:
            return
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        self.ledger.write(table)
        keyed = table.filter(pc.is_valid(table.column("staging_key")))
        self.keys.write(keyed.select(["staging_key", "rollout_id", "capture"]))
        self._counts.append(_count(table.select(["rollout_id", "capture", "delta_len"])))

    def counts(self) -> pa.Table:
        if not self._counts:
            return CALLS_BY_ROLLOUT.empty_table()
        both = pa.concat_tables(self._counts)
        summed = both.group_by(["rollout_id", "capture"], use_threads=False).aggregate(
            [("n_calls", "sum"), ("delta_sum", "sum")]
        )
        return (
            summed.rename_columns({"n_calls_sum": "n_calls", "delta_sum_sum": "delta_sum"})
            .select(CALLS_BY_ROLLOUT.names)
            .cast(CALLS_BY_ROLLOUT)
        )


def _count(table: pa.Table) -> pa.Table:
    table = table.set_column(2, "delta_len", pc.fill_null(pc.cast(table.column("delta_len"), pa.int64()), 0))
    counted = table.group_by(["rollout_id", "capture"], use_threads=False).aggregate(
        [("delta_len", "count", pc.CountOptions(mode="all")), ("delta_len", "sum")]
    )
    return counted.rename_columns({"delta_len_count": "n_calls", "delta_len_sum": "delta_sum"}).select(
        CALLS_BY_ROLLOUT.names
    )


def load_part(
    plan: LoadPlan,
    k: int,
    folder: str,
    settings: Settings = DEFAULTS,
    background: rollout_lines.InBackground | None = None,
    readers: capture_children.CaptureChildren | None = None,
    helpers: bool = True,
) -> dict:
    """Parse part `k` of `plan` into `folder`/load/part-k/; returns its marker (which names
    the plan). `helpers`: start child processes for its rollout lines and its local-mode
    captures when they are worth it (else `background` and `readers`, those load.NightLoad
    started, or none)."""
    part, every_capture = plan.parts[k], plan.night.captures  # a rebuilt line's state file may be in another part
    out = part_folder(folder, k)
    storage.delete_tree(out)  # a part run again is written whole
    own = helpers and background is None and readers is None
    if own:
        background = rollout_lines.start(part, settings.max_line_bytes, settings.max_rollout_tokens)
        readers = capture_children.start(part)
    try:
        what = "load" if len(plan.parts) == 1 else f"load part {k}"  # the progress line's name
        with PartTables(out, PART_TABLES, BUCKET_KEYS, plan.buckets) as tables:
            marker = _parse(tables, part, out, what, settings, every_capture, background, readers, plan.buckets)
    finally:
        if own:
            for helper in (background, readers):
                if helper is not None:
                    helper.close()
    marker.update(part=k, plan=plan.plan_id)
    # what the merge checks before it reads a file of the part (merge/staging.py)
    marker["files"] = {rel: digest(storage.join(out, rel)) for rel in storage.list_files(out, ".parquet")}
    storage.write_bytes(storage.join(out, MARKER), sealed(marker))  # last: the part is done
    return marker


def _parse(
    tables: PartTables,
    part: NightFiles,
    out: str,
    what: str,
    settings: Settings,
    every_capture,
    background,
    readers,
    buckets: int = 1,
) -> dict:
    max_line_bytes = settings.max_line_bytes
    files = token_files(part, settings.max_row_group_bytes)  # unusable token files: refused before anything
    progress = InputProgress.of(part, what)
    try:
        for batch in key_batches(files.locations, files.skip, files.footers, progress.read):
            tables["token_keys"].write(batch)
        if files.too_big:
            tables["rejects"].write(too_big_rejects(part, files))
        rejects = Inserter(tables["rejects"], REJECT_BATCH)
        ledger = LedgerTap(tables)
        gym = GymCapture(ledger, part, rejects, out, max_line_bytes, readers, progress.read, every_capture)
        rollouts = RolloutTap(tables["rollouts"], tables["rollout_items"])

        def read_rollouts() -> int:
            most = settings.max_rollout_tokens  # a verifiers rollout's rows
            lines = load_rollout_lines(
                rollouts, part, rejects, max_line_bytes, background, gym.rollout, most, gym.derived
            )
            progress.read(*(part.path("rollouts", rel) for rel in part.rollouts))
            return lines

        rollouts_first = background is None or background.done()
        rollout_lines_read = read_rollouts() if rollouts_first else 0
        ledger_lines = load_ledger_lines(ledger, part, rejects, max_line_bytes, progress.read)
        if not rollouts_first:
            rollout_lines_read = read_rollouts()
        gym.read()
        rejects.flush()
        derived = derived_keys(gym.token_files, gym.token_keys)  # the derived token files'
        write_table(storage.join(out, "derived_keys.parquet"), KEYS, derived, "t_staging_key", buckets)
        write_table(storage.join(out, "calls_by_rollout.parquet"), CALLS_BY_ROLLOUT, [ledger.counts()])
        write_table(storage.join(out, "samples.parquet"), SAMPLES, [pa.Table.from_pylist(gym.samples, schema=SAMPLES)])
        write_table(
            storage.join(out, "failures.parquet"), FAILURES, [pa.Table.from_pylist(gym.failures, schema=FAILURES)]
        )
        write_table(
            storage.join(out, "outcomes.parquet"), OUTCOMES, [pa.Table.from_pylist(gym.outcomes, schema=OUTCOMES)]
        )
    except BaseException:
        progress.close(ok=False)
        raise
    progress.close()
    return {
        "rollout_lines": rollout_lines_read,
        "ledger_lines": ledger_lines,
        "failures_read": gym.failures_read,
        "failures_rejected": gym.failures_rejected,
        "buckets": buckets,
        "too_big_rows": files.n_too_big,
        "derived_files": gym.token_files,
    }


def run_parts(
    plan: LoadPlan,
    folder: str,
    settings: Settings = DEFAULTS,
    background: rollout_lines.InBackground | None = None,
    readers: capture_children.CaptureChildren | None = None,
) -> list[dict]:
    """Every part of `plan` into `folder`: one part here (with `background` and `readers`,
    the helpers load.NightLoad started for it); more, `settings.workers` at a time in worker
    processes (each starts its own helpers), or one after the other here with one worker.
    Returns their markers, in part order."""
    if len(plan.parts) == 1:
        return [load_part(plan, 0, folder, settings, background, readers, helpers=False)]
    for helper in (background, readers):  # started for a night of one part
        if helper is not None:
            helper.close()
    if settings.workers <= 1:
        return [load_part(plan, k, folder, settings) for k in range(len(plan.parts))]
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from .. import progress

    context = get_context("fork")
    with (
        progress.worker_bars(context) as relay,
        ProcessPoolExecutor(  # the parent draws the workers' bars; a worker ends with its parent
            max_workers=min(settings.workers, len(plan.parts)),
            mp_context=context,
            initializer=worker_start,
            initargs=(relay,),
        ) as pool,
    ):
        futures = [pool.submit(load_part, plan, k, folder, settings) for k in range(len(plan.parts))]
        return [f.result() for f in futures]  # re-raises a worker's error


def clear_parts(plan: LoadPlan, folder: str) -> None:
    """Remove the parts' tables and markers once the merge is in the warehouse: the derived
    token files stay (the shards read them), with the plan. Best effort: what a failing
    store leaves goes with the run's folder once the night is built again (logged)."""
    try:
        doomed = []
        for k in range(len(plan.parts)):
            where = part_folder(folder, k)
            doomed += [storage.join(where, rel) for rel in storage.list_files(where, "") if "derived-tokens" not in rel]
        if storage.is_remote(folder):
            storage.delete_many(doomed)
        else:
            for loc in doomed:
                storage.delete(loc)
    except (StoreError, OSError) as e:
        log.info("the merged load parts in %s stay for now: %s", folder, e)
