"""The keys of the night's token rows, read from the token files' key columns only.

Each token file is read a row group at a time, just its `staging_key`, `rollout_id` and
`model_call_id` columns, through storage.py (a local file or an S3 object, by range): the
token lists stay unread until a shard needs them. Each key gets where its row sits (file
location, row number in the file), so a shard reads exactly the rows a batch needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Set

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..formats.token_file import TokenFile, read_row_group

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


def key_batches(
    locations: list[str],
    skip: Set[tuple[str, int]] = frozenset(),
    footers: dict | None = None,
    done: Callable[[str], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """A batch of keys per row group of every file, but the row groups in `skip` (file, group);
    on object storage several files read at once (keys are small: a file's are held whole).
    `footers`: the files' (size, metadata) where known (read.token_files): not read again.
    `done(location)` once a file's keys are all given."""
    footers = footers or {}
    remote = any(storage.is_remote(loc) for loc in locations)

    def keys(loc: str) -> Iterable[pa.RecordBatch]:  # on object storage a file's keys fetched whole, ahead
        batches = _file_keys(loc, skip, footers.get(loc))
        return list(batches) if remote else batches

    for loc, batches in zip(locations, storage.map_ahead(keys, locations, remote, threads=8)):
        yield from batches
        if done is not None:
            done(loc)


def _file_keys(loc: str, skip: Set[tuple[str, int]], footer=None) -> Iterator[pa.RecordBatch]:
    """The keys of a file's row groups; on object storage the row groups read at once."""
    if footer is None:
        file = TokenFile(loc)
        footer = file.size, file.metadata
    size, metadata = footer
    sizes = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    firsts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    groups = [g for g, n in enumerate(sizes) if n and (loc, g) not in skip]
    one = lambda g: group_keys(metadata, loc, g, int(firsts[g]), size)  # noqa: E731
    if not storage.is_remote(loc) or len(groups) < 2:
        yield from map(one, groups)
        return
    yield from storage.map_ahead(one, groups, True, threads=8)


def group_keys(metadata: pq.FileMetaData, loc: str, group: int, first: int, size: int | None = None) -> pa.RecordBatch:
    """The keys of one row group (`first`: the number of its first row in the file), its key
    columns' pages checked against the footer before they are decoded (token_file.py)."""
    names = metadata.schema.to_arrow_schema().names
    present = [c for c in KEY_COLUMNS if c in names]
    table = read_row_group(loc, metadata, group, present, size)
    n = table.num_rows
    columns = [table.column(c).cast(pa.string()) if c in present else pa.nulls(n, pa.string()) for c in KEY_COLUMNS]
    columns += [pa.repeat(pa.scalar(loc, pa.string()), n), pa.array(np.arange(first, first + n))]
    return pa.RecordBatch.from_arrays(
        [pa.concat_arrays(c.chunks) if isinstance(c, pa.ChunkedArray) else c for c in columns], schema=KEYS
    )
