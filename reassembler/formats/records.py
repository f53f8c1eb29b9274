"""Records of one night, parsed from their JSON lines (CONTRACT.md 2.1 and 2.2).

`parse_rollout` and `parse_ledger_row` turn one decoded JSON value into a flat dict whose
keys are the warehouse columns (sql/schema.sql), or raise `RecordError` with a one-line
reason; the reader turns that into a reject row. Only the *shape* of a record is checked
here (types, required fields). Whether its values make sense (modes, lengths, digests) is
the algorithm's business, so that such a rollout is masked with a reason code instead of
disappearing into the rejects table.
"""

from __future__ import annotations

import json
import math
import re
from typing import TypeGuard

from .fields import LEDGER_DIGESTS, LEDGER_INTS, VERSION_DEFAULTS
from .gym_envelope import contract_of, read_envelope
from .gym_fingerprint import model_items
from .gym_rebuilt import marked, rebuild, token_items
from .items import UnmarkedFloats, generated_items

LINEAGE_SUFFIX = ".lineage.jsonl"
HEX64 = re.compile(r"[0-9a-f]{64}")
HEX64_PATTERN = "^[0-9a-f]{64}$"  # the same, for pyarrow's match_substring_regex
# NeMo Gym's capture key pattern (rollout_correlation.ROLLOUT_ID_PATTERN).
GYM_ROLLOUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_FLOAT_INTS = 2**1024  # integers from here on have no float64 (float() overflows)


class RecordError(ValueError):
    """A JSON line that does not have the shape of its record."""


class NotJson(RecordError):
    """A line that does not parse as JSON at all (a torn one among them)."""


# The reject kind of a file's last line that has no newline and does not parse: a producer
# killed mid-append (README, the quality gate: counted apart from other rejects, never a breach).
TORN_FINAL_LINE = "torn_final_line"


def torn_line(problem: RecordError, raw: bytes) -> RecordError:
    """The reject error of a line that did not decode: `torn_final_line` when it is a
    file's last line with no newline (only the last line can lack one) that is not JSON,
    else `problem` (a line over the size limit stays one, whole or not)."""
    if raw.endswith(b"\n") or not isinstance(problem, NotJson):
        return problem
    return RecordError(f"{TORN_FINAL_LINE}: the last line has no newline and is not whole ({problem})")


def no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict (json's object_pairs_hook); RecordError naming a key
    written twice, at any depth."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RecordError(f"duplicate key {key!r} in a JSON object")
            seen.add(key)
    return obj


_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogate(s: str) -> bool:
    """Whether `s` holds a lone surrogate (JSON's "\\ud800" decodes to one): no UTF-8
    encodes it, so it can be neither stored nor hashed."""
    return not s.isascii() and _SURROGATE.search(s) is not None


def _unicode(key: str, v):
    """An id or key field: refused when it holds a lone surrogate."""
    if isinstance(v, str) and has_surrogate(v):
        raise RecordError(f"{key} is not valid Unicode (it holds a lone surrogate escape such as \\ud800)")
    return v


def storable_text(s: str) -> str:
    """Free text (metadata, a failure reason) as stored: a lone surrogate kept as its JSON
    escape, "\\ud800" (six characters), so the text stays valid UTF-8 and says what was sent."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8") if has_surrogate(s) else s


def _is_int(v) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_str(obj: dict, key: str) -> str | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise RecordError(f"{key} must be a string or null, got {type(v).__name__}")
    return v


def _nonempty_str(v) -> str | None:
    return v if isinstance(v, str) and v else None


def _gym_index(obj: dict, key: str) -> int | None:
    v = obj.get(key)
    if v is not None and (not _is_int(v) or v < 0):
        raise RecordError(f"{key} must be an integer >= 0, got {json.dumps(v)[:40]}")
    return v


def _gym_key(obj: dict, task: int | None, sample: int | None) -> str | None:
    """NeMo Gym's capture key (CONTRACT.md 2.1): `_ng_rollout_id`, else "{task}-{sample}",
    then "-a{attempt}" for a re-dispatch; None when the record has neither."""
    attempt = _gym_index(obj, "_ng_attempt_index")
    key = obj.get("_ng_rollout_id")
    if key is not None and not (isinstance(key, str) and GYM_ROLLOUT_ID.fullmatch(key)):
        raise RecordError(f"_ng_rollout_id must match {GYM_ROLLOUT_ID.pattern}, got {json.dumps(key)[:40]}")
    if key is None and (task is None or sample is None):
        return None
    return (key if key is not None else f"{task}-{sample}") + (f"-a{attempt}" if attempt else "")


def _ids(obj: dict) -> tuple[str, str, int]:
    """rollout_id, group_id and slot: as given, or derived from NeMo Gym's `_ng_*` fields
    for each one the record lacks (CONTRACT.md 2.1)."""
    rollout_id = _nonempty_str(obj.get("rollout_id"))
    group_id = _nonempty_str(obj.get("group_id"))
    slot = obj.get("slot")
    slot = None if slot == "" else slot
    if rollout_id is not None and group_id is not None and slot is not None:
        return rollout_id, group_id, slot
    task = _gym_index(obj, "_ng_task_index")
    sample = _gym_index(obj, "_ng_rollout_index")
    key = _gym_key(obj, task, sample)
    if rollout_id is None:
        if key is None:
            raise RecordError(
                "rollout_id is missing (and no _ng_rollout_id or _ng_task_index + _ng_rollout_index to derive it from)"
            )
        rollout_id = key
    if group_id is None:
        if task is None:
            raise RecordError("group_id is missing (and no _ng_task_index to derive it from)")
        group_id = str(task)
    if slot is None:
        if sample is None:
            raise RecordError("slot is missing (and no _ng_rollout_index to derive it from)")
        slot = sample
    return rollout_id, group_id, slot


def parse_failure(obj) -> dict:
    """One row of NeMo Gym's `<stem>_failures.jsonl` (CONTRACT.md 2.1): the failed attempt's
    capture key, its sample (task and sample index, when given), whether the failure was
    terminal, and its failure class."""
    if not isinstance(obj, dict):
        raise RecordError("a failures row must be a JSON object")
    task = _gym_index(obj, "_ng_task_index")
    sample = _gym_index(obj, "_ng_rollout_index")
    key = _nonempty_str(obj.get("rollout_id")) or _gym_key(obj, task, sample)
    if key is None:
        raise RecordError(
            "the failed attempt's key cannot be derived (no _ng_rollout_id or _ng_task_index + _ng_rollout_index)"
        )
    failure_class = obj.get("_ng_failure_class")
    return {
        "key": _unicode("rollout_id", key),
        "task": task,
        "sample": sample,
        "terminal": obj.get("_ng_failure_terminal") is True,
        "failure_class": storable_text(failure_class if isinstance(failure_class, str) else json.dumps(failure_class)),
    }


def parse_rollout(obj, floats_marked: bool = False) -> dict:
    """`floats_marked`: `obj` was decoded with its floats as items.JsonFloat (read.py).

    Besides the warehouse columns, the row carries `gym_sample` (NeMo Gym's task and sample
    indices, when both are given: CONTRACT.md 2.1's given-up samples) and `gym_rebuilt`
    (for a line that carries token items or NeMo Gym's rebuild marks: whether it is marked,
    and its row or why it is masked, 9.10), which the load takes off."""
    if not isinstance(obj, dict):
        raise RecordError("a rollout line must be a JSON object")
    floats_marked = floats_marked and not isinstance(obj, UnmarkedFloats)
    rollout_id, group_id, slot = _ids(obj)
    if not _is_int(slot) or slot < 0 or slot >= 2**31:
        raise RecordError("slot must be an integer >= 0")
    output = obj.get("output")
    if output is None and isinstance(obj.get("response"), dict):
        output = obj["response"].get("output")
    if not isinstance(output, list) or not all(isinstance(i, dict) for i in output):
        raise RecordError("output (or response.output) must be a list of JSON objects")

    reward, reward_problem = obj.get("reward"), None
    if reward is None:
        reward_problem = "reward is missing"
    elif not isinstance(reward, (int, float)) or isinstance(reward, bool):
        reward, reward_problem = None, f"reward is a {type(reward).__name__}, not a number"
    elif isinstance(reward, int) and abs(reward) >= _FLOAT_INTS:
        digits = len(str(abs(reward)))
        reward, reward_problem = None, f"reward is an integer of {digits} digits, beyond float64"
    elif not math.isfinite(reward):
        reward, reward_problem = None, f"reward is {reward}"
    response = obj.get("response")
    response_id = _nonempty_str(response.get("id")) if isinstance(response, dict) else None
    failure = _opt_str(obj, "failure_reason")
    task, sample = obj.get("_ng_task_index"), obj.get("_ng_rollout_index")
    response_output = response.get("output") if isinstance(response, dict) else None
    carries_tokens = isinstance(response_output, list) and bool(token_items(response_output))
    envelope = read_envelope(obj) if contract_of(obj) is not None else None
    metadata = _audit_metadata(obj, None if envelope is None else envelope.metadata)
    return {
        "rollout_id": _unicode("rollout_id", rollout_id),
        "group_id": _unicode("group_id", group_id),
        "slot": slot,
        "reward": None if reward is None else float(reward),
        "reward_problem": reward_problem,
        "failure_reason": None if failure is None else storable_text(failure),
        "terminal_model_call_id": _unicode(
            "terminal_model_call_id", _nonempty_str(_opt_str(obj, "terminal_model_call_id"))
        ),
        "terminal_response_id": _unicode("response.id", response_id),
        # (id, fingerprint) and (output_index, field): tuples, which Arrow takes as its structs,
        # cheaper than dicts to build and to pickle (rollout_lines.py's children)
        "generated_items": generated_items(output, floats_marked),
        "model_items": model_items(output),
        "n_output_items": len(output),
        "metadata": None
        if metadata is None
        else storable_text(json.dumps(metadata, sort_keys=True, ensure_ascii=False)),
        **gym_origin(obj),
        "gym_sample": (task, sample) if _is_int(task) and _is_int(sample) and min(task, sample) >= 0 else None,
        "gym_rebuilt": {"marked": marked(obj), "row": rebuild(obj)}
        if envelope is None and (marked(obj) or carries_tokens)
        else None,
        "gym_envelope": envelope,
    }


def _audit_metadata(obj: dict, envelope: dict | None):
    """The rollout's `metadata` as the audit keeps it: the line's own, plus NeMo Gym's
    diagnosis (`failure_kind`, `failure_reason`: CONTRACT.md 3.0 item 1) when it names one,
    plus what an envelope line records (11.6). A `metadata` that is not an object is kept
    under the key `metadata` when anything is added to it."""
    metadata = obj.get("metadata")
    extra = dict(envelope or {})
    for key in ("failure_kind", "failure_reason"):
        if obj.get(key) is not None:
            extra[key] = obj[key]
    if not extra:
        return metadata
    if metadata is None:
        return extra
    if isinstance(metadata, dict):
        return {**metadata, **{k: v for k, v in extra.items() if k not in metadata}}
    return {"metadata": metadata, **extra}


def _number(v) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            f = float(v)
        except OverflowError:
            return None
        return f if math.isfinite(f) else None
    return None


def _named(v) -> str | None:
    return storable_text(v) if isinstance(v, str) and v else None


def gym_origin(obj: dict) -> dict:
    """`env`, `agent` and `temperature` of a NeMo Gym result line (CONTRACT.md 5.3; sources
    in docs/CONTRACT.md): `agent_ref.name` (rollout_collection copies the dataset row's
    agent reference onto the line), the sampling request's `responses_create_params.
    temperature` (else the response's `temperature`), and the line's `metadata.env` /
    `metadata.agent` where Gym records nothing (it writes no environment name)."""
    given = obj.get("metadata")
    metadata: dict = given if isinstance(given, dict) else {}
    agent_ref = obj.get("agent_ref")
    request, response = obj.get("responses_create_params"), obj.get("response")
    temperature = _number(request.get("temperature")) if isinstance(request, dict) else None
    if temperature is None and isinstance(response, dict):
        temperature = _number(response.get("temperature"))
    return {
        "env": _named(metadata.get("env")),
        "agent": (_named(agent_ref.get("name")) if isinstance(agent_ref, dict) else None)
        or _named(metadata.get("agent")),
        "temperature": temperature,
    }


def rollout_id_from_path(rel_path: str) -> str | None:
    """NeMo Gym's FileLineageStore writes `<rollout_id>.lineage.jsonl`, rows without ids."""
    name = rel_path.rsplit("/", 1)[-1]
    if name.endswith(LINEAGE_SUFFIX) and len(name) > len(LINEAGE_SUFFIX):
        return name[: -len(LINEAGE_SUFFIX)]
    return None


def _output_items(v) -> list[dict] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise RecordError("output_items must be a list")
    items = []
    for it in v:
        if not isinstance(it, dict) or not isinstance(it.get("fingerprint"), str):
            raise RecordError("each output_items entry needs a string fingerprint")
        items.append({"id": _nonempty_str(it.get("id")), "fingerprint": it["fingerprint"]})
    return items


def parse_ledger_row(obj, rel_path: str) -> dict:
    if not isinstance(obj, dict):
        raise RecordError("a ledger line must be a JSON object")
    rollout_id = _nonempty_str(obj.get("rollout_id")) or rollout_id_from_path(rel_path)
    if rollout_id is None:
        raise RecordError("rollout_id is missing (and the file is not <rollout_id>.lineage.jsonl)")
    call_id = _nonempty_str(obj.get("model_call_id"))
    if call_id is None:
        raise RecordError("model_call_id is missing or not a non-empty string")
    row: dict = {
        "rollout_id": rollout_id,
        "model_call_id": call_id,
        "parent_call_id": _opt_str(obj, "parent_call_id"),
        "failure_reason": _opt_str(obj, "failure_reason"),
    }
    poison = row["failure_reason"] is not None
    staged = obj.get("staging_digest")
    values = dict(obj, digest=staged if staged is not None else obj.get("digest"))
    for key in ("mode",) + LEDGER_DIGESTS:
        v = values.get(key)
        if v is not None and not isinstance(v, str):
            if not poison:
                raise RecordError(f"{key} must be a string, got {type(v).__name__}")
            v = None
        if v is None and not poison:
            raise RecordError(f"{key} is missing")
        row[key] = v
    for key in LEDGER_INTS:
        if key in VERSION_DEFAULTS and (key not in values or values[key] is None):
            # absent: Gym's default; null: kept null, so the rollout fails unsupported_version
            row[key] = VERSION_DEFAULTS[key] if key not in values else None
            continue
        v = values.get(key)
        if not _is_int(v) or not -(2**63) <= v < 2**63:
            if not poison:
                raise RecordError(f"{key} must be an integer, got {json.dumps(v)[:40]}")
            v = None
        row[key] = v
    row["staging_key"] = _nonempty_str(obj.get("staging_key")) or f"{rollout_id}/{call_id}"
    row["response_id"] = _opt_str(obj, "response_id") if not poison else _nonempty_str(obj.get("response_id"))
    admitted = obj.get("admitted_at")
    if isinstance(admitted, int) and not isinstance(admitted, bool) and abs(admitted) >= _FLOAT_INTS:
        admitted = math.copysign(math.inf, admitted)  # informational: out of range reads as infinite
    row["admitted_at"] = (
        float(admitted) if isinstance(admitted, (int, float)) and not isinstance(admitted, bool) else None
    )
    try:
        row["output_items"] = _output_items(obj.get("output_items"))
        row["output_fingerprint"] = _opt_str(obj, "output_fingerprint")
        version = obj.get("fingerprint_version")
        if version is not None and not (_is_int(version) and -(2**63) <= version < 2**63):
            raise RecordError(f"fingerprint_version must be an integer, got {json.dumps(version)[:40]}")
        row["fingerprint_version"] = version
    except RecordError:
        if not poison:
            raise
        row.update(output_items=None, output_fingerprint=None, fingerprint_version=None)
    for key, v in row.items():
        _unicode(key, v)
    for item in row["output_items"] or ():
        _unicode("output_items id", item["id"])
        _unicode("output_items fingerprint", item["fingerprint"])
    return row
