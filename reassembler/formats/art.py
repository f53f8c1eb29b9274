"""OpenPipe ART trajectory Parquet, format version 2 (CONTRACT.md 13; openpipe-art 0.5.23).

One row of an ART file is one trajectory: `trajectory_json` (the authoritative data, ART's
JSON dialect: a NaN or infinite float is the bare literal) with its `group_index`,
`trajectory_index` and `reward`. `read_trajectory` checks one as 13.4 says, in order, and
builds its rows from the training model's branches (formats/art_branches.py):

    invariant: an ok rollout's rows are the training model's branches holding a token it
               trains, in ART's order, each its branch's tokens with loss_mask 1 exactly
               where ART's first-occurrence mask is 1 and that token's log probability
               there (0.0 elsewhere); a masked rollout has no row and names the first
               check it failed (and the call, `c{k}` or `c{k}.{i}`, for the per-call ones).

The files and nights (13.2, 13.3): formats/art_files.py.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from ..reasons import Reason
from .art_branches import Call, Choice, branch_tokens, build_branches, first_occurrence, normalize, without_nulls

TOKEN_LIMIT = 2**31
TRAINING_MODEL = re.compile(r"^(?P<name>.+)@(?P<step>[0-9]+)$")  # `{name}@{N}`: a checkpoint ART served


@dataclass
class ArtRow:
    ids: np.ndarray  # int64
    mask: np.ndarray  # float32, 1.0 where it trains
    logprobs: np.ndarray  # float32, 0.0 off the mask
    prompt_len: int
    call_ids: list[str]
    sampled: int = 0  # its sampled tokens (trained here or on an earlier row: first occurrence)


@dataclass
class ArtRollout:
    """One trajectory read: why it is masked (`reason`, `detail`, `call_id`) or its rows."""

    reason: Reason | None = None
    detail: str | None = None
    call_id: str | None = None
    rows: list[ArtRow] = field(default_factory=list)
    n_sampled: int = 0  # sampled choices of the training model (the audit's n_ledger_calls)
    n_selected: int = 0  # those with a trained token on the rows
    n_roots: int = 0  # branches started without a parent
    agent: str | None = None
    temperature: float | None = None
    policy: tuple[int, int] | None = None


class Masked(Exception):
    def __init__(self, reason: Reason, detail: str, call_id: str | None = None):
        super().__init__(detail)
        self.reason, self.detail, self.call_id = reason, detail, call_id


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_trajectory(trajectory, reward) -> ArtRollout:
    """One trajectory (`trajectory_json`, decoded) with its row's `reward` column."""
    out = ArtRollout()
    try:
        _read(trajectory, reward, out)
    except Masked as m:
        out.reason, out.detail, out.call_id, out.rows = m.reason, m.detail, m.call_id, []
    return out


def _read(t, reward, out: ArtRollout) -> None:
    if not isinstance(t, dict):
        raise Masked(Reason.INVALID_RECORD, "trajectory_json is not a JSON object")
    exchanges = t.get("exchanges") or {}
    legacy = t.get("messages_and_choices") or []
    if not isinstance(exchanges, dict):
        raise Masked(Reason.INVALID_RECORD, "exchanges is not an object")
    chats = exchanges.get("chat_completions") or []
    if chats and (legacy or t.get("additional_histories")):
        raise Masked(Reason.INVALID_RECORD, "the trajectory holds both exchanges and messages_and_choices")
    if not chats and not legacy:
        raise Masked(Reason.MISSING_TOKENS, "the trajectory made no call (neither exchanges nor messages_and_choices)")
    if not chats:
        _check_reward(t, reward)
        _legacy(t, out)
        _policy(t, out)
        return
    calls = _calls(chats)
    models = {c.model for c in calls}
    named = sorted({m for m in models if TRAINING_MODEL.match(m)})
    if len(named) > 1:
        raise Masked(
            Reason.FIELD_MISMATCH, f"its calls use two training-model names ({', '.join(named[:2])}): ART trains none"
        )
    model = named[0] if named else calls[0].model
    mine = [c for c in calls if c.model == model]
    for k, c in enumerate(mine):
        c.k = k
    _check_reward(t, reward)  # 2
    # 3: per call of the training model, then per choice (3.6 waits for the rows)
    for c in mine:
        _check_call(c)
    branches = build_branches(mine)
    tokens = [branch_tokens(b) for b in branches]
    masks = first_occurrence(tokens)
    trained_calls: set[str] = set()
    for b, m in zip(tokens, masks):
        if not m.any():
            continue
        lp = b.logprobs[m]
        bad = ~np.isfinite(lp) | (lp > 0)
        if bad.any():
            at = int(np.flatnonzero(m)[int(np.flatnonzero(bad)[0])])
            call = next(cid for cid, (start, end) in zip(b.call_ids, b.spans) if start <= at < end)
            what = "missing or not finite" if not np.isfinite(lp[bad][0]) else f"{lp[bad][0]:g} > 0"
            raise Masked(Reason.INVALID_LOGPROB, f"{call}: a trained token's log probability is {what}", call)
        first = int(np.flatnonzero(m)[0])
        out.rows.append(
            ArtRow(
                b.ids,
                m.astype(np.float32),
                np.where(m, b.logprobs, 0.0).astype(np.float32),
                first,
                b.call_ids,
                int(b.sampled.sum()),
            )
        )
        trained_calls.update(b.call_ids)
    if not out.rows:  # 4
        raise Masked(Reason.EMPTY_SELECTION, "no branch holds a token the training model trains")
    out.n_sampled = sum(len(c.choices) for c in mine)
    out.n_selected = len(trained_calls)
    out.n_roots = len({b.order[0] for b in branches})
    out.agent = model
    temperatures = {c.temperature for c in mine}
    out.temperature = temperatures.pop() if len(temperatures) == 1 else None
    _policy(t, out)


def _check_reward(t: dict, reward) -> None:
    """Check 2: the reward column, and trajectory_json's (ART leaves out a field at its
    default: a reward of 0.0)."""
    if not (isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward)):
        raise Masked(Reason.INVALID_REWARD, f"reward {reward!r} is not a finite number")
    written = t.get("reward", 0.0)
    if written != reward:
        raise Masked(Reason.FIELD_MISMATCH, f"reward {reward!r} != trajectory_json's {written!r}")


def _policy(t: dict, out: ArtRollout) -> None:
    first_v, final_v = t.get("initial_policy_version"), t.get("final_policy_version")
    if isinstance(first_v, int) and isinstance(final_v, int) and _int(first_v) and _int(final_v):
        out.policy = (first_v, final_v)


def _legacy(t: dict, out: ArtRollout) -> None:
    """A legacy trajectory (13.5): ART's legacy sequences. Its Choices with log probabilities,
    `messages_and_choices` then each of `additional_histories`, in item order (`c{k}`), are
    laid end to end while each prompt extends the sequence so far (its prompt's new tokens
    context, its output trained); one that does not starts the next sequence. A Choice
    without log probabilities is context (ART leaves it out)."""
    histories = [t.get("messages_and_choices") or []]
    extra = t.get("additional_histories") or []
    if not isinstance(extra, list) or not all(isinstance(h, dict) for h in extra):
        raise Masked(Reason.INVALID_RECORD, "additional_histories is not a list of objects")
    histories += [h.get("messages_and_choices") or [] for h in extra]
    if not all(isinstance(h, list) and all(isinstance(i, dict) for i in h) for h in histories):
        raise Masked(Reason.INVALID_RECORD, "messages_and_choices is not a list of objects")
    sequences: list[tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[str]]] = []
    held = 0  # tokens of the sequence being laid
    k = -1
    for item in (i for h in histories for i in h if "finish_reason" in i):
        k += 1
        where = f"c{k}"
        content = item["logprobs"].get("content") if isinstance(item.get("logprobs"), dict) else None
        if item.get("logprobs") is None or content is None:
            continue  # context, as ART reads it
        prompt, ids = item.get("prompt_token_ids"), item.get("token_ids")
        if not isinstance(prompt, list) or not isinstance(ids, list):
            raise Masked(Reason.MISSING_TOKENS, f"{where}: a Choice with log probabilities and no token ids", where)
        for what, values in (("prompt_token_ids", prompt), ("token_ids", ids)):
            if not all(_int(v) and 0 <= v < TOKEN_LIMIT for v in values):
                raise Masked(Reason.INVALID_TOKEN, f"{where}: {what} holds a value not an integer in [0, 2**31)", where)
        if not ids:
            raise Masked(Reason.EMPTY_GENERATION, f"{where}: the Choice has no output token", where)
        if len(content) != len(ids):
            raise Masked(
                Reason.LENGTH_MISMATCH, f"{where}: {len(content)} log probabilities for {len(ids)} tokens", where
            )
        lp = np.array([_number(x.get("logprob") if isinstance(x, dict) else None) for x in content], np.float64)
        bad = (lp > 0) | ~np.isfinite(lp)
        if bad.any():
            raise Masked(Reason.INVALID_LOGPROB, f"{where}: a trained token's log probability is {lp[bad][0]:g}", where)
        p = np.asarray(prompt, np.int64)
        if sequences and len(p) >= held and np.array_equal(p[:held], np.concatenate(sequences[-1][0])):
            new = p[held:]
        else:
            sequences.append(([], [], [], []))
            held, new = 0, p
        ids_, mask, logprobs, calls = sequences[-1]
        out_ids = np.asarray(ids, np.int64)
        ids_ += [new, out_ids]
        mask += [np.zeros(len(new), np.float32), np.ones(len(out_ids), np.float32)]
        logprobs += [np.zeros(len(new), np.float32), lp.astype(np.float32)]
        calls.append(where)
        held += len(new) + len(out_ids)
        out.n_sampled += 1
    for ids_, mask, logprobs, calls in sequences:
        m = np.concatenate(mask)
        first = int(np.flatnonzero(m)[0])
        out.rows.append(ArtRow(np.concatenate(ids_), m, np.concatenate(logprobs), first, calls, int(m.sum())))
    if not out.rows:  # 4
        raise Masked(Reason.EMPTY_SELECTION, "no Choice with log probabilities: nothing trains")
    out.n_selected = out.n_sampled
    out.n_roots = len(out.rows)


def _logprobs(values: list) -> np.ndarray:
    """Log probabilities as float64: a number as written, NaN for anything else (null,
    missing, a string, a boolean)."""
    if set(map(type, values)) <= {float, int}:
        return np.asarray(values, np.float64)
    return np.array([_number(v) for v in values], np.float64)


def _number(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _calls(chats) -> list[Call]:
    """The exchanges as Calls in (start_time, end_time) order; invalid_record for a wrong shape."""
    raw = []
    for i, e in enumerate(chats):
        if not isinstance(e, dict) or not isinstance(e.get("request"), dict) or not isinstance(e.get("response"), dict):
            raise Masked(Reason.INVALID_RECORD, f"exchange {i} is not an object with a request and a response")
        model = e["request"].get("model")
        if not isinstance(model, str) or not model:
            raise Masked(Reason.INVALID_RECORD, f"exchange {i} names no model")
        try:
            start, end = datetime.fromisoformat(e["start_time"]), datetime.fromisoformat(e["end_time"])
        except (KeyError, TypeError, ValueError):
            raise Masked(Reason.INVALID_RECORD, f"exchange {i}: start_time or end_time is not a time") from None
        raw.append((start, end, i, e))
    raw.sort(key=lambda r: (r[0], r[1]))
    return [_call(k, start, end, e) for k, (start, end, _, e) in enumerate(raw)]


def _call(k: int, start: datetime, end: datetime, e: dict) -> Call:
    req, resp = e["request"], e["response"]
    messages = req.get("messages", [])
    choices = resp.get("choices")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise Masked(Reason.INVALID_RECORD, f"c{k}: the request's messages are not a list of objects")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        raise Masked(Reason.INVALID_RECORD, f"c{k}: the response holds no list of choices")
    indices = [c.get("index") for c in choices]
    if not all(_int(i) and i >= 0 for i in indices) or len(set(indices)) != len(indices):
        raise Masked(Reason.INVALID_RECORD, f"c{k}: choice indices are not distinct integers >= 0")
    context = tuple(
        json.dumps(req.get(key), sort_keys=True) for key in ("tools", "chat_template", "chat_template_kwargs")
    )
    prompt = resp.get("prompt_token_ids")
    limit = req.get("max_completion_tokens", req.get("max_tokens"))
    call = Call(
        k,
        req["model"],
        start,
        end,
        [normalize(m) for m in messages],
        context,
        np.zeros(0, np.int64),
        [_choice(k, c, len(choices)) for c in sorted(choices, key=lambda c: c["index"])],
        limit if _int(limit) and limit > 0 else None,
    )
    call.prompt_raw = prompt
    temperature = req.get("temperature")
    call.temperature = float(temperature) if isinstance(temperature, (int, float)) else None
    return call


def _choice(k: int, c: dict, n: int) -> Choice:
    content = (c.get("logprobs") or {}).get("content") if isinstance(c.get("logprobs"), dict) else None
    content = content if isinstance(content, list) else []
    ids = c.get("token_ids")
    message = c.get("message") if isinstance(c.get("message"), dict) else {}
    choice = Choice(
        c["index"],
        np.zeros(0, np.int64),
        np.zeros(0),
        normalize(without_nulls(message)),
        c.get("finish_reason"),
    )
    if content and not all(isinstance(x, dict) for x in content):
        choice.raw = (ids, None, [None] * len(content))
        return choice
    choice.raw = (ids, _token_ids(content), [x.get("logprob") for x in content])
    return choice


def _token_ids(content: list[dict]) -> list[int] | None:
    """The ids a choice's log-probability entries name (`"token_id:N"`, vLLM's
    return_tokens_as_token_ids), or None when an entry names none; judged in Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not content:
        return None
    try:
        tokens = pa.array([x.get("token") for x in content], pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    if tokens.null_count or not pc.all(pc.match_substring_regex(tokens, r"^token_id:-?[0-9]{1,18}$")).as_py():
        return None
    return pc.cast(pc.utf8_slice_codeunits(tokens, len("token_id:")), pa.int64()).to_pylist()


def _ids(values) -> np.ndarray | None:
    """`values` as int64 ids when every one is an integer in [0, 2**31) (types judged in C),
    else None."""
    if not isinstance(values, list) or not set(map(type, values)) <= {int}:
        return None
    try:
        a = np.asarray(values, np.int64) if values else np.zeros(0, np.int64)
    except OverflowError:
        return None
    return a if not len(a) or (int(a.min()) >= 0 and int(a.max()) < TOKEN_LIMIT) else None


def _check_call(c: Call) -> None:
    """Check 3 for one call of the training model, each choice in index order; fills its ids."""
    prompt = c.prompt_raw
    if not isinstance(prompt, list):
        raise Masked(Reason.MISSING_TOKENS, f"c{c.k}: the response carries no prompt_token_ids", f"c{c.k}")
    for choice in c.choices:
        where = c.call_id(choice.index)
        assert choice.raw is not None
        ids, from_tokens, logprobs = choice.raw
        if ids is None and from_tokens is None:  # 3.1
            raise Masked(Reason.MISSING_TOKENS, f"{where}: the choice carries no token ids", where)
        if ids is not None and from_tokens is not None and ids != from_tokens:  # 3.2
            raise Masked(Reason.FIELD_MISMATCH, f"{where}: token_ids and the token_id:N tokens disagree", where)
        ids = ids if ids is not None else from_tokens
        checked: dict[str, np.ndarray] = {}
        for what, values in (("prompt_token_ids", prompt), ("token_ids", ids)):  # 3.3
            found = _ids(values)
            if found is None:
                raise Masked(Reason.INVALID_TOKEN, f"{where}: {what} holds a value not an integer in [0, 2**31)", where)
            checked[what] = found
        if not ids:  # 3.4
            raise Masked(Reason.EMPTY_GENERATION, f"{where}: the choice has no output token", where)
        lp: Any = logprobs if logprobs else [None] * len(ids)
        if len(lp) != len(ids):  # 3.5
            raise Masked(Reason.LENGTH_MISMATCH, f"{where}: {len(lp)} log probabilities for {len(ids)} tokens", where)
        choice.ids = checked["token_ids"]
        choice.logprobs = _logprobs(lp)
        c.prompt_ids = checked["prompt_token_ids"]
