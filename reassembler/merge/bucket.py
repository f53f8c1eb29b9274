"""One bucket of rollouts (merge/__init__.py, step 3): the night's per-call rows of the
rollout ids that fall in it (buckets.py), once the global step and every key bucket have
finished (sql/bucket_merge.sql):

- ledger lines numbered in the night's reading order, the derived calls each rollout keeps
  numbered after them, their token rows' keys, the parts' reject rows, the ledger lines of
  no rollout as reject rows, and the items of the rollouts it keeps (rollout_items):
  written as the bucket's files of the per-call tables (call_tables.py), in the run's
  folders (invisible until the night's commit names the run);
- the bucket's plan pieces (`bucket-NNNNN/calls.parquet`): its calls with their token rows,
  each row group of one shard (sql/bucket_calls.sql); its rollouts' items
  (`items.parquet`, the same way: sql/bucket_items.sql), which the warehouse's rollout rows
  do not hold; and per rollout the first ledger line of its own that was rejected
  (`rollout_rejects.parquet`), for the shards' rollouts.

A bucket run again (a retried task) rewrites the same files whole: nothing is appended.
"""

from __future__ import annotations

import pyarrow as pa

from .. import call_tables, storage
from ..formats.fields import CALL, select_list
from ..load.parts import LoadPlan
from ..settings import DEFAULTS, Settings
from ..warehouse import run_script, sql
from . import keys, rollouts
from .staging import (
    check_handed,
    handed,
    merge_dir,
    part_files,
    read_marker,
    read_part_markers,
    scratch,
    stage,
    write_bucketed,
    write_marker,
    write_query,
)

ITEM_ROWS = 1024  # rollouts a batch as their items go to the plan pieces (a rollout's are kilobytes)
ROLLOUT_REJECTS = pa.schema([("rollout_id", pa.string()), ("n_rejected", pa.int64()), ("first_rejected", pa.string())])


PIECES = ["calls.parquet", "items.parquet", "rollout_rejects.parquet"]  # a bucket's files, its marker records


def name(bucket: int) -> str:
    return f"bucket-{bucket:05d}"


def pieces_dir(folder: str, bucket: int) -> str:
    return storage.join(merge_dir(folder), name(bucket))


def merge_bucket(
    plan: LoadPlan, folder: str, bucket: int, calls: tuple[str, str], settings: Settings = DEFAULTS
) -> dict:
    """Rollout bucket `bucket` of the night of `plan` (its parts, global step and key
    buckets in `folder`: RuntimeError naming one that has not finished); `calls`: the
    output and run the night's per-call files go to. Returns its marker."""
    markers = read_part_markers(plan, folder)
    top = read_marker(folder, rollouts.NAME, "the merge's global step", plan)
    key_markers = [read_marker(folder, keys.name(b), f"key bucket {b}", plan) for b in range(plan.buckets)]
    ds, (output, run) = plan.night.ds, calls
    bases, before = [], 0
    for marker in markers:
        bases.append(before)
        before += marker["ledger_lines"]
    con = scratch(settings.duckdb)
    try:
        call_tables.open_night(con)
        for table in ("ledger", "rejects", "rollout_items"):
            stage(con, f"p_{table}", part_files(plan, folder, table, markers), bucket)
        where = merge_dir(folder)
        decisions = check_handed(where, "decisions.parquet", top, "the merge's global step")
        stage(con, "decisions", [decisions], bucket, with_part=False)
        matches = [
            check_handed(where, f"{keys.name(b)}.parquet", m, f"key bucket {b}") for b, m in enumerate(key_markers)
        ]
        stage(con, "matches", matches, bucket, with_part=False)
        con.register("part_bases", pa.table({"part": list(range(len(bases))), "base": bases}))
        run_script(con, "bucket_merge", {"ds": ds})
        con.unregister("part_bases")
        written = call_tables.write_bucket(con, output, ds, run, f"{name(bucket)}.parquet")
        pieces = pieces_dir(folder, bucket)
        reader = con.sql(sql("bucket_calls", call_columns=select_list(CALL, "l"))).to_arrow_reader(8192)
        write_bucketed(reader, storage.join(pieces, "calls.parquet"), "plan_shard", 0, direct=True)
        reader = con.sql(sql("bucket_items")).to_arrow_reader(ITEM_ROWS)
        write_bucketed(reader, storage.join(pieces, "items.parquet"), "plan_shard", 0, direct=True)
        write_query(
            con,
            storage.join(pieces, "rollout_rejects.parquet"),
            "SELECT rollout_id, count(*) AS n_rejected, "
            "arg_min(file || ':' || line || ': ' || error, (file, line)) AS first_rejected "
            "FROM rejects WHERE source = 'ledger' AND rollout_id IN (SELECT rollout_id FROM decisions WHERE kept) "
            "GROUP BY rollout_id ORDER BY rollout_id",
            schema=ROLLOUT_REJECTS,
        )
        [[used, failed, lines]] = con.execute(
            "SELECT count(*) FILTER (WHERE d.kept), count(*) FILTER (WHERE d.failed AND NOT d.kept), count(*) "
            "FROM ledger l LEFT JOIN decisions d USING (rollout_id) WHERE l.capture IS NULL"
        ).fetchall()
        rejected = dict(con.execute("SELECT source, count(*) FROM rejects GROUP BY source").fetchall())
    finally:
        con.close()
    marker = {
        "plan": plan.plan_id,
        "bucket": bucket,
        "ledger_used": used,
        "ledger_failed": failed,
        "ledger_lines": lines,
        "rows": written,
        "rejects": rejected,
        "files": handed(pieces, PIECES),
    }
    write_marker(folder, name(bucket), marker)
    return marker
