"""NeMo Gym's TokenEntry files read by DuckDB's JSON reader, with the line reader's verdicts
(CONTRACT.md 9.3; load/local_capture.py reads what this module gives back).

The token lists are nearly all of a local-mode night's bytes. DuckDB parses them in C++ on
all its threads, straight into Arrow, several times faster than `orjson` and a Python list
per entry. But DuckDB is lenient where the contract is strict, so each line is read in two
pieces, and each piece by a reader that judges it exactly:

- DuckDB reads a batch of files' three token lists (`prompt_token_ids`,
  `generation_token_ids`, `generation_log_probs`), typed BIGINT[] and DOUBLE[];
- orjson reads the rest of each line: the line with those lists' contents cut out, a few
  hundred bytes, so each scalar, each key absent or null, a repeated key and the object
  itself are judged by the very decoder the line reader uses.

A file goes back to the line reader, for that file alone, wherever the two pieces might not
add up to the line reader's reading of it (a rare path, and always exact):

- a line is over MAX_OBJECT_BYTES (checked here: DuckDB's `maximum_object_size` is not
  an exact bound for small values);
- the query fails for it (a line that is not JSON, not an object, torn, with a repeated
  list key, a lone surrogate, an integer beyond int64, bytes that are not UTF-8): the batch
  is read again file by file, and the files that still fail are the line reader's;
- a line holds `\\u` (a key could be written escaped), or a list's key is not written
  once, literally and followed by `:[`, where DuckDB found it (or found none);
- a list's text holds anything but digits, commas and blanks, a minus sign, and for log
  probabilities `.eE+`, or ends in a comma: DuckDB would read a float, a string or a
  boolean as an id, a string or NaN as a log probability, and accept `[1,]`;
- a null in a list, a log probability that is not finite (`1e400` reads as inf);
- the rest of a line does not parse; DuckDB's rows are not the file's non-blank lines.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..settings import DuckDBSettings
from ..warehouse import scratch_config, sql

LISTS = ("generation_log_probs", "generation_token_ids", "prompt_token_ids")  # the order Gym writes them
KEYS = {name: f'"{name}"'.encode() for name in LISTS}
MAX_OBJECT_BYTES = 16 * 2**20  # DuckDB's maximum_object_size: a longer line goes to the line reader
BATCH_BYTES = 16 * 2**20  # entries files' bytes a query (load/local_capture.py batches by it)
# the reader's own DuckDB: every core, or one a reader when captures are read by a process a core
# (capture_children.py); memory bounded by a batch and the buffers (one of MAX_OBJECT_BYTES a thread)
SETTINGS = DuckDBSettings(memory_limit="256MB", threads=os.cpu_count() or 1)
_IDS_TEXT = b"0123456789,- \t\r"
_LOGPROBS_TEXT = b"0123456789,-+.eE \t\r"
_BLANKS = b" \t\r"
_COLUMNS = {"prompt_token_ids": "BIGINT[]", "generation_token_ids": "BIGINT[]", "generation_log_probs": "DOUBLE[]"}


@dataclass
class EntryLines:
    """One file's lines as the line reader would decode them: (line number, bytes, object),
    blank lines left out, each object's three token lists (when it has them) numpy arrays,
    views of `ids` (prompt then generated ids, line after line) and `logprobs`."""

    lines: list[tuple[int, bytes, dict]]
    ids: np.ndarray
    logprobs: np.ndarray


class EntryReader:
    """A DuckDB connection of its own (in memory, rows kept in order), for a process's
    TokenEntry files."""

    def __init__(self, threads: int | None = None):
        config = scratch_config(SETTINGS if threads is None else dataclasses.replace(SETTINGS, threads=threads))
        config["preserve_insertion_order"] = True  # rows in line order
        self._con = duckdb.connect(":memory:", config=config)
        os.makedirs(config["temp_directory"], exist_ok=True)
        # the files DuckDB reads that are not local files: in this process's spill folder (from
        # a file path its reader is ~2x faster than from a Python file object)
        self._scratch = os.path.join(config["temp_directory"], f"entries-{id(self)}")

    def close(self) -> None:
        self._con.close()

    def read(self, files: list[bytes], paths: list[str | None] | None = None) -> list[EntryLines | None]:
        """Each file's lines (`files`: their contents), or None for a file the line reader
        must read. `paths`: where DuckDB may read each file itself (a local file holding
        those bytes), else None: it is written to a scratch file first."""
        raws = [[(k + 1, raw) for k, raw in enumerate(data.split(b"\n")) if raw.strip()] for data in files]
        # a line over MAX_OBJECT_BYTES is the line reader's (DuckDB's own limit is not exact)
        fits = [all(len(raw) <= MAX_OBJECT_BYTES for _, raw in lines) for lines in raws]
        batch = [k for k, ok in enumerate(fits) if ok and raws[k]]
        given: list[str | None] = list(paths) if paths is not None else [None] * len(files)
        where: dict[int, str] = {}  # the path DuckDB reads of each file of the batch
        scratch: list[str] = []
        tables: list[pa.Table | None] = [None] * len(files)
        try:
            for k in batch:
                path = given[k]
                if path is None:  # one scratch file each, so that DuckDB reads them in parallel
                    path = f"{self._scratch}-{len(scratch)}"
                    scratch.append(path)
                    with open(path, "wb") as out:
                        out.write(files[k])
                where[k] = path
            names, counts = [where[k] for k in batch], [len(raws[k]) for k in batch]
            table = self._query(names) if batch else None
            if table is not None and _grouped(table, names, counts):
                at = 0
                for k, n in zip(batch, counts):
                    tables[k] = table.slice(at, n)
                    at += n
            else:  # a file DuckDB refuses (or rows that are not the lines): each again alone
                for k in batch:
                    alone = self._query([where[k]])
                    tables[k] = alone if alone is not None and _grouped(alone, [where[k]], [len(raws[k])]) else None
        finally:
            for name in scratch:
                os.remove(name)
        return [None if t is None else _lines(lines, t) for lines, t in zip(raws, tables)]

    def _query(self, paths: list[str]) -> pa.Table | None:
        try:
            rel = self._con.read_json(
                paths,  # type: ignore[arg-type]  # DuckDB takes a list of files; its stub says one
                columns=_COLUMNS,
                format="newline_delimited",
                maximum_object_size=MAX_OBJECT_BYTES,
                filename=True,
                hive_partitioning=False,  # a path's `ds=...` folder is not a column
            )
            lists = rel.query("entries", sql("entry_lists"))
            return None if lists is None else lists.to_arrow_table()
        except duckdb.Error:
            return None


def _grouped(table: pa.Table, paths: list[str], counts: list[int]) -> bool:
    """DuckDB's rows are the files' non-blank lines, file after file, in the files' order."""
    if table.num_rows != sum(counts):
        return False
    names = table.column("filename").combine_chunks().dictionary_encode()
    runs = pc.run_end_encode(names.indices) if table.num_rows else None
    if runs is None:
        return not counts
    values = [str(names.dictionary[i]) for i in runs.values.to_pylist()]
    ends = runs.run_ends.to_pylist()
    lengths = [e - b for b, e in zip([0, *ends[:-1]], ends)]
    return values == paths and lengths == counts


def _values(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """A list column's values (of its rows only) and its row offsets from 0, and the column."""
    lists = column.combine_chunks()
    offsets = lists.offsets.to_numpy()
    values = lists.values.slice(offsets[0], offsets[-1] - offsets[0])
    if values.null_count:
        raise ValueError("a null in a list")
    return values.to_numpy(), offsets - offsets[0], lists


def _lines(raws: list[tuple[int, bytes]], table: pa.Table) -> EntryLines | None:
    """The file's lines with DuckDB's lists in them, or None when a guard says the line
    reader must judge the file."""
    if len(raws) != table.num_rows:
        return None
    try:
        ids, id_at, _ = _values(table.column("ids"))
        logprobs, lp_at, lp_lists = _values(table.column("logprobs"))
    except ValueError:
        return None
    if len(logprobs) and not np.isfinite(logprobs).all():
        return None
    id_at, lp_at = id_at.tolist(), lp_at.tolist()
    n_prompt = table.column("n_prompt").to_pylist()
    has = {
        "prompt_token_ids": table.column("has_prompt").to_pylist(),
        "generation_token_ids": table.column("has_generated").to_pylist(),
        "generation_log_probs": lp_lists.is_valid().to_pylist(),
    }
    lines = []
    for row, (number, raw) in enumerate(raws):
        present = {name: flags[row] for name, flags in has.items()}
        obj = _rest(raw, present)
        if obj is None:
            return None
        mid = id_at[row] + n_prompt[row]
        if present["prompt_token_ids"]:
            obj["prompt_token_ids"] = ids[id_at[row] : mid]
        if present["generation_token_ids"]:
            obj["generation_token_ids"] = ids[mid : id_at[row + 1]]
        if present["generation_log_probs"]:
            obj["generation_log_probs"] = logprobs[lp_at[row] : lp_at[row + 1]]
        lines.append((number, raw, obj))
    return EntryLines(lines, ids, logprobs)


def _rest(raw: bytes, present: dict[str, bool]) -> dict | None:
    """The line decoded by orjson with its token lists' contents cut out (each list key then
    holds []), or None when a guard fails (the module docstring's)."""
    if b"\\u" in raw:
        return None
    spans = []
    for name in LISTS:
        key = KEYS[name]
        at = raw.find(key)
        if at < 0:
            if present[name]:
                return None
            continue
        if not present[name] or raw.find(key, at + 1) >= 0:
            return None
        start = at + len(key)
        if raw[start : start + 2] != b":[":
            return None
        end = raw.find(b"]", start + 2)
        if end < 0:
            return None
        text = raw[start + 2 : end]
        if text.translate(None, _LOGPROBS_TEXT if name == "generation_log_probs" else _IDS_TEXT):
            return None
        if text.rstrip(_BLANKS).endswith(b","):
            return None
        spans.append((start + 2, end))
    spans.sort()
    pieces, at = [], 0
    for start, end in spans:
        pieces.append(raw[at:start])
        at = end
    pieces.append(raw[at:])
    try:
        obj = orjson.loads(b"".join(pieces))
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None
