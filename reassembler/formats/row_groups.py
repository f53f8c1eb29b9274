"""A token file's row group read within a bound (CONTRACT.md 2.3): what its columns take
decoded, from the footer alone (`decoded_bytes`), and the row group decoded once its pages
were held to that footer (`read_row_group`, parquet_pages.py). The token file's format
(formats/token_file.py) and its pieces (formats/token_pieces.py) both read through here.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..errors import InputError
from ..settings import DEFAULTS
from . import parquet_pages
from .fields import LEDGER_DIGESTS, LEDGER_INTS, LINEAGE_FIELDS

LOGPROB_NAMES = ("generation_logprobs_delta", "generation_log_probs_delta")  # the contract's, then Gym's
STRINGS, INTS, DIGESTS = LINEAGE_FIELDS, LEDGER_INTS, LEDGER_DIGESTS

# Bytes a token value takes once decoded to the canonical types, per list column (and the
# list offsets, per row and column).
DECODED_WIDTH = {"token_ids_delta": 8, "token_mask_delta": 4, **{name: 4 for name in LOGPROB_NAMES}}
READ = frozenset(STRINGS + INTS + DIGESTS + tuple(DECODED_WIDTH))  # the columns the job may read


def decoded_bytes(metadata: pq.FileMetaData, group: int, columns=READ) -> int:
    """What row group `group`'s `columns` take decoded, from the file's metadata alone:
    token values (leaf values of the list columns, as Parquet counts them) at their
    canonical widths, any other column its uncompressed bytes and an offset a value (a
    column of strings read through a dictionary is measured again: read_row_group). A file
    of a few KB can hold a row group of millions of identical tokens."""
    rg = metadata.row_group(group)
    total = 3 * 8 * rg.num_rows
    for i in range(rg.num_columns):
        column = rg.column(i)
        name = parquet_pages.leaf_path(metadata, i).split(".")[0]  # the schema's, not the chunk's say
        if name not in columns:
            continue
        width = DECODED_WIDTH.get(name)
        total += column.num_values * width if width else column.total_uncompressed_size + 8 * column.num_values
    return total


MERGE_GAP = 1 << 20  # column chunks this close are read as one span (the columns between them too)


def read_row_group(
    loc: str,
    metadata: pq.FileMetaData,
    group: int,
    columns: list[str],
    size: int | None = None,
    bound: int = DEFAULTS.max_row_group_bytes,
) -> pa.Table:
    """Row group `group`'s `columns`, decoded once the pages of each of its column chunks
    were found to hold what the footer declares (parquet_pages.py), and what they decode to
    to stay within `bound` bytes: else InputError naming the file, the row group and the
    column, and nothing is decoded. The chunks' bytes are read once, checked, and decoded
    from memory. Columns of strings whose dictionary could take them past `bound` are
    decoded as dictionaries, measured, and only then laid out."""
    footprint = decoded_bytes(metadata, group, columns)
    if footprint > bound:
        raise InputError(
            f"{loc}: row group {group}: its columns {', '.join(columns)} decode to {footprint:,} bytes, over the "
            f"{bound:,} the job decodes at once; not read (write token files in smaller row groups)"
        )
    found = parquet_pages.chunks(metadata, group, columns)
    end = size if size is not None else storage.size(loc)
    for chunk in found:  # before a byte is read: a footer's offsets and sizes never size a read past the file
        why = parquet_pages.outside(chunk, end)
        if why is not None:
            raise InputError(f"{loc}: row group {group}: {why}; not read (a damaged or crafted token file)")
    spans = parquet_pages.spans(found, MERGE_GAP)
    datas = storage.read_ranges(loc, spans, size)  # one request a span: on S3 a row group's columns at once
    inflated = 0
    for chunk in found:
        start, data = next((s, d) for (s, n), d in zip(spans, datas) if s <= chunk.start < s + n)
        try:
            pages = parquet_pages.checked(chunk, data[chunk.start - start : chunk.start - start + chunk.length])
        except parquet_pages.Refused as e:
            raise InputError(f"{loc}: row group {group}: {e}; not read (a damaged or crafted token file)") from None
        inflated += parquet_pages.inflated(chunk, pages)
    # strings a dictionary could repeat past the bound: decoded as dictionaries, measured first
    measured = [c.column for c in found if c.strings] if footprint + inflated > bound else []
    source = storage.served(loc, [(s, d) for (s, _), d in zip(spans, datas)], size)
    try:
        table = pq.ParquetFile(source, metadata=metadata, read_dictionary=measured or None).read_row_group(
            group, columns=columns
        )
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, pa.ArrowMemoryError):  # out of memory stays what it is (exit 4)
            raise
        said = " ".join(str(e).split())  # one line
        raise InputError(
            f"{loc}: row group {group}: its pages do not decode ({said}); not read (a damaged or crafted token file)"
        ) from None
    finally:
        source.close()
    return laid_out(table, measured, footprint, bound, f"{loc}: row group {group}") if measured else table


def laid_out(table: pa.Table, measured: list[str], total: int, bound: int, where: str) -> pa.Table:
    """`table` with its `measured` columns (dictionaries) as plain strings, once what they
    take so (every value's entry, summed without laying one out) keeps the row group
    within `bound`: else InputError."""
    for name in measured:
        column = table.column(name)
        if not pa.types.is_dictionary(column.type):
            continue
        for chunk in column.chunks:
            lengths = pc.binary_length(chunk.dictionary).cast(pa.int64())
            total += pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0
        if total > bound:
            raise InputError(
                f"{where}: column {name}'s strings decode to more than {bound:,} bytes with the rest of the row "
                "group (a dictionary of long entries, repeated); not read (a damaged or crafted token file)"
            )
        table = table.set_column(table.schema.get_field_index(name), name, column.cast(column.type.value_type))
    return table
