"""One bucket of staging keys (merge/__init__.py, step 2): the check that needs every call
at once, split by key. A token row is found by its staging key alone (CONTRACT.md 3), and
the load parts split both the token rows' keys and the ledger lines' staging keys by that
key (buckets.py), so this bucket sees every row of its keys:

- the night's token rows of these keys, as they are (the `token_rows` per-call table);
- the token rows no ledger line asks for: reject rows;
- each token row with the rollouts whose calls ask for it (`keys-NNNNN.parquet`, split by
  the asking rollout's bucket; a derived call's token rows are its own part's), which the
  rollouts' buckets join to their calls.

It needs no other step's output: it runs beside the global step (merge/rollouts.py).
"""

from __future__ import annotations

import pyarrow as pa

from .. import call_tables, storage
from ..load.parts import LoadPlan
from ..load.read import token_dir
from ..settings import DEFAULTS, Settings
from ..warehouse import sql
from .staging import (
    handed,
    merge_dir,
    part_files,
    read_part_markers,
    scratch,
    stage,
    write_bucketed,
    write_marker,
    write_query,
)

MATCHES = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("t_staging_key", pa.string()),
        ("t_rollout_id", pa.string()),
        ("t_model_call_id", pa.string()),
        ("t_file", pa.string()),
        ("t_row", pa.int64()),
        ("part", pa.int64()),  # the part that derived it (null: a token row of the night's files)
    ]
)


def name(bucket: int) -> str:
    return f"keys-{bucket:05d}"


def matches_path(folder: str, bucket: int) -> str:
    return storage.join(merge_dir(folder), f"{name(bucket)}.parquet")


def merge_keys(plan: LoadPlan, folder: str, bucket: int, calls: tuple[str, str], settings: Settings = DEFAULTS) -> dict:
    """Key bucket `bucket` of the night of `plan` (its parts in `folder`); `calls`: the
    output and run the night's per-call files go to. Returns its marker."""
    markers = read_part_markers(plan, folder)
    ds, output, run = plan.night.ds, *calls
    con = scratch(settings.duckdb)
    try:
        stage(con, "p_token_keys", part_files(plan, folder, "token_keys", markers), bucket, with_part=False)
        stage(con, "p_derived_keys", part_files(plan, folder, "derived_keys", markers), bucket)
        stage(con, "p_ledger_keys", part_files(plan, folder, "ledger_keys", markers), bucket)
        schemas = call_tables.schemas()
        piece = f"{name(bucket)}.parquet"
        token_rows = write_query(
            con,
            storage.join(call_tables.night_folder(output, "token_rows", ds, run), piece),
            "SELECT t_staging_key, t_rollout_id, t_model_call_id, t_file, t_row FROM p_token_keys "
            "ORDER BY t_rollout_id, t_staging_key, t_file, t_row",
            schema=schemas["token_rows"],
        )
        tokens = token_dir(plan.night)
        orphans = write_query(
            con,
            storage.join(call_tables.night_folder(output, "rejects", ds, run), piece),
            sql("keys_orphans"),
            {"token_dir": tokens},
            schemas["rejects"],
        )
        [[in_token_files]] = con.execute(
            "SELECT count(*) FROM p_token_keys WHERE starts_with(t_file, $token_dir)", {"token_dir": tokens}
        ).fetchall()
        reader = con.sql(sql("keys_matches")).to_arrow_reader(65_536)
        write_bucketed(reader, matches_path(folder, bucket), "rollout_id", plan.buckets, MATCHES)
    finally:
        con.close()
    marker = {"plan": plan.plan_id, "bucket": bucket, "token_rows": token_rows, "in_token_files": in_token_files}
    marker["files"] = handed(merge_dir(folder), [f"{name(bucket)}.parquet"])
    marker["rejects"] = {"tokens": orphans} if orphans else {}
    write_marker(folder, name(bucket), marker)
    return marker
