"""NeMo Gym's assistant fingerprint, `fingerprint_version` 2 (CONTRACT.md 2.4).

NeMo Gym 0.7.0 records on each ledger row `output_fingerprint = afp(items of the response
the call served)`; selection by fingerprints (select.py) recomputes `afp` over spans of the
rollout's model-authored output items and matches them to those rows.

Byte layout, version 2:

    afp(items) = ""                                               no model-authored item
               = hex(sha256(b"nemo-gym-lineage" || F(a_1) || F(a_2) || ...))
                 over the model-authored items a_i (role == "assistant" or
                 type == "function_call"), in order

    field(tag, s) = u8(tag) || u64_be(len(utf8(s))) || utf8(s)
    F(a) = field(0x00, kind) || field(0x01, text)       per part of a.content, in order
        || field(0x02, id) || field(0x03, name) || field(0x04, arguments)
                                                        per tool call of a, in order

Parts: a string content is one ("text", s); list elements give ("text", s) for strings and
text-like blocks, nothing for tool_use / tool_result blocks, (type, cj(block)) for other
typed blocks. Tool calls: the item itself when it is a function_call, then its tool_use
content blocks, then Chat-style `tool_calls`. Arguments given as a JSON string are parsed
and written again canonically, so a harness that re-serialises them changes nothing.
`cj` is `orjson.dumps(v, option=OPT_SORT_KEYS)`: orjson itself, never an imitation. An item
whose content cannot be fingerprinted makes `field_bytes` return None, and no span holding
it matches anything.
"""

from __future__ import annotations

import hashlib
import json
import struct

import orjson

PREFIX = b"nemo-gym-lineage"
VERSION = 2
_TEXT_TYPES = ("", "text", "input_text", "output_text")


class Unfingerprintable(ValueError):
    """Gym would record `output_fingerprint` null for a list holding this item."""


def is_model_authored(item) -> bool:
    """Gym's test, exactly: role assistant, or a function_call item (reasoning is not)."""
    return isinstance(item, dict) and (item.get("role") == "assistant" or item.get("type") == "function_call")


def _cj(value) -> bytes:
    try:  # `default=float`: a float read.py marked (items.JsonFloat) is written as the float it is
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=float)
    except (orjson.JSONEncodeError, TypeError) as e:
        raise Unfingerprintable(str(e)) from e


def _utf8(s: str) -> bytes:
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate
        raise Unfingerprintable(str(e)) from e


def _field(tag: int, data: bytes) -> bytes:
    return struct.pack(">BQ", tag, len(data)) + data


def _args(value) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return _utf8(value.strip())
        except RecursionError as e:
            raise Unfingerprintable("arguments nested too deeply") from e
        return _cj(parsed)
    return _cj(value)


def _parts(content) -> list[tuple[bytes, bytes]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [(b"text", _utf8(content))] if content else []
    if not isinstance(content, list):
        raise Unfingerprintable(f"content is a {type(content).__name__}")
    parts = []
    for block in content:
        if isinstance(block, str):
            if block:
                parts.append((b"text", _utf8(block)))
            continue
        if not isinstance(block, dict):
            raise Unfingerprintable(f"content block is a {type(block).__name__}")
        kind = str(block["type"]) if block.get("type") else ""
        if kind in ("tool_use", "tool_result"):
            continue
        text = block.get("text")
        if isinstance(text, str) and kind in _TEXT_TYPES:
            if text:
                parts.append((b"text", _utf8(text)))
        elif kind == "":
            raise Unfingerprintable("content block without type or text")
        else:
            parts.append((_utf8(kind), _cj(block)))
    return parts


def _name(obj: dict) -> str:
    return str(obj["name"]) if "name" in obj else ""


def _calls(item: dict) -> list[tuple[bytes, bytes, bytes]]:
    calls = []
    if item.get("type") == "function_call":
        name = _name(item)
        if item.get("namespace"):
            name = str(item["namespace"]) + "__" + name
        calls.append(
            (_utf8(str(item.get("call_id") or item.get("id") or "")), _utf8(name), _args(item.get("arguments")))
        )
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append((_utf8(str(block.get("id") or "")), _utf8(_name(block)), _args(block.get("input"))))
    tool_calls = item.get("tool_calls")
    if tool_calls:
        if not isinstance(tool_calls, list):
            raise Unfingerprintable("tool_calls is not a list")
        for k in tool_calls:
            if k is not None and not isinstance(k, dict):
                raise Unfingerprintable("a tool call is not an object")
            function = (k or {}).get("function")
            if function is not None and not isinstance(function, dict):
                raise Unfingerprintable("a tool call's function is not an object")
            function = function or {}
            calls.append(
                (_utf8(str((k or {}).get("id") or "")), _utf8(_name(function)), _args(function.get("arguments")))
            )
    return calls


def field_bytes(item) -> bytes | None:
    """F(item) of one model-authored item, or None when Gym could not fingerprint it."""
    if not isinstance(item, dict):
        return None
    try:
        out = [_field(0, kind) + _field(1, text) for kind, text in _parts(item.get("content"))]
        out += [_field(2, i) + _field(3, n) + _field(4, g) for i, n, g in _calls(item)]
    except Unfingerprintable:
        return None
    return b"".join(out)


def afp(items: list) -> str | None:
    """Gym's `afp` of a list of items: "" with no model-authored item, None when undefined."""
    h = hashlib.sha256(PREFIX)
    seen = False
    for item in items:
        if not isinstance(item, dict):
            return None
        if not is_model_authored(item):
            continue
        fb = field_bytes(item)
        if fb is None:
            return None
        h.update(fb)
        seen = True
    return h.hexdigest() if seen else ""


def model_items(output: list) -> list[tuple[int, bytes | None]]:
    """(index in output, F bytes or None) of each model-authored item of an output."""
    return [(i, field_bytes(item)) for i, item in enumerate(output) if is_model_authored(item)]
