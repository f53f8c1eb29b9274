"""What a Parquet row group's pages declare, from their headers, before any of it is decoded.

A token file's footer says how many values each column chunk holds, and the job bounds what
it decodes by that (row_groups.decoded_bytes). Parquet's reader, though, allocates what each
page's own header says. A footer that declares fewer values than the pages hold (a damaged
or crafted file: 8 KB can hold one run-length-encoded page of 30M tokens under a footer that
declares one) would slip past that bound. So before a row group's columns are decoded, the
bytes of their column chunks are read (what the decode reads anyway) and each page's header
is parsed (`PageHeader` of parquet.thrift, Thrift's compact protocol):

    invariant: for each column chunk read, the data pages' `num_values` sum to the footer's
               `num_values`, the pages' `uncompressed_page_size` sum to no more than the
               footer's `total_uncompressed_size` (which counts the headers too), and the
               dictionary pages' `num_values` to no more than the data pages' (a dictionary
               holds distinct values); the chunk lies inside the file (`outside`)

What a chunk takes decoded then follows from its footer (row_groups.decoded_bytes), but for
a column of strings read through a dictionary: each value may repeat the longest entry, so
`inflated` bounds it from the pages (the dictionary's bytes), and a chunk that could pass the
job's bound is decoded as a dictionary and measured before its strings are laid out.

The parser's work is bounded by the bytes it reads: a list or map that declares more elements
than the bytes left is refused before one is read.

A chunk that breaks it, or whose headers do not parse, is refused; a chunk that keeps it is
bounded by its footer, which too_big checks. Only headers are parsed here (a few dozen bytes
a page, pages of about 1 MiB): no value is looked at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import pyarrow.parquet as pq

# PageHeader's fields (parquet.thrift) this module reads
_TYPE, _UNCOMPRESSED, _COMPRESSED = 1, 2, 3
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 5, 7, 8  # the nested headers: field 1 is num_values
_PAGE_KIND = {0: _DATA_PAGE, 2: _DICTIONARY_PAGE, 3: _DATA_PAGE_V2}  # PageType -> its header's field
# Thrift compact protocol types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
_MAX_DEPTH = 16


class Malformed(ValueError):
    """Bytes that are not a page header."""


@dataclass(frozen=True)
class Chunk:
    """One column chunk of a row group, as its footer declares it."""

    column: str  # the column's top-level name
    path: str  # its leaf's path in the schema
    start: int
    length: int
    values: int
    uncompressed: int
    strings: bool  # variable-length values (BYTE_ARRAY): what they decode to depends on the pages


class Pages(NamedTuple):
    """What a column chunk's page headers declare."""

    values: int  # of the data pages
    uncompressed: int  # bytes of every page
    entries: int  # of the dictionary pages
    dictionary: int  # uncompressed bytes of the dictionary pages
    largest: int = 0  # uncompressed bytes of the largest page: no value of the chunk is longer


class Refused(ValueError):
    """A column chunk whose pages break the invariant (the message says how)."""


def chunks(metadata: pq.FileMetaData, group: int, columns: list[str]) -> list[Chunk]:
    """The column chunks of `group` that reading `columns` decodes, in file order."""
    rg = metadata.row_group(group)
    out = []
    for i in range(rg.num_columns):
        c = rg.column(i)
        path = leaf_path(metadata, i)
        name = path.split(".")[0]
        if name not in columns:
            continue
        offsets = [o for o in (c.dictionary_page_offset if c.has_dictionary_page else None, c.data_page_offset) if o]
        start = min(offsets) if offsets else 0
        out.append(
            Chunk(
                name,
                path,
                start,
                c.total_compressed_size,
                c.num_values,
                c.total_uncompressed_size,
                c.physical_type == "BYTE_ARRAY",
            )
        )
    return sorted(out, key=lambda c: c.start)


def leaf_path(metadata: pq.FileMetaData, i: int) -> str:
    """The path of leaf column `i` as the file's schema says: what the reader decodes chunk
    `i` as. A chunk's own `path_in_schema` is not trusted (a footer could name the chunk of
    a million tokens after a column the job never reads)."""
    return metadata.schema.column(i).path


def outside(chunk: Chunk, size: int) -> str | None:
    """Why `chunk`, as its footer declares it, is not in a file of `size` bytes; or None."""
    if chunk.start < 0 or chunk.length < 0 or chunk.start + chunk.length > size:
        return (
            f"column {chunk.path}'s chunk lies past the end of the file (at {chunk.start:,}, "
            f"{chunk.length:,} bytes, in a file of {size:,})"
        )
    return None


def spans(found: list[Chunk], gap: int) -> list[tuple[int, int]]:
    """(offset, length) ranges covering the chunks (in file order), neighbours less than
    `gap` bytes apart joined into one."""
    out: list[list[int]] = []
    for c in found:
        if out and c.start - (out[-1][0] + out[-1][1]) < gap:
            out[-1][1] = max(out[-1][1], c.start + c.length - out[-1][0])
        else:
            out.append([c.start, c.length])
    return [(start, length) for start, length in out]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise Malformed("a header ends inside a number")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 70:
            raise Malformed("a number longer than 10 bytes")


def _int(buf: bytes, pos: int) -> tuple[int, int]:
    raw, pos = _varint(buf, pos)
    return (raw >> 1) ^ -(raw & 1), pos  # zigzag


def _skip(buf: bytes, pos: int, kind: int, depth: int) -> int:
    if depth > _MAX_DEPTH:
        raise Malformed("headers nested too deep")
    if kind in (_TRUE, _FALSE):
        return pos
    if kind == _BYTE:
        return pos + 1
    if kind in (_I16, _I32, _I64):
        return _varint(buf, pos)[1]
    if kind == _DOUBLE:
        return pos + 8
    if kind == _BINARY:
        n, pos = _varint(buf, pos)
        return pos + n
    if kind in (_LIST, _SET):
        if pos >= len(buf):
            raise Malformed("a header ends inside a list")
        head = buf[pos]
        pos += 1
        n, element = head >> 4, head & 0x0F
        if n == 15:
            n, pos = _varint(buf, pos)
        if n > len(buf) - pos:  # every element takes a byte at least: a count never drives the work
            raise Malformed(f"a list declares {n:,} elements in {len(buf) - pos:,} bytes")
        for _ in range(n):
            pos = pos + 1 if element in (_TRUE, _FALSE) else _skip(buf, pos, element, depth + 1)
        return pos
    if kind == _MAP:
        n, pos = _varint(buf, pos)
        if 2 * n > len(buf) - pos:  # every entry takes two bytes at least
            raise Malformed(f"a map declares {n:,} entries in {len(buf) - pos:,} bytes")
        if n:
            if pos >= len(buf):
                raise Malformed("a header ends inside a map")
            key, value = buf[pos] >> 4, buf[pos] & 0x0F
            pos += 1
            for _ in range(n):
                pos = _skip(buf, _skip(buf, pos, key, depth + 1), value, depth + 1)
        return pos
    if kind == _STRUCT:
        return _struct(buf, pos, (), depth + 1)[1]
    raise Malformed(f"unknown field type {kind}")


def _struct(buf: bytes, pos: int, wanted: tuple[int, ...], depth: int = 0) -> tuple[dict[int, object], int]:
    """A struct's integer fields and its nested structs in `wanted` ({id: value}, each nested
    struct's own integer fields), the others skipped; and where it ends."""
    fields: dict[int, object] = {}
    last = 0
    while True:
        if pos >= len(buf):
            raise Malformed("a header ends before its end")
        head = buf[pos]
        pos += 1
        kind = head & 0x0F
        if kind == 0:
            return fields, pos
        delta = head >> 4
        if delta:
            last += delta
        else:
            last, pos = _int(buf, pos)
        if kind in (_I16, _I32, _I64):
            fields[last], pos = _int(buf, pos)
        elif kind == _STRUCT and last in wanted:
            fields[last], pos = _struct(buf, pos, (), depth + 1)
        else:
            pos = _skip(buf, pos, kind, depth)


class _Tally:
    """What the page headers read so far declare."""

    def __init__(self):
        self.values = self.uncompressed = self.entries = self.dictionary = self.largest = 0

    def add(self, header: dict) -> int:
        """Count one page's header; the bytes its page takes after the header."""
        size, stored = header.get(_UNCOMPRESSED), header.get(_COMPRESSED)
        if not isinstance(size, int) or not isinstance(stored, int) or size < 0 or stored < 0:
            raise Malformed("a page header without its sizes")
        page_type = header.get(_TYPE)
        kind = _PAGE_KIND.get(page_type) if isinstance(page_type, int) else None
        if kind in (_DATA_PAGE, _DATA_PAGE_V2, _DICTIONARY_PAGE):
            nested = header.get(kind)
            n = nested.get(1) if isinstance(nested, dict) else None
            if not isinstance(n, int) or n < 0:
                page, what = ("dictionary", "entries") if kind == _DICTIONARY_PAGE else ("data", "values")
                raise Malformed(f"a {page} page header without its number of {what}")
            if kind == _DICTIONARY_PAGE:
                self.entries += n
                self.dictionary += size
            else:
                self.values += n
        self.uncompressed += size
        self.largest = max(self.largest, size)
        return stored

    def pages(self) -> Pages:
        return Pages(self.values, self.uncompressed, self.entries, self.dictionary, self.largest)


_WANTED = (_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2)


def pages(data: bytes) -> Pages:
    """What the pages of a column chunk's bytes declare."""
    tally, pos = _Tally(), 0
    while pos < len(data):
        header, pos = _struct(data, pos, _WANTED)
        pos += tally.add(header)
    if pos != len(data):
        raise Malformed("the last page runs past its column chunk")
    return tally.pages()


WINDOW = 8 << 20  # bytes of a column chunk read at once when its headers are read in windows
MAX_HEADER = 16 << 20  # the longest page header read (statistics included)


def pages_in_windows(chunk: Chunk, read_at, window: int = WINDOW) -> Pages:
    """What the pages of `chunk` declare, its bytes read `window` at a time
    (`read_at(offset, n)`): a column chunk of any size is checked in bounded memory (a
    large row group read in pieces, formats/token_pieces.py). Headers are parsed where they
    lie; a page's body is skipped, read only where it shares a window with headers. A header
    longer than a window is read again in a window twice as long, up to MAX_HEADER."""
    tally, pos, end = _Tally(), chunk.start, chunk.start + chunk.length
    buf, at, size = b"", chunk.start, window
    while pos < end:
        try:
            header, after = _struct(buf, pos - at, _WANTED) if at <= pos < at + len(buf) else ({}, -1)
        except Malformed:
            if at == pos and (len(buf) >= end - pos or size >= MAX_HEADER):
                raise  # every byte left, or a window as long as a header may be: not a header
            size = size * 2 if at == pos else window
            after = -1
        if after < 0:  # the header starts (or runs) past the window: read from it on
            buf, at = read_at(pos, min(size, end - pos)), pos
            if not buf:
                raise Malformed("a header ends before its end")
            continue
        pos, size = at + after, window
        pos += tally.add(header)
    if pos != end:
        raise Malformed("the last page runs past its column chunk")
    return tally.pages()


def checked(chunk: Chunk, data: bytes | None = None, read_at=None) -> Pages:
    """The pages of `chunk` (its bytes `data`, or read in windows by `read_at`), which keep
    the invariant: else Refused."""
    if data is not None and len(data) != chunk.length:
        raise Refused(f"column {chunk.path}'s chunk lies past the end of the file")
    try:
        found = pages(data) if data is not None else pages_in_windows(chunk, read_at)
    except Malformed as e:
        raise Refused(f"column {chunk.path}: unreadable page headers ({e})") from None
    if found.values != chunk.values:
        raise Refused(
            f"column {chunk.path}: its pages hold {found.values:,} values, its footer declares {chunk.values:,}"
        )
    if found.entries > found.values:  # a dictionary holds the values' distinct ones: never more
        raise Refused(
            f"column {chunk.path}: its dictionary declares {found.entries:,} entries for {found.values:,} values"
        )
    if found.uncompressed > chunk.uncompressed:
        raise Refused(
            f"column {chunk.path}: its pages inflate to {found.uncompressed:,} bytes, "
            f"its footer declares {chunk.uncompressed:,}"
        )
    return found


def refusal(chunk: Chunk, data: bytes) -> str | None:
    """Why `chunk` (its bytes `data`) is not decoded: its pages break the invariant; or None."""
    try:
        checked(chunk, data)
    except Refused as e:
        return str(e)
    return None


def inflated(chunk: Chunk, found: Pages) -> int:
    """The most bytes a chunk of strings (`chunk.strings`) can decode to, from its pages: the
    plain pages' bytes, and every value as long as the dictionary's entries together (each
    entry stored after a 4-byte length). 0 for a chunk of fixed-width values."""
    if not chunk.strings:
        return 0
    return found.uncompressed + found.values * max(0, found.dictionary - 4 * found.entries)
