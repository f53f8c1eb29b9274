"""Rows into the warehouse in chunks: dict rows buffered and inserted through a SQL file, as
Arrow batches typed by formats/fields.py."""

from __future__ import annotations

import pyarrow as pa

from ..formats.fields import LEDGER, ROLLOUT, arrow_schema
from ..warehouse import sql

CHUNK_ROWS = 500  # rows buffered before an insert: a rollout row carries its whole output's fingerprints

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


class Inserter:
    """Buffers dict rows and inserts them through sql/<statement>.sql, CHUNK_ROWS at a time."""

    def __init__(self, con, statement: str, schema: pa.Schema, ds: str):
        self.con, self.statement, self.schema, self.ds = con, sql(statement), schema, ds
        self.rows: list[dict] = []
        self.count = 0

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if len(self.rows) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.con.register("batch", pa.Table.from_pylist(self.rows, schema=self.schema))
            self.con.execute(self.statement, {"ds": self.ds})
            self.con.unregister("batch")
            self.count += len(self.rows)
            self.rows = []
