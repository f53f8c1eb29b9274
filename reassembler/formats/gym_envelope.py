"""A result line written by NeMo Gym 0.7.0's compaction agent (CONTRACT.md 11).

`simple_agent_with_compaction` keeps every model call's token arrays in the line's
`response.output` (the **token items**: `prompt_token_ids`, `generation_token_ids`,
`generation_log_probs` on the call's last output item) and, per call, one **evidence
record** (`response.model_call_metadata`, or `completion_evidence` in a version-2 line)
holding the call's identity, its segment and, in version 3, `generation_evidence_digest`:
the SHA-256 Gym computed over the call's three arrays when it captured the call. Each
rewrite of the context is declared by a boundary event (`response.boundary_events`) and by
the call that starts the new segment (`expected_append_compatible: false`,
`compaction_event_id`). A `context_compaction_contract` (or, after 0.7.0,
`rollout_trace_contract`) closes the response.

A line is an **envelope line** when its `response` holds either contract key with a value
that is not null (11.2); it is read here whatever other capture its rollout id has.

Invariants held, in the contract's order (11.4), the first failure masking the rollout:
the producer did not exclude the sample; the contract is a version read here; the envelope
has its shape; the producer admits it to training; token items and evidence records pair
up one to one; then each call's checks in call order, and one row per segment that holds an
eligible call (11.5): gym_envelope_calls.py.

Nothing here touches the warehouse; numpy is imported where the token lists are read (the
rollout parse's child processes import this module).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..reasons import Reason
from .gym_envelope_calls import (  # the calls' checks and rows, and the names callers take from here
    EnvelopeRollout,
    _is_int,
    _Masked,
    _read_calls,
    _text,
    canonical_digest,
)
from .gym_rebuilt import TOKEN_KEY, token_items

__all__ = [
    "CAPTURE",
    "CONTRACT_KEYS",
    "EnvelopeRollout",
    "canonical_digest",
    "contract_of",
    "describe",
    "read_envelope",
]

if TYPE_CHECKING:
    pass

COMPACTION_CONTRACT = "context_compaction_contract"  # Gym 0.7.0 (session.py:69-81)
TRACE_CONTRACT = "rollout_trace_contract"  # Gym after 0.7.0 (PR #2870), no version or mode
CONTRACT_KEYS = (COMPACTION_CONTRACT, TRACE_CONTRACT)
VERSIONS = (2, 3)  # schema_version of context_compaction_contract (session.py:59, :74)
MODE = "exact_trace_authority"
# the identity gaps Gym 0.7.0 always declares (session.py:231-243): they say the generation
# server reported no tokenizer, template or processor identity; the rows carry the token ids
# as recorded and never re-tokenize, so they do not bear on a row (CONTRACT.md 11.4 check 6)
IDENTITY_GAPS = frozenset(
    {
        "exact_tokenizer_identity_not_reported_by_generation_server",
        "exact_chat_template_identity_not_reported_by_generation_server",
        "exact_multimodal_processor_fingerprint_not_reported_by_generation_server",
    }
)
CAPTURE = "envelope"  # the rollouts' and their derived calls' capture kind


def contract_of(obj) -> tuple[str, Any] | None:
    """(key, value) of the line's contract when it is an envelope line (11.2.1), else None.
    With both keys set the first is named (check 4 masks such a line)."""
    response = obj.get("response") if isinstance(obj, dict) else None
    if not isinstance(response, dict):
        return None
    for key in CONTRACT_KEYS:
        if response.get(key) is not None:
            return key, response[key]
    return None


def read_envelope(obj: dict) -> EnvelopeRollout:
    """The checks of CONTRACT.md 11.4 from check 3 on (checks 1 and 2, the failure and the
    reward, are the rollout's, verify/rollout.py), then the rows of 11.5."""
    found = contract_of(obj)
    assert found is not None, "read_envelope is for envelope lines"
    key, contract = found[0], found[1]
    version = contract.get("schema_version") if isinstance(contract, dict) else None
    kind = key if key == TRACE_CONTRACT else f"{key} v{json.dumps(version)[:20]}"
    v2 = key == COMPACTION_CONTRACT and _is_int(version) and version == 2
    out = EnvelopeRollout(kind, "none" if v2 else "digest")
    response = obj["response"]
    evidence_key = "completion_evidence" if v2 else "model_call_metadata"
    records = response.get(evidence_key)
    out.n_calls = len(records) if isinstance(records, list) else 0
    out.metadata = _metadata(obj, key, contract)
    try:
        if obj.get("mask_sample") is True:  # check 3
            diagnosis = {"failure_kind": obj.get("failure_kind"), "failure_reason": obj.get("failure_reason")}
            raise _Masked(Reason.PRODUCER_MASKED, json.dumps(diagnosis, sort_keys=True, separators=(",", ":")))
        _check_version(response, key, contract)  # check 4
        events = _check_envelope(response, contract, records, evidence_key)  # check 5
        _check_admission(contract)  # check 6
        _read_calls(response, contract, records, events, v2, out)  # checks 7-10
    except _Masked as m:
        out.reason, out.detail, out.call_id = m.reason, m.detail, m.call_id
        out.rows, out.calls, out.prompt_lens = [], {}, []
    return out


def _metadata(obj: dict, key: str, contract) -> dict:
    """11.6's suggested audit metadata: the envelope field and version, the generation
    contract's id and admission, verification_skipped, the boundary events, the policy."""
    response = obj["response"]
    generation = contract.get("generation_contract") if isinstance(contract, dict) else None
    generation = generation if isinstance(generation, dict) else {}
    events = response.get("boundary_events")
    policy = response.get("final_policy_decision")
    out = {
        "envelope": key,
        "envelope_version": contract.get("schema_version") if isinstance(contract, dict) else None,
        "generation_contract_id": generation.get("generation_contract_id"),
        "training_eligible": generation.get("training_eligible"),
        "incomplete_reasons": generation.get("incomplete_reasons"),
        "boundary_events": [e.get("event_id") for e in events if isinstance(e, dict)]
        if isinstance(events, list)
        else None,
        "policy": policy.get("policy_name") if isinstance(policy, dict) else None,
    }
    if obj.get("verification_skipped") is True:
        out["verification_skipped"] = True
    return out


def _check_version(response: dict, key: str, contract) -> None:
    if all(response.get(k) is not None for k in CONTRACT_KEYS):
        raise _Masked(Reason.UNSUPPORTED_VERSION, f"the response holds both {COMPACTION_CONTRACT} and {TRACE_CONTRACT}")
    if not isinstance(contract, dict):
        raise _Masked(Reason.UNSUPPORTED_VERSION, f"{key} is a {type(contract).__name__}, not an object")
    if key == COMPACTION_CONTRACT:
        version, mode = contract.get("schema_version"), contract.get("mode")
        if not (_is_int(version) and version in VERSIONS):
            raise _Masked(
                Reason.UNSUPPORTED_VERSION, f"{key} schema_version {json.dumps(version)[:40]}, expected 2 or 3"
            )
        if mode != MODE:
            raise _Masked(Reason.UNSUPPORTED_VERSION, f"{key} mode {json.dumps(mode)[:60]}, expected {MODE}")


def _check_envelope(response: dict, contract: dict, records, evidence_key: str) -> dict[int, str]:
    """Check 5; returns the boundary events' ids by the step they apply to."""

    def bad(what: str) -> _Masked:
        return _Masked(Reason.INVALID_RECORD, what)

    if not _text(contract.get("rollout_id")):
        raise bad("the contract's rollout_id is not a non-empty string")
    generation = contract.get("generation_contract")
    if not isinstance(generation, dict):
        raise bad("generation_contract is not an object")
    if not _text(generation.get("generation_contract_id")):
        raise bad("generation_contract_id is not a non-empty string")
    eligible = generation.get("training_eligible", False)
    if not isinstance(eligible, bool):
        raise bad(f"training_eligible {json.dumps(eligible)[:40]} is not a boolean")
    reasons = generation.get("incomplete_reasons", [])
    if not (isinstance(reasons, list) and all(isinstance(r, str) for r in reasons)):
        raise bad("incomplete_reasons is not an array of strings")
    if eligible and reasons:
        raise bad("training_eligible is true beside incomplete_reasons")
    if not isinstance(records, list):
        raise bad(f"{evidence_key} is not an array")
    events = response.get("boundary_events", [])
    if not isinstance(events, list):
        raise bad("boundary_events is not an array")
    by_step: dict[int, str] = {}
    ids: set[str] = set()
    for i, event in enumerate(events):
        if not (isinstance(event, dict) and _text(event.get("event_id")) and _is_int(event.get("applies_to_step"))):
            raise bad(f"boundary event {i} is not an object with a string event_id and an integer applies_to_step")
        if event["event_id"] in ids:
            raise bad(f"boundary event id {event['event_id']} appears twice")
        if event["applies_to_step"] in by_step:
            raise bad(f"two boundary events apply to step {event['applies_to_step']}")
        ids.add(event["event_id"])
        by_step[event["applies_to_step"]] = event["event_id"]
    return by_step


def _check_admission(contract: dict) -> None:
    generation = contract["generation_contract"]
    if generation.get("training_eligible", False) is True:
        return
    reasons = generation.get("incomplete_reasons", [])
    if reasons and set(reasons) <= IDENTITY_GAPS:
        return
    raise _Masked(
        Reason.PRODUCER_MASKED, "training_eligible false: " + (", ".join(reasons) if reasons else "no reason given")
    )


def describe(obj, rollout: EnvelopeRollout) -> list[str]:
    """An envelope line walked call by call for `reassembler explain`: each call's step,
    segment, eligibility and tokens, each boundary event and the call it starts, and which
    calls became which row."""
    response = obj.get("response") if isinstance(obj, dict) else None
    response = response if isinstance(response, dict) else {}
    lines = [f"NeMo Gym compaction envelope ({rollout.kind}; evidence: {rollout.evidence})"]
    events = response.get("boundary_events")
    for event in events if isinstance(events, list) else ():
        if isinstance(event, dict):
            lines.append(
                f"  boundary event {event.get('event_id')} applies to step {event.get('applies_to_step')}"
                + (f" ({event.get('policy_name')})" if event.get("policy_name") else "")
            )
    output = response.get("output")
    items = [i for i, _ in token_items(output)] if isinstance(output, list) else []
    records = response.get("completion_evidence" if rollout.evidence == "none" else "model_call_metadata")
    records = records if isinstance(records, list) else []
    for k in range(max(len(items), len(records))):
        record = records[k] if k < len(records) and isinstance(records[k], dict) else {}
        where = f"output item {items[k]}" if k < len(items) else "no output item"
        item = output[items[k]] if isinstance(output, list) and k < len(items) else {}
        g = item.get(TOKEN_KEY) if isinstance(item, dict) else None
        p = item.get("prompt_token_ids") if isinstance(item, dict) else None
        lines.append(
            f"  call {k} ({where}): {record.get('completion_id')}, step {record.get('turn_id')}, "
            f"segment {record.get('segment_index')}"
            + (", appends" if record.get("expected_append_compatible") is True else ", starts a segment")
            + (f" under {record['compaction_event_id']}" if record.get("compaction_event_id") else "")
            + f", {len(p) if isinstance(p, list) else '?'} prompt + {len(g) if isinstance(g, list) else '?'} "
            f"generated tokens" + ("" if record.get("eligible", True) is not False else ", not eligible")
        )
    if rollout.reason is not None:
        lines.append(f"  masked {rollout.reason.value}: {rollout.detail}")
    for k, row in enumerate(rollout.rows):
        lines.append(f"  row _s{k}: calls {row} (" + ", ".join(rollout.calls[c].completion_id for c in row) + ")")
    return lines
