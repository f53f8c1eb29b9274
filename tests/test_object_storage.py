"""Capture and rows on object storage, against a real S3-compatible server (moto's, started
on 127.0.0.1 by the `s3` fixture): a night built from and to S3 reads exactly like the local
build; a kill at every publish step leaves readers who follow the manifest a whole night of
one run; two publishers never both win; the lease; and every way the store can refuse says
so in one line. Builds run as the real command in subprocesses, so exit codes, kills and
messages are real."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from commands import cli, one_line_error
from nights import DS
from reassembler import storage
from reassembler.errors import OutputBusy

KINDS = ("rows", "audit")


def build(inp, out, warehouse, *extra, env: dict | None = None) -> subprocess.CompletedProcess:
    return cli("build", "--input", inp, "--output", out, "--warehouse", warehouse, "--ds", DS, *extra, env=env)


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    """Two synthetic nights of every capture shape (staged, lineage, NeMo Gym local mode and
    rebuilt lines, faults injected), the second larger; and the first built locally."""
    root = tmp_path_factory.mktemp("nights")
    for name, rollouts in (("small", 48), ("big", 64)):
        res = cli("synth", "--output", root / name, "--ds", DS, "--rollouts", rollouts, "--seed", "5")
        assert res.returncode == 0, res.stderr
    res = cli("build", "--input", root / "small", "--output", root / "local", "--ds", DS)
    assert res.returncode == 0, res.stderr
    return root


def _table(folder_or_files) -> pa.Table:
    if isinstance(folder_or_files, list):
        return pa.concat_tables([pq.read_table(f) for f in folder_or_files])
    return pq.read_table(folder_or_files, partitioning=None)


def _sorted(table: pa.Table, key: str) -> list[dict]:
    rows = table.drop_columns([c for c in ("run_id",) if c in table.column_names]).to_pylist()
    return sorted(rows, key=lambda r: r[key])


def test_a_night_from_and_to_s3_reads_exactly_like_the_local_build(s3, nights, tmp_path):
    inp, out = f"s3://{s3.bucket('capture')}/nightly", f"s3://{s3.bucket('rows')}/nightly"
    s3.upload(nights / "small", inp)
    res = build(inp, out, tmp_path / "warehouse.duckdb")
    assert res.returncode == 0, res.stderr
    assert f"rows:  {out}/rows/ds={DS}/" in res.stdout
    s3.download(out, tmp_path / "mirror")
    local, mirror = nights / "local", tmp_path / "mirror"
    for kind, key in (("rows", "row_id"), ("audit", "rollout_id")):
        a, b = _table(local / kind / f"ds={DS}"), _table(mirror / kind / f"ds={DS}")
        assert a.schema == b.schema and _sorted(a, key) == _sorted(b, key)
    # rows byte for byte (the rows carry no run id)
    assert [p.read_bytes() for p in sorted((local / "rows" / f"ds={DS}").iterdir())] == [
        p.read_bytes() for p in sorted((mirror / "rows" / f"ds={DS}").iterdir())
    ]
    manifest = json.loads((mirror / "_published" / f"ds={DS}.json").read_text())
    keys = s3.keys(out)
    for kind in KINDS:  # the partition holds exactly the committed files
        assert [k for k in keys if k.startswith(f"{kind}/")] == sorted(manifest["partitions"][kind])
        assert all(k in keys for k in manifest["files"][kind])
    assert "tables/runs.parquet" in keys and "_lock" not in keys
    # the report and its index are written to the output's store
    res = cli("report", "--html", "--output", out, "--warehouse", tmp_path / "warehouse.duckdb", "--ds", DS)
    assert res.returncode == 0, res.stderr
    assert {f"reports/ds={DS}/index.html", "reports/index.html", "reports/plotly.min.js"} <= set(s3.keys(out))
    # and every other command that reads the output
    wh = ("--output", out, "--warehouse", tmp_path / "warehouse.duckdb")
    text = cli("report", *wh)
    assert text.returncode == 0 and DS in text.stdout and "interrupted" not in text.stdout, text.stderr
    assert (
        cli(
            "gate",
            *wh,
            "--ds",
            DS,
            "--max-mask-rate",
            "1",
            "--max-reason-rate",
            "1",
            "--max-rejects",
            "100000",
            "--max-mask-rate-rise",
            "1",
        ).returncode
        == 0
    )
    masked = next(r["rollout_id"] for r in _table(mirror / "audit" / f"ds={DS}").to_pylist() if r["status"] == "masked")
    replay = cli("explain", *wh, "--ds", DS, masked)  # reads the night's input again, from S3
    assert replay.returncode == 0 and masked in replay.stdout, replay.stderr


def test_a_night_loaded_in_parts_on_s3_reads_exactly_like_the_local_build(s3, nights, tmp_path):
    """--load-parts 3 with input and output on S3: the parts are written to the run's folder
    on the store and read back by range; the rows are the local one-part build's, byte for
    byte, and the parts' tables are gone once merged (the derived token files stay)."""
    inp, out = f"s3://{s3.bucket('capture')}/parts", f"s3://{s3.bucket('rows')}/parts"
    s3.upload(nights / "small", inp)
    res = build(inp, out, tmp_path / "warehouse.duckdb", "--load-parts", "3", "--workers", "2", "--merge-buckets", "3")
    assert res.returncode == 0, res.stderr
    per_call = [k for k in s3.keys(out) if k.startswith(f"calls/ledger/ds={DS}/")]
    assert sorted(k.rsplit("/", 1)[-1] for k in per_call) == [f"bucket-0000{b}.parquet" for b in range(3)]
    s3.download(out, tmp_path / "mirror")
    local, mirror = nights / "local", tmp_path / "mirror"
    assert [p.read_bytes() for p in sorted((local / "rows" / f"ds={DS}").iterdir())] == [
        p.read_bytes() for p in sorted((mirror / "rows" / f"ds={DS}").iterdir())
    ]
    a, b = _table(local / "audit" / f"ds={DS}"), _table(mirror / "audit" / f"ds={DS}")
    assert _sorted(a, "rollout_id") == _sorted(b, "rollout_id")
    left = [k for k in s3.keys(out) if "/load/" in k]
    assert any(k.endswith("/load/plan.json") for k in left)
    assert {k.rsplit("/", 2)[-2] for k in left if "/load/part-" in k} <= {f"part-0000{k}" for k in range(3)}
    assert all("derived-tokens" in k for k in left if "/load/part-" in k), left


def test_per_call_tables_on_s3_are_views_explain_reads_and_retention_deletes(s3, nights, tmp_path):
    """The per-call tables of a night on S3 are the current run's files (a reader of the
    warehouse sees them through temporary views); a second night with --retention-nights 1
    deletes the first night's ledger, token_rows and rollout_items folders, its reject rows stay."""
    from reassembler.warehouse import connect

    inp, out = f"s3://{s3.bucket('capture')}/kept", f"s3://{s3.bucket('rows')}/kept"
    warehouse = tmp_path / "warehouse.duckdb"
    s3.upload(nights / "small", inp)
    storage.write_bytes(f"{inp}/ledger/ds={DS}/zz-broken.jsonl", b"not json\n")  # a reject row
    assert build(inp, out, warehouse).returncode == 0
    with connect(out, read_only=True, database=warehouse) as con:
        [[ledger, rejects]] = con.execute(
            "SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM rejects)"
        ).fetchall()
        kinds = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
    assert ledger > 0 and rejects > 0 and not {"ledger", "token_rows", "rejects"} & kinds
    res = build(inp, out, warehouse)  # the same night again: one run's files stay
    assert res.returncode == 0, res.stderr
    runs = {k.split("/")[3] for k in s3.keys(out) if k.startswith(f"calls/ledger/ds={DS}/")}
    assert len(runs) == 1, runs
    later = "2026-11-29"
    for key in [k for k in s3.keys(inp) if k.startswith(("rollouts/", "ledger/", "tokens/"))]:  # a night later
        storage.copy(f"{inp}/{key}", f"{inp}/{key.replace(f'ds={DS}', f'ds={later}')}")
    res = cli(
        "build", "--input", inp, "--output", out, "--warehouse", warehouse, "--ds", later, "--retention-nights", "1"
    )
    assert res.returncode == 0, res.stderr
    keys = s3.keys(out)
    gone = (f"calls/ledger/ds={DS}/", f"calls/token_rows/ds={DS}/", f"calls/rollout_items/ds={DS}/")
    assert not [k for k in keys if k.startswith(gone)]
    assert [k for k in keys if k.startswith(f"calls/rollout_items/ds={later}/")]
    assert [k for k in keys if k.startswith(f"calls/rejects/ds={DS}/")]  # kept for good
    with connect(out, read_only=True, database=warehouse) as con:
        nights_seen = {str(d) for (d,) in con.execute("SELECT DISTINCT ds FROM ledger").fetchall()}
        assert con.execute(f"SELECT count(*) FROM rejects WHERE ds = '{DS}'").fetchone()[0] == rejects
    assert nights_seen == {later}


def test_the_quality_ui_serves_reports_from_object_storage(s3, nights, tmp_path):
    from fastapi.testclient import TestClient

    from reassembler_airflow.quality_ui import create_app

    out = f"s3://{s3.bucket('rows')}/nightly"
    storage.write_bytes(f"{out}/reports/index.html", b"<!doctype html><title>all nights</title>")
    client = TestClient(create_app(output=out, access=lambda: None))
    page = client.get("/")
    assert page.status_code == 200 and "all nights" in page.text
    assert page.headers["content-type"].startswith("text/html")
    assert client.get("/ds=2026-01-01/index.html").status_code == 404


def test_dot_dot_in_a_report_path_on_object_storage_is_404(s3, monkeypatch):
    """No link resolves a key on object storage, so the path's own `..` is all that guards
    it: behind a front end that resolves dot segments (as many do), `reports/../x` is `x`."""
    from fastapi.testclient import TestClient
    from faultproxy import FaultProxy

    from reassembler_airflow.quality_ui import create_app

    out = f"s3://{s3.bucket('rows')}/nightly"
    storage.write_bytes(f"{out}/_published/ds={DS}.json", b'{"secret": 1}')
    storage.write_bytes(f"{out}/reports/index.html", b"<!doctype html><title>all nights</title>")
    proxy = FaultProxy(s3.port, normalize=True)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        client = TestClient(create_app(output=out, access=lambda: None))
        assert "all nights" in client.get("/").text  # through the front end
        for path in (f"/%2e%2e/_published/ds={DS}.json", f"/ds={DS}/%2e%2e/%2e%2e/_published/ds={DS}.json"):
            res = client.get(path)
            assert res.status_code == 404 and "secret" not in res.text, path
    finally:
        proxy.close()


def _manifest_view(s3, out: str) -> dict[str, int] | None:
    """A reader following the manifest on S3: the rows and audit of the run it names."""
    try:
        manifest = json.loads(storage.read_bytes(f"{out}/_published/ds={DS}.json"))
    except FileNotFoundError:
        return None
    view = {}
    for kind in KINDS:
        tables = [pq.read_table(storage.open_parquet(f"{out}/{key}")) for key in manifest["files"][kind]]
        view[kind] = sum(t.num_rows for t in tables)
        if kind == "audit":
            assert {r for t in tables for r in t.column("run_id").to_pylist()} == {manifest["run_id"]}
    return view


@pytest.mark.parametrize("step", ["commit", "manifest", "warehouse", "rows_copied", "rows_in", "audit_in"])
def test_a_kill_at_every_publish_step_on_s3(s3, nights, tmp_path, step):
    inp_small, inp_big = (f"s3://{s3.bucket('capture')}/{n}" for n in ("small", "big"))
    s3.upload(nights / "small", inp_small)
    s3.upload(nights / "big", inp_big)
    out, warehouse = f"s3://{s3.bucket('rows')}/nightly", tmp_path / "warehouse.duckdb"
    assert build(inp_small, out, warehouse).returncode == 0
    before = _manifest_view(s3, out)
    killed = build(inp_big, out, warehouse, env={"REASSEMBLER_TEST_KILL_AT": step, "REASSEMBLER_LEASE_SECONDS": "2"})
    assert killed.returncode == -signal.SIGKILL
    after = _manifest_view(s3, out)
    assert after == before if step == "commit" else after != before  # one whole run, old or new
    lease = json.loads(storage.read_bytes(f"{out}/_lock"))  # the dead holder's, left behind
    while time.time() <= lease["until"]:  # then it expires: its own `until`, not a guess
        time.sleep(0.05)
    rerun = build(inp_big, out, warehouse)  # and is taken over
    assert rerun.returncode == 0, rerun.stderr
    final = _manifest_view(s3, out)
    manifest = json.loads(storage.read_bytes(f"{out}/_published/ds={DS}.json"))
    keys = s3.keys(out)
    for kind in KINDS:  # no stale object of an earlier run among the partition's files
        assert [k for k in keys if k.startswith(f"{kind}/")] == sorted(manifest["partitions"][kind])
    rows = pq.read_table(storage.open_parquet(f"{out}/{manifest['partitions']['rows'][0]}"))
    assert rows.num_rows == final["rows"]


@pytest.mark.parametrize("step", ["manifest", "warehouse", "rows_copied"])
def test_recover_alone_finishes_a_night_killed_after_its_commit_on_s3(s3, nights, tmp_path, monkeypatch, step):
    """A publish killed after the commit, before or while the partitions are copied, and no
    build of the night afterwards: `recover` (what every load and publish runs first) makes
    the warehouse, both partitions and the reader snapshots follow the committed manifest."""
    from reassembler.publish import protocol
    from reassembler.warehouse import connect

    inp_small, inp_big = (f"s3://{s3.bucket('capture')}/{n}" for n in ("small", "big"))
    s3.upload(nights / "small", inp_small)
    s3.upload(nights / "big", inp_big)
    out, warehouse = f"s3://{s3.bucket('rows')}/nightly", tmp_path / "warehouse.duckdb"
    assert build(inp_small, out, warehouse).returncode == 0
    killed = build(inp_big, out, warehouse, env={"REASSEMBLER_TEST_KILL_AT": step})
    assert killed.returncode == -signal.SIGKILL
    manifest = json.loads(storage.read_bytes(f"{out}/_published/ds={DS}.json"))
    monkeypatch.setenv("REASSEMBLER_WAREHOUSE", str(warehouse))
    with connect(out) as con:
        assert protocol.pending(con, out) == [DS]
        assert protocol.recover(con, out) == [DS]
        assert protocol.recover(con, out) == [] and protocol.pending(con, out) == []
        [(run_id, n_rows)] = con.execute(
            "SELECT run_id, n_rows FROM runs WHERE ds = CAST($ds AS DATE) ORDER BY published_at DESC LIMIT 1",
            {"ds": DS},
        ).fetchall()
        audit_runs = {
            r
            for (r,) in con.execute(
                "SELECT DISTINCT run_id FROM audit WHERE ds = CAST($ds AS DATE)", {"ds": DS}
            ).fetchall()
        }
    assert run_id == manifest["run_id"] and n_rows == manifest["numbers"]["n_rows"] and audit_runs == {run_id}
    keys = s3.keys(out)
    for kind in KINDS:
        assert [k for k in keys if k.startswith(f"{kind}/")] == sorted(manifest["partitions"][kind])
    rows = [pq.read_table(storage.open_parquet(f"{out}/{k}")) for k in manifest["partitions"]["rows"]]
    assert sum(t.num_rows for t in rows) == manifest["numbers"]["n_rows"]
    snapshot = pq.read_table(storage.open_parquet(f"{out}/tables/runs.parquet")).to_pylist()
    assert manifest["run_id"] in {r["run_id"] for r in snapshot}


@pytest.mark.parametrize("store", ["s3", "local"])
def test_two_publishers_of_one_night_never_both_win(nights, tmp_path, monkeypatch, request, store):
    """Two runs staged; the first reads the manifest, then the second commits before the
    first's conditional put: the first fails OutputBusy and touches nothing of the winner's."""
    from reassembler.publish import protocol
    from reassembler.warehouse import connect
    from steps import load, shard

    if store == "s3":
        s3 = request.getfixturevalue("s3")
        inp, out = f"s3://{s3.bucket('capture')}/nightly", f"s3://{s3.bucket('rows')}/nightly"
        s3.upload(nights / "small", inp)
    else:
        inp, out = str(nights / "small"), str(tmp_path / "out")
    monkeypatch.setenv("REASSEMBLER_WAREHOUSE", str(tmp_path / "warehouse.duckdb"))
    staged = {}
    for run in ("first", "second"):
        load(inp, out, DS, run_id=run)
        shard(out, DS, 0, run)
        with connect(out, read_only=True) as con:
            staged[run] = protocol.verify_staged(con, protocol.staging_dir(out, DS, run), DS, run_id=run)
    real_put = storage.put_if
    raced = threading.Event()

    def second_commits_first(loc, data, version):
        if not raced.is_set() and loc.endswith(".json"):
            raced.set()
            with connect(out) as con:  # the other publisher, meanwhile
                protocol.publish_staged(
                    con, out, protocol.staging_dir(out, DS, "second"), DS, "second", staged["second"], _info()
                )
        return real_put(loc, data, version)

    monkeypatch.setattr(storage, "put_if", second_commits_first)
    with connect(out) as con, pytest.raises(OutputBusy, match="another run committed night"):
        protocol.publish_staged(con, out, protocol.staging_dir(out, DS, "first"), DS, "first", staged["first"], _info())
    manifest = json.loads(storage.read_bytes(f"{out}/_published/ds={DS}.json"))
    assert manifest["run_id"] == "second"
    for kind in KINDS:  # the winner's night, whole
        listed = storage.list_files(f"{out}/{kind}/ds={DS}", ".parquet")
        assert [f"{kind}/ds={DS}/{name}" for name in listed] == manifest["partitions"][kind]
        assert all(storage.exists(f"{out}/{key}") for key in manifest["files"][kind])


def _info() -> dict:
    return {"input_dir": "x", "mode": "select", "offchain": "selected", "options": "{}", "seconds": 0.0}


def test_the_conditional_put_itself(s3):
    loc = f"s3://{s3.bucket()}/m.json"
    first = storage.put_if(loc, b"1", None)
    with pytest.raises(storage.Conflict):
        storage.put_if(loc, b"2", None)  # If-None-Match: * on an existing object
    second = storage.put_if(loc, b"3", first)
    with pytest.raises(storage.Conflict):
        storage.put_if(loc, b"4", first)  # If-Match of a replaced version
    assert storage.read_versioned(loc) == (b"3", second)


def test_a_held_lease_makes_a_second_build_fail_naming_its_holder(s3, nights, tmp_path):
    inp, out = f"s3://{s3.bucket('capture')}/nightly", f"s3://{s3.bucket('rows')}/nightly"
    s3.upload(nights / "small", inp)
    storage.put_if(
        f"{out}/_lock",
        json.dumps(
            {"pid": 4242, "host": "elsewhere", "ds": DS, "command": "build", "since": "now", "until": 4e9}
        ).encode(),
        None,
    )
    res = build(inp, out, tmp_path / "w.duckdb")
    assert res.returncode == 3
    assert "output is busy, held by pid 4242 on elsewhere (build ds=2026-11-28)" in one_line_error(res)
    expired = json.dumps({"pid": 4242, "host": "elsewhere", "ds": DS, "until": 1.0}).encode()
    storage.write_bytes(f"{out}/_lock", expired)  # its holder died long ago: taken over
    assert build(inp, out, tmp_path / "w.duckdb").returncode == 0
    assert "_lock" not in s3.keys(out)  # released


def test_synth_writes_only_local_folders():
    res = cli("synth", "--output", "s3://capture/nightly", "--ds", DS, "--rollouts", "8")
    assert res.returncode == 2 and "synth writes a local folder" in one_line_error(res)


def test_the_warehouse_is_required_for_an_output_on_s3(s3, nights):
    res = cli("build", "--input", nights / "small", "--output", "s3://rows/x", "--ds", DS)
    assert res.returncode == 2
    assert "is on object storage: give the warehouse file's local path with --warehouse" in one_line_error(res)


@pytest.mark.parametrize("case", ["missing bucket", "wrong credentials", "unreachable endpoint", "missing prefix"])
def test_the_store_refusing_is_one_line_and_an_exit_code(s3, nights, tmp_path, case, request):
    bucket = s3.bucket("capture")
    s3.upload(nights / "small", f"s3://{bucket}/nightly")
    inp, env = f"s3://{bucket}/nightly", {}
    if case == "missing bucket":
        inp, code, said = "s3://no-such-bucket-here/nightly", 6, "bucket no-such-bucket-here does not exist"
    elif case == "wrong credentials":  # a second server that checks every request's credentials
        from s3server import S3Server

        strict = S3Server(tmp_path / "strict.log", authenticate=True)
        request.addfinalizer(strict.stop)
        env, code, said = {"AWS_ENDPOINT_URL": strict.endpoint, "AWS_SECRET_ACCESS_KEY": "wrong"}, 6, "access denied"
    elif case == "unreachable endpoint":  # retried for a short budget here (a refused connection is transient)
        env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "REASSEMBLER_S3_RETRY_SECONDS": "1.5"}
        code, said = 6, "cannot reach the object store"
    else:
        inp, code, said = f"s3://{bucket}/elsewhere", 2, "input partition folder is missing"
    if case == "wrong credentials":
        env["AWS_ACCESS_KEY_ID"] = "AKIAWRONG"
    res = build(inp, f"s3://{s3.bucket('rows')}/nightly", tmp_path / "w.duckdb", env=env)
    assert res.returncode == code, res.stderr
    assert said in one_line_error(res)
    assert "s3:/" + bucket not in res.stderr  # a URI is never turned into a path


def test_files_fetched_ahead_come_back_in_order_with_their_errors(s3):
    """storage.read_many: the small capture files of a night, fetched on threads ahead of the
    caller, are handed over in the order asked, a missing one as its error in its place."""
    root = f"s3://{s3.bucket()}/ledger"
    locations = []
    for k in range(40):
        loc = f"{root}/part-{k:03d}.jsonl"
        if k != 17:
            storage.write_bytes(loc, f'{{"n": {k}}}\n'.encode() * (k + 1))
        locations.append(loc)
    got = list(storage.read_many(locations, window_bytes=64, threads=8))
    assert [loc for loc, _ in got] == locations
    for k, (_, data) in enumerate(got):
        if k == 17:
            assert isinstance(data, FileNotFoundError)
        else:
            assert data == f'{{"n": {k}}}\n'.encode() * (k + 1)


def test_a_shard_needs_nothing_but_the_store(s3, nights, tmp_path, monkeypatch):
    """After the load, a shard reads its plan and the token files from the output store
    only: with the warehouse file gone and no local file of the load's, it builds its
    part, and the night publishes as a whole build does."""
    from reassembler.settings import Settings
    from steps import load, publish, shard

    inp, out = f"s3://{s3.bucket('capture')}/nightly", f"s3://{s3.bucket('rows')}/nightly"
    s3.upload(nights / "small", inp)
    warehouse = tmp_path / "warehouse.duckdb"
    monkeypatch.setenv("REASSEMBLER_WAREHOUSE", str(warehouse))
    settings = Settings(shards=2)
    load(inp, out, DS, settings, run_id="r")
    assert any(k.startswith(f"_runs/ds={DS}/r/plan/shard-00001/") for k in s3.keys(out))
    warehouse.rename(tmp_path / "elsewhere.duckdb")  # another machine: no warehouse here
    monkeypatch.setenv("TMPDIR", str(tmp_path / "empty-tmp"))
    (tmp_path / "empty-tmp").mkdir()
    results = [shard(out, DS, k, "r", settings) for k in range(2)]
    assert not warehouse.exists()
    for k in range(2):  # each shard's plan names the token row groups it read, each once, and how many rows
        plan = f"{out}/_runs/ds={DS}/r/plan/shard-{k:05d}"
        groups = pq.read_table(storage.open_parquet(f"{plan}/token_groups.parquet")).to_pylist()
        calls = pq.read_table(storage.open_parquet(f"{plan}/calls.parquet"), columns=["t_file", "t_row"])
        located = calls.filter(calls.column("t_file").is_valid())
        assert len({(g["file"], g["row_group"]) for g in groups}) == len(groups) > 0
        assert sum(g["rows"] for g in groups) == located.num_rows
        assert {g["file"] for g in groups} == set(located.column("t_file").to_pylist())
    (tmp_path / "elsewhere.duckdb").rename(warehouse)
    numbers = publish(inp, out, DS, "r", settings)
    assert numbers.n_rows == sum(r.n_rows for r in results) > 0
    s3.download(out, tmp_path / "mirror")
    local = pq.read_table(nights / "local" / "rows" / f"ds={DS}", partitioning=None)
    assert sorted(local.to_pylist(), key=str) == sorted(
        pq.read_table(tmp_path / "mirror" / "rows" / f"ds={DS}", partitioning=None).to_pylist(), key=str
    )


@pytest.mark.parametrize(
    "odd",
    [
        "rollouts/ds={ds}/",  # a folder marker at the partition
        "ledger/ds={ds}/server-0/",  # a folder marker below it
        "tokens/ds={ds}/",
        "rollouts/",  # at the kind's folder
        "rollouts/ds={ds}//stray.jsonl",  # an empty name between two slashes
        "ledger/ds={ds}/ledger.jsonl/",  # a marker named as a file is
    ],
)
@pytest.mark.parametrize("body", [b"", b'{"not": "empty"}\n'])
def test_any_object_key_under_a_location_is_handled(s3, nights, tmp_path, odd, body):
    """Object keys a console or another tool leaves under the input locations: folder
    markers (a key ending in `/`, empty or not), an empty name between two slashes. Each
    builds the night as without it (markers hold no data), or stops naming the key (exit 2):
    never an internal error."""
    inp, out = f"s3://{s3.bucket('capture')}/odd", f"s3://{s3.bucket('rows')}/odd"
    s3.upload(nights / "small", inp)
    bucket, _, prefix = inp[len("s3://") :].partition("/")
    s3.client().put_object(Bucket=bucket, Key=f"{prefix}/{odd.format(ds=DS)}", Body=body)
    res = build(inp, out, tmp_path / "warehouse.duckdb")
    assert res.returncode in (0, 2), res.stderr
    if res.returncode == 2:
        line = one_line_error(res)
        assert "internal" not in line and odd.format(ds=DS).rstrip("/").rsplit("/", 1)[-1] in line, line
    else:
        s3.download(out, tmp_path / "mirror")
        a = _table(nights / "local" / "audit" / f"ds={DS}")
        b = _table(tmp_path / "mirror" / "audit" / f"ds={DS}")
        assert _sorted(a, "rollout_id") == _sorted(b, "rollout_id")


def test_a_read_with_a_limit_never_holds_more_than_it_on_s3_as_locally(s3, tmp_path):
    """read_bytes(loc, limit): the file whole when it is no longer than the limit, else its
    first limit + 1 bytes (the rest of the object's body never read); an empty file empty."""
    bucket = s3.bucket("limits")
    for name, data in (("big", bytes(range(256)) * 40), ("small", b"abc"), ("empty", b"")):
        (tmp_path / name).write_bytes(data)
        storage.write_bytes(f"s3://{bucket}/{name}", data)
    for where in (str(tmp_path), f"s3://{bucket}"):
        assert storage.read_bytes(f"{where}/big", 100) == (bytes(range(256)) * 40)[:101]
        assert storage.read_bytes(f"{where}/small", 100) == b"abc"
        assert storage.read_bytes(f"{where}/empty", 100) == b""
        assert len(storage.read_bytes(f"{where}/big")) == 10_240
        got = dict(storage.read_many([f"{where}/big", f"{where}/small"], limit=10))
        assert got == {f"{where}/big": (bytes(range(256)) * 40)[:11], f"{where}/small": b"abc"}
