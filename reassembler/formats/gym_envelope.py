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
up one to one; and per call, in call order: its fields have their types, its arrays agree
(lengths, ranges, finite log probabilities <= 0), the digest recomputed from the arrays is
the one Gym recorded, it belongs to the envelope's rollout and generation contract, it
carries no media, the agent's steps run 1, 2, 3 without a gap, and every appending call
extends the previous call exactly while every break is declared by a boundary event (and
no boundary event declares a break that did not happen). Then one row per segment that
holds an eligible call (11.5).

Nothing here touches the warehouse; numpy is imported where the token lists are read (the
rollout parse's child processes import this module).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from ..reasons import Reason
from .gym_rebuilt import TOKEN_KEY, token_items

if TYPE_CHECKING:
    import numpy as np

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
TOKEN_LIMIT = 2**31
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


def canonical_digest(prompt: list, generated: list, logprobs: list) -> str:
    """Gym's `generation_evidence_digest` (session.py:120-126, `canonical_digest` of
    history.py:88-96): lowercase hex SHA-256 of the UTF-8 bytes of
    {"prompt_token_ids":[...],"sampled_logprobs":[...],"sampled_token_ids":[...]} with no
    whitespace, integers in decimal and each log probability as Python's repr(float(x)).
    The lists are encoded by the json module's C encoder: no Python loop per token."""
    if not set(map(type, logprobs)) <= {float}:  # an integer written as such: repr(float(x)); judged in C
        logprobs = [float(x) for x in logprobs]
    text = json.dumps(
        {"prompt_token_ids": prompt, "sampled_logprobs": logprobs, "sampled_token_ids": generated},
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class EnvelopeCall:
    """One call on a row: the tokens it adds to its segment (its carried prompt tokens, mask
    0, then its generation, mask 1 when eligible) as int64 / float32 / float32."""

    index: int  # k
    completion_id: str
    ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray


@dataclass
class EnvelopeRollout:
    """What the checks of 11.4 found in one envelope line; when every check passed, its rows
    (11.5) as the calls of each segment that holds an eligible call."""

    kind: str  # the contract as named in the audit: "context_compaction_contract v3", ...
    evidence: str  # 'digest' (version 3, rollout_trace_contract) or 'none' (version 2): 5.3
    n_calls: int = 0  # evidence records (the audit's n_ledger_calls)
    reason: Reason | None = None
    detail: str | None = None
    call_id: str | None = None  # the completion_id of the call a check names
    rows: list[list[int]] = field(default_factory=list)  # each row's call indices
    calls: dict[int, EnvelopeCall] = field(default_factory=dict)  # the calls on the rows
    prompt_lens: list[int] = field(default_factory=list)  # per row: len(P(c_1))
    metadata: dict = field(default_factory=dict)  # for the audit's metadata (11.6)

    def shape(self) -> dict:
        """What the verification needs besides the calls (stored with the rollout, as a
        verifiers trace's)."""
        return {
            "envelope": self.kind,
            "rows": [[str(k) for k in row] for row in self.rows],
            "call_ids": [[self.calls[k].completion_id for k in row] for row in self.rows],
            "prompt_lens": self.prompt_lens,
            "calls": self.n_calls,
            "segments": len(self.rows),
        }

    @property
    def n_tokens(self) -> int:
        return sum(len(c.ids) for c in self.calls.values())


class _Masked(Exception):
    def __init__(self, reason: Reason, detail: str, call_id: str | None = None):
        super().__init__(detail)
        self.reason, self.detail, self.call_id = reason, detail, call_id


def _is_int(v) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _text(v) -> bool:
    return isinstance(v, str) and bool(v)


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


_INT_TYPES, _NUMBER_TYPES = {int}, {int, float}  # exact types: a JSON boolean is no integer


def _read_calls(response: dict, contract: dict, records: list, events: dict[int, str], v2: bool, out) -> None:
    """Checks 7 to 10, then the rows."""
    import numpy as np

    output = response.get("output")
    items = token_items(output) if isinstance(output, list) else []
    if not items:  # check 7
        raise _Masked(Reason.MISSING_TOKENS, "no output item carries generation_token_ids")
    if len(records) > len(items):
        raise _Masked(
            Reason.MISSING_TOKENS, f"{len(records)} evidence records for {len(items)} output items with token ids"
        )
    if len(items) > len(records):
        index = items[len(records)][0]
        raise _Masked(
            Reason.UNMATCHED_OUTPUT,
            f"output item {index} carries token ids beyond the {len(records)} evidence records",
        )
    rollout_id = contract["rollout_id"]
    generation_id = contract["generation_contract"]["generation_contract_id"]
    started: set[int] = set()  # steps whose call started a segment under a boundary event
    segment_of: list[int] = []
    calls: list[tuple] = []
    previous = None  # (P, G, record) of call k-1
    for k, ((index, item), record) in enumerate(zip(items, records)):
        cid = record.get("completion_id") if isinstance(record, dict) else None
        call_id = cid if _text(cid) else None
        where = f"call {k} (output item {index})"

        def masked(reason: Reason, what: str, where: str = where, call_id: str | None = call_id) -> _Masked:
            return _Masked(reason, f"{where}: {what}", call_id)

        arrays: list[Any] = [item.get(name) for name in ("prompt_token_ids", TOKEN_KEY, "generation_log_probs")]
        p, g, lp = arrays
        problem = _record_problem(p, g, lp, record, v2)  # 8.1
        if problem:
            raise masked(Reason.INVALID_RECORD, problem)
        if len(lp) != len(g):  # 8.2
            raise masked(Reason.LENGTH_MISMATCH, f"{len(lp)} log probabilities for {len(g)} generated tokens")
        if not g:  # 8.3
            raise masked(Reason.EMPTY_GENERATION, "generation_token_ids is empty")
        for name, values in (("prompt_token_ids", p), (TOKEN_KEY, g)):  # 8.4
            if not set(map(type, values)) <= _INT_TYPES:
                raise masked(Reason.INVALID_TOKEN, f"an element of {name} is not an integer")
        try:
            pa_, ga = np.fromiter(p, np.int64, len(p)), np.fromiter(g, np.int64, len(g))
        except OverflowError:
            raise masked(Reason.INVALID_TOKEN, "a token id is beyond int64") from None
        for name, a in (("prompt_token_ids", pa_), (TOKEN_KEY, ga)):
            bad = (a < 0) | (a >= TOKEN_LIMIT)
            if bad.any():
                raise masked(Reason.INVALID_TOKEN, f"{name} holds {a[bad][0]}, outside [0, 2**31)")
        kinds = set(map(type, lp))  # 8.5
        if type(None) in kinds:
            raise masked(Reason.INVALID_LOGPROB, "a log probability is null (NaN or infinite as written)")
        if not kinds <= _NUMBER_TYPES:
            raise masked(Reason.INVALID_LOGPROB, "a log probability is not a number")
        try:
            la = np.fromiter(lp, np.float64, len(lp))
        except OverflowError:
            raise masked(Reason.INVALID_LOGPROB, "a log probability is beyond float64") from None
        if not np.isfinite(la).all():
            raise masked(Reason.INVALID_LOGPROB, "a log probability is not finite")
        if (la > 0).any():
            raise masked(Reason.INVALID_LOGPROB, f"log probability {float(la[la > 0][0])!r} > 0")
        recomputed = canonical_digest(p, g, lp)  # 8.6
        if v2:
            written = _v2_digest(record)
            if written != recomputed:
                raise masked(Reason.DIGEST_MISMATCH, "the evidence record's arrays differ from the output item's")
        elif record["generation_evidence_digest"] != recomputed:
            raise masked(
                Reason.DIGEST_MISMATCH,
                f"evidence digest {recomputed} != {record['generation_evidence_digest'][:64]}",
            )
        if record["rollout_id"] != rollout_id:  # 8.7
            raise masked(Reason.FIELD_MISMATCH, f"rollout_id {record['rollout_id']!r} != the contract's {rollout_id!r}")
        if record["generation_contract_id"] != generation_id:
            raise masked(
                Reason.FIELD_MISMATCH,
                f"generation_contract_id {record['generation_contract_id']!r} != the contract's {generation_id!r}",
            )
        if record.get("media_ids"):  # 8.8
            raise masked(Reason.UNSUPPORTED_VERSION, f"{len(record['media_ids'])} media ids: multimodal evidence")
        if record["turn_id"] != k + 1:  # 8.9
            raise masked(Reason.BROKEN_CHAIN, f"turn_id {record['turn_id']}, expected {k + 1}: a call is missing")
        starts = _continuity(k, pa_, ga, record, previous, events, masked)  # 8.10
        if starts and k > 0:
            started.add(record["turn_id"])
        segment_of.append(0 if k == 0 else segment_of[-1] + starts)
        calls.append((k, call_id or "", pa_, ga, la, record.get("eligible", True)))
        previous = (pa_, ga, record)
    for step, event_id in sorted(events.items()):  # check 9
        if step not in started:
            raise _Masked(Reason.FIELD_MISMATCH, f"boundary event {event_id} (step {step}) starts no segment")
    _rows(calls, segment_of, out)
    if not out.rows:  # check 10
        raise _Masked(Reason.EMPTY_SELECTION, "no call is eligible for training")


def _record_problem(p, g, lp, record, v2: bool) -> str | None:
    """Check 8.1: what breaks the shape of a call's token item or evidence record."""
    if not all(isinstance(v, list) for v in (p, g, lp)):
        return "the token item does not carry prompt_token_ids, generation_token_ids and generation_log_probs as arrays"
    if not isinstance(record, dict):
        return "the evidence record is not an object"
    if not _is_int(record.get("turn_id")):
        return f"turn_id {json.dumps(record.get('turn_id'))[:40]} is not an integer"
    for name in ("completion_id", "rollout_id", "segment_id", "generation_contract_id"):
        if not _text(record.get(name)):
            return f"{name} is not a non-empty string"
    for name in ("context_epoch", "segment_index"):
        v = record.get(name)
        if not (_is_int(v) and v >= 0):
            return f"{name} {json.dumps(v)[:40]} is not an integer >= 0"
    if not isinstance(record.get("expected_append_compatible"), bool):
        return "expected_append_compatible is not a boolean"
    event = record.get("compaction_event_id")
    if event is not None and not isinstance(event, str):
        return "compaction_event_id is neither null nor a string"
    if not isinstance(record.get("eligible", True), bool):
        return "eligible is not a boolean"
    if not isinstance(record.get("media_ids", []), list):
        return "media_ids is not an array"
    if v2:
        for name in ("prompt_token_ids", "sampled_token_ids", "sampled_logprobs"):
            if not isinstance(record.get(name), list):
                return f"the evidence record's {name} is not an array"
    elif not _text(record.get("generation_evidence_digest")):
        return "generation_evidence_digest is not a non-empty string"
    return None


def _v2_digest(record: dict) -> str | None:
    """The digest of a version-2 evidence record's own copy of the arrays; None (a mismatch)
    when a log probability in it is not a number."""
    import numpy as np

    logprobs = record["sampled_logprobs"]
    if not set(map(type, logprobs)) <= _NUMBER_TYPES:  # the exact types, judged in C
        return None
    try:
        if not np.isfinite(np.fromiter(logprobs, np.float64, len(logprobs))).all():
            return None
    except OverflowError:
        return None
    try:
        return canonical_digest(record["prompt_token_ids"], record["sampled_token_ids"], logprobs)
    except (TypeError, ValueError):
        return None


def _continuity(k: int, p, g, record: dict, previous, events: dict[int, str], masked) -> bool:
    """Check 8.10 for call k; whether it starts a new segment."""
    import numpy as np

    append = record["expected_append_compatible"]
    event_id = record.get("compaction_event_id")
    boundary = events.get(record["turn_id"])
    if k == 0:
        if append or boundary is not None or event_id is not None:
            raise masked(
                Reason.FIELD_MISMATCH,
                "the first call declares "
                + ("itself append-compatible" if append else "a boundary" if boundary else "a compaction event"),
            )
        if record["segment_index"] != 0 or record["context_epoch"] != 0:
            raise masked(
                Reason.FIELD_MISMATCH,
                f"the first call has segment_index {record['segment_index']}, context_epoch {record['context_epoch']}",
            )
        return True
    prev_p, prev_g, prev = previous
    seen = np.concatenate([prev_p, prev_g])
    extends = len(p) >= len(seen) and np.array_equal(p[: len(seen)], seen)
    if append:
        if not extends:
            differ = _first_difference(p, seen)
            raise masked(Reason.PREFIX_MISMATCH, f"the prompt does not extend the previous call (position {differ})")
        if boundary is not None:
            raise masked(Reason.FIELD_MISMATCH, f"append-compatible, yet boundary event {boundary} applies to it")
        if event_id is not None:
            raise masked(Reason.FIELD_MISMATCH, f"append-compatible, yet compaction_event_id {event_id}")
    else:
        if boundary is None:
            if not extends:
                raise masked(
                    Reason.PREFIX_MISMATCH,
                    f"the prompt breaks from the previous call and no boundary event applies to step "
                    f"{record['turn_id']}",
                    where=f"call {k}",
                )
            raise masked(Reason.FIELD_MISMATCH, "a new segment with no boundary event and an unbroken prompt")
        if event_id != boundary:
            raise masked(Reason.FIELD_MISMATCH, f"compaction_event_id {event_id!r} != boundary event {boundary!r}")
        if extends:
            raise masked(
                Reason.FIELD_MISMATCH, f"boundary event {boundary} declares a rewrite the prompt does not show"
            )
    starts = not append
    for name, expected in (
        ("segment_index", prev["segment_index"] + starts),
        ("context_epoch", record["segment_index"]),
    ):
        if record[name] != expected:
            raise masked(Reason.FIELD_MISMATCH, f"{name} {record[name]}, expected {expected}")
    if not starts and record["segment_id"] != prev["segment_id"]:
        raise masked(
            Reason.FIELD_MISMATCH, f"segment_id {record['segment_id']!r} != the segment's {prev['segment_id']!r}"
        )
    return starts


def _first_difference(p, seen) -> int:
    import numpy as np

    n = min(len(p), len(seen))
    differ = np.flatnonzero(p[:n] != seen[:n])
    return int(differ[0]) if len(differ) else n


def _rows(calls: list[tuple], segment_of: list[int], out: EnvelopeRollout) -> None:
    """11.5: one row per segment that holds an eligible call, its calls' pieces."""
    import numpy as np

    segments: dict[int, list[tuple]] = {}
    for call, segment in zip(calls, segment_of):
        segments.setdefault(segment, []).append(call)
    for segment in sorted(segments):
        members = segments[segment]
        if not any(eligible for *_, eligible in members):
            continue
        seen = 0
        for k, call_id, p, g, lp, eligible in members:
            carried = p[seen:]
            ones = np.full(len(g), 1.0 if eligible else 0.0, np.float32)
            out.calls[k] = EnvelopeCall(
                k,
                call_id,
                np.concatenate([carried, g]),
                np.concatenate([np.zeros(len(carried), np.float32), ones]),
                np.concatenate([np.zeros(len(carried), np.float32), lp.astype(np.float32) * ones]),
            )
            seen = len(p) + len(g)
        out.rows.append([k for k, *_ in members])
        out.prompt_lens.append(len(members[0][2]))


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
