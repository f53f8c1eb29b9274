"""One verifiers trace as the job reads it (CONTRACT.md 10.4 checks 4-9, 10.5): its nodes,
checked, and its rows. The Episode line around it, and checks 1-3: verifiers.py.

A trace is a parent-linked message graph (`version` 1): each node adds its own `token_ids`,
a `mask` parallel to them (true where the model sampled the token) and one log probability
per sampled token. Invariants, in the contract's order, the first failure masking the
rollout: the version is 1; every field has its JSON type; every parent is a node of the
trace and no parent walk meets a node twice; some node holds tokens; each node's lists
agree (mask as long as the ids, ids in [0, 2**31), mask false then true and true only where
sampled, a sampled node samples a token, one log probability <= 0 per sampled token). Then
every trainable branch that holds a sampled token not trained on an earlier branch is a row:
each sampled token of a trace is trained exactly once; and no row is built when the rows
would hold more than `max_rollout_tokens` (CONTRACT.md 12.3).

What is kept of a trace grows with its nodes and rows, never with their product
(`TraceRollout.shape`). numpy is imported where the token lists are read (the rollout
parse's child processes import this module).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeGuard

from ..reasons import Reason

if TYPE_CHECKING:
    import numpy as np

TRACE_VERSION = 1  # verifiers' TRACE_VERSION (trace.py)
TOKEN_LIMIT = 2**31
# the tokens a rollout's rows may hold, shared context counted on every branch (CONTRACT.md 12;
# Settings.max_rollout_tokens): a fork tree's rows repeat the context of each branch
MAX_ROLLOUT_TOKENS = 1 << 24


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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
