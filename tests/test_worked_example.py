"""CONTRACT.md section 7, with every token written out and checked row by row."""

from nights import answer, call, reasoning, worked_example
from reassembler.settings import Options


def test_without_compaction_one_row_of_all_five_calls(night, build):
    worked_example(night, "group_g0", compaction=False, reward=1.0)
    built = build(night)
    [row] = built.rows
    assert row["row_id"] == "group_g0_s0"
    assert row["model_call_ids"] == ["c1", "c2", "c3", "c4", "c5"]
    assert row["input_ids"] == [101, 102, 103, 11, 12, 201, 21, 22, 301, 302, 31, 401, 41, 501, 502, 51, 52]
    assert row["loss_mask"] == [0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1]
    assert row["logprobs"] == [0, 0, 0, -0.5, -0.5, 0, -0.5, -0.5, 0, 0, -0.5, 0, -0.5, 0, 0, -0.5, -0.5]
    assert (row["prompt_len"], row["n_tokens"], row["n_generated"]) == (3, 17, 8)
    assert (row["segment_index"], row["segment_count"], row["rollout_weight"]) == (0, 1, 1.0)
    assert row["advantage"] == 0.0  # alone in its group
    audit = built.audit["group_g0"]
    assert (audit["status"], audit["n_selected"], audit["n_offchain"], audit["n_roots"]) == ("ok", 5, 0, 1)


def test_with_compaction_two_rows_and_c4_off_chain(night, build):
    worked_example(night, "group_g0", compaction=True, reward=1.0)
    worked_example(night, "group_g1", compaction=False, reward=0.0)
    built = build(night)
    s0, s1 = built.rows_of("group_g0")
    assert (s0["row_id"], s1["row_id"]) == ("group_g0_s0", "group_g0_s1")
    assert s0["model_call_ids"] == ["c1", "c2"] and s1["model_call_ids"] == ["c3", "c5"]
    assert s0["input_ids"] == [101, 102, 103, 11, 12, 201, 21, 22]
    assert s0["loss_mask"] == [0, 0, 0, 1, 1, 0, 1, 1]
    assert s1["input_ids"] == [301, 302, 31, 501, 502, 51, 52]
    assert s1["loss_mask"] == [0, 0, 1, 0, 0, 1, 1]
    assert (s0["prompt_len"], s1["prompt_len"]) == (3, 2)
    assert s0["segment_count"] == s1["segment_count"] == 2
    assert s0["rollout_weight"] == s1["rollout_weight"] == 0.5
    # one advantage per rollout: the compacted rollout counts once in its group of two
    assert s0["advantage"] == s1["advantage"] == (1.0 - 0.5) / (0.5 + 1e-6)
    [other] = built.rows_of("group_g1")
    assert other["advantage"] == (0.0 - 0.5) / (0.5 + 1e-6)
    audit = built.audit["group_g0"]
    assert (audit["n_selected"], audit["n_segments"], audit["n_offchain"], audit["n_roots"]) == (4, 2, 1, 2)
    assert (audit["n_tokens"], audit["n_generated"]) == (15, 7)
    # rows sorted by (group_id, slot, segment_index)
    assert [r["row_id"] for r in built.rows] == ["group_g0_s0", "group_g0_s1", "group_g1_s0"]


def test_output_without_c3_breaks_the_chain_and_masks_the_whole_rollout(night, build):
    c1 = call("c1", None, [101, 102, 103], [11, 12], [reasoning("r1"), answer("a1")])
    c2 = call("c2", "c1", [201], [21, 22], [reasoning("r2"), answer("a2")])
    c3 = call("c3", None, [301, 302], [31], [reasoning("r3"), answer("a3")])
    c5 = call("c5", "c3", [501, 502], [51, 52], [reasoning("r5"), answer("a5")])
    night.add(
        "group_g0",
        [c1, c2, c3, c5],
        [reasoning("r1"), answer("a1"), reasoning("r2"), answer("a2"), reasoning("r5"), answer("a5")],
    )
    built = build(night)
    assert built.rows == []
    audit = built.audit["group_g0"]
    assert (audit["status"], audit["reason"], audit["failed_call_id"]) == ("masked", "broken_chain", "c5")
    assert audit["advantage"] is None


def test_terminal_mode_masks_the_compacted_rollout_and_keeps_the_other(night, build):
    worked_example(night, "group_g0", compaction=True)
    worked_example(night, "group_g1", compaction=False)
    built = build(night, Options(mode="terminal"))
    assert built.audit["group_g0"]["reason"] == "history_rewritten"
    [row] = built.rows
    assert row["row_id"] == "group_g1_s0" and row["model_call_ids"] == ["c1", "c2", "c3", "c4", "c5"]
