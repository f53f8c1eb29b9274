"""Rows split into the merge's buckets by a stable hash of a key (a rollout id, a staging
key): a key lands in the same bucket in every process and on every machine, whichever load
part read it, so a bucket's merge sees every row of its keys (docs/deploy-celery.md).

The hash is computed in numpy over the keys' UTF-8 bytes, never a Python loop per key:
each byte (plus one) weighted by an odd constant to the power of its place, summed per key
modulo 2^64, the key's length mixed in, then SplitMix64's finalizer. A null key hashes as
the empty string. The bucket is the hash modulo the number of buckets.

A file of rows split this way (`BucketedFile`) holds row groups of one bucket each, with
the bucket in a column of its own, so a bucket's reader takes its row groups by their
statistics and reads nothing else (`read_bucket`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

MULTIPLIER = np.uint64(0x100000001B3)  # FNV's 64-bit prime: odd, so its powers never vanish
BUCKET = "bucket"  # the column of a BucketedFile that holds each row's bucket


def _mix(h: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return h ^ (h >> np.uint64(31))


def key_hash(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The stable 64-bit hash of each key (uint64), nulls as the empty string."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks else pa.array([], pa.string())
    keys = pc.cast(keys, pa.large_string()).fill_null("")
    n = len(keys)
    if n == 0:
        return np.zeros(0, np.uint64)
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[keys.offset : keys.offset + n + 1]
    lengths = np.diff(offsets)
    start, end = int(offsets[0]), int(offsets[-1])
    data = (
        np.frombuffer(data_buf, np.uint8)[start:end] if data_buf is not None and end > start else np.zeros(0, np.uint8)
    )
    h = np.zeros(n, np.uint64)
    if len(data):
        longest = int(lengths.max())
        with np.errstate(over="ignore"):
            powers = np.multiply.accumulate(np.full(longest, MULTIPLIER, np.uint64))
            place = np.arange(len(data), dtype=np.int64) - np.repeat(offsets[:-1] - start, lengths)
            weighted = (data.astype(np.uint64) + np.uint64(1)) * powers[place]
        filled = np.flatnonzero(lengths > 0)
        with np.errstate(over="ignore"):
            h[filled] = np.add.reduceat(weighted, (offsets[:-1] - start)[filled])
    return _mix(h ^ lengths.astype(np.uint64))


def bucket_of(keys: pa.Array | pa.ChunkedArray, buckets: int) -> np.ndarray:
    """Each key's bucket in [0, buckets) (int32)."""
    if buckets <= 1:
        return np.zeros(len(keys), np.int32)
    return (key_hash(keys) % np.uint64(buckets)).astype(np.int32)


HELD_BYTES = 32 << 20  # rows a BucketedFile holds before it writes the largest bucket's
GROUP_ROWS = 65_536  # most rows of one row group


class BucketedFile:
    """Rows written into one Parquet file at `sink`, each row group of one bucket (the
    `bucket` column appended to `schema`): rows are held per bucket, and a bucket's are
    written as a row group once it holds GROUP_ROWS rows, or, once all held rows pass
    HELD_BYTES, the largest bucket's. Rows of one bucket keep the order they came in."""

    def __init__(self, sink, schema: pa.Schema, key: str, buckets: int, direct: bool = False, **options):
        """`direct`: the `key` column holds each row's bucket itself (an integer), not a key to hash."""
        self.schema, self.key, self.buckets, self.direct = schema, key, buckets, direct
        self.file_schema = schema.append(pa.field(BUCKET, pa.int32()))
        self._writer = pq.ParquetWriter(sink, self.file_schema, **options)
        self._held: dict[int, list[pa.Table]] = {}
        self._rows: dict[int, int] = {}
        self._bytes: dict[int, int] = {}
        self.rows = 0

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        if not table.num_rows:
            return
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        table = table.select(self.schema.names).cast(self.schema)
        self.rows += table.num_rows
        if self.direct:
            of = table.column(self.key).fill_null(0).to_numpy().astype(np.int32)
        else:
            of = bucket_of(table.column(self.key), self.buckets)
        if (of == of[0]).all():
            self._hold(int(of[0]), table, of[: table.num_rows])
        else:
            order = np.argsort(of, kind="stable")
            ordered, sorted_of = table.take(pa.array(order)), of[order]
            values, starts = np.unique(sorted_of, return_index=True)
            ends = [*starts[1:].tolist(), len(order)]
            for b, s, e in zip(values.tolist(), starts.tolist(), ends):
                self._hold(b, ordered.slice(s, e - s), sorted_of[s:e])
        while sum(self._bytes.values()) > HELD_BYTES:
            self._flush(max(self._bytes, key=self._bytes.__getitem__))

    def _hold(self, b: int, table: pa.Table, of: np.ndarray) -> None:
        table = table.append_column(BUCKET, pa.array(of, pa.int32()))
        self._held.setdefault(b, []).append(table)
        self._rows[b] = self._rows.get(b, 0) + table.num_rows
        self._bytes[b] = self._bytes.get(b, 0) + table.nbytes
        if self._rows[b] >= GROUP_ROWS:
            self._flush(b)

    def _flush(self, b: int) -> None:
        tables = self._held.pop(b, [])
        self._rows.pop(b, None)
        self._bytes.pop(b, None)
        if tables:
            table = pa.concat_tables(tables).combine_chunks()
            self._writer.write_table(table, row_group_size=max(1, table.num_rows))

    def close(self) -> None:
        for b in sorted(self._held):
            self._flush(b)
        self._writer.close()


def bucket_groups(metadata: pq.FileMetaData, bucket: int) -> list[int]:
    """The row groups of a BucketedFile that hold `bucket` (by their statistics)."""
    column = metadata.schema.names.index(BUCKET)
    out = []
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        stats = group.column(column).statistics
        if group.num_rows and stats is not None and stats.has_min_max and stats.min <= bucket <= stats.max:
            out.append(g)
        elif group.num_rows and (stats is None or not stats.has_min_max):
            out.append(g)  # no statistics: read it, the filter below keeps the bucket's rows
    return out


def read_bucket(file: pq.ParquetFile, bucket: int, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """The rows of `bucket` in a BucketedFile, a row group at a time, without the bucket column."""
    for g in bucket_groups(file.metadata, bucket):
        table = file.read_row_group(g, columns=None if columns is None else [*columns, BUCKET])
        of = table.column(BUCKET)
        table = table.filter(pc.equal(of, bucket)).drop_columns([BUCKET])
        if table.num_rows:
            yield table
