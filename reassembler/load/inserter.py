"""Rows into a table in chunks: dict rows buffered, then written as Arrow batches typed by
formats/fields.py, to a sink: a load part's Parquet file (load/part_tables.py) or the
warehouse, through a SQL file (`IntoWarehouse`)."""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from ..formats.fields import EPISODE, LEDGER, ROLLOUT, ROLLOUT_ITEMS, ROLLOUT_ROW, arrow_schema
from ..table_file import HeldRows
from ..warehouse import sql

CHUNK_ROWS = 500  # rows buffered before a write: a rollout row carries its whole output's fingerprints

ROLLOUT_BATCH = arrow_schema((*ROLLOUT, EPISODE))  # a rollout line as parsed: RolloutTap splits it
ROLLOUT_ROWS = arrow_schema(ROLLOUT_ROW)  # the warehouse's rollout rows
PART_ROLLOUTS = arrow_schema((*ROLLOUT_ROW, EPISODE))  # a part's rollout rows
_SEQ = next(f for f in ROLLOUT if f.name == "rollout_seq")
PART_ITEMS = arrow_schema((ROLLOUT_ITEMS[0], _SEQ, *ROLLOUT_ITEMS[1:]))  # and their per-call fields
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


class RolloutTap:
    """A part's rollout rows as the parsers write them (ROLLOUT_BATCH), split into its two
    tables: the rows (PART_ROLLOUTS) and, keyed by the part's rollout_seq, their fields that
    grow with the calls (PART_ITEMS: formats/fields.py, ROLLOUT_ITEMS)."""

    def __init__(self, rows: Sink, items: Sink):
        self.rows, self.items = rows, items

    def write(self, table: pa.Table) -> None:
        self.rows.write(table.select(PART_ROLLOUTS.names))
        self.items.write(table.select(PART_ITEMS.names))


class Inserter:
    """Buffers rows and writes them to `sink` as tables of `schema`, CHUNK_ROWS at a time:
    dict rows (`add`) or tables of `schema` (`add_table`), in the order given."""

    def __init__(self, sink: Sink, schema: pa.Schema):
        self.sink, self.schema = sink, schema
        self._held = HeldRows(lambda rows: pa.Table.from_pylist(rows, schema=schema))
        self.count = 0

    def add(self, row: dict) -> None:
        self._held.add(row)
        if self._held.count >= CHUNK_ROWS:
            self.flush()

    def add_table(self, table: pa.Table) -> None:
        self._held.add_table(table)
        if self._held.count >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        table = self._held.take()
        if table is not None:
            self.sink.write(table)
            self.count += table.num_rows
