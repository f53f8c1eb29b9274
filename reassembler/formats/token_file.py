"""The token file: the staged-record Parquet a trainer's token store dumps (CONTRACT.md 2.3),
as this job reads it. One home for its format: the columns and the types each may have, the
names it accepts, what a row group takes once decoded, and its rows in canonical types.

| column | accepted | canonical |
|---|---|---|
| staging_key, rollout_id, model_call_id, parent_call_id, mode | string (or all null) | string |
| prev_len, delta_len, cum_len, weight_version | any integer width | int64 (uint64 past int64: PAST_INT64) |
| schema_version, digest_version, extras_digest_version | any integer width, or left out (Gym's 2/2/1) | int64 |
| digest, extras_digest, chain_hash, cumulative_hash | string (64 hex) or fixed_size_binary(32) | lowercase hex string |
| token_ids_delta | list of any integer width | list<int64> (uint64 past int64: negative) |
| token_mask_delta | list<float32>, list<bool>, list<int8> | list<float32> |
| generation_logprobs_delta (Gym: generation_log_probs_delta) | list<float32> or list<float64> | list<float32> |

Extra columns are ignored. A row group is decoded within a bound (the job's
max_row_group_bytes), its footer held to its pages first (formats/row_groups.py,
parquet_pages.py); one past the bound is read in pieces of rows (formats/token_pieces.py),
and what cannot be cut so is not decoded (`too_big`, reject rows): a file of a few KB can
hold millions of identical tokens, or a key gigabytes long.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..errors import InputError
from ..settings import DEFAULTS
from . import token_pieces
from .fields import LEDGER_DIGESTS, LEDGER_INTS, LINEAGE_FIELDS, VERSION_DEFAULTS
from .row_groups import LOGPROB_NAMES, read_row_group

IDS = pa.list_(pa.int64())
FLOATS = pa.list_(pa.float32())
STRINGS, INTS, DIGESTS = LINEAGE_FIELDS, LEDGER_INTS, LEDGER_DIGESTS
LISTS = (
    ("ids", "token_ids_delta", IDS),
    ("mask", "token_mask_delta", FLOATS),
    ("logprobs", "generation_logprobs_delta", FLOATS),
)
CANONICAL = pa.schema(
    [(n, pa.string()) for n in STRINGS]
    + [(n, pa.int64()) for n in INTS]
    + [(n, pa.string()) for n in DIGESTS]
    + [(n, t) for n, _, t in LISTS]
)


def _hex(column: pa.ChunkedArray) -> pa.Array:
    if pa.types.is_fixed_size_binary(column.type):
        return pa.array([None if v is None else v.hex() for v in column.to_pylist()], pa.string())
    return column.cast(pa.string())


# An unsigned 64-bit value past int64 is read as this: no valid ledger value equals it (its
# row fails field_mismatch), and as a token id it is negative (invalid_token).
PAST_INT64 = -(2**63)


def _int64(column: pa.ChunkedArray, canonical: pa.DataType) -> pa.ChunkedArray:
    """An integer column (or list of integers) of any width as int64 (or list<int64>)."""
    if column.type == pa.uint64():
        past = pc.greater(column, pa.scalar(2**63 - 1, pa.uint64()))
        return pc.if_else(past, pa.scalar(PAST_INT64, pa.int64()), column.cast(pa.int64(), safe=False))
    if canonical == IDS and _value_type(column.type) == pa.uint64():
        return column.cast(IDS, safe=False)  # wraps past int64 to negative ids: invalid_token
    return column.cast(canonical)


def _value_type(t: pa.DataType) -> pa.DataType | None:
    return t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else None


class TokenFile:
    """One token file: its metadata, its pieces (formats/token_pieces.py: a row group, or a
    run of rows of one too large to decode at once), where each piece starts (`starts`, row
    numbers in the file), and a piece read in the canonical types."""

    def __init__(self, path: str, bound: int = DEFAULTS.max_row_group_bytes, footer=None):
        self.path = path
        self.bound = bound
        self.remote = storage.is_remote(path)
        if footer is None:
            source = storage.open_parquet(path)
            self.size = source.size() if self.remote else None
            try:
                self.metadata = pq.read_metadata(source)
            finally:
                if not isinstance(source, str):
                    source.close()
        else:
            self.size, self.metadata = footer
        names = self.metadata.schema.to_arrow_schema().names
        lp = next(n for n in LOGPROB_NAMES if n in names)  # the contract's name wins
        self.sources = {n: n for n in STRINGS + INTS + DIGESTS if n in names}
        self.sources.update({name: column for name, column, _ in LISTS}, logprobs=lp)
        self.pieces = token_pieces.file_pieces(path, self.metadata, self.size, bound)
        group_firsts = np.concatenate(
            [[0], np.cumsum([self.metadata.row_group(i).num_rows for i in range(self.metadata.num_row_groups)])]
        ).astype(np.int64)
        self.starts = np.array(
            [group_firsts[p.group] + p.first for p in self.pieces] + [group_firsts[-1]], dtype=np.int64
        )
        self._cursors: list[token_pieces.Cursor] = []  # of one row group, the last used last
        self._cursors_lock = threading.Lock()

    def too_big(self, piece: int) -> str | None:
        return self.pieces[piece].why

    def whole(self, piece: int) -> bool:
        """Whether the piece is a whole row group (read on its own; else through the row group's cursor)."""
        found = self.pieces[piece]
        return found.first == 0 and found.rows == self.metadata.row_group(found.group).num_rows

    def read(self, piece: int) -> pa.Table:
        found = self.pieces[piece]
        if found.why is not None:  # the load made its rows reject rows: no call asks for them
            raise InputError(f"{self.path}: {found.why}")
        columns = list(dict.fromkeys(self.sources.values()))
        if self.whole(piece):
            try:
                t = read_row_group(self.path, self.metadata, found.group, columns, self.size, self.bound)
            except (pa.ArrowException, OSError) as e:
                raise InputError(f"{self.path}: unreadable row group {found.group} ({str(e).splitlines()[0]})") from e
        else:
            t = self._cursor(found.group, found.first, columns).read(found.first, found.rows)
        return self._canonical(t)

    def _cursor(self, group: int, first: int, columns: list[str]) -> token_pieces.Cursor:
        """A streaming reader of row group `group` to read from row `first` on: the one
        nearest before it, else a new one (up to CURSORS of them: a shard reading several
        runs of the row group in turn restarts none), else the one used longest ago. The
        readers are of one row group at a time."""
        with self._cursors_lock:
            if self._cursors and self._cursors[0].group != group:
                self._cursors = []
            before = [c for c in self._cursors if c.at <= first]
            if before:
                cursor = max(before, key=lambda c: c.at)
            else:
                rows = max(1, min(p.rows for p in self.pieces if p.group == group and p.why is None) // 4)
                cursor = token_pieces.Cursor(self.path, self.metadata, group, columns, self.size, rows, self.bound)
                if self._cursors:  # the row group's pages are checked once
                    cursor.checked, cursor.measured = self._cursors[0].checked, list(self._cursors[0].measured)
                if len(self._cursors) >= token_pieces.CURSORS:
                    self._cursors.pop(0)
            if cursor in self._cursors:
                self._cursors.remove(cursor)
            self._cursors.append(cursor)
            return cursor

    def _canonical(self, t: pa.Table) -> pa.Table:
        columns = []
        for field in CANONICAL:
            if field.name not in self.sources:  # a version column the file leaves out
                columns.append(pa.array(np.full(t.num_rows, VERSION_DEFAULTS[field.name]), pa.int64()))
                continue
            col = t.column(self.sources[field.name])
            if field.name in DIGESTS:
                columns.append(_hex(col))
            elif field.name in INTS or field.type == IDS:
                columns.append(_int64(col, field.type))
            else:
                columns.append(col.cast(field.type))
        return pa.table(columns, schema=CANONICAL)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _list_value_type(t: pa.DataType) -> pa.DataType | None:
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return t.value_type
    return None


def check_schema(schema: pa.Schema, rel: str) -> None:
    """Check one token file's schema against the table above; InputError naming the file
    and the problem."""

    def need(name: str) -> pa.DataType:
        if name not in schema.names:
            raise InputError(f"{rel}: token file has no column {name}")
        return schema.field(name).type

    def bad(name: str, t, expected: str) -> InputError:
        return InputError(f"{rel}: column {name} has type {t}, expected {expected}")

    for name in ("staging_key",) + LINEAGE_FIELDS:
        t = need(name)
        if not (_is_string(t) or pa.types.is_null(t)):
            raise bad(name, t, "string")
    for name in LEDGER_INTS:
        if name in VERSION_DEFAULTS and name not in schema.names:
            continue  # Gym's StagedCallRecord default (TokenFile.read fills it in)
        t = need(name)
        if not pa.types.is_integer(t):
            raise bad(name, t, "int64")
    for name in LEDGER_DIGESTS:
        t = need(name)
        if not (_is_string(t) or (pa.types.is_fixed_size_binary(t) and t.byte_width == 32)):
            raise bad(name, t, "string (64 hex) or fixed_size_binary(32)")
    t = need("token_ids_delta")
    value = _list_value_type(t)
    if value is None or not pa.types.is_integer(value):
        raise bad("token_ids_delta", t, "a list of integers (list<int64> or list<int32>)")
    t = need("token_mask_delta")
    if _list_value_type(t) not in (pa.float32(), pa.bool_(), pa.int8()):
        raise bad("token_mask_delta", t, "list<float32>, list<bool> or list<int8>")
    lp_name = next((n for n in LOGPROB_NAMES if n in schema.names), None)
    if lp_name is None:
        raise InputError(f"{rel}: token file has no column generation_logprobs_delta")
    t = schema.field(lp_name).type
    if _list_value_type(t) not in (pa.float32(), pa.float64()):
        raise bad(lp_name, t, "list<float32> or list<float64>")
