"""The night's steps as the Airflow tasks run them, one call each, for tests that stop a
night between its steps: each opens the warehouse for its own step (build.py)."""

from __future__ import annotations

from nights import DS
from reassembler.build import load_step, publish_step, shard_step
from reassembler.load.night_load import NightLoad
from reassembler.settings import DEFAULTS, Settings
from reassembler.warehouse import Warehouse


def load(inp, out, ds: str = DS, settings: Settings = DEFAULTS, run_id: str | None = None):
    with NightLoad(inp, ds, settings) as night:
        return load_step(night, Warehouse(out, settings.duckdb), run_id)


def shard(out, ds: str, k: int, run_id: str, settings: Settings = DEFAULTS):
    return shard_step(out, ds, k, run_id, settings)


def publish(inp, out, ds: str, run_id: str, settings: Settings = DEFAULTS):
    return publish_step(Warehouse(out, settings.duckdb), ds, run_id, inp, settings)
