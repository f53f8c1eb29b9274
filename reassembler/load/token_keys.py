"""The keys of the night's token rows, read from the token files' key columns only.

Each token file is read a row group at a time, just its `staging_key`, `rollout_id` and
`model_call_id` columns, through storage.py (a local file or an S3 object, by range): the
token lists stay unread until a shard needs them. Each key gets where its row sits (file
location, row number in the file), so a shard reads exactly the rows a batch needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..formats import token_pieces
from ..formats.row_groups import decoded_bytes, read_row_group
from ..settings import DEFAULTS

KEY_COLUMNS = ("staging_key", "rollout_id", "model_call_id")
KEYS = pa.schema(
    [
        ("t_staging_key", pa.string()),
        ("t_rollout_id", pa.string()),
        ("t_model_call_id", pa.string()),
        ("t_file", pa.string()),
        ("t_row", pa.int64()),
    ]
)


Skip = Mapping[str, list[tuple[int, int]]]  # location -> (first, last) rows whose keys are not read


def key_batches(
    locations: list[str],
    skip: Skip | None = None,
    footers: dict | None = None,
    done: Callable[[str], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Batches of keys of every file's rows but the rows in `skip` (read.TokenFiles.skip:
    rows too big to decode); a batch per row group, or per piece of one whose keys alone
    are too large to decode at once. On object storage several files are read at once
    (keys are small: a file's are held whole). `footers`: the files' (size, metadata) where
    known (read.token_files): not read again. `done(location)` once a file's keys are all given."""
    footers = footers or {}
    skip = skip or {}
    remote = any(storage.is_remote(loc) for loc in locations)

    def keys(loc: str) -> Iterable[pa.RecordBatch]:  # on object storage a file's keys fetched whole, ahead
        batches = _file_keys(loc, skip.get(loc, []), footers.get(loc))
        return list(batches) if remote else batches

    for loc, batches in zip(locations, storage.map_ahead(keys, locations, remote, threads=8)):
        yield from batches
        if done is not None:
            done(loc)


def _file_keys(loc: str, skip: list[tuple[int, int]], footer=None) -> Iterator[pa.RecordBatch]:
    """The keys of a file's row groups; on object storage the row groups read at once."""
    if footer is None:
        source = storage.open_parquet(loc)
        size = source.size() if storage.is_remote(loc) else None
        footer = size, pq.read_metadata(source)
    size, metadata = footer
    sizes = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    firsts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def skipped(g: int) -> int:  # rows of group g in `skip`
        a, b = int(firsts[g]), int(firsts[g + 1]) - 1
        return sum(max(0, min(b, last) - max(a, first) + 1) for first, last in skip)

    groups = [g for g, n in enumerate(sizes) if n and skipped(g) < n]

    def one(g: int) -> list[pa.RecordBatch]:
        batches = group_key_batches(metadata, loc, g, int(firsts[g]), size)
        return [_without(b, skip) for b in batches] if skipped(g) else list(batches)

    if not storage.is_remote(loc) or len(groups) < 2:
        for g in groups:
            yield from one(g)
        return
    for batches in storage.map_ahead(one, groups, True, threads=8):
        yield from batches


def _without(batch: pa.RecordBatch, skip: list[tuple[int, int]]) -> pa.RecordBatch:
    rows = batch.column("t_row").to_numpy()
    keep = np.ones(len(rows), dtype=bool)
    for first, last in skip:
        keep &= (rows < first) | (rows > last)
    return batch.filter(pa.array(keep))


def group_key_batches(
    metadata: pq.FileMetaData,
    loc: str,
    group: int,
    first: int,
    size: int | None = None,
    bound: int = DEFAULTS.max_row_group_bytes,
) -> Iterator[pa.RecordBatch]:
    """The keys of one row group (`first`: the number of its first row in the file), its key
    columns' pages checked against the footer before they are decoded (token_file.py): one
    batch, or, when the key columns alone decode past `bound`, a batch per piece of rows
    (formats/token_pieces.py) of a quarter of it."""
    names = metadata.schema.to_arrow_schema().names
    present = [c for c in KEY_COLUMNS if c in names]
    n = metadata.row_group(group).num_rows
    footprint = decoded_bytes(metadata, group, present)
    if footprint <= bound or n == 1:  # one row's keys past the bound: refused (read_row_group)
        yield _keys(read_row_group(loc, metadata, group, present, size, bound), present, loc, first)
        return
    rows = max(1, int(n * (bound / 4) / footprint))
    cursor = token_pieces.Cursor(loc, metadata, group, present, size, rows, bound)
    for at in range(0, n, rows):
        yield _keys(cursor.read(at, min(rows, n - at)), present, loc, first + at)


def _keys(table: pa.Table, present: list[str], loc: str, first: int) -> pa.RecordBatch:
    n = table.num_rows
    columns = [table.column(c).cast(pa.string()) if c in present else pa.nulls(n, pa.string()) for c in KEY_COLUMNS]
    columns += [pa.repeat(pa.scalar(loc, pa.string()), n), pa.array(np.arange(first, first + n))]
    return pa.RecordBatch.from_arrays(
        [pa.concat_arrays(c.chunks) if isinstance(c, pa.ChunkedArray) else c for c in columns], schema=KEYS
    )
