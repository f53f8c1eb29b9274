"""Two DAG runs of one night at once (a manual rerun beside the scheduled run): each runs its
load parts and merge in its own folder, a load leaves the folder of a run still in flight
alone, and the later load wins: it publishes, the other run stops at its shards or its audit
checks with one line saying why. A run's folder planned long ago and never loaded (a run
that failed) is collected by the next load."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from conftest import Clock
from nights import DS, Night, worked_example
from reassembler.build import load_step, publish_step, shard_step
from reassembler.errors import InputError
from reassembler.formats.night import find_night
from reassembler.load import part_load
from reassembler.load.parts import STARTED, plan_parts, read_plan, write_plan
from reassembler.merge.bucket import merge_bucket
from reassembler.merge.keys import merge_keys
from reassembler.merge.night_load import PartsLoaded
from reassembler.merge.rollouts import merge_rollouts
from reassembler.publish import protocol
from reassembler.publish.protocol import AuditCheckFailed, path_safe, staging_dir
from reassembler.settings import ENV_SECONDS, Settings
from reassembler.warehouse import Warehouse

S = Settings(load_parts=2, merge_buckets=2, shards=2)


class Run:
    """One DAG run's tasks, each called as its task calls it."""

    def __init__(self, inp, out, run_id: str):
        self.inp, self.out, self.run_id = str(inp), str(out), run_id
        self.staging = staging_dir(self.out, DS, run_id)
        self.calls = (self.out, path_safe(run_id))

    def plan(self):
        night = find_night(self.inp, DS)
        write_plan(self.staging, plan_parts(night, S.load_parts, S.buckets, True))

    def parts(self):
        plan = read_plan(self.staging)
        for k in range(len(plan.parts)):
            part_load.load_part(plan, k, self.staging, S)

    def merge(self):
        merge_rollouts(read_plan(self.staging), self.staging, self.calls, S)
        plan = read_plan(self.staging)
        for step in (merge_keys, merge_bucket):
            for b in range(plan.buckets):
                step(plan, self.staging, b, self.calls, S)

    def load(self):
        load_step(PartsLoaded(self.staging, S), Warehouse(self.out, S.duckdb), self.run_id)

    def shards(self):
        return sum(shard_step(self.out, DS, k, self.run_id, S).n_rows for k in range(2))

    def publish(self):
        return publish_step(Warehouse(self.out, S.duckdb), DS, self.run_id, self.inp, S)


@pytest.fixture
def two_runs(tmp_path):
    n = Night(tmp_path / "n")
    worked_example(n, "a_g0", reward=1.0)
    worked_example(n, "a_g1", compaction=False, reward=0.0)
    inp = n.write()
    return Run(inp, tmp_path / "out", "scheduled__2026-11-28T00:00:00+00:00"), Run(inp, tmp_path / "out", "manual__B")


@pytest.mark.parametrize("later", ["second", "first"])
def test_two_runs_interleaving_their_tasks_publish_the_later_load_and_stop_the_other_saying_so(two_runs, later):
    a, b = two_runs
    for step in ("plan", "parts", "merge"):  # each task of one run, then the same task of the other
        getattr(a, step)()
        getattr(b, step)()
    first, second = (a, b) if later == "second" else (b, a)
    first.load()
    second.load()  # the later load: the night is its own now
    with pytest.raises(InputError) as raised:  # the earlier load's plan went with that load
        first.shards()
    assert "this run's plan is gone: the night was loaded again by another run since" in str(raised.value)
    assert second.shards() > 0
    said = f"not published: run {second.run_id} loaded it again after run {first.run_id} did; that run publishes it"
    with pytest.raises(AuditCheckFailed, match=re.escape(said)):
        first.publish()
    published = second.publish()
    manifest = json.loads((Path(a.out) / "_published" / f"ds={DS}.json").read_text())
    assert manifest["run_id"] == second.run_id and published.n_rows == manifest["numbers"]["n_rows"] > 0


def test_a_load_leaves_a_run_in_flight_alone_and_collects_one_planned_long_ago(two_runs, monkeypatch):
    a, b = two_runs
    clock = Clock(time.time())
    monkeypatch.setattr(protocol, "_clock", clock)
    b.plan()
    b.parts()  # in flight: planned, not loaded
    a.plan()
    a.parts()
    a.merge()
    a.load()
    assert read_plan(b.staging).buckets and (Path(b.staging) / STARTED).is_file()  # b's folder is whole
    assert not (Path(a.staging) / STARTED).exists()  # a loaded: no longer in flight
    b.merge()
    clock.now += ENV_SECONDS["REASSEMBLER_IN_FLIGHT_SECONDS"] + 60  # b never loads: it failed long ago
    c = Run(a.inp, a.out, "manual__C")
    c.plan()
    c.parts()
    c.merge()
    c.load()
    with pytest.raises(InputError, match="this run's load plan is gone: its folder was removed"):
        read_plan(b.staging)
    assert not Path(a.staging).exists()  # loaded, never published, loaded again since: no reader needs it
