"""Local-mode captures read by child processes beside this one (load/capture_children.py,
started by load.NightLoad) load exactly what this process alone loads: the same ledger
rows in the same capture order, the same verdicts, token rows, training rows and audit;
the same one-line errors; and the NightLoad that started them stops them, whatever happens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from nights import DS
from reassembler.build import build_night
from reassembler.errors import InputError
from reassembler.formats.night import find_night
from reassembler.load import capture_children
from reassembler.merge.night_load import NightLoad
from reassembler.merge.run import load_night
from reassembler.producer.config import SynthConfig
from reassembler.producer.synth import read_expected, synth_night
from reassembler.warehouse import connect

LEDGER = "SELECT * EXCLUDE (ds) FROM ledger ORDER BY capture_seq"
START = capture_children.start


@pytest.fixture(scope="module")
def local_night(tmp_path_factory):
    """A synthetic night of NeMo Gym local-mode rollouts, full and delta prompts, with every
    fault synth injects into that capture."""
    root = tmp_path_factory.mktemp("local-night")
    synth_night(root, DS, SynthConfig(rollouts=40, seed=3, only_shape="local", local_delta=0.5))
    return root


def _children(monkeypatch, cores: int | None) -> list:
    """Children for any night of two captures or more on `cores` cores (None: never);
    the CaptureChildren each NightLoad started, appended to the list returned."""
    monkeypatch.setattr(capture_children, "CHILD_ROLLOUTS", 1 if cores else 10**9)
    monkeypatch.setattr(capture_children, "_cores", lambda: cores or 1)
    started: list = []
    monkeypatch.setattr(capture_children, "start", lambda night: started.append(START(night)) or started[-1])
    return started


def _built(root, out, monkeypatch, cores):
    started = _children(monkeypatch, cores)
    summary = build_night(root, out, DS)
    with connect(out, read_only=True) as con:
        ledger = con.execute(LEDGER).fetchall()
        token_rows = con.execute("SELECT count(*) FROM token_rows").fetchone()[0]
    rows = pq.read_table(out / "rows" / f"ds={DS}").sort_by("row_id").to_pylist()
    audit = pq.read_table(out / "audit" / f"ds={DS}").sort_by("rollout_id").to_pylist()
    return summary, ledger, token_rows, rows, audit, started


@pytest.mark.parametrize("cores", [2, 4])
def test_children_read_what_this_process_reads(tmp_path, local_night, monkeypatch, cores):
    here = _built(local_night, tmp_path / "here", monkeypatch, None)
    there = _built(local_night, tmp_path / "there", monkeypatch, cores)
    assert here[5] == [None]
    [children] = there[5]
    assert children is not None and len(children._children) == cores - 1
    assert len(children.token_files) == cores - 1  # each child derived token rows of its own
    assert there[1] == here[1]  # ledger rows: capture order, verdicts (entry_fault), token places
    assert there[2] == here[2] > 0
    assert there[3] == here[3] and len(here[3]) > 0
    for a in here[4] + there[4]:
        a.pop("run_id", None)
        a.pop("built_at", None)
    assert there[4] == here[4]
    assert str(there[0].load) == str(here[0].load)
    expected = read_expected(local_night, DS)
    statuses = {a["rollout_id"]: (a["status"], a["reason"]) for a in there[4]}
    assert statuses == {k: (e["select"]["status"], e["select"]["reason"]) for k, e in expected.items()}
    assert any(reason for _, reason in statuses.values())  # faults were read by the children too


def test_children_read_from_and_write_to_object_storage(s3, local_night, tmp_path, monkeypatch):
    """On S3 the children read the capture files and write their token rows to the run's
    folder on the store, as this process does: the same rows as a local build."""
    inp, out = f"s3://{s3.bucket('capture')}/nightly", f"s3://{s3.bucket('rows')}/nightly"
    s3.upload(local_night, inp)
    here = _built(local_night, tmp_path / "here", monkeypatch, None)
    started = _children(monkeypatch, 2)
    build_night(inp, out, DS, warehouse_file=tmp_path / "warehouse.duckdb")
    [children] = started
    assert children is not None and [f.startswith(out + "/_runs/") for f in children.token_files] == [True]
    s3.download(out, tmp_path / "mirror")
    rows = pq.read_table(tmp_path / "mirror" / "rows" / f"ds={DS}").sort_by("row_id").to_pylist()
    assert rows == here[3] and len(rows) > 0


def _gone(root, key: str, monkeypatch, cores, out) -> str:
    """The one-line error when `key`'s entries file is gone after the listing."""
    started = _children(monkeypatch, cores)
    load = NightLoad(root, DS)
    path = root / "ledger" / f"ds={DS}" / f"{key}.tokens.jsonl"
    aside = out.parent / f"{out.name}-aside"
    with connect(out) as con, load:
        path.rename(aside)
        try:
            with pytest.raises(InputError) as err:
                load.into(con)
        finally:
            aside.rename(path)
    assert (started[0] is not None) == bool(cores)
    return str(err.value)


def test_a_capture_file_gone_is_the_same_one_line_error_in_a_child(tmp_path, local_night, monkeypatch):
    keys = sorted(p.name.removesuffix(".tokens.jsonl") for p in (local_night / "ledger" / f"ds={DS}").glob("*.jsonl"))
    for key in (keys[0], keys[-1]):  # read here, read by the child
        here = _gone(local_night, key, monkeypatch, None, tmp_path / f"here-{key}")
        there = _gone(local_night, key, monkeypatch, 2, tmp_path / f"there-{key}")
        assert there == here == f"{key}.tokens.jsonl: cannot read (No such file or directory)"


def test_a_child_killed_fails_the_load_and_leaves_the_night_before(tmp_path, local_night, monkeypatch):
    with connect(tmp_path / "out") as con:
        load_night(con, find_night(local_night, DS))  # a night loaded before
        before = con.execute(LEDGER).fetchall()
    started = _children(monkeypatch, 2)
    with connect(tmp_path / "out") as con, NightLoad(local_night, DS) as load:
        [child] = started[0]._children
        os.kill(child._proc._proc.pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="local-mode capture reader process ended with exit code -9"):
            load.into(con)
        assert con.execute(LEDGER).fetchall() == before


def test_leaving_the_night_load_stops_and_reaps_idle_children(local_night, monkeypatch):
    started = _children(monkeypatch, 4)
    with NightLoad(local_night, DS):
        procs = [child._proc._proc for child in started[0]._children]  # their Popen
        assert len(procs) == 3 and all(p.poll() is None for p in procs)  # idle, waiting for work
    assert all(p.returncode is not None for p in procs)  # reaped: no zombie left
    with pytest.raises(KeyboardInterrupt), NightLoad(local_night, DS):
        procs = [child._proc._proc for child in started[1]._children]
        raise KeyboardInterrupt
    assert all(p.returncode is not None for p in procs)


def test_children_only_for_enough_captures_on_two_cores_or_more(local_night, monkeypatch):
    night = find_night(local_night, DS)
    n = sum(1 for rel in night.captures if rel.endswith(".tokens.jsonl"))
    cases = [(1, 1, None), (n // 2, 2, 1), (n // 2 + 1, 2, None), (1, 8, capture_children.MAX_READERS - 1)]
    for per_reader, cores, children in cases:
        monkeypatch.setattr(capture_children, "CHILD_ROLLOUTS", per_reader)
        monkeypatch.setattr(capture_children, "_cores", lambda cores=cores: cores)
        readers = capture_children.start(night)
        try:
            assert (None if readers is None else len(readers._children)) == children
        finally:
            if readers is not None:
                readers.close()


def test_the_night_load_module_imports_nothing_heavy():
    """`reassembler build` enters a NightLoad before it imports numpy, pyarrow and DuckDB, so
    that its children start at once (load/night_load.py)."""
    code = (
        "import sys; import reassembler.merge.night_load; "
        "print(sorted(m for m in ('numpy', 'pyarrow', 'duckdb', 'orjson.dumps') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_derived_keys_past_their_memory_bound_are_read_back_the_same(tmp_path, local_night, monkeypatch):
    """A part keeps the keys of the token rows it derives as it writes them, up to KEYS_HELD
    bytes a file; past that the file's keys are read back from it: the same ledger, token
    places and rows either way."""
    from reassembler.load import derived_tokens, token_keys

    kept = _built(local_night, tmp_path / "kept", monkeypatch, None)
    read_back: list[list[str]] = []
    real = token_keys.key_batches
    monkeypatch.setattr(token_keys, "key_batches", lambda files, *a: read_back.append(files) or real(files, *a))
    monkeypatch.setattr(derived_tokens, "KEYS_HELD", 0)
    read = _built(local_night, tmp_path / "read", monkeypatch, None)
    assert [Path(f).name for [f] in read_back if "derived" in f] == ["derived-tokens.parquet"]
    places = [str(r).replace(str(tmp_path / "read"), str(tmp_path / "kept")) for r in read[1]]
    assert places == [str(r) for r in kept[1]] and read[2] == kept[2] > 0
    assert read[3] == kept[3] and len(kept[3]) > 0
