"""A whole synthetic night with every fault kind, checked against the generator's record of
what it injected, under each mode and policy; sharding changes nothing."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest

from reassembler import wide_sort
from reassembler.build import build_night
from reassembler.load import shard_plan
from reassembler.producer.synth import FAULTS, SynthConfig, read_expected, synth_night
from reassembler.reasons import Reason
from reassembler.settings import Options, Settings

DS = "2026-11-28"
CFG = SynthConfig(
    rollouts=260,
    seed=11,
    fault_rate=0.5,
    min_calls=5,
    max_calls=12,
    prompt_tokens=(20, 60),
    observation_tokens=(3, 30),
    generated_tokens=(2, 25),
    token_rows_per_file=300,
)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    totals = synth_night(root / "input", DS, CFG)
    return root, totals, read_expected(root / "input", DS)


@pytest.mark.parametrize(
    "key, options",
    [("select", Options()), ("strict", Options(offchain="strict")), ("terminal", Options(mode="terminal"))],
)
def test_outcomes_match_what_was_injected(synth, key, options):
    root, totals, expected = synth
    out = root / f"out-{key}"
    summary = build_night(root / "input", out, DS, Settings(options=options))
    audit = {a["rollout_id"]: a for a in pq.read_table(out / "audit" / f"ds={DS}").to_pylist()}
    assert len(audit) == CFG.rollouts == summary.numbers.audit_rows
    checked = 0
    for rid, e in expected.items():
        want = e[key]
        if want is None:
            continue
        got = audit[rid]
        assert (got["status"], got["reason"]) == (want["status"], want["reason"]), (rid, e["fault"], got["detail"])
        if want["status"] == "ok":
            assert got["n_segments"] == want["n_segments"], rid
        checked += 1
    assert checked >= 0.6 * CFG.rollouts  # terminal mode: select-only faults are not predicted
    rows = pq.read_table(out / "rows" / f"ds={DS}").to_pylist()
    assert {r["rollout_id"] for r in rows} == {rid for rid, a in audit.items() if a["status"] == "ok"}
    keys = [(r["group_id"], r["slot"], r["segment_index"]) for r in rows]
    assert keys == sorted(keys)


def test_every_reason_code_is_produced_by_the_night(synth):
    root, totals, expected = synth
    assert set(totals["faults"]) == set(FAULTS)
    produced = set()
    for e in expected.values():
        for key in ("select", "strict", "terminal"):
            if e[key] and e[key]["reason"]:
                produced.add(e[key]["reason"])
    assert produced == {r.value for r in Reason}


def test_shards_change_nothing(synth):
    root, _, _ = synth
    one = build_night(root / "input", root / "one", DS, Settings(shards=1))
    three = build_night(root / "input", root / "three", DS, Settings(shards=3, workers=2))  # worker processes
    assert sorted((root / "three" / "rows" / f"ds={DS}").glob("part-*.parquet"))[2].name.endswith("-00002.parquet")
    t1 = pq.read_table(root / "one" / "rows" / f"ds={DS}").to_pylist()
    t3 = pq.read_table(root / "three" / "rows" / f"ds={DS}").to_pylist()
    assert t1 == t3 and one.numbers.n_rows == three.numbers.n_rows


def test_plans_sorted_in_spilled_buckets_of_one_rollout_change_nothing(synth, monkeypatch):
    """A shard's rollouts and calls are sorted a bucket at a time (runs of rollouts in output
    order, cut between rollouts whatever their group), spilled to files when held rows pass
    wide_sort.HELD_BYTES; buckets of one rollout each (every group cut into several), all
    spilled, give the same plans, rows and audit rows."""
    root, _, _ = synth
    plans: dict[str, list] = {}

    def read_plans(out) -> None:
        [staging] = (out / "_runs" / f"ds={DS}").iterdir()  # the run's folder: its plans stay until the next run
        for name in ("rollouts", "calls"):
            rows = pq.read_table(f"{shard_plan.plan_dir(staging, 0)}/{name}.parquet").to_pylist()
            for row in rows:  # a token file the build derived: in its own run's folder
                if (row.get("t_file") or "").startswith(str(staging)):
                    row["t_file"] = row["t_file"][len(str(staging)) :]
            plans.setdefault(name, []).append(rows)

    build_night(root / "input", root / "whole", DS)
    read_plans(root / "whole")
    spilled = []
    real = wide_sort.SortBuckets._spill
    monkeypatch.setattr(wide_sort.SortBuckets, "_spill", lambda self: spilled.append(len(self.held)) or real(self))
    monkeypatch.setattr(shard_plan, "BUCKET_ROWS", 1)
    monkeypatch.setattr(wide_sort, "HELD_BYTES", 0)
    build_night(root / "input", root / "bucketed", DS)
    read_plans(root / "bucketed")
    audit = pq.read_table(root / "whole" / "audit" / f"ds={DS}").to_pylist()
    groups = {r["group_id"] for r in audit}
    assert len(groups) > 1 and len(spilled) > 1  # batches split over buckets, then spilled
    assert max(spilled) >= len(audit)  # a sort bucket a rollout: every group cut into its rollouts
    for name in ("rollouts", "calls"):
        whole, bucketed = plans[name]
        assert whole == bucketed and whole
    for kind in ("rows", "audit"):
        whole, bucketed = (pq.read_table(root / b / kind / f"ds={DS}") for b in ("whole", "bucketed"))
        if "run_id" in whole.column_names:
            whole, bucketed = whole.drop_columns(["run_id"]), bucketed.drop_columns(["run_id"])
        assert whole.to_pylist() == bucketed.to_pylist() and whole.num_rows


def test_the_night_holds_every_producer_shape_as_written(synth):
    """Part of each night is written exactly as NeMo Gym 0.7.0 writes it (CONTRACT.md 2)."""
    import json

    root, _, expected = synth
    shapes = {}
    for e in expected.values():
        shapes.setdefault(e["shape"], []).append(e)
    assert set(shapes) == {"plain", "lineage", "gym", "local", "rebuilt", "verifiers", "envelope"}
    assert len({e["fault"] for e in shapes["envelope"]} - {None}) >= 6  # compaction-agent lines (CONTRACT.md 11)
    assert len({e["fault"] for e in shapes["gym"]} - {None}) >= 10  # faults reach Gym's shape too
    assert len({e["fault"] for e in shapes["local"]} - {None}) >= 8
    assert len({e["fault"] for e in shapes["verifiers"]} - {None}) >= 6  # verifiers traces (CONTRACT.md 10)
    traces = [json.loads(line) for line in open(root / "input" / "rollouts" / f"ds={DS}" / "traces.jsonl")]
    assert len(traces) == len(shapes["verifiers"]) and all(len(t["traces"]) == 1 for t in traces)
    assert any(
        x["type"] == "compaction" for t in traces for n in t["traces"][0]["nodes"] for x in n["semantic_parents"]
    )
    ledger = root / "input" / "ledger" / f"ds={DS}"
    gym_files = sorted(ledger.glob("*.lineage.jsonl"))  # the flat capture folder
    assert gym_files and all(f.with_name(f.name.replace(".lineage.jsonl", ".tokens.lock")).exists() for f in gym_files)
    assert list(ledger.glob("*.tokens.intents"))  # local-mode companions beside them: ignored
    local = [e["rollout_id"] for e in shapes["local"] if e["fault"] != "empty_ledger"]
    assert all(
        (ledger / f"{rid}.tokens.jsonl").exists() and (ledger / f"{rid}.tokens.state.json").exists() for rid in local
    )
    entries = [json.loads(line) for rid in local for line in open(ledger / f"{rid}.tokens.jsonl")]
    assert {e["prompt_is_delta"] for e in entries} == {True, False}  # both of Gym's representations
    assert {e["parent_resolution"] for e in entries} >= {"root", "resolved"}
    rows = [json.loads(line) for f in gym_files for line in open(f)]
    poison = [r for r in rows if r.get("failure_reason")]
    assert poison and all(set(r) == {"model_call_id", "failure_reason"} for r in poison)
    captured = [r for r in rows if not r.get("failure_reason")]
    assert all(
        "output_items" not in r and "rollout_id" not in r and r["fingerprint_version"] == 2 and "staging_digest" in r
        for r in captured
    )
    assert sum("schema_version" in r for r in captured) <= 2  # only the unsupported_version fault
    results = [json.loads(line) for line in open(root / "input" / "rollouts" / f"ds={DS}" / "rollouts-00000.jsonl")]
    gym_results = [r for r in results if "_ng_task_index" in r]
    assert len(gym_results) == sum(len(shapes[s]) for s in ("gym", "local", "rebuilt", "envelope"))
    rebuilt = [r for r in gym_results if "_ng_token_capture" in r]
    assert len(rebuilt) == len(shapes["rebuilt"]) and all(
        any("generation_token_ids" in item for item in r["response"]["output"]) for r in rebuilt
    )
    assert all("rollout_id" not in r and "group_id" not in r and "slot" not in r for r in gym_results)
    token_files = sorted((root / "input" / "tokens" / f"ds={DS}").glob("gym-staged-*.parquet"))
    assert any("schema_version" not in pq.read_schema(f).names for f in token_files)


@pytest.mark.parametrize(
    "options", [Options(), Options(leave_one_out=True), Options(std_normalize=False)], ids=["grpo", "loo", "nostd"]
)
def test_a_group_too_big_for_a_batch_streams_through_the_shard_and_changes_nothing(tmp_path, options, monkeypatch):
    """Groups of 48 rollouts (with faults) in batches of 40 calls: each group is cut between
    two of its rollouts, over several batches (open_group.py), its advantages taken over the
    whole group at its end. Rows and audit rows are those of batches that hold whole groups,
    in the same order, under each advantage option; the spill folders are gone."""
    import dataclasses

    from reassembler.verify import open_group

    root = tmp_path / "in"
    synth_night(root, DS, dataclasses.replace(CFG, rollouts=150, group_size=48))
    opened: list[str] = []
    real = open_group.OpenGroup.__init__

    def spy(self, group_id, scratch=None):
        opened.append(group_id)
        real(self, group_id, scratch)

    whole = build_night(root, tmp_path / "whole", DS, Settings(options=options))
    monkeypatch.setattr(open_group.OpenGroup, "__init__", spy)
    cut = build_night(root, tmp_path / "cut", DS, Settings(options=options, batch_rows=40, batch_tokens=10**9))
    assert len(opened) >= 3 and len(set(opened)) == len(opened)  # every group of 48 is cut
    assert (whole.numbers.n_rows, whole.numbers.ok_rollouts) == (cut.numbers.n_rows, cut.numbers.ok_rollouts)
    for kind in ("rows", "audit"):
        a = pq.read_table(tmp_path / "whole" / kind / f"ds={DS}")
        b = pq.read_table(tmp_path / "cut" / kind / f"ds={DS}")
        drop = [c for c in ("run_id",) if c in a.column_names]
        assert a.drop_columns(drop).equals(b.drop_columns(drop)), kind
    advantages = pq.read_table(tmp_path / "cut" / "audit" / f"ds={DS}").column("advantage").to_pylist()
    assert any(a not in (None, 0.0) for a in advantages)
    assert not list((tmp_path / "cut").rglob("reassembler-group-*"))


def test_a_shard_that_fails_inside_an_open_group_leaves_no_spill(tmp_path, monkeypatch):
    import dataclasses

    from reassembler.verify import open_group

    root = tmp_path / "in"
    synth_night(root, DS, dataclasses.replace(CFG, rollouts=100, group_size=48))
    folders: list[str] = []
    real = open_group.OpenGroup.__init__

    def spy(self, group_id, scratch=None):
        real(self, group_id, scratch)
        folders.append(self.folder)

    def boom(self, *a, **k):
        raise RuntimeError("the disk is gone")

    monkeypatch.setattr(open_group.OpenGroup, "__init__", spy)
    monkeypatch.setattr(open_group.OpenGroup, "add", boom)
    with pytest.raises(RuntimeError, match="the disk is gone"):
        build_night(root, tmp_path / "out", DS, Settings(batch_rows=40, batch_tokens=10**9))
    assert folders and not any(os.path.exists(f) for f in folders)
    assert not (tmp_path / "out" / "rows").exists()


def test_a_shards_rollout_records_read_their_bulky_fields_from_the_plan_as_a_dict_would(synth):
    """The shard's rollout records keep their items and trace in the Arrow columns of the
    plan's items file (load/shard_plan.py: RolloutRecord, read in step with the rollouts) and
    give each field as the plain record would: by [] and .get, nulls as None, a missing key
    a KeyError or the default. An items file out of step with the rollouts is refused."""
    root, _, _ = synth
    build_night(root / "input", root / "records", DS)
    [staging] = (root / "records" / "_runs" / f"ds={DS}").iterdir()
    plan = shard_plan.plan_dir(staging, 0)
    plain = pq.read_table(f"{plan}/rollouts.parquet").to_pylist()
    items = pq.read_table(f"{plan}/{shard_plan.ITEMS_FILE}").to_pylist()
    assert [p["rollout_id"] for p in plain] == [i["rollout_id"] for i in items]  # a row each, in step
    plain = [{**p, **i} for p, i in zip(plain, items)]
    records = list(shard_plan.read_rollouts(staging, 0))
    assert len(records) == len(plain) > 100
    assert any(p["generated_items"] for p in plain) and any(p["trace"] is None for p in plain)
    for record, row in zip(records, plain):
        assert set(shard_plan.BULKY) & set(record.keys()) == set()  # not held as Python objects
        for key, value in row.items():
            assert record[key] == value and record.get(key) == value and record.get(key, "d") == value
        with pytest.raises(KeyError):
            record["no_such_field"]
        assert record.get("no_such_field", "d") == "d"
    table = pq.read_table(f"{plan}/{shard_plan.ITEMS_FILE}")
    pq.write_table(table.slice(1), f"{plan}/{shard_plan.ITEMS_FILE}")  # one row short: the rest out of step
    with pytest.raises(RuntimeError, match="not in step"):
        list(shard_plan.read_rollouts(staging, 0))
