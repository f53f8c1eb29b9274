"""OpenPipe ART trajectory Parquet (CONTRACT.md 13), as far as it is read today: the night
ART's own code wrote (tests/data/art-0.5.23/), each exchange trajectory's rows equal to the
branches and first-occurrence masks ART's own training code derives (art_reference.json) and
to the rows section 13 asks for (expected.json); the checks of 13.4 with tokens written out.
Not read yet (issue 62): legacy messages_and_choices trajectories, the load, --layout art."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from reassembler.formats.art import read_trajectory
from reassembler.formats.art_files import VERSION, VERSION_KEY, decode

DATA = Path(__file__).parent / "data" / "art-0.5.23"
MODEL = DATA / "night" / ".art" / "reassembler-fixture" / "models" / "agent-001-run"
EXPECTED = {r["rollout_id"]: r for r in json.loads((DATA / "expected.json").read_text())["rollouts"]}
REFERENCE = json.loads((DATA / "art_reference.json").read_text())


def _trajectories() -> dict[str, tuple[dict, float]]:
    """Every trajectory of the night by rollout id (13.3 under --layout art), with its reward column."""
    out = {}
    for step in ("0001", "0002"):
        table = pq.read_table(MODEL / "trajectories" / "train" / f"{step}.parquet")
        assert table.schema.metadata[VERSION_KEY].decode() == VERSION
        for row in table.to_pylist():
            if row["trajectory_index"] is None:
                continue  # an empty group's sentinel row
            rid = f"agent-001-run/train/{step}/g{row['group_index']}/t{row['trajectory_index']}"
            out[rid] = (decode(row["trajectory_json"]), row["reward"])
    return out


TRAJECTORIES = _trajectories()


@pytest.mark.parametrize("rid", list(EXPECTED))
def test_each_trajectory_reads_as_section_13_expects(rid):
    want = EXPECTED[rid]
    got = read_trajectory(*TRAJECTORIES[rid])
    if want["status"] == "masked":
        assert (got.reason.value, got.call_id) == (want["reason"], want["failed_call_id"]), got.detail
        assert got.rows == []
        return
    assert got.reason is None, got.detail
    assert len(got.rows) == len(want["rows"])
    for row, w in zip(got.rows, want["rows"]):
        assert row.ids.tolist() == w["input_ids"]
        assert row.mask.tolist() == w["loss_mask"]
        assert np.array_equal(row.logprobs, np.asarray(w["logprobs"], np.float32))
        assert row.prompt_len == w["prompt_len"]
        if "model_call_ids" in w:  # exchange trajectories
            assert row.call_ids == w["model_call_ids"]
    assert got.policy == (want["weight_version_min"], want["weight_version_max"])


def _reference_trajectories():
    for f in REFERENCE["files"]:
        for g in f["groups"]:
            for t in g["trajectories"]:
                rid = f"agent-001-run/train/{f['step']:04d}/g{g['group_index']}/t{t['trajectory_index']}"
                yield rid, t


@pytest.mark.parametrize("rid", [rid for rid, t in _reference_trajectories() if t["kind"] == "exchanges"])
def test_the_rows_are_the_branches_arts_own_code_trains_with_its_mask(rid):
    """Every branch ART builds that holds a token it trains is a row, in ART's order: its
    tokens, its first-occurrence mask, its log probabilities on that mask."""
    t = dict(_reference_trajectories())[rid]
    got = read_trajectory(*TRAJECTORIES[rid])
    if got.reason is not None:  # ART raises for the whole batch here; this rollout alone is masked
        assert EXPECTED[rid]["status"] == "masked"
        return
    trained = [b for b in t["art_branches"]["branches"] if any(b["sampled_first_occurrence_mask"])]
    assert [r.ids.tolist() for r in got.rows] == [b["tokens"] for b in trained]
    assert [r.mask.astype(int).tolist() for r in got.rows] == [b["sampled_first_occurrence_mask"] for b in trained]
    for r, b in zip(got.rows, trained):
        on = np.asarray(b["sampled_first_occurrence_mask"], bool)
        assert np.allclose(r.logprobs[on], np.asarray(b["logprobs"], float)[on], atol=1e-6)


# ---------------------------------------------------------------- 13.4, tokens written out


def _exchange(k: int, prompt: list[int], out: list[int], messages: list[dict], logprobs=None, model="agent@1", n=1):
    lp = logprobs if logprobs is not None else [-0.5] * len(out)
    choice = {
        "index": 0,
        "finish_reason": "stop",
        "token_ids": out,
        "logprobs": {"content": [{"token": f"token_id:{i}", "logprob": v} for i, v in zip(out, lp)]},
        "message": {"role": "assistant", "content": f"answer {k}"},
    }
    choices = [dict(copy.deepcopy(choice), index=i) for i in range(n)]
    return {
        "start_time": f"2026-01-01T00:00:0{k}Z",
        "end_time": f"2026-01-01T00:00:0{k}.5Z",
        "request": {"model": model, "messages": messages, "temperature": 0.7},
        "response": {"choices": choices, "prompt_token_ids": prompt},
    }


SYSTEM, USER = {"role": "system", "content": "s"}, {"role": "user", "content": "u"}


def _two_calls() -> dict:
    """c0: [1 2] -> [3 4]; c1 extends it: [1 2 3 4 5] -> [6 7]."""
    first = _exchange(0, [1, 2], [3, 4], [SYSTEM, USER])
    second = _exchange(
        1,
        [1, 2, 3, 4, 5],
        [6, 7],
        [SYSTEM, USER, {"role": "assistant", "content": "answer 0"}, {"role": "user", "content": "more"}],
    )
    return {
        "exchanges": {"chat_completions": [first, second]},
        "reward": 1.0,
        "initial_policy_version": 3,
        "final_policy_version": 4,
    }


def test_two_calls_of_one_branch_are_one_row_training_both_outputs():
    got = read_trajectory(_two_calls(), 1.0)
    [row] = got.rows
    assert (row.ids.tolist(), row.mask.tolist()) == ([1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 0, 1, 1])
    assert row.logprobs.tolist() == [0, 0, -0.5, -0.5, 0, -0.5, -0.5]
    assert (row.prompt_len, row.call_ids, got.policy, got.agent, got.temperature) == (
        2,
        ["c0", "c1"],
        (3, 4),
        "agent@1",
        0.7,
    )


def _masked(t, reward=1.0):
    got = read_trajectory(t, reward)
    return (got.reason.value, got.call_id) if got.reason else (None, None)


def test_each_check_of_13_4_masks_with_its_reason_and_call():
    t = _two_calls()
    t["exchanges"]["chat_completions"][1]["response"]["choices"][0].pop("token_ids")
    t["exchanges"]["chat_completions"][1]["response"]["choices"][0]["logprobs"]["content"][0]["token"] = "x"
    assert _masked(t) == ("missing_tokens", "c1")  # a call without ids
    t = _two_calls()
    t["exchanges"]["chat_completions"][0]["response"].pop("prompt_token_ids")
    assert _masked(t) == ("missing_tokens", "c0")
    t = _two_calls()
    t["exchanges"]["chat_completions"][1]["response"]["choices"][0]["token_ids"] = [6, 8]
    assert _masked(t) == ("field_mismatch", "c1")  # token_ids and token_id:N disagree
    t = _two_calls()
    t["exchanges"]["chat_completions"][1]["response"]["choices"][0]["logprobs"]["content"][1]["logprob"] = None
    assert _masked(t) == ("invalid_logprob", "c1")  # ids without a log probability on a trained token
    t = _two_calls()
    t["exchanges"]["chat_completions"][1]["request"]["model"] = "agent@2"
    assert _masked(t) == ("field_mismatch", None)  # two training-model names
    assert _masked({"reward": 1.0}) == ("missing_tokens", None)  # no call
    assert _masked(_two_calls(), float("nan")) == ("invalid_reward", None)
    assert _masked(_two_calls(), 0.5) == ("field_mismatch", None)  # the column differs from the JSON
    t = _two_calls()
    t["exchanges"]["chat_completions"][0]["response"]["choices"][0]["token_ids"] = [3, 2**31]
    t["exchanges"]["chat_completions"][0]["response"]["choices"][0]["logprobs"]["content"][1]["token"] = (
        "token_id:2147483648"
    )
    assert _masked(t) == ("invalid_token", "c0")
    t = _two_calls()
    t["exchanges"]["chat_completions"][0]["response"]["choices"][0]["logprobs"]["content"] = [
        {"token": "three", "logprob": -0.5}
    ]  # tokens not written as token_id:N, one log probability for two ids
    assert _masked(t) == ("length_mismatch", "c0")
    t = _two_calls()
    t["messages_and_choices"] = [{"role": "user", "content": "u"}]
    assert _masked(t) == ("invalid_record", None)  # both kinds


def test_a_judges_calls_train_nothing_and_are_not_checked():
    t = _two_calls()
    judge = _exchange(
        2, [50, 51], [52], [{"role": "user", "content": "judge this"}], logprobs=[float("nan")], model="judge-model"
    )
    t["exchanges"]["chat_completions"].append(judge)
    got = read_trajectory(t, 1.0)
    assert got.reason is None and [r.ids.tolist() for r in got.rows] == [[1, 2, 3, 4, 5, 6, 7]]


def test_a_nan_on_a_sampled_token_an_earlier_branch_trains_is_context():
    """n=2 on the second call: both branches share c0's output; the second branch's copy of it
    is context, so its NaN there (as ART keeps it) is no failure."""
    t = _two_calls()
    second = t["exchanges"]["chat_completions"][1]
    second["response"]["choices"].append(dict(copy.deepcopy(second["response"]["choices"][0]), index=1))
    second["response"]["choices"][1]["token_ids"] = [6, 9]
    second["response"]["choices"][1]["logprobs"]["content"][1]["token"] = "token_id:9"
    got = read_trajectory(t, 1.0)
    assert got.reason is None, got.detail
    assert [r.mask.tolist() for r in got.rows] == [[0, 0, 1, 1, 0, 1, 1], [0, 0, 0, 0, 0, 0, 1]]
    assert [r.call_ids for r in got.rows] == [["c0", "c1.0"], ["c0", "c1.1"]]


# ---------------------------------------------------------------- the night, as a user builds it

DS = "2026-12-06"


def _built(out: Path) -> tuple[dict, list[dict]]:
    from conftest import read_partition

    return {a["rollout_id"]: a for a in read_partition(out, "audit", DS)}, read_partition(out, "rows", DS)


def _as_expected(audit: dict, rows: list[dict], terminal: bool = False) -> None:
    assert set(audit) == set(EXPECTED)
    for rid, want in EXPECTED.items():
        got = audit[rid]
        if terminal and want["status"] == "ok" and len(want["rows"]) > 1:
            assert (got["status"], got["reason"]) == ("masked", "history_rewritten")
            continue
        assert (got["capture"], got["evidence"]) == ("art", None if want["status"] == "masked" else "none")
        assert (got["status"], got["reason"], got["failed_call_id"]) == (
            want["status"],
            want.get("reason"),
            want.get("failed_call_id"),
        ), got["detail"]
        if want["status"] == "masked":
            continue
        if not terminal:
            assert got["advantage"] == pytest.approx(want["advantage"], abs=1e-9)
        meta = json.loads(got["metadata"])
        assert (meta["split"], meta.get("duplicate_of")) == ("train", want.get("duplicate_of"))
        mine = sorted((r for r in rows if r["rollout_id"] == rid), key=lambda r: r["segment_index"])
        assert len(mine) == len(want["rows"])
        for r, w in zip(mine, want["rows"]):
            assert (r["input_ids"], r["loss_mask"], r["prompt_len"]) == (
                w["input_ids"],
                w["loss_mask"],
                w["prompt_len"],
            )
            assert np.array_equal(np.float32(r["logprobs"]), np.float32(w["logprobs"]))
            assert (r["segment_index"], r["segment_count"]) == (w["segment_index"], w["segment_count"])
            assert r["model_call_ids"] == w.get("model_call_ids", r["model_call_ids"])
            assert (r["weight_version_min"], r["weight_version_max"]) == (
                want["weight_version_min"],
                want["weight_version_max"],
            )
            assert (r["env"], r["capture"], r["evidence"]) == ("reassembler-fixture", "art", "none")


@pytest.mark.parametrize("mode", ["select", "terminal"])
def test_the_command_builds_arts_model_folder_as_expected(tmp_path, mode):
    from commands import cli

    out = tmp_path / "out"
    res = cli("build", "--layout", "art", "--input", MODEL, "--output", out, "--ds", DS, "--mode", mode)
    assert res.returncode == 0, res.stderr
    _as_expected(*_built(out), terminal=mode == "terminal")
    res = cli("explain", "--output", out, "--ds", DS, "agent-001-run/train/0001/g1/t3")
    assert res.returncode == 0, res.stderr
    if mode == "terminal":
        assert "masked, history_rewritten: the trajectory has 2 trainable branches (rows)" in res.stdout
    else:
        assert "OpenPipe ART: row 1 is branch 1: calls c0, c1.1" in res.stdout, res.stdout
    assert (
        "branch 1: 41 tokens, 2 trained (9 sampled tokens trained on an earlier row: a shared prefix), calls c0, c1.1"
        in res.stdout
    )


def _model_copy(tmp_path: Path) -> Path:
    import shutil

    copy_ = tmp_path / "models" / "m"
    shutil.copytree(MODEL, copy_)
    return copy_


def test_layout_art_reads_the_train_steps_history_records_on_the_night(tmp_path):
    """history.jsonl decides: a step whose last train/ line is another day's is another night;
    a val/ line of the same step does not move it; a step with no line: the file's mtime."""
    from commands import cli

    model = _model_copy(tmp_path)
    lines = [json.loads(line) for line in (model / "history.jsonl").read_text().splitlines()]
    lines[1]["recorded_at"] = "2026-12-07T01:00:00"  # step 2 re-logged the next day
    lines.append({"val/reward": 0.5, "step": 1, "recorded_at": "2026-12-08T00:00:00"})  # a val line of step 1
    (model / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (model / "trajectories" / "val").mkdir()
    (model / "trajectories" / "val" / "0001.parquet").write_bytes(
        (model / "trajectories" / "train" / "0001.parquet").read_bytes()
    )
    res = cli("build", "--layout", "art", "--input", model, "--output", tmp_path / "a", "--ds", DS)
    assert res.returncode == 0, res.stderr
    audit, _ = _built(tmp_path / "a")
    assert {rid.split("/")[2] for rid in audit} == {"0001"} and len(audit) == 16
    assert all(rid.startswith("m/train/") for rid in audit)
    import os

    (model / "history.jsonl").write_text("")  # no line at all: each file's modification date
    for f in (model / "trajectories" / "train").iterdir():
        os.utime(f, (1_765_000_000, 1_765_000_000))  # 2025-12-06 UTC
    res = cli("build", "--layout", "art", "--input", model, "--output", tmp_path / "b", "--ds", "2025-12-06")
    assert res.returncode == 0, res.stderr
    assert len(cli_audit := __import__("conftest").read_partition(tmp_path / "b", "audit", "2025-12-06")) == 24
    assert all(a["capture"] == "art" for a in cli_audit)


def test_a_broken_file_or_row_is_a_reject_and_one_broken_trajectory_masks_itself(tmp_path):
    import pyarrow as pa

    from commands import cli

    model = _model_copy(tmp_path)
    train = model / "trajectories" / "train"
    table = pq.read_table(train / "0001.parquet")
    texts = table.column("trajectory_json").to_pylist()
    texts[0] = "[1, 2]"  # g0/t0: not a JSON object
    broken = json.loads(texts[1])
    choice = broken["exchanges"]["chat_completions"][0]["response"]["choices"][0]  # g0/t1's first call
    choice["token_ids"][0] = -3
    choice["logprobs"]["content"][0]["token"] = "token_id:-3"
    texts[1] = json.dumps(broken)
    table = table.set_column(
        table.schema.get_field_index("trajectory_json"), "trajectory_json", pa.array(texts, pa.large_string())
    )
    pq.write_table(table, train / "0001.parquet")
    other = table.replace_schema_metadata({b"art.trajectory_parquet.version": b"3"})
    pq.write_table(other, train / "0003.parquet")
    res = cli("build", "--layout", "art", "--input", model, "--output", tmp_path / "out", "--ds", DS)
    assert res.returncode == 0, res.stderr
    audit, _ = _built(tmp_path / "out")
    assert "m/train/0001/g0/t0" not in audit  # the copy's model folder is m
    assert (
        audit["m/train/0001/g0/t1"]["reason"],
        audit["m/train/0001/g0/t1"]["failed_call_id"],
    ) == ("invalid_token", "c0")
    assert audit["m/train/0001/g0/t2"]["status"] == "ok"
    import duckdb

    with duckdb.connect(str(tmp_path / "out" / "warehouse.duckdb"), read_only=True) as con:
        rejects = con.execute("SELECT file, line, error FROM rejects ORDER BY file, line").fetchall()
    assert rejects == [
        ("0001.parquet", 1, "trajectory_json is not a JSON object"),
        ("0003.parquet", 0, "ART trajectory Parquet version '3', this job reads 2"),
    ]


def test_a_call_under_another_tool_list_starts_a_branch_of_its_own():
    """c1 extends c0's messages and tokens but the tools changed: ART starts a new branch (the
    context differs); c0's output, trained on the first branch, is context on the second."""
    t = _two_calls()
    t["exchanges"]["chat_completions"][1]["request"]["tools"] = [{"type": "function", "function": {"name": "f"}}]
    got = read_trajectory(t, 1.0)
    assert [r.ids.tolist() for r in got.rows] == [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7]]
    assert [r.mask.tolist() for r in got.rows] == [[0, 0, 1, 1], [0, 0, 0, 0, 0, 1, 1]]
    assert got.n_roots == 2


def test_an_empty_groups_sentinel_row_is_neither_a_rollout_nor_a_reject(tmp_path):
    import pyarrow as pa

    from commands import cli

    model = _model_copy(tmp_path)
    path = model / "trajectories" / "train" / "0002.parquet"
    table = pq.read_table(path)
    sentinel = {name: [None] for name in table.column_names}
    sentinel.update(format_version=[2], group_index=[7], group_json=['{"trajectories": []}'])
    table = pa.concat_tables([table, pa.table(sentinel, schema=table.schema)])
    pq.write_table(table, path)
    assert pq.read_table(path).schema.metadata == table.schema.metadata
    res = cli("build", "--layout", "art", "--input", model, "--output", tmp_path / "out", "--ds", DS)
    assert res.returncode == 0, res.stderr
    audit, _ = _built(tmp_path / "out")
    assert len(audit) == 24 and not any("/g7/" in rid for rid in audit)
    import duckdb

    with duckdb.connect(str(tmp_path / "out" / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM rejects").fetchone() == (0,)


def test_a_night_mixing_art_files_with_nemo_gym_builds_each_as_alone(tmp_path):
    import shutil

    from conftest import night_outcome

    gym = Path(__file__).parent / "data" / "gym-0.7.0"
    gym_ds = json.loads((gym / "expected.json").read_text())["ds"]
    mixed, art = tmp_path / "mixed", tmp_path / "art"
    shutil.copytree(gym, mixed, ignore=shutil.ignore_patterns("expected.json", "README.md"))
    for root in (mixed, art):
        folder = root / "rollouts" / f"ds={gym_ds}"
        folder.mkdir(parents=True, exist_ok=True)
        for step in ("0001", "0002"):
            shutil.copy(MODEL / "trajectories" / "train" / f"{step}.parquet", folder / f"{step}.parquet")

    def outcome(root: Path, out: Path):
        return night_outcome(root, out, gym_ds)

    both_rows, both_audit = outcome(mixed, tmp_path / "out-mixed")
    gym_rows, gym_audit = outcome(gym, tmp_path / "out-gym")
    art_rows, art_audit = outcome(art, tmp_path / "out-art")
    assert len(art_audit) == 24 and {a["capture"] for a in art_audit.values()} == {"art"}
    assert "0001/g1/t3" in art_audit  # outside --layout art: the file's path is its key (13.3)
    assert both_rows == {**gym_rows, **art_rows} and gym_rows
    assert both_audit == {**gym_audit, **art_audit}


def test_arts_json_dialect_is_read_from_the_files_bytes():
    """orjson first, Python's json for ART's bare NaN / Infinity; bytes that are not UTF-8 are
    a ValueError (the row's reject), never another error."""
    import math

    assert decode(memoryview(b'{"a": [1, 2]}')) == {"a": [1, 2]}
    value = decode(memoryview(b'{"lp": NaN, "x": -Infinity}'))
    assert math.isnan(value["lp"]) and value["x"] == float("-inf")
    with pytest.raises(ValueError):
        decode(memoryview(b'{"a": "\xff"}'))
