"""Each shard's plan: written by the load as Parquet into the run's folder on the output
store, so that a shard needs nothing but the store (no warehouse, no local file another
task wrote) and may run on any machine.

    <run folder>/plan/shard-<k>/rollouts.parquet   the shard's rollouts (sql/shard_rollouts.sql),
                                                   in output order: group_id, slot
    <run folder>/plan/shard-<k>/items.parquet      their items (generated_items, model_items,
                                                   trace: the warehouse's rows do not hold
                                                   them), a row each, in the same order
    <run folder>/plan/shard-<k>/calls.parquet      their calls in the order the shard reads
                                                   them (sql/shard_calls.sql), each with its
                                                   token row's file and row number
    <run folder>/plan/shard-<k>/token_groups.parquet  the token row groups it reads (file, row
                                                   group, rows taken), in the order it first
                                                   needs them

Memory is bounded while writing, whatever the size of the shard or of a group: its rollouts
are cut, in output order and between rollouts, into sort buckets of about BUCKET_ROWS
rollout and call rows (the merge's global step: sql/merge_plan.sql); DuckDB reads the
shard's rollouts, then its calls, once each and unordered, and each row goes to its bucket
(wide_sort.SortBuckets: held in memory, then spilled to Arrow files in this process's DuckDB
spill folder); each bucket is then sorted by Arrow into output order and written in batches of
CALL_BATCH_ROWS rows, which become the files' row groups; the shard reads them back in the
same batches. DuckDB never sorts the wide rows (at a small memory_limit its sort of them
runs out of memory), and no query is run per bucket (one per bucket scanned the whole
ledger each time: a night's plans grew with the square of its calls). Both files are
scratch, read once: no compression, dictionary or statistics.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..errors import InputError
from ..formats.fields import ROLLOUT_ITEMS, arrow_schema
from ..formats.token_file import TokenFile
from ..settings import DEFAULTS
from ..warehouse import sql
from ..wide_sort import SortBuckets, empty_of, sort_rows, spill_of

ITEMS_FILE = "items.parquet"  # the plan's rollouts' items (formats/fields.py: ITEMS), in their order
ITEMS_SCHEMA = arrow_schema(ROLLOUT_ITEMS)
BULKY = ITEMS_SCHEMA.names[1:]  # a rollout's fields read once, when it is verified
ITEM_ORDER = [("plan_group", "ascending"), ("plan_slot", "ascending"), ("rollout_id", "ascending")]  # ROLLOUT_ORDER
BUCKET_ROWS = 8192  # rollout and call rows Arrow sorts at a time (a call ~2.5 KB), whole rollouts
READ_ROWS = 2048  # rows a batch as DuckDB streams a query's rows to their buckets
ROLLOUT_ORDER = [("group_id", "ascending"), ("slot", "ascending"), ("rollout_id", "ascending")]
CALL_ORDER = [
    ("group_id", "ascending"),
    ("plan_slot", "ascending"),
    ("rollout_id", "ascending"),
    ("capture_seq", "ascending"),
    ("t_file", "ascending"),
    ("t_row", "ascending"),
]
# Rows a row group of the plan files, as the shard reads them back (PlannedCalls). Measured
# when DuckDB streamed its batches at this size: at 64 ~0.09-0.13 CPU-s on a 1x night, at
# 256-512 ~0.07; from 512 on, the shard's peak RSS grows (+20 MiB at 512, +50 MiB at 1024
# on the 4x night, +110-145 MiB at 2048).
CALL_BATCH_ROWS = 256
SCRATCH = {"compression": "none", "use_dictionary": False, "write_statistics": False}


def plan_dir(staging, shard: int) -> str:
    return storage.join(str(staging), "plan", f"shard-{shard:05d}")


def write_rollout_plans(con, staging, ds: str, run: str, shards: int) -> None:
    """Write the rollouts of every shard of the night `ds` that the run `run` (path-safe)
    loaded into the warehouse behind `con` (the merge's decisions, with each rollout's sort
    bucket, and the rollouts' rejected ledger lines registered by the caller as `night_sort`
    and `rollout_rejects`: merge/commit.py); each shard writes its calls (merge/pieces.py)."""
    query = sql("shard_rollouts", buckets="plan_buckets", rejected="rollout_rejects")
    for shard in range(shards):
        params = {"ds": ds, "run": run, "shard": shard, "rollout_id": None}
        buckets = con.sql(sql("plan_buckets"), params={"shard": shard}).to_arrow_table()
        rollouts = _sorted(con, query, params, buckets, ROLLOUT_ORDER, spill_of(con))
        write_sorted(storage.join(plan_dir(staging, shard), "rollouts.parquet"), None, rollouts)


TOKEN_GROUPS = pa.schema([("file", pa.string()), ("row_group", pa.int32()), ("rows", pa.int64())])
TOKENS_KEY = b"reassembler.tokens"  # token_groups.parquet's metadata: the shard's tokens


class TokenGroups:
    """The token row groups a shard reads, in the order it first needs them, with how many
    of each one's rows it takes (the plan's token_groups.parquet)."""

    def __init__(self, starts: dict[str, np.ndarray], bound: int = DEFAULTS.max_row_group_bytes):
        self.starts = starts
        self.bound = bound  # the pieces the shard's TokenStore reads (formats/token_pieces.py)
        self.files: list[pa.Array] = []
        self.rows: list[pa.Array] = []
        self.tokens = 0  # the calls' new tokens (delta_len), the shard's progress total

    def add(self, table: pa.Table) -> pa.Table:
        self.files += table.column("t_file").chunks
        self.rows += table.column("t_row").chunks
        self.tokens += max(0, pc.sum(table.column("delta_len")).as_py() or 0)
        return table

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
        self.starts.update(zip(new, storage.map_ahead(lambda n: TokenFile(n, self.bound).starts, new, remote)))
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


def write_sorted(loc: str, schema: pa.Schema | None, parts) -> None:
    """Write the tables or record batches of `parts` (the schema from the first, if not given)."""
    writer = None
    with storage.open_output(loc) as sink:
        for part in parts:
            if writer is None:
                writer = pq.ParquetWriter(sink, schema or part.schema, **SCRATCH)
            if part.num_rows or schema is not None:
                writer.write(part, row_group_size=CALL_BATCH_ROWS)
        if writer is None:
            raise ValueError(f"{loc}: nothing to write, not even a schema")
        writer.close()


def _sorted(con, query: str, params: dict, buckets, order: list[tuple[str, str]], spill: str) -> Iterator[pa.Table]:
    """The rows of `query` (the shard's rollouts or calls, each with its bucket in `buckets`:
    plan_buckets.sql's rows) in `order`, a table a bucket; the first is empty (it carries
    the schema)."""
    # the connection itself, not a cursor: the night's per-call tables are its temporary ones
    con.register("plan_buckets", buckets)
    try:
        reader = con.sql(query, params=params).to_arrow_reader(READ_ROWS)
        schema = reader.schema
        yield empty_of(schema)
        with SortBuckets(schema, spill) as held:
            for batch in reader:
                held.add(batch)
            reader = None
            for table in held.tables():
                yield sort_rows(table, order)
    finally:
        con.unregister("plan_buckets")


ROLLOUT_BATCH_ROWS = 1024  # the shard's rollouts are read this many at a time


def read_rollouts(staging, shard: int) -> Iterator[dict]:
    """The shard's rollouts, in output order, read a batch at a time (never the shard's
    whole list), each with its items (ITEMS_FILE, in the same order). No plan: InputError at once
    (the night was loaded again by another run since, which removed this run's folder: the
    later load wins)."""
    loc = storage.join(plan_dir(staging, shard), "rollouts.parquet")
    at = storage.join(plan_dir(staging, shard), ITEMS_FILE)
    try:
        file = pq.ParquetFile(storage.open_parquet(loc))
        items = _InStep(pq.ParquetFile(storage.open_parquet(at)), at)
    except FileNotFoundError:
        raise plan_gone(loc) from None
    return (row for batch in file.iter_batches(ROLLOUT_BATCH_ROWS) for row in _records(batch, items))


class _InStep:
    """The plan's items file read in step with its rollouts: the next rows, as many as a
    batch of rollouts has, which must be theirs (RuntimeError otherwise)."""

    def __init__(self, file: pq.ParquetFile, loc: str):
        self.batches, self.loc = file.iter_batches(ROLLOUT_BATCH_ROWS), loc
        self.held: pa.RecordBatch | None = None

    def next(self, ids: pa.Array) -> pa.Table:
        pieces, have = [], 0
        while have < len(ids):
            if self.held is None or not self.held.num_rows:
                self.held = next(self.batches, None)
                if self.held is None:
                    break
            piece = self.held.slice(0, len(ids) - have)
            self.held = self.held.slice(piece.num_rows)
            pieces.append(piece)
            have += piece.num_rows
        table = pa.Table.from_batches(pieces, ITEMS_SCHEMA) if pieces else ITEMS_SCHEMA.empty_table()
        if not table.column("rollout_id").combine_chunks().equals(ids):
            raise RuntimeError(f"internal: {self.loc} is not in step with the shard's rollouts")
        return table


def _records(batch: pa.RecordBatch, items: _InStep) -> list[dict]:
    """The rollouts of `batch` as records whose items (BULKY) stay in Arrow columns until
    read (as Python objects, a unit's items took ~10 KB a rollout)."""
    theirs = items.next(batch.column("rollout_id"))
    bulky = {name: theirs.column(name).combine_chunks() for name in BULKY}
    return [RolloutRecord(row, bulky, at) for at, row in enumerate(batch.to_pylist())]


class RolloutRecord(dict):
    """A rollout of the shard's plan: its fields as a dict, but the bulky ones (BULKY),
    which are read from the plan's Arrow columns each time they are asked for."""

    __slots__ = ("_bulky", "_at")

    def __init__(self, row: dict, bulky: dict[str, pa.Array], at: int):
        super().__init__(row)
        self._bulky, self._at = bulky, at

    def __missing__(self, key: str):
        if key in self._bulky:
            return self._bulky[key][self._at].as_py()
        raise KeyError(key)

    def get(self, key: str, default=None):
        if key in self._bulky:
            return self._bulky[key][self._at].as_py()
        return super().get(key, default)


def read_groups(staging, shard: int) -> list[str]:
    """The shard's groups, in output order (its rollouts' group_id column alone)."""
    loc = storage.join(plan_dir(staging, shard), "rollouts.parquet")
    try:
        column = pq.read_table(storage.open_parquet(loc), columns=["group_id"]).column("group_id")
    except FileNotFoundError:
        raise plan_gone(loc) from None
    return list(dict.fromkeys(column.to_pylist()))


def plan_gone(loc: str) -> InputError:
    return InputError(
        f"{loc}: this run's plan is gone: the night was loaded again by another run since (the later "
        "load wins), or the run's folder was removed; run the night again"
    )


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
