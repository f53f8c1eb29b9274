"""Run the per-rollout core on staged capture without files or DuckDB: the same
`verify_batch` the shards run, fed with a table shaped like sql/shard_calls.sql's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from reassembler.formats.fields import CALL, SHARED_FIELDS, arrow_schema
from reassembler.formats.records import parse_rollout
from reassembler.load.inserter import ROLLOUT_BATCH
from reassembler.load.token_store import CANONICAL
from reassembler.settings import Options
from reassembler.verify.batch import verify_batch

# the columns of sql/shard_calls.sql: the group, the call fields (reassembler/fields.py), the token location
SCHEMA = pa.schema([("group_id", pa.string()), *arrow_schema(CALL), ("t_file", pa.string()), ("t_row", pa.int64())])
# a rollout's items as a shard reads them (load/shard_plan.py): Arrow's structs, as dicts
ITEMS = pa.schema([ROLLOUT_BATCH.field(name) for name in ("generated_items", "model_items")])


def reassemble(record: dict, staged: list[tuple[dict, dict | None]], options: Options = Options()):
    rollout, table, tokens = tables(record, staged)
    outcomes, batch = verify_batch([rollout], table, tokens, options)
    return outcomes[0], batch


def tables(record: dict, staged: list[tuple[dict, dict | None]]) -> tuple[dict, pa.Table, pa.Table]:
    """The rollout, its call rows (sql/shard_calls.sql's shape) and their token rows."""
    rollout = parse_rollout(record)
    rollout.update(pa.Table.from_pylist([{k: rollout[k] for k in ITEMS.names}], schema=ITEMS).to_pylist()[0])
    rollout.update(n_rejected=None, first_rejected=None)
    rows, lists = [], []
    for seq, (ledger, token) in enumerate(staged):
        row = {name: ledger.get(name) for name in SCHEMA.names if not name.startswith("t_")}
        row.update(group_id=rollout["group_id"], capture_seq=seq)
        lists.append({name: None for name in CANONICAL.names})
        if token is not None:
            row.update(t_file="in-memory", t_row=seq)
            lists[-1].update({k: token[k] for k in SHARED_FIELDS})
            lists[-1].update(
                ids=np.asarray(token["token_ids_delta"]).tolist(),
                mask=np.asarray(token["token_mask_delta"]).tolist(),
                logprobs=np.asarray(token["generation_logprobs_delta"]).tolist(),
            )
        rows.append(row)
    return rollout, pa.Table.from_pylist(rows, schema=SCHEMA), pa.Table.from_pylist(lists, schema=CANONICAL)
