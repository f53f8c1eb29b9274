"""The calls of a local-mode rollout (local_capture.py) as ledger rows and token rows, with
each call's own checks (CONTRACT.md 9.6).

Each call's own checks run here too, because only here are the full sequences at hand; the
first failing one is kept on its ledger row (`entry_fault`, `entry_detail`), and the shard
raises it where finalize checks that call (verify/checks.py), so a fault masks the rollout
only on a chain, and counts as an off-chain fault elsewhere. In this order:

    missing_parent / lineage_cycle   a resolved entry whose parent is not an entry of R
                                     (a delta prompt then cannot be rebuilt either)
    invalid_record                   cum_len or digest null
    length_mismatch                  cum_len != the length of the full sequence F
    parent_length_mismatch           the parent's cum_len is longer than the child's prompt
    prefix_mismatch                  a full prompt that does not start with the parent's F
    invalid_token                    an id outside [0, 2**31)
    empty_generation                 no generated token
    invalid_logprob                  a log probability null or not finite
    digest_mismatch                  the tokens digest of F differs from the entry's

(the per-token checks before the digest, as CONTRACT.md 3.3 orders them for staged calls).

Each entry's digest covers its whole sequence F, its length first: it cannot be extended
from the parent's, so a long chain of entries hashes its shared prefix again and again (a
3M-id root and 5,000 one-id deltas: 120 GB). A rollout's digests hash at most
MAX_HASHED_TOKENS ids in all (2 GiB of SHA-256, about a second); an entry past that is not
hashed and carries invalid_record saying so (a choice the contract leaves open: README).
An entry adding more than MAX_ROW_TOKENS tokens (its token row would decode past what one
row may take, formats/token_pieces.py) is invalid_record too, after its digest checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..formats.gym_local import tokens_digest
from ..formats.items import generated_items
from ..reasons import Reason
from .derived_calls import MAX_ROW_TOKENS, TokenRow
from .local_tokens import TOKEN_LIMIT, Masked, Parsed, Sequences, full_ids

UNRESOLVED = "unresolved_parent"  # the poison rows' failure_reason (CONTRACT.md 9.6)
MAX_HASHED_TOKENS = 1 << 28  # the ids a rollout's entry digests may hash in all (the module docstring)


def calls_of(key: str, rel: str, parsed: list[Parsed], walk: list[str]) -> tuple[list[dict], list[TokenRow]]:
    by_id = {p.entry.model_call_id: p for p in parsed}
    seqs = Sequences(by_id)
    calls, tokens = [], []
    hashed = 0  # the ids the rollout's digests have hashed so far
    for p in parsed:
        e = p.entry
        poison = e.resolution == "unresolved"
        row: dict[str, Any] = {
            "rollout_id": key,
            "model_call_id": e.model_call_id,
            "parent_call_id": e.parent_call_id if e.resolution == "resolved" else None,
            "mode": None if poison else ("token_in" if e.resolution == "resolved" else "text"),
            "prev_len": None,
            "delta_len": None,
            "cum_len": e.cum_len,
            "weight_version": None,
            "schema_version": 1,
            "digest_version": 1,
            "extras_digest_version": None,
            "digest": e.digest,
            "extras_digest": None,
            "chain_hash": None,
            "cumulative_hash": None,
            "staging_key": f"{key}/{e.model_call_id}",
            "response_id": e.response_id,
            "admitted_at": None,
            "output_items": [{"id": i, "fingerprint": f} for i, f in generated_items(e.output_items)],
            "output_fingerprint": None,
            "fingerprint_version": None,
            "failure_reason": UNRESOLVED if poison else None,
            "source_file": rel,
            "source_line": e.line,
            "capture": "local",
            "entry_fault": None,
            "entry_detail": None,
        }
        calls.append(row)
        if poison:  # never a chain's call: no token row (a poison row, CONTRACT.md 3.6)
            walk.append(_describe(p, row))
            continue
        n_full = e.cum_len if isinstance(e.cum_len, int) and e.cum_len > 0 else 0
        try:
            if hashed + n_full > MAX_HASHED_TOKENS:
                raise Masked(
                    Reason.INVALID_RECORD,
                    f"its digest covers {n_full:,} tokens, past the {MAX_HASHED_TOKENS:,} a rollout's entry digests "
                    f"may hash in all ({hashed:,} before it); not hashed",
                    e.model_call_id,
                )
            hashed += n_full
            prev, token_row = _check(p, by_id, seqs, row["staging_key"])
            row["prev_len"] = prev
            tokens.append(token_row)
        except Masked as m:
            row["entry_fault"], row["entry_detail"] = m.reason.value, m.detail
            tokens.append(_placeholder(row["staging_key"]))
        if row["prev_len"] is None:
            row["prev_len"] = 0 if e.resolution == "root" else _parent_cum_len(p, by_id)
        if e.cum_len is not None and row["prev_len"] is not None:
            row["delta_len"] = e.cum_len - row["prev_len"]
        walk.append(_describe(p, row))
    return calls, tokens


def _describe(p: Parsed, row: dict) -> str:
    e = p.entry
    place = {"root": "root", "resolved": f"child of {e.parent_call_id}", "unresolved": "unresolved (a poison row)"}
    prompt = f"{'delta' if e.prompt_is_delta else 'full'} prompt of {len(e.prompt)} tokens"
    verdict = (
        f"{row['entry_fault']}: {row['entry_detail']}"
        if row["entry_fault"]
        else ("not checked (never on a chain)" if e.resolution == "unresolved" else "checks pass")
    )
    return (
        f"entry line {e.line} {e.model_call_id}: {place[e.resolution]}, {prompt}, {len(e.generated)} generated, "
        f"cum_len {e.cum_len}: {verdict}"
    )


def _parent_cum_len(p: Parsed, by_id: dict[str, Parsed]) -> int | None:
    parent = by_id.get(p.entry.parent_call_id or "")
    return None if parent is None else parent.entry.cum_len


def _placeholder(staging_key: str) -> TokenRow:
    """The token row of an entry whose checks failed: never part of a row."""
    return TokenRow(staging_key, np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32))


def _check(p: Parsed, by_id: dict[str, Parsed], seqs: Sequences, staging_key: str) -> tuple[int, TokenRow]:
    """One entry's checks (the module docstring's order), and its token row: (prev_len, row)."""
    e = p.entry
    cid = e.model_call_id
    parent = None
    if e.resolution == "resolved":
        parent = by_id.get(e.parent_call_id or "")
        if parent is None:
            raise Masked(Reason.MISSING_PARENT, f"parent {e.parent_call_id} is not an entry of the rollout", cid)
    full = seqs.full(p)  # a delta's parents: missing_parent, lineage_cycle
    if e.cum_len is None or e.digest is None:
        raise Masked(
            Reason.INVALID_RECORD, f"line {e.line}: {'cum_len' if e.cum_len is None else 'digest'} is null", cid
        )
    n = full.n
    if e.cum_len != n:
        raise Masked(Reason.LENGTH_MISMATCH, f"cum_len {e.cum_len} != {n} tokens in the full sequence", cid)
    assert p.prompt is not None and p.generated is not None  # seqs.full checked them
    prompt_len = n - len(p.generated)  # of the full prompt
    prev = 0
    if parent is not None:
        parent_full = seqs.full(parent)
        prev = parent.entry.cum_len if parent.entry.cum_len is not None else parent_full.n
        if prev > prompt_len:
            raise Masked(
                Reason.PARENT_LENGTH_MISMATCH,
                f"parent {parent.entry.model_call_id} cum_len {prev} > this call's prompt of {prompt_len} tokens",
                cid,
            )
        if not e.prompt_is_delta:  # its own prompt, big-endian as hashed, against the parent's F
            if seqs.own(p).pieces[0][: 8 * prev] != b"".join(parent_full.pieces):
                raise Masked(
                    Reason.PREFIX_MISMATCH,
                    f"the prompt does not start with parent {parent.entry.model_call_id}'s {prev} tokens",
                    cid,
                )
    for name, ids in (("prompt_token_ids", p.prompt), ("generation_token_ids", p.generated)):
        if (p.flat is None or not p.flat.clean_ids) and len(ids) and (ids.min() < 0 or ids.max() >= TOKEN_LIMIT):
            bad = np.flatnonzero((ids < 0) | (ids >= TOKEN_LIMIT))
            raise Masked(Reason.INVALID_TOKEN, f"{name}[{bad[0]}] = {ids[bad[0]]}, outside [0, 2**31)", cid)
    if len(p.generated) == 0:
        raise Masked(Reason.EMPTY_GENERATION, "generation_token_ids is empty", cid)
    clean = p.flat is not None and p.flat.clean_logprobs
    bad_lp = (
        np.zeros(0, np.int64) if clean or np.isfinite(p.logprobs.sum()) else np.flatnonzero(~np.isfinite(p.logprobs))
    )
    if len(bad_lp):
        value = p.logprobs[bad_lp[0]]
        shown = "null" if np.isnan(value) else value
        raise Masked(Reason.INVALID_LOGPROB, f"generation_log_probs[{bad_lp[0]}] is {shown}", cid)
    recomputed = tokens_digest(full.pieces, n)
    if recomputed != e.digest:
        raise Masked(Reason.DIGEST_MISMATCH, f"recomputed {recomputed[:16]}.. != entry {e.digest[:16]}..", cid)
    if n - prev > MAX_ROW_TOKENS:
        raise Masked(
            Reason.INVALID_RECORD,
            f"it adds {n - prev:,} tokens, over the {MAX_ROW_TOKENS:,} one token row may hold; not read",
            cid,
        )
    # the new tokens, from `start` in its own prompt, or F's after prev
    if not e.prompt_is_delta:
        start: int | None = prev  # F is its own prompt, then its generation
    elif parent is not None and prev == parent_full.n:
        start = 0  # a delta prompt on all of its parent's F
    else:
        start = None
    end = len(p.prompt) + len(p.generated)
    if p.flat is not None and start is not None:  # slices of the rollout's arrays
        a, b = p.at + start, p.at + end
        return prev, TokenRow(staging_key, p.flat.ids[a:b], p.flat.row_mask[a:b], p.flat.row_logprobs[a:b])
    if start is not None:
        ids = np.concatenate([p.prompt[start:], p.generated])
    else:
        ids = full_ids(full)[prev:]
    carried = prompt_len - prev
    mask = np.concatenate([np.zeros(carried, np.float32), np.ones(len(p.generated), np.float32)])
    logprobs = np.concatenate([np.zeros(carried, np.float32), p.logprobs.astype(np.float32)])
    return prev, TokenRow(staging_key, ids, mask, logprobs)
