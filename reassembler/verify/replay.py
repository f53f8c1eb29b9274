"""A rollout's selection replayed as text, from its records alone (no token reads): the
ledger in one line, then each selected span, the cut, and the walk of every chain, as
CONTRACT.md section 7 narrates the worked example. The capture-quality report shows it for
example rollouts; `reassembler explain` prints the same lines, and reruns every check too."""

from __future__ import annotations

from ..reasons import Masked
from .calls import Call
from .cut import cut_chains
from .finalize import walk_to_root
from .rollout import declared_terminal
from .select import select_calls


def ledger_line(calls: list[tuple[str, str | None, str | None]]) -> str:
    """(model_call_id, parent_call_id, failure_reason) per call, in capture order, as one line."""
    if not calls:
        return "ledger: no calls"
    return f"ledger: {len(calls)} calls in capture order: " + ", ".join(
        f"{cid} ({'poison: ' + fr if fr else 'root' if parent is None else 'parent ' + parent})"
        for cid, parent, fr in calls
    )


def selection_lines(rollout: dict, calls: list[Call]) -> list[str]:
    """Select, cut and the walks of the rollout's chains (select mode), each step once; a
    step that masks the rollout ends the lines with `stopped: <reason>: <detail>`."""
    lines: list[str] = []
    try:
        selected = select_calls(rollout, calls, declared_terminal(rollout, calls), lines)
        chains = cut_chains(selected, lines)
        by_id = {c.model_call_id: c for c in calls}
        for chain in chains:
            lines.append(
                "finalize: walk " + " -> ".join(c.model_call_id for c in reversed(walk_to_root(chain[-1], by_id)))
            )
    except Masked as m:
        lines.append(f"stopped: {m.reason.value}: {m.detail}")
    return lines
