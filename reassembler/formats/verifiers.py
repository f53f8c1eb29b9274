"""PrimeIntellect verifiers 0.4.0 traces: one `Episode` line of `traces.jsonl` (CONTRACT.md 10).

verifiers writes each finished episode as one JSON line (`write_episode`): the episode's
`id`, `group`, `run`, `ok`, `errors` and `traces`, one trace per agent run. A trace is a
parent-linked message graph (`version` 1): each node adds its own `token_ids`, a `mask`
parallel to them (true where the model sampled the token) and one log probability per
sampled token. A **branch** is a root-to-leaf path; its tokens end to end are what
verifiers trains on (`Trace.branches`).

Invariants this module holds a trace to, in the contract's order (10.4), the first failure
masking the rollout: the episode and trace declare `ok`; the trace is not `dropped`
(verifiers 0.4.1); the rewards are scored numbers; then the trace's graph and its rows
(checks 4-9 and 10.5: verifiers_graph.py), each sampled token trained exactly once.

Nothing vouches for the tokens beyond these checks (10.8): no digest, no call id.
Nothing here touches the warehouse; numpy and pyarrow are imported where the token lists
are read, as the other formats do (the rollout parse's child processes import this module).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..reasons import Reason
from .records import RecordError, has_surrogate, no_duplicate_keys, storable_text
from .verifiers_graph import (  # the trace's nodes and rows, and the names its callers take from here
    MAX_ROLLOUT_TOKENS,
    Masked,
    TraceRollout,
    _check_graph,
    _is_int,
    _is_number,
    _link,
    _links,
    context_call,
    leaves,
    path_to,
    untrainable_leaves,
)

__all__ = [
    "DECODER",
    "MAX_ROLLOUT_TOKENS",
    "TraceRollout",
    "context_call",
    "describe",
    "is_traces_file",
    "parse_episode",
]

TRACES_FILE = "traces.jsonl"  # verifiers' TRACES_FILE (utils/trace_store.py)
TRACES_SUFFIX = ".traces.jsonl"  # choice (10.2): several runs in one night, e.g. runA.traces.jsonl


def is_traces_file(rel: str) -> bool:
    """Whether a file of the rollouts partition is a verifiers file (10.2), by its name."""
    name = rel.rsplit("/", 1)[-1]
    return name == TRACES_FILE or (name.endswith(TRACES_SUFFIX) and len(name) > len(TRACES_SUFFIX))


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


# RFC 8259 exactly: NaN and Infinity literals refused, a repeated key refused, big integers kept
DECODER = json.JSONDecoder(object_pairs_hook=no_duplicate_keys, parse_constant=_refuse_constant)


def _text(v) -> str | None:
    """An id: a non-empty string, or None; a lone surrogate cannot be stored (a reject)."""
    if not isinstance(v, str) or not v:
        return None
    if has_surrogate(v):
        raise RecordError("an id is not valid Unicode (it holds a lone surrogate escape such as \\ud800)")
    return v


def parse_episode(value, max_tokens: int = MAX_ROLLOUT_TOKENS) -> list[TraceRollout]:
    """The rollouts of one decoded Episode line, each checked (10.3, 10.4; its rows at most
    `max_tokens` tokens); RecordError when the line is not an Episode (10.2: a rejected
    input line)."""
    if not isinstance(value, dict) or "traces" not in value:
        raise RecordError("not a verifiers Episode: a JSON object with the key traces")
    episode_id = _text(value.get("id"))
    if episode_id is None:
        raise RecordError("the Episode's id is not a non-empty string")
    traces = value["traces"]
    if not isinstance(traces, list):
        raise RecordError("the Episode's traces is not an array")
    group = value.get("group")
    group_id: str | None = episode_id  # choice: without a group, a group of its own
    if group is not None:
        group_id = _text(group.get("id")) if isinstance(group, dict) else None
    if group_id is None:
        raise RecordError("the Episode's group is not an object with a non-empty string id")
    policy = _policy(value.get("run"))
    if not traces:
        out = TraceRollout(episode_id, group_id, episode_id, None, _metadata(value, None, None))
        out.reason = Reason.ROLLOUT_FAILED
        out.detail = "the Episode holds no trace (its env failed before any agent ran)"
        out.reward, out.reward_problem = _reward({})
        out.policy = policy
        return [out]
    rollouts = []
    for i, trace in enumerate(traces):
        agent = trace.get("agent") if isinstance(trace, dict) else None
        if isinstance(agent, dict) and agent.get("trainable") is False:
            continue  # a judge's or a simulated user's seat: not a rollout
        rid = episode_id if len(traces) == 1 else f"{episode_id}-t{i}"
        out = TraceRollout(rid, group_id, episode_id, i, _metadata(value, trace, i))
        out.policy = policy
        out.env, out.agent, out.temperature = origin(value, trace)
        check_trace(value, trace, out, max_tokens)
        rollouts.append(out)
    return rollouts


def _policy(run) -> tuple[int, int] | None:
    work = run.get("work") if isinstance(run, dict) else None
    policy = work.get("policy") if isinstance(work, dict) else None
    if not isinstance(policy, dict):
        return None
    start, end = policy.get("start"), policy.get("end")
    if isinstance(start, int) and isinstance(end, int) and _is_int(start) and _is_int(end):
        if -(2**63) <= min(start, end) and max(start, end) < 2**63:
            return start, end
    return None


def _metadata(episode: dict, trace, i: int | None) -> str:
    """Free-form JSON for the audit (10.6): env id, agent name, trace id, task key, stop
    condition, and where the trace sits in its Episode."""
    out: dict[str, Any] = {"episode_id": episode.get("id")}
    env, task = episode.get("env"), episode.get("task")
    if isinstance(env, dict) and isinstance(env.get("id"), str):
        out["env"] = env["id"]
    if isinstance(task, dict) and isinstance(task.get("key"), str):
        out["task_key"] = task["key"]
    if isinstance(trace, dict):
        agent = trace.get("agent")
        if isinstance(agent, dict) and isinstance(agent.get("name"), str):
            out["agent"] = agent["name"]
        for key, name in (("id", "trace_id"), ("stop_condition", "stop_condition")):
            if isinstance(trace.get(key), str):
                out[name] = trace[key]
    if i is not None:
        out["trace_index"] = i
    return storable_text(json.dumps(out, sort_keys=True, ensure_ascii=False))


def origin(episode: dict, trace) -> tuple[str | None, str | None, float | None]:
    """env, agent and temperature of a trace (CONTRACT.md 5.3): the Episode's `env.id`
    (else `env.name`), the trace's `agent.name` (AgentInfo.name, trace.py), and the sampling
    temperature resolved into the agent's config that verifiers stamps on every trace
    (`agent.config.sampling.temperature`: AgentConfig.sampling, configs/agent.py), null
    where not recorded."""
    env = episode.get("env")
    env_id = None
    if isinstance(env, dict):
        env_id = next((env[k] for k in ("id", "name") if isinstance(env.get(k), str) and env[k]), None)
    agent = trace.get("agent") if isinstance(trace, dict) else None
    agent = agent if isinstance(agent, dict) else {}
    name = agent.get("name") if isinstance(agent.get("name"), str) and agent.get("name") else None
    config = agent.get("config")
    sampling = config.get("sampling") if isinstance(config, dict) else None
    value = sampling.get("temperature") if isinstance(sampling, dict) else None
    temperature = float(value) if _is_number(value) and math.isfinite(value) else None
    return (
        None if env_id is None else storable_text(env_id),
        None if name is None else storable_text(name),
        temperature,
    )


def _last_error(obj) -> str | None:
    errors = obj.get("errors") if isinstance(obj, dict) else None
    if not isinstance(errors, list) or not errors or not isinstance(errors[-1], dict):
        return None
    last = errors[-1]
    return f"{last.get('type')}: {last.get('message')}"


def _reward(rewards) -> tuple[float | None, str | None]:
    """Check 2 and Trace.reward: the sum of score * weight over the non-null entries, in the
    order the keys appear, in float64 from 0; or None and why not."""
    if not isinstance(rewards, dict):
        return None, f"rewards is {type(rewards).__name__}, not an object"
    total, scored = 0.0, 0
    for name, entry in rewards.items():
        if entry is None:
            continue  # verifiers writes a NaN or infinite score as null
        if not isinstance(entry, dict) or not _is_number(entry.get("score")):
            return None, f"reward {name!r} has no number score"
        weight = entry.get("weight", 1.0)
        if not _is_number(weight):
            return None, f"reward {name!r} has a weight that is not a number"
        try:
            total += float(entry["score"]) * float(weight)
        except OverflowError:
            return None, f"reward {name!r} is beyond float64"
        scored += 1
    if not scored:
        return None, "no reward was scored (every entry null, or none)"
    if not math.isfinite(total):
        return None, f"the reward is {total}"
    return total, None


def check_trace(episode: dict, trace, out: TraceRollout, max_tokens: int = MAX_ROLLOUT_TOKENS) -> None:
    """The checks of 10.4 in order, into `out` (the first failure: reason, detail, node);
    its rows and nodes when all pass. The reward is computed whatever the outcome: the
    audit keeps it when check 2 passes."""
    try:
        if not isinstance(trace, dict):
            out.reward_problem = "the trace is not an object"
            raise Masked(Reason.INVALID_RECORD, f"trace {out.trace_index} of the Episode is not an object")
        nodes = trace.get("nodes", [])
        if isinstance(nodes, list):
            out.sampled = [i for i, n in enumerate(nodes) if isinstance(n, dict) and n.get("sampled") is True]
            out.n_roots = sum(isinstance(n, dict) and n.get("parent") is None for n in nodes)
        out.reward, out.reward_problem = _reward(trace.get("rewards", {}))
        for what, obj in (("episode", episode), ("trace", trace)):  # check 1
            if obj.get("ok") is not True:
                error = _last_error(trace) or _last_error(episode)
                raise Masked(Reason.ROLLOUT_FAILED, f"{what} ok is not true" + (f": {error}" if error else ""))
        dropped = trace.get("dropped")  # check 2 (verifiers 0.4.1's Trace.dropped)
        if dropped is not None:
            if not isinstance(dropped, str):
                raise Masked(Reason.INVALID_RECORD, f"dropped {json.dumps(dropped)[:40]} is neither null nor a string")
            raise Masked(Reason.PRODUCER_MASKED, f"dropped: {storable_text(dropped)}")
        if out.reward is None:  # check 3
            raise Masked(Reason.INVALID_REWARD, out.reward_problem or "no reward")
        _check_graph(trace, out, max_tokens)
    except Masked as m:
        out.reason, out.detail = m.reason, m.detail
        out.call_id = None if m.node is None else str(m.node)
        out.rows, out.nodes = [], {}


def describe(value, rollout_id: str | None = None) -> list[str]:
    """A trace walked node by node for `reassembler explain`: each rollout of the line (or
    the one of `rollout_id`), its nodes (parent, sampled, tokens, links), its leaves and
    which became which row, or why a branch is not one."""
    lines = []
    for r in parse_episode(value):
        if rollout_id is not None and r.rollout_id != rollout_id:
            continue
        lines.append(f"rollout {r.rollout_id} (trace {r.trace_index} of Episode {r.episode_id})")
        traces = value.get("traces") or []
        trace = traces[r.trace_index] if r.trace_index is not None else None
        nodes = trace.get("nodes") if isinstance(trace, dict) else None
        if isinstance(nodes, list):
            for i, node in enumerate(nodes):
                if not isinstance(node, dict):
                    lines.append(f"  node {i}: not an object")
                    continue
                mask: list = node["mask"] if isinstance(node.get("mask"), list) else []
                role = node.get("message", {}).get("role") if isinstance(node.get("message"), dict) else None
                links = ", ".join(f"{_link(x)} -> {x.get('node')}" for x in _links(node) if isinstance(x, dict))
                lines.append(
                    f"  node {i}: parent {node.get('parent')}, {role or 'message'}, "
                    f"{'sampled' if node.get('sampled') is True else 'not sampled'}, "
                    f"{len(node.get('token_ids') or [])} tokens ({sum(1 for v in mask if v is True)} sampled)"
                    + (f", links {links}" if links else "")
                )
        if r.reason is not None:
            lines.append(f"  masked {r.reason.value}: {r.detail}")
            continue
        nodes = nodes if isinstance(nodes, list) else []
        parents = [n.get("parent") for n in nodes]
        rows = {tuple(p): k for k, p in enumerate(r.rows)}
        owners = {node: k for k in reversed(range(len(r.rows))) for node in r.rows[k] if r.nodes[node].mask.any()}
        rejected = untrainable_leaves(nodes)
        for leaf in leaves(parents):
            path = path_to(leaf, parents)
            where = " -> ".join(map(str, path))
            if tuple(path) in rows:
                k = rows[tuple(path)]
                shared = ", ".join(f"node {n} (trained on row {r.rollout_id}_s{owners[n]})" for n in r.context[k])
                lines.append(
                    f"  branch to leaf {leaf} [{where}]: row {r.rollout_id}_s{k}"
                    + (f"; context only: {shared}" if shared else "")
                )
            elif leaf in rejected:
                lines.append(f"  branch to leaf {leaf} [{where}]: no row, an unaccepted compaction attempt")
            elif any(node in owners for node in path):
                lines.append(
                    f"  branch to leaf {leaf} [{where}]: no row, every sampled node on it is trained on an earlier row"
                )
            else:
                lines.append(f"  branch to leaf {leaf} [{where}]: no row, it holds no sampled token")
    return lines
