"""`reassembler explain`: replay one rollout of a published night, step by step, the way
CONTRACT.md section 7 narrates the worked example."""
from __future__ import annotations

import json
from pathlib import Path

from .read import InputError, find_night
from .reasons import DESCRIPTIONS
from .rollout import Options
from .select import select_calls
from .shard import reassemble_one
from .warehouse import connect, sql


def _ledger_line(ledger) -> str:
    if not ledger:
        return "ledger: no calls"
    return f"ledger: {len(ledger)} calls in capture order: " + ", ".join(
        f"{cid} ({'poison: ' + fr if fr else 'root' if parent is None else 'parent ' + parent})"
        for cid, parent, fr in ledger)


def ledger_trace(con, ds: str, rollout_id: str) -> list[str]:
    """The trace of one published rollout replayed from the warehouse alone (no token
    reads): its ledger, selection, cut and walks, then the outcome the build recorded. The
    per-call token checks are not rerun here; `reassembler explain` reruns everything."""
    from .calls import calls_from_rows
    from .cut import cut_chains
    from .finalize import walk_to_root
    from .reasons import Masked
    from .rollout import declared_terminal

    params = {"ds": ds, "shard": None, "rollout_id": rollout_id}
    cur = con.execute(sql("shard_rollouts"), params)
    names = [d[0] for d in cur.description]
    records = [dict(zip(names, row)) for row in cur.fetchall()]
    published = con.execute(sql("explain_audit"), {"ds": ds, "rollout_id": rollout_id}).fetchone()
    if not records or published is None:
        return [f"rollout {rollout_id}: not in the warehouse for ds={ds}"]
    rollout = records[0]
    cur = con.execute(sql("explain_ledger"), {"ds": ds, "rollout_id": rollout_id})
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, row), _row=0, token_fields=None) for row in cur.fetchall()]
    calls = calls_from_rows(rows)
    status, reason, detail, failed, *_ , mode = published[:8]
    lines = [_ledger_line([(c.model_call_id, c.parent_call_id, c.failure_reason) for c in calls])]
    if mode != "terminal" and calls and not rollout["failure_reason"] and rollout["reward"] is not None:
        try:
            selected = select_calls(rollout, calls, declared_terminal(rollout, calls), lines)
            chains = cut_chains(selected, lines)
            by_id = {c.model_call_id: c for c in calls}
            for chain in chains:
                lines.append("finalize: walk " + " -> ".join(c.model_call_id for c in reversed(walk_to_root(chain[-1], by_id))))
        except Masked as m:
            lines.append(f"stopped: {m.reason.value}: {m.detail}")
    at = f" at call {failed}" if failed else ""
    lines.append(f"result (as built): {status}" + (f", {reason}{at}: {detail}" if reason else ""))
    return lines


def explain(output_dir, ds: str, rollout_id: str) -> str:
    with connect(output_dir, read_only=True) as con:
        published = con.execute(sql("explain_audit"), {"ds": ds, "rollout_id": rollout_id}).fetchone()
        if published is None:
            raise InputError(f"{Path(output_dir) / 'warehouse.duckdb'}: no published audit row for "
                             f"rollout {rollout_id} on ds={ds}")
        status, reason, detail, failed, advantage, run_id, input_dir, mode, offchain, options = published
        opts = Options(**json.loads(options)) if options else Options()
        night = find_night(input_dir, ds)
        outcome, trace, batch = reassemble_one(con, night, rollout_id, opts)
        con.execute(sql("explain_calls"), {"ds": ds, "rollout_id": rollout_id})
        ledger = con.fetchall()

    r = outcome.rollout
    lines = [f"rollout {rollout_id} (group {r['group_id']}, slot {r['slot']}), ds={ds}, "
             f"mode {opts.mode}, off-chain policy {opts.offchain}; published by run {run_id}",
             _ledger_line(ledger),
             f"output: {len(r['generated_items'] or [])} generated items, "
             f"{len(r['model_items'] or [])} model-authored (NeMo Gym fingerprint evidence)"]
    lines += trace
    if outcome.ok:
        k = len(outcome.segments)
        on_chain = {c.model_call_id for s in outcome.segments for c in s.calls}
        off = [cid for cid, _, _ in ledger if cid not in on_chain]
        for i, seg in enumerate(outcome.segments):
            rows = seg.token_rows
            lines.append(f"row {rollout_id}_s{i}: calls [{', '.join(c.model_call_id for c in seg.calls)}], "
                         f"{int(batch.n_ids[rows].sum())} tokens, {int(batch.ones[rows].sum())} generated, "
                         f"prompt_len {int(batch.zeros[rows[0]])}")
        lines.append(f"off-chain: {', '.join(off) if off else 'none'} "
                     f"({outcome.n_offchain_faults} faulty)")
        lines.append(f"result: ok, {k} row{'s' if k != 1 else ''}, rollout_weight {1 / k:g}, "
                     f"advantage {advantage}")
    else:
        at = f" at call {outcome.failed_call_id}" if outcome.failed_call_id else ""
        lines.append(f"result: masked, {outcome.reason.value}{at}: {outcome.detail}")
        lines.append(f"  ({outcome.reason.value}: {DESCRIPTIONS[outcome.reason]})")
    if (status == "ok") != outcome.ok or (reason or None) != (outcome.reason.value if outcome.reason else None):
        lines.append(f"warning: the published audit row says {status} {reason or ''}; "
                     "the input changed since it was built")
    return "\n".join(lines)
