"""Reading a night: rejects, NeMo Gym's own layout, every accepted column type, and the
one-line errors for unusable input."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nights import DS, worked_example
from reassembler.build import build_night
from reassembler.errors import InputError
from reassembler.formats.night import find_night
from reassembler.merge.run import load_night
from reassembler.producer.capture import TOKEN_FILE_VARIANTS, write_jsonl, write_token_file
from reassembler.warehouse import connect


def test_every_accepted_column_type_gives_the_same_rows(tmp_path, night):
    worked_example(night, "grp_g0", compaction=True, reward=1.0)
    worked_example(night, "grp_g1", compaction=False, reward=0.5)
    results = []
    for i, variant in enumerate(TOKEN_FILE_VARIANTS):
        inp = night.write(variant)
        out = tmp_path / f"out{i}"
        build_night(inp, out, DS)
        results.append(pq.read_table(out / "rows" / f"ds={DS}").to_pylist())
    assert all(r == results[0] for r in results) and len(results[0]) == 3


def test_mixed_types_across_files_in_one_night(tmp_path, night):
    worked_example(night, "grp_g0", compaction=True)
    worked_example(night, "grp_g1", compaction=False)
    inp = night.write()
    part = inp / "tokens" / f"ds={DS}"
    (part / "tokens.parquet").unlink()
    for i, variant in enumerate(TOKEN_FILE_VARIANTS):  # each file typed on its own
        rows = [t for k, t in enumerate(night.tokens) if k % len(TOKEN_FILE_VARIANTS) == i]
        write_token_file(part / f"t{i}.parquet", rows, variant)
    summary = build_night(inp, tmp_path / "out", DS)
    assert summary.numbers.ok_rollouts == 2 and summary.numbers.n_rows == 3


def test_nemo_gym_layout_loads_as_written(tmp_path, night):
    """One <rollout_id>.lineage.jsonl per rollout in server subfolders, rows without
    rollout_id, staging_digest beside an unrelated digest, opaque staging keys,
    response.output instead of output."""
    ledger, tokens = worked_example(night, "grp_g0", compaction=True, reward=1.0)
    for row, tok in zip([r for r in ledger], tokens):
        key = f"opaque-{abs(hash(row['model_call_id'])):x}"
        row["staging_key"] = tok["staging_key"] = key
        row["staging_digest"] = row["digest"]
        row["digest"] = "f" * 64  # Gym's digest field means something else
        del row["rollout_id"]
    record = night.rollouts[0]
    record["response"] = {"id": "resp_1", "output": record.pop("output")}
    base = tmp_path / "input"
    write_jsonl(base / "rollouts" / f"ds={DS}" / "results.jsonl", night.rollouts)
    write_jsonl(base / "ledger" / f"ds={DS}" / "policy-a" / "grp_g0.lineage.jsonl", ledger)
    write_token_file(base / "tokens" / f"ds={DS}" / "t.parquet", night.tokens)
    summary = build_night(base, tmp_path / "out", DS)
    assert summary.numbers.ok_rollouts == 1 and summary.numbers.n_rows == 2
    assert summary.load.n_rejects == 0


def test_bad_lines_become_reject_rows_and_never_stop_the_night(tmp_path, night):
    worked_example(night, "grp_g0", compaction=True, reward=1.0)
    ledger, _ = worked_example(night, "grp_g1", compaction=False, reward=0.0)
    ledger[3]["prev_len"] = "9"  # c4: wrong type -> reject; its rollout is masked
    inp = night.write()
    with open(inp / "rollouts" / f"ds={DS}" / "rollouts.jsonl", "a") as fh:
        fh.write("{not json\n")
        fh.write(json.dumps({"rollout_id": "grp_g0", "group_id": "grp", "slot": 5, "reward": 1, "output": []}) + "\n")
        fh.write(json.dumps({"group_id": "grp", "slot": 6, "reward": 1, "output": []}) + "\n")
    with open(inp / "ledger" / f"ds={DS}" / "ledger.jsonl", "a") as fh:
        fh.write("[1, 2]\n")
        fh.write(
            json.dumps(
                {"rollout_id": "nobody_g0", "model_call_id": "z", "parent_call_id": None, "failure_reason": "lost"}
            )
            + "\n"
        )
    out = tmp_path / "out"
    summary = build_night(inp, out, DS)
    with connect(out, read_only=True) as con:
        rejects = con.execute("SELECT source, file, line, error FROM rejects ORDER BY source, line").fetchall()
        audit = dict(con.execute("SELECT rollout_id, reason FROM audit").fetchall())
    rollout_rejects = [r for r in rejects if r[0] == "rollouts"]
    assert [r[1:3] for r in rollout_rejects] == [("rollouts.jsonl", 3), ("rollouts.jsonl", 4), ("rollouts.jsonl", 5)]
    assert "not valid JSON" in rollout_rejects[0][3]
    assert "already seen" in rollout_rejects[1][3] and "rollout_id is missing" in rollout_rejects[2][3]
    ledger_rejects = [r for r in rejects if r[0] == "ledger"]
    assert [r[2] for r in ledger_rejects] == [9, 11, 12]
    assert "prev_len must be an integer" in ledger_rejects[0][3]
    assert "no rollout record for rollout_id nobody_g0" in ledger_rejects[2][3]
    # the token row of the rejected ledger line is asked for by no one: counted too
    assert [r[1:] for r in rejects if r[0] == "tokens"] == [
        ("tokens.parquet", 8, "token row matches no ledger staging_key")
    ]
    assert summary.load.n_rejects == len(rejects) == 7
    assert audit == {"grp_g0": None, "grp_g1": "invalid_record"}


def test_orphan_token_rows_are_counted_as_rejects(tmp_path, night):
    worked_example(night, "grp_g0")
    night.tokens.append(dict(night.tokens[0], staging_key="nobody/asks"))
    summary = build_night(night.write(), tmp_path / "out", DS)
    assert summary.load.n_rejects == 1 and summary.numbers.ok_rollouts == 1


def test_missing_partition_folder_is_a_usage_error(tmp_path, night):
    inp = night.write()
    with pytest.raises(InputError, match=r"rollouts/ds=2026-11-27: input partition folder is missing"):
        find_night(inp, "2026-11-27")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.write_bytes(b"PAR1 this is not parquet"), "tokens.parquet: unreadable Parquet file"),
        (
            lambda p: pq.write_table(pq.read_table(p).drop_columns(["chain_hash"]), p),
            "tokens.parquet: token file has no column chain_hash",
        ),
        (
            lambda p: pq.write_table(
                pq.read_table(p).set_column(
                    17, "token_mask_delta", pa.array([["x"]] * pq.read_table(p).num_rows, pa.list_(pa.string()))
                ),
                p,
            ),
            "tokens.parquet: column token_mask_delta has type list<element: string>",
        ),
    ],
)
def test_unusable_token_file_stops_the_night_naming_the_file(tmp_path, night, damage, message):
    worked_example(night, "grp_g0")
    inp = night.write()
    damage(inp / "tokens" / f"ds={DS}" / "tokens.parquet")
    with pytest.raises(InputError, match=message):
        build_night(inp, tmp_path / "out", DS)
    assert not (tmp_path / "out" / "rows").exists()


def test_reload_replaces_the_night_instead_of_appending(tmp_path, night):
    worked_example(night, "grp_g0")
    inp = night.write()
    with duckdb.connect(str(tmp_path / "w.duckdb")) as con:
        con.close()
    with connect(tmp_path / "out") as con:
        for _ in range(2):
            load_night(con, find_night(inp, DS))
        assert con.execute("SELECT count(*) FROM ledger").fetchone()[0] == 5
        assert con.execute("SELECT count(*) FROM rollouts").fetchone()[0] == 1


def test_a_load_without_a_run_folder_leaves_nothing_in_the_temporary_folder(tmp_path, night, monkeypatch):
    """A load given no run folder (a library caller, the tests) works in a temporary one,
    which goes once the load is done or failed; an in-memory warehouse's views read the
    night's per-call rows from it, so there it goes with the connection."""
    import gc
    import tempfile

    worked_example(night, "grp_g0")
    inp = night.write()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with connect(tmp_path / "out") as con:
        load_night(con, find_night(inp, DS))
        assert con.execute("SELECT count(*) FROM ledger").fetchone()[0] == 5
    assert list(scratch.glob("reassembler-load-*")) == []
    with pytest.raises(InputError), connect(tmp_path / "out") as con:
        load_night(con, find_night(tmp_path / "nothing", DS))
    assert list(scratch.glob("reassembler-load-*")) == []
    from reassembler.warehouse import migrate

    con = duckdb.connect()
    migrate(con)
    load_night(con, find_night(inp, DS))
    assert con.execute("SELECT count(*) FROM ledger").fetchone()[0] == 5  # read from the folder
    assert len(list(scratch.glob("reassembler-load-*"))) == 1
    con.close()
    del con
    gc.collect()
    assert list(scratch.glob("reassembler-load-*")) == []


def test_a_damaged_data_page_is_a_one_line_error_not_a_traceback(tmp_path, night, capsys):
    from reassembler.cli import main

    worked_example(night, "grp_g0")
    inp = night.write()
    path = inp / "tokens" / f"ds={DS}" / "tokens.parquet"
    data = bytearray(path.read_bytes())
    middle = len(data) // 3
    data[middle : middle + 200] = b"\xff" * 200  # the footer survives, a data page does not
    path.write_bytes(bytes(data))
    assert main(["build", "--input", str(inp), "--output", str(tmp_path / "out"), "--ds", DS]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("reassembler: error: ") and "tokens.parquet" in err and "\n" not in err
    assert not (tmp_path / "out" / "rows").exists()


def test_nemo_gym_result_lines_get_their_ids_derived(tmp_path):
    """CONTRACT.md 2.1: rollout_id, group_id and slot from _ng_* when a record lacks them."""
    gym = {"reward": 1.0, "response": {"id": "resp_1", "output": []}}
    lines = [
        dict(gym, _ng_task_index=3, _ng_rollout_index=1),  # 3-1
        dict(gym, _ng_task_index=3, _ng_rollout_index=1, _ng_attempt_index=1),  # 3-1-a1
        dict(gym, _ng_task_index=3, _ng_rollout_index=2, _ng_attempt_index=0),  # 3-2
        dict(gym, _ng_task_index=10, _ng_rollout_index=0, _ng_rollout_id="job7.t10.r0"),
        dict(gym, rollout_id="mine", _ng_task_index=4, _ng_rollout_index=5),  # only group, slot derived
        dict(gym, rollout_id="given", group_id="g", slot=0, _ng_task_index=True),  # all given: not checked
        dict(gym, _ng_task_index=3, _ng_rollout_index=1, reward=0.0),  # 3-1 again: first wins
        dict(gym, _ng_task_index=True, _ng_rollout_index=1),
        dict(gym, _ng_task_index=3, _ng_rollout_index=-1),
        dict(gym, _ng_rollout_id="no spaces!", _ng_task_index=3, _ng_rollout_index=7),
        dict(gym, _ng_rollout_id="job8", slot=2),  # no task: no group
        dict(gym),
    ]
    base = tmp_path / "input"
    write_jsonl(base / "rollouts" / f"ds={DS}" / "part-000.jsonl", lines)
    (base / "ledger" / f"ds={DS}").mkdir(parents=True)
    (base / "tokens" / f"ds={DS}").mkdir(parents=True)
    with connect(tmp_path / "out") as con:
        load_night(con, find_night(base, DS))
        rollouts = con.execute(
            "SELECT rollout_id, group_id, slot, reward FROM rollouts ORDER BY rollout_seq"
        ).fetchall()
        rejects = con.execute("SELECT line, error FROM rejects ORDER BY line").fetchall()
    assert rollouts == [
        ("3-1", "3", 1, 1.0),
        ("3-1-a1", "3", 1, 1.0),
        ("3-2", "3", 2, 1.0),
        ("job7.t10.r0", "10", 0, 1.0),
        ("mine", "4", 5, 1.0),
        ("given", "g", 0, 1.0),
    ]
    assert [line for line, _ in rejects] == [7, 8, 9, 10, 11, 12]
    errors = [e for _, e in rejects]
    assert "rollout_id 3-1 already seen" in errors[0]
    assert errors[1].startswith("_ng_task_index must be an integer >= 0")
    assert errors[2].startswith("_ng_rollout_index must be an integer >= 0")
    assert errors[3].startswith("_ng_rollout_id must match")
    assert errors[4].startswith("group_id is missing")
    assert errors[5].startswith("rollout_id is missing")


def test_a_shards_plan_lists_the_token_row_groups_in_the_order_it_first_needs_them(tmp_path, night):
    """Three rollouts whose token rows are written last rollout first, four rows a row group
    (5 calls each: groups of rows 0-3, 4-7, 8-11, 12-14), and a second file holding the
    middle rollout's last call. The shard reads g_g0, g_g1, g_g2 in order, so it needs
    tokens.parquet's row groups 2 and 3, then 1, the other file, then 0: each listed once,
    where it is first needed, with all the rows it takes from it."""
    from reassembler.load.shard_plan import plan_dir
    from reassembler.merge.pieces import build_calls
    from reassembler.publish.protocol import staging_dir
    from steps import load

    for k in range(3):
        worked_example(night, f"g_g{k}", reward=float(k))
    inp = night.write()
    rows = night.tokens
    by_rollout = [[r for r in rows if r["rollout_id"] == f"g_g{k}"] for k in range(3)]
    moved = by_rollout[1].pop()  # g_g1's c5, alone in another file
    folder = inp / "tokens" / f"ds={DS}"
    (folder / "tokens.parquet").unlink()
    write_token_file(folder / "tokens.parquet", by_rollout[2] + by_rollout[1] + by_rollout[0], row_group_size=4)
    write_token_file(folder / "tokens-more.parquet", [moved])
    out = tmp_path / "out"
    load(inp, out, DS, run_id="r")
    build_calls(staging_dir(out, DS, "r"), 0)  # the shard's own first step
    plan = plan_dir(staging_dir(out, DS, "r"), 0)
    groups = pq.read_table(f"{plan}/token_groups.parquet").to_pylist()
    main, more = str(folder / "tokens.parquet"), str(folder / "tokens-more.parquet")
    # tokens.parquet: g_g2's rows 0-4, g_g1's 5-8, g_g0's 9-13; row groups 0-3, 4-7, 8-11, 12-13
    assert [(g["file"], g["row_group"], g["rows"]) for g in groups] == [
        (main, 2, 4),  # g_g0's rows 9-11, later g_g1's row 8
        (main, 3, 2),  # g_g0's rows 12-13
        (main, 1, 4),  # g_g1's rows 5-7, later g_g2's row 4
        (more, 0, 1),  # g_g1's c5
        (main, 0, 4),  # g_g2's rows 0-3
    ]
