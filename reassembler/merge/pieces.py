"""A shard's calls, sorted out of the merge's buckets by the shard itself (on any worker):
each bucket's plan pieces hold its calls a shard per row group (merge/bucket.py), each call
with its rollout's sort bucket (runs of about BUCKET_ROWS rollout and call rows in output
order, cut between rollouts: sql/merge_plan.sql), so the shard reads only its own row groups
of each bucket, routes each row to its sort bucket, sorts one sort bucket at a time into
output order (CALL_ORDER) and writes its plan's calls.parquet and token_groups.parquet
(load/shard_plan.py), which it then reads as before; and its rollouts' items
(items.parquet) the same way, into the order of its rollouts. Memory: the rows held before they
spill, and one sort bucket, whatever the size of a group.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..buckets import read_bucket
from ..load.parts import read_plan
from ..load.shard_plan import CALL_ORDER, ITEM_ORDER, ITEMS_FILE, TokenGroups, plan_dir, plan_gone, write_sorted
from ..settings import DEFAULTS, Settings
from ..warehouse import scratch_config
from ..wide_sort import SortBuckets, empty_of, sort_rows
from .bucket import name as bucket_name
from .bucket import pieces_dir
from .staging import check_handed, open_checked, read_checked, read_marker


def build_calls(folder: str, shard: int, plans: str | None = None, settings: Settings = DEFAULTS) -> None:
    """Write shard `shard`'s calls.parquet, token_groups.parquet and items.parquet into its
    plan (in the run's `folder`, or in `plans`) from the buckets' pieces in `folder`."""
    mine = storage.join(plan_dir(plans or folder, shard), "rollouts.parquet")
    if not storage.exists(mine):
        raise plan_gone(mine)
    plan = read_plan(folder)
    spill = scratch_config(settings.duckdb)["temp_directory"]

    made = [read_marker(folder, bucket_name(b), f"merge bucket {b}", plan) for b in range(plan.buckets)]

    def pieces(name: str) -> list[tuple[str, pq.ParquetFile]]:
        at = [check_handed(pieces_dir(folder, b), name, made[b], f"merge bucket {b}") for b in range(plan.buckets)]
        return [(loc, open_checked(loc)) for loc in at]

    out = plan_dir(plans or folder, shard)
    token_groups = TokenGroups({}, settings.max_row_group_bytes)
    calls = (token_groups.add(table) for table in _sorted_out(pieces("calls.parquet"), shard, CALL_ORDER, spill))
    write_sorted(storage.join(out, "calls.parquet"), None, calls)
    table = token_groups.table()
    write_sorted(storage.join(out, "token_groups.parquet"), table.schema, [table])
    items = _sorted_out(pieces("items.parquet"), shard, ITEM_ORDER, spill)
    write_sorted(storage.join(out, ITEMS_FILE), None, items)


def _sorted_out(files: list[tuple[str, pq.ParquetFile]], shard: int, order, spill: str) -> Iterator[pa.Table]:
    """The rows of `shard` in the BucketedFiles `files` (pieces: each with its location),
    in `order`, a sort bucket (their plan_bucket) at a time; the first table is empty (it
    carries the schema). A page that fails its CRC is an InputError naming its file."""
    first = files[0][1].schema_arrow
    schema = first.remove(first.get_field_index("bucket"))
    yield empty_of(schema)
    with SortBuckets(schema, spill) as held:
        for loc, file in files:
            for table in read_checked(loc, read_bucket(file, shard)):
                for batch in table.cast(schema).to_batches():
                    held.add(batch)
        for table in held.tables():
            yield sort_rows(table, order)
