"""A token row group is decoded only once its pages agree with its footer
(formats/parquet_pages.py): honest files of every page layout read exactly as pyarrow reads
them; a footer that understates its pages, page headers that do not parse and a chunk past
the end of the file are refused, naming the file, the row group and the column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_hostile_input import understate, varint

from reassembler.errors import InputError
from reassembler.formats.row_groups import read_row_group

COLUMNS = ["staging_key", "token_ids_delta", "token_mask_delta"]


def _table(rows: int = 50, tokens: int = 40) -> pa.Table:
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 50_000, rows * tokens)
    offsets = pa.array(np.arange(0, rows * tokens + 1, tokens, dtype=np.int32))
    return pa.table(
        {
            "staging_key": [f"r{k // 5}/c{k}" for k in range(rows)],
            "token_ids_delta": pa.ListArray.from_arrays(offsets, pa.array(ids)),
            "token_mask_delta": pa.ListArray.from_arrays(offsets, pa.array(np.ones(rows * tokens, np.float32))),
        }
    )


LAYOUTS = {
    "v1 pages, dictionary, zstd": dict(compression="zstd"),
    "v2 pages, no dictionary, snappy": dict(data_page_version="2.0", use_dictionary=False, compression="snappy"),
    "many small pages, uncompressed": dict(data_page_size=512, compression="none", use_dictionary=False),
    "v2 pages, dictionary, page index and statistics": dict(data_page_version="2.0", write_page_index=True),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_an_honest_file_of_any_page_layout_reads_as_pyarrow_reads_it(tmp_path, layout):
    path = tmp_path / "t.parquet"
    table = _table()
    pq.write_table(table, path, row_group_size=20, **LAYOUTS[layout])
    metadata = pq.read_metadata(path)
    assert metadata.num_row_groups == 3
    for group in range(3):
        got = read_row_group(str(path), metadata, group, COLUMNS)
        assert got.equals(pq.ParquetFile(path).read_row_group(group, columns=COLUMNS))


def test_a_footer_that_understates_a_columns_values_is_refused(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(rows=1, tokens=2_000_000), path, compression="zstd")
    understate(str(path), 0, 1_100_000)
    with pytest.raises(InputError) as e:
        read_row_group(str(path), pq.read_metadata(path), 0, COLUMNS)
    assert str(e.value) == (
        f"{path}: row group 0: column token_ids_delta.list.element: its pages hold 2,000,000 values, its footer "
        "declares 1,100,000; not read (a damaged or crafted token file)"
    )


def test_a_footer_that_understates_a_columns_uncompressed_size_is_refused(tmp_path):
    """The footer's total_uncompressed_size bounds what a chunk inflates to before it is
    decoded: a footer that declares less than the pages hold is refused, not trusted."""
    path = tmp_path / "t.parquet"
    pq.write_table(_table(rows=1, tokens=200_000), path, compression="zstd", use_dictionary=False)
    rg = pq.read_metadata(path).row_group(0)
    held = next(rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema.startswith("token_ids"))
    claimed = held.total_uncompressed_size - 1_000
    _refooter(path, "total_uncompressed_size", claimed)
    with pytest.raises(InputError) as e:
        read_row_group(str(path), pq.read_metadata(path), 0, COLUMNS)
    assert str(e.value).startswith(f"{path}: row group 0: column token_ids_delta.list.element: its pages inflate to ")
    assert f"its footer declares {claimed:,}; not read" in str(e.value)


def _count(n: int) -> bytes:
    """A Thrift compact-protocol size (unsigned, 7 bits a byte)."""
    out = b""
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


HUGE = 2**40
# a page header whose field 1 declares a container of 2**40 elements, in a few bytes
DECLARED = {
    "a list of booleans": (bytes([0x19, 0xF1]) + _count(HUGE), "a list declares 1,099,511,627,776 elements in "),
    "a list of bytes": (bytes([0x19, 0xF3]) + _count(HUGE), "a list declares 1,099,511,627,776 elements in "),
    "a list of lists": (bytes([0x19, 0xF9]) + _count(HUGE), "a list declares 1,099,511,627,776 elements in "),
    "a map of booleans": (bytes([0x1B]) + _count(HUGE) + bytes([0x11]), "a map declares 1,099,511,627,776 entries"),
}


@pytest.mark.parametrize("case", list(DECLARED))
def test_a_page_header_declaring_more_elements_than_it_holds_is_refused(case):
    """The page-header parser's work is bounded by the bytes it reads: a declared count
    larger than the bytes left (every element takes one at least) is refused before any
    element is read, whatever the element type (a boolean in a map takes no byte of its own
    in the parser's skip, so a count there once looped without reading)."""
    from reassembler.formats import parquet_pages

    header, said = DECLARED[case]
    with pytest.raises(parquet_pages.Malformed, match=said):
        parquet_pages.pages(header + b"\x00" * 16)


def test_page_headers_that_do_not_parse_are_refused(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path, compression="none", use_dictionary=False)
    metadata = pq.read_metadata(path)
    column = metadata.row_group(0).column(1)
    data = bytearray(Path(path).read_bytes())
    data[column.data_page_offset] = 0xFF  # the first page header's first field: not Thrift
    Path(path).write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"row group 0: column token_ids_delta.list.element: unreadable page headers"):
        read_row_group(str(path), metadata, 0, COLUMNS)


def _refooter(path: Path, field: str, value: int) -> None:
    """The footer of `path` with the token_ids column's `field` (a Thrift i64 of its column
    metadata) declaring `value` instead, the footer's length written again."""
    metadata = pq.read_metadata(path)
    rg = metadata.row_group(0)
    column = next(rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema.startswith("token_ids"))
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[-8:-4], "little")
    footer = bytes(data[-8 - length : -8])
    old = varint(getattr(column, field))
    assert footer.count(old) == 1, field
    footer = footer.replace(old, varint(value))
    path.write_bytes(bytes(data[: -8 - length]) + footer + len(footer).to_bytes(4, "little") + b"PAR1")


@pytest.mark.parametrize(
    "field, value",
    [("total_compressed_size", 2**40), ("data_page_offset", -5), ("data_page_offset", 2**40)],
)
def test_a_footer_placing_a_chunk_outside_the_file_is_refused_before_a_byte_is_read(tmp_path, field, value):
    """A footer's offsets and sizes never size a read: a chunk it declares of 2**40 bytes, at a
    negative offset or past the end is exit 2 naming the file, the row group and the
    column, not an attempt to read it (out of memory) nor an internal error."""
    path = tmp_path / "t.parquet"
    pq.write_table(_table(rows=3, tokens=5_000), path, compression="zstd", use_dictionary=False)
    _refooter(path, field, value)
    with pytest.raises(InputError) as e:
        read_row_group(str(path), pq.read_metadata(path), 0, COLUMNS)
    assert str(e.value).startswith(
        f"{path}: row group 0: column token_ids_delta.list.element's chunk lies past the end of the file (at "
    )


def test_a_dictionary_of_more_entries_than_values_is_refused(tmp_path):
    """A dictionary holds the distinct values of its chunk: a dictionary page that declares
    more entries than the chunk's values (2**31 keys in a crafted file) is refused before
    Parquet's reader allocates them."""
    from reassembler.formats import parquet_pages

    path = tmp_path / "t.parquet"
    pq.write_table(_table(rows=50), path, compression="none", use_dictionary=["staging_key"])
    column = pq.read_metadata(path).row_group(0).column(0)
    assert column.path_in_schema == "staging_key" and column.has_dictionary_page
    start, data = column.dictionary_page_offset, bytearray(path.read_bytes())
    chunk = bytes(data[start : start + column.total_compressed_size])
    assert parquet_pages.pages(chunk)[2] == 50
    at = next(  # the dictionary header's num_values, 50 (zigzag 0x64), declared 63 instead
        k for k in range(40) if chunk[k] == 0x64 and parquet_pages.pages(chunk[:k] + b"\x7e" + chunk[k + 1 :])[2] == 63
    )
    data[start + at] = 0x7E
    path.write_bytes(bytes(data))
    with pytest.raises(InputError) as e:
        read_row_group(str(path), pq.read_metadata(path), 0, COLUMNS)
    assert str(e.value) == (
        f"{path}: row group 0: column staging_key: its dictionary declares 63 entries for 50 values; "
        "not read (a damaged or crafted token file)"
    )


def test_pages_that_do_not_decode_are_one_line_naming_the_file(tmp_path):
    """Pages whose headers keep the invariant but whose data does not decode (a codec that
    lies, a damaged zstd frame) are exit 2 naming the file and the row group, not exit 70."""
    path = tmp_path / "t.parquet"
    pq.write_table(_table(rows=3, tokens=5_000), path, compression="zstd", use_dictionary=False)
    data = bytearray(path.read_bytes())
    frame = data.find(b"\x28\xb5\x2f\xfd", 4)  # the first zstd frame's magic number
    assert frame > 0
    data[frame] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(InputError) as e:
        read_row_group(str(path), pq.read_metadata(path), 0, COLUMNS)
    message = str(e.value)
    assert message.startswith(f"{path}: row group 0: its pages do not decode (") and "\n" not in message
    assert message.endswith("; not read (a damaged or crafted token file)")


def test_a_column_chunk_past_the_end_of_the_file_is_refused(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path, row_group_size=25)
    metadata = pq.read_metadata(path)  # the footer of the whole file, then the file cut short
    Path(path).write_bytes(Path(path).read_bytes()[: metadata.row_group(1).column(0).data_page_offset + 10])
    assert read_row_group(str(path), metadata, 0, COLUMNS).num_rows == 25
    with pytest.raises(InputError, match=r"row group 1: column staging_key's chunk lies past the end of the file"):
        read_row_group(str(path), metadata, 1, COLUMNS)


def test_a_chunk_cut_short_after_its_size_was_taken_is_refused(tmp_path):
    """The file's size as a listing gave it before the file was cut short (a file replaced
    under the job): the footer's chunk lies inside that size, but fewer bytes come back than
    it declares, and the chunk is refused before anything is decoded."""
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path, row_group_size=25)
    size = path.stat().st_size
    metadata = pq.read_metadata(path)
    Path(path).write_bytes(Path(path).read_bytes()[: metadata.row_group(1).column(0).data_page_offset + 10])
    with pytest.raises(InputError) as e:
        read_row_group(str(path), metadata, 1, COLUMNS, size)
    assert str(e.value) == (
        f"{path}: row group 1: column staging_key's chunk lies past the end of the file; "
        "not read (a damaged or crafted token file)"
    )
