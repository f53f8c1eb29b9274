"""Select: match the agent's final output to the calls that produced it (CONTRACT.md 3.1).

Walk the generated items left to right. At item p, the candidates are the non-poison calls
not selected yet whose `output_items` equal G[p : p + len(output_items)] (fingerprints
equal; ids equal where both sides carry one). Several candidates: keep the one that
continues the chain (a root at p = 0, else a child of the call selected last).
"""
from __future__ import annotations

from .calls import Call
from .reasons import Masked, Reason

Item = tuple[str | None, str]  # (id or None, fingerprint)


def _matches(produced: list[Item], generated: list[Item], p: int) -> bool:
    if p + len(produced) > len(generated):
        return False
    for (pid, pfp), (gid, gfp) in zip(produced, generated[p:p + len(produced)]):
        if pfp != gfp or (pid and gid and pid != gid):
            return False
    return True


def select_calls(generated: list[Item], calls: list[Call], terminal_call_id: str | None = None,
                 trace: list[str] | None = None) -> list[Call]:
    by_first_fp: dict[str, list[Call]] = {}
    for call in calls:
        if not call.is_poison and call.output_items:
            by_first_fp.setdefault(call.output_items[0][1], []).append(call)

    selected: list[Call] = []
    taken: set[int] = set()
    p = 0
    while p < len(generated):
        candidates = [c for c in by_first_fp.get(generated[p][1], ())
                      if id(c) not in taken and _matches(c.output_items, generated, p)]
        if not candidates:
            raise Masked(Reason.UNMATCHED_OUTPUT, f"item {p}: no call produced it")
        if len(candidates) > 1:
            prev = selected[-1].model_call_id if selected else None
            continuing = [c for c in candidates
                          if (c.is_root if prev is None else c.parent_call_id == prev)]
            if len(continuing) != 1:
                names = ", ".join(c.model_call_id for c in candidates)
                raise Masked(Reason.AMBIGUOUS_OUTPUT,
                             f"item {p}: {len(candidates)} candidates ({names}), "
                             f"{len(continuing)} continue the chain")
            candidates = continuing
        call = candidates[0]
        if trace is not None:
            n = len(call.output_items)
            span = f"item {p}" if n == 1 else f"items {p}-{p + n - 1}"
            trace.append(f"select: {span} -> {call.model_call_id}")
        selected.append(call)
        taken.add(id(call))
        p += len(call.output_items)

    if not selected:
        raise Masked(Reason.EMPTY_SELECTION, "the output holds no generated item")
    for before, after in zip(selected, selected[1:]):
        if after.capture_seq <= before.capture_seq:
            raise Masked(Reason.OUT_OF_CAPTURE_ORDER,
                         f"{after.model_call_id} was captured before {before.model_call_id}",
                         after.model_call_id)
    if terminal_call_id is not None and selected[-1].model_call_id != terminal_call_id:
        raise Masked(Reason.TERMINAL_NOT_LAST,
                     f"declared terminal {terminal_call_id}, last selected {selected[-1].model_call_id}",
                     selected[-1].model_call_id)
    return selected
