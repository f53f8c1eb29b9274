"""A group too big for one batch, streamed through the shard (CONTRACT.md 3.4).

A batch holds whole groups, but one group can hold more calls than a batch may (a group of
160,000 rollouts): the shard then cuts it between two rollouts (shard.py's `_units`), and
the group's rollouts reach the writer over several batches. Their advantages need the whole
group, so until it ends:

    invariant: of an open group, only what the advantage needs is held in memory (the ok
               rollouts' ids and rewards); its rows and audit rows wait in a spill file on
               local disk, written as they come, and are written out, each row's advantage
               filled in, in their order, as the group ends and before any later group's

The spill files are read back a row group at a time, so the memory a group takes is bounded
by the batch whatever its size.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .advantage import group_advantages
from .rows import AUDIT_SCHEMA, ROW_SCHEMA

SPILL_OPTIONS = {"compression": "none", "use_dictionary": False, "write_statistics": False}


class OpenGroup:
    """One group whose rollouts come over several batches: its rows and audit rows spilled,
    its ok rollouts' rewards held."""

    def __init__(self, group_id: str, scratch: str | None = None):
        self.group_id = group_id
        self.folder = tempfile.mkdtemp(prefix="reassembler-group-", dir=scratch)
        self.rows = pq.ParquetWriter(f"{self.folder}/rows.parquet", ROW_SCHEMA, **SPILL_OPTIONS)
        self.audit = pq.ParquetWriter(f"{self.folder}/audit.parquet", AUDIT_SCHEMA, **SPILL_OPTIONS)
        # the group's ok rollouts and their rewards, a chunk a batch: Arrow and numpy, never
        # the rollouts' own str objects, which would keep every page of Python's small-object
        # heap the batches' rollouts were read into from being given back (1 GB of resident
        # memory for one group of 160,000 rollouts)
        self.ids: list[pa.Array] = []
        self.rewards: list[np.ndarray] = []

    def add(self, outcomes, rows: Iterable[pa.Table], audit: pa.Table) -> None:
        """Some of the group's rollouts: their outcomes, rows (written as they come) and
        audit rows."""
        ok = [o.rollout for o in outcomes if o.ok]
        self.ids.append(pa.array([r["rollout_id"] for r in ok], pa.string()))
        self.rewards.append(np.array([r["reward"] for r in ok], dtype=np.float64))
        for table in rows:
            if table.num_rows:
                self.rows.write_table(table)
        self.audit.write_table(audit)

    def close(self, rows_out: pq.ParquetWriter, audit_out: pq.ParquetWriter, options, row_group_rows: int) -> None:
        """The group has ended: its rows and audit rows, each with its rollout's advantage
        over the whole group, into the shard's writers; the spill goes."""
        try:
            self.rows.close()
            self.audit.close()
            values = group_advantages(np.concatenate(self.rewards), options.std_normalize, options.leave_one_out)
            ids = pa.concat_arrays(self.ids)
            advantages = pa.array(np.asarray(values, dtype=np.float64))
            for name, out, schema, size in (
                ("rows", rows_out, ROW_SCHEMA, row_group_rows),
                ("audit", audit_out, AUDIT_SCHEMA, None),
            ):
                spill = pq.ParquetFile(f"{self.folder}/{name}.parquet")
                for g in range(spill.num_row_groups):
                    table = spill.read_row_group(g)
                    table = _with_advantages(table, ids, advantages).cast(schema)
                    if name == "rows":
                        out.write_table(table, row_group_size=size)
                    else:
                        out.write_table(table)
        finally:
            self.discard()

    def discard(self) -> None:
        for writer in (self.rows, self.audit):
            try:
                writer.close()
            except Exception:  # noqa: BLE001, S110 - closed already, or the error being raised is the one reported
                pass
        shutil.rmtree(self.folder, ignore_errors=True)


def _with_advantages(table: pa.Table, ids: pa.Array, advantages: pa.Array) -> pa.Table:
    """`table` with its `advantage` column set from each row's rollout: its advantage over
    the whole group when it is one of the ok rollouts `ids`, null otherwise."""
    at = pc.index_in(table.column("rollout_id"), value_set=ids)
    column = pc.take(advantages, at)  # null where the rollout is not an ok one
    index = table.schema.get_field_index("advantage")
    return table.set_column(index, "advantage", column)
