"""Output tables (CONTRACT.md 5.1 and 5.2): training rows and audit rows as Arrow.

Both carry the night as their first column, `ds` (its YYYY-MM-DD text, dictionary-encoded as
hive-partitioned readers type the folder name), beside the contract's columns:
Gym's rollout ids repeat every night, so (ds, row_id) and (ds, rollout_id) are the keys
across nights, whichever reader drops the partition folder's name.

Training rows are gathered from the TokenBatch in one vectorized pass per batch of
outcomes; nothing here touches tokens one at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date

import numpy as np
import pyarrow as pa

# The night: its YYYY-MM-DD text, dictionary-encoded, the type every hive-partitioned reader
# gives the `ds=<ds>` folder name (pyarrow, pandas): a plain read of `<output>/rows` then merges
# the files' column with the folder's instead of refusing two types (README, choices).
NIGHT_TYPE = pa.dictionary(pa.int32(), pa.string())

ROW_SCHEMA = pa.schema(
    [
        ("ds", NIGHT_TYPE),
        ("row_id", pa.string()),
        ("rollout_id", pa.string()),
        ("group_id", pa.string()),
        ("slot", pa.int32()),
        ("segment_index", pa.int32()),
        ("segment_count", pa.int32()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("prompt_len", pa.int32()),
        ("n_tokens", pa.int32()),
        ("n_generated", pa.int32()),
        ("model_call_ids", pa.list_(pa.string())),
        ("weight_version_min", pa.int64()),
        ("weight_version_max", pa.int64()),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("rollout_weight", pa.float64()),
        ("capture", pa.string()),
        ("evidence", pa.string()),
        ("env", pa.string()),
        ("agent", pa.string()),
        ("temperature", pa.float64()),
    ]
)

# Parquet writer settings for training rows: dictionary encoding and statistics only on the
# small identifying columns (on the token lists they cost time and buy nothing).
ROW_WRITE_OPTIONS = {
    "use_dictionary": ["row_id", "rollout_id", "group_id", "capture", "evidence", "env", "agent"],
    "write_statistics": ["row_id", "rollout_id", "group_id", "slot", "segment_index", "capture", "evidence", "env"],
}

AUDIT_SCHEMA = pa.schema(
    [
        ("ds", NIGHT_TYPE),
        ("rollout_id", pa.string()),
        ("group_id", pa.string()),
        ("slot", pa.int32()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("failed_call_id", pa.string()),
        ("n_ledger_calls", pa.int32()),
        ("n_selected", pa.int32()),
        ("n_segments", pa.int32()),
        ("n_offchain", pa.int32()),
        ("n_offchain_faults", pa.int32()),
        ("n_tokens", pa.int64()),
        ("n_generated", pa.int64()),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("metadata", pa.string()),
        ("run_id", pa.string()),
        ("capture", pa.string()),
        ("evidence", pa.string()),
        ("n_roots", pa.int32()),
    ]
)

# which capture vouched for its tokens with a digest recomputed from them (CONTRACT.md 5.3):
# the staged record's digest and chain hash (4), local mode's nemo-gym-tokens digest (9.5);
# an envelope line says which of its versions it is (11.4)
DIGEST_CAPTURES = ("staged", "local")


def capture_of(rollout: dict, n_ledger_calls: int | None) -> str | None:
    """The audit's and rows' `capture` (5.3): the reading that built the rollout; a ledger
    rollout is `staged`; null for one no reading applied to (a given-up sample, a rollout
    with no ledger row and no other capture)."""
    capture = rollout.get("capture")
    if capture == "none":
        return None
    if capture is None:
        return "staged" if n_ledger_calls else None
    return capture


# what the rows and audit rows read of a rollout's record (the shard keeps only these once
# the rollout is verified: its items and trace are the bulk of it)
WRITTEN_FIELDS = (
    *("rollout_id", "group_id", "slot", "reward", "metadata"),
    *("env", "agent", "temperature", "capture", "evidence"),
)


def evidence_of(rollout: dict) -> str:
    """`evidence` of an ok rollout's rows (5.3): `digest` or `none`."""
    capture = rollout.get("capture") or "staged"
    if capture == "envelope":
        return rollout.get("evidence") or "none"
    return "digest" if capture in DIGEST_CAPTURES else "none"


# Tokens of the rows built and written at once: a verifiers trace's rows repeat their shared
# context, so a batch's rows can hold many times the tokens the batch read (CONTRACT.md 10.5).
# Each token row a row is cut from counts as ROW_PIECE_PER_TOKEN_ROW tokens more: building
# a row costs about 100 bytes a token row (the rows of a comb of one-token nodes: a token row
# a token). Measured on a comb of 3,000 branches (4.5M one-token rows): pieces of 4M tokens
# peaked at 917 MB, of 1M at 527 MB, of 256k at 463 MB; a batch of staged calls of ~1,000
# tokens (1M tokens, 1,000 token rows) stays one piece.
ROW_PIECE_TOKENS = 1 << 21
ROW_PIECE_PER_TOKEN_ROW = 16


def row_tables(outcomes, batch, ds: str, piece_tokens: int | None = None) -> Iterator[pa.Table]:
    """Training rows of the ok outcomes of night `ds`, in the order given (already output
    order), in tables of whole rows that each hold about `piece_tokens` tokens (default
    ROW_PIECE_TOKENS, each token row counted as ROW_PIECE_PER_TOKEN_ROW more; one row at
    least): what they take is bounded by that, whatever the rows repeat. At least one table."""
    piece_tokens = piece_tokens or ROW_PIECE_TOKENS
    rows, yielded = _Rows(), False
    for o in outcomes:
        if not o.ok:
            continue
        r = o.rollout
        k = len(o.segments)
        origin = {
            "capture": capture_of(r, o.n_ledger_calls),
            "evidence": evidence_of(r),
            "env": r.get("env"),
            "agent": r.get("agent"),
            "temperature": r.get("temperature"),
        }
        for index, seg in enumerate(o.segments):
            rows.add(batch, o, r, index, k, seg, origin)
            if rows.tokens >= piece_tokens:
                yield rows.table(batch, ds)
                rows, yielded = _Rows(), True
    if rows.segs_per_row or not yielded:
        yield rows.table(batch, ds)


class _Rows:
    """Rows gathered for one table: their columns but the token lists, and the token rows
    each is cut from."""

    def __init__(self):
        self.meta: dict[str, list] = {
            name: [] for name in ROW_SCHEMA.names if name not in ("ds", "input_ids", "loss_mask", "logprobs")
        }
        self.token_rows: list[int] = []
        self.segs_per_row: list[int] = []
        self.tokens = 0

    def add(self, batch, o, r: dict, index: int, k: int, seg, origin: dict) -> None:
        meta = self.meta
        rows = seg.token_rows
        self.token_rows.extend(rows)
        self.segs_per_row.append(len(rows))
        n_tokens = int(batch.n_ids[rows].sum())
        self.tokens += n_tokens + ROW_PIECE_PER_TOKEN_ROW * len(rows)
        versions = list(seg.versions or (c.weight_version for c in seg.calls if c.weight_version is not None))
        meta["row_id"].append(f"{r['rollout_id']}_s{index}")
        meta["rollout_id"].append(r["rollout_id"])
        meta["group_id"].append(r["group_id"])
        meta["slot"].append(r["slot"])
        meta["segment_index"].append(index)
        meta["segment_count"].append(k)
        meta["prompt_len"].append(seg.prompt_len if seg.prompt_len is not None else prompt_len(batch, rows))
        meta["n_tokens"].append(n_tokens)
        meta["n_generated"].append(int(batch.ones[rows].sum()))
        meta["model_call_ids"].append(
            seg.call_ids if seg.call_ids is not None else [c.model_call_id for c in seg.calls]
        )
        meta["weight_version_min"].append(min(versions) if versions else None)  # none in Gym's local capture
        meta["weight_version_max"].append(max(versions) if versions else None)
        meta["reward"].append(r["reward"])
        meta["advantage"].append(o.advantage)
        meta["rollout_weight"].append(1.0 / k)
        for name, value in origin.items():
            meta[name].append(value)

    def table(self, batch, ds: str) -> pa.Table:
        meta = self.meta
        offsets, ids, mask, lp = batch.gather(
            np.asarray(self.token_rows, dtype=np.int64), np.asarray(self.segs_per_row, dtype=np.int64)
        )
        columns = {name: pa.array(values, type=ROW_SCHEMA.field(name).type) for name, values in meta.items()}
        columns["ds"] = _night(ds, len(meta["row_id"]))
        off = pa.array(offsets, type=pa.int32())
        columns["input_ids"] = pa.ListArray.from_arrays(off, pa.array(ids, type=pa.int32()))
        columns["loss_mask"] = pa.ListArray.from_arrays(off, pa.array(mask, type=pa.int8()))
        columns["logprobs"] = pa.ListArray.from_arrays(off, pa.array(lp, type=pa.float32()))
        return pa.table([columns[n] for n in ROW_SCHEMA.names], schema=ROW_SCHEMA)


def prompt_len(batch, rows: list[int]) -> int:
    """The index of a row's first mask-1 token: its leading token rows without one (a
    verifiers branch's prompt nodes), then the zeros of the first with one (each token row
    holds its zeros before its ones). A chain's root has a 1: its zeros."""
    before = 0
    for r in rows:
        if batch.ones[r]:
            return before + int(batch.zeros[r])
        before += int(batch.n_ids[r])
    return before


def _night(ds: str, n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, np.int32)), pa.array([date.fromisoformat(ds).isoformat()])
    )


def audit_table(outcomes, batch, run_id: str, ds: str) -> pa.Table:
    records = []
    for o in outcomes:
        r = o.rollout
        rows = [row for s in o.segments for row in s.token_rows]
        records.append(
            {
                "rollout_id": r["rollout_id"],
                "group_id": r["group_id"],
                "slot": r["slot"],
                "status": "ok" if o.ok else "masked",
                "reason": None if o.ok else o.reason.value,
                "detail": o.detail,
                "failed_call_id": o.failed_call_id,
                "n_ledger_calls": o.n_ledger_calls,
                "n_selected": o.n_selected,
                "n_segments": len(o.segments),
                "n_offchain": o.n_offchain,
                "n_offchain_faults": o.n_offchain_faults,
                "n_tokens": int(batch.n_ids[rows].sum()) if rows else 0,
                "n_generated": int(batch.ones[rows].sum()) if rows else 0,
                "reward": r["reward"],
                "advantage": o.advantage,
                "metadata": r["metadata"],
                "run_id": run_id,
                "capture": capture_of(r, o.n_ledger_calls),
                "evidence": evidence_of(r) if o.ok else None,
                "n_roots": o.n_roots,
            }
        )
    table = pa.Table.from_pylist(records, schema=AUDIT_SCHEMA.remove(0))
    return table.add_column(0, AUDIT_SCHEMA.field("ds"), _night(ds, table.num_rows))
