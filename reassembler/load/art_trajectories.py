"""A night's OpenPipe ART trajectory Parquet files into rollout rows, derived calls and token
rows (CONTRACT.md 13; the files: formats/art_files.py; a trajectory's checks and rows: formats/art.py).

`read_art_file` reads one file where the rollout lines are read (load/rollout_lines.py),
sharing the night's rollout ids: each trajectory row gives one rollout row, checked as it is
read, or a reject row (13.2.4: the whole file when it is not ART's version 2, a row whose
trajectory_json is not a JSON object or whose group and trajectory indices repeat; an empty
group's sentinel row is neither). A rollout row carries its shape (`trace`: each row's
derived call, its ART call ids, its prompt length, the audit's counts, the weight versions)
and, when every check passed, its rows, which `art_calls` turns into one derived call per
row (`r{k}`, no parent, its tokens, mask and log probabilities: 0.0 off the mask). From
there the shards treat them as any derived call.

What is counted: a file's unit is a trajectory row (or the whole file, refused), `read =
loaded + rejected`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..formats.art_files import ArtLine, FileRefused, file_key, read_lines, step_of
from ..formats.night import NightFiles
from .derived_calls import DerivedCall, without_output

if TYPE_CHECKING:  # the rollout parse's children import this module: numpy only once a file is read
    from ..formats.art import ArtRollout
from .json_lines import reject, seen_before

CAPTURE = "art"  # the rollouts' and their derived calls' capture kind


def read_art_file(
    night: NightFiles, rel: str, number: int, seen: set[str], add: Callable[[dict], None], rejects
) -> int:
    """Every trajectory of the ART file `rel`: its rollout row to `add` (an id in `seen` is
    a reject row; the ids kept go into `seen`), or a reject row. Returns `number` plus the
    units read (module docstring)."""
    import pyarrow.parquet as pq

    from .. import storage
    from ..formats.art import read_trajectory

    loc = night.path("rollouts", rel)
    try:
        lines = read_lines(pq.ParquetFile(storage.open_parquet(loc)))
        first = next(lines, None)  # the file-level checks run before the first row
    except FileRefused as e:
        reject(rejects, "rollouts", rel, 0, str(e), b"")
        return number + 1
    except Exception as e:  # noqa: BLE001 - any Parquet the reader refuses is this file's reject row
        reject(rejects, "rollouts", rel, 0, f"not readable Parquet: {type(e).__name__}: {e}", b"")
        return number + 1
    if first is not None:
        lines = itertools.chain([first], lines)
    split, step = storage.name(storage.parent(loc)), step_of(rel)  # trajectories/{split}/{step:04d}.parquet
    key = file_key(rel, night.art_model, split)
    pairs: set[tuple[int, int]] = set()
    texts: dict[tuple[int, bytes], str] = {}  # (group, trajectory_json's SHA-256) -> the first rollout id of it
    for line in _readable(lines, rel, rejects):
        if line.trajectory_index is None:
            continue  # an empty group's sentinel row (13.2.4)
        number += 1
        raw = line.raw  # a view of the batch's bytes: copied only into a reject row
        rid = f"{key}/g{line.group_index}/t{line.trajectory_index}"
        if not isinstance(line.trajectory, dict):
            why = line.trajectory if isinstance(line.trajectory, ValueError) else "not a JSON object"
            reject(rejects, "rollouts", rel, line.row, f"trajectory_json is {why}", bytes(raw), rid)
            continue
        pair = (line.group_index, line.trajectory_index)
        if pair in pairs:
            reject(
                rejects,
                "rollouts",
                rel,
                line.row,
                f"group {pair[0]} trajectory {pair[1]} repeats an earlier row",
                bytes(raw),
                rid,
            )
            continue
        pairs.add(pair)
        if rid in seen:
            reject(rejects, "rollouts", rel, line.row, str(seen_before(rid)), bytes(raw), rid)
            continue
        seen.add(rid)
        duplicate_of = texts.setdefault((line.group_index, hashlib.sha256(raw).digest()), rid)
        r = read_trajectory(line.trajectory, line.reward)
        row = rollout_row(night, r, rid, f"{key}/g{line.group_index}", line, split, step, duplicate_of)
        row.update(source_file=rel, source_line=line.row, rollout_seq=len(seen))
        add(row)
    return number


def _readable(lines: Iterator[ArtLine], rel: str, rejects) -> Iterator[ArtLine]:
    """The file's rows until one cannot be read (a damaged page past the first batch): that
    is one reject row for the rest of the file, and the rows before it stand."""
    row = 0
    while True:
        try:
            line = next(lines, None)
        except Exception as e:  # noqa: BLE001 - the Parquet reader's refusal, named in the reject row
            reject(
                rejects,
                "rollouts",
                rel,
                row + 1,
                f"not readable Parquet from row {row + 1}: {type(e).__name__}: {e}",
                b"",
            )
            return
        if line is None:
            return
        row = line.row
        yield line


def rollout_row(
    night: NightFiles,
    r: ArtRollout,
    rid: str,
    group: str,
    line,
    split: str | None,
    step: int | None,
    duplicate_of: str,
) -> dict:
    """The rollout row of one trajectory (formats/fields.py's ROLLOUT); `art`: the checked
    trajectory, when it has rows."""
    metadata = _metadata(line.metadata)
    env = night.art_project if night.art_model is not None else metadata.get("env")
    extra = {"split": split, "step": step}
    if duplicate_of != rid:
        extra["duplicate_of"] = duplicate_of
    shape = {
        "rows": [[f"r{k}"] for k in range(len(r.rows))],
        "call_ids": [row.call_ids for row in r.rows],
        "prompt_lens": [row.prompt_len for row in r.rows],
        "calls": r.n_sampled,
        "selected": r.n_selected,
        "roots": r.n_roots,
        "policy": list(r.policy) if r.policy else None,
    }
    reward = line.reward if isinstance(line.reward, (int, float)) and not isinstance(line.reward, bool) else None
    return {
        "rollout_id": rid,
        "group_id": group,
        "slot": line.trajectory_index,
        "reward": reward if reward is not None and reward == reward and abs(reward) != float("inf") else None,
        "reward_problem": None,
        **without_output(),
        "metadata": json.dumps({**metadata, **{k: v for k, v in extra.items() if v is not None}}, sort_keys=True),
        "capture": CAPTURE,
        "capture_reason": None if r.reason is None else r.reason.value,
        "capture_detail": r.detail,
        "capture_call_id": r.call_id,
        "trace": json.dumps(shape, separators=(",", ":")),
        "env": env if isinstance(env, str) and env else None,
        "agent": r.agent,
        "temperature": r.temperature,
        "art": r if r.rows else None,
    }


def _metadata(text) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def art_calls(r: ArtRollout) -> Iterator[DerivedCall]:
    """One derived call a row (`r{k}`): the row's tokens, mask and log probabilities."""
    for k, row in enumerate(r.rows):
        yield DerivedCall(f"r{k}", None, "text", row.ids, row.mask, row.logprobs)


def derive_again(night: NightFiles, rollout: dict) -> tuple[dict, list[str]]:
    """The token rows of one trajectory's rows read again from its file as it is now
    (`reassembler explain`), by staging key, and its branches walked."""
    import pyarrow.parquet as pq

    from .. import storage
    from ..formats.art import read_trajectory
    from .derived_calls import token_rows

    rid, rel, row = rollout["rollout_id"], rollout["source_file"], rollout["source_line"]
    try:
        line = next(
            (x for x in read_lines(pq.ParquetFile(storage.open_parquet(night.path("rollouts", rel)))) if x.row == row),
            None,
        )
    except (FileRefused, OSError) as e:
        return {}, [f"{rel}: the file is now a reject: {e}"]
    if line is None or not isinstance(line.trajectory, dict):
        return {}, [f"{rel}: row {row} is now no trajectory"]
    r = read_trajectory(line.trajectory, line.reward)
    walked = [f"{rel} row {row}: group {line.group_index}, trajectory {line.trajectory_index}"]
    for k, b in enumerate(r.rows):
        trained = int(b.mask.sum())
        earlier = (
            f" ({b.sampled - trained} sampled tokens trained on an earlier row: a shared prefix)"
            if (b.sampled > trained)
            else ""
        )
        walked.append(f"  branch {k}: {len(b.ids)} tokens, {trained} trained{earlier}, calls {', '.join(b.call_ids)}")
    if r.reason is not None:
        walked.append(f"  masked {r.reason.value}: {r.detail}")
    return token_rows(rid, art_calls(r)), walked
