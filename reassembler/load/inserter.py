"""Rows into a table in chunks: dict rows buffered, then written as Arrow batches typed by
formats/fields.py, to a sink: a load part's Parquet file (load/part_tables.py) or the
warehouse, through a SQL file (`IntoWarehouse`)."""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from ..formats.fields import LEDGER, ROLLOUT, arrow_schema
from ..warehouse import sql

CHUNK_ROWS = 500  # rows buffered before a write: a rollout row carries its whole output's fingerprints

ROLLOUT_BATCH = arrow_schema(ROLLOUT)
LEDGER_BATCH = arrow_schema(LEDGER)
REJECT_BATCH = pa.schema(
    [
        ("source", pa.string()),
        ("file", pa.string()),
        ("line", pa.int64()),
        ("error", pa.string()),
        ("raw", pa.string()),
        ("rollout_id", pa.string()),
        ("model_call_id", pa.string()),
    ]
)


class Sink(Protocol):
    def write(self, table: pa.Table) -> None: ...


class IntoWarehouse:
    """A sink that inserts each table through sql/<statement>.sql (it reads `batch`; `$ds`)."""

    def __init__(self, con, statement: str, ds: str):
        self.con, self.statement, self.ds = con, sql(statement), ds

    def write(self, table: pa.Table) -> None:
        self.con.register("batch", table)
        try:
            self.con.execute(self.statement, {"ds": self.ds})
        finally:
            self.con.unregister("batch")


class Inserter:
    """Buffers dict rows and writes them to `sink` as tables of `schema`, CHUNK_ROWS at a time."""

    def __init__(self, sink: Sink, schema: pa.Schema):
        self.sink, self.schema = sink, schema
        self.rows: list[dict] = []
        self.count = 0

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if len(self.rows) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.sink.write(pa.Table.from_pylist(self.rows, schema=self.schema))
            self.count += len(self.rows)
            self.rows = []
