"""Each shard's plan: written by the load as Parquet into the run's folder on the output
store, so that a shard needs nothing but the store (no warehouse, no local file another
task wrote) and may run on any machine.

    <run folder>/plan/shard-<k>/rollouts.parquet   the shard's rollouts (sql/shard_rollouts.sql),
                                                   in output order: group_id, slot
    <run folder>/plan/shard-<k>/calls.parquet      their calls in the order the shard reads
                                                   them (sql/shard_calls.sql), each with its
                                                   token row's file and row number
    <run folder>/plan/shard-<k>/token_groups.parquet  the token row groups it reads (file, row
                                                   group, rows taken), in the order it first
                                                   needs them

Memory is bounded while writing: DuckDB sorts one slice of SLICE_CALLS calls' groups at a
time and streams it out in batches of CALL_BATCH_ROWS rows, which become the calls file's
row groups; the shard reads them back in the same batches. Both files are scratch, read
once: no compression, dictionary or statistics.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..errors import InputError
from ..formats.fields import CALL, select_list
from ..formats.token_file import TokenFile
from ..warehouse import sql

SLICE_CALLS = 8192  # calls DuckDB sorts at a time (~2.5 KB each): slices of whole groups
# Rows per Arrow batch DuckDB streams a slice in: at 64, streaming a 1x night's slices took
# ~0.09-0.13 CPU-s, at 256-512 ~0.07 (the build: 1-3% less CPU); from 512 on, peak RSS
# grows (+20 MiB at 512, +50 MiB at 1024 on the 4x night, +110-145 MiB at 2048).
CALL_BATCH_ROWS = 256
SCRATCH = {"compression": "none", "use_dictionary": False, "write_statistics": False}


def plan_dir(staging, shard: int) -> str:
    return storage.join(str(staging), "plan", f"shard-{shard:05d}")


def write_plans(con, staging, ds: str, shards: int) -> None:
    """Write the plan of every shard of the loaded night `ds` (sql/plan_shards.sql split it)."""
    starts: dict[str, np.ndarray] = {}  # each token file's row-group starts, its footer read once
    for shard in range(shards):
        params = {"ds": ds, "shard": shard, "rollout_id": None}
        folder = plan_dir(staging, shard)
        rollouts = con.sql(sql("shard_rollouts"), params=params).to_arrow_table()
        _write(storage.join(folder, "rollouts.parquet"), rollouts.schema, [rollouts])
        groups = _TokenGroups(starts)
        calls = (groups.add(batch) for batch in _call_slices(con, params, _slices(con, ds, shard)))
        _write(storage.join(folder, "calls.parquet"), None, calls)
        table = groups.table()
        _write(storage.join(folder, "token_groups.parquet"), table.schema, [table])


TOKEN_GROUPS = pa.schema([("file", pa.string()), ("row_group", pa.int32()), ("rows", pa.int64())])
TOKENS_KEY = b"reassembler.tokens"  # token_groups.parquet's metadata: the shard's tokens


class _TokenGroups:
    """The token row groups a shard reads, in the order it first needs them, with how many
    of each one's rows it takes (the plan's token_groups.parquet)."""

    def __init__(self, starts: dict[str, np.ndarray]):
        self.starts = starts
        self.files: list[pa.Array] = []
        self.rows: list[pa.Array] = []
        self.tokens = 0  # the calls' new tokens (delta_len), the shard's progress total

    def add(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        self.files.append(batch.column("t_file"))
        self.rows.append(batch.column("t_row"))
        self.tokens += max(0, pc.sum(batch.column("delta_len")).as_py() or 0)
        return batch

    def table(self) -> pa.Table:
        return self._table().replace_schema_metadata({TOKENS_KEY: str(self.tokens)})

    def _table(self) -> pa.Table:
        if not self.files:
            return TOKEN_GROUPS.empty_table()
        files = pa.chunked_array(self.files, pa.string()).combine_chunks().dictionary_encode()
        present = files.is_valid().to_numpy(zero_copy_only=False)
        codes = files.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        rows = pa.chunked_array(self.rows, pa.int64()).fill_null(0).to_numpy()
        groups = np.zeros(len(rows), dtype=np.int64)
        names = files.dictionary.to_pylist()
        new = [n for n in names if n not in self.starts]
        remote = any(storage.is_remote(n) for n in new)
        self.starts.update(zip(new, storage.map_ahead(lambda n: TokenFile(n).starts, new, remote)))
        for code, name in enumerate(names):
            idx = np.flatnonzero(present & (codes == code))
            groups[idx] = np.searchsorted(self.starts[name], rows[idx], side="right") - 1
        keys = (codes << 32) + groups
        distinct, first, counts = np.unique(keys[present], return_index=True, return_counts=True)
        order = np.argsort(first)  # the order the shard first needs them
        names = files.dictionary.take(pa.array(distinct[order] >> 32))
        return pa.table(
            [names, pa.array((distinct[order] & 0xFFFFFFFF).astype(np.int32)), pa.array(counts[order])],
            schema=TOKEN_GROUPS,
        )


def _write(loc: str, schema: pa.Schema | None, parts) -> None:
    """Write the tables or record batches of `parts` (the schema from the first, if not given)."""
    writer = None
    with storage.open_output(loc) as sink:
        for part in parts:
            if writer is None:
                writer = pq.ParquetWriter(sink, schema or part.schema, **SCRATCH)
            if part.num_rows or schema is not None:
                writer.write(part)
        if writer is None:
            raise ValueError(f"{loc}: nothing to write, not even a schema")
        writer.close()


def _slices(con, ds: str, shard: int) -> list[tuple[str | None, str | None]]:
    """The shard's groups cut into ranges (first, last group_id) of at most SLICE_CALLS
    ledger rows each (a group larger than that is a slice of its own); [(None, None)], the
    whole shard, when it holds no group."""
    slices: list[tuple[str | None, str | None]] = []
    first = last = None
    held = 0
    for group, calls in con.execute(sql("shard_slices"), {"ds": ds, "shard": shard}).fetchall():
        if first is not None and held + calls > SLICE_CALLS:
            slices.append((first, last))
            first, held = None, 0
        first = group if first is None else first
        last, held = group, held + calls
    if first is not None:
        slices.append((first, last))
    return slices or [(None, None)]


def _call_slices(con, params: dict, slices: list[tuple[str | None, str | None]]) -> Iterator[pa.RecordBatch]:
    """The shard's call rows (token locations from the night's token_rows), slice after
    slice: DuckDB sorts a slice at a time, so its sort holds a slice, not the shard. The
    first batch of each slice may be empty (it carries the schema)."""
    query = sql("shard_calls", tokens=sql("night_token_rows"), call_columns=select_list(CALL, "l"))
    for first, last in slices:
        with con.cursor() as cursor:  # closed with its slice (a one-process build shares the connection)
            reader = cursor.sql(query, params=dict(params, first_group=first, last_group=last)).to_arrow_reader(
                CALL_BATCH_ROWS
            )
            yield pa.RecordBatch.from_pylist([], schema=reader.schema)
            yield from reader


def read_rollouts(staging, shard: int) -> list[dict]:
    """The shard's rollouts, in output order. No plan: InputError (the night was loaded
    again by another run since, which removed this run's folder: the later load wins)."""
    loc = storage.join(plan_dir(staging, shard), "rollouts.parquet")
    try:
        source = storage.open_parquet(loc)
        return pq.read_table(source).to_pylist()
    except FileNotFoundError:
        raise InputError(
            f"{loc}: this run's plan is gone: the night was loaded again by another run since (the later "
            "load wins), or the run's folder was removed; run the night again"
        ) from None


def read_token_groups(staging, shard: int) -> tuple[list[tuple[str, int]], int]:
    """The token row groups the shard reads (file, row group), in the order it first needs
    them, and the tokens of its calls; none (and 0) for a plan that does not list them."""
    loc = storage.join(plan_dir(staging, shard), "token_groups.parquet")
    try:
        table = pq.read_table(storage.open_parquet(loc), columns=["file", "row_group"])
    except FileNotFoundError:
        return [], 0
    tokens = int((table.schema.metadata or {}).get(TOKENS_KEY, b"0"))
    return list(zip(table.column("file").to_pylist(), table.column("row_group").to_pylist())), tokens


class PlannedCalls:
    """The shard's calls as record batches, in the order the shard reads them."""

    def __init__(self, staging, shard: int):
        self.file = pq.ParquetFile(storage.open_parquet(storage.join(plan_dir(staging, shard), "calls.parquet")))
        self.schema = self.file.schema_arrow

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self.file.iter_batches(batch_size=CALL_BATCH_ROWS)
