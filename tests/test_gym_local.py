"""NeMo Gym's own on-disk capture (CONTRACT.md 9): local mode, Gym-rebuilt result lines, and
Gym's output-folder sidecars. Hand-written nights with every token spelled out, the night
NeMo Gym 0.7.0's own code wrote (tests/data/gym-0.7.0-local), and a property: a chain
written as full-prompt entries and as delta entries gives the same rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Built
from nights import DS, Night, answer, call, reasoning, tool_output, worked_example, worked_example_local
from reassembler.build import build_night
from reassembler.errors import InputError
from reassembler.formats.gym_local import float_array, int_array, tokens_digest
from reassembler.producer.gym_local import entry_line
from reassembler.settings import Options

DATA = Path(__file__).parent / "data" / "gym-0.7.0-local"
STRICT = Options(offchain="strict")
TERMINAL = Options(mode="terminal")

# The worked example's rows, tokens spelled out (CONTRACT.md 7): compacted into two chains
COMPACTED_IDS = [[101, 102, 103, 11, 12, 201, 21, 22], [301, 302, 31, 501, 502, 51, 52]]
COMPACTED_MASK = [[0, 0, 0, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 1, 1]]
PLAIN_IDS = [[101, 102, 103, 11, 12, 201, 21, 22, 301, 302, 31, 401, 41, 501, 502, 51, 52]]


def digest(ids: list[int]) -> str:
    import numpy as np

    return tokens_digest([np.asarray(ids, dtype=">u8").tobytes()], len(ids))


def entry(entries: list[dict], call_id: str) -> dict:
    return next(e for e in entries if e["model_call_id"] == call_id)


# -- the night NeMo Gym 0.7.0 wrote


def test_gyms_own_local_mode_night_builds_into_the_rows_it_expects(tmp_path):
    """Pointed at as written: rollouts and Gym's flat capture folder, no tokens folder."""
    expected = json.loads((DATA / "expected.json").read_text())
    summary = build_night(DATA, tmp_path / "out", expected["ds"])
    built = Built(tmp_path / "out", summary)
    assert set(built.audit) == {r["rollout_id"] for r in expected["rollouts"]}  # 8-2: a failed attempt's capture
    assert summary.load.gym.not_read == ["8-2"] and summary.load.n_rejects == 0
    for want in expected["rollouts"]:
        got = built.audit[want["rollout_id"]]
        assert (got["group_id"], got["slot"], got["reward"]) == (want["group_id"], want["slot"], want["reward"])
        assert got["status"] == want["status"]
        if want["status"] == "masked":
            assert got["reason"] == want["reason"]
            assert got["failed_call_id"] == want.get("failed_call_id")
            assert built.rows_of(want["rollout_id"]) == []
            continue
        rows = built.rows_of(want["rollout_id"])
        assert len(rows) == want["n_chains"] == got["n_segments"]
        assert got["n_ledger_calls"] == want["n_calls"]
        assert got["n_selected"] == len(want["kept_call_ids"])
        for row, chain in zip(rows, want["chains"]):
            assert row["model_call_ids"] == chain["model_call_ids"]
            assert row["input_ids"] == chain["input_ids"]
            assert row["loss_mask"] == chain["loss_mask"]
            assert row["logprobs"] == chain["logprobs"]
            assert row["prompt_len"] == chain["prompt_len"]
            assert digest(row["input_ids"]) == chain["leaf_digest"]
            assert row["weight_version_min"] is None and row["weight_version_max"] is None
            assert row["segment_count"] == want["n_chains"] and row["rollout_weight"] == 1 / want["n_chains"]
    compacted = built.audit["7-2"]
    assert (compacted["n_roots"], compacted["n_offchain"]) == (2, 1)  # the summarizer's call is off-chain


def test_a_symlinked_gym_night_is_read_through_its_links(tmp_path):
    """The README's way: link Gym's folders into the input root, convert nothing."""
    root = tmp_path / "input"
    for kind in ("rollouts", "ledger"):
        (root / kind).mkdir(parents=True)
        (root / kind / f"ds={DS}").symlink_to(DATA / kind / f"ds={DS}")
    built = Built(tmp_path / "out", build_night(root, tmp_path / "out", DS))
    assert {a["rollout_id"]: a["status"] for a in built.audit.values()} == {
        "7-0": "ok",
        "7-1": "ok",
        "7-2": "ok",
        "8-0": "masked",
        "8-1": "masked",
        "8-2-a1": "ok",
    }


# -- local mode, hand-written


@pytest.mark.parametrize("delta", [False, True], ids=["full prompts", "delta prompts"])
def test_the_worked_example_in_local_mode_gives_the_staged_rows(night, build, delta):
    worked_example_local(night, "grp_g0", compaction=True, delta=delta, reward=1.0)
    worked_example_local(night, "grp_g1", compaction=False, delta=delta, reward=0.0)
    built = build(night)
    assert [r["input_ids"] for r in built.rows_of("grp_g0")] == COMPACTED_IDS
    assert [r["loss_mask"] for r in built.rows_of("grp_g0")] == COMPACTED_MASK
    assert [r["logprobs"] for r in built.rows_of("grp_g0")] == [
        [0, 0, 0, -0.5, -0.5, 0, -0.5, -0.5],
        [0, 0, -0.5, 0, 0, -0.5, -0.5],
    ]
    assert [r["input_ids"] for r in built.rows_of("grp_g1")] == PLAIN_IDS
    assert [r["prompt_len"] for r in built.rows_of("grp_g0")] == [3, 2]
    assert [r["model_call_ids"] for r in built.rows_of("grp_g0")] == [["c1", "c2"], ["c3", "c5"]]
    assert [r["advantage"] for r in built.rows_of("grp_g0")] == [pytest.approx(0.5 / (0.5 + 1e-6))] * 2
    audit = built.audit["grp_g0"]
    assert (audit["n_ledger_calls"], audit["n_selected"], audit["n_offchain"], audit["n_roots"]) == (5, 4, 1, 2)
    assert built.summary.load.gym.local_rollouts == 2 and built.summary.load.gym.local_entries == 10


def test_a_night_of_local_mode_alone_needs_no_tokens_folder(night, build, tmp_path):
    worked_example_local(night, "grp_g0")
    inp = night.write()
    assert not (inp / "tokens").exists() and not (inp / "ledger" / f"ds={DS}" / "ledger.jsonl").exists()
    Built(tmp_path / "o", build_night(inp, tmp_path / "o", DS))
    (inp / "ledger" / f"ds={DS}" / "lineage.jsonl").write_text("")  # now a rollout could need token rows
    with pytest.raises(InputError, match=r"tokens/ds=2026-11-28: input partition folder is missing"):
        build_night(inp, tmp_path / "o2", DS)


def _masked(built: Built, rollout_id: str = "grp_g1") -> tuple:
    a = built.audit[rollout_id]
    assert built.rows_of(rollout_id) == [] and a["advantage"] is None
    return a["reason"], a["failed_call_id"], a["detail"]


def _one_bad(night: Night, **kw) -> list[dict]:
    worked_example_local(night, "grp_g0", reward=1.0)
    return worked_example_local(night, "grp_g1", reward=0.5, **kw)


def test_capture_retired_masks_a_line_without_rebuilt_tokens(night, build):
    _one_bad(night)
    night.local_files["grp_g1"] = {"state": {"retired": True}}
    assert _masked(build(night))[0] == "capture_retired"


@pytest.mark.parametrize(
    "damage, detail",
    [
        ("torn", "torn_final_line"),
        ("incomplete_file", "incomplete: c4"),
        ("incomplete_empty_id", "incomplete: ''"),
        ("state_flag", "the state file says incomplete: true"),
        ("dangling_intent", "intents without an entry: c6"),
    ],
)
def test_capture_incomplete_in_each_of_gyms_four_ways(night, build, damage, detail):
    entries = _one_bad(night)
    files = night.local_files.setdefault("grp_g1", {})
    if damage == "torn":
        night.local["grp_g1"] = [entry_line(e) for e in entries] + [entry_line(entries[0])[:40]]
    elif damage == "incomplete_file":
        files["incomplete"] = ["c4"]
    elif damage == "incomplete_empty_id":
        files["incomplete"] = [""]
    elif damage == "state_flag":
        files["state"] = {"incomplete": True}
    else:
        files["intents"] = ["c1", "c2", "c3", "c4", "c5", "c6"]
    reason, failed, got = _masked(build(night))
    assert (reason, failed, got) == ("capture_incomplete", None, detail)


def test_a_rollout_with_ledger_rows_and_local_entries_is_mixed_capture(night, build):
    worked_example(night, "grp_g0", reward=1.0)
    worked_example(night, "grp_g1", reward=0.5)
    worked_example_local(night, "grp_g1", reward=0.5)
    night.rollouts.pop()  # one result line for grp_g1: its capture is in both families
    reason, failed, detail = _masked(build(night))
    assert (reason, failed, detail) == ("mixed_capture", None, "ledger rows and grp_g1.tokens.jsonl: neither is read")


@pytest.mark.parametrize(
    "change, reason, failed, detail",
    [
        (
            lambda e: e[2].update(schema_version=2),
            "unsupported_version",
            "c3",
            "line 3: schema_version 2, only 1 is read",
        ),
        (lambda e: e[2].update(rollout_id="grp_g9"), "field_mismatch", "c3", None),
        (lambda e: e[2].update(parent_resolution="root", parent_call_id="c1"), "invalid_record", "c3", None),
        (lambda e: e[1].update(parent_resolution="resolved", parent_call_id=None), "invalid_record", "c2", None),
        (lambda e: e[0].update(prompt_is_delta=True), "invalid_record", "c1", None),
        (lambda e: e[1].update(generation_log_probs=[-0.5]), "invalid_record", "c2", None),
        (lambda e: e[1].update(token_item_index=7), "invalid_record", "c2", None),
        (lambda e: e[1].update(generation_token_ids=[21, 22.0]), "invalid_record", "c2", None),
        (lambda e: e[1].update(generation_token_ids=[21, True]), "digest_mismatch", "c2", None),  # lax: true is 1
        (lambda e: e[1].update(model_call_id=""), "invalid_record", None, None),
    ],
)
def test_a_line_gyms_validator_refuses_masks_the_rollout(night, build, change, reason, failed, detail):
    entries = _one_bad(night)
    change(entries)
    got = _masked(build(night))
    assert got[:2] == (reason, failed)
    if detail:
        assert got[2] == detail


@pytest.mark.parametrize("version, shown", [(True, "true"), (1.0, "1.0"), (False, "false"), ("1", '"1"')])
def test_a_schema_version_that_is_not_the_integer_1_is_unsupported(night, build, version, shown):
    """JSON `true` and `1.0` equal 1 in Python, not in the contract: only the integer 1 is read."""
    entries = _one_bad(night)
    entries[2]["schema_version"] = version
    assert _masked(build(night)) == ("unsupported_version", "c3", f"line 3: schema_version {shown}, only 1 is read")


def test_token_item_index_is_an_index_of_the_output_items(night, build):
    """c2 served two items: 0 and 1 are indexes of them, 2 (one past the end) and -1 are not."""
    for index, status in ((0, "ok"), (1, "ok"), (2, "masked"), (-1, "masked")):
        n = Night(night.root / f"index{index}")
        entries = _one_bad(n)
        assert len(entry(entries, "c2")["output_items"]) == 2
        entry(entries, "c2")["token_item_index"] = index
        built = build(n)
        assert built.audit["grp_g1"]["status"] == status, index
        if status == "masked":
            assert _masked(built)[:2] == ("invalid_record", "c2")
            assert f"token_item_index {index} is not an index of output_items" in _masked(built)[2]


def test_entry_digests_hash_each_line_without_its_surrounding_whitespace(night, build):
    """Gym's index holds sha256 of each line stripped of whitespace (9.4 item 5): lines written
    with blanks around them check against the digests of the bare lines, not of the padded."""
    import hashlib

    entries = _one_bad(night)
    bare = [entry_line(e) for e in entries]
    night.local["grp_g1"] = [b"  " + line + b" \t" for line in bare]
    size = sum(len(line) + 5 for line in bare)  # two blanks before, a blank and a tab after, the newline
    index = {e["model_call_id"]: hashlib.sha256(line).hexdigest() for e, line in zip(entries, bare)}
    night.local_files["grp_g1"] = {"state": {"entry_digests": index, "indexed_size": size}}
    built = build(night)
    assert built.audit["grp_g1"]["status"] == "ok"
    assert [r["input_ids"] for r in built.rows_of("grp_g1")] == COMPACTED_IDS
    padded = Night(night.root / "padded-digests")
    entries = _one_bad(padded)
    padded.local["grp_g1"] = [b"  " + entry_line(e) + b" \t" for e in entries]
    c2 = hashlib.sha256(b"  " + entry_line(entry(entries, "c2")) + b" \t").hexdigest()
    padded.local_files["grp_g1"] = {"state": {"entry_digests": {"c2": c2}, "indexed_size": size}}
    reason, failed, detail = _masked(build(padded))
    assert (reason, failed) == ("digest_mismatch", "c2") and detail.endswith(f"!= {c2}")


@pytest.mark.timeout(30)
def test_two_delta_entries_that_name_each_other_as_parents_are_a_lineage_cycle(night, build):
    """c2 and c5, delta prompts, each the other's parent: neither full sequence can be
    rebuilt. The load finishes; the walk from the terminal masks lineage_cycle, selection
    broken_chain (c2 follows c1 in the output, but names c5); the other rollout is built."""
    entries = _one_bad(night, delta=True)
    entry(entries, "c2")["parent_call_id"] = "c5"
    entry(entries, "c5")["parent_call_id"] = "c2"
    assert entry(entries, "c2")["prompt_is_delta"] and entry(entries, "c5")["prompt_is_delta"]
    terminal = build(night, TERMINAL)
    assert _masked(terminal)[:2] == ("lineage_cycle", "c5")
    selected = build(night)
    assert _masked(selected)[0] == "broken_chain" and selected.audit["grp_g0"]["status"] == "ok"


def test_a_corrupt_line_before_others_is_invalid_record_not_torn(night, build):
    entries = _one_bad(night)
    lines = [entry_line(e) for e in entries]
    night.local["grp_g1"] = [lines[0], b'{"model_call_id": "c', *lines[1:]]
    reason, failed, detail = _masked(build(night))
    assert (reason, failed) == ("invalid_record", None) and detail.startswith("line 2: not valid JSON")


def test_the_same_line_twice_is_one_entry_a_different_one_is_a_duplicate(night, build):
    entries = _one_bad(night)
    night.local["grp_g1"] = [entry_line(e) for e in entries] + [entry_line(entries[1])]
    built = build(night)
    assert built.audit["grp_g1"]["status"] == "ok" and built.audit["grp_g1"]["n_ledger_calls"] == 5
    night2 = Night(night.root / "again")
    entries = _one_bad(night2)
    night2.local["grp_g1"] = entries + [dict(entries[1], created_at=1.0)]
    assert _masked(build(night2))[:2] == ("duplicate_call_id", None)


def test_entry_digests_are_checked_only_when_gyms_index_covers_the_file(night, build):
    entries = _one_bad(night)
    lines = [entry_line(e) for e in entries]
    night.local["grp_g1"] = lines
    stale = "0" * 64
    night.local_files["grp_g1"] = {"state": {"entry_digests": {"c2": stale}}}
    reason, failed, detail = _masked(build(night))
    assert (reason, failed) == ("digest_mismatch", "c2") and detail.endswith(f"!= {stale}")
    other = Night(night.root / "stale-index")
    _one_bad(other)
    other.local_files["grp_g1"] = {"state": {"entry_digests": {"c2": stale}, "indexed_size": 10}}
    assert build(other).audit["grp_g1"]["status"] == "ok"  # Gym rebuilds such an index: ignored


def _call_fault(night: Night, call_id: str, **fields) -> None:
    entries = _one_bad(night)
    entry(entries, call_id).update(fields)


@pytest.mark.parametrize("delta", [False, True], ids=["full", "delta"])
def test_each_entrys_own_checks_mask_on_the_chain(tmp_path, delta):
    """c5 is the leaf of the second chain: its prompt holds c3's tokens (full) or only its
    carried tokens (delta)."""
    cases = {
        "length_mismatch": dict(cum_len=99),
        "invalid_record": dict(digest=None),
        "digest_mismatch": dict(generation_token_ids=[51, 53]),
        "invalid_token": dict(generation_token_ids=[51, 2**31]),
        "empty_generation": dict(generation_token_ids=[], generation_log_probs=[], cum_len=5),
        "invalid_logprob": dict(generation_log_probs=[-0.5, None]),
    }
    for reason, fields in cases.items():
        n = Night(tmp_path / reason)
        worked_example_local(n, "grp_g0", reward=1.0, delta=delta)
        entries = worked_example_local(n, "grp_g1", reward=0.5, delta=delta)
        entry(entries, "c5").update(fields)
        built = Built(tmp_path / reason / "out", build_night(n.write(), tmp_path / reason / "out", DS))
        assert _masked(built)[:2] == (reason, "c5"), (reason, _masked(built))
        assert built.audit["grp_g0"]["status"] == "ok"


def test_a_full_prompt_that_does_not_extend_its_parent_is_prefix_mismatch(night, build):
    entries = _one_bad(night)
    c5 = entry(entries, "c5")  # prompt: c3's 3 tokens, then 501, 502
    c5["prompt_token_ids"] = [301, 399, 31, 501, 502]
    c5["digest"] = digest(c5["prompt_token_ids"] + c5["generation_token_ids"])
    reason, failed, detail = _masked(build(night))
    assert (reason, failed) == ("prefix_mismatch", "c5") and "parent c3's 3 tokens" in detail


def test_a_parent_longer_than_the_childs_prompt_is_parent_length_mismatch(night, build):
    entries = _one_bad(night)
    c5 = entry(entries, "c5")
    c5["prompt_token_ids"] = [301, 302]  # shorter than c3's 3 tokens
    c5["cum_len"] = 4
    c5["digest"] = digest([301, 302, 51, 52])
    assert _masked(build(night))[:2] == ("parent_length_mismatch", "c5")


def test_a_delta_entry_whose_parent_is_lost_is_missing_parent(night, build):
    entries = _one_bad(night, delta=True)
    entry(entries, "c5")["parent_call_id"] = "c9"  # a call whose entry is not in the file
    assert _masked(build(night))[:2] == ("broken_chain", "c5")  # selected after c3, not its child
    assert _masked(build(night, TERMINAL))[:2] == ("missing_parent", "c5")


def test_unresolved_entries_are_poison_rows(night, build):
    """Off-chain and faulty under the default policy; capture_poisoned under strict."""
    c1 = call("c1", None, [101, 102, 103], [11, 12], [reasoning("r1"), answer("a1")])
    lost = call("c1b", None, [], [], [], poison="no_match")
    c2 = call("c2", "c1", [201], [21, 22], [reasoning("r2"), answer("a2")])
    worked_example_local(night, "grp_g0", reward=1.0)
    night.add_local("grp_g1", [c1, lost, c2], [reasoning("r1"), answer("a1"), reasoning("r2"), answer("a2")], 0.5)
    built = build(night)
    audit = built.audit["grp_g1"]
    assert (audit["status"], audit["n_offchain"], audit["n_offchain_faults"], audit["n_roots"]) == ("ok", 1, 1, 1)
    assert [r["input_ids"] for r in built.rows_of("grp_g1")] == [[101, 102, 103, 11, 12, 201, 21, 22]]
    strict = build(night, STRICT)
    reason, failed, detail = _masked(strict)
    assert (reason, failed, detail) == ("capture_poisoned", None, "poison rows: c1b (unresolved_parent)")


def test_an_absent_parent_resolution_reads_as_gyms_compatibility_callers_do(night, build):
    """Without parent_resolution, an entry with a parent is resolved, one without is
    unresolved (a poison row, never selected)."""
    entries = _one_bad(night)
    for e in entries:
        if e["parent_call_id"] is not None:
            del e["parent_resolution"]
    assert build(night).audit["grp_g1"]["status"] == "ok"
    del entry(entries, "c1")["parent_resolution"]
    assert _masked(build(night))[:3] == ("unmatched_output", None, "item 0: no call produced it")


def test_a_faulty_off_chain_entry_counts_and_masks_only_under_strict(night, build):
    entries = _one_bad(night)
    entry(entries, "c4")["generation_token_ids"] = [42]  # c4 is off-chain; its digest no longer holds
    built = build(night)
    assert built.audit["grp_g1"]["status"] == "ok" and built.audit["grp_g1"]["n_offchain_faults"] == 1
    assert _masked(build(night, STRICT))[:2] == ("digest_mismatch", "c4")


def test_terminal_mode_reads_local_capture_too(night, build):
    worked_example_local(night, "grp_g0", compaction=False, reward=1.0)
    worked_example_local(night, "grp_g1", compaction=True, reward=0.5)
    built = build(night, TERMINAL)
    assert [r["input_ids"] for r in built.rows_of("grp_g0")] == PLAIN_IDS
    assert _masked(built)[:2] == ("history_rewritten", "c5")


# -- rebuilt result lines (CONTRACT.md 9.10)


def _chain():
    return [
        call("c1", None, [101, 102, 103], [11, 12], [reasoning("r1"), answer("a1")]),
        call("c2", "c1", [201], [21, 22], [reasoning("r2"), answer("a2")]),
        call("c3", "c2", [301, 302], [31], [reasoning("r3"), answer("a3")], logprob=-0.25),
    ]


def test_a_gym_rebuilt_line_becomes_one_row_of_its_token_items(night, build):
    worked_example_local(night, "grp_g0", reward=1.0)
    line = night.add_rebuilt("grp_g1", _chain(), reward=0.0)
    night.local["grp_g1"] = []  # its capture, retired by Gym: not read
    night.local_files["grp_g1"] = {"state": {"retired": True}}
    built = build(night)
    [row] = built.rows_of("grp_g1")
    assert row["input_ids"] == [101, 102, 103, 11, 12, 201, 21, 22, 301, 302, 31]
    assert row["loss_mask"] == [0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1]
    assert row["logprobs"] == [0, 0, 0, -0.5, -0.5, 0, -0.5, -0.5, 0, 0, -0.25]
    assert (row["prompt_len"], row["model_call_ids"], row["segment_count"], row["rollout_weight"]) == (3, [], 1, 1.0)
    assert row["weight_version_min"] is None
    audit = built.audit["grp_g1"]
    assert (audit["n_selected"], audit["n_segments"], audit["n_ledger_calls"], audit["n_roots"]) == (3, 1, 0, 0)
    assert (audit["n_offchain"], audit["n_offchain_faults"]) == (0, 0)
    assert row["advantage"] == pytest.approx(-0.5 / (0.5 + 1e-6))  # in its group with the local-mode rollout
    assert built.summary.load.gym.rebuilt == 1
    assert len(line["response"]["output"]) == 6


def _rebuilt_fault(night: Night, change) -> dict:
    worked_example_local(night, "grp_g0", reward=1.0)
    line = night.add_rebuilt("grp_g1", _chain(), reward=0.0)
    change(line, [i for i in line["response"]["output"] if "generation_token_ids" in i])
    return line


@pytest.mark.parametrize(
    "change, reason, detail",
    [
        (
            lambda line, items: line.update(mask_sample=True),
            "producer_masked",
            '{"chains":1,"delivered_fraction":1.0}',
        ),
        (lambda line, items: [i.update(generation_token_ids=[]) for i in items], "missing_tokens", None),
        (lambda line, items: items[1].update(prompt_token_ids=None), "invalid_record", "item 3"),
        (lambda line, items: items[1].update(generation_log_probs=[-0.5]), "length_mismatch", "item 3"),
        (
            lambda line, items: items[1].update(generation_token_ids=[], generation_log_probs=[]),
            "empty_generation",
            "item 3",
        ),
        (lambda line, items: items[0].update(generation_token_ids=[11, True]), "invalid_token", "item 1"),
        (lambda line, items: items[0].update(generation_token_ids=[11, 12.0]), "invalid_token", "item 1"),
        (lambda line, items: items[2].update(generation_token_ids=[2**31]), "invalid_token", "item 5"),
        (lambda line, items: items[2].update(generation_log_probs=[None]), "invalid_logprob", "item 5"),
        (lambda line, items: items[2].update(generation_log_probs=[True]), "invalid_logprob", "item 5"),
        (lambda line, items: items[2]["prompt_token_ids"].__setitem__(0, 999), "prefix_mismatch", "item 5"),
    ],
)
def test_each_check_of_a_rebuilt_line(night, build, change, reason, detail):
    _rebuilt_fault(night, change)
    got_reason, failed, got_detail = _masked(build(night))
    assert (got_reason, failed) == (reason, None)
    if detail is not None:
        assert got_detail == detail or got_detail.startswith(detail + ":"), got_detail


@pytest.mark.parametrize("bad", [2**31, -1])
def test_a_prompt_id_out_of_range_in_a_rebuilt_line_is_invalid_token(night, build, bad):
    """The prompt's ids are checked as the generated ones are, in every token item."""
    for k in range(3):
        n = Night(night.root / f"item{k}-{bad}")
        _rebuilt_fault(n, lambda line, items, k=k: items[k]["prompt_token_ids"].__setitem__(-1, bad))
        reason, failed, detail = _masked(build(n))
        assert (reason, failed) == ("invalid_token", None) and detail.startswith(f"item {2 * k + 1}:"), (k, detail)


def test_a_rebuilt_prompt_equal_to_the_sequence_before_carries_no_token(night, build):
    """A call whose prompt is exactly the previous call's prompt and generation (no
    observation between): it adds only its generation."""
    worked_example_local(night, "grp_g0", reward=1.0)
    calls = _chain()
    calls[1] = call("c2", "c1", [], [21, 22], [reasoning("r2"), answer("a2")])
    night.add_rebuilt("grp_g1", calls, reward=0.0)
    [row] = build(night).rows_of("grp_g1")
    assert row["input_ids"] == [101, 102, 103, 11, 12, 21, 22, 301, 302, 31]
    assert row["loss_mask"] == [0, 0, 0, 1, 1, 1, 1, 0, 0, 1]
    assert row["logprobs"] == [0, 0, 0, -0.5, -0.5, -0.5, -0.5, 0, 0, -0.25]


def test_token_items_without_marks_are_rebuilt_only_when_gym_retired_the_capture(night, build):
    """An unmarked line with token items: Gym-rebuilt if its state file says retired; else
    an ordinary line, read from its capture."""
    worked_example_local(night, "grp_g0", reward=1.0)
    line = night.add_rebuilt("grp_g1", _chain(), reward=0.0)
    del line["_ng_token_capture"]
    night.local_files["grp_g1"] = {"state": {"retired": True}}
    night.local["grp_g1"] = []
    assert build(night).audit["grp_g1"]["n_selected"] == 3
    other = Night(night.root / "not-retired")
    worked_example_local(other, "grp_g0", reward=1.0)
    line = other.add_rebuilt("grp_g1", _chain(), reward=0.0)
    del line["_ng_token_capture"]
    built = build(other)
    assert _masked(built)[0] == "empty_ledger"  # read as an ordinary line: no capture of its own


# -- Gym's output folder (CONTRACT.md 2.1)


def _failures(night: Night, rows: list[dict]) -> None:
    path = night.root / "input" / "rollouts" / f"ds={night.ds}" / "rollouts_failures.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_failed_attempts_capture_makes_no_reject_and_no_row(night, build, tmp_path):
    worked_example_local(night, "grp_g0", reward=1.0)
    worked_example(night, "grp_g1", reward=0.0)
    worked_example(night, "3-1", reward=0.0, group_id="3", slot=1)  # attempt 0 of task 3 sample 1, failed
    night.rollouts.pop()
    worked_example_local(night, "4-0", reward=0.0, group_id="4", slot=0)  # a local-mode failed attempt
    night.rollouts.pop()
    inp = night.write()
    _failures(
        night,
        [
            {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_failure_class": "http_error"},
            {"_ng_task_index": 4, "_ng_rollout_index": 0, "_ng_failure_class": "http_error"},
        ],
    )
    built = Built(tmp_path / "out", build_night(inp, tmp_path / "out", DS))
    assert built.summary.load.n_rejects == 0 and built.summary.load.gym.not_read == []
    assert str(built.summary.load.ledger) == "10 read = 5 loaded + 0 rejected + 5 of failed attempts"
    assert set(built.audit) == {"grp_g0", "grp_g1"}  # neither sample was given up: Gym would retry them
    no_failures = tmp_path / "again"
    shutil.copytree(inp, no_failures)
    (no_failures / "rollouts" / f"ds={DS}" / "rollouts_failures.jsonl").unlink()
    again = build_night(no_failures, tmp_path / "out2", DS)
    assert again.load.ledger.rejected == 5 and again.load.gym.not_read == ["4-0"]  # orphans of no failed attempt


def test_samples_gym_gave_up_on_get_one_masked_audit_row(night, build, tmp_path):
    worked_example(night, "grp_g0", reward=1.0)
    night.write()
    _failures(
        night,
        [
            {"_ng_task_index": 5, "_ng_rollout_index": 0, "_ng_failure_class": "timeout"},
            {"_ng_task_index": 5, "_ng_rollout_index": 0, "_ng_attempt_index": 1, "_ng_failure_class": "timeout"},
            {"_ng_task_index": 5, "_ng_rollout_index": 0, "_ng_attempt_index": 2, "_ng_failure_class": "oom"},
            {"_ng_task_index": 6, "_ng_rollout_index": 1, "_ng_failure_class": "env", "_ng_failure_terminal": True},
            {"_ng_task_index": 7, "_ng_rollout_index": 0, "_ng_failure_class": "http_error"},  # retried on resume
            {"_ng_task_index": 8},  # no key: a reject row
        ],
    )
    summary = build_night(night.root / "input", tmp_path / "out", DS)
    built = Built(tmp_path / "out", summary)
    gave_up = {k: (a["group_id"], a["slot"], a["reason"], a["detail"]) for k, a in built.audit.items() if k != "grp_g0"}
    assert gave_up == {"5-0-a2": ("5", 0, "rollout_failed", "oom"), "6-1": ("6", 1, "rollout_failed", "env")}
    assert summary.load.gym.given_up == 2 and summary.load.n_rollouts == 3 and summary.load.n_rejects == 1
    assert [r["row_id"] for r in built.rows] == ["grp_g0_s0", "grp_g0_s1"]


def test_a_sample_that_fails_first_non_terminally_then_terminally_is_given_up(night, build, tmp_path):
    """Gym retries a non-terminal failure and gives up at a terminal one: the sample is one
    masked audit row, named after its last attempt, whatever came before; a sample whose
    failures are all non-terminal (fewer than 3) is not given up."""
    worked_example(night, "grp_g0", reward=1.0)
    night.write()
    _failures(
        night,
        [
            {"_ng_task_index": 9, "_ng_rollout_index": 0, "_ng_failure_class": "timeout"},
            {"_ng_task_index": 9, "_ng_rollout_index": 1, "_ng_failure_class": "timeout"},
            {
                "_ng_task_index": 9,
                "_ng_rollout_index": 0,
                "_ng_attempt_index": 1,
                "_ng_failure_class": "env",
                "_ng_failure_terminal": True,
            },
            {"_ng_task_index": 9, "_ng_rollout_index": 1, "_ng_attempt_index": 1, "_ng_failure_class": "timeout"},
        ],
    )
    summary = build_night(night.root / "input", tmp_path / "out", DS)
    built = Built(tmp_path / "out", summary)
    gave_up = {k: (a["group_id"], a["slot"], a["reason"], a["detail"]) for k, a in built.audit.items() if k != "grp_g0"}
    assert gave_up == {"9-0-a1": ("9", 0, "rollout_failed", "env")}
    assert summary.load.gym.given_up == 1


def test_a_night_of_all_three_captures_in_one_group(night, build):
    """Staged, local and rebuilt rollouts of one group share one advantage baseline."""
    worked_example(night, "grp_g0", reward=1.0)
    worked_example_local(night, "grp_g1", reward=0.0, delta=True)
    night.add_rebuilt("grp_g2", _chain(), reward=0.5)
    built = build(night)
    assert [built.audit[r]["status"] for r in ("grp_g0", "grp_g1", "grp_g2")] == ["ok"] * 3
    assert [r["input_ids"] for r in built.rows_of("grp_g0")] == [r["input_ids"] for r in built.rows_of("grp_g1")]
    advantages = {r["rollout_id"]: r["advantage"] for r in built.rows}
    assert advantages["grp_g0"] == pytest.approx(1.2247, abs=1e-3) and advantages["grp_g2"] == pytest.approx(0.0)
    with duckdb.connect(str(built.output / "warehouse.duckdb"), read_only=True) as con:  # where each came from
        modes = dict(con.execute("SELECT rollout_id, capture FROM rollouts ORDER BY 1").fetchall())
    assert modes == {"grp_g0": "staged", "grp_g1": "local", "grp_g2": "rebuilt"}


def test_capture_files_of_no_rollout_are_named_not_read_and_bad_keys_rejected(night, build, tmp_path):
    worked_example_local(night, "grp_g0", reward=1.0)
    worked_example_local(night, "lost_g1", reward=1.0)
    night.rollouts.pop()
    inp = night.write()
    (inp / "ledger" / f"ds={DS}" / "bad key.tokens.jsonl").write_text("{}\n")
    summary = build_night(inp, tmp_path / "out", DS)
    assert summary.load.gym.not_read == ["lost_g1"] and summary.load.n_rejects == 1
    assert "not read 1 local-mode captures of no rollout and no failed attempt: lost_g1" in "\n".join(
        summary.load.lines()
    )


# -- the property: full-prompt and delta entries are one capture


@st.composite
def _chains(draw):
    """A rollout of 1-3 chains (a compaction starts each), each of 1-4 calls of random tokens."""
    calls, output, k = [], [], 0
    for _ in range(draw(st.integers(1, 3))):
        parent = None
        for _ in range(draw(st.integers(1, 4))):
            k += 1
            carried = draw(st.lists(st.integers(0, 2**31 - 1), min_size=0 if parent else 1, max_size=6))
            generated = draw(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6))
            items = [reasoning(f"r{k}"), answer(f"a{k}")]
            calls.append(call(f"c{k}", parent, carried, generated, items, logprob=-0.125 * k))
            output += items + [tool_output(f"o{k}")]
            parent = f"c{k}"
    return calls, output


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_chains(), st.integers(0, 2**32 - 1))
def test_full_prompt_and_delta_entries_give_the_same_rows(tmp_path_factory, chains, seed):
    """The same chains captured with full prompts, delta prompts, a mix of both, and staged:
    four rollouts of one night, the same rows each."""
    calls, output = chains
    root = tmp_path_factory.mktemp("night")
    n = Night(root)
    mixed = lambda c: (hash((c.call_id, seed)) % 2) == 0  # noqa: E731
    for kind, delta in (("full", False), ("delta", True), ("mixed", mixed)):
        n.add_local(f"{kind}_g0", calls, output, delta=delta)
    n.add("staged_g0", calls, output)
    built = Built(root / "out", build_night(n.write(), root / "out", DS))
    rows = []
    for kind in ("full", "delta", "mixed", "staged"):
        assert built.audit[f"{kind}_g0"]["status"] == "ok", built.audit[f"{kind}_g0"]
        picked = built.rows_of(f"{kind}_g0")
        rows.append([(r["input_ids"], r["loss_mask"], r["logprobs"], r["prompt_len"]) for r in picked])
    assert rows[0] == rows[1] == rows[2] == rows[3] and rows[0]


def test_gyms_tokens_digest_of_the_fixture_entries():
    """Every entry of Gym's own night hashes as formats/gym_local.py says (9.5)."""
    for path in sorted((DATA / "ledger" / f"ds={DS}").glob("7-0.tokens.jsonl")):
        for line in path.read_bytes().splitlines():
            e = orjson.loads(line)
            assert e["prompt_is_delta"] is False
            assert digest(e["prompt_token_ids"] + e["generation_token_ids"]) == e["digest"]


_elements = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.integers(2**63, 2**70) | st.integers(-(2**70), -(2**63) - 1),
    st.floats(allow_nan=False),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_elements, max_size=6))
def test_token_lists_are_read_exactly_or_refused(values):
    """int_array: integers (JSON true / false as 1 / 0) in int64 as they are; a list with an
    element of another type is refused (TypeError: invalid_record), a list of integers one of
    which is beyond int64 is OverflowError (invalid_token); strictly, booleans are refused
    too. float_array: numbers as float64, null as NaN."""
    ints = all(isinstance(v, int) for v in values)
    for strict in (False, True):
        if ints and not (strict and any(isinstance(v, bool) for v in values)):
            if all(-(2**63) <= v < 2**63 for v in values):
                got = int_array(values, strict=strict)
                assert got.dtype == np.int64 and got.tolist() == [int(v) for v in values]
            else:
                with pytest.raises(OverflowError):
                    int_array(values, strict=strict)
        elif all(isinstance(v, int) and -(2**63) <= v < 2**63 for v in values):  # booleans, strictly
            with pytest.raises(TypeError):
                int_array(values, strict=strict)
        else:  # which of the two, when both an intruder and a huge integer are there, is not said
            with pytest.raises((TypeError, OverflowError)):
                int_array(values, strict=strict)
    numbers = all(v is None or (isinstance(v, (int, float)) and abs(v) < 2**53) for v in values)
    if numbers:
        got = float_array(values)
        assert got.tolist() == pytest.approx([float("nan") if v is None else float(v) for v in values], nan_ok=True)
    elif any(isinstance(v, (str, list)) for v in values):
        with pytest.raises(TypeError):
            float_array(values)


# -- the audit product shows the capture


def test_explain_walks_a_local_mode_rollout_entry_by_entry(night, build):
    worked_example_local(night, "grp_g0", reward=1.0, delta=True)
    entries = worked_example_local(night, "grp_g1", reward=0.5)
    entry(entries, "c4")["generation_token_ids"] = [42]  # off-chain, faulty
    built = build(night)
    from reassembler.audit.explain import explain

    text = explain(built.output, DS, "grp_g1").text()
    assert "capture: NeMo Gym local mode" in text
    assert "entry line 1 c1: root, full prompt of 3 tokens, 2 generated, cum_len 5: checks pass" in text
    assert "entry line 4 c4: child of c3, full prompt of 4 tokens, 1 generated, cum_len 5: digest_mismatch" in text
    assert "row grp_g1_s1: calls [c3, c5], 7 tokens, 3 generated, prompt_len 2" in text
    delta = explain(built.output, DS, "grp_g0").text()
    assert "entry line 2 c2: child of c1, delta prompt of 1 tokens, 2 generated, cum_len 8: checks pass" in delta
    assert "warning" not in text + delta


def test_explain_replays_a_rebuilt_line(night, build):
    night.add_rebuilt("grp_g0", _chain(), reward=1.0)
    built = build(night)
    from reassembler.audit.explain import explain

    text = explain(built.output, DS, "grp_g0").text()
    assert "capture: a result line NeMo Gym rebuilt itself" in text
    assert "Gym-rebuilt line rollouts.jsonl:1: 3 token items" in text
    assert "result: ok, 1 row" in text and "warning" not in text


def test_the_reports_show_each_captures_rollouts_and_mask_rate(night, build):
    worked_example(night, "grp_g0", reward=1.0)
    worked_example_local(night, "grp_g1", reward=0.0)
    night.local_files["grp_g1"] = {"incomplete": ["c2"]}
    night.add_rebuilt("grp_g2", _chain(), reward=0.5)
    built = build(night)
    from reassembler.audit.quality import night_quality
    from reassembler.audit.report_text import report

    assert "  2026-11-28: local 1 (100.0% masked), rebuilt 1 (0.0% masked), staged 1 (0.0% masked)" in report(
        built.output
    )
    with duckdb.connect(str(built.output / "warehouse.duckdb"), read_only=True) as con:
        q = night_quality(con, DS)
    by_capture = {g["value"]: (g["rollouts"], g["masked"]) for g in q["breakdowns"]["capture"]}
    assert by_capture == {"staged": (1, 0), "NeMo Gym local mode": (1, 1), "Gym-rebuilt line": (1, 0)}
    from reassembler.build import report_step
    from reassembler.warehouse import Warehouse

    page = Path(report_step(Warehouse(built.output), DS)).read_text()
    table = page[page.index("Rollouts by capture") :].split("</table>")[0]
    assert '<td>NeMo Gym local mode</td><td class="n">1</td><td class="n">1</td><td class="n">100.0%</td>' in table


def test_a_chain_whose_digests_would_hash_past_the_budget_is_masked_unhashed(night, build):
    """Each entry's digest covers its whole sequence: 500 one-token deltas on a 600,000-token
    root would hash 300M ids. A rollout's digests hash at most MAX_HASHED_TOKENS (2**28) ids in
    all; the entry past it is not hashed and masks the chain as invalid_record, saying so."""
    from reassembler.load.local_calls import MAX_HASHED_TOKENS

    root, k = 600_000, 500
    calls = [call("c0", None, list(range(1, root)), [7], [answer("a0")])]
    calls += [call(f"c{i}", f"c{i - 1}", [5], [7], [answer(f"a{i}")]) for i in range(1, k)]
    night.add_local("big_g0", calls, [answer(f"a{i}") for i in range(k)], delta=True)
    worked_example_local(night, "grp_g0", delta=True)  # beside it: a rollout that trains
    built = build(night)
    a = built.audit["big_g0"]
    first_past = MAX_HASHED_TOKENS // root  # entry i covers root + 2i tokens; c0 .. c446 fit
    assert (a["status"], a["reason"]) == ("masked", "invalid_record")
    assert a["failed_call_id"] == f"c{first_past}", a
    assert f"past the {MAX_HASHED_TOKENS:,} a rollout's entry digests may hash in all" in a["detail"]
    assert built.audit["grp_g0"]["status"] == "ok"


def test_a_capture_file_or_an_entry_line_past_its_limit_masks_its_rollout_unparsed(night, build, monkeypatch):
    """The load holds a rollout's capture files whole: an entries file past MAX_FILE_BYTES is
    read no further than the limit and its rollout is invalid_record; an entry line past
    MAX_LINE_BYTES (the file under the limit; a line past DuckDB's MAX_OBJECT_BYTES goes to the
    line reader, which checks it) is invalid_record, not parsed. The rollout beside them trains.
    (The limits lowered here; at their defaults 48 MiB, 32 MiB and 16 MiB.)"""
    from reassembler.load import entry_reader, local_capture

    monkeypatch.setattr(local_capture, "MAX_FILE_BYTES", 6_000)
    monkeypatch.setattr(local_capture, "MAX_LINE_BYTES", 2_000)
    monkeypatch.setattr(entry_reader, "MAX_OBJECT_BYTES", 1_000)
    long_prompt = list(range(1, 800))  # one entry line of ~3 KB (and a file of ~3 KB)
    night.add_local("line_g0", [call("c0", None, long_prompt, [7], [answer("a0")])], [answer("a0")])
    many = [call("c0", None, list(range(1, 300)), [7], [answer("a0")])]
    many += [call(f"c{i}", f"c{i - 1}", [5], [7], [answer(f"a{i}")]) for i in range(1, 4)]
    night.add_local("file_g0", many, [answer(f"a{i}") for i in range(4)])  # full prompts: lines of 1-2 KB
    worked_example_local(night, "grp_g0")
    inp = night.write()
    sizes = {p.name: p.stat().st_size for p in inp.rglob("*_g0.tokens.*")}
    assert sizes["file_g0.tokens.jsonl"] > 6_000 and 2_000 < sizes["line_g0.tokens.jsonl"] <= 6_000, sizes
    assert max(s for name, s in sizes.items() if not name.endswith(".jsonl")) < 6_000, sizes
    built = Built(tmp_path := inp.parent / "out", build_night(inp, tmp_path, night.ds))
    line, file = built.audit["line_g0"], built.audit["file_g0"]
    assert (line["status"], line["reason"]) == ("masked", "invalid_record")
    assert (
        line["detail"].startswith("line 1 of line_g0.tokens.jsonl: ")
        and "over the 2,000 an entry line" in line["detail"]
    )
    assert (file["status"], file["reason"]) == ("masked", "invalid_record")
    assert file["detail"] == "file_g0.tokens.jsonl: more than the 6,000 bytes a capture file may hold; not read"
    assert built.audit["grp_g0"]["status"] == "ok"


def test_an_entry_adding_more_tokens_than_one_token_row_may_hold_masks_its_rollout(night, build, monkeypatch):
    """A derived token row is read alone up to twice the row-group bound (formats/token_pieces.py):
    an entry whose new tokens pass MAX_ROW_TOKENS is invalid_record after its digest is checked,
    naming it, and no token row is written for it (lowered to 500 here; 2^23 by default)."""
    from reassembler.load import local_calls

    monkeypatch.setattr(local_calls, "MAX_ROW_TOKENS", 500)
    calls = [call("c0", None, list(range(1, 300)), [7], [answer("a0")])]
    calls += [call("c1", "c0", list(range(1, 400)), [7], [answer("a1")])]  # a delta: adds 400 tokens, fits
    calls += [call("c2", "c1", list(range(1, 600)), [7], [answer("a2")])]  # adds 600: past 500
    night.add_local("big_g0", calls, [answer(f"a{i}") for i in range(3)], delta=True)
    worked_example_local(night, "grp_g0")
    built = build(night)
    a = built.audit["big_g0"]
    assert (a["status"], a["reason"], a["failed_call_id"]) == ("masked", "invalid_record", "c2")
    assert a["detail"] == "it adds 600 tokens, over the 500 one token row may hold; not read"
    assert built.audit["grp_g0"]["status"] == "ok"
