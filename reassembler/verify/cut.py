"""Cut: split the selected calls into chains at every root (CONTRACT.md 3.2).

One pass, looking only at each call's parent: a root starts a new chain; a call whose
parent is the call selected just before it continues the current chain; anything else
means the output does not follow the lineage (missing_root first, broken_chain later).
"""

from __future__ import annotations

from ..reasons import Masked, Reason
from .calls import Call


def cut_chains(selected: list[Call], trace: list[str] | None = None) -> list[list[Call]]:
    chains: list[list[Call]] = []
    for i, call in enumerate(selected):
        if call.is_root:
            chains.append([call])
            note = f"{call.model_call_id} root -> starts chain {len(chains) - 1}"
        elif i > 0 and call.parent_call_id == selected[i - 1].model_call_id:
            chains[-1].append(call)
            note = f"{call.model_call_id} continues chain {len(chains) - 1}"
        elif i == 0:
            raise Masked(
                Reason.MISSING_ROOT,
                f"first selected call {call.model_call_id} has parent {call.parent_call_id}",
                call.model_call_id,
            )
        else:
            raise Masked(
                Reason.BROKEN_CHAIN,
                f"{call.model_call_id} has parent {call.parent_call_id} but follows {selected[i - 1].model_call_id}",
                call.model_call_id,
            )
        if trace is not None:
            trace.append(f"cut: {note}")
    return chains
