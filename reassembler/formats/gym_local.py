"""NeMo Gym's local capture mode, as Gym 0.7.0 writes it (CONTRACT.md 9.2-9.5).

Files, in the ledger partition (Gym's flat `token_id_capture.dir`), per capture key R:

    R.tokens.jsonl       one TokenEntry per committed call, one JSON object a line (orjson,
                         keys sorted): the call's ids, parent, prompt (full, or the tokens
                         after its parent's when prompt_is_delta), generated ids and log
                         probabilities, cum_len and the digest of the full sequence
    R.tokens.intents     one call id a line, written before the call is sent
    R.tokens.incomplete  one call id a line ("" allowed): a call whose tokens were lost
    R.tokens.state.json  {"retired", "incomplete", "entry_digests", "indexed_size", ...}
    R.tokens.lock, .tokens-state-*                 ignored

Digests, version 1 (the first byte of the hashed bytes; no field names it):

    tokens digest(v) = sha256(b"nemo-gym-tokens")                          when v is empty
                     = sha256(b"nemo-gym-tokens" || u8(1) || u64(len v) || u64(v0) || ...)
    entry digest     = sha256(the line's bytes, without its "\\n", whitespace stripped)

u64 is 8 bytes big-endian unsigned. `v` is the call's full sequence: its full prompt, then
its generated ids. This module parses and checks one line at a time (`parse_entry`, the
checks Gym's TokenEntry validator makes) and hashes; load/local_capture.py turns a
rollout's entries into the contract's calls.
"""

from __future__ import annotations

import array
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import numpy as np

from ..reasons import Reason

TOKENS_SUFFIX = ".tokens.jsonl"
COMPANIONS = {".tokens.jsonl": "entries", ".tokens.intents": "intents", ".tokens.incomplete": "incomplete"}
STATE_SUFFIX = ".tokens.state.json"
IGNORED_SUFFIXES = (".tokens.lock",)
CAPTURE_SUFFIXES = (*COMPANIONS, STATE_SUFFIX)  # the files this reader looks at
IGNORED_PREFIX = ".tokens-state-"  # Gym's temporary state file

DIGEST_PREFIX = b"nemo-gym-tokens"
DIGEST_VERSION = 1
SCHEMA_VERSION = 1  # TokenEntry's; an absent schema_version is 1
RESOLUTIONS = ("root", "resolved", "unresolved")
_HEAD = struct.Struct(">BQ")


def capture_file(name: str) -> tuple[str, str] | None:
    """(capture key, role) of a file in the ledger partition that belongs to local capture:
    role "entries", "intents", "incomplete" or "state"; None for any other file (a lock,
    a lineage file, Gym's temporary state file)."""
    if name.startswith(IGNORED_PREFIX) or name.endswith(IGNORED_SUFFIXES):
        return None
    if name.endswith(STATE_SUFFIX):
        return name[: -len(STATE_SUFFIX)], "state"
    for suffix, role in COMPANIONS.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], role
    return None


def valid_key(key: str) -> bool:
    """Gym's validate_rollout_id: non-empty, ASCII letters, digits and `._-` only."""
    return bool(key) and key.isascii() and all(c.isalnum() or c in "._-" for c in key)


def tokens_digest(parts: Sequence[bytes | memoryview], n: int) -> str:
    """The tokens digest of a sequence of `n` ids given as big-endian u64 bytes in `parts`
    (its pieces end to end)."""
    if n == 0:
        return hashlib.sha256(DIGEST_PREFIX).hexdigest()
    h = hashlib.sha256(DIGEST_PREFIX + _HEAD.pack(DIGEST_VERSION, n))
    for part in parts:
        h.update(part)
    return h.hexdigest()


def entry_digest(line: bytes) -> str:
    return hashlib.sha256(line.rstrip(b"\n").strip()).hexdigest()


class LineProblem(Exception):
    """A line Gym's own reader would refuse: the rollout is masked with `reason` (9.3)."""

    def __init__(self, reason: Reason, detail: str, call_id: str | None = None):
        super().__init__(detail)
        self.reason, self.detail, self.call_id = reason, detail, call_id


@dataclass
class Entry:
    """One TokenEntry line, its shape checked; the token lists are still Python lists (the
    caller converts them in one call each), or already numpy arrays (load/entry_reader.py)."""

    line: int
    raw: bytes
    model_call_id: str
    parent_call_id: str | None
    resolution: str  # root | resolved | unresolved: Gym's parent_resolution, an absent one mapped (9.6)
    prompt_is_delta: bool
    prompt: list
    generated: list
    logprobs: list
    cum_len: int | None
    digest: str | None
    response_id: str | None
    output_items: list[dict]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_entry(obj, raw: bytes, line: int, key: str) -> Entry:
    """One line of `key`.tokens.jsonl, decoded (`obj`), checked as Gym's TokenEntry
    validator checks it; LineProblem when it fails."""
    where = f"line {line}"
    if not isinstance(obj, dict):
        raise LineProblem(Reason.INVALID_RECORD, f"{where}: not a JSON object")
    cid = obj.get("model_call_id")
    call_id = cid if isinstance(cid, str) and cid else None

    def bad(detail: str, reason: Reason = Reason.INVALID_RECORD) -> LineProblem:
        return LineProblem(reason, f"{where}: {detail}", call_id)

    version = obj.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION or not _is_int(version):
        raise bad(f"schema_version {orjson.dumps(version).decode()[:40]}, only 1 is read", Reason.UNSUPPORTED_VERSION)
    rid = obj.get("rollout_id")
    if not isinstance(rid, str):
        raise bad("rollout_id is missing or not a string")
    if rid != key:
        raise bad(f"rollout_id {rid!r} in the file of capture key {key!r}", Reason.FIELD_MISMATCH)
    if call_id is None:
        raise bad("model_call_id is missing or not a non-empty string")
    lists: dict[str, Any] = {}
    for name in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
        v = obj.get(name)
        # a list, or the numpy array DuckDB's JSON reader made of it (load/entry_reader.py)
        if not isinstance(v, list) and getattr(v, "ndim", None) != 1:
            raise bad(f"{name} is missing or not a list")
        lists[name] = v
    if len(lists["generation_log_probs"]) != len(lists["generation_token_ids"]):
        raise bad(
            f"generation_log_probs has {len(lists['generation_log_probs'])} values, "
            f"generation_token_ids {len(lists['generation_token_ids'])}"
        )
    items = obj.get("output_items", [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise bad("output_items is not a list of objects")
    index = obj.get("token_item_index")
    if index is not None and (not _is_int(index) or not 0 <= index < len(items)):
        raise bad(f"token_item_index {orjson.dumps(index).decode()[:40]} is not an index of output_items")
    parent = obj.get("parent_call_id")
    if parent is not None and not isinstance(parent, str):
        raise bad("parent_call_id is not a string")
    parent = parent or None
    resolution = obj.get("parent_resolution")
    if resolution is not None and resolution not in RESOLUTIONS:
        raise bad(f"parent_resolution {orjson.dumps(resolution).decode()[:40]} is not root, resolved or unresolved")
    if resolution == "resolved" and parent is None:
        raise bad("parent_resolution resolved without parent_call_id")
    if resolution in ("root", "unresolved") and parent is not None:
        raise bad(f"parent_resolution {resolution} with parent_call_id {parent}")
    if resolution is None:  # Gym's compatibility callers (9.6)
        resolution = "resolved" if parent is not None else "unresolved"
    delta = obj.get("prompt_is_delta", False)
    if not isinstance(delta, bool):
        raise bad("prompt_is_delta is not a boolean")
    if delta and resolution != "resolved":
        raise bad("prompt_is_delta without a resolved parent")
    cum_len, digest = obj.get("cum_len"), obj.get("digest")
    if cum_len is not None and not _is_int(cum_len):
        raise bad("cum_len is not an integer")
    if digest is not None and not isinstance(digest, str):
        raise bad("digest is not a string")
    response_id = obj.get("response_id")
    return Entry(
        line=line,
        raw=raw,
        model_call_id=call_id,
        parent_call_id=parent,
        resolution=resolution,
        prompt_is_delta=delta,
        prompt=lists["prompt_token_ids"],
        generated=lists["generation_token_ids"],
        logprobs=lists["generation_log_probs"],
        cum_len=cum_len,
        digest=digest,
        response_id=response_id if isinstance(response_id, str) and response_id else None,
        output_items=items,
    )


def parse_state(raw: bytes) -> dict:
    """The state file's fields this reader uses; ValueError when it is not a JSON object."""
    state = orjson.loads(raw)
    if not isinstance(state, dict):
        raise ValueError("not a JSON object")
    digests = state.get("entry_digests")
    size = state.get("indexed_size")
    return {
        "retired": state.get("retired") is True,
        "incomplete": state.get("incomplete") is True,
        "entry_digests": digests if isinstance(digests, dict) else {},
        "indexed_size": size if _is_int(size) else None,
    }


def int_array(values: list, strict: bool = False) -> np.ndarray:
    """A JSON list of integers as int64, converted in one call. TypeError when an element is
    not an integer (a float, null, a string), OverflowError when one is beyond int64. A JSON
    `true` / `false` reads as 1 / 0, as Gym's TokenEntry validator (pydantic, lax) reads it,
    unless `strict` (a rebuilt line's checks refuse it, CONTRACT.md 9.10). numpy and pyarrow
    are imported here, not with the module: the rollout parse's child processes load this
    module and need them only for a line that carries tokens."""
    import numpy as np

    if not values:
        return np.zeros(0, dtype=np.int64)
    if not strict:
        try:  # C longs straight from the list: the same refusals as below, faster
            return np.frombuffer(array.array("q", values), dtype=np.int64)
        except (TypeError, OverflowError):
            pass  # below, for the error it is (or a list numpy reads after all)
    try:
        decoded = np.array(values)
    except ValueError:  # lists of unequal lengths inside
        raise TypeError("not a list of integers") from None
    if decoded.ndim != 1:  # lists of integers inside: numpy would make a matrix of them
        raise TypeError("not a list of integers")
    if decoded.dtype == np.int64 and not strict:
        return decoded
    import pyarrow as pa

    if not strict:  # a boolean is the integer it reads as
        values = [int(v) if isinstance(v, bool) else v for v in values]
    try:  # the exact reading: refuses floats and booleans, says which integer is too big
        exact = pa.array(values, type=pa.int64())
    except OverflowError:
        raise
    except (pa.ArrowException, TypeError, ValueError):
        raise TypeError("not a list of integers") from None
    if exact.null_count or decoded.dtype.kind == "f":
        raise TypeError("not a list of integers")
    return exact.to_numpy()


def float_array(values: list, strict: bool = False) -> np.ndarray:
    """A JSON list of numbers as float64, null as NaN; TypeError for anything else (a
    boolean reads as 1.0 / 0.0 unless `strict`)."""
    import numpy as np
    import pyarrow as pa

    if not values:
        return np.zeros(0, dtype=np.float64)
    try:
        array = pa.array(values) if strict else pa.array(values, type=pa.float64())
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        raise TypeError("not a list of numbers") from None
    if not strict:  # float64 already: the typed conversion refused everything else
        return array.to_numpy(zero_copy_only=False)
    if not (pa.types.is_floating(array.type) or pa.types.is_integer(array.type) or pa.types.is_null(array.type)):
        raise TypeError("not a list of numbers")
    return array.cast(pa.float64()).to_numpy(zero_copy_only=False)
