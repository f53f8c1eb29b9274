"""Rows of wide tables put in order without DuckDB sorting them whole.

DuckDB 2.0, streaming a table of wide rows `ORDER BY` a key, runs out of memory at a small
`memory_limit` (128MB, the default: 100,000 rows of 2 KB fail at 64MB whatever the Arrow
batch), where the same rows read unordered stream in bounded memory. So the rows are put in
order in buckets:

    invariant: DuckDB sorts only the keys (and each row's rowid), numbering the rows in
               order and cutting them into buckets of `rows` rows; the wide rows are read
               once, unordered, each with its bucket; a bucket's rows are held in memory up
               to HELD_BYTES in all, then spilled to an Arrow file of their own; each bucket
               is then sorted by Arrow (ties in the order they came) and given out in
               bucket order. Memory: the held rows and one bucket, whatever the table.

`SortBuckets` and `sort_rows` also serve queries that bring their own bucket column
(`plan_bucket`: the shard plans, load/shard_plan.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HELD_BYTES = 64 * 2**20  # rows held in memory before the buckets are spilled to files
BUCKET = "plan_bucket"  # the column that holds each row's bucket (dropped with every plan_ column)


def spill_of(con) -> str:
    """The spill folder of the DuckDB connection `con`, where held rows spill too."""
    [[spill]] = con.execute("SELECT current_setting('temp_directory')").fetchall()
    return spill


def ordered(con, table: str, order: list[str], exclude: str | None, rows: int) -> tuple[pa.Schema, Iterator[pa.Table]]:
    """The rows of `table` (a table of the connection `con`, without its columns `exclude`)
    in the order of the columns `order`, ascending, nulls last: its schema and its rows, a
    table a bucket of `rows` rows (held rows spill into the connection's spill folder)."""
    spill = spill_of(con)
    by = ", ".join(f"{c} ASC NULLS LAST" for c in order)
    columns = "t.*" if exclude is None else f"t.* EXCLUDE ({exclude})"
    query = (
        f"SELECT {columns}, o.{BUCKET} FROM {table} t "  # noqa: S608 - the caller's fixed names
        f"JOIN (SELECT rowid AS plan_rowid, (row_number() OVER (ORDER BY {by}) - 1) // {int(rows)} AS {BUCKET} "
        f"FROM {table}) o ON o.plan_rowid = t.rowid"
    )
    reader = con.sql(query).to_arrow_reader(min(rows, 8192))
    schema = empty_of(reader.schema).schema

    def tables() -> Iterator[pa.Table]:
        with SortBuckets(reader.schema, spill) as held:
            for batch in reader:
                held.add(batch)
            for bucket in held.tables():
                yield sort_rows(bucket, [(c, "ascending") for c in order])

    return schema, tables()


def sort_rows(table: pa.Table, order: list[tuple[str, str]]) -> pa.Table:
    """`table` (a query's rows, with their plan_ columns) in `order`, without those columns:
    ROLLOUT_ORDER or CALL_ORDER, what ORDER BY would give (nulls last), ties in table order."""
    table = table.take(pc.sort_indices(table, sort_keys=order))
    return table.drop_columns([name for name in table.column_names if name.startswith("plan_")])


def empty_of(schema: pa.Schema) -> pa.Table:
    return pa.schema([f for f in schema if not f.name.startswith("plan_")]).empty_table()


class SortBuckets:
    """Rows routed to their bucket, held in memory up to HELD_BYTES, then spilled: one Arrow
    stream file a bucket, in a folder of its own in `spill`, removed on leaving."""

    def __init__(self, schema: pa.Schema, spill: str):
        self.schema, self.spill = schema, spill
        self.held: dict[int, list[pa.RecordBatch]] = {}
        self.held_bytes = 0
        self.folder: str | None = None
        self.writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for writer in self.writers.values():
            writer.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        bucket = batch.column(BUCKET).to_numpy(zero_copy_only=False)
        if bucket[0] == bucket[-1] and (bucket == bucket[0]).all():
            self._hold(int(bucket[0]), batch)
        else:
            order = np.argsort(bucket, kind="stable")
            ordered = batch.take(pa.array(order))
            keys, starts = np.unique(bucket[order], return_index=True)
            for key, start, end in zip(keys.tolist(), starts.tolist(), [*starts[1:].tolist(), len(order)]):
                self._hold(key, ordered.slice(start, end - start))
        self.held_bytes += batch.nbytes
        if self.held_bytes > HELD_BYTES:
            self._spill()

    def _hold(self, bucket: int, batch: pa.RecordBatch) -> None:
        self.held.setdefault(bucket, []).append(batch)

    def _spill(self) -> None:
        if self.folder is None:
            os.makedirs(self.spill, exist_ok=True)
            self.folder = tempfile.mkdtemp(prefix="plan-buckets-", dir=self.spill)
        for bucket, batches in self.held.items():
            if bucket not in self.writers:
                self.writers[bucket] = pa.ipc.new_stream(self._path(bucket), self.schema)
            self.writers[bucket].write_table(pa.Table.from_batches(batches, self.schema).combine_chunks())
        self.held, self.held_bytes = {}, 0

    def _path(self, bucket: int) -> str:
        assert self.folder is not None
        return os.path.join(self.folder, f"{bucket}.arrow")

    def tables(self) -> Iterator[pa.Table]:
        """Each bucket's rows, in bucket order (rows in the order they came)."""
        for bucket in sorted({*self.held, *self.writers}):
            batches = []
            if bucket in self.writers:
                self.writers.pop(bucket).close()
                path = self._path(bucket)
                with pa.OSFile(path) as source:
                    batches += pa.ipc.open_stream(source).read_all().to_batches()
                os.remove(path)
            batches += self.held.pop(bucket, [])
            yield pa.Table.from_batches(batches, self.schema)
