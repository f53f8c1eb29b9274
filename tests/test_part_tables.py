"""A load part's tables written as rows come (load/part_tables.py): row groups bounded by
rows and by bytes, and a file whole or absent."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembler import table_file as part_tables
from reassembler.load.part_tables import PartTables, TableFile, write_table

SCHEMA = pa.schema([("id", pa.string()), ("n", pa.int64())])


def _rows(first: int, count: int) -> pa.Table:
    return pa.table({"id": [f"r{k}" for k in range(first, first + count)], "n": list(range(first, first + count))})


def test_rows_are_written_in_order_a_row_group_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(part_tables, "ROW_GROUP_ROWS", 4)
    loc = str(tmp_path / "t.parquet")
    write_table(loc, SCHEMA, [_rows(k, 1) for k in range(10)] + [_rows(10, 0), _rows(10, 3).to_batches()[0]])
    file = pq.ParquetFile(loc)
    # a row group is cut once it holds ROW_GROUP_ROWS: the write that reaches it stays whole
    assert [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)] == [4, 4, 5]
    assert file.read().column("n").to_pylist() == list(range(13))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]


def test_a_row_group_is_cut_by_bytes_too(tmp_path, monkeypatch):
    monkeypatch.setattr(part_tables, "ROW_GROUP_BYTES", _rows(0, 3).nbytes)
    loc = str(tmp_path / "t.parquet")
    write_table(loc, SCHEMA, [_rows(k, 1) for k in range(7)])
    file = pq.ParquetFile(loc)
    assert [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)] == [3, 3, 1]


def test_an_empty_table_is_a_file_with_its_schema(tmp_path):
    loc = str(tmp_path / "t.parquet")
    write_table(loc, SCHEMA, [])
    assert pq.read_table(loc).schema == SCHEMA and pq.read_table(loc).num_rows == 0


def test_a_file_not_closed_whole_leaves_nothing(tmp_path):
    file = TableFile(str(tmp_path / "t.parquet"), SCHEMA)
    file.write(_rows(0, 5))
    assert [p.name for p in tmp_path.iterdir()] == [f"t.parquet.tmp-{os.getpid()}"]
    file.close(ok=False)
    assert list(tmp_path.iterdir()) == []


def test_a_part_that_fails_leaves_none_of_its_tables(tmp_path):
    with pytest.raises(KeyError), PartTables(str(tmp_path), {"a": SCHEMA, "b": SCHEMA}) as tables:
        tables["a"].write(_rows(0, 2))
        tables["b"].write(_rows(0, 2))
        tables["c"]  # a failure while the part is parsed
    assert list(tmp_path.iterdir()) == []
    with PartTables(str(tmp_path), {"a": SCHEMA, "b": SCHEMA}) as tables:
        tables["a"].write(_rows(0, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.parquet"]
    assert pq.read_table(tmp_path / "a.parquet").num_rows == 2 and pq.read_table(tmp_path / "b.parquet").num_rows == 0


def test_held_rows_come_out_in_order_and_their_count_starts_again_once_taken():
    from reassembler.table_file import HeldRows

    held = HeldRows(lambda rows: pa.table({"n": rows}))
    assert held.take() is None and held.count == 0
    held.add(1)
    held.add(2)
    held.add_table(pa.table({"n": [3, 4]}))
    held.add(5)
    assert held.count == 5
    assert held.take().column("n").to_pylist() == [1, 2, 3, 4, 5]
    assert held.count == 0 and held.take() is None
    held.add(6)
    assert held.count == 1 and held.take().column("n").to_pylist() == [6]
