"""The night into the warehouse (the warehouse task's part of the merge: merge/__init__.py):
in one transaction, the night's rollout rows and shard ranges are written as the run's and
replace those of the night's other loads, the night's current run kept when a run published
it (sql/clear_night.sql: a rebuild replaces a published night only when it publishes); then
each shard's rollouts are written into its plan, from the run's rows. Its cost grows with the night's rollouts
and groups, never with its calls: those the buckets wrote are not read here, only their
markers' counts.
"""

from __future__ import annotations

import pyarrow as pa

from .. import storage
from ..load.gym_capture import GymSummary
from ..load.parts import LoadPlan
from ..load.read import LoadSummary, SourceCount
from ..load.shard_plan import write_rollout_plans
from ..warehouse import run_script
from . import bucket, keys, rollouts
from .staging import (
    WIDE_ROWS,
    check_handed,
    merge_dir,
    open_checked,
    read_checked,
    read_marker,
    read_part_markers,
    read_whole,
)


def markers(plan: LoadPlan, folder: str) -> tuple[list[dict], dict, list[dict], list[dict]]:
    """The markers of every step of the merge (RuntimeError naming one not finished)."""
    parts = read_part_markers(plan, folder)
    top = read_marker(folder, rollouts.NAME, "the merge's global step", plan)
    key_markers = [read_marker(folder, keys.name(b), f"key bucket {b}", plan) for b in range(plan.buckets)]
    buckets = [read_marker(folder, bucket.name(b), f"merge bucket {b}", plan) for b in range(plan.buckets)]
    return parts, top, key_markers, buckets


def commit_merge(con, plan: LoadPlan, folder: str, calls: tuple[str, str]) -> LoadSummary:
    """Replace the night in the warehouse behind `con` with the merge's (every step done).
    Returns the load's summary; every line and token row read is accounted for."""
    parts, top, key_markers, bucket_markers = markers(plan, folder)
    ds, (_, run) = plan.night.ds, calls
    where = merge_dir(folder)
    step = "the merge's global step"
    night = open_checked(check_handed(where, "rollouts.parquet", top, step, whole=True))
    groups_at = check_handed(where, "groups.parquet", top, step, whole=True)
    groups = read_whole(groups_at)
    con.execute("BEGIN TRANSACTION")
    try:
        run_script(con, "clear_night", {"ds": ds, "run": run})
        batches = read_checked(storage.join(where, "rollouts.parquet"), night.iter_batches(WIDE_ROWS))
        con.register("night_rollouts", pa.RecordBatchReader.from_batches(night.schema_arrow, batches))
        con.register("night_groups", groups)
        run_script(con, "insert_night", {"ds": ds, "run": run})
        con.unregister("night_rollouts")
        con.unregister("night_groups")
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except Exception:  # noqa: BLE001, S110 - the error that aborted the commit is the one reported
            pass
        raise
    return summarize(plan, parts, top, key_markers, bucket_markers)


def summarize(
    plan: LoadPlan, parts: list[dict], top: dict, key_markers: list[dict], buckets: list[dict]
) -> LoadSummary:
    counts: dict[str, int] = {}
    for marker in [top, *key_markers, *buckets]:
        for source, n in marker["rejects"].items():
            counts[source] = counts.get(source, 0) + n
    token_rows = sum(m["in_token_files"] for m in key_markers) + sum(m["too_big_rows"] for m in parts)
    summary = LoadSummary(
        rollouts=SourceCount(top["rollout_lines"], top["rollouts_loaded"], counts.get("rollouts", 0)),
        ledger=SourceCount(
            sum(m["ledger_lines"] for m in parts),
            sum(m["ledger_used"] for m in buckets),
            counts.get("ledger", 0),
            sum(m["ledger_failed"] for m in buckets),
        ),
        tokens=SourceCount(token_rows, token_rows - counts.get("tokens", 0), counts.get("tokens", 0)),
        n_ledger_rows=sum(m["ledger_lines"] for m in buckets),
        n_token_files=len(plan.night.tokens),
        sidecars=tuple(plan.night.sidecars),
        gym=GymSummary(**top["gym"]),
        other_rejects=counts.get("failures", 0) + counts.get("capture", 0),
        traces=tuple(top["traces"]),
        envelopes=tuple(top["envelopes"]),
    )
    for name in ("rollouts", "ledger", "tokens"):
        c = getattr(summary, name)
        if c.read != c.loaded + c.rejected + c.failed_attempts:  # every line and token row is accounted for
            raise RuntimeError(f"internal: {name} {c}")
    return summary


def write_shard_rollouts(con, plan: LoadPlan, folder: str, run: str, shards: int, plans: str | None = None) -> None:
    """Each shard's rollouts into its plan (in the run's `folder`, or in `plans`), from the
    rows of `run` (path-safe) the warehouse behind `con` now holds, with the buckets'
    rejected ledger lines."""
    where = merge_dir(folder)
    rejected = []
    for b in range(plan.buckets):
        marker = read_marker(folder, bucket.name(b), f"merge bucket {b}", plan)
        at = check_handed(bucket.pieces_dir(folder, b), "rollout_rejects.parquet", marker, f"merge bucket {b}", True)
        rejected.append(read_whole(at))
    top = read_marker(folder, rollouts.NAME, "the merge's global step", plan)
    con.register("rollout_rejects", pa.concat_tables(rejected) if rejected else bucket.ROLLOUT_REJECTS.empty_table())
    decisions = check_handed(where, "decisions.parquet", top, "the merge's global step", whole=True)
    columns = ["rollout_id", "kept", "shard", "sort_bucket"]
    con.register("night_sort", read_whole(decisions, columns))
    try:
        write_rollout_plans(con, plans or folder, plan.night.ds, run, shards)
    finally:
        con.unregister("rollout_rejects")
        con.unregister("night_sort")
