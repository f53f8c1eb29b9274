"""Select: match the agent's final output to the calls that produced it (CONTRACT.md 3.1).

Walk the output left to right. At each position p, the candidates are the non-poison calls
not selected yet whose evidence matches the output starting at p; several candidates: keep
the one that continues the chain (a root at p = 0, else a child of the call selected last).

The evidence is chosen per rollout (`evidence_of`):

- **items** (the contract's own): a call's `output_items` must equal G[p : p + n] of the
  generated items G (fingerprints equal; ids equal where both sides carry one); span n.
- **fingerprints** (NeMo Gym 0.7.0): a call's `output_fingerprint` must equal
  afp(M[p : p + k]) for some k over the model-authored items M; the span is the largest
  such k. The hashes of all spans from p are built incrementally, one SHA-256 update per
  item (gym_fingerprint.py holds the byte layout).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Literal

from ..formats.gym_fingerprint import PREFIX as AFP_PREFIX
from ..formats.records import HEX64
from ..reasons import Masked, Reason
from .calls import Call

Item = tuple[str | None, str]  # (id or None, fingerprint)
ModelItem = tuple[int, bytes | None]  # (index in output, F bytes or None: unfingerprintable)
Evidence = Literal["items", "fingerprints"]
# candidates at position p, given the calls already taken: (call, span) in capture order
Candidates = Callable[[int, set[int]], list[tuple[Call, int]]]


def evidence_of(calls: list[Call]) -> Evidence:
    """By items when any non-poison row carries output_items, else by fingerprints."""
    if any(not c.is_poison and c.output_items is not None for c in calls):
        return "items"
    return "fingerprints"


def _by_items(generated: list[Item], calls: list[Call]) -> Candidates:
    by_first_fp: dict[str, list[Call]] = {}
    for call in calls:
        if not call.is_poison and call.output_items:
            by_first_fp.setdefault(call.output_items[0][1], []).append(call)

    def matches(produced: list[Item], p: int) -> bool:
        if p + len(produced) > len(generated):
            return False
        for (pid, pfp), (gid, gfp) in zip(produced, generated[p : p + len(produced)]):
            if pfp != gfp or (pid and gid and pid != gid):
                return False
        return True

    def at(p: int, taken: set[int]) -> list[tuple[Call, int]]:
        return [
            (c, len(c.output_items or ()))
            for c in by_first_fp.get(generated[p][1], ())
            if id(c) not in taken and matches(c.output_items or [], p)
        ]

    return at


def _by_fingerprints(model_items: list[ModelItem], calls: list[Call]) -> Candidates:
    # keyed by the 32 digest bytes; a fingerprint that is not lowercase hex can equal no
    # hexdigest, so it is left out (it matches nothing, as before)
    by_fp: dict[bytes, list[Call]] = {}
    for call in calls:
        fp = call.output_fingerprint
        if not call.is_poison and fp is not None and HEX64.fullmatch(fp):
            by_fp.setdefault(bytes.fromhex(fp), []).append(call)
    fields = [field for _, field in model_items]

    def at(p: int, taken: set[int]) -> list[tuple[Call, int]]:
        span: dict[int, tuple[Call, int]] = {}
        h = hashlib.sha256(AFP_PREFIX)
        for k, field in enumerate(fields[p:], 1):
            if field is None:  # this span and every longer one match nothing
                break
            h.update(field)
            found = by_fp.get(h.digest())  # digest() leaves h as it is
            if found:
                for c in found:
                    if id(c) not in taken:
                        span[id(c)] = (c, k)  # the largest k wins
        return sorted(span.values(), key=lambda cs: cs[0].capture_seq)

    return at


def select_calls(
    rollout: dict, calls: list[Call], declared: tuple[str, ...] | None = None, trace: list[str] | None = None
) -> list[Call]:
    """The selected calls, in output order; Masked on the first failing check.
    `declared`: the declared terminal call(s) of the rollout (rollout.declared_terminal)."""
    evidence = evidence_of(calls)
    if evidence == "items":
        positions = [(i["id"], i["fingerprint"]) for i in rollout["generated_items"] or []]
        candidates_at = _by_items(positions, calls)
        where = lambda p: f"item {p}"  # noqa: E731
    else:
        positions = [(m["output_index"], m["field"]) for m in rollout["model_items"] or []]
        candidates_at = _by_fingerprints(positions, calls)
        where = lambda p: f"model-authored item {p} (output item {positions[p][0]})"  # noqa: E731
    if trace is not None:
        trace.append(
            f"select: by {'output_items' if evidence == 'items' else 'output_fingerprint'}, "
            f"{len(positions)} {'generated' if evidence == 'items' else 'model-authored'} items"
        )

    selected: list[Call] = []
    taken: set[int] = set()
    p = 0
    while p < len(positions):
        candidates = candidates_at(p, taken)
        if not candidates:
            raise Masked(Reason.UNMATCHED_OUTPUT, f"{where(p)}: no call produced it")
        if len(candidates) > 1:
            prev = selected[-1].model_call_id if selected else None
            continuing = [(c, n) for c, n in candidates if (c.is_root if prev is None else c.parent_call_id == prev)]
            if len(continuing) != 1:
                names = ", ".join(c.model_call_id for c, _ in candidates)
                raise Masked(
                    Reason.AMBIGUOUS_OUTPUT,
                    f"{where(p)}: {len(candidates)} candidates ({names}), {len(continuing)} continue the chain",
                )
            candidates = continuing
        call, span = candidates[0]
        if trace is not None:
            items = f"item {p}" if span == 1 else f"items {p}-{p + span - 1}"
            trace.append(f"select: {items} -> {call.model_call_id}")
        selected.append(call)
        taken.add(id(call))
        p += span

    if not selected:
        kind = "generated" if evidence == "items" else "model-authored"
        raise Masked(Reason.EMPTY_SELECTION, f"the output holds no {kind} item")
    for before, after in zip(selected, selected[1:]):
        if after.capture_seq <= before.capture_seq:
            raise Masked(
                Reason.OUT_OF_CAPTURE_ORDER,
                f"{after.model_call_id} was captured before {before.model_call_id}",
                after.model_call_id,
            )
    if declared is not None and selected[-1].model_call_id not in declared:
        raise Masked(
            Reason.TERMINAL_NOT_LAST,
            f"declared terminal {', '.join(declared)}, last selected {selected[-1].model_call_id}",
            selected[-1].model_call_id,
        )
    return selected
