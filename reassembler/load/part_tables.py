"""A load part's tables (load/part_load.py), each one Parquet file written as its rows come.

A part holds no database: the rows it parses are buffered and written a row group at a
time (cut once it holds ROW_GROUP_ROWS rows or ROW_GROUP_BYTES, whichever comes first; the
write that reaches the bound stays whole), so a part's memory is a row group per table,
whatever the size of the part. A file is whole or absent: a local
file is written under a temporary name and renamed once closed; an object appears once its
upload completes (storage.open_output), and a part that fails leaves neither.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..buckets import BucketedFile

ROW_GROUP_ROWS = 65_536
ROW_GROUP_BYTES = 16 << 20  # a rollout row carries its whole output's fingerprints
OPTIONS: dict[str, Any] = {"compression": "zstd", "compression_level": 1}


class TableFile:
    """One Parquet file at `loc` of `schema`, written a row group at a time (`write`), whole
    once `close()`d; `close(ok=False)` leaves nothing."""

    def __init__(self, loc: str, schema: pa.Schema, key: str | None = None, buckets: int = 1):
        self.loc, self.schema = loc, schema
        self._target = loc if storage.is_remote(loc) else f"{loc}.tmp-{os.getpid()}"
        self._sink = storage.open_output(self._target)
        # split by `key` into `buckets` (buckets.py): the file's row groups are one bucket's each
        self._bucketed = None if key is None else BucketedFile(self._sink, schema, key, buckets, **OPTIONS)
        self._writer = self._bucketed or pq.ParquetWriter(self._sink, schema, **OPTIONS)
        self._held: list[pa.Table] = []
        self._rows = self._bytes = 0
        self.rows = 0  # written so far

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        if not table.num_rows:
            return
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
    loc: str, schema: pa.Schema, tables: Iterable[pa.Table | pa.RecordBatch], key: str | None = None, buckets: int = 1
) -> None:
    """Tables (or batches) into one Parquet file at `loc`, whole (split by `key`: TableFile)."""
    file = TableFile(loc, schema, key, buckets)
    try:
        for table in tables:
            file.write(table)
    except BaseException:
        file.close(ok=False)
        raise
    file.close()


class PartTables:
    """The warehouse's four tables of a part (rollouts, ledger, rejects, token_keys) as
    TableFiles in `folder`: a context that closes them whole, or on an error leaves none."""

    def __init__(
        self, folder: str, schemas: dict[str, pa.Schema], keys: dict[str, str] | None = None, buckets: int = 1
    ):
        self.files: dict[str, TableFile] = {}
        try:
            for name, schema in schemas.items():
                key = (keys or {}).get(name)
                self.files[name] = TableFile(storage.join(folder, f"{name}.parquet"), schema, key, buckets)
        except BaseException:
            self.close(ok=False)
            raise

    def __getitem__(self, name: str) -> TableFile:
        return self.files[name]

    def close(self, ok: bool = True) -> None:
        first: BaseException | None = None
        for file in self.files.values():
            try:
                file.close(ok)
            except BaseException as e:  # the others still closed (or removed)
                ok, first = False, first or e
        if first is not None:
            raise first

    def __enter__(self) -> PartTables:
        return self

    def __exit__(self, kind, value, tb) -> None:
        self.close(ok=kind is None)
