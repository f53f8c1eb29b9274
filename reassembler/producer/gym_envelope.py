"""Writing NeMo Gym 0.7.0 compaction-agent result lines as Gym does (CONTRACT.md 11.1), for
the synthetic nights (synth.py) and the tests' hand-written envelopes.

A call is its prompt ids (the whole request as the model saw it), its generated ids and one
log probability per generated id. A call starts a segment (the first call, or a call after
a rewrite of the context, which a boundary event declares) or appends to the previous call,
whose prompt and generation its prompt then extends. The line holds, as Gym's session
writes them: the token items in `response.output` (a reasoning item before each, a tool
output between calls), one evidence record per call (`model_call_metadata` with its
`generation_evidence_digest`, or `completion_evidence` with the arrays in version 2), the
boundary events, and the `context_compaction_contract` (or `rollout_trace_contract`);
then rollout_collection's result fields. Gym writes it with orjson; `json.dumps` writes
the same values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..formats.gym_envelope import IDENTITY_GAPS, MODE, canonical_digest


@dataclass
class EnvelopeCall:
    prompt: Sequence[int]
    generated: Sequence[int]
    logprobs: Sequence[float]
    starts_segment: bool = False  # the first call always does
    eligible: bool = True
    policy: str = "recency"  # the boundary event's policy, when the call starts a segment after the first


@dataclass
class Envelope:
    task: int
    sample: int
    calls: list[EnvelopeCall]
    reward: float | None = 1.0
    version: int | None = 3  # None: rollout_trace_contract (after 0.7.0)
    training_eligible: bool = False
    incomplete_reasons: list[str] = field(default_factory=lambda: sorted(IDENTITY_GAPS))
    failure_kind: str | None = None
    failure_reason: str | None = None
    mask_sample: bool = False
    agent: str = "simple_agent_with_compaction"
    temperature: float = 1.0

    @property
    def rollout_id(self) -> str:
        return f"{self.task}-{self.sample}"


def envelope_record(env: Envelope) -> dict:
    """The result line of one rollout as a JSON object (see the module's docstring)."""
    gym_rollout = f"sample:task-{env.task:04d}:rollout-{env.sample:02d}"
    contract_id = f"generation-contract-{env.task:04d}"
    output: list[dict] = []
    records: list[dict] = []
    events: list[dict] = []
    segment, segment_id = -1, ""
    for k, call in enumerate(env.calls):
        step = k + 1
        starts = k == 0 or call.starts_segment
        event_id = None
        if starts:
            segment += 1
            segment_id = f"segment-{env.task:04d}-{env.sample:02d}-{segment}"
            if k > 0:
                event_id = f"boundary-{step:06d}-{env.task:04d}{env.sample:02d}"
                events.append(
                    {
                        "event_id": event_id,
                        "applies_to_step": step,
                        "policy_name": call.policy,
                        "previous_segment_index": segment - 1,
                        "segment_index": segment,
                    }
                )
        output.append({"id": f"rs_{step}", "type": "reasoning", "summary": [{"text": f"step {step}"}]})
        output.append(
            {
                "id": f"msg_{step}",
                "type": "message" if k == len(env.calls) - 1 else "function_call",
                "prompt_token_ids": [int(v) for v in call.prompt],
                "generation_token_ids": [int(v) for v in call.generated],
                "generation_log_probs": [float(v) for v in call.logprobs],
            }
        )
        if k < len(env.calls) - 1:
            output.append({"type": "function_call_output", "call_id": f"call_{step}", "output": "ok"})
        record = {
            "rollout_id": gym_rollout,
            "completion_id": f"completion-{step:06d}-{env.task:04d}{env.sample:02d}",
            "action_id": f"action-{step:06d}",
            "turn_id": step,
            "context_epoch": segment,
            "segment_index": segment,
            "segment_id": segment_id,
            "expected_append_compatible": not starts,
            "compaction_event_id": event_id,
            "generation_contract_id": contract_id,
            "eligible": call.eligible,
            "media_ids": [],
        }
        arrays = (list(call.prompt), list(call.generated), [float(v) for v in call.logprobs])
        if env.version == 2:
            record.update(prompt_token_ids=arrays[0], sampled_token_ids=arrays[1], sampled_logprobs=arrays[2])
        else:
            record["generation_evidence_digest"] = canonical_digest(*arrays)
        records.append(record)
    contract: dict = {
        "rollout_id": gym_rollout,
        "group_id": f"sample:task-{env.task:04d}",
        "task_id": f"task-{env.task:04d}",
        "rollout_index": env.sample,
        "attempt_index": 0,
        "generation_contract": {
            "schema_version": 1,
            "generation_contract_id": contract_id,
            "training_eligible": env.training_eligible,
            "incomplete_reasons": list(env.incomplete_reasons),
        },
    }
    response: dict = {
        "id": f"resp_{env.task}_{env.sample}",
        "object": "response",
        "model": "policy",
        "temperature": env.temperature,
        "output": output,
        ("completion_evidence" if env.version == 2 else "model_call_metadata"): records,
        "boundary_events": events,
        "final_policy_decision": {"policy_name": env.calls[-1].policy if events else "identity"},
    }
    if env.version is None:
        response["rollout_trace_contract"] = contract
    else:
        response["context_compaction_contract"] = {"schema_version": env.version, "mode": MODE, **contract}
    line: dict = {
        "responses_create_params": {"input": [], "temperature": env.temperature},
        "response": response,
        "reward": env.reward,
        "mask_sample": env.mask_sample,
        "failure_kind": env.failure_kind,
        "failure_reason": env.failure_reason,
        "agent_ref": {"type": "responses_api_agents", "name": env.agent},
        "_ng_task_index": env.task,
        "_ng_rollout_index": env.sample,
    }
    if env.version == 2:
        line["verification_skipped"] = True
    return line


def envelope_line(env: Envelope | dict) -> str:
    """One result line (a record from `envelope_record`, perhaps changed by a test)."""
    record = envelope_record(env) if isinstance(env, Envelope) else env
    return json.dumps(record, separators=(",", ":")) + "\n"


def compacting_calls(seed: int, n_calls: int, compact_at: Sequence[int], vocab: int = 50000) -> list[EnvelopeCall]:
    """`n_calls` calls of an agent whose context is rewritten before each call in
    `compact_at` (a new segment: a shorter prompt that does not extend the last call); every
    other call appends a tool observation to the previous call's prompt and generation."""
    import numpy as np

    rng = np.random.default_rng(seed)
    calls: list[EnvelopeCall] = []
    seen: list[int] = []
    for k in range(n_calls):
        generated = rng.integers(0, vocab, int(rng.integers(2, 12))).tolist()
        logprobs = np.round(-rng.exponential(2.0, len(generated)), 6).astype(np.float32).tolist()
        if k == 0 or k in compact_at:
            prompt = rng.integers(0, vocab, int(rng.integers(4, 16))).tolist()
            if seen and prompt[: len(seen)] == seen:  # a rewrite shows as a break
                prompt[0] = (prompt[0] + 1) % vocab
        else:
            prompt = seen + rng.integers(0, vocab, int(rng.integers(1, 6))).tolist()
        calls.append(EnvelopeCall(prompt, generated, logprobs, starts_segment=k in compact_at))
        seen = prompt + generated
    return calls


# fault kind (synth.FAULTS' names where one applies) -> the reason 11.4 gives it
FAULTS = {
    "rollout_failed": "rollout_failed",
    "invalid_reward": "invalid_reward",
    "producer_masked": "producer_masked",
    "unsupported_version": "unsupported_version",
    "invalid_record": "invalid_record",
    "missing_tokens": "missing_tokens",
    "unmatched_output": "unmatched_output",
    "length_mismatch": "length_mismatch",
    "empty_generation": "empty_generation",
    "invalid_token": "invalid_token",
    "invalid_logprob": "invalid_logprob",
    "digest_mismatch": "digest_mismatch",
    "field_mismatch": "field_mismatch",
    "broken_chain": "broken_chain",
    "prefix_mismatch": "prefix_mismatch",
    "empty_selection": "empty_selection",
}


def inject(record: dict, fault: str, rng) -> None:
    """One fault in an envelope line (FAULTS), on a call drawn from `rng` where it names one."""
    response = record["response"]
    items = [item for item in response["output"] if item.get("generation_token_ids") is not None]
    evidence = response["model_call_metadata"]
    k = int(rng.integers(len(items)))
    item, meta = items[k], evidence[k]
    if fault == "rollout_failed":
        record.update(failure_kind="env_error", failure_reason="the resources server crashed", reward=None)
    elif fault == "invalid_reward":
        record["reward"] = None
    elif fault == "producer_masked":
        record.update(mask_sample=True, failure_kind="judge_refused", failure_reason="no verdict")
    elif fault == "unsupported_version":
        response["context_compaction_contract"]["schema_version"] = 4
    elif fault == "invalid_record":
        meta["turn_id"] = str(meta["turn_id"])
    elif fault == "missing_tokens":
        del item["generation_token_ids"]
    elif fault == "unmatched_output":
        evidence.pop()
    elif fault == "length_mismatch":
        item["generation_log_probs"].append(-1.0)
    elif fault == "empty_generation":
        item["generation_token_ids"], item["generation_log_probs"] = [], []
    elif fault == "invalid_token":
        item["generation_token_ids"][-1] = -5
    elif fault == "invalid_logprob":
        item["generation_log_probs"][-1] = None if rng.random() < 0.5 else 0.25
    elif fault == "digest_mismatch":  # a generated token changed after Gym took the digest
        item["generation_token_ids"][-1] = (item["generation_token_ids"][-1] + 1) % 2**31
    elif fault == "field_mismatch":
        meta["rollout_id"] = "another-rollout"
    elif fault == "broken_chain":  # a call lost: the steps after it skip one
        for later in evidence[k:]:
            later["turn_id"] += 1
    elif fault == "prefix_mismatch":  # a break no boundary event declares (or, without one, a rewritten prompt)
        if response["boundary_events"]:
            response["boundary_events"].pop(int(rng.integers(len(response["boundary_events"]))))
        else:
            target = items[-1] if len(items) > 1 else None
            if target is None:  # one call: nothing to break from; a second call that does not extend it
                raise ValueError("prefix_mismatch needs two calls")
            target["prompt_token_ids"][0] = (target["prompt_token_ids"][0] + 1) % 2**31
            evidence[-1]["generation_evidence_digest"] = canonical_digest(
                target["prompt_token_ids"], target["generation_token_ids"], target["generation_log_probs"]
            )
    elif fault == "empty_selection":
        for meta in evidence:
            meta["eligible"] = False
    else:
        raise ValueError(f"no such envelope fault: {fault}")
