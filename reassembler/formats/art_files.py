"""OpenPipe ART's trajectory files and nights (CONTRACT.md 13.2, 13.3): which files a night
holds under --layout art (history.jsonl), rollout ids' file keys, and a file's rows read a
few at a time after its file-level checks (version metadata, columns, format_version).
Nothing heavy is imported here (the load's children and the night's listing import it);
a trajectory's checks and rows: formats/art.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

VERSION_KEY = b"art.trajectory_parquet.version"
VERSION = "2"


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def decode(text: str | bytes | memoryview):
    """ART's JSON: Python's json with its defaults (NaN, Infinity, -Infinity read as floats).
    orjson reads it first (several times faster); a text it refuses (those literals, or JSON
    it judges otherwise) is read by json, whose verdict stands."""
    import orjson

    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(bytes(text).decode("utf-8") if not isinstance(text, str) else text)


TRAIN_SPLIT = "trajectories/train"  # what --layout art reads: the split ART trains (13.2.2)
HISTORY = "history.jsonl"


def is_art_file(rel: str) -> bool:
    """A rollouts file read as ART trajectory Parquet (13.2.1: by its suffix here; the
    reader refuses one without ART's version metadata, the whole file a reject row)."""
    return rel.endswith(".parquet")


def file_key(rel: str, model: str | None, split: str | None) -> str:
    """13.3: `{name}/{split}/{step}` under --layout art (`model`: the model folder's name,
    `split`: the folder the file is in), else the file's path without `.parquet`."""
    stem = rel[: -len(".parquet")]
    if model is None:
        return stem
    return f"{model}/{split}/{stem.rsplit('/', 1)[-1]}"


def steps_recorded_on(history: str, ds: str) -> tuple[set[int], set[int]]:
    """From ART's history.jsonl: (the train steps whose last line with a `train/` key was
    recorded on `ds`, every step that has such a line). Lines that are not JSON objects
    with an integer step are skipped (ART appends; a torn last line is possible)."""
    last: dict[int, str] = {}
    for line in history.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict) or not _int(obj.get("step")) or not isinstance(obj.get("recorded_at"), str):
            continue
        if any(isinstance(k, str) and k.startswith("train/") for k in obj):
            last[obj["step"]] = obj["recorded_at"]
    return {step for step, at in last.items() if at[:10] == ds}, set(last)


def step_of(rel: str) -> int | None:
    """The step a file `NNNN.parquet` holds."""
    name = rel.rsplit("/", 1)[-1][: -len(".parquet")]
    return int(name) if name.isdigit() else None


@dataclass
class ArtLine:
    """One row of an ART file: its place, ids and trajectory (decoded, or why not)."""

    row: int  # 1-based, as a reject row's line
    group_index: int
    trajectory_index: int | None
    trajectory: Any
    reward: Any
    metadata: Any
    raw: bytes | memoryview  # trajectory_json's UTF-8 bytes, as stored (a view of the file's batch)


class FileRefused(Exception):
    """The whole file is a reject row (13.2.4)."""


BATCH_ROWS = 8  # trajectories read and decoded at once (one holds every call's whole prompt: megabytes of JSON)


def read_lines(file) -> Iterator[ArtLine]:
    """The rows of an ART file (a pyarrow ParquetFile), a few at a time, after the file-level
    checks of 13.2.4 (FileRefused): its version metadata, its columns, every row's
    format_version (that column read alone first)."""
    schema = file.schema_arrow
    version = (schema.metadata or {}).get(VERSION_KEY)
    if version is None:
        raise FileRefused("a Parquet file without ART's art.trajectory_parquet.version: not an ART trajectory file")
    if version.decode(errors="replace") != VERSION:
        raise FileRefused(f"ART trajectory Parquet version {version.decode(errors='replace')!r}, this job reads 2")
    names = set(schema.names)
    for name in ("group_index", "trajectory_index", "trajectory_json", "reward"):
        if name not in names:
            raise FileRefused(f"an ART trajectory file without its column {name}")
    if "format_version" in names:
        versions = set(file.read(columns=["format_version"]).column(0).to_pylist())
        if versions - {2}:
            raise FileRefused(
                f"format_version {sorted(v for v in versions - {2} if v is not None) or [None]}, this job reads 2"
            )
    wanted = [
        "group_index",
        "trajectory_index",
        "trajectory_json",
        "reward",
        *(["metadata"] if "metadata" in names else []),
    ]
    row = 0
    for batch in file.iter_batches(batch_size=BATCH_ROWS, columns=wanted):
        texts = _utf8_views(batch.column(batch.schema.get_field_index("trajectory_json")))
        columns = batch.drop_columns(["trajectory_json"]).to_pydict()
        for k in range(batch.num_rows):
            row += 1
            text = texts[k]
            try:
                value = decode(text) if text is not None else None
            except ValueError as e:
                value = e
            yield ArtLine(
                row,
                columns["group_index"][k],
                columns["trajectory_index"][k],
                value,
                columns["reward"][k],
                columns["metadata"][k] if "metadata" in columns else None,
                text if text is not None else b"",
            )


def _utf8_views(array) -> list[memoryview | None]:
    """Each value of a (large) string column as a view of its UTF-8 bytes in the batch's own
    buffer: orjson reads them as they are, no copy into Python strings (a trajectory is megabytes)."""
    import numpy as np

    _, offsets, data = array.buffers()
    if data is None:
        return [None] * len(array)
    width = np.int64 if str(array.type) == "large_string" else np.int32
    ends = np.frombuffer(offsets, width, len(array) + 1, array.offset * np.dtype(width).itemsize)
    view, valid = memoryview(data), array.is_valid().to_pylist()
    return [view[int(ends[k]) : int(ends[k + 1])] if valid[k] else None for k in range(len(array))]
