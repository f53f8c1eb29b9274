"""Run the per-rollout core on staged capture without files or DuckDB: the same
`reassemble_unit` the shards run, fed with a table shaped like sql/shard_calls.sql's."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from reassembler.calls import SHARED_FIELDS
from reassembler.records import parse_rollout
from reassembler.rollout import Options
from reassembler.shard import reassemble_unit

_ITEMS = pa.list_(pa.struct([("id", pa.string()), ("fingerprint", pa.string())]))
_INTS = ("prev_len", "delta_len", "cum_len", "weight_version", "schema_version", "digest_version",
         "extras_digest_version")
SCHEMA = pa.schema(
    [("group_id", pa.string()), ("rollout_id", pa.string()), ("capture_seq", pa.int64())]
    + [(k, pa.int64() if k in _INTS else pa.string()) for k in SHARED_FIELDS if k != "rollout_id"]
    + [("staging_key", pa.string()), ("output_items", _ITEMS), ("failure_reason", pa.string()),
       ("t_staging_key", pa.string())]
    + [("t_" + k, pa.int64() if k in _INTS else pa.string()) for k in SHARED_FIELDS]
    + [("t_token_ids", pa.list_(pa.int64())), ("t_mask", pa.list_(pa.float32())),
       ("t_logprobs", pa.list_(pa.float32()))]
)


def reassemble(record: dict, staged: list[tuple[dict, dict | None]], options: Options = Options()):
    rollout = parse_rollout(record)
    rollout.update(n_rejected=None, first_rejected=None)
    rows = []
    for seq, (ledger, token) in enumerate(staged):
        row = {name: ledger.get(name) for name in SCHEMA.names if not name.startswith("t_")}
        row.update(group_id=rollout["group_id"], capture_seq=seq)
        if token is not None:
            row["t_staging_key"] = token["staging_key"]
            row.update({"t_" + k: token[k] for k in SHARED_FIELDS})
            row["t_token_ids"] = np.asarray(token["token_ids_delta"]).tolist()
            row["t_mask"] = np.asarray(token["token_mask_delta"]).tolist()
            row["t_logprobs"] = np.asarray(token["generation_logprobs_delta"]).tolist()
        rows.append(row)
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    outcomes, batch = reassemble_unit([rollout], table, options)
    return outcomes[0], batch
