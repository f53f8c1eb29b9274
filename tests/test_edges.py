"""The job's edges, replayed as an operator meets them: SIGKILL at every step of publish,
two builds at once, readers holding the warehouse, odd input, and every exit code. Builds
run as subprocesses of the real command, so exit codes, messages and kills are real."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from commands import cli, one_line_error
from nights import DS, Night, partition_parts, worked_example
from reassembler.errors import ResourceExhausted, classify
from reassembler.publish.protocol import KINDS
from reassembler.settings import DuckDBSettings

STEPS = ["commit", "manifest", "warehouse", "rows_in", "audit_in"]


def build(inp, out, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return cli("build", "--input", inp, "--output", out, "--ds", DS, *extra, env=env)


def night_input(root: Path, extra: bool = False) -> Path:
    """Three rollouts (3 rows); with `extra`, a fourth (4 rows)."""
    n = Night(root)
    worked_example(n, "a_g0", compaction=True, reward=1.0)
    worked_example(n, "a_g1", compaction=False, reward=0.0)
    worked_example(n, "b_g0", compaction=False, reward=None, failure_reason="timeout")
    if extra:
        worked_example(n, "b_g1", compaction=False, reward=0.1)
    return n.write()


def part_bytes(folder: Path) -> dict[str, bytes]:
    return partition_parts(folder)


def reader_view(out: Path) -> dict[str, int | None]:
    """What a reader globbing <table>/ds=* sees: it must be one complete partition of one run
    or none."""
    seen = {}
    for kind in KINDS:
        entries = sorted(p.name for p in (out / kind).iterdir()) if (out / kind).exists() else []
        assert all(re.fullmatch(r"ds=\d{4}-\d{2}-\d{2}", e) for e in entries), (kind, entries)  # nothing else
        part = out / kind / f"ds={DS}"
        names = [p.name for p in part.iterdir()] if part.exists() else []
        assert all(n.startswith("part-") for n in names)
        assert len({n.rsplit("-", 1)[0] for n in names}) <= 1, names  # the files of one run
        seen[kind] = pq.read_table(part).num_rows if part.exists() else None
    return seen


def manifest_view(out: Path) -> dict[str, int] | None:
    """What a reader following the manifest sees: the rows and audit of the run it names."""
    path = out / "_published" / f"ds={DS}.json"
    if not path.exists():
        return None
    manifest = json.loads(path.read_text())
    view = {}
    for kind in KINDS:
        tables = [pq.read_table(out / key) for key in manifest["files"][kind]]
        view[kind] = sum(t.num_rows for t in tables)
        if kind == "audit":
            assert {r for t in tables for r in t.column("run_id").to_pylist()} == {manifest["run_id"]}
    return view


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("edges")
    old, new = night_input(root / "old"), night_input(root / "new", extra=True)
    clean = root / "clean"
    assert build(new, clean).returncode == 0
    return old, new, part_bytes(clean / "rows" / f"ds={DS}")


@pytest.mark.parametrize("step", STEPS)
def test_sigkill_at_every_step_of_publish(tmp_path, inputs, step):
    old, new, clean_rows = inputs
    out = tmp_path / "out"
    assert build(old, out).returncode == 0
    killed = build(new, out, env={"REASSEMBLER_TEST_KILL_AT": step})
    assert killed.returncode == -signal.SIGKILL
    view = reader_view(out)  # never absent, never a mix
    assert view["rows"] in (3, 4) and view["audit"] in (3, 4)
    # a reader following the manifest: a whole night of one run, the old one until the commit
    assert manifest_view(out) == ({"rows": 3, "audit": 3} if step == "commit" else {"rows": 4, "audit": 4})
    if step == "commit":  # not decided: the old night is still whole everywhere
        assert view == {"rows": 3, "audit": 3}
    assert build(new, out).returncode == 0  # recovers, then rebuilds
    assert reader_view(out) == {"rows": 4, "audit": 4} == manifest_view(out)
    assert part_bytes(out / "rows" / f"ds={DS}") == clean_rows  # byte-identical rows
    manifest = json.loads((out / "_published" / f"ds={DS}.json").read_text())
    audit_runs = set(pq.read_table(out / "audit" / f"ds={DS}").column("run_id").to_pylist())
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        wh_runs = {r for (r,) in con.execute("SELECT DISTINCT run_id FROM audit WHERE ds = ?", [DS]).fetchall()}
        last = con.execute("SELECT run_id FROM runs ORDER BY published_at DESC LIMIT 1").fetchone()[0]
    assert audit_runs == wh_runs == {manifest["run_id"]} == {last}
    for kind in KINDS:  # nothing but the committed files in the partition
        assert sorted(f"{kind}/ds={DS}/{p.name}" for p in (out / kind / f"ds={DS}").iterdir()) == sorted(
            manifest["partitions"][kind]
        )


def test_recovery_alone_finishes_an_interrupted_publish(tmp_path, inputs):
    """A kill after the commit leaves the partitions of the previous run; the next load or
    publish of the night brings them to the manifest first, and `report` says it waits."""
    old, new, _ = inputs
    out = tmp_path / "out"
    assert build(old, out).returncode == 0
    assert build(new, out, env={"REASSEMBLER_TEST_KILL_AT": "rows_in"}).returncode == -signal.SIGKILL
    assert reader_view(out) == {"rows": 4, "audit": 3}  # rows in; audit not yet
    assert manifest_view(out) == {"rows": 4, "audit": 4}
    assert "the publish of ds=2026-11-28 was interrupted" in cli("report", "--output", out).stdout
    assert cli("build", "--input", old, "--output", out, "--ds", DS, "--max-mask-rate", "0").returncode == 1
    assert reader_view(out) == {"rows": 4, "audit": 4}  # finished before that build refused its own night


def _wait_for_holder(out: Path, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = json.loads((out / "_lock").read_text() or "{}")
            if info:
                return info
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError("the first build never took the lock")


def test_two_builds_at_once_the_second_fails_and_touches_nothing(tmp_path, inputs):
    old, new, clean_rows = inputs
    out, flag = tmp_path / "out", tmp_path / "pause"
    flag.touch()
    first = subprocess.Popen(
        [sys.executable, "-m", "reassembler.cli", "build", "--input", str(new), "--output", str(out), "--ds", DS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "REASSEMBLER_TEST_PAUSE_AT": "loaded", "REASSEMBLER_TEST_PAUSE_FILE": str(flag)},
    )
    try:
        holder = _wait_for_holder(out)
        second = build(old, out)
        assert second.returncode == 3
        err = one_line_error(second)
        assert f"pid {first.pid}" in err and f"ds={DS}" in err and "since" in err and holder["host"] in err
    finally:
        flag.unlink()
    assert first.wait(timeout=120) == 0, first.stderr.read()
    assert part_bytes(out / "rows" / f"ds={DS}") == clean_rows
    staggered = build(old, out)  # once the first is done, the next one runs
    assert staggered.returncode == 0 and reader_view(out) == {"rows": 3, "audit": 3}


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, inputs):
    old, _, _ = inputs
    out = tmp_path / "out"
    out.mkdir()
    (out / "_lock").write_text(json.dumps({"pid": 999999, "host": "here", "ds": DS, "since": "yesterday"}))
    assert build(old, out).returncode == 0


def test_a_reader_of_the_warehouse_makes_the_job_wait_not_fail(tmp_path, inputs):
    old, _, _ = inputs
    out = tmp_path / "out"
    assert build(old, out).returncode == 0
    analyst = duckdb.connect(str(out / "warehouse.duckdb"), read_only=True)
    res = build(old, out, "--lock-wait", "1")
    assert res.returncode == 3
    assert "locked by another DuckDB client" in one_line_error(res)
    threading.Timer(2.0, analyst.close).start()  # the analyst closes after 2 s; the job waited
    assert build(old, out, "--lock-wait", "60").returncode == 0


def test_report_and_explain_never_write_to_the_output(tmp_path, inputs):
    old, _, _ = inputs
    out = tmp_path / "out"
    assert build(old, out).returncode == 0
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert cli("report", "--output", out).returncode == 0
    assert cli("explain", "--output", out, "--ds", DS, "a_g0").returncode == 0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    # analysts' way around the warehouse: the Parquet partitions and the table snapshots
    with duckdb.connect() as con:
        assert (
            con.execute(
                f"SELECT count(*) FROM read_parquet('{out}/audit/ds=*/*.parquet', hive_partitioning = true)"
            ).fetchone()[0]
            == 3
        )
        assert con.execute(f"SELECT count(*) FROM '{out}/tables/runs.parquet'").fetchone()[0] == 1


# ------------------------------------------------------------------ input nobody may skip


def _partition(inp: Path, kind: str) -> Path:
    return inp / kind / f"ds={DS}"


def test_a_dangling_rollouts_link_stops_the_night_and_keeps_the_partition(tmp_path):
    inp, out = night_input(tmp_path / "n"), tmp_path / "out"
    assert build(inp, out).returncode == 0
    before = part_bytes(out / "rows" / f"ds={DS}")
    (_partition(inp, "rollouts") / "more.jsonl").symlink_to(tmp_path / "gone.jsonl")
    res = build(inp, out)
    assert res.returncode == 2 and "more.jsonl: dangling symbolic link" in one_line_error(res)
    assert part_bytes(out / "rows" / f"ds={DS}") == before


def test_an_empty_rollouts_partition_is_refused_unless_asked_for(tmp_path):
    inp, out = night_input(tmp_path / "n"), tmp_path / "out"
    assert build(inp, out).returncode == 0
    for f in _partition(inp, "rollouts").iterdir():
        f.unlink()
    res = build(inp, out)
    assert res.returncode == 2 and "no rollout could be read" in one_line_error(res)
    assert reader_view(out) == {"rows": 3, "audit": 3}
    assert build(inp, out, "--allow-empty").returncode == 0
    assert reader_view(out) == {"rows": 0, "audit": 0}


def test_a_dangling_token_file_link_stops_the_night(tmp_path):
    inp = night_input(tmp_path / "n")
    (_partition(inp, "tokens") / "more.parquet").symlink_to(tmp_path / "gone.parquet")
    res = build(inp, tmp_path / "out")
    assert res.returncode == 2 and "more.parquet: dangling symbolic link" in one_line_error(res)


def test_symlinked_ledger_folders_are_read_and_loops_refused(tmp_path):
    inp, out = night_input(tmp_path / "n"), tmp_path / "out"
    ledger = _partition(inp, "ledger")
    elsewhere = tmp_path / "server-a"
    elsewhere.mkdir()
    (ledger / "ledger.jsonl").rename(elsewhere / "ledger.jsonl")
    (ledger / "server-a").symlink_to(elsewhere, target_is_directory=True)
    res = build(inp, out)
    assert res.returncode == 0 and "3 read = 3 loaded + 0 rejected" in res.stdout
    assert reader_view(out) == {"rows": 3, "audit": 3}
    (elsewhere / "loop").symlink_to(ledger, target_is_directory=True)
    res = build(inp, out)
    assert res.returncode == 2 and "symbolic link loop" in one_line_error(res)


def test_a_duplicate_key_is_a_reject_and_the_genuine_rollout_is_kept(tmp_path):
    inp, out = night_input(tmp_path / "n"), tmp_path / "out"
    path = _partition(inp, "rollouts") / "rollouts.jsonl"
    lines = path.read_text().splitlines()
    forged = lines[0].replace('"rollout_id": "a_g0"', '"rollout_id": "x_g9", "rollout_id": "a_g0"', 1)
    path.write_text("\n".join([forged] + lines) + "\n")
    res = build(inp, out)
    assert res.returncode == 0 and "rollouts 4 read = 3 loaded + 1 rejected" in res.stdout
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        [(line, error)] = con.execute("SELECT line, error FROM rejects WHERE source = 'rollouts'").fetchall()
        rollouts = con.execute("SELECT rollout_id, source_line FROM rollouts ORDER BY 2").fetchall()
    assert line == 1 and "duplicate key 'rollout_id'" in error
    assert rollouts == [("a_g0", 2), ("a_g1", 3), ("b_g0", 4)]


def test_a_rejected_line_of_a_lineage_file_masks_its_rollout(tmp_path):
    n = Night(tmp_path / "n")
    ledger, _ = worked_example(n, "a_g0")
    worked_example(n, "a_g1", compaction=False)
    inp = n.write()
    folder = _partition(inp, "ledger")
    (folder / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in n.ledger if r["rollout_id"] == "a_g1"))
    rows = [dict(r) for r in ledger]
    for r in rows:
        del r["rollout_id"]
    rows[2]["prev_len"] = "zero"  # wrong type: a reject row that names no rollout itself
    (folder / "a_g0.lineage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = build(inp, tmp_path / "out")
    assert res.returncode == 0
    audit = {a["rollout_id"]: a for a in pq.read_table(tmp_path / "out" / "audit" / f"ds={DS}").to_pylist()}
    assert (audit["a_g0"]["reason"], audit["a_g1"]["status"]) == ("invalid_record", "ok")
    assert "a_g0.lineage.jsonl:3" in audit["a_g0"]["detail"]


def test_a_huge_line_is_a_reject_row_with_its_size(tmp_path):
    inp, out = night_input(tmp_path / "n"), tmp_path / "out"
    with open(_partition(inp, "rollouts") / "rollouts.jsonl", "a") as fh:
        fh.write(
            json.dumps(
                {
                    "rollout_id": "huge_g0",
                    "group_id": "huge",
                    "slot": 0,
                    "reward": 1.0,
                    "output": [{"type": "message", "content": "x" * 3000}],
                }
            )
            + "\n"
        )
    res = build(inp, out, "--max-line-bytes", "2000")
    assert res.returncode == 0 and "rollouts 4 read = 3 loaded + 1 rejected" in res.stdout
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        [(error,)] = con.execute("SELECT error FROM rejects").fetchall()
    assert error.startswith("line is 3,") and "over the 2,000-byte limit" in error


# ------------------------------------------------------------------ one line, one exit code


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--memory-limit", "banana"], 2, "'banana' is not a size"),
        (["--memory-limit", "4MB"], 4, "out of memory at memory_limit 4MB"),
        (["--temp-directory", "{file}"], 2, "is a file, not a folder"),
    ],
)
def test_exit_codes(tmp_path, inputs, args, code, message):
    old, _, _ = inputs
    (tmp_path / "a-file").touch()
    res = build(old, tmp_path / "out", *[a.format(file=tmp_path / "a-file") for a in args])
    assert res.returncode == code and "Traceback" not in res.stderr
    assert message in res.stderr
    if code != 2:
        one_line_error(res)
    assert not (tmp_path / "out" / "rows").exists()


def test_a_broken_pipe_is_no_traceback(tmp_path, inputs):
    old, _, _ = inputs
    res = subprocess.run(
        f"{sys.executable} -m reassembler.cli build --input {old} --output {tmp_path / 'out'} --ds {DS} | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in res.stderr and res.stdout == "built ds=2"
    assert reader_view(tmp_path / "out") == {"rows": 3, "audit": 3}


def test_a_full_disk_is_exit_4_naming_the_path(tmp_path, inputs, monkeypatch, capsys):
    import errno

    from reassembler.cli import main
    from reassembler.publish import protocol as publish

    old, _, _ = inputs

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "tables"))

    monkeypatch.setattr(publish, "export_tables", full)
    assert main(["build", "--input", str(old), "--output", str(tmp_path / "out"), "--ds", DS]) == 4
    err = capsys.readouterr().err.strip()
    assert err.startswith("reassembler: error: no space left on device writing ") and "tables" in err


def test_a_read_only_output_serves_report_and_explain_and_refuses_a_build(tmp_path, inputs):
    old, _, _ = inputs
    src, ro = tmp_path / "out", tmp_path / "ro"
    assert build(old, src).returncode == 0
    ro.mkdir()

    def unless_privileged(why: str) -> None:
        # CI runs as root, where mounts work: there (REASSEMBLER_REQUIRE_MOUNTS=1, set by .ci/run)
        # a missing privilege fails the test instead of skipping it
        if os.environ.get("REASSEMBLER_REQUIRE_MOUNTS") == "1":
            pytest.fail(f"{why}, but REASSEMBLER_REQUIRE_MOUNTS=1 says this machine gives them")
        pytest.skip(why)

    if subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True).returncode != 0:
        unless_privileged("bind mounts need privileges this machine does not give")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode != 0:
            unless_privileged("read-only remount not permitted here")
        assert cli("report", "--output", ro).returncode == 0
        assert cli("explain", "--output", ro, "--ds", DS, "a_g0").returncode == 0
        res = build(old, ro)
        assert res.returncode == 2 and "not writable" in one_line_error(res)
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


@pytest.mark.parametrize(
    "message",
    [
        "Out of Memory Error: failed to allocate data of size 32.0 KiB (3.6 MiB/3.8 MiB used)",
        # a checkpoint that ran out of memory (a one-process build checkpoints beside the shard)
        "FATAL Error: Failed to create checkpoint because of error: could not allocate block of size 256.0 KiB "
        "(3.6 MiB/3.8 MiB used)",
        "FATAL Error: Failed to create checkpoint because of error: failed to pin block of size 256.0 KiB "
        "(3.7 MiB/3.8 MiB used)",
    ],
)
def test_duckdb_out_of_memory_however_worded_is_exit_4(message):
    error = classify(duckdb.Error(message), DuckDBSettings(memory_limit="4MB"))
    assert isinstance(error, ResourceExhausted) and error.exit_code == 4
    assert str(error).startswith("out of memory at memory_limit 4MB (")


def test_other_duckdb_errors_are_not_out_of_memory():
    assert classify(duckdb.Error("Binder Error: column x (1 used) not found")) is None


def test_the_gate_judges_a_published_night_of_no_rollout(tmp_path):
    inp, out = night_input(tmp_path / "n"), tmp_path / "out"
    for f in _partition(inp, "rollouts").iterdir():
        f.unlink()
    assert build(inp, out, "--allow-empty").returncode == 0
    res = cli("gate", "--output", out, "--ds", DS)  # the ledger rows of no rollout are rejected lines
    assert res.returncode == 5 and res.stderr.strip().endswith(": 15 rejected input lines > 0"), res.stderr
    res = cli("gate", "--output", out, "--ds", DS, "--max-rejects", "15", "--max-mask-rate", "0")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines() == [  # every check: value against limit, margin, status
        "ok     mask_rate                             0.000 against limit   0.000, margin 0.000",
        "warn   rejects                                  15 against limit      15, margin 0",
        f"quality gate passed for ds={DS} (1 warning)",
    ]
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT verdict FROM quality WHERE ds = ?", [DS]).fetchall() == [("ok",)]  # the last
    report = cli("report", "--output", out)
    assert report.returncode == 0 and f"{DS}  0 " in report.stdout and "mask reasons" not in report.stdout
    assert cli("gate", "--output", out, "--ds", "2026-11-27").returncode == 2  # a night never published


@pytest.mark.parametrize(
    "ds, message",
    [
        ("2026-11-31", "ds 2026-11-31 is not a date: day is out of range for month"),
        ("2026-13-45", "ds 2026-13-45 is not a date: month must be in 1..12"),
        ("2026-1-05", "ds must be a date written YYYY-MM-DD, got '2026-1-05'"),
        ("２０２６-11-05", "ds must be a date written YYYY-MM-DD, got '２０２６-11-05'"),
    ],
)
def test_an_impossible_night_is_refused_with_what_is_wrong(tmp_path, ds, message):
    res = cli("build", "--input", tmp_path, "--output", tmp_path / "out", "--ds", ds)
    assert res.returncode == 2 and f"argument --ds: {message} (see `reassembler build --help`)" in res.stderr


def test_gyms_sidecar_files_are_read_as_contract_v3_says(tmp_path):
    """NeMo Gym writes <stem>_failures.jsonl, <stem>_materialized_inputs.jsonl and
    <stem>_aggregate_metrics.json beside its results. A terminal failure of a sample with no
    result line is a given-up sample: one audit row, masked rollout_failed. The other two are
    counted and named, not read."""
    inp, out = night_input(tmp_path / "n"), tmp_path / "out"
    part = _partition(inp, "rollouts")
    failed = {"_ng_task_index": 9, "_ng_rollout_index": 0, "_ng_failure_class": "timeout", "_ng_failure_terminal": True}
    (part / "rollouts_failures.jsonl").write_text(json.dumps(failed) + "\n")
    (part / "rollouts_materialized_inputs.jsonl").write_text(json.dumps({"_ng_task_index": 9}) + "\n")
    (part / "rollouts_aggregate_metrics.json").write_text(json.dumps({"reward": 0.5}))
    res = build(inp, out)
    assert res.returncode == 0, res.stderr
    assert "rollouts 3 read = 3 loaded + 0 rejected" in res.stdout
    assert "failures 1 read = 1 failed attempts + 0 rejected; 1 given-up samples" in res.stdout
    assert (
        "not read 2 NeMo Gym sidecar files, not results: rollouts_aggregate_metrics.json, "
        "rollouts_materialized_inputs.jsonl" in res.stdout
    )
    assert reader_view(out) == {"rows": 3, "audit": 4}
    audit = {a["rollout_id"]: a for a in pq.read_table(out / "audit" / f"ds={DS}").to_pylist()}
    given_up = audit["9-0"]
    assert (given_up["group_id"], given_up["slot"], given_up["status"], given_up["reason"]) == (
        "9",
        0,
        "masked",
        "rollout_failed",
    )
    assert (given_up["detail"], given_up["failed_call_id"], given_up["reward"], given_up["advantage"]) == (
        "timeout",
        None,
        None,
        None,
    )


def _descendants(pid: int) -> set[int]:
    """The live processes below `pid` (zombies, which the system reaps, not counted)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.add(pid)
        except OSError:
            pass
    return alive


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("sig", "after"), [(signal.SIGKILL, 0.0), (signal.SIGTERM, 0.0), (signal.SIGKILL, 1.5)])
def test_a_killed_multi_worker_build_leaves_no_process_and_its_rerun_succeeds(tmp_path, sig, after):
    """kill -9 (or SIGTERM) of a `--workers 2` build while its worker processes run (the load
    parts at once, later the merge or the shards): every worker ends with it, the output's
    lock is free, and the same command run again builds the night."""
    from reassembler.producer.synth import SynthConfig, synth_night

    inp, out = tmp_path / "in", tmp_path / "out"
    synth_night(inp, DS, SynthConfig(rollouts=160, seed=5, fault_rate=0.1))
    cmd = [sys.executable, "-m", "reassembler.cli", "build", "--input", str(inp), "--output", str(out), "--ds", DS]
    cmd += ["--workers", "2", "--shards", "2", "--load-parts", "2", "--merge-buckets", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    workers: set[int] = set()
    while not workers and proc.poll() is None and time.monotonic() < deadline:
        workers = _descendants(proc.pid)
        time.sleep(0.02)
    assert workers, f"the build started no worker (exit {proc.poll()})"
    time.sleep(after)
    workers |= _descendants(proc.pid)
    proc.send_signal(sig)
    proc.wait(timeout=30)
    proc.stderr.close()
    deadline = time.monotonic() + 10
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(workers) == set(), "workers outlived the killed build"
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr
    assert "160 rollouts" in res.stdout
