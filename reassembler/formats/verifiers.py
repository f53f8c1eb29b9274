"""PrimeIntellect verifiers 0.4.0 traces: one `Episode` line of `traces.jsonl` (CONTRACT.md 10).

verifiers writes each finished episode as one JSON line (`write_episode`): the episode's
`id`, `group`, `run`, `ok`, `errors` and `traces`, one trace per agent run. A trace is a
parent-linked message graph (`version` 1): each node adds its own `token_ids`, a `mask`
parallel to them (true where the model sampled the token) and one log probability per
sampled token. A **branch** is a root-to-leaf path; its tokens end to end are what
verifiers trains on (`Trace.branches`).

Invariants this module holds a trace to, in the contract's order (10.4), the first failure
masking the rollout: the episode and trace declare `ok`; the trace is not `dropped`
(verifiers 0.4.1); the rewards are scored numbers;
the version is 1; every field has its JSON type; every parent is a node of the trace and
no parent walk meets a node twice; some node holds tokens; and each node's lists agree
(mask as long as the ids, ids in [0, 2**31), mask false then true and true only where
sampled, a sampled node samples a token, one log probability <= 0 per sampled token).
Then every trainable branch that holds a sampled token not trained on an earlier branch is a
row (10.5): each sampled token of a trace is trained exactly once.

Nothing vouches for the tokens beyond these checks (10.8): no digest, no call id.
Nothing here touches the warehouse; numpy and pyarrow are imported where the token lists
are read, as the other formats do (the rollout parse's child processes import this module).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from ..reasons import Reason
from .records import RecordError, has_surrogate, no_duplicate_keys, storable_text

if TYPE_CHECKING:
    import numpy as np

TRACES_FILE = "traces.jsonl"  # verifiers' TRACES_FILE (utils/trace_store.py)
TRACES_SUFFIX = ".traces.jsonl"  # choice (10.2): several runs in one night, e.g. runA.traces.jsonl
TRACE_VERSION = 1  # verifiers' TRACE_VERSION (trace.py)
TOKEN_LIMIT = 2**31
TORN_FINAL_LINE = "torn_final_line"
# the tokens a rollout's rows may hold, shared context counted on every branch (CONTRACT.md 12;
# Settings.max_rollout_tokens): a fork tree's rows repeat the context of each branch
MAX_ROLLOUT_TOKENS = 1 << 24


def is_traces_file(rel: str) -> bool:
    """Whether a file of the rollouts partition is a verifiers file (10.2), by its name."""
    name = rel.rsplit("/", 1)[-1]
    return name == TRACES_FILE or (name.endswith(TRACES_SUFFIX) and len(name) > len(TRACES_SUFFIX))


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


# RFC 8259 exactly: NaN and Infinity literals refused, a repeated key refused, big integers kept
DECODER = json.JSONDecoder(object_pairs_hook=no_duplicate_keys, parse_constant=_refuse_constant)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _text(v) -> str | None:
    """An id: a non-empty string, or None; a lone surrogate cannot be stored (a reject)."""
    if not isinstance(v, str) or not v:
        return None
    if has_surrogate(v):
        raise RecordError("an id is not valid Unicode (it holds a lone surrogate escape such as \\ud800)")
    return v


@dataclass
class Node:
    """One node on a row: the tokens it adds (ids int64, mask float32 0/1, log probabilities
    float32, 0.0 where the mask is 0), and its parent (None: a root)."""

    index: int
    parent: int | None
    sampled: bool
    ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray


@dataclass
class TraceRollout:
    """One rollout of an Episode line (10.3): its ids, its reward, and what the checks of
    10.4 found; when every check passed, its rows (10.5) as node paths root to leaf, and the
    nodes on them."""

    rollout_id: str
    group_id: str
    episode_id: str
    trace_index: int | None  # None: an Episode without traces
    metadata: str
    reward: float | None = None  # Trace.reward when check 2 passes
    reward_problem: str | None = None  # why not
    reason: Reason | None = None  # the first check of 10.4 that failed
    detail: str | None = None
    call_id: str | None = None  # the node a check names
    sampled: list[int] = field(default_factory=list)  # nodes with sampled: true (the audit's n_ledger_calls)
    n_roots: int = 0  # nodes without a parent
    policy: tuple[int, int] | None = None  # run.work.policy (start, end): the rows' weight versions
    rows: list[list[int]] = field(default_factory=list)  # each row's nodes, root to leaf
    context: list[list[int]] = field(default_factory=list)  # per row: its sampled nodes an earlier row trains
    owners: dict[int, int] = field(default_factory=dict)  # each sampled node on the rows: the row that trains it
    nodes: dict[int, Node] = field(default_factory=dict)  # the nodes on the rows
    env: str | None = None  # the Episode's env.id (5.3)
    agent: str | None = None  # the trace's agent.name
    temperature: float | None = None  # the trace's agent.config.sampling.temperature

    @property
    def n_sampled(self) -> int:
        return len(self.sampled)

    @property
    def n_selected(self) -> int:
        """Distinct sampled nodes on the rows."""
        return sum(node.sampled for node in self.nodes.values())

    def shape(self) -> dict:
        """What the verification needs besides the nodes' calls (stored with the rollout), in
        a size that grows with the nodes and rows, never with their product: each row as its
        leaf (its path follows the nodes' parents: `branch`), and the row that trains each
        sampled node (on a later row that holds it, it is context: `row_context`)."""
        return {
            "leaves": [path[-1] for path in self.rows],
            "owners": {str(k): row for k, row in self.owners.items()},
            "sampled": self.n_sampled,
            "roots": self.n_roots,
            "selected": self.n_selected,
            "offchain": [i for i in self.sampled if i not in self.nodes] if self.rows else None,
            "policy": list(self.policy) if self.policy is not None else None,
        }


def branch(leaf: int, parent_of) -> list[int]:
    """The nodes of the row that ends at `leaf`, root first, from `parent_of(node)` (a node's
    parent, or None); ValueError when the walk does not end (nodes that are not a tree)."""
    path, k, steps = [], leaf, 0
    while k is not None:
        path.append(k)
        k = parent_of(k)
        steps += 1
        if steps > 1 << 26:
            raise ValueError(f"the branch to leaf {leaf} does not reach a root")
    path.reverse()
    return path


def row_context(row: int, path: list[int], owners: dict[str, int]) -> set[int]:
    """The sampled nodes of row `row` (its `path`) that an earlier row trains (10.5)."""
    return {k for k in path if owners.get(str(k), row) < row}


def context_call(node: int) -> str:
    """The derived call of a sampled node's copy as context (mask 0, log probabilities 0.0)
    on a row after the one that trains it (10.5, exactly-once ownership)."""
    return f"{node}c"


class Masked(Exception):
    def __init__(self, reason: Reason, detail: str, node: int | None = None):
        super().__init__(detail)
        self.reason, self.detail, self.node = reason, detail, node


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


_LISTS = ("token_ids", "mask", "logprobs", "semantic_parents")


def _check_graph(trace: dict, out: TraceRollout, max_tokens: int) -> None:
    version = trace.get("version", TRACE_VERSION)
    if not (_is_int(version) and version == TRACE_VERSION):
        raise Masked(Reason.UNSUPPORTED_VERSION, f"trace version {json.dumps(version)[:40]}, expected 1")
    nodes = trace.get("nodes", [])
    if not isinstance(nodes, list):
        raise Masked(Reason.INVALID_RECORD, f"nodes is {type(nodes).__name__}, not an array")
    for i, node in enumerate(nodes):  # check 4: the JSON types
        _check_types(i, node)
    n = len(nodes)
    parents: list[int | None] = [node.get("parent") for node in nodes]
    for i, p in enumerate(parents):  # check 5
        if p is not None and not 0 <= p < n:
            raise Masked(Reason.MISSING_PARENT, f"node {i}: parent {p} is not a node of the trace ({n} nodes)", i)
    _no_cycle(parents)  # check 6
    if not any(node.get("token_ids") for node in nodes):  # check 7
        raise Masked(
            Reason.MISSING_TOKENS,
            "no node holds a token id (an eval/relay client recorded no tokens)" if n else "the trace has no node",
        )
    checked = [_check_node(i, node) for i, node in enumerate(nodes)]  # check 8
    _rows(nodes, parents, checked, out, max_tokens)
    if not out.rows:  # check 9
        raise Masked(Reason.EMPTY_SELECTION, "no trainable branch holds a sampled token")


def _check_types(i: int, node) -> None:
    if not isinstance(node, dict):
        raise Masked(Reason.INVALID_RECORD, f"node {i} is not an object", i)
    parent = node.get("parent")
    if parent is not None and not _is_int(parent):
        raise Masked(Reason.INVALID_RECORD, f"node {i}: parent {json.dumps(parent)[:40]} is not an integer", i)
    sampled = node.get("sampled", False)
    if not isinstance(sampled, bool):
        raise Masked(Reason.INVALID_RECORD, f"node {i}: sampled {json.dumps(sampled)[:40]} is not a boolean", i)
    for key in _LISTS:
        if not isinstance(node.get(key, []), list):
            raise Masked(Reason.INVALID_RECORD, f"node {i}: {key} is not an array", i)
    for link in node.get("semantic_parents", []):
        if not (
            isinstance(link, dict)
            and _is_int(link.get("node"))
            and link["node"] >= 0
            and isinstance(link.get("type"), str)
        ):
            raise Masked(
                Reason.INVALID_RECORD,
                f"node {i}: semantic_parents holds {json.dumps(link)[:60]}, not {{node: integer >= 0, type: string}}",
                i,
            )


def _no_cycle(parents: list[int | None]) -> None:
    """Check 6: the first node (index order) whose parent walk meets a node twice. Each node
    is walked once: a walk stops at a node already known to reach a root."""
    reaches_root = [False] * len(parents)
    for i in range(len(parents)):
        path: list[int] = []
        on_path: set[int] = set()
        k: int | None = i
        while k is not None and not reaches_root[k]:
            if k in on_path:
                raise Masked(Reason.LINEAGE_CYCLE, f"node {i}: its parent walk meets node {k} twice", i)
            on_path.add(k)
            path.append(k)
            k = parents[k]
        for j in path:
            reaches_root[j] = True


_INTS, _BOOLS, _NUMBERS = {int}, {bool}, {int, float}  # the exact Python types of JSON's values (bool is no int)


@functools.cache
def _no_tokens() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The arrays of every node without tokens (a fork of a million empty nodes holds no
    arrays of each node's own)."""
    import numpy as np

    return np.zeros(0, np.int64), np.zeros(0, np.bool_), np.zeros(0, np.float64)


def _check_node(i: int, node: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check 8 for one node, in its order; returns its ids (int64), mask (bool) and log
    probabilities (float64, one per sampled token). A list's values are judged by their
    exact types first (`set(map(type, ...))`, in C), then converted in one call."""
    import numpy as np

    token_ids, mask, logprobs = node.get("token_ids", []), node.get("mask", []), node.get("logprobs", [])
    sampled = node.get("sampled", False)
    if not token_ids and not mask and not logprobs:  # no token: the verdicts below, and no arrays of its own
        if sampled:
            raise Masked(Reason.EMPTY_GENERATION, f"node {i}: sampled, but no token has mask true", i)
        return _no_tokens()
    if len(mask) != len(token_ids):
        raise Masked(Reason.LENGTH_MISMATCH, f"node {i}: {len(mask)} mask values for {len(token_ids)} token ids", i)
    if not set(map(type, token_ids)) <= _INTS:
        raise Masked(Reason.INVALID_TOKEN, f"node {i}: a token id is not an integer in [0, 2**31)", i)
    try:
        ids = np.fromiter(token_ids, np.int64, len(token_ids))
    except OverflowError:  # beyond int64 (which a fast JSON reader may hand over as a float)
        raise Masked(Reason.INVALID_TOKEN, f"node {i}: a token id is not an integer in [0, 2**31)", i) from None
    out = (ids < 0) | (ids >= TOKEN_LIMIT)
    if out.any():
        raise Masked(Reason.INVALID_TOKEN, f"node {i}: token id {ids[out][0]} outside [0, 2**31)", i)
    if not set(map(type, mask)) <= _BOOLS:
        raise Masked(Reason.INVALID_MASK, f"node {i}: a mask value is not a boolean", i)
    m = np.fromiter(mask, np.bool_, len(mask))
    ones = int(np.count_nonzero(m))
    if ones and sampled is not True:
        raise Masked(Reason.INVALID_MASK, f"node {i}: mask true on a node that was not sampled", i)
    if ones and not m[len(m) - ones :].all():
        raise Masked(Reason.INVALID_MASK, f"node {i}: a mask false after a true", i)
    if sampled and not ones:
        raise Masked(Reason.EMPTY_GENERATION, f"node {i}: sampled, but no token has mask true", i)
    if len(logprobs) != ones:
        raise Masked(Reason.LENGTH_MISMATCH, f"node {i}: {len(logprobs)} logprobs for {ones} sampled tokens", i)
    kinds = set(map(type, logprobs))
    if type(None) in kinds:
        raise Masked(Reason.INVALID_LOGPROB, f"node {i}: a log probability is null (NaN or infinite as written)", i)
    try:
        if not kinds <= _NUMBERS:
            raise TypeError
        lp = np.fromiter(logprobs, np.float64, len(logprobs))
    except (TypeError, OverflowError):
        raise Masked(Reason.INVALID_LOGPROB, f"node {i}: a log probability is not a number in float64", i) from None
    if not np.isfinite(lp).all():
        raise Masked(Reason.INVALID_LOGPROB, f"node {i}: a log probability is not finite", i)
    if (lp > 0).any():
        raise Masked(Reason.INVALID_LOGPROB, f"node {i}: log probability {lp[lp > 0][0]:g} > 0", i)
    return ids, m, lp


def leaves(parents: list[int | None]) -> list[int]:
    """The nodes that are no node's parent, in index order (graph.leaves)."""
    is_parent = set(p for p in parents if p is not None)
    return [i for i in range(len(parents)) if i not in is_parent]


def path_to(leaf: int, parents: list[int | None]) -> list[int]:
    """The branch of `leaf`: its root first (the graph was checked acyclic)."""
    path = []
    k: int | None = leaf
    while k is not None:
        path.append(k)
        k = parents[k]
    path.reverse()
    return path


def branch_tokens(parents: list[int | None], sizes: list[int], ends: list[int]) -> int:
    """The tokens of the branches root..k for each k of `ends`, shared nodes counted on every
    branch and each node as at least one token: what the rows of those branches would hold,
    found without building one (a pass over the nodes, never over their tokens)."""
    upto = [-1] * len(parents)  # the tokens root..k
    for start in range(len(parents)):
        walk: list[int] = []
        k: int | None = start
        while k is not None and upto[k] < 0:
            walk.append(k)
            k = parents[k]
        held = 0 if k is None else upto[k]
        for j in reversed(walk):
            held += max(sizes[j], 1)
            upto[j] = held
    return sum(upto[k] for k in ends)


def untrainable_leaves(nodes: list[dict]) -> set[int]:
    """Leaves' candidates that are unaccepted compaction attempts (10.5): a node with a
    `compaction_attempt` link that no node's `compaction` link names."""
    attempts = {i for i, node in enumerate(nodes) if any(_link(x) == "compaction_attempt" for x in _links(node))}
    accepted = {x["node"] for node in nodes for x in _links(node) if _link(x) == "compaction"}
    return attempts - accepted


def _links(node) -> list:
    links = node.get("semantic_parents", []) if isinstance(node, dict) else []
    return links if isinstance(links, list) else []


def _link(x) -> str | None:
    return x.get("type") if isinstance(x, dict) else None


def _rows(nodes: list[dict], parents: list[int | None], checked: list, out: TraceRollout, max_tokens: int) -> None:
    """10.5: the trainable branches in leaf order; each sampled node is trained on the first
    of them that holds it and is context on the later ones (exactly-once ownership); a
    branch left with nothing to train is not a row. Nothing is built when the trainable
    branches hold more than `max_tokens` tokens (CONTRACT.md 12): the rollout is masked."""
    import numpy as np

    rejected = untrainable_leaves(nodes)
    held = branch_tokens(parents, [len(c[0]) for c in checked], [k for k in leaves(parents) if k not in rejected])
    if held > max_tokens:
        raise Masked(
            Reason.INVALID_RECORD,
            f"its trainable branches hold {held:,} tokens with their shared context, over the {max_tokens:,} "
            "a rollout's rows may hold (max_rollout_tokens); not built",
        )
    owner: dict[int, int] = {}  # a sampled node: the row that trains it
    for leaf in leaves(parents):
        if leaf in rejected:
            continue  # set aside first: an unaccepted compaction attempt claims nothing
        path = path_to(leaf, parents)
        sampled = [k for k in path if checked[k][1].any()]
        if all(k in owner for k in sampled):
            continue  # no sampled token, or every one trained on an earlier row
        out.context.append([k for k in sampled if k in owner])
        for k in sampled:
            owner.setdefault(k, len(out.rows))
        out.rows.append(path)
        out.owners = owner
        for k in path:
            if k not in out.nodes:
                ids, m, lp = checked[k]
                mask = m.astype(np.float32)
                logprobs = np.zeros(len(ids), dtype=np.float32)
                logprobs[m] = lp
                out.nodes[k] = Node(k, parents[k], nodes[k].get("sampled", False) is True, ids, mask, logprobs)


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
