"""Read one load part of a night of capture (CONTRACT.md section 2), for the merge (merge/).

- rollout JSONL is parsed line by line (rollout_lines.py: in child processes for a big
  night); the ledger's files are parsed in columns (ledger_columns.py), and the files and
  lines that path cannot take exactly are parsed line by line (json_lines.py); a line that
  is not JSON, or not the shape of its record, becomes a reject row;
- token Parquet is not copied: each file's schema is checked (formats/token_file.py: a
  missing column or an unsupported type stops the night with exit 2); the keys of its rows
  go into the warehouse's token_rows, and token_store.py reads the lists of the rows a shard
  needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..errors import InputError, StoreError
from ..formats import token_file, token_pieces
from ..formats.night import NightFiles
from ..formats.records import parse_ledger_row
from ..progress import Progress
from ..settings import DEFAULTS
from . import rollout_lines
from .derived_calls import DerivedChunk
from .gym_capture import GymSummary
from .inserter import LEDGER_BATCH, REJECT_BATCH, ROLLOUT_BATCH, Inserter, Sink
from .json_lines import decode, one_line, read_file_lines
from .ledger_columns import Chunk, ledger_chunks
from .token_keys import group_key_batches

# ---------------------------------------------------------------- JSON lines -> warehouse


@dataclass(frozen=True)
class SourceCount:
    """One input source of a night: every line / token row read is loaded, rejected, or
    (ledger lines) belongs to a failed attempt NeMo Gym's failures file names."""

    read: int
    loaded: int
    rejected: int
    failed_attempts: int = 0

    def __str__(self) -> str:
        text = f"{self.read} read = {self.loaded} loaded + {self.rejected} rejected"
        return text + (f" + {self.failed_attempts} of failed attempts" if self.failed_attempts else "")


@dataclass(frozen=True)
class LoadSummary:
    rollouts: SourceCount
    ledger: SourceCount
    tokens: SourceCount
    n_ledger_rows: int  # rows in the warehouse's ledger table (rows of unknown rollouts included)
    n_token_files: int
    sidecars: tuple[str, ...] = ()  # Gym's files beside its results, not rollout lines (night.py)
    gym: GymSummary = field(default_factory=GymSummary)  # NeMo Gym's own capture (gym_capture.py)
    other_rejects: int = 0  # failures rows and capture files rejected
    traces: tuple[int, int] = (0, 0)  # verifiers rollouts loaded, and masked by their trace's checks
    envelopes: tuple[int, int] = (0, 0)  # NeMo Gym compaction-agent lines loaded, and masked by their checks

    @property
    def n_rollouts(self) -> int:
        """Rollouts the night's audit will hold: result lines loaded, and given-up samples."""
        return self.rollouts.loaded + self.gym.given_up

    @property
    def n_rejects(self) -> int:
        return self.rollouts.rejected + self.ledger.rejected + self.tokens.rejected + self.other_rejects

    def lines(self) -> list[str]:
        out = [
            f"{name:<9}{count}"
            for name, count in (("rollouts", self.rollouts), ("ledger", self.ledger), ("tokens", self.tokens))
        ]
        out += self.gym.lines()
        if self.traces[0]:
            out.append(
                f"{'traces':<9}{self.traces[0]} rollouts from verifiers traces files "
                f"({self.traces[1]} masked by their trace checks)"
            )
        if self.envelopes[0]:
            out.append(
                f"{'envelope':<9}{self.envelopes[0]} NeMo Gym compaction-agent lines "
                f"({self.envelopes[1]} masked by their envelope checks)"
            )
        if self.sidecars:
            out.append(
                f"{'not read':<9}{len(self.sidecars)} NeMo Gym sidecar files, not results: {', '.join(self.sidecars)}"
            )
        return out


def _ledger_files(night: NightFiles) -> list[tuple[str, str]]:
    return [(rel, night.path("ledger", rel)) for rel in night.ledger]


def load_rollout_lines(
    sink: Sink,
    night: NightFiles,
    rejects: Inserter,
    max_line_bytes: int,
    background: rollout_lines.InBackground | None,
    take: Callable[[dict], dict] | None,
    max_rollout_tokens: int,
    derived: Callable[[DerivedChunk | None], None],
) -> int:
    """Every rollout line of `night` (a load part): a rollout row, or a reject row (an id
    repeated in these files keeps the first); parsed here, or by `background` (the same code
    in a child process); `take` takes each row's NeMo Gym fields off first. Returns the
    lines read. The rows go to `sink` (the part's rollouts table), the calls they carry to
    `derived` a chunk at a time, after the chunk's rows (load/derived_calls.py)."""
    rollouts = Inserter(sink, ROLLOUT_BATCH)

    def add(row: dict) -> None:
        rollouts.add(take(row) if take is not None else row)

    if background is None:
        lines = rollout_lines.parse_here(night, max_line_bytes, add, rejects, derived, max_rollout_tokens)
    else:
        lines = background.results(add, rejects, derived)
    rollouts.flush()
    return lines


class InputProgress(Progress):
    """A load part's progress: the bytes of its input files dealt with (a file counts once
    its lines or keys are all in)."""

    def __init__(self, what: str, sizes: dict[str, int]):
        super().__init__(what, sum(sizes.values()))
        self.sizes = sizes

    def read(self, *locations: str) -> None:
        self.advance(sum(self.sizes.pop(loc, 0) for loc in locations))

    @classmethod
    def of(cls, night: NightFiles, what: str = "load") -> InputProgress:
        locations = [night.path("rollouts", rel) for rel in night.rollouts + night.failures]
        locations += [night.path("ledger", rel) for rel in night.ledger + night.captures]
        locations += [night.path("tokens", rel) for rel in night.tokens]
        # a file gone since the listing counts 0 here: reading it is what fails, naming it
        return cls(what, dict(zip(locations, storage.sizes(locations, missing=0))))


def load_ledger_lines(
    sink: Sink, night: NightFiles, rejects: Inserter, max_line_bytes: int, done: Callable[..., None] | None = None
) -> int:
    """Every ledger line of `night` (a load part), in capture order (files by path, then
    lines, numbered from 1 in capture_seq): a ledger row, or a reject row. The files are
    parsed in columns a chunk at a time (ledger_columns.py); the ones (and the lines) it
    cannot take are read here line by line. The rows go to `sink` (the part's ledger table).
    Returns the lines read."""
    ledger = Inserter(sink, LEDGER_BATCH)

    def add(capture_seq: int, row: dict) -> None:
        row["capture_seq"] = capture_seq
        ledger.add(row)

    number = 0
    for chunk in ledger_chunks(_ledger_files(night), max_line_bytes, LEDGER_IN_COLUMNS):
        columnar = {f.rel: f for f in chunk.columnar}
        bases = []  # the number before each file read in columns
        for rel, _ in chunk.files:
            if rel in columnar:
                bases.append(number)
                number += columnar[rel].n_lines
            else:
                number = read_file_lines(night, "ledger", rel, number, parse_ledger_row, add, rejects, max_line_bytes)
        if chunk.columnar:
            sink.write(_columns(night, chunk, bases, add, rejects))
        if done is not None:
            done(*(night.path("ledger", rel) for rel, _ in chunk.files))
    ledger.flush()
    return number


LEDGER_IN_COLUMNS = True  # False: every ledger line takes the per-line path (the tests' reference)


def _columns(night: NightFiles, chunk: Chunk, bases: list[int], add, rejects: Inserter) -> pa.Table:
    """The ledger rows parsed in columns; the lines ledger_columns.py leaves to the per-line
    path go through it (`add` or a reject row)."""
    files, table, per_line = chunk.columnar, chunk.table, chunk.per_line
    assert table is not None and per_line is not None
    numbers = np.concatenate([np.arange(base + 1, base + 1 + f.n_lines) for f, base in zip(files, bases)])
    lines = np.concatenate([np.arange(1, f.n_lines + 1) for f in files])
    file_of_row = np.repeat(np.arange(len(files)), [f.n_lines for f in files])
    for k in np.flatnonzero(per_line).tolist():
        f, line = files[file_of_row[k]], int(lines[k])
        raw = f.line(line - 1)
        one_line("ledger", f.rel, line, raw, decode(raw), int(numbers[k]), parse_ledger_row, add, rejects)
    keep = pa.array(~per_line)
    rels = pa.array([f.rel for f in files], pa.string())
    table = (
        table.append_column("capture_seq", pa.array(numbers))
        .append_column("source_file", rels.take(pa.array(file_of_row)))
        .append_column("source_line", pa.array(lines))
        .filter(keep)
        .select(LEDGER_BATCH.names)
        .cast(LEDGER_BATCH)
    )
    return table


def too_big_rejects(night: NightFiles, files: TokenFiles) -> pa.Table:
    """The rows too big to decode, as reject rows that say why (their calls then find no
    token row: missing_tokens): their keys are read (once a row group), never their token lists."""
    ranges: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
    for loc, group, first, last, reason in sorted(files.too_big):
        ranges.setdefault((loc, group), []).append((first, last, reason))
    batches = []
    for (loc, group), found in ranges.items():
        size, metadata = files.footers[loc]
        at = int(sum(metadata.row_group(g).num_rows for g in range(group)))
        of_range: list[list[pa.RecordBatch]] = [[] for _ in found]  # each range's rows, in the ranges' order
        for keys in group_key_batches(metadata, loc, group, at, size):
            rows = keys.column("t_row").to_numpy()
            for k, (first, last, reason) in enumerate(found):
                taken = keys.filter(pa.array((rows >= first) & (rows <= last)))
                if taken.num_rows:
                    of_range[k].append(_reject_batch(night, taken, reason))
        batches += [b for taken in of_range for b in taken]
    return pa.Table.from_batches(batches, schema=REJECT_BATCH)


def _reject_batch(night: NightFiles, keys: pa.RecordBatch, reason: str) -> pa.RecordBatch:
    n = keys.num_rows
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar("tokens"), n),
            pc.replace_substring(keys.column("t_file"), token_dir(night), ""),
            keys.column("t_row"),
            pa.repeat(pa.scalar(reason), n),
            keys.column("t_staging_key"),
            keys.column("t_rollout_id"),
            keys.column("t_model_call_id"),
        ],
        schema=REJECT_BATCH,
    )


def token_dir(night: NightFiles) -> str:
    return str(night.path("tokens", "")).rstrip("/") + "/"


# ---------------------------------------------------------------- token files


@dataclass(frozen=True)
class TokenFiles:
    """The night's token files (locations), their schemas checked, and the row groups too
    big to decode (`too_big`: file, row group, first row, last row, why), which the load
    makes reject rows instead of reading."""

    locations: list[str]
    too_big: list[tuple[str, int, int, int, str]]
    footers: dict = field(default_factory=dict)  # location -> (its size on object storage, or None; metadata)

    @property
    def n_too_big(self) -> int:
        return sum(last - first + 1 for _, _, first, last, _ in self.too_big)

    @property
    def skip(self) -> dict[str, list[tuple[int, int]]]:
        """The rows too big to decode, by file: (first, last) row numbers."""
        out: dict[str, list[tuple[int, int]]] = {}
        for loc, _, first, last, _ in self.too_big:
            out.setdefault(loc, []).append((first, last))
        return out


def _footer(night: NightFiles, rel: str):
    """A token file's Parquet metadata; InputError naming the file when it has none."""
    loc = night.path("tokens", rel)
    try:
        source = storage.open_parquet(loc)
        return (None if isinstance(source, str) else source.size()), pq.read_metadata(source)
    except StoreError:
        raise
    except Exception as e:  # pyarrow raises several types for a broken footer
        found = storage.store_error(loc, e)
        if found is not None:
            raise found from None
        raise InputError(f"{rel}: unreadable Parquet file ({str(e).splitlines()[0]})") from e


def token_files(night: NightFiles, bound: int = DEFAULTS.max_row_group_bytes) -> TokenFiles:
    """Check every token file's schema (InputError naming the file), and find the row
    groups that would decode to more than `bound` bytes (formats/token_file.py)."""
    locations, too_big, footers = [], [], {}
    read = storage.map_ahead(lambda rel: _footer(night, rel), night.tokens, night.remote)
    for rel, (size, metadata) in zip(night.tokens, read):
        loc = night.path("tokens", rel)
        footers[loc] = (size, metadata)
        schema = metadata.schema.to_arrow_schema()
        token_file.check_schema(schema, rel)
        locations.append(loc)
        firsts = np.cumsum([0] + [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)])
        for piece in token_pieces.file_pieces(loc, metadata, size, bound):
            if piece.why is not None and piece.rows:
                first = int(firsts[piece.group]) + piece.first
                too_big.append((loc, piece.group, first, first + piece.rows - 1, f"{piece.why}"))
    return TokenFiles(locations, too_big, footers)
