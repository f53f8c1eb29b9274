"""The load in parts (load/parts.py, part_load.py) and the merge in buckets (merge/):
whatever the number of parts and buckets, the night's outcome is the same, byte for byte:
training rows, audit, reject rows, the summary, and the warehouse's per-call tables once
sorted. A part or a bucket that dies is run again alone and leaves nothing twice; a part
parsed for another plan, or not finished, stops the merge with a line naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nights import DS
from reassembler.build import build_night
from reassembler.formats.night import find_night
from reassembler.load import part_load
from reassembler.load.parts import part_folder, plan_parts, read_plan, write_plan
from reassembler.merge.bucket import merge_bucket
from reassembler.merge.commit import commit_merge
from reassembler.merge.rollouts import merge_rollouts
from reassembler.merge.run import merge_night
from reassembler.producer.config import SynthConfig
from reassembler.producer.synth import synth_night
from reassembler.settings import Settings
from reassembler.warehouse import connect

PER_CALL = {
    "rollouts": "SELECT * EXCLUDE (ds) FROM rollouts ORDER BY rollout_seq",
    "ledger": "SELECT * EXCLUDE (ds) FROM ledger ORDER BY capture_seq",
    "rejects": "SELECT * EXCLUDE (ds) FROM rejects ORDER BY ALL",
    "rollout_items": "SELECT * EXCLUDE (ds) FROM rollout_items ORDER BY rollout_id",
    # derived token rows sit in their part's file: their place differs, their key does not
    "token_rows": "SELECT t_staging_key, t_rollout_id, t_model_call_id, "
    "CASE WHEN t_file LIKE '%/load/part-%' THEN 'derived' ELSE t_file END, "
    "CASE WHEN t_file LIKE '%/load/part-%' THEN NULL ELSE t_row END FROM token_rows ORDER BY ALL",
}


def _damaged(root: Path, seed: int, shape: str | None) -> Path:
    """A synth night (every fault synth injects), its rollout file cut in three (its traces
    file in two, the second repeating an Episode of the first) and then:
    a fourth file repeating some rollout ids of the first (an id an earlier part holds), a
    broken line, a NeMo Gym failures file with a given-up sample and a failed attempt, a
    ledger line of no rollout and a capture of no rollout."""
    synth_night(root, DS, SynthConfig(rollouts=24, group_size=4, seed=seed, only_shape=shape, max_calls=12))
    folder = root / "rollouts" / f"ds={DS}"
    traces = folder / "traces.jsonl"  # verifiers' Episodes: cut in two runs' files, the second repeating one
    if traces.exists():
        episodes = traces.read_bytes().splitlines(keepends=True)
        traces.unlink()
        (folder / "runA.traces.jsonl").write_bytes(b"".join(episodes[: len(episodes) // 2]))
        (folder / "runB.traces.jsonl").write_bytes(b"".join(episodes[len(episodes) // 2 :] + episodes[:1]))
    [only] = sorted(folder.glob("rollouts-*.jsonl"))
    lines = only.read_bytes().splitlines(keepends=True)
    only.unlink()
    third = max(1, len(lines) // 3)
    for k, chunk in enumerate((lines[:third], lines[third : 2 * third], lines[2 * third :])):
        (folder / f"results-{k}.jsonl").write_bytes(b"".join(chunk))
    (folder / "results-3.jsonl").write_bytes(b"".join(lines[:2]) + b'{"rollout_id": "torn\n' + b"".join(lines[-1:]))
    failures = [
        {"_ng_task_index": 900, "_ng_rollout_index": 0, "_ng_failure_terminal": True, "_ng_failure_class": "timeout"},
        {"_ng_task_index": 901, "_ng_rollout_index": 1, "_ng_failure_terminal": False, "_ng_failure_class": "x"},
    ]
    (folder / "results-3_failures.jsonl").write_text("".join(json.dumps(f) + "\n" for f in failures) + "not json\n")
    ledger = root / "ledger" / f"ds={DS}"
    ledger_files = sorted(p for p in ledger.rglob("*.jsonl") if not p.name.endswith(".tokens.jsonl"))
    if ledger_files:
        line = json.loads(ledger_files[0].read_bytes().splitlines()[0])
        line["rollout_id"] = "nobody"
        (ledger / "zz-orphan.jsonl").write_text(json.dumps(line) + "\n")
    (ledger / "nobody-else.tokens.intents").write_text("c1\n")
    return root


def _outcome(out: Path, summary) -> dict:
    with connect(out, read_only=True) as con:
        tables = {name: con.execute(query).fetchall() for name, query in PER_CALL.items()}
    rows = pq.read_table(out / "rows" / f"ds={DS}").sort_by("row_id").to_pylist()
    audit = pq.read_table(out / "audit" / f"ds={DS}").sort_by("rollout_id").to_pylist()
    for a in audit:
        a.pop("run_id", None)
        a.pop("built_at", None)
    return {"tables": tables, "rows": rows, "audit": audit, "load": summary.load.lines()}


def _build(inp: Path, out: Path, parts: int, workers: int = 1, buckets: int = 1, shards: int = 1) -> dict:
    settings_ = Settings(load_parts=parts, workers=workers, merge_buckets=buckets, shards=shards, allow_empty=True)
    return _outcome(out, build_night(inp, out, DS, settings_))


def _merged(con, plan, run: Path, settings_: Settings, calls: tuple[str, str]) -> None:
    merge_night(plan, str(run), calls, settings_)
    commit_merge(con, plan, str(run), calls)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 10_000),
    shape=st.sampled_from([None, "plain", "gym", "local", "rebuilt", "verifiers"]),
    parts=st.integers(2, 5),
    workers=st.sampled_from([1, 2]),
    buckets=st.integers(1, 4),
    shards=st.integers(2, 3),
)
def test_any_number_of_parts_and_buckets_gives_the_same_night(
    tmp_path_factory, seed, shape, parts, workers, buckets, shards
):
    root = tmp_path_factory.mktemp("night")
    inp = _damaged(root / "in", seed, shape)
    one = _build(inp, root / "one", 1)
    many = _build(inp, root / "many", parts, workers, buckets, shards)  # each shard sorts its own calls
    assert many == one
    assert one["rows"] and any(r[0] == "rollouts" for r in one["tables"]["rejects"])  # the damage was read
    assert len(one["tables"]["rollout_items"]) <= len(one["tables"]["rollouts"])  # a row per line kept
    assert any(generated or model or trace for _, generated, model, trace in one["tables"]["rollout_items"])
    repeated = [r for r in one["tables"]["rejects"] if "already seen" in (r[3] or "")]
    assert repeated and all(r[4] for r in repeated)  # a repeated id's reject row keeps its raw line


def test_the_plan_keeps_files_whole_and_captures_together(tmp_path):
    inp = _damaged(tmp_path / "in", 5, "local")
    night = find_night(inp, DS)
    plan = plan_parts(night, 3)
    assert len(plan.parts) == 3
    for kind in ("rollouts", "failures", "ledger", "captures", "tokens"):
        cut = [rel for part in plan.parts for rel in getattr(part, kind)]
        assert sorted(cut) == sorted(getattr(night, kind))  # each file in one part, whole
        if kind != "captures":
            assert cut == getattr(night, kind)  # runs in reading order
    keys = {}
    for k, part in enumerate(plan.parts):
        for rel in part.captures:
            keys.setdefault(rel.split(".tokens")[0], set()).add(k)
    assert keys and all(len(owners) == 1 for owners in keys.values())
    assert sum(1 for p in plan.parts if p.rollouts) >= 2  # the bytes were spread
    again = read_plan_roundtrip(tmp_path / "run", plan)
    assert again == plan


def read_plan_roundtrip(folder: Path, plan):
    write_plan(str(folder), plan)
    return read_plan(str(folder))


def test_a_killed_part_is_run_again_alone_and_leaves_nothing_twice(tmp_path, monkeypatch):
    inp = _damaged(tmp_path / "in", 11, None)
    one = _build(inp, tmp_path / "one", 1)
    night = find_night(inp, DS)
    plan = plan_parts(night, 3)
    run = tmp_path / "run"
    write_plan(str(run), plan)
    settings_ = Settings(load_parts=3, allow_empty=True)
    for k in range(3):
        part_load.load_part(plan, k, str(run), settings_)
    # part 1 dies after writing some of its tables (a killed worker): its marker is gone
    real = part_load.write_table
    written = []

    def dies(loc, schema, batches, *args):
        written.append(loc)
        if len(written) == 3:
            raise KeyboardInterrupt("killed")
        real(loc, schema, batches, *args)

    monkeypatch.setattr(part_load, "write_table", dies)
    with pytest.raises(KeyboardInterrupt):
        part_load.load_part(plan, 1, str(run), settings_)
    monkeypatch.setattr(part_load, "write_table", real)
    left = sorted(p.name for p in Path(part_folder(str(run), 1)).rglob("*") if p.is_file())
    assert part_load.MARKER not in left
    # the tables written as rows came are gone whole (none half written, none complete)
    assert not [f for f in left if ".tmp-" in f or f.split(".")[0] in part_load.PART_TABLES], left
    calls = (str(tmp_path / "wh"), "r1")
    with connect(tmp_path / "wh") as con, pytest.raises(RuntimeError, match=r"part-00001/part.json: load part 1 of 3"):
        _merged(con, plan, run, settings_, calls)
    part_load.load_part(plan, 1, str(run), settings_)  # the retry, alone
    files = sorted(p.name for p in Path(part_folder(str(run), 1)).iterdir())
    assert not [f for f in files if ".tmp-" in f]  # nothing half written is left
    with connect(tmp_path / "wh") as con:
        _merged(con, plan, run, settings_, calls)
        tables = {name: con.execute(query).fetchall() for name, query in PER_CALL.items()}
    assert tables["rollouts"] == one["tables"]["rollouts"]
    assert tables["ledger"] == one["tables"]["ledger"]
    assert tables["rejects"] == one["tables"]["rejects"]


def test_a_part_of_another_plan_is_refused(tmp_path):
    inp = _damaged(tmp_path / "in", 2, "plain")
    night = find_night(inp, DS)
    run = str(tmp_path / "run")
    plan = plan_parts(night, 2)
    for k in range(2):
        part_load.load_part(plan, k, run, Settings(load_parts=2))
    later = plan_parts(find_night(inp, DS), 3)  # the listing cut again: part 0 is not this plan's
    shutil.rmtree(Path(part_folder(run, 2)), ignore_errors=True)
    with pytest.raises(RuntimeError, match="load part 0 of 3 ran for another load plan"):
        merge_rollouts(later, run, (str(tmp_path / "wh"), "r1"), Settings())


def test_merge_and_plans_never_sort_the_wide_rows_whole(tmp_path):
    """The merge numbers rollouts over their keys only, and the shard plans are sorted a
    bucket of groups at a time (load/shard_plan.py), so the warehouse task's memory does
    not grow with the night: 2,000 rollouts and ~47k calls build at a 48MB memory_limit,
    where sorting every rollout row or every call row in one DuckDB query ran out of memory."""
    from reassembler.settings import DuckDBSettings

    cfg = SynthConfig(
        rollouts=2000,
        seed=5,
        prompt_tokens=(10, 30),
        observation_tokens=(2, 12),
        generated_tokens=(2, 12),
        rollouts_per_ledger_file=500,
        token_rows_per_file=20000,
    )
    totals = synth_night(tmp_path / "input", DS, cfg)
    assert totals["calls"] > 40_000
    summary = build_night(
        tmp_path / "input", tmp_path / "out", DS, Settings(duckdb=DuckDBSettings(memory_limit="48MB"))
    )
    audit = pq.read_table(tmp_path / "out" / "audit" / f"ds={DS}")
    assert audit.num_rows == summary.numbers.audit_rows == 2000 and summary.numbers.ok_rollouts > 1000


def test_an_error_in_the_merge_is_the_one_reported_not_its_cleanups(tmp_path, monkeypatch):
    """Out of memory while the merge stages a part's table aborts the transaction; the cleanup
    that then fails too (unregister, ROLLBACK on an aborted transaction) does not replace the
    error the user must see (exit 4, out of memory)."""
    import duckdb

    from reassembler.build import build_night as build
    from reassembler.merge import bucket

    synth_night(
        tmp_path / "in",
        DS,
        SynthConfig(
            rollouts=8, max_calls=6, prompt_tokens=(10, 20), observation_tokens=(2, 5), generated_tokens=(2, 5)
        ),
    )

    class Aborting:
        """A connection whose staging query runs out of memory, after which every call fails
        as DuckDB's do on an aborted transaction."""

        def __init__(self, con):
            self.con, self.aborted = con, False

        def execute(self, query, *args):
            if self.aborted:
                raise duckdb.TransactionException("TransactionContext Error: Current transaction is aborted")
            if query.startswith("CREATE OR REPLACE TEMP TABLE p_ledger"):
                self.aborted = True
                raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")
            return self.con.execute(query, *args)

        def unregister(self, name):
            if self.aborted:
                raise duckdb.TransactionException("TransactionContext Error: Current transaction is aborted")
            return self.con.unregister(name)

        def __getattr__(self, name):
            return getattr(self.con, name)

    real = bucket.scratch
    monkeypatch.setattr(bucket, "scratch", lambda *a: Aborting(real(*a)))
    with pytest.raises(duckdb.OutOfMemoryException, match="Out of Memory"):
        build(tmp_path / "in", tmp_path / "out", DS, Settings(load_parts=2))


def test_empty_last_files_are_planned_into_the_last_part(tmp_path):
    """A kind whose last file is empty (0 bytes) still cuts into every part without falling
    off the end of the plan."""
    synth_night(tmp_path / "in", DS, SynthConfig(rollouts=12, max_calls=6))
    folder = tmp_path / "in" / "rollouts" / f"ds={DS}"
    (folder / "zz-empty.jsonl").write_bytes(b"")
    night = find_night(tmp_path / "in", DS)
    for parts in (2, 3, 5):
        plan = plan_parts(night, parts)
        assert len(plan.parts) == parts
        assert [rel for p in plan.parts for rel in p.rollouts] == night.rollouts  # each once, in order
        assert "zz-empty.jsonl" in plan.parts[-1].rollouts


def test_a_plan_of_another_version_is_refused(tmp_path):
    from reassembler.load.parts import PLAN_VERSION, LoadPlan

    synth_night(tmp_path / "in", DS, SynthConfig(rollouts=4, max_calls=6))
    data = json.loads(plan_parts(find_night(tmp_path / "in", DS), 2).to_json())
    data["version"] = PLAN_VERSION + 1
    from reassembler.errors import InputError
    from reassembler.load.parts import sealed

    with pytest.raises(InputError, match=rf"plan.json: load plan of version {PLAN_VERSION + 1}, expected"):
        LoadPlan.from_json(json.dumps(data).encode(), "plan.json")
    # a plan the planner wrote, changed since (its version put back, its buckets edited): refused
    data["version"] = PLAN_VERSION
    written = json.loads(sealed(data))
    written["buckets"] += 1
    with pytest.raises(InputError, match=r"plan.json: the load plan was changed since it was planned"):
        LoadPlan.from_json(json.dumps(written).encode(), "plan.json")
    assert LoadPlan.from_json(sealed(data), "plan.json").buckets == data["buckets"]


@pytest.mark.parametrize("parts", [1, 3])
def test_a_night_whose_every_rollout_line_is_rejected_stops_at_the_load(tmp_path, parts):
    """Exit 2 naming the rollouts, before the warehouse's copy of the night is replaced."""
    from reassembler.errors import InputError

    synth_night(tmp_path / "in", DS, SynthConfig(rollouts=6, max_calls=6))
    folder = tmp_path / "in" / "rollouts" / f"ds={DS}"
    for f in folder.glob("*.jsonl"):
        f.write_text("{not json\n" * 3)
    with pytest.raises(InputError, match=r"no rollout could be read \(\d+ files, \d+ lines\)"):
        build_night(tmp_path / "in", tmp_path / "out", DS, Settings(load_parts=parts))
    assert not (tmp_path / "out" / "rows").exists()


def test_a_killed_bucket_is_run_again_alone_and_leaves_nothing_twice(tmp_path, monkeypatch):
    """Bucket 1 of 3 dies while it writes its per-call files (a killed worker): its marker
    is missing, so the commit refuses the night naming it; run again alone, it rewrites
    its files whole, and the night equals the one a single bucket builds."""
    from reassembler import call_tables

    inp = _damaged(tmp_path / "in", 7, None)
    one = _build(inp, tmp_path / "one", 1)
    night = find_night(inp, DS)
    settings_ = Settings(load_parts=2, merge_buckets=3, allow_empty=True)
    plan = plan_parts(night, 2, settings_.buckets)
    run = tmp_path / "run"
    write_plan(str(run), plan)
    for k in range(2):
        part_load.load_part(plan, k, str(run), settings_)
    calls = (str(tmp_path / "wh"), "r1")
    merge_night(plan, str(run), calls, settings_)
    marker = run / "load" / "merge" / "bucket-00001.json"
    marker.unlink()
    real, written = call_tables.write_file, []

    def dies(loc, *args, **kw):
        written.append(loc)
        if len(written) == 2:
            raise KeyboardInterrupt("killed")
        return real(loc, *args, **kw)

    monkeypatch.setattr(call_tables, "write_file", dies)
    with pytest.raises(KeyboardInterrupt):
        merge_bucket(plan, str(run), 1, calls, settings_)
    monkeypatch.setattr(call_tables, "write_file", real)
    with connect(tmp_path / "wh") as con, pytest.raises(RuntimeError, match=r"bucket-00001.json: merge bucket 1"):
        commit_merge(con, plan, str(run), calls)
    merge_bucket(plan, str(run), 1, calls, settings_)  # the retry, alone
    leftovers = [p.name for p in Path(tmp_path / "wh" / "calls").rglob("*") if ".tmp-" in p.name]
    assert leftovers == []
    with connect(tmp_path / "wh") as con:
        commit_merge(con, plan, str(run), calls)
        tables = {name: con.execute(query).fetchall() for name, query in PER_CALL.items()}
    assert tables["ledger"] == one["tables"]["ledger"] and tables["rejects"] == one["tables"]["rejects"]
    assert tables["rollouts"] == one["tables"]["rollouts"]
    assert {p.name for p in (tmp_path / "wh" / "calls" / "ledger" / f"ds={DS}" / "run=r1").iterdir()} == {
        f"bucket-{b:05d}.parquet" for b in range(3)
    }


def _flip(back: int):
    """One byte of the file's first column chunk inverted, `back` bytes before its end (a
    damaged disk): the last bytes are page data, which only the page's CRC tells damaged;
    further back, a page header."""

    def flip(path: Path) -> None:
        column = pq.read_metadata(path).row_group(0).column(0)
        start = column.dictionary_page_offset or column.data_page_offset
        data = bytearray(path.read_bytes())
        data[start + column.total_compressed_size - back] ^= 0xFF
        path.write_bytes(bytes(data))

    return flip


def _rewrite(path: Path, change) -> None:
    """The file rewritten by a tool with `change` applied to its table (an edit in place)."""
    pq.write_table(change(pq.read_table(path)), path)


def _edited_rewards(t):
    import pyarrow.compute as pc

    return t.set_column(t.schema.get_field_index("reward"), "reward", pc.add(t.column("reward"), 1.0))


# what is done to part 1's files between the part and the merge: the file, and what the error says
PART_DAMAGE = {
    "truncated": (
        "ledger.parquet",
        lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
        "not the file load part 1 wrote",
    ),
    "garbage of the same size": (
        "token_keys.parquet",
        lambda p: p.write_bytes(b"\x07" * p.stat().st_size),
        "damaged since it was written (Parquet magic bytes not found",
    ),
    "a byte of page data inverted": ("ledger.parquet", _flip(2), "CRC checksum verification failed"),
    "a byte of the rollouts, read whole, inverted": ("rollouts.parquet", _flip(2), "not the file load part 1 wrote"),
    "rewards edited": (
        "rollouts.parquet",
        lambda p: _rewrite(p, _edited_rewards),
        "not the file load part 1 wrote",
    ),
    "a row dropped": (
        "rollouts.parquet",
        lambda p: _rewrite(p, lambda t: t.slice(0, t.num_rows - 1)),
        "not the file load part 1 wrote",
    ),
    "gone": ("ledger_keys.parquet", lambda p: p.unlink(), "written by load part 1, now missing"),
    "marker not JSON": ("part.json", lambda p: p.write_text("{not json"), "marker of load part 1 of 2 is unreadable"),
    "marker of another shape": ("part.json", lambda p: p.write_text("[1, 2]"), "is not a JSON object"),
    "marker counts edited": (
        "part.json",
        lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "rollout_lines": 11})),
        "the marker of load part 1 of 2 was changed since load part 1 of 2 wrote it",
    ),
}


@pytest.mark.parametrize("case", list(PART_DAMAGE))
def test_a_part_file_changed_since_its_part_wrote_it_stops_the_merge_naming_it(tmp_path, case):
    """Each part records the size and SHA-256 of every file it writes (and each page carries
    its CRC): the merge checks them before it reads, so a file damaged, truncated, edited or
    gone since, or a marker that does not parse, is one InputError (exit 2) naming it,
    never an internal error and never a night built from it."""
    from reassembler.errors import InputError

    inp = _damaged(tmp_path / "in", 7, None)
    settings_ = Settings(load_parts=2, merge_buckets=2, allow_empty=True)
    plan = plan_parts(find_night(inp, DS), 2, settings_.buckets)
    run = tmp_path / "run"
    write_plan(str(run), plan)
    for k in range(2):
        part_load.load_part(plan, k, str(run), settings_)
    name, damage, said = PART_DAMAGE[case]
    target = Path(part_folder(str(run), 1)) / name
    damage(target)
    with pytest.raises(InputError) as raised:
        merge_night(plan, str(run), (str(tmp_path / "wh"), "r1"), settings_)
    message = str(raised.value)
    assert message.startswith(f"{target}: ") and "\n" not in message and message.endswith("run the load again")
    assert said in message


def test_a_load_plan_that_does_not_parse_is_one_line_naming_it(tmp_path):
    from reassembler.errors import InputError
    from reassembler.load.parts import plan_location

    run = tmp_path / "run"
    write_plan(str(run), plan_parts(find_night(_damaged(tmp_path / "in", 7, None), DS), 1))
    where = Path(plan_location(str(run)))
    for text in ("{not json", "[]", '{"version": 2}'):
        where.write_text(text)
        with pytest.raises(InputError, match=rf"^{where}: the load plan .*; plan the load again$"):
            read_plan(str(run))


WIDE_TABLE = (  # 100,000 rows of ~2 KB (200 MB), keys repeated, one in 997 null
    "CREATE TABLE r AS SELECT CAST(NULL AS DATE) AS ds, "
    "CASE WHEN i % 997 = 0 THEN NULL ELSE (i * 7919) % 50000 END AS seq, "
    "repeat('x', 2000) || i AS items FROM range(100000) t(i)"
)


def test_wide_rows_are_written_in_key_order_within_the_memory_limit(tmp_path):
    """The global step writes the night's rollout rows in rollout_seq order. DuckDB 2.0
    streaming a table of wide rows ORDER BY its key runs out of memory whatever the batch
    (160,000 rollouts stopped a night at the default 128MB); `write_in_order` sorts the keys,
    then the rows a range of keys at a time: the same order (nulls last, ties kept
    together), every row, within a limit the whole sort passes."""
    import duckdb
    import pyarrow.parquet as pq

    from reassembler.merge.staging import write_in_order

    con = duckdb.connect(config={"memory_limit": "64MB", "threads": 2, "temp_directory": str(tmp_path / "spill")})
    con.execute(WIDE_TABLE).fetchall()
    with pytest.raises(duckdb.OutOfMemoryException):
        for _ in con.sql("SELECT * EXCLUDE (ds) FROM r ORDER BY seq").to_arrow_reader(1024):
            pass
    con = duckdb.connect(config={"memory_limit": "64MB", "threads": 2, "temp_directory": str(tmp_path / "spill2")})
    con.execute(WIDE_TABLE).fetchall()
    assert write_in_order(con, str(tmp_path / "r.parquet"), "r", "seq", rows=4096) == 100_000
    seqs = pq.read_table(tmp_path / "r.parquet", columns=["seq"]).column("seq").to_pylist()
    nulls = seqs.count(None)
    assert nulls == 101 and seqs[-nulls:] == [None] * nulls
    assert seqs[:-nulls] == sorted(seqs[:-nulls])


def test_a_buckets_per_call_files_are_written_in_order_within_the_memory_limit(tmp_path, monkeypatch):
    """A merge bucket writes its ledger and reject rows sorted by rollout (the order the
    views' readers find one rollout by): 100,000 wide ledger rows and as many rejects,
    which DuckDB 2.0 cannot sort whole at 64MB, are written in order (nulls last) with
    every row (wide_sort.py)."""
    import duckdb
    import pyarrow.parquet as pq

    from reassembler import call_tables, wide_sort

    sorted_rows: list[int] = []  # each sort's rows: a bucket at a time, never a table whole
    real = wide_sort.sort_rows
    monkeypatch.setattr(wide_sort, "sort_rows", lambda t, order: sorted_rows.append(t.num_rows) or real(t, order))
    con = duckdb.connect(config={"memory_limit": "64MB", "threads": 2, "temp_directory": str(tmp_path / "spill")})
    call_tables.open_night(con)
    con.execute(
        "INSERT INTO temp.ledger (ds, rollout_id, capture_seq, model_call_id, staging_key, extras_digest) "
        "SELECT DATE '2026-11-28', 'r' || ((i * 7919) % 5000), (i * 31) % 1000, "
        "'c' || i, 'k' || i, repeat('x', 2000) FROM range(100000) t(i)"
    )
    con.execute(
        "INSERT INTO temp.rejects (ds, source, file, line, error, raw) "
        "SELECT DATE '2026-11-28', 'ledger', 'f' || (i % 7), "
        "CASE WHEN i % 997 = 0 THEN NULL ELSE (i * 7919) % 100000 END, "
        "'bad', repeat('y', 2000) "
        "FROM range(100000) t(i)"
    )
    written = call_tables.write_bucket(con, str(tmp_path / "out"), DS, "r1", "bucket-00000.parquet")
    assert written == {"ledger": 100_000, "token_rows": 0, "rejects": 100_000, "rollout_items": 0}
    assert len(sorted_rows) >= 2 * 100_000 // call_tables.SORT_ROWS and max(sorted_rows) <= call_tables.SORT_ROWS
    ledger = pq.read_table(
        f"{call_tables.night_folder(str(tmp_path / 'out'), 'ledger', DS, 'r1')}/bucket-00000.parquet",
        columns=["rollout_id", "capture_seq"],
    ).to_pylist()
    keys = [(r["rollout_id"], r["capture_seq"]) for r in ledger]
    assert keys == sorted(keys)
    rejects = pq.read_table(
        f"{call_tables.night_folder(str(tmp_path / 'out'), 'rejects', DS, 'r1')}/bucket-00000.parquet",
        columns=["file", "line"],
    ).to_pylist()
    keys = [(r["file"], r["line"] is None, r["line"] or 0) for r in rejects]
    assert keys == sorted(keys) and sum(k[1] for k in keys) == 101  # nulls last within a file


def _marker_edit(change, reseal: bool = False):
    """A marker edited by hand (`reseal`: and sealed again, as a step with a bug would write it)."""
    from reassembler.load.parts import sealed

    def edit(path: Path) -> None:
        marker = json.loads(path.read_text())
        change(marker)
        path.write_bytes(sealed(marker)) if reseal else path.write_text(json.dumps(marker))

    return edit


# what is done to the merge's own files (under load/merge/) before the step that reads them:
# the file, the damage, the reader ("bucket": a rollout bucket run again; "load": the commit;
# "shard": a shard's sort of its calls out of the buckets), and what the one-line error says
MERGE_DAMAGE = {
    "a page byte of a bucket's calls inverted": (
        "bucket-00000/calls.parquet", _flip(2), "shard", "CRC checksum verification failed"),
    "a page byte of a bucket's items inverted": (
        "bucket-00001/items.parquet", _flip(2), "shard", "CRC checksum verification failed"),
    "a bucket's calls truncated": (
        "bucket-00000/calls.parquet", lambda p: p.write_bytes(p.read_bytes()[:-100]), "shard",
        "not the file merge bucket 0 wrote"),
    "another bucket's calls": (
        "bucket-00000/calls.parquet", lambda p: shutil.copy(p.parent.parent / "bucket-00001" / "calls.parquet", p),
        "shard", "not the file merge bucket 0 wrote"),
    "a page byte of the global step's rollouts inverted": (
        "rollouts.parquet", _flip(2), "load", "not the file the merge's global step wrote"),
    "the groups gone": (
        "groups.parquet", lambda p: p.unlink(), "load", "written by the merge's global step, now missing"),
    "a bucket's rejected ledger lines edited": (
        "bucket-00001/rollout_rejects.parquet", lambda p: _rewrite(p, lambda t: t.slice(0, 0)), "load",
        "not the file merge bucket 1 wrote"),
    "a key bucket's matches replaced by another's": (
        "keys-00001.parquet", lambda p: shutil.copy(p.parent / "keys-00000.parquet", p), "bucket",
        "not the file key bucket 1 wrote"),
    "the decisions gone": (
        "decisions.parquet", lambda p: p.unlink(), "bucket", "written by the merge's global step, now missing"),
    "a bucket marker with a count written as text": (
        "bucket-00000.json", _marker_edit(lambda m: m.update(ledger_lines=str(m["ledger_lines"]))), "load",
        "the marker of merge bucket 0 was changed since merge bucket 0 wrote it"),
    "a key marker without its files": (
        "keys-00000.json", _marker_edit(lambda m: m.pop("files")), "bucket",
        "the marker of key bucket 0 was changed since key bucket 0 wrote it"),
    "a bucket marker resealed with a count as text": (
        "bucket-00000.json", _marker_edit(lambda m: m.update(ledger_lines=str(m["ledger_lines"])), reseal=True),
        "load", "the marker of merge bucket 0 records ledger_lines '"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MERGE_DAMAGE))
def test_a_merge_file_changed_since_its_step_wrote_it_stops_the_night_naming_it(tmp_path, case):
    """Every step of the merge records what it hands on (size, SHA-256, its footer's SHA-256)
    and every page carries its CRC: the step that reads a file checks it first, so a file
    damaged, truncated, replaced by another bucket's or gone, or a marker whose counts are not
    counts, is one InputError (exit 2) naming it, never an internal error and never a night
    published from it."""
    from reassembler.build import load_step
    from reassembler.errors import InputError
    from reassembler.merge.keys import merge_keys
    from reassembler.merge.night_load import PartsLoaded
    from reassembler.publish.staged import staging_dir
    from reassembler.warehouse import Warehouse
    from steps import shard

    inp, out = _damaged(tmp_path / "in", 7, None), tmp_path / "out"
    settings_ = Settings(load_parts=2, merge_buckets=2, shards=2, allow_empty=True)
    plan = plan_parts(find_night(inp, DS), 2, settings_.buckets)
    run_id = "run-1"
    run = staging_dir(str(out), DS, run_id)
    write_plan(run, plan)
    for k in range(2):
        part_load.load_part(plan, k, run, settings_)
    calls = (str(out), "run-1")
    merge_rollouts(plan, run, calls, settings_)
    for b in range(2):
        merge_keys(plan, run, b, calls, settings_)
    for b in range(2):
        merge_bucket(plan, run, b, calls, settings_)
    name, damage, reader, said = MERGE_DAMAGE[case]
    target = Path(run) / "load" / "merge" / name
    if reader == "shard":
        load_step(PartsLoaded(run, settings_), Warehouse(out, settings_.duckdb), run_id)
    damage(target)
    with pytest.raises(InputError) as raised:
        if reader == "bucket":
            merge_bucket(plan, run, 1, calls, settings_)
        elif reader == "load":
            load_step(PartsLoaded(run, settings_), Warehouse(out, settings_.duckdb), run_id)
        else:
            for k in range(2):
                shard(out, DS, k, run_id, settings_)
    message = str(raised.value)
    assert message.startswith(f"{target}: ") and "\n" not in message and message.endswith("run the load again")
    assert said in message, message
    assert not (out / "rows").exists()
