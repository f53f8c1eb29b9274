"""Output items of a rollout: which ones the model generated, and their fingerprints.

Fingerprint (CONTRACT.md 2.1), version 1:

    sha256(b"rr-output-item-v1" || canonical_json(item without top-level "id", "status"
                                                   and NeMo Gym's TOKEN_FIELDS, 9.7))

canonical_json: keys sorted at every level, separators (",", ":"), non-ASCII kept as UTF-8.
"""

from __future__ import annotations

import hashlib
import json

import orjson

FINGERPRINT_PREFIX = b"rr-output-item-v1"
# the keys a NeMo Gym model server puts a call's tokens in on a served item, which Gym strips
# before it keeps the item (records.py TOKEN_FIELDS): never part of an item's fingerprint
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")
_NOT_HASHED = ("id", "status", *TOKEN_FIELDS)
_GENERATED_TYPES = {"reasoning", "function_call"}


def is_generated(item: dict) -> bool:
    """Items the model wrote; everything else is an observation carried by the next call."""
    kind = item.get("type")
    if kind in _GENERATED_TYPES:
        return True
    return kind == "message" and item.get("role", "assistant") in ("assistant", None)


class JsonFloat(float):
    """A float as read.py decodes it from a rollout line. orjson refuses it (a float
    subclass), which is how `canonical_json(value, floats_marked=True)` knows to leave a
    value holding floats to `json`, the reference."""


class UnmarkedFloats(dict):
    """A rollout line decoded without JsonFloat marks (read.py does so for a line carrying
    token arrays, whose log probabilities would cost a Python call each): its items'
    fingerprints are written by `json` alone."""


def _holds_float(value) -> bool:
    """Whether a decoded JSON value holds a float anywhere (walked without recursion: a
    line may nest as deep as the decoder allows)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def canonical_json(value, floats_marked: bool = False) -> bytes:
    """The canonical JSON of a value, written by `json`. orjson writes it instead when it
    holds no float (known without a look when `floats_marked`: every float in `value` is
    then a JsonFloat, which orjson refuses) and no integer beyond 64 bits: the same bytes,
    ten times faster (tests/test_items.py)."""
    if floats_marked or not _holds_float(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # a JsonFloat, a big integer, a lone surrogate: json decides
            pass
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def fingerprint(item: dict, floats_marked: bool = False) -> str | None:
    """The item's fingerprint; None when it holds a lone surrogate, which no UTF-8 encodes
    (no producer can have fingerprinted it either: the item matches no call)."""
    body = {k: v for k, v in item.items() if k not in _NOT_HASHED}
    try:
        return hashlib.sha256(FINGERPRINT_PREFIX + canonical_json(body, floats_marked)).hexdigest()
    except UnicodeEncodeError:
        return None


def _item_id(item: dict) -> str | None:
    item_id = item.get("id")
    if not isinstance(item_id, str) or not item_id:
        return None
    try:
        item_id.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no id to compare (the fingerprint still is)
        return None
    return item_id


def generated_items(output: list, floats_marked: bool = False) -> list[tuple[str | None, str | None]]:
    """(id, fingerprint) of each generated item of an output, in order."""
    return [
        (_item_id(item), fingerprint(item, floats_marked))
        for item in output
        if isinstance(item, dict) and is_generated(item)
    ]
