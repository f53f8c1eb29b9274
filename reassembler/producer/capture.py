"""Write capture the way a trainer's harness does: ledger rows and token rows with their
lengths, chain hashes, cumulative hashes and staged-record digests (CONTRACT.md 2 and 4).

Used by `reassembler synth` and by the tests' hand-written fixtures. It is the producer
side of the contract, kept apart from the reader so that neither is checked only against
itself: the digests are pinned by NeMo Gym's published vector (tests/test_digests.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..formats import digests
from ..formats.fields import LEDGER_INTS, SHARED_FIELDS, VERSION_DEFAULTS
from ..formats.gym_fingerprint import VERSION as GYM_FINGERPRINT_VERSION
from ..formats.gym_fingerprint import afp
from ..formats.items import fingerprint


@dataclass
class CapturedCall:
    """One model call as the harness saw it: its new tokens and the items it generated."""

    call_id: str
    parent: str | None
    ids: list[int] | np.ndarray
    mask: list[float] | np.ndarray
    logprobs: list[float] | np.ndarray
    items: list[dict] = field(default_factory=list)
    weight_version: int = 0
    poison: str | None = None  # admitted but not captured: a poison ledger row, no token row


def stage_rollout(
    rollout_id: str,
    calls: list[CapturedCall],
    schema_version: int = 2,
    staging_key=lambda rid, cid: f"{rid}/{cid}",
    evidence: Literal["items", "fingerprint"] = "items",
) -> list[tuple[dict, dict | None]]:
    """(ledger row, token row or None) per call, in the order given (= capture order).

    `evidence` says how a ledger row names the output the call produced: the contract's
    per-item `output_items`, or NeMo Gym 0.7.0's `output_fingerprint` (afp of its items)."""
    by_id = {c.call_id: c for c in calls}
    context: dict[str, tuple[list[bytes], int, str]] = {}  # id -> (ids parts, cum_len, chain hash)

    def ctx(call: CapturedCall):
        if call.call_id not in context:
            ids = np.asarray(call.ids, dtype=np.int64)
            ids_be = ids.astype(">u8").tobytes()
            if call.parent is None or call.parent not in by_id:
                parts, prev, parent_chain = [], 0, None
            else:
                parts, prev, parent_chain = ctx(by_id[call.parent])
            context[call.call_id] = (parts + [ids_be], prev + len(ids), digests.chain_hash(parent_chain, ids_be))
        return context[call.call_id]

    out: list[tuple[dict, dict | None]] = []
    for c in calls:
        if c.poison is not None:
            out.append(
                (
                    {
                        "rollout_id": rollout_id,
                        "model_call_id": c.call_id,
                        "parent_call_id": c.parent,
                        "failure_reason": c.poison,
                        "output_items": [],
                    },
                    None,
                )
            )
            continue
        ids = np.asarray(c.ids, dtype=np.int64)
        mask = np.asarray(c.mask, dtype=np.float32)
        lp = np.asarray(c.logprobs, dtype=np.float32)
        parts, cum, chain = ctx(c)
        n = len(ids)
        ledger = {
            "rollout_id": rollout_id,
            "model_call_id": c.call_id,
            "parent_call_id": c.parent,
            "mode": "text" if c.parent is None else "token_in",
            "prev_len": cum - n,
            "delta_len": n,
            "cum_len": cum,
            "weight_version": c.weight_version,
            "schema_version": schema_version,
            "digest_version": 2,
            "extras_digest_version": 1,
            "extras_digest": digests.NO_EXTRAS_DIGEST,
            "chain_hash": chain,
            "cumulative_hash": digests.cumulative_hash(parts),
            "staging_key": staging_key(rollout_id, c.call_id),
            "response_id": f"resp_{c.call_id}",
            "failure_reason": None,
        }
        if evidence == "items":
            ledger["output_items"] = [{"id": it.get("id"), "fingerprint": fingerprint(it)} for it in c.items]
        else:
            ledger["output_fingerprint"] = afp(c.items) if c.items else None
            ledger["fingerprint_version"] = GYM_FINGERPRINT_VERSION
        ledger["digest"] = record_digest(ledger, ids, mask, lp)
        token = {k: ledger[k] for k in ("staging_key",) + SHARED_FIELDS}
        token.update(token_ids_delta=ids, token_mask_delta=mask, generation_logprobs_delta=lp)
        out.append((ledger, token))
    return out


def as_gym_lineage_row(ledger: dict) -> dict:
    """A staged ledger row in the shape NeMo Gym 0.7.0's FileLineageStore writes it: no
    rollout_id (the file is named after it), no version fields at their defaults, the
    staged digest under `staging_digest` and the cumulative hash under `digest`; a poison
    row is just {model_call_id, failure_reason}."""
    if ledger.get("failure_reason") is not None:
        return {"model_call_id": ledger["model_call_id"], "failure_reason": ledger["failure_reason"]}
    row = {
        k: v
        for k, v in ledger.items()
        if k not in ("rollout_id", "failure_reason") and not (k in VERSION_DEFAULTS and v == VERSION_DEFAULTS[k])
    }
    row["staging_digest"] = ledger["digest"]
    row["digest"] = ledger["cumulative_hash"]
    return row


def record_digest(ledger: dict, ids, mask, lp) -> str:
    """The staged-record digest of a ledger row with these token lists."""
    ids_be, mask_be, lp_be = digests.to_be_bytes(
        np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.float32), np.asarray(lp, dtype=np.float32)
    )
    fields = {
        k: ledger[k]
        for k in (
            "schema_version",
            "digest_version",
            "extras_digest_version",
            "rollout_id",
            "model_call_id",
            "parent_call_id",
            "mode",
            "prev_len",
            "delta_len",
            "cum_len",
            "weight_version",
            "extras_digest",
            "chain_hash",
            "cumulative_hash",
        )
    }
    return digests.staged_call_digest(**fields, ids_be=ids_be, mask_be=mask_be, logprobs_be=lp_be)


def resign(ledger: dict, token: dict, **changes) -> None:
    """Change fields on both the ledger row and its token row, then recompute the
    staged-record digest: a fault injector's way to make `changes` the only thing wrong."""
    ledger.update(changes)
    token.update(changes)
    ledger["digest"] = token["digest"] = record_digest(
        ledger, token["token_ids_delta"], token["token_mask_delta"], token["generation_logprobs_delta"]
    )


# ---------------------------------------------------------------- files


@dataclass(frozen=True)
class TokenFileTypes:
    """The alternative Arrow types of CONTRACT.md 2.3 one token file is written with."""

    ids: pa.DataType = pa.int64()
    mask: pa.DataType = pa.float32()
    logprobs: pa.DataType = pa.float32()
    logprob_name: str = "generation_logprobs_delta"
    binary_digests: bool = False
    version_columns: bool = True  # False: left out, as a Gym token store may (defaults 2/2/1)


TOKEN_FILE_VARIANTS = (
    TokenFileTypes(),
    TokenFileTypes(pa.int32(), pa.bool_(), pa.float64(), "generation_log_probs_delta", True),
    TokenFileTypes(pa.int64(), pa.int8(), pa.float32(), "generation_log_probs_delta", False),
    TokenFileTypes(pa.int32(), pa.float32(), pa.float64(), "generation_logprobs_delta", True),
)


def token_table(rows: list[dict], types: TokenFileTypes = TokenFileTypes()) -> pa.Table:
    def col(name):
        return [r[name] for r in rows]

    digest_type = pa.binary(32) if types.binary_digests else pa.string()

    def digest_col(name):
        values = col(name)
        if types.binary_digests:
            values = [
                None if v is None else bytes.fromhex(v) if len(v) == 64 else v.encode()[:32].ljust(32, b"\0")
                for v in values
            ]
        return pa.array(values, type=digest_type)

    def list_col(name, value_type):
        values = col(name)
        lengths = np.array([0 if v is None else len(v) for v in values], dtype=np.int32)
        offsets = np.zeros(len(values) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        present = [np.asarray(v) for v in values if v is not None]
        flat = np.concatenate(present) if present else np.zeros(0)
        flat = flat != 0 if value_type == pa.bool_() else flat.astype(value_type.to_pandas_dtype())
        nulls = pa.array([v is None for v in values], type=pa.bool_())
        return pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()),
            pa.array(flat, type=value_type),
            mask=nulls if any(v is None for v in values) else None,
        )

    columns = {
        "staging_key": pa.array(col("staging_key"), pa.string()),
        "rollout_id": pa.array(col("rollout_id"), pa.string()),
        "model_call_id": pa.array(col("model_call_id"), pa.string()),
        "parent_call_id": pa.array(col("parent_call_id"), pa.string()),
        "mode": pa.array(col("mode"), pa.string()),
    }
    for name in LEDGER_INTS:
        if name in VERSION_DEFAULTS and not types.version_columns:
            if any(v != VERSION_DEFAULTS[name] for v in col(name)):
                raise ValueError(f"a token file without {name} can only hold rows at the default")
            continue
        columns[name] = pa.array(col(name), pa.int64())
    for name in ("digest", "extras_digest", "chain_hash", "cumulative_hash"):
        columns[name] = digest_col(name)
    columns["token_ids_delta"] = list_col("token_ids_delta", types.ids)
    columns["token_mask_delta"] = list_col("token_mask_delta", types.mask)
    columns[types.logprob_name] = list_col("generation_logprobs_delta", types.logprobs)
    return pa.table(columns)


def write_token_file(
    path: Path, rows: list[dict], types: TokenFileTypes = TokenFileTypes(), row_group_size: int = 256
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(token_table(rows, types), path, row_group_size=row_group_size)


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
