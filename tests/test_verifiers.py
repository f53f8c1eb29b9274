"""PrimeIntellect verifiers 0.4.0 traces (CONTRACT.md 10): the night verifiers' own code wrote
(tests/data/verifiers-0.4.0/, its expected outcome taken from verifiers' own reader), each
check of 10.4 on a trace with its tokens written out, rows built as verifiers' branches,
the ids and groups of 10.3, a torn and an empty file, a night mixing verifiers with NeMo
Gym, the command line and explain."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from commands import cli, one_line_error
from conftest import night_outcome, read_partition
from reassembler.build import build_night
from reassembler.errors import InputError
from reassembler.producer.verifiers import episode, episode_line, prompt_node, sampled_node, trace
from reassembler.settings import Options, Settings

FIXTURE = Path(__file__).parent / "data" / "verifiers-0.4.0"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
DS = EXPECTED["ds"]
GYM = Path(__file__).parent / "data" / "gym-0.7.0"


def write_traces(root: Path, episodes: list, name: str = "traces.jsonl", ds: str = DS, tail: str = "") -> Path:
    """A night of one verifiers traces file (no ledger or tokens folder, as verifiers writes)."""
    folder = root / "rollouts" / f"ds={ds}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "a") as fh:
        for ep in episodes:
            fh.write(episode_line(ep) if isinstance(ep, dict) else ep)
        fh.write(tail)
    return root


def build(root: Path, out: Path, options: Options = Options(), **kw):
    summary = build_night(root, out, DS, Settings(options=options, **kw))
    rows = read_partition(out, "rows", DS)
    audit = {a["rollout_id"]: a for a in read_partition(out, "audit", DS)}
    return summary, rows, audit


def rejects(out: Path) -> list[tuple]:
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        return con.execute("SELECT file, line, error, rollout_id FROM rejects ORDER BY file, line").fetchall()


# ---------------------------------------------------------------- the night verifiers wrote


BUILDS = {"select": Options(), "strict": Options(offchain="strict"), "terminal": Options(mode="terminal")}


@pytest.fixture(scope="module", params=list(BUILDS))
def fixture_night(request, tmp_path_factory):
    """The fixture night in each build (`--offchain` has no effect on a trace: 10.3)."""
    out = tmp_path_factory.mktemp(f"verifiers-{request.param}")
    return (request.param, out, *build(FIXTURE, out, BUILDS[request.param]))


def test_the_fixture_night_builds_exactly_its_expected_rows_and_audit(fixture_night):
    mode, out, summary, rows, audit = fixture_night
    assert not (FIXTURE / "ledger").exists() and not (FIXTURE / "tokens").exists()
    assert len(audit) == len(EXPECTED["rollouts"]) == summary.load.n_rollouts
    by_row = {r["row_id"]: r for r in rows}
    expected_rows = 0
    for e in EXPECTED["rollouts"]:
        got = audit[e["rollout_id"]]
        assert (got["group_id"], got["slot"]) == (e["group_id"], e["slot"])
        if mode == "terminal" and len(e.get("rows", [])) > 1:  # several branches: several chains (10.5)
            assert (got["status"], got["reason"]) == ("masked", "history_rewritten")
            continue
        assert (got["status"], got["reason"], got["failed_call_id"]) == (e["status"], e["reason"], e["failed_call_id"])
        if e["status"] == "masked":
            assert got["detail"] == e["detail"] and got["advantage"] is None
            continue
        for key in ("n_ledger_calls", "n_selected", "n_segments", "n_offchain", "n_offchain_faults", "n_roots"):
            assert got[key] == e[key], key
        assert (got["n_tokens"], got["n_generated"]) == (e["n_tokens"], e["n_generated"])
        assert got["reward"] == pytest.approx(e["reward"], abs=1e-12)
        if mode != "terminal":
            assert got["advantage"] == pytest.approx(e["advantage"], abs=1e-9)
        for want in e["rows"]:
            row = by_row.pop(want["row_id"])
            expected_rows += 1
            assert row["input_ids"] == want["input_ids"]
            assert row["loss_mask"] == want["loss_mask"]
            assert np.array_equal(np.asarray(row["logprobs"], np.float32), np.asarray(want["logprobs"], np.float32))
            for key in ("prompt_len", "n_tokens", "n_generated", "model_call_ids", "segment_index", "segment_count"):
                assert row[key] == want[key], key
            assert row["rollout_weight"] == want["rollout_weight"]
            assert (row["weight_version_min"], row["weight_version_max"]) == (
                want["weight_version_min"],
                want["weight_version_max"],
            )
            assert row["advantage"] == got["advantage"] and row["reward"] == got["reward"]
    assert not by_row and expected_rows == (1 if mode == "terminal" else 5)


def test_the_torn_final_line_is_a_rejected_input_line(fixture_night):
    _, out, summary, _, audit = fixture_night
    [(file, line, error, rollout_id)] = rejects(out)
    [torn] = EXPECTED["not_rollouts"]
    assert (file, line) == (torn["file"], torn["line"]) and error.startswith("torn_final_line")
    assert torn["episode_id"] not in audit
    assert str(summary.load.rollouts) == "7 read = 6 loaded + 1 rejected"


def test_the_empty_traces_file_builds_an_empty_night_only_when_allowed(tmp_path):
    empty = FIXTURE / "empty-night"
    assert (empty / "rollouts" / f"ds={DS}" / "traces.jsonl").stat().st_size == 0
    with pytest.raises(InputError, match="no rollout could be read .*--allow-empty"):
        build_night(empty, tmp_path / "refused", DS)
    summary, rows, audit = build(empty, tmp_path / "out", allow_empty=True)
    assert (rows, audit, summary.load.n_rejects) == ([], {}, 0)


# ---------------------------------------------------------------- rows, tokens written out


def _compaction_episode() -> dict:
    """Node 0 system, 1 user, 2 sampled (scaffold 9, then 10 11), 3 tool, 4 a compaction
    attempt the harness did not accept, 5 the accepted one, 6 the new context's user turn,
    7 sampled naming 5 as its compaction; 8 a fork of 2's answer (re-sent: its own row)."""
    nodes = [
        prompt_node([1, 2, 3], None, "system"),
        prompt_node([4, 5], 0),
        sampled_node([9], [10, 11], [-0.5, -0.25], 1),
        prompt_node([12], 2, "tool"),
        sampled_node([], [20, 21], [-1.0, -2.0], 3, [(2, "compaction_attempt")]),
        sampled_node([], [22], [-0.125], 3, [(2, "compaction_attempt")]),
        prompt_node([30, 31], 0),
        sampled_node([9], [40], [-0.0625], 6, [(5, "compaction")]),
        sampled_node([], [50, 51, 52], [-1.5, -0.5, -0.75], 1),
    ]
    return episode("ep-compact", [trace(nodes, {"a": {"score": 2.0, "weight": 0.5}, "b": None})], group="gc")


def test_rows_are_the_trainable_branches_with_their_tokens(tmp_path):
    root = write_traces(tmp_path / "in", [_compaction_episode()])
    summary, rows, audit = build(root, tmp_path / "out")
    a = audit["ep-compact"]
    assert (a["status"], a["n_segments"], a["n_ledger_calls"], a["n_selected"], a["n_offchain"]) == ("ok", 3, 5, 4, 1)
    assert (a["n_roots"], a["reward"], a["advantage"]) == (1, 1.0, 0.0)  # one rollout in its group
    assert [r["row_id"] for r in rows] == ["ep-compact_s0", "ep-compact_s1", "ep-compact_s2"]
    s0, s1, s2 = rows  # leaves in index order: 5 (4 is not accepted), 7, 8
    assert s0["input_ids"] == [1, 2, 3, 4, 5, 9, 10, 11, 12, 22]
    assert s0["loss_mask"] == [0, 0, 0, 0, 0, 0, 1, 1, 0, 1]
    assert s0["logprobs"] == [0, 0, 0, 0, 0, 0, -0.5, -0.25, 0, -0.125]
    assert (s0["prompt_len"], s0["model_call_ids"]) == (6, ["2", "5"])
    assert s1["input_ids"] == [1, 2, 3, 30, 31, 9, 40] and s1["loss_mask"] == [0, 0, 0, 0, 0, 0, 1]
    assert (s1["prompt_len"], s1["model_call_ids"], s1["logprobs"][-1]) == (6, ["7"], -0.0625)
    assert s2["input_ids"] == [1, 2, 3, 4, 5, 50, 51, 52] and s2["loss_mask"] == [0, 0, 0, 0, 0, 1, 1, 1]
    assert (s2["prompt_len"], s2["model_call_ids"]) == (5, ["8"])
    assert {
        (r["segment_count"], r["rollout_weight"], r["weight_version_min"], r["weight_version_max"]) for r in rows
    } == {(3, 1 / 3, 6, 7)}
    assert (a["n_tokens"], a["n_generated"]) == (10 + 7 + 8, 3 + 1 + 3)


def _fork_episode() -> dict:
    """A fork after a sampled turn (CONTRACT.md 10.5, exactly-once ownership): prompt [1 2],
    sampled node 1 [3 | 4 5], then two tool answers each followed by a sampled turn (leaves 3
    and 5), and a third branch that ends at a tool answer after node 1 (leaf 6)."""
    nodes = [
        prompt_node([1, 2], None, "system"),
        sampled_node([3], [4, 5], [-0.5, -0.25], 0),
        prompt_node([6], 1, "tool"),
        sampled_node([], [7], [-1.0], 2),
        prompt_node([8], 1, "tool"),
        sampled_node([], [9, 10], [-2.0, -0.125], 4),
        prompt_node([11], 1, "tool"),
    ]
    return episode("ep-fork", [trace(nodes)], group="gf")


def test_a_shared_sampled_node_trains_on_its_first_row_only(tmp_path):
    root = write_traces(tmp_path / "in", [_fork_episode()])
    _, rows, audit = build(root, tmp_path / "out")
    s0, s1 = rows  # leaf 6 holds no sampled token of its own: no row
    assert s0["input_ids"] == [1, 2, 3, 4, 5, 6, 7] and s0["loss_mask"] == [0, 0, 0, 1, 1, 0, 1]
    assert s0["logprobs"] == [0, 0, 0, -0.5, -0.25, 0, -1.0] and s0["prompt_len"] == 3
    assert s1["input_ids"] == [1, 2, 3, 4, 5, 8, 9, 10] and s1["loss_mask"] == [0, 0, 0, 0, 0, 0, 1, 1]
    assert s1["logprobs"] == [0, 0, 0, 0, 0, 0, -2.0, -0.125] and s1["prompt_len"] == 6
    assert (s0["model_call_ids"], s1["model_call_ids"]) == (["1", "3"], ["1", "5"])  # every sampled node of the path
    assert (s0["n_generated"], s1["n_generated"]) == (3, 2)
    assert {(r["segment_count"], r["rollout_weight"]) for r in rows} == {(2, 0.5)}
    a = audit["ep-fork"]
    assert (a["n_segments"], a["n_ledger_calls"], a["n_selected"], a["n_generated"]) == (2, 3, 3, 5)


@pytest.mark.parametrize("children", [False, True])
def test_a_rollout_whose_rows_would_hold_more_than_the_limit_is_masked(tmp_path, monkeypatch, children):
    """A fork tree's rows repeat the shared context on every branch (CONTRACT.md 12): the
    fork episode's three trainable branches hold 7 + 8 + 6 = 21 tokens (prompt [1 2] and
    node 1 [3 4 5] on each). Over max_rollout_tokens the rollout is masked before a row is
    built, naming the limit; the other rollouts of the night are built as before; at the
    limit it builds. The same in the rollout parser's child processes."""
    from reassembler.load import rollout_lines

    if children:
        monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    other = episode("ep-other", [trace(_ok_nodes())], group="go")
    root = write_traces(tmp_path / "in", [_fork_episode(), other])
    _, rows, audit = build(root, tmp_path / "over", max_rollout_tokens=20)
    a = audit["ep-fork"]
    assert (a["status"], a["reason"]) == ("masked", "invalid_record")
    assert a["detail"] == (
        "its trainable branches hold 21 tokens with their shared context, over the 20 a rollout's rows may hold "
        "(max_rollout_tokens); not built"
    )
    assert audit["ep-other"]["status"] == "ok" and {r["rollout_id"] for r in rows} == {"ep-other"}
    _, rows, audit = build(root, tmp_path / "at", max_rollout_tokens=21)
    assert audit["ep-fork"]["status"] == "ok" and sum(r["rollout_id"] == "ep-fork" for r in rows) == 2


def _amplifying_night(root: Path, context: int, branches: int, rollouts: int) -> Path:
    """One group of `rollouts` fork trees, each a prompt of `context` tokens then `branches`
    branches of a tool answer and one sampled token: every row repeats the prompt."""
    episodes = []
    for r in range(rollouts):
        nodes = [prompt_node(list(range(1, context + 1)), None, "system")]
        for _ in range(branches):
            nodes.append(prompt_node([7], 0, "tool"))
            nodes.append(sampled_node([], [9], [-0.5], len(nodes) - 1))
        episodes.append(episode(f"ep-{r}", [trace(nodes)], group="g"))
    return write_traces(root, episodes)


def test_rows_are_built_and_written_a_bounded_piece_at_a_time(tmp_path):
    """Four rollouts of one group (one batch) whose 150 rows each repeat a prompt of 100,000
    tokens: 60 million tokens of rows from 400,000 read (under the rollout limit each). The
    shard builds and writes them a few million tokens at a time: the build peaks far below
    what building the batch's rows at once took (~1 GB), in a process of its own."""
    from test_hostile_input import peak_of

    root = _amplifying_night(tmp_path / "in", 100_000, 150, 4)
    out = tmp_path / "out"
    res, peak_kib = peak_of(
        [sys.executable, "-m", "reassembler.cli", "build", "--input", str(root), "--output", str(out), "--ds", DS]
    )
    assert res.returncode == 0, res.stderr
    assert peak_kib < 600 << 10, peak_kib
    meta = pq.read_metadata(next((out / "rows" / f"ds={DS}").glob("*.parquet")))
    assert meta.num_rows == 600
    lengths = pq.read_table(out / "rows" / f"ds={DS}", columns=["n_tokens"]).column("n_tokens").to_pylist()
    assert lengths == [100_002] * 600


def test_rows_written_a_row_at_a_time_are_the_rows_written_at_once(tmp_path, monkeypatch):
    """The pieces change where the rows file's row groups end, never a row: the fixture's
    night and the fork episodes, built with pieces of one row, give the same rows."""
    from reassembler.verify import rows as rows_module

    root = tmp_path / "in"
    shutil.copytree(FIXTURE / "rollouts", root / "rollouts")
    traces = root / "rollouts" / f"ds={DS}" / "traces.jsonl"
    whole_lines = traces.read_bytes()
    traces.write_bytes(whole_lines[: whole_lines.rindex(b"\n") + 1])  # its torn final line goes
    write_traces(root, [_fork_episode(), _amplifying_night_episode()])
    _, whole, _ = build(root, tmp_path / "whole")
    monkeypatch.setattr(rows_module, "ROW_PIECE_TOKENS", 1)
    _, pieces, _ = build(root, tmp_path / "pieces")
    assert pieces == whole and {"ep-fork", "ep-amp"} <= {r["rollout_id"] for r in whole} and len(whole) > 8
    [part] = (tmp_path / "pieces" / "rows" / f"ds={DS}").glob("*.parquet")
    assert pq.read_metadata(part).num_row_groups == len(whole)  # one row a piece, one piece a row group


def _amplifying_night_episode() -> dict:
    nodes = [prompt_node([1, 2, 3], None, "system")]
    for _ in range(3):
        nodes.append(prompt_node([7], 0, "tool"))
        nodes.append(sampled_node([], [9], [-0.5], len(nodes) - 1))
    return episode("ep-amp", [trace(nodes)], group="ga")


def test_a_combs_trace_is_stored_in_a_size_of_its_nodes_not_of_its_paths():
    """A comb: a spine of 1,500 tool answers, a sampled tooth on each. Its rows hold 1.1
    million node places (each row the spine up to its tooth), so storing each row's path
    took megabytes in the rollout's trace column (and DuckDB's memory with it: exit 4 at
    3,000 teeth); the trace stores each row's leaf and each sampled node's owner instead,
    and the shard follows the parents (the comb's rows are checked end to end below)."""
    from reassembler.formats.verifiers import parse_episode
    from reassembler.load.verifiers_traces import decode_episode, rollout_row

    nodes, spine = [prompt_node([1, 2], None, "system")], 0
    for _ in range(1_500):
        nodes.append(prompt_node([5], spine, "tool"))
        spine = len(nodes) - 1
        nodes.append(sampled_node([], [9], [-0.5], spine))
    [rollout] = parse_episode(decode_episode(episode_line(episode("ep-comb", [trace(nodes)], group="gc")).encode()))
    assert sum(len(path) for path in rollout.rows) > 1_100_000
    stored = rollout_row(rollout)["trace"]
    assert len(stored) < 64 << 10
    shape = json.loads(stored)
    assert shape["leaves"][:2] == [2, 4] and shape["owners"]["2"] == 0 and "rows" not in shape


def test_a_combs_rows_follow_their_nodes_parents(tmp_path):
    """A small comb end to end: each row is the spine up to its tooth, root first."""
    nodes, spine = [prompt_node([1, 2], None, "system")], 0
    for tooth in range(4):
        nodes.append(prompt_node([5 + tooth], spine, "tool"))
        spine = len(nodes) - 1
        nodes.append(sampled_node([], [20 + tooth], [-0.5], spine))
    root = write_traces(tmp_path / "in", [episode("ep-comb", [trace(nodes)], group="gc")])
    _, rows, audit = build(root, tmp_path / "out")
    assert [r["input_ids"] for r in rows] == [
        [1, 2, 5, 20],
        [1, 2, 5, 6, 21],
        [1, 2, 5, 6, 7, 22],
        [1, 2, 5, 6, 7, 8, 23],
    ]
    assert [r["model_call_ids"] for r in rows] == [["2"], ["4"], ["6"], ["8"]]
    assert audit["ep-comb"]["n_segments"] == 4


def test_a_million_empty_nodes_are_judged_within_the_memory_bound(tmp_path):
    """A 15.6 MB line of 1.2 million nodes `{"parent":0}` under one prompt (the issue's
    probe): no trainable branch, so the rollout is masked empty_selection. The line is held
    once (its structure read and let go before orjson reads it) and the nodes without
    tokens share their empty arrays: it peaked at 1,019 MB, in a process of its own."""
    from test_hostile_input import peak_of

    line = episode_line(episode("ep-empty", [trace([prompt_node([1, 2], None, "system")])], group="ge"))
    marker = '"logprobs":[]}]'
    assert line.count(marker) == 1
    line = line.replace(marker, marker[:-1] + ',{"parent":0}' * 1_200_000 + "]")
    root = write_traces(tmp_path / "in", [line])
    out = tmp_path / "out"
    res, peak_kib = peak_of(
        [sys.executable, "-m", "reassembler.cli", "build", "--input", str(root), "--output", str(out), "--ds", DS]
    )
    assert res.returncode == 0, res.stderr
    assert peak_kib < 700 << 10, peak_kib
    [a] = read_partition(out, "audit", DS)
    assert (a["status"], a["reason"]) == ("masked", "empty_selection")


def test_the_rollout_token_limit_is_a_flag_of_the_command(tmp_path):
    root = write_traces(tmp_path / "in", [_fork_episode()])
    out = tmp_path / "out"
    res = cli("build", "--input", root, "--output", out, "--ds", DS, "--max-rollout-tokens", "20", "--allow-empty")
    assert res.returncode == 0, res.stderr
    [a] = read_partition(out, "audit", DS)
    assert a["reason"] == "invalid_record" and "over the 20 a rollout's rows may hold" in a["detail"]


def test_explain_says_which_row_owns_a_shared_node(tmp_path):
    root = write_traces(tmp_path / "in", [_fork_episode()])
    out = tmp_path / "out"
    build(root, out)
    res = cli("explain", "--output", out, "--ds", DS, "ep-fork")
    assert res.returncode == 0, res.stderr
    assert "branch to leaf 5 [0 -> 1 -> 4 -> 5]: row ep-fork_s1; context only: node 1 (trained on row ep-fork_s0)" in (
        res.stdout
    )
    assert "branch to leaf 6 [0 -> 1 -> 6]: no row, every sampled node on it is trained on an earlier row" in (
        res.stdout
    )
    assert "row ep-fork_s1: calls [1, 5], 8 tokens, 2 generated, prompt_len 6" in res.stdout


def test_a_rejected_compaction_attempt_claims_none_of_the_prefix_it_shares(tmp_path):
    """prime-rl #3478: untrainable branches are set aside before ownership, so the shared
    sampled node trains on the accepted branch."""
    nodes = [
        prompt_node([1], None),
        sampled_node([], [2, 3], [-0.5, -0.5], 0),
        sampled_node([], [4], [-1.0], 1, links=[(1, "compaction_attempt")]),  # leaf 2: not accepted
        sampled_node([], [5], [-1.0], 1),
    ]
    root = write_traces(tmp_path / "in", [episode("ep-a", [trace(nodes)], group="ga")])
    _, [row], _ = build(root, tmp_path / "out")
    assert row["input_ids"] == [1, 2, 3, 5] and row["loss_mask"] == [0, 1, 1, 1]


def test_a_dropped_trace_is_masked_and_out_of_its_groups_statistics(tmp_path):
    nodes = [prompt_node([1], None), sampled_node([], [2], [-1.0], 0)]

    def ep(name: str, score: float, dropped: str | None = None) -> dict:
        t = trace(nodes, {"r": {"score": score}})
        if dropped is not None:
            t["dropped"] = dropped
        return episode(name, [t], group="gd")

    root = write_traces(tmp_path / "in", [ep("a", 1.0), ep("b", 0.0), ep("c", 5.0, "judge: refused")])
    _, rows, audit = build(root, tmp_path / "out")
    assert (audit["c"]["reason"], audit["c"]["detail"]) == ("producer_masked", "dropped: judge: refused")
    assert {r["rollout_id"] for r in rows} == {"a", "b"}
    assert audit["a"]["advantage"] == pytest.approx(-audit["b"]["advantage"]) and audit["a"]["advantage"] > 0


def test_a_frozen_policy_gives_null_weight_versions(tmp_path):
    nodes = [prompt_node([1], None), sampled_node([], [2], [-1.0], 0)]
    root = write_traces(tmp_path / "in", [episode("ep-eval", [trace(nodes)], policy=None)])
    _, [row], _ = build(root, tmp_path / "out")
    assert (row["weight_version_min"], row["weight_version_max"]) == (None, None)


# ---------------------------------------------------------------- the checks of 10.4


def _ok_nodes() -> list[dict]:
    """A plain two-call trace: system [1 2], user [3], sampled [4 | 5 6], tool [7], sampled [8]."""
    return [
        prompt_node([1, 2], None, "system"),
        prompt_node([3], 0),
        sampled_node([4], [5, 6], [-0.5, -1.0], 1),
        prompt_node([7], 2, "tool"),
        sampled_node([], [8], [-0.25], 3),
    ]


def _with(change) -> dict:
    ep = episode("x", [trace(_ok_nodes())])
    change(ep, ep["traces"][0], ep["traces"][0]["nodes"])
    return ep


def _set(obj: dict, key: str, value):
    obj[key] = value


# (name, the change, reason, failed_call_id, a part of the detail)
CHECKS = [
    ("episode_not_ok", lambda e, t, n: _set(e, "ok", False), "rollout_failed", None, "episode ok is not true"),
    (
        "trace_not_ok",
        lambda e, t, n: t.update(ok=False, errors=[{"type": "RuntimeError", "message": "sandbox died"}]),
        "rollout_failed",
        None,
        "trace ok is not true: RuntimeError: sandbox died",
    ),
    ("no_traces", lambda e, t, n: _set(e, "traces", []), "rollout_failed", None, "holds no trace"),
    ("trace_not_object", lambda e, t, n: _set(e, "traces", [7]), "invalid_record", None, "not an object"),
    ("dropped", lambda e, t, n: _set(t, "dropped", "judge: off-topic"), "producer_masked", None, "dropped: judge"),
    (
        "dropped_before_reward",
        lambda e, t, n: t.update(dropped="judge dropped it", rewards={"judge": None}),
        "producer_masked",
        None,
        "dropped: judge dropped it",
    ),
    ("dropped_not_string", lambda e, t, n: _set(t, "dropped", True), "invalid_record", None, "dropped true"),
    ("rewards_not_object", lambda e, t, n: _set(t, "rewards", [1.0]), "invalid_reward", None, "not an object"),
    ("reward_nan", lambda e, t, n: _set(t, "rewards", {"a": None}), "invalid_reward", None, "no reward was scored"),
    ("no_rewards", lambda e, t, n: _set(t, "rewards", {}), "invalid_reward", None, "no reward was scored"),
    ("score_string", lambda e, t, n: _set(t, "rewards", {"a": {"score": "1"}}), "invalid_reward", None, "score"),
    (
        "weight_bool",
        lambda e, t, n: _set(t, "rewards", {"a": {"score": 1, "weight": True}}),
        "invalid_reward",
        None,
        "weight",
    ),
    (
        "reward_overflow",
        lambda e, t, n: _set(t, "rewards", {"a": {"score": 1e308, "weight": 10.0}}),
        "invalid_reward",
        None,
        "inf",
    ),
    ("version_2", lambda e, t, n: _set(t, "version", 2), "unsupported_version", None, "version 2"),
    ("version_float", lambda e, t, n: _set(t, "version", 1.0), "unsupported_version", None, "version 1.0"),
    ("nodes_not_array", lambda e, t, n: _set(t, "nodes", {}), "invalid_record", None, "not an array"),
    ("node_not_object", lambda e, t, n: n.__setitem__(3, "tool"), "invalid_record", "3", "node 3 is not an object"),
    ("parent_float", lambda e, t, n: _set(n[1], "parent", 0.0), "invalid_record", "1", "parent 0.0"),
    ("sampled_int", lambda e, t, n: _set(n[2], "sampled", 1), "invalid_record", "2", "sampled 1"),
    ("mask_not_array", lambda e, t, n: _set(n[4], "mask", "true"), "invalid_record", "4", "mask is not an array"),
    (
        "link_negative",
        lambda e, t, n: _set(n[4], "semantic_parents", [{"node": -1, "type": "compaction"}]),
        "invalid_record",
        "4",
        "semantic_parents",
    ),
    ("parent_minus_one", lambda e, t, n: _set(n[1], "parent", -1), "missing_parent", "1", "parent -1"),
    ("parent_past_end", lambda e, t, n: _set(n[4], "parent", 5), "missing_parent", "4", "parent 5"),
    ("cycle", lambda e, t, n: _set(n[1], "parent", 3), "lineage_cycle", "1", "node 1: its parent walk meets node 1"),
    (
        "no_token_ids",
        lambda e, t, n: [x.update(token_ids=[], mask=[], logprobs=[]) for x in n],
        "missing_tokens",
        None,
        "no node holds a token id",
    ),
    ("no_nodes", lambda e, t, n: _set(t, "nodes", []), "missing_tokens", None, "no node"),
    ("mask_short", lambda e, t, n: n[2]["mask"].pop(), "length_mismatch", "2", "2 mask values for 3 token ids"),
    ("token_negative", lambda e, t, n: n[3]["token_ids"].__setitem__(0, -1), "invalid_token", "3", "token id -1"),
    ("token_2_31", lambda e, t, n: n[0]["token_ids"].__setitem__(1, 2**31), "invalid_token", "0", "2147483648"),
    ("token_float", lambda e, t, n: n[4]["token_ids"].__setitem__(0, 8.0), "invalid_token", "4", "not an integer"),
    ("token_bool", lambda e, t, n: n[1]["token_ids"].__setitem__(0, True), "invalid_token", "1", "not an integer"),
    ("token_huge", lambda e, t, n: n[1]["token_ids"].__setitem__(0, 10**30), "invalid_token", "1", "not an integer"),
    ("mask_int", lambda e, t, n: n[2]["mask"].__setitem__(0, 0), "invalid_mask", "2", "not a boolean"),
    ("mask_on_prompt", lambda e, t, n: n[3]["mask"].__setitem__(0, True), "invalid_mask", "3", "not sampled"),
    (
        "mask_true_then_false",
        lambda e, t, n: _set(n[2], "mask", [True, True, False]),
        "invalid_mask",
        "2",
        "false after a true",
    ),
    (
        "sampled_nothing",
        lambda e, t, n: n[4].update(mask=[False], logprobs=[]),
        "empty_generation",
        "4",
        "sampled, but no token",
    ),
    ("logprob_missing", lambda e, t, n: n[2]["logprobs"].pop(), "length_mismatch", "2", "1 logprobs for 2 sampled"),
    ("logprob_extra", lambda e, t, n: n[4]["logprobs"].append(-1.0), "length_mismatch", "4", "2 logprobs for 1"),
    ("logprob_null", lambda e, t, n: n[2]["logprobs"].__setitem__(1, None), "invalid_logprob", "2", "null"),
    ("logprob_positive", lambda e, t, n: n[4]["logprobs"].__setitem__(0, 0.5), "invalid_logprob", "4", "0.5 > 0"),
    ("logprob_string", lambda e, t, n: n[4]["logprobs"].__setitem__(0, "-1"), "invalid_logprob", "4", "not a number"),
    (
        "only_a_rejected_attempt",
        lambda e, t, n: _set(n[4], "semantic_parents", [{"node": 2, "type": "compaction_attempt"}]),
        "empty_selection",
        None,
        "no trainable branch",
    ),
    (
        "no_sampled_token_on_a_branch",
        lambda e, t, n: [x.update(sampled=False, mask=[False] * len(x["mask"]), logprobs=[]) for x in n],
        "empty_selection",
        None,
        "no trainable branch",
    ),
]


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """Every case of CHECKS as an Episode of its own (its id the case's name), one night."""
    root = tmp_path_factory.mktemp("checks")
    episodes = []
    for name, change, *_ in CHECKS:
        ep = _with(change)
        ep["id"] = name
        episodes.append(ep)
    write_traces(root / "in", episodes + [dict(_with(lambda e, t, n: None), id="sound")])
    return build(root / "in", root / "out")


@pytest.mark.parametrize("name, change, reason, call, detail", CHECKS, ids=[c[0] for c in CHECKS])
def test_each_check_masks_its_rollout_with_its_reason(checked, name, change, reason, call, detail):
    _, rows, audit = checked
    got = audit[name]
    assert (got["status"], got["reason"], got["failed_call_id"]) == ("masked", reason, call), got["detail"]
    assert detail in got["detail"]
    assert got["advantage"] is None and not [r for r in rows if r["rollout_id"] == name]
    assert audit["sound"]["status"] == "ok"


def test_the_reward_is_kept_when_its_check_passed(checked):
    _, _, audit = checked
    assert audit["episode_not_ok"]["reward"] == 1.0 and audit["mask_int"]["reward"] == 1.0
    assert audit["reward_nan"]["reward"] is None and audit["trace_not_object"]["reward"] is None


def test_the_checks_run_in_the_contracts_order():
    """A trace failing several checks is masked by the first (10.4's order; 8 node by node)."""
    from reassembler.formats.verifiers import parse_episode

    def first(*changes) -> tuple:
        ep = _with(lambda e, t, n: [c(e, t, n) for c in changes])
        [r] = parse_episode(json.loads(json.dumps(ep)))
        return r.reason.value, r.call_id

    lp_null = lambda e, t, n: n[2]["logprobs"].__setitem__(1, None)  # noqa: E731
    assert first(lambda e, t, n: _set(e, "ok", False), lambda e, t, n: _set(t, "rewards", {})) == (
        "rollout_failed",
        None,
    )
    assert first(lambda e, t, n: _set(t, "rewards", {}), lambda e, t, n: _set(t, "version", 3)) == (
        "invalid_reward",
        None,
    )
    assert first(lambda e, t, n: _set(t, "version", 3), lambda e, t, n: _set(n[0], "sampled", 1)) == (
        "unsupported_version",
        None,
    )
    assert first(lambda e, t, n: _set(n[4], "parent", 9), lambda e, t, n: _set(n[3], "sampled", 1)) == (
        "invalid_record",
        "3",
    )
    assert first(lambda e, t, n: _set(n[4], "parent", 9), lambda e, t, n: _set(n[1], "parent", 3)) == (
        "missing_parent",
        "4",
    )
    assert first(lp_null, lambda e, t, n: n[4]["token_ids"].__setitem__(0, -3)) == ("invalid_logprob", "2")
    assert first(lambda e, t, n: n[2]["mask"].pop(), lambda e, t, n: n[2]["token_ids"].__setitem__(0, -3)) == (
        "length_mismatch",
        "2",
    )
    # within a node: tokens before the mask, the mask before the log probabilities
    assert first(lp_null, lambda e, t, n: n[2]["token_ids"].__setitem__(0, -3)) == ("invalid_token", "2")
    assert first(lp_null, lambda e, t, n: n[2]["mask"].__setitem__(0, 1)) == ("invalid_mask", "2")


# ---------------------------------------------------------------- ids, groups, slots (10.3)


@pytest.mark.parametrize("parts", [1, 2])
def test_ids_groups_and_slots_follow_the_reading_order(tmp_path, parts):
    """The same night in one load part and in two (each file in a part of its own: an id
    repeated across them is the merge's to find)."""
    nodes = _ok_nodes
    judge = trace(nodes(), agent="judge", trainable=False)
    root = tmp_path / "in"
    write_traces(
        root,
        [
            episode("A", [trace(nodes()), judge, trace(nodes())], group="g"),  # A-t0, A-t2 (the judge counts in i)
            episode("B", [trace(nodes())], group=None),  # a group of its own
            episode("A", [trace(nodes())], group="g"),  # an Episode id seen before: rejected
            episode("C", [judge], group="g"),  # no trainable trace: no rollout, not a reject
            episode("C", [trace(nodes())], group="g"),  # but its id was seen: rejected
        ],
        name="runA.traces.jsonl",
    )
    write_traces(
        root,
        [
            episode("B", [trace(nodes()), trace(nodes())], group=None),  # an Episode id seen: 2 rejects
            episode("D", [dict(trace(nodes()), ok=False)], group="g"),
            episode("A-t0", [trace(nodes())], group="g"),  # a derived id seen before: rejected
            "\n   \n",  # blank lines are skipped
            '{"id": "E", "traces": [], "id": "E2"}\n',  # a repeated key: rejected
            '{"id": "F", "traces": [{"rewards": {"a": {"score": NaN}}}]}\n',  # NaN is not JSON
            '{"id": "G"}\n',  # not an Episode
            '{"id": "", "traces": []}\n',
            '{"id": "H", "traces": {}}\n',
            '{"id": "I", "traces": [], "group": {"id": 5}}\n',
        ],
        name="runB.traces.jsonl",
    )
    summary, rows, audit = build(root, tmp_path / "out", allow_empty=True, load_parts=parts)
    assert {rid: (a["group_id"], a["slot"]) for rid, a in audit.items()} == {
        "A-t0": ("g", 0),
        "A-t2": ("g", 1),
        "B": ("B", 0),
        "D": ("g", 2),
    }
    assert audit["B"]["advantage"] == 0.0 and audit["A-t0"]["advantage"] == 0.0  # equal rewards in the group
    assert audit["D"]["reason"] == "rollout_failed"
    want = [
        ("runA.traces.jsonl", 3, "Episode id A already seen in this night", "A"),
        ("runA.traces.jsonl", 5, "Episode id C already seen in this night", "C"),
        ("runB.traces.jsonl", 1, "Episode id B already seen in this night", "B"),
        ("runB.traces.jsonl", 1, "Episode id B already seen in this night", "B"),
        ("runB.traces.jsonl", 3, "rollout_id A-t0 already seen in this night", "A-t0"),
        ("runB.traces.jsonl", 6, "duplicate key 'id' in a JSON object", None),
        ("runB.traces.jsonl", 7, "not valid JSON", None),
        ("runB.traces.jsonl", 8, "not a verifiers Episode", "G"),
        ("runB.traces.jsonl", 9, "the Episode's id is not a non-empty string", None),
        ("runB.traces.jsonl", 10, "the Episode's traces is not an array", "H"),
        ("runB.traces.jsonl", 11, "the Episode's group is not an object with a", "I"),
    ]
    got = rejects(tmp_path / "out")
    assert [(f, line, rid) for f, line, _, rid in got] == [(f, line, rid) for f, line, _, rid in want]
    assert all(error.startswith(start) for (_, _, error, _), (_, _, start, _) in zip(got, want)), got
    assert str(summary.load.rollouts) == "15 read = 4 loaded + 11 rejected"


def test_only_files_named_traces_are_read_as_verifiers(tmp_path):
    """`traces.jsonl` and `*.traces.jsonl` (10.2); `mytraces.jsonl` is a rollout file, whose
    Episode lines are rejected as rollout records."""
    from reassembler.formats.verifiers import is_traces_file

    assert [is_traces_file(n) for n in ("traces.jsonl", "a/traces.jsonl", "runA.traces.jsonl")] == [True] * 3
    assert [is_traces_file(n) for n in ("mytraces.jsonl", ".traces.jsonl", "traces.json", "rollouts.jsonl")] == [
        False
    ] * 4
    root = write_traces(tmp_path / "in", [episode("A", [trace(_ok_nodes())])], name="mytraces.jsonl")
    (root / "ledger" / f"ds={DS}").mkdir(parents=True)
    (root / "tokens" / f"ds={DS}").mkdir(parents=True)
    summary, _, audit = build(root, tmp_path / "out", allow_empty=True)
    assert audit == {} and summary.load.rollouts.rejected == 1


# ---------------------------------------------------------------- a night that mixes producers


def test_a_night_mixing_verifiers_and_gym_builds_each_as_alone(tmp_path):
    gym_ds = json.loads((GYM / "expected.json").read_text())["ds"]
    mixed = tmp_path / "mixed"
    shutil.copytree(GYM, mixed, ignore=shutil.ignore_patterns("expected.json", "README.md"))
    traces = (FIXTURE / "rollouts" / f"ds={DS}" / "traces.jsonl").read_bytes()
    (mixed / "rollouts" / f"ds={gym_ds}" / "traces.jsonl").write_bytes(traces)
    # a ledger row carrying a verifiers rollout's id produces nothing (10.3): not read, not a reject
    [ledger] = sorted((mixed / "ledger" / f"ds={gym_ds}").glob("*.lineage.jsonl"))[:1]
    row = json.loads(ledger.read_text().splitlines()[0])
    (mixed / "ledger" / f"ds={gym_ds}" / "496652fef1314e1d2a00f9049a9ae3dc.lineage.jsonl").write_text(
        json.dumps(row) + "\n"
    )
    vf = tmp_path / "vf"
    shutil.copytree(FIXTURE / "rollouts", vf / "rollouts")
    (vf / "rollouts" / f"ds={DS}").rename(vf / "rollouts" / f"ds={gym_ds}")

    def outcome(root: Path, out: Path):
        return night_outcome(root, out, gym_ds)

    both_rows, both_audit = outcome(mixed, tmp_path / "out-mixed")
    gym_rows, gym_audit = outcome(GYM, tmp_path / "out-gym")
    vf_rows, vf_audit = outcome(vf, tmp_path / "out-vf")
    assert both_rows == {**gym_rows, **vf_rows} and len(vf_rows) == 5 and gym_rows
    assert both_audit == {**gym_audit, **vf_audit}
    with duckdb.connect(str(tmp_path / "out-mixed" / "warehouse.duckdb"), read_only=True) as con:
        captures = dict(con.execute("SELECT capture, count(*) FROM rollouts GROUP BY ALL").fetchall())
        [[torn]] = con.execute("SELECT count(*) FROM rejects WHERE error LIKE 'torn_final_line%'").fetchall()
        [[orphans]] = con.execute("SELECT count(*) FROM rejects WHERE source = 'ledger'").fetchall()
    assert captures["verifiers"] == 6 and captures["staged"] >= 1
    assert (torn, orphans) == (1, 0)


# ---------------------------------------------------------------- as a user runs it


def test_the_command_builds_explains_and_reports_a_verifiers_night(tmp_path):
    out = tmp_path / "out"
    res = cli("build", "--input", FIXTURE, "--output", out, "--ds", DS)
    assert res.returncode == 0, res.stderr
    assert "traces   6 rollouts from verifiers traces files (3 masked by their trace checks)" in res.stdout
    res = cli("explain", "--output", out, "--ds", DS, "18137f8f87631c6139429bc57ba9a2b9")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "capture: a verifiers trace" in text and "node 7: parent 6, assistant, sampled" in text
    assert "branch to leaf 7 [0 -> 1 -> 2 -> 3 -> 4 -> 5 -> 6 -> 7]: no row, an unaccepted compaction attempt" in text
    assert "branch to leaf 8 [0 -> 1 -> 2 -> 3 -> 4 -> 5 -> 6 -> 8]: row 18137f8f87631c6139429bc57ba9a2b9_s0" in text
    assert (
        "row 18137f8f87631c6139429bc57ba9a2b9_s1: calls [10, 12], 68 tokens, 18 generated" in text
    )  # its model_call_ids
    assert "off-chain: 7 (0 faulty)" in text and "result: ok, 2 rows" in text
    res = cli("explain", "--output", out, "--ds", DS, "35857c33bf405e0683a0acb6fb6077f2", "--json")
    assert res.returncode == 0, res.stderr
    replay = json.loads(res.stdout)
    assert replay["result"]["reason"] == "length_mismatch" and replay["result"]["failed_call_id"] == "4"
    assert any("masked length_mismatch: node 4: 20 logprobs for 21 sampled tokens" in s for s in replay["steps"])
    res = cli("report", "--output", out, "--html")
    assert res.returncode == 0, res.stderr
    page = (out / "reports" / f"ds={DS}" / "index.html").read_text()
    assert "Rollouts by capture" in page and "verifiers trace" in page
    res = cli("gate", "--output", out, "--ds", DS)  # half of 6 rollouts masked: a warning (too few for a rate)
    assert res.returncode == 0 and "warn   mask_rate" in res.stdout, res.stderr
    res = cli("gate", "--output", out, "--ds", DS, "--min-rollouts", "6")  # judged as a rate: the gate says so
    assert res.returncode == 5 and "mask rate 0.500 (3/6) > 0.200" in res.stderr, res.stderr
    res = cli("build", "--input", tmp_path / "nowhere", "--output", tmp_path / "o2", "--ds", DS)
    assert res.returncode == 2 and "input partition folder is missing" in one_line_error(res)


def test_the_rollout_parse_in_child_processes_reads_traces_the_same(tmp_path, monkeypatch):
    from reassembler.load import rollout_lines

    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    monkeypatch.setattr(rollout_lines, "PART_BYTES", 1)
    _, rows, audit = build(FIXTURE, tmp_path / "children")
    monkeypatch.undo()
    _, rows_here, audit_here = build(FIXTURE, tmp_path / "here")
    for a in (*audit.values(), *audit_here.values()):
        a.pop("run_id")
    assert (rows, audit) == (rows_here, audit_here) and len(rows) == 5


def test_a_warehouse_of_release_6_gets_the_trace_column(tmp_path):
    from reassembler.warehouse import SCHEMA_VERSION, connect
    from steps import back_to_version

    out = tmp_path / "out"
    with connect(out) as con:  # a current warehouse taken back to version 6
        back_to_version(con, 9)  # rollouts a table again
        con.execute("ALTER TABLE rollouts DROP COLUMN trace")
        back_to_version(con, 6)
    _, rows, _ = build(FIXTURE, out)
    assert len(rows) == 5
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION == 12
        assert con.execute("SELECT count(trace) FROM rollout_items").fetchone()[0] == 6


def test_the_report_counts_what_terminal_mode_would_mask(fixture_night):
    """Capture quality (audit/quality.py): a verifiers trace of several rows is what
    compaction-aware reading keeps and terminal mode masks history_rewritten."""
    from reassembler.audit.quality import night_quality
    from reassembler.warehouse import connect

    mode, out, *_ = fixture_night
    with connect(out, read_only=True) as con:
        q = night_quality(con, DS)
    assert {g["value"]: (g["rollouts"], g["masked"]) for g in q["breakdowns"]["capture"]} == {
        "verifiers trace": (6, 3 if mode != "terminal" else 5)
    }
    saved = q["compaction"]
    assert (saved["saved_rollouts"], saved["saved_rows"]) == ((2, 4) if mode != "terminal" else (0, 0))


def test_verifiers_runs_on_the_s3_server_read_with_one_setting(tmp_path, s3):
    """Runs kept on object storage (one folder per run under the night), pointed at by
    `--rollouts` alone: built as the same files locally, explained from there."""
    runs = tmp_path / "runs" / DS
    (runs / "rl-a").mkdir(parents=True)
    shutil.copy(FIXTURE / "rollouts" / f"ds={DS}" / "traces.jsonl", runs / "rl-a" / "traces.jsonl")
    root = f"s3://{s3.bucket('runs')}/runs"
    s3.upload(runs, f"{root}/{DS}")
    out = tmp_path / "out"
    res = cli("build", "--rollouts", root + "/{ds}/*/traces.jsonl", "--output", out, "--ds", DS)
    assert res.returncode == 0, res.stderr
    _, rows, audit = build(FIXTURE, tmp_path / "local")
    got = {r["row_id"]: r for r in read_partition(out, "rows", DS)}
    assert got == {r["row_id"]: r for r in rows} and len(got) == 5
    assert {k: a["status"] for k, a in audit.items()} == {
        a["rollout_id"]: a["status"] for a in read_partition(out, "audit", DS)
    }
    explained = cli("explain", "--output", out, "--ds", DS, "61f9479d9f65230d2db0765e897adc8c")
    assert explained.returncode == 0, explained.stderr
    assert "branch to leaf 5 [0 -> 1 -> 3 -> 4 -> 5]: row 61f9479d9f65230d2db0765e897adc8c_s1" in explained.stdout


TRICKY_LINES = [
    b'{"id":"a","traces":[{"nodes":[{"parent":18446744073709551616,"token_ids":[1,2]}]}]}',
    b'{"id":"a","traces":[{"version":18446744073709551617,"nodes":[]}]}',
    b'{"id":"a","traces":[{"nodes":[{"semantic_parents":[{"node":18446744073709551616,"type":"compaction"}]}]}]}',
    b'{"id":"a","id":"b","traces":[]}',
    b'{"id":"a","traces":[{"nodes":[{"token_ids":[1,2],"token_ids":[3]}]}]}',
    b'{"id":"a","traces":[{"rewards":{"x":{"score":NaN}}}]}',
    b'{"id":"a","traces":[{"rewards":{"x":{"score":-Infinity}}}]}',
    b'{"id":"\\ud800","traces":[]}',
    b'{"id":"a","traces":[],"note":"[1,2] and [true] inside a string, \\"[3]\\""}',
    b'{"id":"a","traces":[1e400, -0.0, 2.50]}',
    b'{"id":"a","traces":[' + b"[" * 200 + b"]" * 200 + b"]}",
    b'{"id":"a","traces":[{"mask":[true,false,tru]}]}',
    b'{"id":"a","traces":[{"v":[1,]}]}',
    b"\xff{}",
    b'{"id":"a","traces":[{"nodes":[{"token_ids":[ 1 , 2 ],"mask":[ true , false ],"logprobs":[-1E-3]}]}]}',
]


@pytest.mark.parametrize("raw", TRICKY_LINES)
def test_the_fast_line_reader_judges_a_line_as_the_strict_decoder(raw):
    """load/verifiers_traces.py reads a line by orjson and its structure by the strict
    decoder: the value (types included) or the reject's words are the strict decoder's."""
    from reassembler.formats.records import RecordError
    from reassembler.formats.verifiers import DECODER
    from reassembler.load.json_lines import decode
    from reassembler.load.verifiers_traces import decode_episode

    fast, strict = decode_episode(raw), decode(raw, DECODER)
    if isinstance(strict, RecordError):
        assert isinstance(fast, RecordError) and str(fast) == str(strict)
    else:
        assert json.dumps(fast) == json.dumps(strict)  # big integers stay integers


def test_a_child_hands_traces_over_in_chunks_bounded_by_their_tokens(monkeypatch):
    """A verifiers rollout row carries its nodes' token arrays: a child's chunk of rows ends
    at CHUNK_TOKENS tokens as well as at CHUNK rows."""
    from reassembler.formats.verifiers import DECODER, parse_episode
    from reassembler.load import rollout_lines
    from reassembler.load.verifiers_traces import rollout_row, trace_calls

    class Records:
        def __init__(self):
            self.sizes: list[tuple[int, int]] = []  # per chunk: rows, derived calls

        def put(self, kind, payload):
            if kind == "rows":
                rows, calls = payload
                self.sizes.append((len(rows), calls.calls.num_rows))
                assert calls.calls.column("staging_key").to_pylist() == calls.tokens.column("staging_key").to_pylist()

    lines = (FIXTURE / "rollouts" / f"ds={DS}" / "traces.jsonl").read_bytes().splitlines()[:3]

    def rows():
        return [rollout_row(r) for raw in lines for r in parse_episode(DECODER.decode(raw.decode()))]

    derived = [list(trace_calls(row["verifiers"])) for row in rows()]
    tokens = [sum(len(c.ids) for c in calls) for calls in derived]
    n = [len(calls) for calls in derived]
    for bound, want in (
        (10**9, [(3, sum(n))]),
        (min(tokens), [(1, n[0]), (1, n[1]), (1, n[2])]),
        (tokens[0] + tokens[1], [(2, n[0] + n[1]), (1, n[2])]),
    ):
        monkeypatch.setattr(rollout_lines, "CHUNK_TOKENS", bound)
        records = Records()
        chunks = rollout_lines._Chunks(records)  # type: ignore[arg-type]
        for row in rows():
            rollout_lines.carried_calls(row, chunks.calls)  # as parse_rollouts does
            chunks.add_row(row)
        chunks.put("lines", 3)
        assert records.sizes == want, (bound, tokens)


def test_episodes_repeated_across_parse_children_are_the_reject_rows_of_one_process(tmp_path, monkeypatch):
    """Two runs' files, the second repeating Episodes of the first (one with another number
    of traces): parsed by two child processes, the night and its reject rows are the ones a
    single process gives."""
    from reassembler.load import rollout_lines

    lines = (FIXTURE / "rollouts" / f"ds={DS}" / "traces.jsonl").read_bytes().splitlines(keepends=True)[:6]
    again = json.loads(lines[1])
    again["traces"] = again["traces"] * 2  # the same Episode id, its rollouts now ...-t0 and ...-t1
    root = write_traces(tmp_path / "in", [line.decode() for line in lines], name="runA.traces.jsonl")
    write_traces(root, [lines[0].decode(), again, lines[2].decode()], name="runB.traces.jsonl")

    def outcome(out: Path):
        _, rows, audit = build(root, out)
        for a in audit.values():
            a.pop("run_id")
        return rows, audit, rejects(out)

    here = outcome(tmp_path / "here")
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    monkeypatch.setattr(rollout_lines, "PART_BYTES", 1)
    monkeypatch.setattr(rollout_lines.os, "cpu_count", lambda: 2)
    assert outcome(tmp_path / "children") == here
    assert [(f, line, e.split(" already")[0]) for f, line, e, _ in here[2]] == [
        ("runB.traces.jsonl", 1, f"Episode id {json.loads(lines[0])['id']}"),
        ("runB.traces.jsonl", 2, f"Episode id {again['id']}"),
        ("runB.traces.jsonl", 2, f"Episode id {again['id']}"),
        ("runB.traces.jsonl", 3, f"Episode id {json.loads(lines[2])['id']}"),
    ]


# ---------------------------------------------------------------- behaviours stated once (issue 50)


def test_reward_entries_weigh_one_without_weight_and_a_zero_sum_trains():
    from reassembler.formats.verifiers import parse_episode

    def reward_of(rewards):
        [r] = parse_episode(episode("x", [trace(_ok_nodes(), rewards)]))
        return r.reason, r.reward

    assert reward_of({"a": {"score": 0.25}, "b": {"score": 0.5, "weight": 2.0}}) == (None, 1.25)
    assert reward_of({"a": {"score": 1.0}, "b": {"score": -1.0}}) == (None, 0.0)  # exactly 0: trains


def test_a_link_type_that_is_no_string_and_a_logprob_past_float64_mask():
    from reassembler.formats.verifiers import parse_episode

    def first(change) -> tuple:
        ep = _with(change)
        [r] = parse_episode(json.loads(json.dumps(ep).replace("-9999.5", "-1e400")))
        return r.reason.value if r.reason else None, r.call_id

    assert first(lambda e, t, n: _set(n[4], "semantic_parents", [{"node": 2, "type": 7}])) == ("invalid_record", "4")
    assert first(lambda e, t, n: n[2]["logprobs"].__setitem__(0, -9999.5)) == ("invalid_logprob", "2")


def test_a_semantic_link_to_node_0_is_valid_and_a_mask_without_token_ids_is_no_tokenless_node():
    from reassembler.formats.verifiers import parse_episode

    def first(change) -> tuple:
        [r] = parse_episode(_with(change))
        return (r.reason.value, r.call_id, r.detail) if r.reason else (None, None, None)

    assert first(lambda e, t, n: _set(n[4], "semantic_parents", [{"node": 0, "type": "system"}])) == (None,) * 3
    assert first(lambda e, t, n: n.append(dict(prompt_node([], 4), mask=[False]))) == (
        "length_mismatch",
        "5",
        "node 5: 1 mask values for 0 token ids",
    )


def test_env_is_the_episodes_env_id_else_its_name():
    from reassembler.formats.verifiers import parse_episode

    def env_of(env) -> str | None:
        ep = _with(lambda e, t, n: _set(e, "env", env))
        return parse_episode(ep)[0].env

    assert env_of({"id": "swe-lite@2", "name": "swe-lite"}) == "swe-lite@2"
    assert env_of({"id": "", "name": "swe-lite"}) == env_of({"name": "swe-lite"}) == "swe-lite"
    assert env_of({"id": 7}) is None and env_of("swe-lite") is None


def test_a_policy_version_past_int64_gives_null_versions(tmp_path):
    nodes = [prompt_node([1], None), sampled_node([], [2], [-1.0], 0)]
    ep = episode("ep-big", [trace(nodes)])
    ep["run"] = {"work": {"policy": {"start": 2**63, "end": 2**63 + 1}}}
    root = write_traces(tmp_path / "in", [ep])
    _, [row], audit = build(root, tmp_path / "out")
    assert (row["weight_version_min"], row["weight_version_max"]) == (None, None) and audit["ep-big"]["status"] == "ok"


def test_a_repeated_episode_of_untrainable_traces_only_is_one_reject_row_counted_as_read(tmp_path):
    nodes = [prompt_node([1], None), sampled_node([], [2], [-1.0], 0)]
    judge = episode("ep-j", [trace(nodes, trainable=False)])
    root = write_traces(tmp_path / "in", [judge, judge, episode("ep-ok", [trace(nodes)])])
    summary, rows, audit = build(root, tmp_path / "out")
    assert set(audit) == {"ep-ok"} and len(rows) == 1
    assert (summary.load.rollouts.read, summary.load.rollouts.rejected) == (2, 1)  # the first line holds no rollout
    assert [(line, error) for _, line, error, _ in rejects(tmp_path / "out")] == [
        (2, "Episode id ep-j already seen in this night")
    ]
