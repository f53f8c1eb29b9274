"""The README's snippets for reading the rows, run as written on two nights whose rollout ids
repeat (as NeMo Gym's do): each reader's plain call on `<output>/rows` works, and keeps the
nights apart by the `ds` column (the night, as text or a date)."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from nights import Night, worked_example
from reassembler.build import build_night

README = Path(__file__).resolve().parents[1] / "README.md"
NIGHTS = ("2026-11-27", "2026-11-28")


def snippets() -> list[str]:
    section = README.read_text().split("## Output and how to read it", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(found) == 5, "the README shows one snippet per reader"
    return found


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    root = tmp_path_factory.mktemp("readers")
    for ds in NIGHTS:
        n = Night(root / ds, ds=ds)
        worked_example(n, "a_g0", compaction=True)  # the same ids both nights
        worked_example(n, "a_g1", compaction=False, reward=0.0)
        build_night(n.write(), root / "out", ds)
    return root / "out"


def _columns(rows) -> tuple[list, list]:
    """(ds values, row_id values) of whatever the reader returned."""
    if hasattr(rows, "to_pydict") and not hasattr(rows, "features"):  # pyarrow
        return rows.column("ds").to_pylist(), rows.column("row_id").to_pylist()
    if hasattr(rows, "features"):  # datasets, streamed
        read = list(rows)
        return [r["ds"] for r in read], [r["row_id"] for r in read]
    if hasattr(rows, "get_column"):  # polars
        return rows.get_column("ds").to_list(), rows.get_column("row_id").to_list()
    return list(rows["ds"]), list(rows["row_id"])  # pandas


@pytest.mark.parametrize("k", range(5), ids=["pyarrow", "duckdb", "polars", "pandas", "datasets"])
def test_each_readme_snippet_keeps_two_nights_apart(output, k):
    namespace = {"OUTPUT": str(output)}
    exec(snippets()[k], namespace)
    ds, row_id = _columns(namespace["rows"])
    per_night = pq.read_table(output / "rows" / f"ds={NIGHTS[0]}").num_rows
    assert len(row_id) == 2 * per_night
    assert {(d.isoformat() if isinstance(d, datetime.date) else str(d)) for d in ds} == set(NIGHTS)
    assert len(set(row_id)) == per_night  # row ids repeat across nights ...
    assert len(set(zip(ds, row_id))) == 2 * per_night  # ... (ds, row_id) does not


def test_the_files_themselves_carry_ds_as_the_folder_names_type(output):
    """Each file says its night (a file read alone, the manifest's readers), typed as pyarrow's
    hive partitioning types the folder, so that the two merge."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    for kind in ("rows", "audit"):
        for ds in NIGHTS:
            for part in (output / kind / f"ds={ds}").glob("*.parquet"):
                table = pq.read_table(part)
                assert table.schema.field("ds").type == pa.dictionary(pa.int32(), pa.string())
                assert set(table.column("ds").to_pylist()) == {ds}
        hive = pads.HivePartitioning.discover(infer_dictionary=True)  # pq.read_table's and pandas'
        assert pads.dataset(output / kind, partitioning=hive).schema.field("ds").type == table.schema.field("ds").type


def test_the_plain_calls_read_every_night_of_the_audit_too(output):
    import pandas as pd
    import polars as pl

    n = pq.read_table(output / "audit" / f"ds={NIGHTS[0]}").num_rows
    assert pq.read_table(output / "audit").num_rows == pd.read_parquet(output / "audit").shape[0] == 2 * n
    assert pl.read_parquet(output / "audit").height == 2 * n


def test_the_datasets_snippet_leaves_no_copy_in_its_cache(output, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    for _ in range(2):  # a rerun neither
        namespace = {"OUTPUT": str(output)}
        exec(snippets()[4], namespace)
        assert len(list(namespace["rows"])) > 0
    cached = [p for p in (tmp_path / "hf-cache").rglob("*") if p.is_file() and p.suffix == ".arrow"]
    assert cached == []


def test_runs_are_recorded_under_their_own_ids(tmp_path):
    """The run id a build is given (Airflow's, with ':' and '+') is the one recorded in the
    audit rows, the runs table and the manifest; only the staging folder is path-safe."""
    import json

    import duckdb

    n = Night(tmp_path / "n")
    worked_example(n, "a_g0")
    out = tmp_path / "out"
    run_id = "manual__2026-12-01T13:19:42.400957+00:00"
    build_night(n.write(), out, "2026-11-28", run_id=run_id)
    assert set(pq.read_table(out / "audit" / "ds=2026-11-28").column("run_id").to_pylist()) == {run_id}
    assert json.loads((out / "_published" / "ds=2026-11-28.json").read_text())["run_id"] == run_id
    assert duckdb.sql(f"SELECT run_id FROM '{out}/tables/runs.parquet'").fetchall() == [(run_id,)]


# ---------------------------------------------------------------- readers that follow the manifest


def manifest_snippets() -> list[str]:
    section = README.read_text().split("## Reading exactly the committed night", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(found) == 5, "the README resolves the manifest once, then one snippet per reader"
    return found


READERS = ["pyarrow", "duckdb", "polars", "datasets"]


def _rows_of(rows) -> list[str]:
    if hasattr(rows, "features"):  # datasets
        return sorted(rows["row_id"])
    if hasattr(rows, "get_column"):  # polars
        return sorted(rows.get_column("row_id").to_list())
    return sorted(rows.column("row_id").to_pylist())


@pytest.mark.parametrize("store", ["local", "s3"])
@pytest.mark.parametrize("reader", READERS)
def test_each_reader_follows_the_manifest_to_exactly_the_committed_night(output, request, store, reader):
    import json

    out = str(output)
    if store == "s3":
        s3 = request.getfixturevalue("s3")
        out = f"s3://{s3.bucket('rows')}/nightly"
        s3.upload(output, out)
    setup, *per_reader = manifest_snippets()
    namespace = {"OUTPUT": out, "DS": NIGHTS[1]}
    exec(setup, namespace)
    exec(per_reader[READERS.index(reader)], namespace)
    manifest = json.loads((output / "_published" / f"ds={NIGHTS[1]}.json").read_text())
    expected = sorted(
        r for key in manifest["files"]["rows"] for r in pq.read_table(output / key).column("row_id").to_pylist()
    )
    assert _rows_of(namespace["rows"]) == expected and expected


@pytest.mark.parametrize("reader", ["pyarrow", "pandas", "polars"])
def test_the_plain_calls_read_the_rows_on_s3_too(output, s3, reader):
    """The same plain calls on s3:// (the endpoint and credentials from AWS_* as the README
    says); DuckDB has no httpfs here: on S3 it follows the manifest."""
    out = f"s3://{s3.bucket('plain')}/nightly"
    s3.upload(output, out)
    namespace = {"OUTPUT": out}
    code = {k: snippets()[i] for i, k in enumerate(["pyarrow", "duckdb", "polars", "pandas", "datasets"])}[reader]
    exec(code, namespace)
    ds, row_id = _columns(namespace["rows"])
    per_night = pq.read_table(output / "rows" / f"ds={NIGHTS[0]}").num_rows
    assert len(row_id) == 2 * per_night and {str(d) for d in ds} == set(NIGHTS)
