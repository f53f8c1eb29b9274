"""`reassembler explain`: replay one rollout of a published night, step by step, the way
CONTRACT.md section 7 narrates the worked example."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from .. import call_tables
from ..errors import InputError
from ..formats.fields import CALL, ITEMS, select_list
from ..formats.gym_local import capture_file
from ..formats.night import NightFiles, find_night
from ..load.derived_tokens import derived_tokens
from ..load.gym_capture import derive_again
from ..load.read import token_files
from ..load.shard_plan import CALL_ORDER
from ..load.token_keys import KEYS, key_batches
from ..load.token_store import TokenStore
from ..reasons import DESCRIPTIONS
from ..settings import Options
from ..verify.batch import verify_batch
from ..verify.calls import calls_from_table
from ..verify.replay import ledger_line, selection_lines
from ..verify.rows import prompt_len
from ..warehouse import connect, sql, warehouse_path
from ..wide_sort import sort_rows

# the captures a rollout's own line carries (its calls derived at the load: CONTRACT.md 9.10, 10, 11, 13)
LINE_CAPTURES = ("rebuilt", "verifiers", "envelope", "art")

CAPTURES = {
    "staged": "staged (ledger rows and token rows)",
    "local": "NeMo Gym local mode (<rollout_id>.tokens.jsonl, checked entry by entry at the load)",
    "rebuilt": "a result line NeMo Gym rebuilt itself (its token items; no digest vouches for them)",
    "verifiers": "a verifiers trace (traces.jsonl: its nodes' tokens, masks and log probabilities; no digest)",
    "envelope": "a NeMo Gym compaction-agent line (every call's token items, bound to its evidence record)",
    "art": "an OpenPipe ART trajectory (a row of its Parquet file: its calls' token ids; no digest)",
    "none": "none (no capture of its own)",
}


def _rollouts(con, params: dict) -> list[dict]:
    """The records of sql/shard_rollouts.sql for `params` (one rollout), without its plan_
    columns (the shard plans' buckets: none here), with its items (sql/explain_items.sql)."""
    cur = con.execute(sql("shard_rollouts", buckets=sql("no_buckets"), rejected=sql("ledger_rejected")), params)
    names = [d[0] for d in cur.description]
    records = [{k: v for k, v in zip(names, row) if not k.startswith("plan_")} for row in cur.fetchall()]
    items = call_tables.cursor(con).execute(sql("explain_items"), {k: params[k] for k in ("ds", "rollout_id")})
    found = dict(zip([d[0] for d in items.description], items.fetchone() or ()))
    for record in records:  # the rollout's items: beside the warehouse (call_tables.py)
        record.update({name: found.get(name) for name in ITEMS})
    return records


def ledger_trace(con, ds: str, rollout_id: str) -> list[str]:
    """The trace of one published rollout replayed from the warehouse alone (no token
    reads): its ledger, selection, cut and walks, then the outcome the build recorded. The
    per-call token checks are not rerun here; `explain` reruns everything."""
    records = _rollouts(con, {"ds": ds, "run": None, "shard": None, "rollout_id": rollout_id})
    published = con.execute(sql("explain_audit"), {"ds": ds, "rollout_id": rollout_id}).fetchone()
    if not records or published is None:
        return [f"rollout {rollout_id}: not in the warehouse for ds={ds}"]
    rollout = records[0]
    calls = calls_from_table(
        call_tables.cursor(con)
        .sql(sql("explain_ledger", call_columns=select_list(CALL, "l")), params={"ds": ds, "rollout_id": rollout_id})
        .to_arrow_table()
    )
    status, reason, detail, failed, *_, mode = published[:8]
    lines = [ledger_line([(c.model_call_id, c.parent_call_id, c.failure_reason) for c in calls])]
    if rollout.get("capture") == "verifiers":  # no selection: each trainable branch is a row (CONTRACT.md 10.5)
        shape = json.loads(rollout["trace"] or "{}")
        rows = [f"row {k}: nodes {path}" for k, path in enumerate(shape.get("rows") or [])] + [
            f"row {k}: the branch to leaf {leaf}" for k, leaf in enumerate(shape.get("leaves") or [])
        ]
        lines = [f"verifiers trace: {shape.get('sampled', 0)} sampled nodes, {shape.get('roots', 0)} roots"]
        lines += rows
    elif rollout.get("capture") == "art":  # one row per trained branch (CONTRACT.md 13.5)
        shape = json.loads(rollout["trace"] or "{}")
        lines = [
            f"OpenPipe ART trajectory (row {_line(rollout)}): {shape.get('calls', 0)} sampled calls of the "
            f"training model, {len(shape.get('call_ids') or [])} branches train"
        ]
        lines += [f"row {k}: branch of calls {', '.join(ids)}" for k, ids in enumerate(shape.get("call_ids") or [])]
    elif rollout.get("capture") == "envelope":  # one row per declared segment (CONTRACT.md 11.5)
        shape = json.loads(rollout["trace"] or "{}")
        lines = [f"{shape.get('envelope')}: {shape.get('calls', 0)} calls, line {_line(rollout)}"]
        lines += [f"row {k}: calls {ids}" for k, ids in enumerate(shape.get("call_ids") or [])]
    elif mode != "terminal" and calls and not rollout["failure_reason"] and rollout["reward"] is not None:
        lines += selection_lines(rollout, calls)
    at = f" at call {failed}" if failed else ""
    lines.append(f"result (as built): {status}" + (f", {reason}{at}: {detail}" if reason else ""))
    return lines


def _line(rollout: dict) -> str:
    return f"{rollout.get('source_file')}:{rollout.get('source_line')}"


def _evidence(night: NightFiles, rollout: dict, failed: dict | None) -> list[str]:
    """Where an engineer looks for a masked rollout's failure, most specific first: the
    failing call's line (its ledger row, its local-mode entry, the line of a derived call),
    NeMo Gym's capture files of the rollout when a capture check masked it without naming a
    call, and the rollout's own line (its result line, Episode line, or failures row)."""
    out = []
    if failed is not None and failed.get("source_file"):
        kind = "rollouts" if failed.get("capture") in LINE_CAPTURES else "ledger"
        what = {"ledger": "the failing call's line", "rollouts": "the line holding the failing call"}[kind]
        if failed.get("capture") == "local":
            what = "the failing call's local-mode entry"
        out.append(f"{night.path(kind, failed['source_file'])}:{failed['source_line']} ({what})")
    if (
        failed is None
        and rollout.get("capture") == "local"
        or rollout.get("capture_reason")
        in (
            "mixed_capture",
            "capture_incomplete",
            "capture_retired",
        )
    ):
        files = [rel for rel in night.captures if (capture_file(rel) or ("",))[0] == rollout["rollout_id"]]
        out += [f"{night.path('ledger', rel)} (NeMo Gym's capture file of the rollout)" for rel in files]
    if rollout.get("source_file"):
        out.append(f"{night.path('rollouts', rollout['source_file'])}:{rollout['source_line']} (the rollout's line)")
    return out


def rerun(con, night: NightFiles, rollout_id: str, options: Options):
    """One rollout rerun through verification (verify.batch) on the night's files as they
    are now: (outcome or None, the trace of its steps, its token batch)."""
    params = {"ds": night.ds, "run": None, "shard": None, "rollout_id": rollout_id}
    rollouts = _rollouts(con, params)
    if not rollouts:
        return None, [], None
    derived = rollouts[0].get("capture") in ("local", *LINE_CAPTURES)  # at the load (9-11, 13)
    cursor = call_tables.cursor(con)
    if not derived:  # the keys of the night's token files as they are now (the token lists unread)
        files = token_files(night)
        cursor.register(
            "explain_tokens", pa.RecordBatchReader.from_batches(KEYS, key_batches(files.locations, files.skip))
        )
    table = cursor.sql(
        sql(
            "shard_calls",
            tokens=sql("token_empty") if derived else "SELECT * FROM explain_tokens",
            call_columns=select_list(CALL, "l"),
            buckets=sql("no_buckets"),
        ),
        params={k: v for k, v in params.items() if k != "run"},
    ).to_arrow_table()
    table = sort_rows(table, CALL_ORDER)
    walk: list[str] = []
    if derived:
        rows, walk = derive_again(night, rollouts[0])
        table, tokens = derived_tokens(table, rows)
    else:
        tokens = TokenStore().fetch(table.column("t_file"), table.column("t_row"))
    trace: dict[str, list[str]] = {}
    outcomes, batch = verify_batch(rollouts, table, tokens, options, trace)
    return outcomes[0], walk + trace.get(rollout_id, []), batch


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
            ledger_line([(c["model_call_id"], c["parent_call_id"], c["failure_reason"]) for c in self.ledger]),
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
            lines += [f"  open: {where}" for where in res.get("evidence") or []]
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


def explain(output_dir, ds: str, rollout_id: str, warehouse=None) -> Replay:
    with connect(output_dir, read_only=True, database=warehouse) as con:
        published = con.execute(sql("explain_audit"), {"ds": ds, "rollout_id": rollout_id}).fetchone()
        if published is None:
            raise InputError(
                f"{warehouse_path(output_dir, warehouse)}: no published audit row for rollout {rollout_id} on ds={ds}"
            )
        status, reason, detail, failed, advantage, run_id, input_dir, mode, offchain, options = published
        opts = Options(**json.loads(options)) if options else Options()
        night = find_night(input_dir, ds)
        outcome, trace, batch = rerun(con, night, rollout_id, opts)
        if outcome is None or batch is None:  # the audit row is kept for good, the per-call tables are not
            raise InputError(
                f"rollout {rollout_id} of ds={ds} is no longer in the warehouse's per-call tables "
                "(past the retention); its audit row is all that is kept"
            )
        cur = con.execute(sql("explain_calls"), {"ds": ds, "rollout_id": rollout_id})
        names = [d[0] for d in cur.description]
        ledger = [dict(zip(names, row)) for row in cur.fetchall()]

    r = outcome.rollout
    output = (
        f"output: {len(r['generated_items'] or [])} generated items, "
        f"{len(r['model_items'] or [])} model-authored (NeMo Gym fingerprint evidence)\n"
        if r.get("capture") not in ("verifiers", "art")  # no output to select by: the branches are the rows
        else ""
    )
    line = f", line {_line(r)}" if r.get("capture") in LINE_CAPTURES else ""
    header = (
        f"rollout {rollout_id} (group {r['group_id']}, slot {r['slot']}), ds={ds}, mode {opts.mode}, "
        f"off-chain policy {opts.offchain}; published by run {run_id}\n"
        f"{output}capture: {CAPTURES.get(r.get('capture') or '', r.get('capture'))}{line}"
    )
    replay = Replay(rollout_id, ds, header, ledger, trace, {})
    if outcome.ok:
        on_chain = {c.model_call_id for s in outcome.segments for c in s.calls}
        for i, seg in enumerate(outcome.segments):
            rows = seg.token_rows
            replay.rows.append(
                {
                    "row_id": f"{rollout_id}_s{i}",
                    # the row's model_call_ids: a verifiers branch's sampled nodes, an envelope's completion ids
                    "calls": seg.call_ids if seg.call_ids is not None else [c.model_call_id for c in seg.calls],
                    "tokens": int(batch.n_ids[rows].sum()),
                    "generated": int(batch.ones[rows].sum()),
                    "prompt_len": seg.prompt_len if seg.prompt_len is not None else prompt_len(batch, rows),
                }
            )
        offchain = [c["model_call_id"] for c in ledger if c["model_call_id"] not in on_chain]
        if r.get("capture") == "verifiers":  # its sampled nodes on no row (no call of the ledger's)
            offchain = [str(node) for node in json.loads(r["trace"])["offchain"]]
        replay.result = {
            "status": "ok",
            "advantage": advantage,
            "offchain_faults": outcome.n_offchain_faults,
            "offchain": offchain,
        }
    else:
        failed = next((c for c in ledger if c["model_call_id"] == outcome.failed_call_id), None)
        source = f"{failed['source_file']}:{failed['source_line']}" if failed and failed["source_file"] else None
        assert outcome.reason is not None
        replay.result = {
            "status": "masked",
            "reason": outcome.reason.value,
            "detail": outcome.detail,
            "failed_call_id": outcome.failed_call_id,
            "meaning": DESCRIPTIONS[outcome.reason],
            "failed_call_source": f"ledger/ds={ds}/{source}" if source and failed and not failed["capture"] else None,
            "evidence": _evidence(night, r, failed),
        }
    if (status == "ok") != outcome.ok or (reason or None) != (outcome.reason.value if outcome.reason else None):
        replay.warnings.append(
            f"the published audit row says {status} {reason or ''}; the input changed since it was built"
        )
    return replay
