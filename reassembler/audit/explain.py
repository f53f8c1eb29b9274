"""`reassembler explain`: replay one rollout of a published night, step by step, the way
CONTRACT.md section 7 narrates the worked example."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import InputError
from ..formats.fields import CALL, select_list
from ..formats.night import find_night
from ..reasons import DESCRIPTIONS
from ..settings import Options
from ..verify.select import select_calls
from ..verify.shard import reassemble_one
from ..warehouse import connect, sql


def _ledger_line(ledger) -> str:
    if not ledger:
        return "ledger: no calls"
    return f"ledger: {len(ledger)} calls in capture order: " + ", ".join(
        f"{cid} ({'poison: ' + fr if fr else 'root' if parent is None else 'parent ' + parent})"
        for cid, parent, fr in ledger
    )


def ledger_trace(con, ds: str, rollout_id: str) -> list[str]:
    """The trace of one published rollout replayed from the warehouse alone (no token
    reads): its ledger, selection, cut and walks, then the outcome the build recorded. The
    per-call token checks are not rerun here; `reassembler explain` reruns everything."""
    from ..reasons import Masked
    from ..verify.calls import calls_from_table
    from ..verify.cut import cut_chains
    from ..verify.finalize import walk_to_root
    from ..verify.rollout import declared_terminal

    params = {"ds": ds, "shard": None, "rollout_id": rollout_id}
    cur = con.execute(sql("shard_rollouts"), params)
    names = [d[0] for d in cur.description]
    records = [dict(zip(names, row)) for row in cur.fetchall()]
    published = con.execute(sql("explain_audit"), {"ds": ds, "rollout_id": rollout_id}).fetchone()
    if not records or published is None:
        return [f"rollout {rollout_id}: not in the warehouse for ds={ds}"]
    rollout = records[0]
    calls = calls_from_table(
        con.cursor()
        .sql(sql("explain_ledger", call_columns=select_list(CALL, "l")), params={"ds": ds, "rollout_id": rollout_id})
        .to_arrow_table()
    )
    status, reason, detail, failed, *_, mode = published[:8]
    lines = [_ledger_line([(c.model_call_id, c.parent_call_id, c.failure_reason) for c in calls])]
    if mode != "terminal" and calls and not rollout["failure_reason"] and rollout["reward"] is not None:
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
    at = f" at call {failed}" if failed else ""
    lines.append(f"result (as built): {status}" + (f", {reason}{at}: {detail}" if reason else ""))
    return lines


@dataclass
class Replay:
    """One rollout replayed: the steps of CONTRACT.md section 7, each printed once."""

    rollout_id: str
    ds: str
    header: str
    ledger: list[dict]
    steps: list[str]
    result: dict
    rows: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        lines = [
            self.header,
            _ledger_line([(c["model_call_id"], c["parent_call_id"], c["failure_reason"]) for c in self.ledger]),
        ]
        lines += self.steps
        lines += [
            f"row {r['row_id']}: calls [{', '.join(r['calls'])}], {r['tokens']} tokens, "
            f"{r['generated']} generated, prompt_len {r['prompt_len']}"
            for r in self.rows
        ]
        res = self.result
        if res["status"] == "ok":
            lines.append(f"off-chain: {', '.join(res['offchain']) or 'none'} ({res['offchain_faults']} faulty)")
            k = len(self.rows)
            lines.append(
                f"result: ok, {k} row{'s' if k != 1 else ''}, rollout_weight {1 / k:g}, advantage {res['advantage']}"
            )
        else:
            at = f" at call {res['failed_call_id']}" if res["failed_call_id"] else ""
            lines.append(f"result: masked, {res['reason']}{at}: {res['detail']}")
            lines.append(f"  ({res['reason']}: {res['meaning']})")
            if res.get("failed_call_source"):
                lines.append(f"  the failing call's ledger row: {res['failed_call_source']}")
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


def explain(output_dir, ds: str, rollout_id: str) -> Replay:
    with connect(output_dir, read_only=True) as con:
        published = con.execute(sql("explain_audit"), {"ds": ds, "rollout_id": rollout_id}).fetchone()
        if published is None:
            raise InputError(
                f"{Path(output_dir) / 'warehouse.duckdb'}: no published audit row for rollout {rollout_id} on ds={ds}"
            )
        status, reason, detail, failed, advantage, run_id, input_dir, mode, offchain, options = published
        opts = Options(**json.loads(options)) if options else Options()
        night = find_night(input_dir, ds)
        outcome, trace, batch = reassemble_one(con, night, rollout_id, opts)
        if outcome is None or batch is None:  # the audit row is kept for good, the per-call tables are not
            raise InputError(
                f"rollout {rollout_id} of ds={ds} is no longer in the warehouse's per-call tables "
                "(past the retention); its audit row is all that is kept"
            )
        cur = con.execute(sql("explain_calls"), {"ds": ds, "rollout_id": rollout_id})
        names = [d[0] for d in cur.description]
        ledger = [dict(zip(names, row)) for row in cur.fetchall()]

    r = outcome.rollout
    header = (
        f"rollout {rollout_id} (group {r['group_id']}, slot {r['slot']}), ds={ds}, mode {opts.mode}, "
        f"off-chain policy {opts.offchain}; published by run {run_id}\n"
        f"output: {len(r['generated_items'] or [])} generated items, "
        f"{len(r['model_items'] or [])} model-authored (NeMo Gym fingerprint evidence)"
    )
    replay = Replay(rollout_id, ds, header, ledger, trace, {})
    if outcome.ok:
        on_chain = {c.model_call_id for s in outcome.segments for c in s.calls}
        for i, seg in enumerate(outcome.segments):
            rows = seg.token_rows
            replay.rows.append(
                {
                    "row_id": f"{rollout_id}_s{i}",
                    "calls": [c.model_call_id for c in seg.calls],
                    "tokens": int(batch.n_ids[rows].sum()),
                    "generated": int(batch.ones[rows].sum()),
                    "prompt_len": int(batch.zeros[rows[0]]),
                }
            )
        replay.result = {
            "status": "ok",
            "advantage": advantage,
            "offchain_faults": outcome.n_offchain_faults,
            "offchain": [c["model_call_id"] for c in ledger if c["model_call_id"] not in on_chain],
        }
    else:
        source = next(
            (f"{c['source_file']}:{c['source_line']}" for c in ledger if c["model_call_id"] == outcome.failed_call_id),
            None,
        )
        assert outcome.reason is not None
        replay.result = {
            "status": "masked",
            "reason": outcome.reason.value,
            "detail": outcome.detail,
            "failed_call_id": outcome.failed_call_id,
            "meaning": DESCRIPTIONS[outcome.reason],
            "failed_call_source": f"ledger/ds={ds}/{source}" if source else None,
        }
    if (status == "ok") != outcome.ok or (reason or None) != (outcome.reason.value if outcome.reason else None):
        replay.warnings.append(
            f"the published audit row says {status} {reason or ''}; the input changed since it was built"
        )
    return replay
