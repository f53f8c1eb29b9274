"""A shard's calls, sorted out of the merge's buckets by the shard itself (on any worker):
each bucket's plan pieces hold its calls a shard per row group (merge/bucket.py), so the
shard reads only its own row groups of each bucket, routes each row to the sort bucket of
its group (whole groups of about BUCKET_ROWS rollout and call rows: the merge's
`groups.parquet`), sorts one sort bucket at a time into output order (CALL_ORDER) and
writes its plan's calls.parquet and token_groups.parquet (load/shard_plan.py), which it then
reads as before. Memory: the rows held before they spill, and one sort bucket.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..buckets import read_bucket
from ..load.parts import read_plan
from ..load.shard_plan import (
    BUCKET_ROWS,
    CALL_ORDER,
    SortBuckets,
    TokenGroups,
    empty_of,
    plan_dir,
    plan_gone,
    sort_rows,
    write_sorted,
)
from ..settings import DEFAULTS, Settings
from ..warehouse import scratch_config
from .bucket import pieces_dir
from .staging import merge_dir


def sort_buckets(folder: str, shard: int) -> tuple[pa.Array, np.ndarray]:
    """The shard's groups and the sort bucket of each (as sql/plan_buckets.sql cuts them)."""
    groups = pq.read_table(storage.open_parquet(storage.join(merge_dir(folder), "groups.parquet")))
    mine = groups.filter(pc.equal(groups.column("shard"), shard))
    rows = mine.column("n_rows").to_numpy(zero_copy_only=False).astype(np.int64)
    before = np.concatenate([[0], np.cumsum(rows)[:-1]]) if len(rows) else rows
    return mine.column("group_id").combine_chunks(), before // BUCKET_ROWS


def build_calls(folder: str, shard: int, plans: str | None = None, settings: Settings = DEFAULTS) -> None:
    """Write shard `shard`'s calls.parquet and token_groups.parquet into its plan (in the
    run's `folder`, or in `plans`) from the buckets' pieces in `folder`."""
    mine = storage.join(plan_dir(plans or folder, shard), "rollouts.parquet")
    if not storage.exists(mine):
        raise plan_gone(mine)
    plan = read_plan(folder)
    groups, of_group = sort_buckets(folder, shard)
    files = [
        pq.ParquetFile(storage.open_parquet(storage.join(pieces_dir(folder, b), "calls.parquet")))
        for b in range(plan.buckets)
    ]
    schema = files[0].schema_arrow.remove(files[0].schema_arrow.get_field_index("bucket"))
    schema = schema.append(pa.field("plan_bucket", pa.int64()))
    spill = scratch_config(settings.duckdb)["temp_directory"]

    def routed() -> Iterator[pa.RecordBatch]:
        for file in files:
            for table in read_bucket(file, shard):
                at = pc.index_in(table.column("group_id"), value_set=groups).to_numpy(zero_copy_only=False)
                table = table.append_column("plan_bucket", pa.array(of_group[at.astype(np.int64)], pa.int64()))
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
