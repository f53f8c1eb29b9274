"""Finalize: verify one chain by the leaf-to-root walk and every per-call check (CONTRACT.md 3.3).

The walk follows parent_call_id from the leaf through the rollout's whole ledger
(missing_parent, lineage_cycle) and must give back the chain (order_mismatch). Then, root
to leaf, each call passes all its checks before the next call is looked at: its record
checks, its parent's cum_len, its token checks and digest, its chain hash (the verdicts
were computed for the whole batch in checks.py; here they are looked up in order), and the
leaf's cumulative_hash must be the hash of the whole joined row.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..formats.digests import cumulative_hash
from ..reasons import Masked, Reason
from .calls import Call


@dataclass(frozen=True)
class Segment:
    """A verified chain: one training row. `call_ids`: the row's model_call_ids when they
    are not its calls' ids (a rebuilt line has none, a verifiers branch its sampled nodes);
    `versions`: its weight versions (min, max) when its calls declare none (verifiers: the
    Episode's policy span); `prompt_len` when the capture defines it (an envelope segment:
    its first call's prompt, CONTRACT.md 11.5)."""

    calls: list[Call]
    call_ids: list[str] | None = None
    versions: tuple[int, int] | None = None
    prompt_len: int | None = None  # when the capture says it (an envelope segment: its first prompt)

    @property
    def token_rows(self) -> list[int]:
        return [c.row for c in self.calls]


def walk_to_root(leaf: Call, by_id: dict[str, Call]) -> list[Call]:
    """The calls from `leaf` up to its root, root first."""
    walk: list[Call] = []
    seen: set[str] = set()
    call = leaf
    while True:
        if call.model_call_id in seen:
            raise Masked(
                Reason.LINEAGE_CYCLE,
                f"{call.model_call_id} reached twice from {leaf.model_call_id}",
                call.model_call_id,
            )
        seen.add(call.model_call_id)
        walk.append(call)
        if call.parent_call_id is None:  # the walk ends at any row without a parent, poison or not
            break
        parent = by_id.get(call.parent_call_id)
        if parent is None:
            raise Masked(
                Reason.MISSING_PARENT,
                f"{call.model_call_id} has parent {call.parent_call_id}, which is not in the ledger",
                call.model_call_id,
            )
        call = parent
    walk.reverse()
    return walk


def finalize_chain(chain: list[Call], by_id: dict[str, Call], checks, trace: list[str] | None = None) -> Segment:
    """`checks`: the batch's verdicts (checks.BatchChecks)."""
    leaf = chain[-1]
    walk = walk_to_root(leaf, by_id)
    if trace is not None:
        trace.append("finalize: walk " + " -> ".join(c.model_call_id for c in reversed(walk)))
    if [c.model_call_id for c in walk] != [c.model_call_id for c in chain]:
        raise Masked(
            Reason.ORDER_MISMATCH,
            f"walk [{', '.join(c.model_call_id for c in walk)}] != chain [{', '.join(c.model_call_id for c in chain)}]",
            leaf.model_call_id,
        )
    for k, call in enumerate(chain):
        checks.record(call)
        if k > 0 and chain[k - 1].cum_len != call.prev_len:
            raise Masked(
                Reason.PARENT_LENGTH_MISMATCH,
                f"parent {chain[k - 1].model_call_id} cum_len {chain[k - 1].cum_len} != prev_len {call.prev_len}",
                call.model_call_id,
            )
        checks.tokens_and_digest(call)
        checks.chain(call, chain[k - 1] if k > 0 else None)
    if leaf.capture is not None:  # NeMo Gym's own capture: its checks ran at the load (CONTRACT.md 9.6)
        return Segment(list(chain))
    joined = cumulative_hash(checks.joined_ids_be(chain))
    assert leaf.cumulative_hash is not None  # checked by checks.record
    if joined != leaf.cumulative_hash:
        raise Masked(
            Reason.CUMULATIVE_HASH_MISMATCH,
            f"hash of the joined row {joined[:16]}.. != leaf cumulative_hash {leaf.cumulative_hash[:16]}..",
            leaf.model_call_id,
        )
    return Segment(list(chain))
