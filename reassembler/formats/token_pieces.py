"""A token row group too large to decode at once, read in pieces of rows (CONTRACT.md 2.3).

pyarrow writes a file's rows in one row group of up to a million rows by default: a trainer's
token store dumping an hour of capture that way holds hundreds of millions of tokens in one
row group. The job never decodes more than its bound (settings.max_row_group_bytes) at once,
so such a row group is cut into **pieces**: runs of consecutive rows, each decoding to at
most half the bound, read one after the other through pyarrow's streaming reader (pages
read as they are decoded, a batch of rows at a time).

    invariant: a piece's rows are consecutive rows of one row group; the pieces of a row
               group cover its rows in order; a piece of several rows decodes (by its rows'
               `delta_len`) to at most PIECE_SHARE of the bound; a row that alone decodes to
               more is a piece of its own, read when it decodes to at most ROW_ALONE times
               the bound (its columns but the token lists to at most OTHER_SHARE of it),
               else refused (`why`: its rows are reject rows)

How many tokens a row holds comes from its `delta_len` column (8 bytes a row, read first)
when those lengths add up to the number of values its token lists' pages hold (each empty
or null list counts one); else (no such column, nulls, as in the job's own derived tokens,
or lengths that do not add up) from its token mask lists, decoded first in pieces of the
row group's average row size. The pages of every column chunk are checked against the footer
(parquet_pages.py) in windows before the first piece is decoded, so a row group of any
size is checked in bounded memory. A row group of one row is one piece.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..errors import InputError
from . import parquet_pages
from .row_groups import DECODED_WIDTH, LOGPROB_NAMES, READ, decoded_bytes, laid_out, read_row_group

PIECE_SHARE = 0.5  # of the bound: a piece of several rows decodes to at most this
ROW_ALONE = 2  # times the bound: the most one row decodes to and is read (alone)
OTHER_SHARE = 0.25  # of the bound: the most a row's other columns (keys, digests) take, read alone
STRING_PAGE = 1 << 20  # a page of strings may decode to this however small the bound (pyarrow's page size)
CURSORS = 2  # streaming readers of one row group at once: runs of it read in turn restart none
STREAM_BUFFER = 1 << 20  # bytes pyarrow reads ahead of what it decodes in a piece's column chunk
IDS_COLUMN, MASK_COLUMN, LENGTH_COLUMN = "token_ids_delta", "token_mask_delta", "delta_len"


@dataclass(frozen=True)
class Piece:
    """Rows `first` .. `first + rows - 1` of row group `group` (numbered in the row group),
    what they decode to, and why they are not read (None: they are)."""

    group: int
    first: int
    rows: int
    size: int
    why: str | None = None


def _leaf_values(metadata: pq.FileMetaData, group: int, column: str) -> int | None:
    rg = metadata.row_group(group)
    found = [
        rg.column(i).num_values
        for i in range(rg.num_columns)
        if parquet_pages.leaf_path(metadata, i).split(".")[0] == column
    ]
    return found[0] if len(found) == 1 else None


def cut(lengths: np.ndarray, per_row: float, width: int, bound: int) -> list[tuple[int, int, int]]:
    """(first, rows, bytes) pieces of rows holding `lengths` tokens each (`width` bytes a
    token decoded, `per_row` bytes a row besides): consecutive rows up to PIECE_SHARE of
    `bound` together, a row past that alone."""
    sizes = lengths.astype(np.float64) * width + per_row
    share = bound * PIECE_SHARE
    alone = sizes > share / 2
    # runs of rows that are not alone, cut where their running size passes a multiple of half
    # the share: each run's piece holds less than the share (half of it, and a row under half)
    before = np.cumsum(np.where(alone, 0.0, sizes)) - np.where(alone, 0.0, sizes)
    bucket = np.floor(before / (share / 2)).astype(np.int64)
    starts = np.zeros(len(sizes), dtype=bool)
    starts[0] = True
    starts[1:] = alone[1:] | alone[:-1] | (bucket[1:] != bucket[:-1])
    firsts = np.flatnonzero(starts)
    ends = np.concatenate([firsts[1:], [len(sizes)]])
    totals = np.add.reduceat(sizes, firsts) if len(firsts) else np.zeros(0)
    return [(int(a), int(b - a), int(t)) for a, b, t in zip(firsts, ends, totals)]


def file_pieces(loc: str, metadata: pq.FileMetaData, size: int | None, bound: int) -> list[Piece]:
    """The pieces of every row group of a token file, in order: a row group within `bound`
    is one piece."""
    out = []
    for group in range(metadata.num_row_groups):
        total = decoded_bytes(metadata, group)
        n = metadata.row_group(group).num_rows
        out += (
            [Piece(group, 0, n, total)] if total <= bound or n == 0 else plan(loc, metadata, group, size, bound, total)
        )
    return out


def plan(loc: str, metadata: pq.FileMetaData, group: int, size: int | None, bound: int, total: int) -> list[Piece]:
    """The pieces of row group `group`, which decodes to `total` bytes (more than `bound`)."""
    n = metadata.row_group(group).num_rows
    too_big = f"row group {group} ({n} rows) decodes to {total:,} bytes, over the {bound:,} the job decodes at once"
    names = metadata.schema.to_arrow_schema().names
    values = _leaf_values(metadata, group, IDS_COLUMN)
    # a token's bytes decoded: its id, its mask, its log probability (one column of the two names read)
    width = sum(DECODED_WIDTH[c] for c in (IDS_COLUMN, MASK_COLUMN)) + DECODED_WIDTH[LOGPROB_NAMES[0]] * any(
        n in names for n in LOGPROB_NAMES
    )
    if n == 1:
        other = total - (values or 0) * width  # what the row's keys, digests and counts take
        if total > ROW_ALONE * bound or other > bound * OTHER_SHARE:
            return [Piece(group, 0, 1, total, f"{too_big}, more than one row may take; not read")]
        return [Piece(group, 0, 1, total)]
    if values is None:
        return [Piece(group, 0, n, total, f"{too_big}; not read: write token files in smaller row groups")]
    long = _long_strings(loc, metadata, group, size, bound)
    if long is not None:
        return [Piece(group, 0, n, total, f"{too_big}, and {long}; not read")]
    lengths = _declared(loc, metadata, group, size, bound, values, names)
    if lengths is None:  # no delta_len that counts the lists (the job's own derived tokens have none)
        lengths = _decoded(loc, metadata, group, size, bound, total)
    per_row = max(0.0, (total - values * width) / n)
    pieces = []
    for first, rows, nbytes in cut(lengths, per_row, width, bound):
        why = None
        if rows == 1 and nbytes > ROW_ALONE * bound:
            why = (
                f"row {first} of row group {group} decodes to {nbytes:,} bytes alone, over the "
                f"{ROW_ALONE * bound:,} a row may take; not read"
            )
        pieces.append(Piece(group, first, rows, nbytes, why))
    return pieces


def _read_at(loc: str, size: int | None):
    return lambda offset, n: storage.read_ranges(loc, [(offset, n)], size)[0]


def _long_page(chunk: parquet_pages.Chunk, found: parquet_pages.Pages, bound: int) -> str | None:
    """Why a column of strings may hold a value too long to read in a piece: a page of it
    decodes past OTHER_SHARE of the bound, or past STRING_PAGE with a smaller bound (no value
    is longer than its page; keys and digests are short); else None."""
    most = max(int(bound * OTHER_SHARE), STRING_PAGE)
    if chunk.strings and found.largest > most:
        return f"column {chunk.path} holds a page of {found.largest:,} bytes, past the {most:,} a string may take"
    return None


def _long_strings(loc: str, metadata: pq.FileMetaData, group: int, size: int | None, bound: int) -> str | None:
    """_long_page of the row group's columns of strings, their pages read in windows (a
    chunk refused for its pages or its place is refused where it is read, naming why)."""
    end = size if size is not None else storage.size(loc)
    for chunk in parquet_pages.chunks(metadata, group, list(READ)):
        if not chunk.strings or parquet_pages.outside(chunk, end):
            continue
        try:
            why = _long_page(chunk, parquet_pages.checked(chunk, read_at=_read_at(loc, size)), bound)
        except parquet_pages.Refused:
            continue
        if why is not None:
            return why
    return None


def _declared(loc, metadata, group, size, bound, values: int, names: list[str]) -> np.ndarray | None:
    """The rows' token counts by their delta_len column, when it counts the token lists'
    values (each empty or null list one); else None."""
    if LENGTH_COLUMN not in names:
        return None
    lengths = read_row_group(loc, metadata, group, [LENGTH_COLUMN], size, bound).column(LENGTH_COLUMN)
    lengths = pc.max_element_wise(lengths.cast(pa.int64()).fill_null(0), 0).to_numpy().astype(np.int64)
    return lengths if int(np.maximum(lengths, 1).sum()) == values else None


def _decoded(loc, metadata, group, size, bound, total: int) -> np.ndarray:
    """The rows' token counts from their token mask lists, decoded in pieces of rows of the
    row group's average size (the narrowest list column: at most a quarter of what the rows take)."""
    n = metadata.row_group(group).num_rows
    rows = max(1, int(n * bound * PIECE_SHARE / total))
    cursor = Cursor(loc, metadata, group, [MASK_COLUMN], size, rows, bound)
    out = np.zeros(n, dtype=np.int64)
    for at in range(0, n, rows):
        masks = cursor.read(at, min(rows, n - at)).column(MASK_COLUMN)
        out[at : at + masks.length()] = pc.list_value_length(masks).fill_null(0).to_numpy(zero_copy_only=False)
    return out


class Cursor:
    """A row group's pieces read in order through one streaming reader: the next piece asked
    continues where the last ended; a piece before it starts the row group over (a night
    read out of order is correct, only slower). One piece at a time (a lock)."""

    def __init__(
        self,
        loc: str,
        metadata: pq.FileMetaData,
        group: int,
        columns: list[str],
        size: int | None,
        batch_rows: int,
        bound: int,
    ):
        self.loc, self.metadata, self.group, self.columns, self.size = loc, metadata, group, columns, size
        self.bound = bound
        self.batch_rows = max(1, batch_rows)
        self.lock = threading.Lock()
        self.checked = False
        self.measured: list[str] = []  # columns of strings read as dictionaries, measured before laid out
        self._batches: Iterator[pa.RecordBatch] | None = None  # None: not started (or failed)
        self._held: list[pa.RecordBatch] = []
        self._at = 0  # the row (in the row group) of the first row held

    @property
    def at(self) -> int:
        """The first row it reads next without starting over."""
        return self._at if self._batches is not None else 0

    def _check(self) -> None:
        """Every column chunk read lies in the file and its pages keep to its footer, read in windows."""
        end = self.size if self.size is not None else storage.size(self.loc)
        where = f"{self.loc}: row group {self.group}"
        for chunk in parquet_pages.chunks(self.metadata, self.group, self.columns):
            why = parquet_pages.outside(chunk, end)
            if why is None:
                try:
                    found = parquet_pages.checked(chunk, read_at=_read_at(self.loc, self.size))
                except parquet_pages.Refused as e:
                    why = str(e)
                else:
                    why = _long_page(chunk, found, self.bound)
                    if why is None and parquet_pages.inflated(chunk, found) > chunk.uncompressed + 8 * chunk.values:
                        self.measured.append(chunk.column)
            if why is not None:
                raise InputError(f"{where}: {why}; not read (a damaged or crafted token file)")
        self.checked = True

    def _restart(self) -> None:
        if not self.checked:
            self._check()
        source = storage.open_parquet(self.loc, self.size)
        file = pq.ParquetFile(
            source,
            metadata=self.metadata,
            buffer_size=STREAM_BUFFER,
            pre_buffer=False,
            read_dictionary=self.measured or None,
        )
        self._batches = file.iter_batches(
            self.batch_rows, row_groups=[self.group], columns=self.columns, use_threads=False
        )
        self._held, self._at = [], 0

    def read(self, first: int, rows: int) -> pa.Table:
        """Rows `first` .. `first + rows - 1` of the row group."""
        with self.lock:
            if self._batches is None or first < self._at:
                self._restart()
            batches = self._batches
            assert batches is not None
            try:
                while self._at + sum(b.num_rows for b in self._held) < first + rows:
                    batch = next(batches, None)
                    if batch is None:
                        raise InputError(f"{self.loc}: row group {self.group} ends before row {first + rows - 1}")
                    self._held.append(batch)
                    while self._held and self._at + self._held[0].num_rows <= first:  # rows before the piece
                        self._at += self._held.pop(0).num_rows
            except (pa.ArrowException, OSError) as e:
                if isinstance(e, pa.ArrowMemoryError):
                    raise
                self._batches = None
                said = " ".join(str(e).split())
                raise InputError(
                    f"{self.loc}: row group {self.group}: its pages do not decode ({said}); not read"
                ) from None
            held = pa.Table.from_batches(self._held)
            table = held.slice(first - self._at, rows)
            rest = held.slice(first - self._at + rows)  # kept: the next piece starts there
            self._held = rest.to_batches() if rest.num_rows else []
            self._at = first + rows
        if self.measured:  # strings a dictionary could repeat: measured before they are laid out
            table = laid_out(
                table,
                self.measured,
                0,
                self.bound,
                f"{self.loc}: row group {self.group}, rows {first}-{first + rows - 1}",
            )
        return table.combine_chunks()
