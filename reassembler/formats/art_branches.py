"""OpenPipe ART's branches of one trajectory's chat-completion exchanges, and which sampled
tokens train (CONTRACT.md 13.1 "what ART trains", 13.5; openpipe-art 0.5.23,
`trajectories/_history.py` and `preprocessing/tokenize.py`, read, not copied).

    invariant: the branches are those ART's `chat_completions_histories` builds. The calls
               of one model, in (start_time, end_time) order, each extend the longest open
               branch of the same context (tools, chat template, its kwargs) whose messages
               are a prefix of the call's messages and which the call continues: the last
               sampled output's prompt + output ids are a prefix of the call's prompt ids,
               every sampled reasoning on the branch is still in them, and that output did
               not stop at its token limit inside a tool call. Failing that, a call whose
               messages are a prefix of a branch regenerates from that branch's head (the
               branch stays); else it starts a branch. A call with n choices gives n
               branches. A branch's tokens are its last call's prompt ids + output ids;
               the outputs of its sampled messages found there are its sampled tokens; a
               sampled token trains only at the first occurrence of its token prefix among
               the trajectory's branches in ART's order (sorted by first call time, then
               by the order of their calls and choices): a shared sampled prefix trains once.

Calls: per call, Python (a trajectory holds tens of calls); tokens: numpy, never a loop per
token.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np


@dataclass
class Choice:
    """One choice of a call: its index, output ids (int64) and log probabilities (float64,
    NaN where none was written), and its message as ART's history holds it."""

    index: int
    ids: np.ndarray
    logprobs: np.ndarray
    message: dict
    finish_reason: str | None = None
    raw: tuple | None = None  # (token_ids, the token_id:N ids, log probabilities) as written, until checked


@dataclass
class Call:
    """One chat-completion exchange of the training model, in time order (`k`)."""

    k: int
    model: str
    start: datetime
    end: datetime
    messages: list[dict]  # the request's, normalized
    context: tuple  # tools, chat template, its kwargs (JSON text)
    prompt_ids: np.ndarray
    choices: list[Choice]
    token_limit: int | None = None  # max_completion_tokens, else max_tokens
    prompt_raw: object = None  # response.prompt_token_ids as written, until checked
    temperature: float | None = None  # request.temperature

    def call_id(self, choice: int) -> str:
        """`c{k}`, or `c{k}.{i}` for a call of several choices (13.4)."""
        return f"c{self.k}" if len(self.choices) == 1 else f"c{self.k}.{choice}"


@dataclass(frozen=True)
class Source:
    """Where a branch's message came from: a call's choice (sampled), or a request message."""

    call: Call
    choice: int | None = None  # the choice index: a sampled message
    request_index: int | None = None


@dataclass
class Branch:
    items: list[dict]
    sources: list[Source | None]
    context: tuple
    order: tuple[int, ...]
    first_time: datetime
    keys: list[str] = field(default_factory=list)


def normalize(message: dict) -> dict:
    """A chat message in the form ART's history compares (`normalize_chat_message`)."""
    data = copy.deepcopy(dict(message))
    data.pop("annotations", None)
    if data.get("reasoning_content") is not None and not data.get("reasoning"):
        data["reasoning"] = data.pop("reasoning_content")
    elif data.get("reasoning_content") == data.get("reasoning"):
        data.pop("reasoning_content", None)
    if data.get("role") == "assistant" and data.get("content") is None:
        data["content"] = ""
    elif data.get("content") is None:
        data.pop("content", None)
    if data.get("tool_calls") == []:
        data.pop("tool_calls")
    return data


def without_nulls(value):
    """A response message as pydantic dumps it with exclude_none (its nulls dropped, nested too)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def message_key(message: dict) -> str:
    """What a message is matched by across calls: its visible part (reasoning left out)."""
    data = dict(message)
    data.pop("reasoning", None)
    data.pop("reasoning_content", None)
    return json.dumps(data, sort_keys=True, default=str)


def _is_prefix(prefix, value) -> bool:
    return len(prefix) <= len(value) and all(a == b for a, b in zip(prefix, value))


def _ids_prefix(prefix: np.ndarray, value: np.ndarray) -> bool:
    return len(prefix) <= len(value) and bool(np.array_equal(value[: len(prefix)], prefix))


def _find(tokens: np.ndarray, part: np.ndarray, start: int = 0) -> int:
    """The first position >= start where `part` occurs in `tokens` (-1: nowhere): a byte
    search over the int64 values (C speed, no window per position), kept at value boundaries."""
    n = len(part)
    if n == 0:
        return start
    hay, needle = (
        np.ascontiguousarray(tokens[start:], np.int64).tobytes(),
        np.ascontiguousarray(part, np.int64).tobytes(),
    )
    at = hay.find(needle)
    while at >= 0 and at % 8:
        at = hay.find(needle, at + 1)
    return -1 if at < 0 else start + at // 8


def _last_sampled(branch: Branch, length: int) -> Source | None:
    return next((s for s in reversed(branch.sources[:length]) if s is not None and s.choice is not None), None)


def _choice(source: Source) -> Choice:
    return next(c for c in source.call.choices if c.index == source.choice)


def _extends_exactly(branch: Branch, call: Call, length: int) -> bool:
    prior = _last_sampled(branch, length)
    if prior is None:
        return True
    return _ids_prefix(np.concatenate([prior.call.prompt_ids, _choice(prior).ids]), call.prompt_ids)


def _keeps_reasoning(branch: Branch, call: Call, length: int) -> bool:
    for message, source in zip(branch.items[:length], branch.sources[:length]):
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        if not reasoning or source is None or source.choice is None:
            continue
        sampled = _choice(source).ids
        if len(sampled) and _find(call.prompt_ids, sampled) < 0:
            return False
    return True


def _hit_limit(branch: Branch, length: int) -> bool:
    prior = _last_sampled(branch, length)
    if prior is None:
        return False
    choice = _choice(prior)
    if choice.finish_reason != "tool_calls" or not choice.message.get("tool_calls"):
        return False
    limit = prior.call.token_limit
    return limit is not None and len(choice.ids) >= limit


def _retains_suffix(branch: Branch, call: Call, length: int) -> bool:
    """ART's `_retains_output_suffix`: the call's prompt goes on from the prior call's
    prompt with a continuation that the prior output ends with, or that begins inside it."""
    prior = _last_sampled(branch, length)
    if prior is None:
        return False
    prompt, output = prior.call.prompt_ids, _choice(prior).ids
    if not _ids_prefix(prompt, call.prompt_ids):
        return False
    rest = call.prompt_ids[len(prompt) :]
    if not len(output) or not len(rest):
        return False
    for n in range(min(len(output), len(rest)), 0, -1):  # the longest suffix of the output that starts rest
        if np.array_equal(output[len(output) - n :], rest[:n]):
            return True
    return False


def build_branches(calls: list[Call]) -> list[Branch]:
    """The branches of one model's calls (already in time order), in ART's order."""
    branches: list[Branch] = []
    for sequence, call in enumerate(calls):
        prompt = call.messages
        keys = [message_key(m) for m in prompt]
        n = len(prompt)

        def continues(b: Branch, n: int = n, call: Call = call) -> bool:
            return not _hit_limit(b, n) and _keeps_reasoning(b, call, n) and _extends_exactly(b, call, n)

        def source_continues(b: Branch, n: int = n, call: Call = call) -> bool:
            return _extends_exactly(b, call, n) or _retains_suffix(b, call, n)

        defaults: list[Source | None] = [Source(call, request_index=i) for i in range(n)]
        lineage = [b for b in branches if len(b.items) < n and source_continues(b) and keys[: len(b.items)] == b.keys]
        if lineage:
            parent_l = min(lineage, key=lambda b: (-len(b.items), b.order))
            prompt_sources = [*parent_l.sources, *defaults[len(parent_l.items) :]]
        else:
            prompt_sources = defaults
        candidates = [
            (i, b)
            for i, b in enumerate(branches)
            if b.context == call.context and _is_prefix(b.items, prompt) and continues(b)
        ]
        parent: Branch | None = None
        if candidates:
            index, parent = min(candidates, key=lambda item: (-len(item[1].items), item[1].order))
            branches.pop(index)
            sources = [*parent.sources, *prompt_sources[len(parent.items) :]]
        else:
            regenerations = [
                b for b in branches if b.context == call.context and _is_prefix(prompt, b.items) and continues(b)
            ]
            if regenerations:
                parent = min(regenerations, key=lambda b: b.order)
                sources = list(parent.sources[:n])
            else:
                sources = list(prompt_sources)
        base = parent.order if parent is not None else (sequence,)
        first_time = parent.first_time if parent is not None else call.start
        for choice in call.choices:
            branches.append(
                Branch(
                    items=[*prompt, choice.message],
                    sources=[*sources, Source(call, choice=choice.index)],
                    context=call.context,
                    order=(*base, choice.index),
                    first_time=first_time,
                    keys=[*keys, message_key(choice.message)],
                )
            )
    return sorted(branches, key=lambda b: (b.first_time, b.order))


@dataclass
class BranchTokens:
    """A branch's tokens, which of them were sampled, their log probabilities (NaN where
    none), and its sampled calls root to leaf."""

    ids: np.ndarray
    sampled: np.ndarray  # bool
    logprobs: np.ndarray  # float64
    call_ids: list[str]
    spans: list[tuple[int, int]]  # each sampled call's tokens [start, end), as call_ids ((-1, -1): not found)


def branch_tokens(branch: Branch) -> BranchTokens:
    """Tokens = the last call's prompt ids + its output ids; each sampled message's output
    found in them (at its own prompt's end when its prompt + output lead them, else the next
    place it occurs) is sampled."""
    last = branch.sources[-1]
    assert last is not None and last.choice is not None
    ids = np.concatenate([last.call.prompt_ids, _choice(last).ids])
    sampled = np.zeros(len(ids), bool)
    logprobs = np.full(len(ids), np.nan)
    call_ids: list[str] = []
    spans: list[tuple[int, int]] = []
    at = 0
    seen: set[tuple[int, int]] = set()
    for source in branch.sources:
        if source is None or source.choice is None or (source.call.k, source.choice) in seen:
            continue
        seen.add((source.call.k, source.choice))
        choice = _choice(source)
        whole = np.concatenate([source.call.prompt_ids, choice.ids])
        start = len(source.call.prompt_ids) if _ids_prefix(whole, ids) else _find(ids, choice.ids, at)
        call_ids.append(source.call.call_id(choice.index))
        if start < 0:  # not in these ids (the template dropped or rewrote it): context
            spans.append((-1, -1))
            continue
        end = start + len(choice.ids)
        sampled[start:end] = True
        logprobs[start:end] = choice.logprobs
        spans.append((start, end))
        at = end
    return BranchTokens(ids, sampled, logprobs, call_ids, spans)


def first_occurrence(branches: list[BranchTokens]) -> list[np.ndarray]:
    """Per branch (in ART's order): its sampled tokens whose token prefix no earlier branch
    trained (ART's `_FirstOccurrenceTrie`, one model): a prefix node is claimed by the first
    branch that trains its last token; a later branch sharing that prefix leaves it."""
    out: list[np.ndarray] = []
    for k, b in enumerate(branches):
        claimed = np.zeros(len(b.ids), bool)
        for earlier, trained in zip(branches[:k], out):
            n = min(len(b.ids), len(earlier.ids))
            differ = np.flatnonzero(b.ids[:n] != earlier.ids[:n])
            common = int(differ[0]) if len(differ) else n
            claimed[:common] |= trained[:common]
        out.append(b.sampled & ~claimed)
    return out
