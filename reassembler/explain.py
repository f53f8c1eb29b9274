"""`reassembler explain`: replay one rollout of a published night, step by step, the way
CONTRACT.md section 7 narrates the worked example."""
from __future__ import annotations

import json
from pathlib import Path

from .read import InputError, find_night
from .reasons import DESCRIPTIONS
from .rollout import Options
from .shard import reassemble_one
from .warehouse import connect, sql


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
             f"ledger: {len(ledger)} calls in capture order: " + ", ".join(
                 f"{cid} ({'poison: ' + fr if fr else 'root' if parent is None else 'parent ' + parent})"
                 for cid, parent, fr in ledger) if ledger else "ledger: no calls",
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
