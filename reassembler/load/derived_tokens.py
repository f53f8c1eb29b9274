"""Token rows the load derives (NeMo Gym's local mode and rebuilt lines), as a token file.

A derived token row holds one call's new tokens, with the mask and log probabilities the
load derived for them (load/local_capture.py, formats/gym_rebuilt.py). `DerivedTokens`
writes them to a Parquet file in the token file's canonical columns (formats/token_file.py,
CONTRACT.md 2.3), custody columns null, 256 rows or 1M tokens a row group, uncompressed, ids as int32
and the mask as int8 (the file's reader widens them: formats/token_file.py): scratch in the
run's folder, written and read once, so half the bytes of the canonical types is half the
time; the shards treat its rows as any token row.
`derived_tokens` gives the same columns in memory, for `reassembler explain`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..formats.token_file import CANONICAL, LISTS
from ..formats.token_pieces import ROW_ALONE
from ..table_file import HeldRows
from .derived_calls import MAX_ROW_TOKENS, TokenRow

ROW_GROUP_ROWS = 256
GROUP_TOKENS = 1 << 20  # a row group holds at most this many tokens (16 MiB decoded), but a row past it alone
KEYS_HELD = 64 << 20  # bytes of staging keys a DerivedTokens keeps for `keys`; past that they are read back
NAME = "derived-tokens"  # how the load names its derived token files (a capture child's: derived-tokens-local-<n>)
# the bound the job reads its own derived files with, at least: a derived row of MAX_ROW_TOKENS
# (16 bytes a token decoded) is read alone at ROW_ALONE times it (formats/token_pieces.py)
OWN_BOUND = MAX_ROW_TOKENS * 16 // ROW_ALONE

# a token file (CONTRACT.md 2.3) holding only keys and token lists; the custody columns are
# null: a derived call's checks ran where it was derived. Every derived id is in [0, 2**31)
# (a call whose ids are not has no token row) and every mask value 0 or 1.
COMPACT = {"ids": np.int32, "mask": np.int8, "logprobs": np.float32}
FILE_SCHEMA = pa.schema(
    [("staging_key", pa.string())]
    + [(f.name, f.type) for f in CANONICAL if f.name not in ("ids", "mask", "logprobs")]
    + [(column, pa.list_(pa.from_numpy_dtype(COMPACT[name]))) for name, column, _ in LISTS]
)
CANONICAL_TYPES = {"ids": np.int64, "mask": np.float32, "logprobs": np.float32}


def read_bound(path: str, bound: int) -> int:
    """The bound a token file at `path` is read with: the setting's (`bound`), and for the
    load's own derived files at least OWN_BOUND. Their rows were checked and held whole when
    they were derived (local mode caps an entry at MAX_ROW_TOKENS), so reading one back costs
    no more than deriving it did, and a smaller setting never refuses the job's own file."""
    return max(bound, OWN_BOUND) if storage.name(path).startswith(NAME) else bound


def token_table(rows: list[TokenRow]) -> pa.Table:
    """Token rows as a table of the file's columns (FILE_SCHEMA)."""
    n = len(rows)
    columns = [pa.array([r.staging_key for r in rows], pa.string())]
    columns += [pa.nulls(n, f.type) for f in list(FILE_SCHEMA)[1:-3]]  # the custody columns
    return pa.table(columns + _token_lists(rows, COMPACT), schema=FILE_SCHEMA)


class DerivedTokens:
    """Token rows the load derives, written to one Parquet file in the canonical columns
    (formats/token_file.py), a row group at a time: given one by one (`add`) or as tables
    of the file's columns (`add_table`, load/derived_calls.py), in the order given."""

    def __init__(self, folder: str, name: str = f"{NAME}.parquet"):
        self.path = storage.join(folder, name)
        self._writer: pq.ParquetWriter | None = None
        self._sink: Any = None
        self._held = HeldRows(token_table)  # rows not yet written
        self._keys: list[pa.ChunkedArray] | None = []  # the staging keys written, in file order
        self._key_bytes = 0
        self._tokens = 0  # held
        self.count = 0

    def add(self, row: TokenRow) -> None:
        self._held.add(row)
        self._tokens += len(row.ids)
        if self._held.count >= ROW_GROUP_ROWS or self._tokens >= GROUP_TOKENS:
            self._flush()

    def add_table(self, table: pa.Table) -> None:
        self._held.add_table(table)
        self._tokens += pc.sum(pc.list_value_length(table.column(LISTS[0][1]))).as_py() or 0
        if self._held.count >= ROW_GROUP_ROWS or self._tokens >= GROUP_TOKENS:
            self._flush()

    def _flush(self, last: bool = False) -> None:
        """Whole row groups of what is held (`last`: every row held)."""
        table = self._held.take()
        if table is None:
            return
        cuts = row_groups(pc.list_value_length(table.column(LISTS[0][1])).fill_null(0).to_numpy())
        full = cuts[-1] - cuts[-2] == ROW_GROUP_ROWS
        n = table.num_rows if last or full else cuts[-2]  # the last row group waits for more rows, unless full
        held = table.slice(n)
        self._held.add_table(held)
        self._tokens = pc.sum(pc.list_value_length(held.column(LISTS[0][1]))).as_py() or 0
        if not n:
            return
        if self._writer is None:
            self._sink = storage.open_output(self.path)
            # scratch, read once by the shards: no compression, dictionary or statistics to make
            self._writer = pq.ParquetWriter(
                self._sink, FILE_SCHEMA, compression="none", use_dictionary=False, write_statistics=False
            )
        written = table.slice(0, n)
        for a, b in zip(cuts[:-1], cuts[1:]):
            if b <= n:
                self._writer.write_table(written.slice(a, b - a), row_group_size=b - a)
        if self._keys is not None:
            self._keys.append(written.column("staging_key"))
            self._key_bytes += written.column("staging_key").nbytes
            if self._key_bytes > KEYS_HELD:  # memory bounded: the file's keys read back instead
                self._keys = None
        self.count += n

    def keys(self) -> pa.Table | None:
        """The keys of the rows written, as token_keys.key_batches would read them back from
        the file (token_keys.KEYS: the rollout and call columns null, as the file's are);
        None when they were more than KEYS_HELD bytes (`derived_keys` reads them back)."""
        from .token_keys import KEYS

        if self._keys is None:
            return None
        n = self.count
        keys = pa.chunked_array(self._keys, pa.string()) if self._keys else pa.chunked_array([], pa.string())
        columns = [keys, pa.nulls(n, pa.string()), pa.nulls(n, pa.string())]
        rows = pa.array(np.arange(n, dtype=np.int64))  # each key's row in the file
        columns += [pa.repeat(pa.scalar(self.path, pa.string()), n), rows]
        return pa.Table.from_arrays(columns, schema=KEYS)

    def close(self) -> str | None:
        """The file, once complete; None when no row was derived."""
        self._flush(last=True)
        if self._writer is None:
            return None
        self._writer.close()
        self._sink.close()
        self._writer = self._sink = None
        return self.path


def row_groups(lengths: np.ndarray) -> list[int]:
    """Where rows holding `lengths` tokens are cut into row groups: at most ROW_GROUP_ROWS
    rows and GROUP_TOKENS tokens each (a row past that alone); the first cut 0, the last the
    number of rows."""
    n = len(lengths)
    if not n:
        return [0]
    lengths = lengths.astype(np.int64)
    bucket = (np.cumsum(lengths) - lengths) // GROUP_TOKENS
    big = lengths >= GROUP_TOKENS
    new = np.ones(n, dtype=bool)
    new[1:] = (bucket[1:] != bucket[:-1]) | big[1:] | big[:-1]
    run = np.cumsum(new) - 1
    position = np.arange(n) - np.flatnonzero(new)[run]  # within its run: a run split every ROW_GROUP_ROWS rows
    return [*np.flatnonzero(position % ROW_GROUP_ROWS == 0).tolist(), n]


def derived_tokens(table: pa.Table, rows: dict[str, TokenRow]) -> tuple[pa.Table, pa.Table]:
    """A batch's call rows (sql/shard_calls.sql, no token file joined) given their derived
    token rows: the call rows with each found one's place (t_file, t_row), and the token
    rows row for row in the canonical columns (formats/token_file.py)."""
    keys = table.column("staging_key").to_pylist()
    found = [rows.get(k) for k in keys]
    n = len(keys)
    t_file = pa.array(["(derived)" if r is not None else None for r in found], pa.string())
    t_row = pa.array([k if r is not None else None for k, r in enumerate(found)], pa.int64())
    table = table.set_column(table.schema.get_field_index("t_file"), "t_file", t_file)
    table = table.set_column(table.schema.get_field_index("t_row"), "t_row", t_row)
    columns = [pa.nulls(n, f.type) for f in CANONICAL if f.name not in ("ids", "mask", "logprobs")]
    return table, pa.table(columns + _token_lists(found, CANONICAL_TYPES), schema=CANONICAL)


def _token_lists(rows: list[TokenRow] | list[TokenRow | None], types: Mapping[str, Any]) -> list[pa.Array]:
    """The ids, mask and logprobs list columns of token rows (null for a None), their values
    of `types` (the canonical int64, float32, float32, or the file's COMPACT ones)."""
    missing = pa.array([r is None for r in rows], pa.bool_()) if any(r is None for r in rows) else None
    out = []
    for part, dtype in types.items():
        arrays = [getattr(r, part) if r is not None else np.zeros(0, dtype) for r in rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        values = np.concatenate(arrays) if rows else np.zeros(0, dtype)
        narrowed: np.ndarray = values.astype(dtype, copy=False)
        if len(values) and narrowed.dtype != values.dtype and not np.array_equal(narrowed, values):
            raise RuntimeError(f"internal: a derived token row's {part} does not fit {np.dtype(dtype).name}")
        out.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(narrowed), mask=missing))
    return out


def derived_keys(files: list[str], keys: list[pa.Table | None]) -> Iterator[pa.Table | pa.RecordBatch]:
    """The keys of the derived token files `files`, in order: each file's as its writer kept
    them (`DerivedTokens.keys`), or read back from the file when it did not."""
    from .token_keys import key_batches

    for path, kept in zip(files, keys, strict=True):
        if kept is not None:
            yield kept
        else:
            yield from key_batches([path])
