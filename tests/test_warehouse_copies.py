"""The warehouse survives its worker (reassembler/warehouse/copies.py): three nights, the
worker's DuckDB file lost, a fourth night; and a stale file (an older night's copy) put back.
The report's trends, explain, the gate's history and the retention see all four nights,
with the output on local disk and on the S3 server; the warehouse file itself lives apart
(`--warehouse`, the worker's disk), as a deployment keeps it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from commands import cli
from reassembler.call_tables import nights_on_disk
from reassembler.producer.synth import SynthConfig, synth_night

NIGHTS = ["2026-11-25", "2026-11-26", "2026-11-27", "2026-11-28"]


@pytest.fixture(scope="module")
def nights(tmp_path_factory) -> Path:
    inp = tmp_path_factory.mktemp("copies") / "input"
    for k, ds in enumerate(NIGHTS):
        cfg = SynthConfig(
            rollouts=12,
            seed=70 + k,
            fault_rate=0.25,
            max_calls=6,
            prompt_tokens=(10, 30),
            observation_tokens=(3, 10),
            generated_tokens=(2, 8),
        )
        synth_night(inp, ds, cfg)
    return inp


def _build_and_gate(inp: Path, out: str, warehouse: Path, ds: str, *extra: str):
    res = cli("build", "--input", inp, "--output", out, "--warehouse", warehouse, "--ds", ds, *extra)
    assert res.returncode == 0, res.stderr
    gate = cli("gate", "--output", out, "--warehouse", warehouse, "--ds", ds, "--json")
    assert gate.returncode in (0, 5), gate.stderr
    return res


def _all_four_are_there(inp: Path, out: str, warehouse: Path) -> None:
    with duckdb.connect(str(warehouse), read_only=True) as con:
        verdicts = con.execute("SELECT DISTINCT ds::VARCHAR FROM quality ORDER BY 1").fetchall()
        runs = con.execute("SELECT DISTINCT ds::VARCHAR FROM runs ORDER BY 1").fetchall()
    assert [d for (d,) in verdicts] == NIGHTS and [d for (d,) in runs] == NIGHTS
    # the retention (3 nights) knew night 1 and dropped its per-call files
    assert nights_on_disk(out, "ledger") == NIGHTS[1:]
    report = cli("report", "--output", out, "--warehouse", warehouse)
    assert report.returncode == 0, report.stderr
    assert all(f"{ds}  12 " in report.stdout for ds in NIGHTS), report.stdout
    for ds in NIGHTS[:2]:  # night 1 is past the retention, and the warehouse knows it; night 2 is explained
        first = json.loads((inp / "_expected" / f"ds={ds}" / "outcomes.jsonl").read_text().splitlines()[0])
        explained = cli("explain", "--output", out, "--warehouse", warehouse, "--ds", ds, first["rollout_id"])
        if ds == NIGHTS[0]:
            assert explained.returncode == 2 and "past the retention); its audit row is all" in explained.stderr
        else:
            assert explained.returncode == 0 and first["rollout_id"] in explained.stdout, explained.stderr


@pytest.mark.parametrize("store", ["local", "s3"])
def test_losing_the_warehouse_worker_loses_nothing(tmp_path, nights, store, request):
    if store == "s3":
        s3 = request.getfixturevalue("s3")
        out = f"s3://{s3.bucket('rows')}/nightly"
    else:
        out = str(tmp_path / "out")
    worker = tmp_path / "worker-disk"
    warehouse = worker / "warehouse.duckdb"
    for ds in NIGHTS[:3]:
        _build_and_gate(nights, out, warehouse, ds, "--retention-nights", "3")
    shutil.rmtree(worker)  # the worker is replaced: its disk is gone
    res = _build_and_gate(nights, out, warehouse, NIGHTS[3], "--retention-nights", "3")
    restored = [line for line in res.stderr.splitlines() if "restored the warehouse" in line]
    assert len(restored) == 1 and "no local file" in restored[0] and f"night {NIGHTS[2]}" in restored[0], res.stderr
    _all_four_are_there(nights, out, warehouse)
    if store == "local":
        pointer = json.loads((Path(out) / "_warehouse" / "latest.json").read_text())
        assert pointer["ds"] == NIGHTS[3] and pointer["schema_version"] >= 12


def test_a_stale_warehouse_file_is_set_aside_and_the_stores_copy_restored(tmp_path, nights):
    out, worker = tmp_path / "out", tmp_path / "worker-disk"
    warehouse = worker / "warehouse.duckdb"
    for ds in NIGHTS[:2]:
        _build_and_gate(nights, str(out), warehouse, ds, "--retention-nights", "3")
    shutil.copy(warehouse, tmp_path / "after-night-2.duckdb")
    _build_and_gate(nights, str(out), warehouse, NIGHTS[2], "--retention-nights", "3")
    shutil.copy(tmp_path / "after-night-2.duckdb", warehouse)  # an old disk image comes back
    res = _build_and_gate(nights, str(out), warehouse, NIGHTS[3], "--retention-nights", "3")
    assert "older than the store's copy" in res.stderr, res.stderr
    _all_four_are_there(nights, str(out), warehouse)
    stale = [p.name for p in worker.iterdir() if ".stale-" in p.name]
    assert len(stale) == 1 and stale[0].startswith("warehouse.duckdb.stale-")  # set aside, not deleted


def test_a_copy_that_does_not_match_its_pointer_is_not_restored(tmp_path, nights):
    out, warehouse = tmp_path / "out", tmp_path / "disk" / "warehouse.duckdb"
    _build_and_gate(nights, str(out), warehouse, NIGHTS[0])
    pointer = json.loads((out / "_warehouse" / "latest.json").read_text())
    copy = out / "_warehouse" / pointer["file"]
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 1
    copy.write_bytes(bytes(data))
    warehouse.unlink()
    res = cli("report", "--output", out, "--warehouse", warehouse)
    err = res.stderr.strip()
    assert res.returncode == 6 and "\n" not in err and f"{copy}: " in err and "the warehouse was not restored" in err
    assert not warehouse.exists()
    # the rows stay what they were
    assert pq.read_table(out / "rows" / f"ds={NIGHTS[0]}").num_rows > 0
