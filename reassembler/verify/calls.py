"""The calls of a batch as small records, for the per-rollout steps (select, cut, walk).

A `Call` holds one ledger row's fields and where its verdicts and token lists sit in the
batch: `index` (its number in the batch: checks.py's arrays) and `row` (its first token
row in the batch's TokenBatch). `calls_from_table` builds them column by column from the
batch's call rows (sql/shard_calls.sql: one row per token row, capture order); no check
runs here, checks.py holds them.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..formats.fields import CALL, python_type
from ..formats.gym_fingerprint import VERSION as FINGERPRINT_VERSION
from ..formats.records import HEX64_PATTERN

# The record: one field per ledger field of formats/fields.py's CALL, in its order, then where
# the call's verdicts and token rows sit in its batch.
_CallRecord: Any = make_dataclass(
    "_CallRecord",
    [(f.name, python_type(f) if f.required else python_type(f) | None) for f in CALL]
    + [("index", int, field(default=-1)), ("row", int, field(default=-1)), ("n_token_rows", int, field(default=0))],
    slots=True,
    eq=False,
)


class Call(_CallRecord):
    """One ledger row of a batch, as select, cut and the walk see it: its fields (CALL;
    `output_items` as (id, fingerprint) pairs, None when the row carries none;
    `output_fingerprint` only when usable as NeMo Gym's evidence, version 2 and 64 hex), its
    number in the batch (`index`: checks.py's arrays), its first row there (`row`: its token
    row when it has one) and how many token rows it has."""

    __slots__ = ()

    @property
    def is_poison(self) -> bool:
        return self.failure_reason is not None

    @property
    def is_root(self) -> bool:
        """A poison row is never a root (CONTRACT.md 3.6): it says nothing of its place."""
        return self.parent_call_id is None and self.failure_reason is None


# the ledger columns a Call is built from, in its field order
CALL_FIELDS = tuple(f.name for f in CALL)


def call_starts(table: pa.Table) -> np.ndarray:
    """The first row of each call: rows of one call are consecutive (same capture_seq)."""
    seq = table.column("capture_seq").to_numpy()
    if len(seq) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate([[True], seq[1:] != seq[:-1]]))


def token_row_counts(table: pa.Table, starts: np.ndarray) -> np.ndarray:
    """Token rows per call (0: no token row; the join gives one null row then)."""
    if len(starts) == 0:
        return np.zeros(0, dtype=np.int64)
    found = table.column("t_file").is_valid().to_numpy(zero_copy_only=False).astype(np.int64)
    return np.add.reduceat(found, starts)


def _evidence(heads: pa.Table) -> list[str | None]:
    """NeMo Gym's output_fingerprint counts as evidence only at version 2 and as 64 hex."""
    fp = heads.column("output_fingerprint")
    usable = pc.and_(
        pc.equal(heads.column("fingerprint_version"), FINGERPRINT_VERSION),
        pc.match_substring_regex(fp, HEX64_PATTERN),
    )
    return pc.if_else(pc.fill_null(usable, False), fp, pa.nulls(len(fp), pa.string())).to_pylist()


def calls_from_table(table: pa.Table) -> list[Call]:
    """The calls of a batch's call rows, in row order."""
    starts = call_starts(table)
    return calls_from_heads(table.take(pa.array(starts, pa.int64())), starts, token_row_counts(table, starts))


def calls_from_heads(heads: pa.Table, starts: np.ndarray, counts: np.ndarray) -> list[Call]:
    """`heads`: the first row of each call; `starts`: their row numbers; `counts`: their token rows."""
    columns = {name: heads.column(name).to_pylist() for name in CALL_FIELDS if name != "output_fingerprint"}
    columns["output_fingerprint"] = _evidence(heads)
    columns["output_items"] = [
        None if items is None else [(i["id"], i["fingerprint"]) for i in items] for items in columns["output_items"]
    ]
    values = zip(*(columns[name] for name in CALL_FIELDS), range(len(starts)), starts.tolist(), counts.tolist())
    return [Call(*v) for v in values]
