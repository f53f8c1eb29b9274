"""Publishing: whole partitions or nothing, identical reruns, audit checks that refuse."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from nights import DS, worked_example
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
    worked_example(night, "b_g0", compaction=False, reward=0.3, failure_reason="timeout")
    return night.write()


def test_rerun_of_the_same_night_publishes_identical_rows(tmp_path, two_groups):
    out = tmp_path / "out"
    first = build_night(two_groups, out, DS)
    rows1 = _files(out / "rows" / f"ds={DS}")
    second = build_night(two_groups, out, DS, Settings(shards=2))
    rows2 = _files(out / "rows" / f"ds={DS}")
    assert first.run_id != second.run_id
    t1 = pq.read_table(out / "rows" / f"ds={DS}").to_pylist()
    assert len(t1) == 3 and set(rows1) == {"part-00000.parquet"}
    assert set(rows2) == {"part-00000.parquet", "part-00001.parquet"}  # nothing but the partition's files
    manifest = json.loads((out / "_published" / f"ds={DS}.json").read_text())
    assert manifest["run_id"] == second.run_id and manifest["n_rows"] == 3
    build_night(two_groups, out, DS)
    assert _parts(_files(out / "rows" / f"ds={DS}")) == _parts(rows1)  # byte for byte
    assert not (out / "_staging" / DS).exists() or not any((out / "_staging" / DS).iterdir())


def test_a_crash_in_a_shard_leaves_the_previous_partition(tmp_path, two_groups, monkeypatch):
    out = tmp_path / "out"
    build_night(two_groups, out, DS)
    before = {k: _files(out / k / f"ds={DS}") for k in ("rows", "audit")}

    def boom(*a, **k):
        raise RuntimeError("worker killed")

    monkeypatch.setattr(shard_module, "rows_table", boom)
    with pytest.raises(RuntimeError):
        build_night(two_groups, out, DS)
    assert {k: _files(out / k / f"ds={DS}") for k in ("rows", "audit")} == before


def test_a_crash_between_renames_leaves_nothing_half_and_the_next_run_recovers(tmp_path, two_groups, monkeypatch):
    out = tmp_path / "out"
    build_night(two_groups, out, DS)
    real_rename = os.rename
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 3:  # journal written, old partition moved aside, new one not yet in place
            raise OSError("disk went away")
        return real_rename(src, dst)

    monkeypatch.setattr(publish_module.os, "rename", flaky)
    with pytest.raises(OSError):
        build_night(two_groups, out, DS)
    assert not (out / "rows" / f"ds={DS}").exists()  # nothing, rather than a mix
    assert sorted(p.name for p in (out / "rows").iterdir()) == []  # and nothing beside it
    assert (out / "_publish" / f"ds={DS}.json").exists()  # the journal says what to finish
    monkeypatch.setattr(publish_module.os, "rename", real_rename)
    summary = build_night(two_groups, out, DS)
    assert summary.numbers.n_rows == 3
    assert not (out / "_publish" / f"ds={DS}.json").exists()  # the journal is gone
    assert (not (out / "_trash").exists()) or (not any((out / "_trash").iterdir()))  # and the trash is empty


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
    from steps import load, shard

    from reassembler.publish.protocol import staging_dir

    out = tmp_path / "out"
    load(two_groups, out, DS, run_id="r")
    shard(out, DS, 0, "r")
    return out, staging_dir(out, DS, "r")


def _rewrite(folder, edit):
    import pyarrow as pa

    [path] = sorted(folder.glob("part-*.parquet"))
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
    _rewrite(staging / kind, edit)
    with pytest.raises(AuditCheckFailed, match=f"night {DS} not published: .*{named}"):
        _verify(out, staging)
    assert not (out / "rows").exists()


def test_the_mask_rate_limit_is_exclusive(tmp_path, two_groups):
    out, staging = _staged(tmp_path, two_groups)
    assert _verify(out, staging, max_mask_rate=1 / 3).masked == 1  # at the limit: published
    with pytest.raises(AuditCheckFailed, match=r"mask rate 0.333 \(1/3\) above the limit 0.330"):
        _verify(out, staging, max_mask_rate=0.33)
