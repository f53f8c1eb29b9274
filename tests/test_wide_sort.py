"""Wide rows put in order in buckets (wide_sort.py): DuckDB numbers the keys, the rows are
held a bucket at a time, spilled to Arrow files past HELD_BYTES, and given out in order, ties
in the order they came; the spill folder goes with the sort."""

from __future__ import annotations

import os

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from reassembler import wide_sort
from reassembler.wide_sort import BUCKET, SortBuckets, ordered


def _batch(buckets: list[int], first: int) -> pa.RecordBatch:
    n = len(buckets)
    return pa.record_batch({"n": list(range(first, first + n)), BUCKET: buckets, "pad": ["x" * 100] * n})


def _drain(held: SortBuckets) -> list[tuple[int, list[int]]]:
    out = []
    for table in held.tables():
        buckets = set(table.column(BUCKET).to_pylist())
        assert len(buckets) == 1, buckets  # a table is one bucket
        out.append((buckets.pop(), table.column("n").to_pylist()))
    return out


@pytest.mark.parametrize("held_bytes", [wide_sort.HELD_BYTES, 12_000])
def test_rows_come_out_a_bucket_at_a_time_in_bucket_order_each_in_the_order_it_came(tmp_path, monkeypatch, held_bytes):
    monkeypatch.setattr(wide_sort, "HELD_BYTES", held_bytes)  # 12,000: a spill every third batch
    rng = np.random.default_rng(7)
    # bucket numbers whose set does not iterate in order; the last batch is still held at the end
    batches = [_batch(rng.choice([40, 17, 9, 1, 0], 40).tolist(), 40 * k) for k in range(13)]
    batches.insert(3, _batch([2, 0, 2], 10_000))  # first and last alike, a row between of another bucket
    batches.insert(5, _batch([], 20_000))
    spilled = []
    real_spill = SortBuckets._spill
    monkeypatch.setattr(SortBuckets, "_spill", lambda self: (spilled.append(1), real_spill(self)))
    want: dict[int, list[int]] = {}
    for b in batches:
        for n, k in zip(b.column("n").to_pylist(), b.column(BUCKET).to_pylist()):
            want.setdefault(k, []).append(n)
    spill = tmp_path / "spill"
    with SortBuckets(batches[0].schema, str(spill)) as held:
        for b in batches:
            held.add(b)
        got = _drain(held)
    assert got == sorted(want.items())
    per_batch = batches[0].nbytes
    if held_bytes == 12_000:  # the held bytes start again after each spill: a spill per 12,000 bytes held, not per add
        assert 1 <= len(spilled) <= len(batches) * per_batch // 12_000 + 1 < len(batches) - 1
    else:
        assert spilled == []
    assert os.listdir(spill) == [] if spill.exists() else True  # the sort's own folder is gone


def test_the_spill_folder_goes_when_the_sort_is_left_early(tmp_path, monkeypatch):
    monkeypatch.setattr(wide_sort, "HELD_BYTES", 1)
    spill = tmp_path / "spill"
    with pytest.raises(RuntimeError):
        with SortBuckets(_batch([0], 0).schema, str(spill)) as held:
            held.add(_batch([0, 1, 1], 0))
            assert len(os.listdir(spill)) == 1 and os.listdir(spill / os.listdir(spill)[0])
            raise RuntimeError("the consumer failed")
    assert os.listdir(spill) == []


def test_a_large_bucket_keeps_its_ties_in_arrival_order(tmp_path):
    rng = np.random.default_rng(3)
    buckets = rng.integers(0, 3, 5000).tolist()  # past numpy's small-array (always stable) sort
    with SortBuckets(_batch(buckets, 0).schema, str(tmp_path)) as held:
        held.add(_batch(buckets, 0))
        got = _drain(held)
    assert [k for k, _ in got] == [0, 1, 2]
    assert all(rows == sorted(rows) for _, rows in got)


def test_ordered_gives_a_tables_rows_by_its_keys_nulls_last(tmp_path):
    con = duckdb.connect()
    con.execute(f"SET temp_directory = '{tmp_path}'")
    con.execute(
        "CREATE TABLE t AS SELECT i AS n, CASE WHEN i % 7 = 0 THEN NULL ELSE (i * 37) % 11 END AS k, "
        "repeat('x', 50) AS pad, i % 2 AS drop_me FROM range(200) r(i)"
    )
    schema, tables = ordered(con, "t", ["k"], "drop_me", rows=16)
    assert schema.names == ["n", "k", "pad"]
    got = [t for t in tables]
    assert all(t.column_names == ["n", "k", "pad"] and t.num_rows <= 16 for t in got)
    rows = [(r["k"], r["n"]) for t in got for r in t.to_pylist()]
    stored = con.execute("SELECT k, n FROM t").fetchall()
    keys = [k for k, _ in rows]
    assert keys == sorted(keys, key=lambda k: (k is None, k or 0)) and keys[-1] is None
    assert sorted(rows, key=str) == sorted(stored, key=str)
    assert len(got) == 13  # 200 rows, 16 a bucket
