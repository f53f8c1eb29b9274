from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from nights import DS, Night
from reassembler.build import build_night
from reassembler.settings import Options, Settings


def read_partition(output: Path, kind: str, ds: str = DS) -> list[dict]:
    return pq.read_table(Path(output) / kind / f"ds={ds}").to_pylist()


def night_outcome(root: Path, out: Path, ds: str) -> tuple[dict, dict]:
    """The night of `root` built into `out`: its rows by row id and its audit rows by rollout
    id (without the run id), to compare a night built alone with the same night mixed in."""
    from reassembler.build import build_night

    build_night(root, out, ds)
    rows = {r["row_id"]: r for r in read_partition(out, "rows", ds)}
    audit = {a["rollout_id"]: a for a in read_partition(out, "audit", ds)}
    for a in audit.values():
        a.pop("run_id")
    return rows, audit


class Built:
    def __init__(self, output: Path, summary):
        self.output, self.summary = output, summary
        self.rows = read_partition(output, "rows")
        self.audit = {a["rollout_id"]: a for a in read_partition(output, "audit")}

    def rows_of(self, rollout_id: str) -> list[dict]:
        return [r for r in self.rows if r["rollout_id"] == rollout_id]


class Clock:
    """A clock a test moves (`clock.now += 60`), to stand in for a module's `_clock`."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def night(tmp_path) -> Night:
    return Night(tmp_path)


@pytest.fixture
def build(tmp_path):
    def run(night: Night, options: Options = Options(), shards: int = 1, **kw) -> Built:
        inp = night.write(**kw)
        out = tmp_path / "output"
        return Built(out, build_night(inp, out, night.ds, Settings(options=options, shards=shards)))

    return run


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3-compatible server on 127.0.0.1 (tests/s3server.py), for the session."""
    from s3server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server, with this process's AWS environment pointed at it (subprocesses the
    test starts inherit it)."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return s3_server
