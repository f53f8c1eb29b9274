"""A result line into which NeMo Gym wrote its own rebuilt tokens (CONTRACT.md 9.10).

With `rebuild_response: true` Gym replaces the line's `response.output` with its projection
of one chain: the items that carried a call's tokens (**token items**) hold

    prompt_token_ids      the running sequence up to the call: every token before it
    generation_token_ids  what the call generated
    generation_log_probs  one log probability per generated token

and writes `_ng_token_capture` (its build's metrics) and, when it excluded the rollout,
`mask_sample: true`. A line is **Gym-rebuilt** when it has the key `_ng_token_capture`, or
`mask_sample: true`, or a token item while its capture's state file says `retired: true`.

The line becomes one row: with seen_0 = [] and seen_i = prompt_i + generated_i, the row's
ids are seen_k; each item adds prompt_i[len(seen_{i-1}):] with mask 0 and log probability
0.0, then its generated ids with mask 1 and its log probabilities. No digest, call id or
parent vouches for it: the checks below are all there is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from ..reasons import Reason
from .gym_local import float_array, int_array

if TYPE_CHECKING:
    import numpy as np

TOKEN_KEY = "generation_token_ids"
TOKEN_LIMIT = 2**31


def token_items(output: list) -> list[tuple[int, dict]]:
    """(index in the output, item) of every token item: an object whose generation_token_ids
    is present and not null."""
    return [(k, item) for k, item in enumerate(output) if isinstance(item, dict) and item.get(TOKEN_KEY) is not None]


def marked(obj: dict) -> bool:
    """Gym-rebuilt whatever the state file says: `_ng_token_capture` or `mask_sample: true`."""
    return "_ng_token_capture" in obj or obj.get("mask_sample") is True


@dataclass
class RebuiltRow:
    """The row of a Gym-rebuilt line as one piece per token item (the tokens it adds: its
    carried prompt tokens, mask 0, then its generation, mask 1), or why it is masked."""

    n_items: int  # token items: the audit's n_selected
    reason: Reason | None = None
    detail: str | None = None
    pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None  # (ids int64, mask f32, logprobs f32)


def _masked(n: int, reason: Reason, detail: str) -> RebuiltRow:
    return RebuiltRow(n, reason, detail)


def rebuild(obj: dict) -> RebuiltRow:
    """The checks of CONTRACT.md 9.10 in order, then the row."""
    import numpy as np

    response = obj.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    items = token_items(output) if isinstance(output, list) else []
    if obj.get("mask_sample") is True:
        capture = obj.get("_ng_token_capture")
        detail = "" if capture is None else orjson.dumps(capture, option=orjson.OPT_SORT_KEYS).decode()
        return _masked(len(items), Reason.PRODUCER_MASKED, detail)
    if not any(isinstance(item[TOKEN_KEY], list) and item[TOKEN_KEY] for _, item in items):
        return _masked(len(items), Reason.MISSING_TOKENS, "no output item carries generation_token_ids")
    arrays = []
    for k, item in items:
        where = f"item {k}"
        lists = [item.get(name) for name in ("prompt_token_ids", TOKEN_KEY, "generation_log_probs")]
        if not all(isinstance(v, list) for v in lists):
            return _masked(len(items), Reason.INVALID_RECORD, f"{where}: a token field is not a list")
        prompt, generated, logprobs = (v if isinstance(v, list) else [] for v in lists)
        if len(logprobs) != len(generated):
            return _masked(
                len(items),
                Reason.LENGTH_MISMATCH,
                f"{where}: {len(logprobs)} log probabilities for {len(generated)} generated tokens",
            )
        if not generated:
            return _masked(len(items), Reason.EMPTY_GENERATION, f"{where}: generation_token_ids is empty")
        try:
            p, g = int_array(prompt, strict=True), int_array(generated, strict=True)
        except (TypeError, OverflowError):
            return _masked(len(items), Reason.INVALID_TOKEN, f"{where}: a token id is not an integer in [0, 2**31)")
        if (p.size and (p.min() < 0 or p.max() >= TOKEN_LIMIT)) or g.min() < 0 or g.max() >= TOKEN_LIMIT:
            return _masked(len(items), Reason.INVALID_TOKEN, f"{where}: a token id outside [0, 2**31)")
        try:
            lp = float_array(logprobs, strict=True)
        except TypeError:
            return _masked(len(items), Reason.INVALID_LOGPROB, f"{where}: a log probability is not a number")
        if not np.isfinite(lp).all():
            return _masked(len(items), Reason.INVALID_LOGPROB, f"{where}: a log probability is null or not finite")
        arrays.append((k, p, g, lp))
    pieces = []
    seen = 0
    sequence = np.zeros(0, dtype=np.int64)
    for k, p, g, lp in arrays:
        if len(p) < seen or not np.array_equal(p[:seen], sequence):
            return _masked(
                len(items), Reason.PREFIX_MISMATCH, f"item {k}: prompt_token_ids does not start with the tokens before"
            )
        carried = p[seen:]
        pieces.append(
            (
                np.concatenate([carried, g]),
                np.concatenate([np.zeros(len(carried), np.float32), np.ones(len(g), np.float32)]),
                np.concatenate([np.zeros(len(carried), np.float32), lp.astype(np.float32)]),
            )
        )
        sequence = np.concatenate([p, g])
        seen = len(sequence)
    return RebuiltRow(len(items), pieces=pieces)
