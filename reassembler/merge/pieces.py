"""A shard's calls, sorted out of the merge's buckets by the shard itself (on any worker):
each bucket's plan pieces hold its calls a shard per row group (merge/bucket.py), each call
with its rollout's sort bucket (runs of about BUCKET_ROWS rollout and call rows in output
order, cut between rollouts: sql/merge_plan.sql), so the shard reads only its own row groups
of each bucket, routes each row to its sort bucket, sorts one sort bucket at a time into
output order (CALL_ORDER) and writes its plan's calls.parquet and token_groups.parquet
(load/shard_plan.py), which it then reads as before. Memory: the rows held before they
spill, and one sort bucket, whatever the size of a group.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..buckets import read_bucket
from ..load.parts import read_plan
from ..load.shard_plan import CALL_ORDER, TokenGroups, plan_dir, plan_gone, write_sorted
from ..settings import DEFAULTS, Settings
from ..warehouse import scratch_config
from ..wide_sort import SortBuckets, empty_of, sort_rows
from .bucket import pieces_dir


def build_calls(folder: str, shard: int, plans: str | None = None, settings: Settings = DEFAULTS) -> None:
    """Write shard `shard`'s calls.parquet and token_groups.parquet into its plan (in the
    run's `folder`, or in `plans`) from the buckets' pieces in `folder`."""
    mine = storage.join(plan_dir(plans or folder, shard), "rollouts.parquet")
    if not storage.exists(mine):
        raise plan_gone(mine)
    plan = read_plan(folder)
    files = [
        pq.ParquetFile(storage.open_parquet(storage.join(pieces_dir(folder, b), "calls.parquet")))
        for b in range(plan.buckets)
    ]
    schema = files[0].schema_arrow.remove(files[0].schema_arrow.get_field_index("bucket"))
    spill = scratch_config(settings.duckdb)["temp_directory"]

    def routed() -> Iterator[pa.RecordBatch]:
        for file in files:
            for table in read_bucket(file, shard):
                yield from table.cast(schema).to_batches()

    def sorted_tables() -> Iterator[pa.Table]:
        yield empty_of(schema)
        with SortBuckets(schema, spill) as held:
            for batch in routed():
                held.add(batch)
            for table in held.tables():
                yield sort_rows(table, CALL_ORDER)

    out = plan_dir(plans or folder, shard)
    token_groups = TokenGroups({})
    calls = (token_groups.add(table) for table in sorted_tables())
    write_sorted(storage.join(out, "calls.parquet"), None, calls)
    table = token_groups.table()
    write_sorted(storage.join(out, "token_groups.parquet"), table.schema, [table])
