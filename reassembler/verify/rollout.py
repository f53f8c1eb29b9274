"""One rollout, all or nothing: rollout checks, then select -> cut -> finalize (or the
terminal walk), then the off-chain policy (CONTRACT.md 3.0 - 3.5).

`reassemble_rollout` never raises for bad data: the first failing check becomes the
outcome's reason, and the outcome carries the verified segments only when every check
passed.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from ..formats.verifiers_graph import branch, context_call, row_context
from ..reasons import Masked, Reason
from ..settings import Options
from .calls import Call
from .cut import cut_chains
from .finalize import Segment, finalize_chain, walk_to_root
from .select import select_calls


@dataclass
class Outcome:
    rollout: dict
    n_ledger_calls: int
    n_roots: int
    reason: Reason | None = None
    detail: str | None = None
    failed_call_id: str | None = None
    n_selected: int | None = None
    n_offchain: int | None = None
    n_offchain_faults: int | None = None
    segments: list[Segment] = field(default_factory=list)
    advantage: float | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


def _parent(by_id: dict[str, Call], node: int) -> int | None:
    """A verifiers node's parent, from its derived call (parent_call_id: the parent's index)."""
    parent = by_id[str(node)].parent_call_id
    return None if parent is None else int(parent)


def _line_checks(rollout: dict) -> None:
    """CONTRACT.md 3.0 items 1 and 2, then the capture's own checks the load made (9, 10, 11).
    `failure_reason` masks only without a usable reward: beside a finite one it is NeMo
    Gym's diagnosis of a sample it still measured validly, kept in the audit's metadata."""
    if rollout["failure_reason"] is not None and rollout["reward"] is None:
        raise Masked(Reason.ROLLOUT_FAILED, rollout["failure_reason"])
    if rollout["reward"] is None:
        raise Masked(Reason.INVALID_REWARD, rollout.get("reward_problem") or "reward is missing")
    if rollout.get("capture_reason") is not None:  # the checks of NeMo Gym's own capture (CONTRACT.md 9)
        raise Masked(Reason(rollout["capture_reason"]), rollout.get("capture_detail"), rollout.get("capture_call_id"))


def _rollout_checks(rollout: dict, calls: list[Call], options: Options) -> None:
    _line_checks(rollout)
    if rollout.get("capture") == "rebuilt":
        return  # a Gym-rebuilt line: the load checked it (9.10), its calls are its token items
    if rollout.get("n_rejected"):
        # Choice (README): a ledger line of this rollout could not be read, so its lineage
        # is incomplete; it is masked rather than built from the remaining calls.
        raise Masked(
            Reason.INVALID_RECORD, f"{rollout['n_rejected']} ledger rows rejected; first: {rollout['first_rejected']}"
        )
    if not calls:
        raise Masked(Reason.EMPTY_LEDGER, "no ledger row carries this rollout_id")
    dups = [cid for cid, n in Counter(c.model_call_id for c in calls).items() if n > 1]
    if dups:
        raise Masked(Reason.DUPLICATE_CALL_ID, "model_call_id seen more than once: " + ", ".join(dups))
    if options.offchain == "strict":
        poison = [c for c in calls if c.is_poison]
        if poison:
            raise Masked(
                Reason.CAPTURE_POISONED,
                "poison rows: " + ", ".join(f"{c.model_call_id} ({c.failure_reason})" for c in poison),
            )


def declared_terminal(rollout: dict, calls: list[Call]) -> tuple[str, ...] | None:
    """The call(s) the rollout declares as its terminal (CONTRACT.md 2.1), or None:
    `terminal_model_call_id` when given; else the rows whose `response_id` is the
    rollout's `response.id` (poison rows included): none of them means no declaration."""
    if rollout.get("terminal_model_call_id") is not None:
        return (rollout["terminal_model_call_id"],)
    response_id = rollout.get("terminal_response_id")
    if response_id is None:
        return None
    return tuple(c.model_call_id for c in calls if c.response_id == response_id) or None


def _terminal_chain(rollout: dict, calls: list[Call], by_id: dict[str, Call], n_roots: int) -> list[Call]:
    declared = declared_terminal(rollout, calls)
    if declared is not None:
        if len(declared) > 1:
            raise Masked(
                Reason.MISSING_TERMINAL,
                f"response id {rollout.get('terminal_response_id')} names {len(declared)} calls: "
                + ", ".join(declared),
            )
        leaf = by_id.get(declared[0])
        if leaf is None or leaf.is_poison:
            raise Masked(
                Reason.MISSING_TERMINAL,
                f"declared terminal {declared[0]} is {'a poison row' if leaf else 'not in the ledger'}",
                declared[0],
            )
    else:
        if calls and calls[-1].is_poison:
            raise Masked(
                Reason.MISSING_TERMINAL,
                f"the last ledger row in capture order, {calls[-1].model_call_id}, is a poison row: "
                "the call that ended the rollout was not captured",
                calls[-1].model_call_id,
            )
        leaf = next((c for c in reversed(calls) if not c.is_poison), None)
        if leaf is None:
            raise Masked(Reason.MISSING_TERMINAL, "no terminal declared and no non-poison call")
    walk = walk_to_root(leaf, by_id)
    if n_roots > 1:
        raise Masked(Reason.HISTORY_REWRITTEN, f"the ledger holds {n_roots} roots", leaf.model_call_id)
    # Ordinary capture rebuilds the row from the walked calls in capture order;
    # finalize then checks that the lineage agrees with it (order_mismatch otherwise).
    return sorted(walk, key=lambda c: c.capture_seq)


def reassemble_rollout(
    rollout: dict, calls: list[Call], checks, options: Options = Options(), trace: list[str] | None = None
) -> Outcome:
    """`calls`: the rollout's ledger rows in capture order; `checks`: the verdicts of their
    batch (checks.BatchChecks)."""
    if rollout.get("capture") == "rebuilt":
        return _rebuilt(rollout, [c for c in calls if c.capture == "rebuilt"], checks, options, trace)
    if rollout.get("capture") in ("verifiers", "envelope", "art"):
        return _derived_rows(rollout, [c for c in calls if c.capture == rollout["capture"]], checks, options, trace)
    out = Outcome(rollout, n_ledger_calls=len(calls), n_roots=sum(c.is_root for c in calls))
    try:
        _rollout_checks(rollout, calls, options)
        by_id = {c.model_call_id: c for c in calls}
        if options.mode == "select":
            selected = select_calls(rollout, calls, declared_terminal(rollout, calls), trace)
            out.n_selected = len(selected)
            chains = cut_chains(selected, trace)
        else:
            chain = _terminal_chain(rollout, calls, by_id, out.n_roots)
            out.n_selected = len(chain)
            chains = [chain]
            if trace is not None:
                trace.append(
                    "terminal: leaf "
                    + chain[-1].model_call_id
                    + ", one chain ["
                    + ", ".join(c.model_call_id for c in chain)
                    + "]"
                )
        on_chain = {id(c) for chain in chains for c in chain}
        offchain = [c for c in calls if id(c) not in on_chain]
        out.n_offchain = len(offchain)
        out.n_offchain_faults = sum(checks.record_fault(c) is not None for c in offchain)
        segments = [finalize_chain(chain, by_id, checks, trace) for chain in chains]
        if options.offchain == "strict":
            for c in offchain:
                if checks.record_fault(c) is not None:
                    raise checks.record_fault(c)  # no local name: see checks._raise
        out.segments = segments
    except Masked as m:
        out.reason, out.detail, out.failed_call_id = m.reason, m.detail, m.call_id
        out.segments = []
    return out


def _rebuilt(rollout: dict, items: list[Call], checks, options: Options, trace: list[str] | None) -> Outcome:
    """A Gym-rebuilt line (CONTRACT.md 9.10): one row, its token items end to end, in both
    modes; the load made its checks. Audit: no ledger calls, no roots, nothing off-chain."""
    out = Outcome(rollout, n_ledger_calls=0, n_roots=0)
    try:
        _rollout_checks(rollout, items, options)
        out.n_selected, out.n_offchain, out.n_offchain_faults = rollout.get("n_token_items") or len(items), 0, 0
        for call in items:
            checks.record(call)
        if trace is not None:
            trace.append(f"Gym-rebuilt line: one row from its {len(items)} token items")
        out.segments = [Segment(items, call_ids=[])]  # its items are no calls of Gym's
    except Masked as m:
        out.reason, out.detail, out.failed_call_id = m.reason, m.detail, m.call_id
        out.segments = []
    return out


def _derived_rows(rollout: dict, calls: list[Call], checks, options: Options, trace: list[str] | None) -> Outcome:
    """A verifiers trace (CONTRACT.md 10) or a NeMo Gym compaction envelope (11): the load
    made its checks and found its rows (`trace`: the shape it stored, each row a path of
    derived calls root to leaf); the calls are the nodes (verifiers) or model calls (envelope)
    on them, each with its token row. Terminal mode keeps a rollout of one row and masks one
    of several history_rewritten."""
    shape = json.loads(rollout["trace"]) if rollout.get("trace") else {}
    art = rollout.get("capture") == "art"  # OpenPipe ART (13): a row is one derived call, the branch's tokens
    envelope = rollout.get("capture") == "envelope" or art
    if art:
        out = Outcome(rollout, n_ledger_calls=shape.get("calls", 0), n_roots=shape.get("roots", 0))
    elif envelope:
        out = Outcome(rollout, n_ledger_calls=shape.get("calls", 0), n_roots=shape.get("segments", 0))
    else:
        out = Outcome(rollout, n_ledger_calls=shape.get("sampled", 0), n_roots=shape.get("roots", 0))
    try:
        if envelope and not art:
            _line_checks(rollout)  # 11.4 checks 1 and 2 are the rollout's, then the envelope's
        elif rollout.get("capture_reason") is not None:  # a verifiers trace's, an ART trajectory's (13.4)
            raise Masked(
                Reason(rollout["capture_reason"]), rollout.get("capture_detail"), rollout.get("capture_call_id")
            )
        rows = shape["rows"] if envelope or "rows" in shape else shape["leaves"]  # "rows": a trace stored before 10
        if options.mode == "terminal" and len(rows) > 1:
            raise Masked(
                Reason.HISTORY_REWRITTEN,
                f"the trajectory has {len(rows)} trainable branches (rows)"
                if art
                else f"the envelope declares {len(rows)} segments (rows)"
                if envelope
                else f"the trace has {len(rows)} trainable branches (rows)",
            )
        by_id = {c.model_call_id: c for c in calls}
        policy = shape.get("policy")
        segments = []
        for k, path in enumerate(rows):
            if envelope:
                on_row = [by_id[call] for call in path]
                versions = tuple(policy) if art and policy else None
                segments.append(
                    Segment(
                        on_row, call_ids=shape["call_ids"][k], prompt_len=shape["prompt_lens"][k], versions=versions
                    )
                )
                described = (
                    f"OpenPipe ART: row {k} is branch {k}: calls {', '.join(shape['call_ids'][k])}"
                    if art
                    else f"envelope: row {k} is segment {k}: calls {path} ({', '.join(shape['call_ids'][k])})"
                )
            else:  # a sampled node an earlier row trains is context here: its copy with mask 0 (10.5)
                if "leaves" in shape:  # the row's path follows its nodes' parents from its leaf
                    path = branch(path, lambda node: _parent(by_id, node))
                    context = row_context(k, path, shape["owners"])
                else:
                    context = set(shape["context"][k]) if shape.get("context") else set()
                on_row = [by_id[context_call(node) if node in context else str(node)] for node in path]
                sampled = [str(node) for node in path if by_id[str(node)].mode == "sampled"]
                segments.append(Segment(on_row, call_ids=sampled, versions=tuple(policy) if policy else None))
                described = f"verifiers: row {k} is the branch to leaf {path[-1]}: nodes {path}, sampled {sampled}" + (
                    f"; trained on an earlier row, context here: {sorted(context)}" if context else ""
                )
            for call in on_row:
                checks.record(call)
            if trace is not None:
                trace.append(described)
        out.n_selected = shape["selected"] if art or not envelope else shape["calls"]
        out.n_offchain = out.n_ledger_calls - out.n_selected if art or not envelope else 0
        out.n_offchain_faults = 0
        out.segments = segments
    except Masked as m:
        out.reason, out.detail, out.failed_call_id = m.reason, m.detail, m.call_id
        out.segments = []
    return out
