"""Writing verifiers 0.4.0 `traces.jsonl` lines as verifiers does (CONTRACT.md 10.1), for the
synthetic nights (synth.py) and the tests' hand-written traces.

A node is a message with the tokens it adds: a prompt or observation node (`sampled`
false, every mask value false), or a sampled node (scaffold tokens with mask false, then
the completion with mask true and one log probability each, rounded to 4 decimals as
verifiers' JSON serializer writes them). An Episode line is `json.dumps` of the episode,
compact, then a newline; fields verifiers leaves out when None are left out here too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import numpy as np


def prompt_node(ids: Sequence[int], parent: int | None, role: str = "user", links: Iterable[tuple] = ()) -> dict:
    """A message the model did not sample (system, user, tool): its tokens, mask false."""
    node: dict = {
        "semantic_parents": [{"node": n, "type": t} for n, t in links],
        "message": {"role": role, "content": f"{role} message"},
        "sampled": False,
        "token_ids": [int(v) for v in ids],
        "mask": [False] * len(ids),
        "logprobs": [],
    }
    if parent is not None:
        node["parent"] = parent
    return node


def sampled_node(
    scaffold: Sequence[int],
    generated: Sequence[int],
    logprobs: Sequence[float],
    parent: int | None,
    links: Iterable[tuple] = (),
) -> dict:
    """An assistant message the model sampled: scaffold tokens (mask false), then the
    completion (mask true, one log probability each, rounded to 4 decimals)."""
    node = prompt_node(list(scaffold) + list(generated), parent, "assistant", links)
    node.update(
        sampled=True,
        mask=[False] * len(scaffold) + [True] * len(generated),
        logprobs=[round(float(v), 4) for v in logprobs],
    )
    return node


def trace(
    nodes: list[dict],
    rewards: dict | None = None,
    ok: bool = True,
    agent: str = "solver",
    trainable: bool = True,
    stop: str = "agent_completed",
    errors: Sequence[tuple[str, str]] = (),
    trace_id: str = "t0",
) -> dict:
    return {
        "version": 1,
        "id": trace_id,
        "verifiers": {"version": "0.4.0"},
        "agent": {"name": agent, "trainable": trainable},
        "nodes": nodes,
        "calls": [],
        "rewards": {"correct": {"score": 1.0, "weight": 1.0}} if rewards is None else rewards,
        "ok": ok,
        "stop_condition": stop,
        "errors": [{"type": t, "message": m} for t, m in errors],
    }


def episode(
    episode_id: str,
    traces: list[dict],
    group: str | None = "g0",
    ok: bool = True,
    policy: tuple[int, int] | None = (6, 7),
    errors: Sequence[tuple[str, str]] = (),
) -> dict:
    out: dict = {"id": episode_id, "env": {"id": "swe-lite", "name": "swe-lite"}, "task": {"key": "k0"}}
    if group is not None:
        out["group"] = {"id": group}
    out["run"] = {"type": "eval", "id": "eval"}  # a frozen policy: no versions
    if policy is not None:
        work = {"type": "train", "step": 1, "policy": {"start": policy[0], "end": policy[1]}}
        out["run"] = {"type": "train", "id": "run", "work": work}
    out.update(ok=ok, errors=[{"type": t, "message": m} for t, m in errors], traces=traces)
    return out


def episode_line(value: dict) -> str:
    """One line of traces.jsonl, as `write_episode` writes it (compact JSON, then \\n)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n"


def call_nodes(nodes: list[dict], parent: int | None, call, links: Iterable[tuple] = ()) -> int:
    """A captured call (capture.CapturedCall: its new tokens, the observation with mask 0,
    then its generation) as verifiers records it: an observation node (a user prompt for a
    root, a tool result for a child), then the sampled node. Returns the sampled node's
    index."""
    ids, mask, lp = np.asarray(call.ids), np.asarray(call.mask), np.asarray(call.logprobs)
    n_prompt = int((mask == 0).sum())
    if n_prompt:
        nodes.append(prompt_node(ids[:n_prompt].tolist(), parent, "user" if parent is None else "tool"))
        parent = len(nodes) - 1
    nodes.append(sampled_node([], ids[n_prompt:].tolist(), lp[n_prompt:].tolist(), parent, links))
    return len(nodes) - 1


# the faults a synthetic verifiers rollout can carry (synth.py's names) and the reason each
# masks it with, in every mode (the checks of CONTRACT.md 10.4 run at the load)
FAULTS = {
    "rollout_failed": "rollout_failed",
    "invalid_reward": "invalid_reward",
    "unsupported_version": "unsupported_version",
    "invalid_record": "invalid_record",
    "dangling_parent": "missing_parent",
    "lineage_cycle": "lineage_cycle",
    "missing_tokens": "missing_tokens",
    "length_mismatch": "length_mismatch",
    "invalid_token": "invalid_token",
    "invalid_mask": "invalid_mask",
    "empty_generation": "empty_generation",
    "invalid_logprob": "invalid_logprob",
    "empty_selection": "empty_selection",
}


def inject(ep: dict, fault: str, rng: np.random.Generator) -> None:
    """One fault in an Episode of one trace (FAULTS)."""
    t = ep["traces"][0]
    nodes = t["nodes"]
    sampled = [n for n in nodes if n["sampled"]]
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    if fault == "rollout_failed":
        (ep if rng.random() < 0.5 else t)["ok"] = False
        t["errors"] = [{"type": "TimeoutError", "message": "agent stage deadline (600s) expired"}]
    elif fault == "invalid_reward":
        t["rewards"] = {"correct": None}  # a NaN score, as verifiers writes it
    elif fault == "unsupported_version":
        t["version"] = 2
    elif fault == "invalid_record":
        pick(nodes)["sampled"] = "true"
    elif fault == "dangling_parent":
        nodes[-1]["parent"] = len(nodes) + 3
    elif fault == "lineage_cycle":  # two late nodes, each the other's parent
        nodes.append(prompt_node([1, 2], len(nodes) + 1, "tool"))
        nodes.append(prompt_node([3], len(nodes) - 1, "tool"))
    elif fault == "missing_tokens":  # an eval/relay client: no token ids anywhere
        for n in nodes:
            n["token_ids"], n["mask"], n["logprobs"] = [], [], []
    elif fault == "length_mismatch":
        pick(sampled)["logprobs"].pop()
    elif fault == "invalid_token":
        pick(sampled)["token_ids"][-1] = -5
    elif fault == "invalid_mask":
        node = pick([n for n in nodes if not n["sampled"] and n["token_ids"]])
        node["mask"][0] = True
    elif fault == "empty_generation":
        node = pick(sampled)
        node["mask"], node["logprobs"] = [False] * len(node["token_ids"]), []
    elif fault == "invalid_logprob":
        pick(sampled)["logprobs"][-1] = None if rng.random() < 0.5 else 0.25
    elif fault == "empty_selection":  # every leaf an unaccepted compaction attempt
        parents = {n.get("parent") for n in nodes}
        for k, n in enumerate(nodes):
            n["semantic_parents"] = [x for x in n["semantic_parents"] if x["type"] != "compaction"]
            if k not in parents:
                n["semantic_parents"].append({"node": 0, "type": "compaction_attempt"})
    else:
        raise ValueError(f"no verifiers fault {fault!r}")
