"""The calls of a NeMo Gym compaction-agent line (CONTRACT.md 11.4, per call, and 11.5): each
call's token item and evidence record checked in call order, then the rows. The line around
them (its contract, envelope and admission): gym_envelope.py.

Invariants held per call, in call order, the first failure masking the rollout: its fields
have their types, its arrays agree (lengths, ranges, finite log probabilities <= 0), the
digest recomputed from the arrays is the one Gym recorded, it belongs to the envelope's
rollout and generation contract, it carries no media, the agent's steps run 1, 2, 3 without
a gap, and every appending call extends the previous call exactly while every break is
declared by a boundary event (and no boundary event declares a break that did not happen).
Then one row per segment that holds an eligible call.

numpy is imported where the token lists are read (the rollout parse's child processes
import this module).
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

TOKEN_LIMIT = 2**31
_INT_TYPES, _NUMBER_TYPES = {int}, {int, float}  # exact types: a JSON boolean is no integer


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
