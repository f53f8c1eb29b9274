"""A night's verifiers `traces.jsonl` files into rollout rows, derived calls and token rows
(CONTRACT.md 10; the trace format and its checks: formats/verifiers.py).

`read_traces_file` reads one file as the rollout lines are read (load/rollout_lines.py),
sharing the night's rollout ids: each Episode line gives its trainable traces as rollout
rows, checked as they are parsed, or a reject row (a line that is not an Episode, a torn
final line, an Episode id or rollout id seen before). A rollout row carries its trace's
shape (`trace`: the rows' node paths, counts and weight versions, as JSON) and, when every
check passed, the nodes on its rows, which `trace_calls` turns into one derived call per
node (model_call_id: the node's index, parent_call_id: its parent's) and its token row (the
node's ids, mask and log probabilities, 0.0 where the mask is 0). From there the shards
treat them as any derived call (load/gym_capture.py writes them with NeMo Gym's own).

What is counted: a traces file's unit is a rollout (an Episode line may hold several, or
none when every trace is untrainable), or a rejected line; `read = loaded + rejected`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import orjson

from ..formats.night import NightFiles
from ..formats.records import RecordError, torn_line
from ..formats.verifiers import (
    DECODER,
    MAX_ROLLOUT_TOKENS,
    TraceRollout,
    context_call,
    describe,
    parse_episode,
)
from .derived_calls import DerivedCall, token_rows, without_output
from .json_lines import LineRange, decode, guess_ids, json_lines, reject, seen_before

if TYPE_CHECKING:  # the rollout parse's child processes import this module: nothing heavy at import
    from .derived_calls import TokenRow

CAPTURE = "verifiers"  # the rollouts' and their derived calls' capture kind


def read_traces_file(
    night: NightFiles,
    rel: str,
    number: int,
    seen: set[str],
    add: Callable[[dict], None],
    rejects,
    max_line_bytes: int,
    lines: LineRange | None = None,
    episodes: set[str] | None = None,
    max_rollout_tokens: int = MAX_ROLLOUT_TOKENS,
) -> int:
    """Every line of the traces file `rel` (`lines`: of that range only): its rollouts to
    `add` (an id in `seen` is a reject row; the ids kept go into `seen`), or one reject row.
    `episodes`: the Episode ids of the night read so far (a repeated one: the line is a
    reject row). Returns `number` plus the units read (module docstring)."""
    episodes = set() if episodes is None else episodes
    for line, raw, value in json_lines(night.path("rollouts", rel), rel, max_line_bytes, decode_episode, lines):
        try:
            if isinstance(value, RecordError):
                raise torn_line(value, raw)
            rollouts = parse_episode(value, max_rollout_tokens)
        except RecordError as e:
            number += 1
            reject(rejects, "rollouts", rel, line, str(e), raw, *_ids(value))
            continue
        if value["id"] in episodes:  # the first line of an Episode id is the episode: one reject a rollout
            for _ in range(max(1, len(rollouts))):
                number += 1
                reject(rejects, "rollouts", rel, line, str(seen_before(value["id"], "Episode id")), raw, *_ids(value))
            continue
        episodes.add(value["id"])
        for r in rollouts:
            number += 1
            if r.rollout_id in seen:
                reject(rejects, "rollouts", rel, line, str(seen_before(r.rollout_id)), raw, r.rollout_id)
                continue
            seen.add(r.rollout_id)
            row = rollout_row(r)
            row.update(source_file=rel, source_line=line, rollout_seq=len(seen))
            add(row)
    return number


# an array of numbers or of booleans, as verifiers writes a node's lists (the bulk of a line)
_FLAT = re.compile(rb"\[[-+0-9.eE, \t\r\n]*\]|\[[truefals, \t\r\n]*\]")


def decode_episode(raw: bytes):
    """One line's JSON value, or the RecordError that makes it a reject row: exactly as the
    strict decoder (formats/verifiers.py's DECODER, with json_lines.decode's depth guard)
    judges it, faster. orjson reads the line; the strict decoder reads its structure, the
    line with every flat array of numbers or booleans emptied (a few KiB: keys written twice,
    nesting); wherever the two might disagree, the strict decoder reads the whole line:
    orjson refuses it (its error is not ours to word; NaN, a lone surrogate, bytes that are
    not UTF-8 all land here), or an integer past 64 bits came back a float where an integer
    is judged (a parent, a link's node, a version; a token id's verdict is the same). The
    structure is read and let go before orjson reads the line: a line of a million small
    objects (nodes) is held once, never twice."""
    structure = decode(_FLAT.sub(b"[]", raw), DECODER)
    refused = structure if isinstance(structure, RecordError) else None
    del structure
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return decode(raw, DECODER)
    if refused is not None:
        return refused
    return decode(raw, DECODER) if _float_for_int(value) else value


def _float_for_int(value) -> bool:
    """Whether a field whose integers are judged holds a float (orjson reads an integer past
    64 bits as one)."""
    traces = value.get("traces") if isinstance(value, dict) else None
    for t in traces if isinstance(traces, list) else ():
        if not isinstance(t, dict):
            continue
        if isinstance(t.get("version"), float):
            return True
        nodes = t.get("nodes")
        for node in nodes if isinstance(nodes, list) else ():
            if isinstance(node, dict) and (
                isinstance(node.get("parent"), float)
                or any(
                    isinstance(x, dict) and isinstance(x.get("node"), float) for x in _list(node, "semantic_parents")
                )
            ):
                return True
    return False


def _list(node: dict, key: str) -> list:
    v = node.get(key)
    return v if isinstance(v, list) else []


def _ids(value) -> tuple[str | None, None]:
    """The id a rejected Episode line still tells."""
    if isinstance(value, dict) and isinstance(value.get("id"), str) and value["id"]:
        return guess_ids({"rollout_id": value["id"]})[0], None
    return None, None


def rollout_row(r: TraceRollout) -> dict:
    """The rollout row of one trace (formats/fields.py's ROLLOUT), its slot given by the
    merge (10.3), and `verifiers`: the checked trace, when it has rows."""
    shape = r.shape()
    shape["episode"] = r.episode_id
    return {
        "rollout_id": r.rollout_id,
        "group_id": r.group_id,
        "slot": 0,  # the merge numbers the group's rollouts in reading order
        "reward": r.reward,
        "reward_problem": r.reward_problem,
        **without_output(),
        "metadata": r.metadata,
        "capture": CAPTURE,
        "capture_reason": None if r.reason is None else r.reason.value,
        "capture_detail": r.detail,
        "capture_call_id": r.call_id,
        "trace": json.dumps(shape, separators=(",", ":")),
        "episode": r.episode_id,
        "env": r.env,
        "agent": r.agent,
        "temperature": r.temperature,
        "verifiers": r if r.rows else None,
    }


def trace_calls(trace: TraceRollout) -> Iterator[DerivedCall]:
    """The derived calls of a trace's rows' nodes, in node order (load/derived_calls.py);
    then, for each sampled node a later row holds as context (10.5, exactly-once
    ownership), its copy with mask 0 and log probabilities 0.0 (formats/verifiers.py's
    context_call). One at a time: a trace of a million nodes is never held as call rows."""
    import numpy as np

    def parent(node) -> str | None:
        return None if node.parent is None else str(node.parent)

    for k in sorted(trace.nodes):
        node = trace.nodes[k]
        mode = "sampled" if node.sampled else "context"
        yield DerivedCall(str(k), parent(node), mode, node.ids, node.mask, node.logprobs)
    zeros = np.zeros(0, np.float32)
    for k in sorted({k for context in trace.context for k in context}):
        node = trace.nodes[k]
        if len(zeros) < len(node.ids):
            zeros = np.zeros(len(node.ids), np.float32)
        none = zeros[: len(node.ids)]
        yield DerivedCall(context_call(k), parent(node), "context", node.ids, none, none)


def derive_again(raw: bytes, rollout_id: str) -> tuple[dict[str, TokenRow], list[str]]:
    """The token rows of one rollout's nodes read again from its Episode line as it is now
    (`reassembler explain`), by staging key, and the trace walked node by node."""
    value = decode_episode(raw)
    if isinstance(value, RecordError):
        return {}, [f"the line is now a rejected input line: {value}"]
    trace = next((r for r in parse_episode(value) if r.rollout_id == rollout_id), None)
    if trace is None:
        return {}, [f"the line holds no rollout {rollout_id} now"]
    return token_rows(rollout_id, trace_calls(trace)), describe(value, rollout_id)
