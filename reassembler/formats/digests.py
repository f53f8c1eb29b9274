"""Digests of the staged capture, byte-compatible with NeMo Gym staging digest v2.

Byte layout (CONTRACT.md section 4). All integers big-endian; every hash SHA-256, hex
lowercase.

    u64(x)        8 bytes unsigned               u8(x)        1 byte
    text(s)       u64(len(utf8 s)) || utf8 s      opt_text(s)  0x00 | 0x01 || text(s)
    blob(b)       u64(len b) || b                 raw32(h)     the 32 bytes of hex digest h
    ids(v)        u64(len v) || u64(v0) || u64(v1) ...
    f32s(v)       u64(len v) || be_f32(v0) || ...

    cumulative  = H("nemo-gym-staging-prefix-v2" || ids(every token id, root .. this call))
    chain       = H("nemo-gym-staging-chain-v1"  || (0x00 | 0x01 || raw32(parent chain))
                                                 || ids(token_ids_delta))
    staged call = H("nemo-gym-staging-call-v2" || u8 schema || u8 digest_v || u8 extras_v
                    || text rollout_id || text model_call_id || opt_text parent_call_id
                    || text mode || u64 prev_len || u64 delta_len || u64 cum_len
                    || u64 weight_version || blob(ids(token_ids_delta))
                    || blob(f32s(token_mask_delta)) || blob(f32s(generation_logprobs_delta))
                    || raw32 extras_digest || 0x01 || raw32 chain_hash
                    || 0x01 || raw32 cumulative_hash)
    extras      = H("nemo-gym-staging-extras-v1" || u8(1) || enc(extras)), enc typed:
                  N | B 0/1 | I i64 | F f64 | S text | L u64(n) items | D u64(n) (text key, value)*
                  with dict keys sorted by their UTF-8 bytes.

Token payloads are passed in already converted to big-endian bytes (one numpy conversion
per batch, see `to_be_bytes`), so no function here loops over tokens in Python.
"""

from __future__ import annotations

import hashlib
import math
import struct

import numpy as np

PREFIX_CUMULATIVE = b"nemo-gym-staging-prefix-v2"
PREFIX_CHAIN = b"nemo-gym-staging-chain-v1"
PREFIX_CALL = b"nemo-gym-staging-call-v2"
PREFIX_EXTRAS = b"nemo-gym-staging-extras-v1"

_U64 = struct.Struct(">Q")
_PAIR = struct.Struct(">QQ")
_HEAD = struct.Struct(">QQQQQQ")  # prev_len, delta_len, cum_len, weight_version, blob length, id count


def u64(x: int) -> bytes:
    return _U64.pack(x)


def text(s: str) -> bytes:
    b = s.encode("utf-8")
    return _U64.pack(len(b)) + b


def opt_text(s: str | None) -> bytes:
    return b"\x00" if s is None else b"\x01" + text(s)


def raw32(hex_digest: str) -> bytes:
    b = bytes.fromhex(hex_digest)
    if len(b) != 32:
        raise ValueError("a digest must be 32 bytes")
    return b


def to_be_bytes(ids: np.ndarray, mask: np.ndarray, logprobs: np.ndarray) -> tuple[memoryview, memoryview, memoryview]:
    """Flat token arrays -> big-endian u64 ids, f32 mask, f32 logprobs, as byte views (one
    conversion each, no further copy)."""
    return (
        ids.astype(">u8").data.cast("B"),
        mask.astype(">f4").data.cast("B"),
        logprobs.astype(">f4").data.cast("B"),
    )


def staged_call_digest(
    *,
    schema_version: int,
    digest_version: int,
    extras_digest_version: int,
    rollout_id: str,
    model_call_id: str,
    parent_call_id: str | None,
    mode: str,
    prev_len: int,
    delta_len: int,
    cum_len: int,
    weight_version: int,
    ids_be: bytes | memoryview,
    mask_be: bytes | memoryview,
    logprobs_be: bytes | memoryview,
    extras_digest: str,
    chain_hash: str,
    cumulative_hash: str,
) -> str:
    """Staged-record digest of one call; `*_be` are the big-endian token payloads."""
    given = locals()  # the keyword arguments, passed on in STAGED_FIELDS' order (its one definition)
    return staged_digest_of(tuple(given[name] for name in STAGED_FIELDS), ids_be, mask_be, logprobs_be)


# the ledger fields staged_digest_of takes, in its order (before the three token payloads)
STAGED_FIELDS = (
    "schema_version digest_version extras_digest_version rollout_id model_call_id parent_call_id mode "
    "prev_len delta_len cum_len weight_version extras_digest chain_hash cumulative_hash"
).split()


def staged_digest_of(fields: tuple, ids_be, mask_be, logprobs_be) -> str:
    """`staged_call_digest` of a call's STAGED_FIELDS values, for the loop over a batch."""
    (
        schema_version,
        digest_version,
        extras_digest_version,
        rollout_id,
        model_call_id,
        parent_call_id,
        mode,
        prev_len,
        delta_len,
        cum_len,
        weight_version,
        extras_digest,
        chain,
        cumulative,
    ) = fields
    n_ids, n_mask, n_lp = len(ids_be) // 8, len(mask_be) // 4, len(logprobs_be) // 4
    rid, cid, mode_b = rollout_id.encode(), model_call_id.encode(), mode.encode()
    parent = b"\x00" if parent_call_id is None else b"\x01" + text(parent_call_id)
    h = hashlib.sha256(
        b"".join(
            (
                PREFIX_CALL,
                bytes((schema_version & 0xFF, digest_version & 0xFF, extras_digest_version & 0xFF)),
                _U64.pack(len(rid)),
                rid,
                _U64.pack(len(cid)),
                cid,
                parent,
                _U64.pack(len(mode_b)),
                mode_b,
                _HEAD.pack(prev_len, delta_len, cum_len, weight_version, 8 + 8 * n_ids, n_ids),
            )
        )
    )
    h.update(ids_be)
    h.update(_PAIR.pack(8 + 4 * n_mask, n_mask))
    h.update(mask_be)
    h.update(_PAIR.pack(8 + 4 * n_lp, n_lp))
    h.update(logprobs_be)
    h.update(b"".join((raw32(extras_digest), b"\x01", raw32(chain), b"\x01", raw32(cumulative))))
    return h.hexdigest()


def chain_hash(parent_chain_hash: str | None, ids_be: bytes | memoryview) -> str:
    parent = b"\x00" if parent_chain_hash is None else b"\x01" + raw32(parent_chain_hash)
    h = hashlib.sha256(PREFIX_CHAIN + parent + _U64.pack(len(ids_be) // 8))
    h.update(ids_be)
    return h.hexdigest()


def cumulative_hash(ids_be_parts: list[bytes | memoryview]) -> str:
    """Hash of the whole context: the call deltas root to leaf, each big-endian u64."""
    h = hashlib.sha256(PREFIX_CUMULATIVE)
    h.update(_U64.pack(sum(len(p) for p in ids_be_parts) // 8))
    for part in ids_be_parts:
        h.update(part)
    return h.hexdigest()


def _enc(value, out: list[bytes]) -> None:
    if value is None:
        out.append(b"N")
    elif isinstance(value, bool):
        out.append(b"B\x01" if value else b"B\x00")
    elif isinstance(value, int):
        out.append(b"I" + struct.pack(">q", value))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("extras may not hold a non-finite float")
        out.append(b"F" + struct.pack(">d", value))
    elif isinstance(value, str):
        out.append(b"S" + text(value))
    elif isinstance(value, (list, tuple)):
        out.append(b"L" + _U64.pack(len(value)))
        for item in value:
            _enc(item, out)
    elif isinstance(value, dict):
        out.append(b"D" + _U64.pack(len(value)))
        for key in sorted(value, key=lambda k: k.encode("utf-8")):
            out.append(text(key))
            _enc(value[key], out)
    else:
        raise TypeError(f"extras cannot encode a {type(value).__name__}")


def extras_digest(extras) -> str:
    out: list[bytes] = [PREFIX_EXTRAS, b"\x01"]
    _enc(extras, out)
    return hashlib.sha256(b"".join(out)).hexdigest()


NO_EXTRAS_DIGEST = extras_digest(None)
