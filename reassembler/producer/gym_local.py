"""Write NeMo Gym's local capture mode the way Gym 0.7.0 writes it (CONTRACT.md 9.2-9.5):
per rollout `R.tokens.jsonl` (one TokenEntry line per call, orjson with sorted keys),
`R.tokens.intents`, `R.tokens.state.json` and `R.tokens.lock`; and a result line rebuilt
by Gym (9.10).

Used by `reassembler synth` and the tests' hand-written nights. The producer side of
formats/gym_local.py and formats/gym_rebuilt.py, kept apart from the reader; both are
held to the night NeMo Gym's own code wrote (tests/data/gym-0.7.0-local).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import orjson

from ..formats.gym_local import tokens_digest
from ..formats.items import is_generated
from .capture import CapturedCall


def _split(c: CapturedCall) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(carried prompt ids, generated ids, their log probabilities) of a call's delta."""
    ids = np.asarray(c.ids, dtype=np.int64)
    mask = np.asarray(c.mask, dtype=np.float32)
    lp = np.asarray(c.logprobs, dtype=np.float64)
    gen = mask == 1
    return ids[~gen], ids[gen], lp[gen]


def local_entries(rollout_id: str, calls: list[CapturedCall], delta=False) -> list[dict]:
    """One TokenEntry per call, in capture order. A call's prompt is its parent's full
    sequence then its carried tokens (a root: its carried tokens); `delta` (a bool, or a
    function of the call) writes a resolved call's prompt as the tokens after its parent's
    (prompt_is_delta). A poison call becomes an `unresolved` entry of its own few tokens."""
    full: dict[str, np.ndarray] = {}
    out = []
    for k, c in enumerate(calls):
        entry: dict = {
            "schema_version": 1,
            "rollout_id": rollout_id,
            "model_call_id": c.call_id,
            "model": "policy",
            "created_at": 1796133075.0 + k,
            "response_id": f"resp_{c.call_id}",
            "fingerprint_version": 2,
            "prefix_requested": False,
            "prefix_supplied": False,
            "routed_experts": None,
        }
        items = [dict(i) for i in c.items]
        generated_at = [j for j, item in enumerate(items) if is_generated(item)]
        entry["output_items"] = items
        entry["token_item_index"] = generated_at[-1] if generated_at else None
        if c.poison is not None:
            prompt = np.asarray([1, 2, 3], dtype=np.int64)
            gen, lp = np.asarray([7], dtype=np.int64), np.asarray([-0.5])
            entry.update(parent_call_id=None, parent_resolution="unresolved", parent_resolution_reason=c.poison)
            entry.update(prompt_is_delta=False, prompt_token_ids=prompt.tolist())
            sequence = np.concatenate([prompt, gen])
        else:
            carried, gen, lp = _split(c)
            resolved = c.parent is not None and c.parent in full
            before = full[c.parent] if c.parent is not None and resolved else np.zeros(0, dtype=np.int64)
            sequence = np.concatenate([before, carried, gen])
            is_delta = resolved and (delta(c) if callable(delta) else bool(delta))
            prompt = carried if is_delta else np.concatenate([before, carried])
            entry.update(
                parent_call_id=c.parent if resolved else None,
                parent_resolution="resolved" if resolved else "root",
                parent_resolution_reason="",
                prompt_is_delta=is_delta,
                prompt_token_ids=prompt.tolist(),
            )
            full[c.call_id] = sequence
        entry.update(
            generation_token_ids=gen.tolist(),
            generation_log_probs=[float(v) for v in lp],
            cum_len=len(sequence),
            digest=tokens_digest([sequence.astype(">u8").tobytes()], len(sequence)),
        )
        out.append(entry)
    return out


def entry_line(entry: dict) -> bytes:
    """A TokenEntry line as Gym's TokenCaptureStore.append writes it (without the newline)."""
    return orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)


def write_local_capture(
    folder: Path,
    rollout_id: str,
    entries: list[dict] | list[bytes],
    intents: list[str] | None = None,
    incomplete: list[str] | None = None,
    state: dict | None = None,
) -> None:
    """`R.tokens.jsonl` (entries as dicts, or as the exact line bytes), `R.tokens.intents`
    (every entry's call id unless given), `R.tokens.state.json` (Gym's index of the lines
    unless given, with `state` merged in), `R.tokens.lock`, and `R.tokens.incomplete` when
    `incomplete` is given."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [e if isinstance(e, bytes) else entry_line(e) for e in entries]
    data = b"".join(line + b"\n" for line in lines)
    (folder / f"{rollout_id}.tokens.jsonl").write_bytes(data)
    index = {}
    for line in lines:
        try:
            cid = orjson.loads(line).get("model_call_id")
        except orjson.JSONDecodeError:
            continue  # a line Gym never acknowledged: not in its index
        if isinstance(cid, str):
            index[cid] = hashlib.sha256(line.strip()).hexdigest()
    if intents is None:
        intents = list(index)
    (folder / f"{rollout_id}.tokens.intents").write_text("".join(f"{i}\n" for i in intents))
    if incomplete is not None:
        (folder / f"{rollout_id}.tokens.incomplete").write_text("".join(f"{i}\n" for i in incomplete))
    body = {
        "entry_digests": index,
        "frozen": False,
        "incomplete": incomplete is not None,
        "indexed_size": len(data),
        "retired": False,
        "snapshot_id": "",
        "version": len(lines),
    }
    body.update(state or {})
    (folder / f"{rollout_id}.tokens.state.json").write_bytes(orjson.dumps(body, option=orjson.OPT_SORT_KEYS) + b"\n")
    (folder / f"{rollout_id}.tokens.lock").touch()


def rebuilt_output(calls: list[CapturedCall]) -> list[dict]:
    """The chain of `calls` (root to leaf) as NeMo Gym's rebuild projects it into a result
    line's `response.output` (CONTRACT.md 9.10): each call's items, the last generated one
    carrying the call's full prompt, its generated ids and their log probabilities."""
    out, sequence = [], np.zeros(0, dtype=np.int64)
    for c in calls:
        carried, gen, lp = _split(c)
        prompt = np.concatenate([sequence, carried])
        items = [dict(i) for i in c.items]
        carrier = max((j for j, item in enumerate(items) if is_generated(item)), default=None)
        if carrier is None:
            items.append({"type": "message", "role": "assistant", "content": []})
            carrier = len(items) - 1
        items[carrier].update(
            prompt_token_ids=prompt.tolist(),
            generation_token_ids=gen.tolist(),
            generation_log_probs=[float(v) for v in lp],
        )
        out.extend(items)
        sequence = np.concatenate([prompt, gen])
    return out
