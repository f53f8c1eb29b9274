"""Publishing: one commit per night (the manifest), whole partitions, identical reruns,
audit checks that refuse."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import Clock
from nights import DS, partition_parts, worked_example
from reassembler.build import build_night
from reassembler.publish import protocol as publish_module
from reassembler.publish.protocol import AuditCheckFailed
from reassembler.settings import Settings
from reassembler.verify import shard as shard_module


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _parts(files):
    return {k: v for k, v in files.items() if k.startswith("part-")}


@pytest.fixture
def two_groups(night):
    worked_example(night, "a_g0", compaction=True, reward=1.0)
    worked_example(night, "a_g1", compaction=False, reward=0.0)
    worked_example(night, "b_g0", compaction=False, reward=None, failure_reason="timeout")
    return night.write()


def _manifest(out):
    return json.loads((out / "_published" / f"ds={DS}.json").read_text())


def test_rerun_of_the_same_night_publishes_identical_rows(tmp_path, two_groups):
    out = tmp_path / "out"
    first = build_night(two_groups, out, DS)
    rows1 = partition_parts(out / "rows" / f"ds={DS}")
    second = build_night(two_groups, out, DS, Settings(shards=2))
    assert first.run_id != second.run_id
    t1 = pq.read_table(out / "rows" / f"ds={DS}").to_pylist()
    assert len(t1) == 3 and set(rows1) == {"00000.parquet"}
    manifest = _manifest(out)
    assert manifest["run_id"] == second.run_id and manifest["numbers"]["n_rows"] == 3
    for kind in ("rows", "audit"):  # the partition holds exactly the files the manifest names, and nothing else
        listed = sorted(f"{kind}/ds={DS}/{p.name}" for p in (out / kind / f"ds={DS}").iterdir())
        assert (
            listed
            == manifest["partitions"][kind]
            == [f"{kind}/ds={DS}/part-{second.run_id}-{k:05d}.parquet" for k in (0, 1)]
        )
        for key, part in zip(manifest["files"][kind], manifest["partitions"][kind]):  # the same bytes
            assert (out / key).read_bytes() == (out / part).read_bytes()
    # the replaced run's files stay readable for the grace period, under its own folder
    assert (out / first_key(first.run_id)).exists()
    third = build_night(two_groups, out, DS)
    assert partition_parts(out / "rows" / f"ds={DS}") == rows1  # byte for byte
    # every run replaced within the grace period keeps its files (the first one too: replaced
    # by the second less than the grace period ago)
    runs = sorted(p.name for p in (out / "_runs" / f"ds={DS}").iterdir())
    assert runs == sorted([first.run_id, second.run_id, third.run_id])
    assert [r["run_id"] for r in _manifest(out)["superseded"]] == [second.run_id, first.run_id]


def first_key(run_id: str) -> str:
    return f"_runs/ds={DS}/{run_id}/rows/part-00000.parquet"


@pytest.fixture
def clock(monkeypatch):
    """The publish protocol's clock (publish/protocol.py `_clock`), from now on moved by the test."""
    clock = Clock(time.time())
    monkeypatch.setattr(publish_module, "_clock", clock)
    return clock


GRACE = publish_module.GRACE_SECONDS


def _runs(out) -> set[str]:
    return {p.name for p in (out / "_runs" / f"ds={DS}").iterdir()}


def test_a_superseded_runs_files_stay_for_the_grace_period_from_the_commit_that_replaced_it(
    tmp_path, two_groups, clock
):
    """The grace period starts when a run is superseded, not when it was committed, and ends
    GRACE_SECONDS later: the first build after that deletes its folder."""
    out = tmp_path / "out"
    first = build_night(two_groups, out, DS)
    clock.now += GRACE - 60  # the first run has been the night for almost a grace period
    second = build_night(two_groups, out, DS)  # supersedes it now
    clock.now += GRACE - 60  # superseded a minute less than the grace period ago
    third = build_night(two_groups, out, DS)
    assert _runs(out) == {first.run_id, second.run_id, third.run_id}
    assert [r["run_id"] for r in _manifest(out)["superseded"]] == [second.run_id, first.run_id]
    clock.now += 120  # the first's grace is over, the second's (superseded 2 minutes ago) is not
    fourth = build_night(two_groups, out, DS)
    assert _runs(out) == {second.run_id, third.run_id, fourth.run_id}
    assert [r["run_id"] for r in _manifest(out)["superseded"]] == [third.run_id, second.run_id]
    for key in _manifest(out)["files"]["rows"]:
        assert (out / key).exists()


def _replaced(out) -> dict[str, set[str]]:
    """What `_tmp/publish/` holds: each replaced partition folder's run (from its files)."""
    folder = out / "_tmp" / "publish"
    return {p.name: {n.rsplit("-", 1)[0][len("part-") :] for n in os.listdir(p)} for p in folder.iterdir()}


def test_a_replaced_local_partition_folder_is_removed_once_its_grace_period_is_over(tmp_path, two_groups, clock):
    """A local partition is swapped whole; the folder it replaced stays under _tmp/publish/
    for the grace period from the swap (a reader that opened it keeps its files), however old
    its files are, and the first build after that removes it."""
    out = tmp_path / "out"
    first = build_night(two_groups, out, DS)
    clock.now += GRACE - 60
    build_night(two_groups, out, DS)  # rows/ and audit/ of the first run are replaced now
    assert sorted(_replaced(out).values(), key=str) == [{first.run_id}, {first.run_id}]
    clock.now += GRACE - 60  # replaced a minute less than the grace period ago
    build_night(two_groups, out, DS)
    assert sum(runs == {first.run_id} for runs in _replaced(out).values()) == 2
    clock.now += 120
    build_night(two_groups, out, DS)
    assert not any(runs == {first.run_id} for runs in _replaced(out).values())
    assert len(_replaced(out)) == 4  # the second's and the third's, replaced within the grace period


def test_airflow_run_ids_name_path_safe_folders_for_every_key_of_the_manifest(tmp_path, two_groups, clock):
    """Airflow's run ids hold ':' and '+': every key the manifest names is path-safe, every
    one is there, and the run's folder is kept (and collected) under that name."""
    out = tmp_path / "out"
    ids = ["manual__2026-11-28T00:00:00+00:00", "scheduled__2026-11-29T02:00:00+00:00", "asset__2026-11-29T03:00:00"]
    safe = [publish_module.path_safe(r) for r in ids]
    assert safe[0] == "manual__2026-11-28T00_00_00_00_00"
    for k, run_id in enumerate(ids):
        build_night(two_groups, out, DS, run_id=run_id)
        manifest = _manifest(out)
        assert manifest["run_id"] == run_id  # the run id itself is recorded as it is
        keys = [k for kind in ("rows", "audit") for k in manifest["files"][kind] + manifest["partitions"][kind]]
        assert keys and all(re.fullmatch(r"[A-Za-z0-9_./=-]+", key) for key in keys), keys
        assert all((out / key).is_file() for key in keys)
        assert all(f"/{safe[k]}/" in key for key in manifest["files"]["rows"])
        assert all(f"part-{safe[k]}-" in key for key in manifest["partitions"]["rows"])
        assert _runs(out) == set(safe[: k + 1])  # superseded ones kept within the grace period
        clock.now += 60
    clock.now += GRACE
    build_night(two_groups, out, DS, run_id=ids[2])  # the night again under the same run: a rerun
    assert _runs(out) == {safe[2]}


def test_a_crash_in_a_shard_leaves_the_previous_partition(tmp_path, two_groups, monkeypatch):
    out = tmp_path / "out"
    build_night(two_groups, out, DS)
    before = {k: _files(out / k / f"ds={DS}") for k in ("rows", "audit")}

    def boom(*a, **k):
        raise RuntimeError("worker killed")

    monkeypatch.setattr(shard_module, "row_tables", boom)
    with pytest.raises(RuntimeError):
        build_night(two_groups, out, DS)
    assert {k: _files(out / k / f"ds={DS}") for k in ("rows", "audit")} == before


def test_a_failure_after_the_commit_leaves_whole_partitions_and_the_next_run_finishes_it(
    tmp_path, two_groups, monkeypatch
):
    out = tmp_path / "out"
    first = build_night(two_groups, out, DS)

    def broken(a, b):
        raise OSError("disk went away")

    monkeypatch.setattr(publish_module, "_exchange", broken)
    with pytest.raises(OSError, match="disk went away"):
        build_night(two_groups, out, DS)
    committed = _manifest(out)["run_id"]
    assert committed != first.run_id  # decided: the manifest names the new run
    # the partitions are still the first run's, whole (never absent, never a mix)
    for kind in ("rows", "audit"):
        assert {p.name for p in (out / kind / f"ds={DS}").iterdir()} == {f"part-{first.run_id}-00000.parquet"}
    # a reader that follows the manifest reads the new run's files, which are all there
    for key in _manifest(out)["files"]["rows"] + _manifest(out)["files"]["audit"]:
        assert pq.read_table(out / key).num_rows > 0
    monkeypatch.undo()
    from reassembler.publish.protocol import recover
    from reassembler.warehouse import connect

    with connect(out) as con:
        assert recover(con, out) == [DS]  # what every load and publish runs first
        assert recover(con, out) == []  # and then there is nothing left to do
    for kind in ("rows", "audit"):
        assert {p.name for p in (out / kind / f"ds={DS}").iterdir()} == {f"part-{committed}-00000.parquet"}
    assert set(pq.read_table(out / "audit" / f"ds={DS}").column("run_id").to_pylist()) == {committed}


def test_mask_rate_over_the_limit_publishes_nothing_and_says_why(tmp_path, two_groups):
    out = tmp_path / "out"
    with pytest.raises(
        AuditCheckFailed, match=r"mask rate 0.333 \(1/3\) above the limit 0.100; top reasons: rollout_failed 1"
    ):
        build_night(two_groups, out, DS, Settings(max_mask_rate=0.1))
    assert not (out / "rows").exists() and not (out / "audit").exists()


# ---------------------------------------------------------------- the audit invariants


def _staged(tmp_path, two_groups):
    """The night loaded and staged by one shard, not published: (output, staging folder)."""
    from reassembler.publish.protocol import staging_dir
    from steps import load, shard

    out = tmp_path / "out"
    load(two_groups, out, DS, run_id="r")
    shard(out, DS, 0, "r")
    return out, staging_dir(out, DS, "r")


def _rewrite(folder, edit):
    import pyarrow as pa

    [path] = sorted(Path(folder).glob("part-*.parquet"))
    rows = pq.read_table(path, partitioning=None).to_pylist()
    schema = pq.read_schema(path)
    pq.write_table(pa.Table.from_pylist(edit(rows), schema=schema), path)


def _verify(out, staging, **kw):
    from reassembler.publish.protocol import verify_staged
    from reassembler.warehouse import connect

    with connect(out, read_only=True) as con:
        return verify_staged(con, staging, DS, run_id="r", **kw)


INVARIANTS = {
    # each broken on its own, named in the message (CONTRACT.md 3.4: nothing is dropped silently)
    "an audit row lost": (
        "audit",
        lambda rows: rows[1:],
        "rollouts in 3 != audit rows 2",
    ),
    "a rollout audited twice": (
        "audit",
        lambda rows: rows[:2] + [rows[0]],
        "audit rows 3 but 2 distinct rollouts",
    ),
    "an ok rollout without rows": (
        "rows",
        lambda rows: [r for r in rows if r["rollout_id"] != "a_g1"],
        "ok rollouts 2 != distinct rollouts in rows 1",
    ),
    "rows of a masked rollout": (
        "rows",
        lambda rows: rows + [dict(rows[0], rollout_id="b_g0", row_id="b_g0_s0")],
        "ok rollouts 2 != distinct rollouts in rows 3",
    ),
}


@pytest.mark.parametrize("case", list(INVARIANTS))
def test_each_audit_invariant_refuses_the_night_and_names_itself(tmp_path, two_groups, case):
    out, staging = _staged(tmp_path, two_groups)
    assert _verify(out, staging).audit_rows == 3  # whole, it passes
    kind, edit, named = INVARIANTS[case]
    _rewrite(Path(staging) / kind, edit)
    with pytest.raises(AuditCheckFailed, match=f"night {DS} not published: .*{named}"):
        _verify(out, staging)
    assert not (out / "rows").exists()


def test_the_mask_rate_limit_is_exclusive(tmp_path, two_groups):
    out, staging = _staged(tmp_path, two_groups)
    assert _verify(out, staging, max_mask_rate=1 / 3).masked == 1  # at the limit: published
    with pytest.raises(AuditCheckFailed, match=r"mask rate 0.333 \(1/3\) above the limit 0.330"):
        _verify(out, staging, max_mask_rate=0.33)


def test_a_local_partition_is_one_whole_run_at_every_instant(tmp_path, two_groups, monkeypatch):
    """The night published again and again: after every change a publish makes to the file
    system (each rename, link, unlink, removal and swap), rows/ds=<ds>/ is there and holds
    all the files of exactly one run. Looked at after each change, not by a racing reader."""
    out = tmp_path / "out"
    build_night(two_groups, out, DS)
    part = out / "rows" / f"ds={DS}"
    seen, problems, changes = {}, [], []

    def look(what: str) -> None:
        changes.append(what)
        try:
            names = os.listdir(part)
        except FileNotFoundError:
            problems.append(f"the partition was absent after {what}")
            return
        runs = {n.rsplit("-", 1)[0] for n in names}
        if len(runs) != 1:
            problems.append(f"files of {len(runs)} runs after {what}: {names}")
            return
        seen.setdefault(runs.pop(), set()).add(len(names))

    def watched(what: str, fn):
        def change(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            finally:
                look(what)

        return change

    for name in ("rename", "replace", "link", "unlink", "remove", "rmdir", "makedirs", "symlink"):
        monkeypatch.setattr(os, name, watched(name, getattr(os, name)))
    monkeypatch.setattr(publish_module, "_exchange", watched("exchange", publish_module._exchange))
    for shards in (2, 3, 2, 3):
        build_night(two_groups, out, DS, Settings(shards=shards))
    monkeypatch.undo()
    assert not problems, problems[:3]
    assert changes.count("exchange") == 8  # two partitions, four publishes: each looked at
    assert len(seen) == 5 and all(len(counts) == 1 for counts in seen.values()), seen


def test_an_output_of_the_release_before_is_built_over(tmp_path, two_groups):
    """The release before published by renaming whole folders and wrote a manifest of its
    numbers only, a journal while publishing, staging and trash folders: a build over such an
    output publishes the night with its manifest and removes that night's leftovers."""
    out = tmp_path / "out"
    build_night(two_groups, out, DS)
    for kind in ("rows", "audit"):  # the old layout: part-<shard>.parquet
        for p in (out / kind / f"ds={DS}").iterdir():
            p.rename(p.with_name("part-00000.parquet"))
    (out / "_published" / f"ds={DS}.json").write_text(json.dumps({"run_id": "old", "n_rows": 3}))
    for leftover in (out / "_staging" / DS / "old" / "rows", out / "_trash" / DS):
        leftover.mkdir(parents=True)
    (out / "_publish").mkdir()
    (out / "_publish" / f"ds={DS}.json").write_text("{}")
    new = build_night(two_groups, out, DS)
    assert [p.name for p in (out / "rows" / f"ds={DS}").iterdir()] == [f"part-{new.run_id}-00000.parquet"]
    assert _manifest(out)["run_id"] == new.run_id
    assert not (out / "_staging" / DS).exists() and not (out / "_trash" / DS).exists()
    assert not (out / "_publish" / f"ds={DS}.json").exists()
