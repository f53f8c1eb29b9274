"""NeMo Gym compaction-agent result lines into derived calls and token rows (CONTRACT.md 11;
the line's format and its checks: formats/gym_envelope.py).

An envelope line is read with the night's other rollout lines (records.parse_rollout checks
it as it is parsed); its rollout row carries the envelope's shape (`trace`: each row's calls,
their Gym completion ids, each row's prompt length) and its `evidence`. Here each call on a
row becomes one derived call (model_call_id: the call's index in the line, parent: the call
before it in its segment) with its token row: the tokens it adds to its segment, mask 0 on
its carried prompt, then its generation. From there the shards treat them as any derived
call (load/gym_capture.py writes them with NeMo Gym's other captures). Whatever other capture
the rollout id has (ledger rows, local-mode files, a retired state file) is not read (11.2).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..formats.gym_envelope import CAPTURE, EnvelopeRollout, describe, read_envelope
from .derived_calls import DerivedCall, token_rows

if TYPE_CHECKING:
    from .derived_calls import TokenRow


def envelope_columns(envelope: EnvelopeRollout) -> dict:
    """The rollout row's capture columns of an envelope line."""
    return {
        "capture": CAPTURE,
        "capture_reason": None if envelope.reason is None else envelope.reason.value,
        "capture_detail": envelope.detail,
        "capture_call_id": envelope.call_id,
        "n_token_items": envelope.n_calls,
        "trace": json.dumps(envelope.shape(), separators=(",", ":")),
        "evidence": envelope.evidence,
    }


def envelope_calls(envelope: EnvelopeRollout) -> Iterator[DerivedCall]:
    """The derived calls of the calls on the rows, in call order (load/derived_calls.py)."""
    for segment in envelope.rows:
        for j, k in enumerate(segment):
            call = envelope.calls[k]
            parent = None if j == 0 else str(segment[j - 1])
            yield DerivedCall(str(k), parent, "text" if j == 0 else "token_in", call.ids, call.mask, call.logprobs)


def derive_again(value, rollout_id: str) -> tuple[dict[str, TokenRow], list[str]]:
    """The token rows of one envelope line's calls read again from the line as it is now
    (`reassembler explain`), by staging key, and the line walked call by call."""
    if not isinstance(value, dict):
        return {}, [f"the line is now a rejected input line: {value}"]
    envelope = read_envelope(value)
    return token_rows(rollout_id, envelope_calls(envelope)), describe(value, envelope)
