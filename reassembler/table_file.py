"""One Parquet table file written as its rows come, whole or absent (a load part's tables,
load/part_tables.py; the per-call tables beside the warehouse, call_tables.py; the merge's
files, merge/staging.py).

Rows are buffered and written a row group at a time (cut once it holds ROW_GROUP_ROWS rows
or ROW_GROUP_BYTES, whichever comes first; the write that reaches the bound stays whole), so
a writer's memory is a row group per table, whatever the size of the table. A file is whole
or absent: a local file is written under a temporary name and renamed once closed (a view's
glob never sees a torn file); an object appears once its upload completes
(storage.open_output), and a writer that fails leaves neither.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import storage
from .buckets import BucketedFile

DIGEST_CHUNK = 1 << 20


class HeldRows:
    """Rows held in the order given until taken as one table: one by one (laid out in tables
    by `to_table`, a run at a time) or as tables already (load/inserter.py's Inserter,
    load/derived_tokens.py's DerivedTokens)."""

    def __init__(self, to_table: Callable[[list], pa.Table]):
        self._to_table = to_table
        self._rows: list = []
        self._tables: list[pa.Table] = []
        self.count = 0  # rows held

    def add(self, row) -> None:
        self._rows.append(row)
        self.count += 1

    def add_table(self, table: pa.Table) -> None:
        self._lay_out()
        self._tables.append(table)
        self.count += table.num_rows

    def take(self) -> pa.Table | None:
        """Every row held, in order (None when none is)."""
        self._lay_out()
        if not self._tables:
            return None
        table = pa.concat_tables(self._tables) if len(self._tables) > 1 else self._tables[0]
        self._tables, self.count = [], 0
        return table

    def _lay_out(self) -> None:
        if self._rows:
            self._tables.append(self._to_table(self._rows))
            self._rows = []


ROW_GROUP_ROWS = 65_536
ROW_GROUP_BYTES = 16 << 20  # a rollout row carries its whole output's fingerprints
# every page with its CRC32: a reader that asks (merge/staging.py) finds a page damaged since it was written
OPTIONS: dict[str, Any] = {"compression": "zstd", "compression_level": 1, "write_page_checksum": True}


class TableFile:
    """One Parquet file at `loc` of `schema`, written a row group at a time (`write`), whole
    once `close()`d; `close(ok=False)` leaves nothing."""

    def __init__(self, loc: str, schema: pa.Schema, key: str | None = None, buckets: int = 1, direct: bool = False):
        self.loc, self.schema = loc, schema
        self._target = loc if storage.is_remote(loc) else f"{loc}.tmp-{os.getpid()}"
        self._sink = storage.open_output(self._target)
        # split by `key` into `buckets` (buckets.py; `direct`: `key` holds the bucket): the
        # file's row groups are one bucket's each
        self._bucketed = (
            None if key is None else BucketedFile(self._sink, schema, key, buckets, direct=direct, **OPTIONS)
        )
        self._writer = self._bucketed or pq.ParquetWriter(self._sink, schema, **OPTIONS)
        self._held: list[pa.Table] = []
        self._rows = self._bytes = 0
        self.rows = 0  # written so far

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        if not table.num_rows:
            return
        if table.schema != self.schema:
            table = table.cast(self.schema)
        if self._bucketed is not None:
            self._bucketed.write(table)
            self.rows += table.num_rows
            return
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        self._held.append(table)
        self._rows += table.num_rows
        self._bytes += table.nbytes
        self.rows += table.num_rows
        if self._rows >= ROW_GROUP_ROWS or self._bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        self._flush_to(self._writer)

    def _flush_to(self, writer) -> None:
        if self._held:  # one row group
            writer.write_table(pa.concat_tables(self._held).combine_chunks(), row_group_size=self._rows)
            self._held, self._rows, self._bytes = [], 0, 0

    def close(self, ok: bool = True) -> None:
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        try:
            if ok:
                self._flush_to(writer)
            writer.close()
        except BaseException:
            if ok:
                ok = False
                raise
        finally:
            storage.close_outputs([self._sink], ok=ok)
            if self._target != self.loc:
                if ok:
                    os.replace(self._target, self.loc)
                else:
                    storage.delete(self._target)


def write_table(
    loc: str,
    schema: pa.Schema,
    tables: Iterable[pa.Table | pa.RecordBatch],
    key: str | None = None,
    buckets: int = 1,
    direct: bool = False,
) -> int:
    """Tables (or batches, each cast to `schema`) into one Parquet file at `loc`, whole or
    absent (split by `key`: TableFile); returns the rows written."""
    file = TableFile(loc, schema, key, buckets, direct)
    try:
        for table in tables:
            file.write(table)
    except BaseException:
        file.close(ok=False)
        raise
    file.close()
    return file.rows


def digest(loc: str) -> dict:
    """`loc`'s size and SHA-256, read a chunk at a time: what a writer records of a file it
    wrote, and its reader checks before trusting it (a load part's files: merge/staging.py)."""
    import hashlib

    sha, size = hashlib.sha256(), 0
    with storage.open_input(loc) as fh:
        while chunk := fh.read(DIGEST_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": sha.hexdigest()}
