"""Selection by NeMo Gym's evidence (CONTRACT.md 2.4 and 3.1 b), hand-written with tokens
spelled out: ledger rows carry `output_fingerprint` (afp of the call's own items) and no
`output_items`; the rollout's output is matched span by span over its model-authored items.
Also the other rules of contract v2 around it: the declared terminal through response.id,
poison rows that are never roots, and version fields left out."""

from __future__ import annotations

import json

import pytest

from nights import DS, answer, call, reasoning
from reassembler.formats.gym_fingerprint import afp
from reassembler.producer.capture import TokenFileTypes, as_gym_lineage_row, write_jsonl, write_token_file
from reassembler.settings import Options

GYM = "fingerprint"


def fc(name: str, args: dict, item_id: str, call_id: str | None = None) -> dict:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id or f"call_{item_id}",
        "name": name,
        "arguments": json.dumps(args),
        "status": "completed",
    }


def fco(item: dict, text: str) -> dict:
    return {"type": "function_call_output", "call_id": item["call_id"], "output": text}


READ = fc("read_file", {"path": "a.py"}, "fc_1")
TEST = fc("run_tests", {"k": "a"}, "fc_2")
EDIT = fc("edit_file", {"path": "a.py", "line": 3}, "fc_3")


def chain_calls():
    """c1 root [read], c2 child [reasoning, run_tests], c3 child [final message]."""
    return [
        call("c1", None, [101, 102, 103], [11, 12], [READ]),
        call("c2", "c1", [201], [21, 22], [reasoning("look at the tests"), TEST]),
        call("c3", "c2", [301, 302], [31], [answer("done")]),
    ]


CHAIN_OUTPUT = [READ, fco(READ, "code"), reasoning("look at the tests"), TEST, fco(TEST, "1 failed"), answer("done")]
CHAIN_IDS = [101, 102, 103, 11, 12, 201, 21, 22, 301, 302, 31]
CHAIN_MASK = [0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1]


def test_a_chain_is_selected_by_fingerprints_and_rebuilt_token_for_token(night, build):
    ledger, _ = night.add("gym_g0", chain_calls(), CHAIN_OUTPUT, evidence=GYM)
    assert all("output_items" not in row for row in ledger)
    assert ledger[1]["output_fingerprint"] == afp([TEST])  # the reasoning item is not hashed
    built = build(night)
    audit = built.audit["gym_g0"]
    assert (audit["status"], audit["n_selected"], audit["n_offchain"]) == ("ok", 3, 0)
    [row] = built.rows_of("gym_g0")
    assert row["input_ids"] == CHAIN_IDS and row["loss_mask"] == CHAIN_MASK
    assert row["model_call_ids"] == ["c1", "c2", "c3"] and row["prompt_len"] == 3


def test_a_compaction_starts_a_new_row_and_the_summarizer_stays_off_chain(night, build):
    calls = [
        call("c1", None, [101, 102], [11], [READ]),
        call("c2", "c1", [201], [21, 22], [TEST]),
        call("s", "c2", [901], [91, 92], [answer("summary: a.py fails test a")]),
        call("c3", None, [301, 302, 303], [31], [reasoning("fix it"), EDIT]),  # rewritten history: a root
        call("c4", "c3", [401], [41, 42], [answer("fixed")]),
    ]
    output = [
        READ,
        fco(READ, "code"),
        TEST,
        fco(TEST, "1 failed"),
        reasoning("fix it"),
        EDIT,
        fco(EDIT, "ok"),
        answer("fixed"),
    ]
    night.add("gym_g0", calls, output, evidence=GYM)
    built = build(night)
    audit = built.audit["gym_g0"]
    assert (audit["status"], audit["n_roots"], audit["n_segments"], audit["n_offchain"]) == ("ok", 2, 2, 1)
    assert [(r["row_id"], r["input_ids"]) for r in built.rows_of("gym_g0")] == [
        ("gym_g0_s0", [101, 102, 11, 201, 21, 22]),
        ("gym_g0_s1", [301, 302, 303, 31, 401, 41, 42]),
    ]
    assert {r["rollout_weight"] for r in built.rows_of("gym_g0")} == {0.5}


def test_a_retried_call_is_left_off_chain(night, build):
    rejected = fc("run_tests", {"k": "b"}, "fc_2x")
    calls = [
        call("c1", None, [101, 102, 103], [11, 12], [READ]),
        call("c2x", "c1", [201], [29], [rejected]),  # the harness rejected this attempt
        call("c2", "c1", [201], [21, 22], [reasoning("look at the tests"), TEST]),
        call("c3", "c2", [301, 302], [31], [answer("done")]),
    ]
    night.add("gym_g0", calls, CHAIN_OUTPUT, evidence=GYM)
    built = build(night)
    audit = built.audit["gym_g0"]
    assert (audit["status"], audit["n_offchain"], audit["n_offchain_faults"]) == ("ok", 1, 0)
    assert built.rows_of("gym_g0")[0]["input_ids"] == CHAIN_IDS


def test_a_call_with_several_model_authored_items_takes_the_longest_span(night, build):
    note = answer("let me run the tests first")
    calls = [
        call("c1", None, [101, 102, 103], [11, 12], [READ]),
        call("c2", "c1", [201], [21, 22, 23], [note, reasoning("hm"), TEST]),
        call("c3", "c2", [301], [31], [answer("done")]),
    ]
    output = [READ, fco(READ, "code"), note, reasoning("hm"), TEST, fco(TEST, "ok"), answer("done")]
    night.add("gym_g0", calls, output, evidence=GYM)
    built = build(night)
    assert built.audit["gym_g0"]["status"] == "ok"
    assert built.rows_of("gym_g0")[0]["model_call_ids"] == ["c1", "c2", "c3"]


def test_tool_arguments_re_serialised_by_the_harness_still_match(night, build):
    night.add(
        "gym_g0",
        chain_calls(),
        [
            dict(READ, arguments='{"path":"a.py"}'),
            fco(READ, "code"),
            reasoning("look at the tests"),
            dict(TEST, arguments='  {"k" : "a"}  '),
            fco(TEST, "1 failed"),
            answer("done"),
        ],
        evidence=GYM,
    )
    assert build(night).audit["gym_g0"]["status"] == "ok"


def test_a_few_shot_assistant_turn_in_the_prompt_changes_nothing(night, build):
    """Gym's continuation fingerprints hash the prompt's assistant turns too; selection reads
    only each call's own output_fingerprint."""
    few_shot = [{"type": "message", "role": "user", "content": "example"}, answer("an example answer")]
    ledger, _ = night.add("gym_g0", chain_calls(), CHAIN_OUTPUT, evidence=GYM)
    context = list(few_shot)
    for row, items in zip(ledger, [[READ], [TEST], [answer("done")]]):
        context += items
        row["continuation_fingerprint"] = row["fingerprint"] = afp(context)
    built = build(night)
    assert built.audit["gym_g0"]["status"] == "ok" and len(built.rows_of("gym_g0")) == 1


def test_an_output_that_no_span_matches_is_unmatched_output(night, build):
    night.add(
        "gym_g0",
        chain_calls(),
        [READ, fco(READ, "code"), dict(TEST, name="run_all_tests"), fco(TEST, "1 failed"), answer("done")],
        evidence=GYM,
    )
    audit = build(night).audit["gym_g0"]
    assert (audit["reason"], audit["failed_call_id"]) == ("unmatched_output", None)
    assert audit["detail"].startswith("model-authored item 1 (output item 2)")


def test_an_unfingerprintable_item_stops_every_span_through_it(night, build):
    """c2's tool call holds an integer past 2**64 in its arguments: no fingerprint holds it
    (Gym records c2's as null). At its place nothing matches, even though the item after it
    is exactly c3's output: unmatched_output there, not a span that skips it."""
    huge = dict(TEST, arguments='{"k": 99999999999999999999999}')
    calls = chain_calls()
    calls[1] = call("c2", "c1", [201], [21, 22], [reasoning("look at the tests"), huge])
    ledger, _ = night.add(
        "gym_g0", calls, [READ, fco(READ, "code"), huge, fco(huge, "ok"), answer("done")], evidence=GYM
    )
    assert ledger[1]["output_fingerprint"] is None and ledger[2]["output_fingerprint"] == afp([answer("done")])
    audit = build(night).audit["gym_g0"]
    assert (audit["reason"], audit["failed_call_id"]) == ("unmatched_output", None)
    assert audit["detail"].startswith("model-authored item 1 (output item 2)")


def test_a_fingerprint_in_upper_case_hex_matches_nothing(night, build):
    ledger, _ = night.add("gym_g0", chain_calls(), CHAIN_OUTPUT, evidence=GYM)
    ledger[1]["output_fingerprint"] = ledger[1]["output_fingerprint"].upper()  # the hash is lowercase hex
    audit = build(night).audit["gym_g0"]
    assert (audit["reason"], audit["failed_call_id"]) == ("unmatched_output", None)
    assert audit["detail"].startswith("model-authored item 1 (output item 3)")


def test_two_calls_matching_one_span_is_ambiguous_output(night, build):
    calls = chain_calls()
    calls.insert(2, call("c2b", "c1", [201], [23, 24], [TEST]))  # a sibling with the same output
    night.add("gym_g0", calls, CHAIN_OUTPUT, evidence=GYM)
    audit = build(night).audit["gym_g0"]
    assert audit["reason"] == "ambiguous_output" and "c2, c2b" in audit["detail"]


def test_a_reasoning_only_final_call_is_never_selected(night, build):
    calls = chain_calls()[:2] + [call("c3", "c2", [301], [31, 32], [reasoning("nothing to add")])]
    output = CHAIN_OUTPUT[:5] + [reasoning("nothing to add")]
    # the agent kept c3's response last: the declared terminal is a call selection cannot reach
    night.add("gym_g0", calls, output, evidence=GYM, response={"id": "resp_c3", "output": output})
    night.add("gym_g1", calls, output, evidence=GYM)  # no declaration: c3 is just off-chain
    built = build(night)
    declared = built.audit["gym_g0"]
    assert (declared["reason"], declared["failed_call_id"]) == ("terminal_not_last", "c2")
    plain = built.audit["gym_g1"]
    assert (plain["status"], plain["n_offchain"]) == ("ok", 1)
    assert built.rows_of("gym_g1")[0]["model_call_ids"] == ["c1", "c2"]


def test_output_items_win_over_fingerprints(night, build):
    ledger, _ = night.add("gym_g0", chain_calls(), CHAIN_OUTPUT)
    for row in ledger:
        row.update(output_fingerprint="0" * 64, fingerprint_version=2)  # wrong, and never read
    ledger, _ = night.add("gym_g1", chain_calls(), CHAIN_OUTPUT, evidence=GYM)
    ledger[0]["output_items"] = []  # one row with output_items: the rollout is selected by items
    built = build(night)
    assert built.audit["gym_g0"]["status"] == "ok"
    assert built.audit["gym_g1"]["reason"] == "unmatched_output"


def test_fingerprint_version_other_than_2_is_no_evidence(night, build):
    ledger, _ = night.add("gym_g0", chain_calls(), CHAIN_OUTPUT, evidence=GYM)
    ledger[1]["fingerprint_version"] = 0  # CallRecord's default: no fingerprint
    audit = build(night).audit["gym_g0"]
    assert audit["reason"] == "unmatched_output" and audit["detail"].startswith("model-authored item 1")


# ------------------------------------------------------------ the declared terminal, v2


def test_response_id_declares_the_terminal(night, build):
    night.add("gym_g0", chain_calls(), CHAIN_OUTPUT, evidence=GYM, response={"id": "resp_c3", "output": CHAIN_OUTPUT})
    night.add("gym_g1", chain_calls(), CHAIN_OUTPUT, evidence=GYM, response={"id": "resp_c2", "output": CHAIN_OUTPUT})
    night.add(
        "gym_g2", chain_calls(), CHAIN_OUTPUT, evidence=GYM, response={"id": "resp_nobody", "output": CHAIN_OUTPUT}
    )  # no row: no declaration
    built = build(night)
    assert built.audit["gym_g0"]["status"] == "ok"
    assert (built.audit["gym_g1"]["reason"], built.audit["gym_g1"]["failed_call_id"]) == ("terminal_not_last", "c3")
    assert built.audit["gym_g2"]["status"] == "ok"
    terminal = build(night, Options(mode="terminal"))
    assert terminal.audit["gym_g1"]["status"] == "ok"  # walked from c2: one row [c1, c2]
    assert terminal.rows_of("gym_g1")[0]["model_call_ids"] == ["c1", "c2"]


def test_several_rows_with_the_declared_response_id(night, build):
    ledger, _ = night.add(
        "gym_g0", chain_calls(), CHAIN_OUTPUT, evidence=GYM, response={"id": "resp_c3", "output": CHAIN_OUTPUT}
    )
    ledger[1]["response_id"] = "resp_c3"  # c2 and c3 both claim the scored response
    assert build(night).audit["gym_g0"]["status"] == "ok"  # the last selected call is one of them
    terminal = build(night, Options(mode="terminal")).audit["gym_g0"]
    assert terminal["reason"] == "missing_terminal" and "c2, c3" in terminal["detail"]


def test_a_poison_row_is_never_a_root(night, build):
    ledger, _ = night.add("gym_g0", chain_calls(), CHAIN_OUTPUT, evidence=GYM)
    night.ledger.insert(
        night.ledger.index(ledger[1]),
        {"rollout_id": "gym_g0", "model_call_id": "lost", "failure_reason": "worker_capture_failed"},
    )
    for options in (Options(), Options(mode="terminal")):
        audit = build(night, options).audit["gym_g0"]
        assert (audit["status"], audit["n_roots"], audit["n_offchain_faults"]) == ("ok", 1, 1)
    assert build(night, Options(offchain="strict")).audit["gym_g0"]["reason"] == "capture_poisoned"


def test_terminal_mode_masks_a_rollout_whose_last_call_was_not_captured(night, build):
    night.add("gym_g0", chain_calls(), CHAIN_OUTPUT, evidence=GYM)
    night.ledger.append({"rollout_id": "gym_g0", "model_call_id": "c4", "failure_reason": "worker_capture_failed"})
    assert build(night).audit["gym_g0"]["status"] == "ok"  # select mode: c4 is off-chain
    audit = build(night, Options(mode="terminal")).audit["gym_g0"]
    assert (audit["reason"], audit["failed_call_id"]) == ("missing_terminal", "c4")


# ------------------------------------------------------------ version fields left out


def test_version_fields_left_out_take_gyms_defaults(tmp_path, night):
    """Gym's lineage rows never write schema/digest/extras versions, and a token store may
    leave the columns out too: both read as 2/2/1 and the digests verify."""
    from reassembler.build import build_night

    ledger, _ = night.add("gym_g0", chain_calls(), CHAIN_OUTPUT, evidence=GYM)
    base = tmp_path / "input"
    write_jsonl(base / "rollouts" / f"ds={DS}" / "r.jsonl", night.rollouts)
    write_jsonl(base / "ledger" / f"ds={DS}" / "gym_g0.lineage.jsonl", [as_gym_lineage_row(r) for r in ledger])
    write_token_file(base / "tokens" / f"ds={DS}" / "t.parquet", night.tokens, TokenFileTypes(version_columns=False))
    summary = build_night(base, tmp_path / "out", DS)
    assert summary.load.n_rejects == 0 and summary.numbers.ok_rollouts == 1


@pytest.mark.parametrize("side", ["ledger", "token row"])
def test_a_null_version_is_unsupported(night, build, side):
    ledger, tokens = night.add("gym_g0", chain_calls(), CHAIN_OUTPUT, evidence=GYM)
    (ledger if side == "ledger" else tokens)[1]["digest_version"] = None
    audit = build(night).audit["gym_g0"]
    assert (audit["reason"], audit["failed_call_id"]) == ("unsupported_version", "c2")


def test_afp_hashes_tool_arguments_as_their_canonical_json():
    """CONTRACT.md 2.4, byte for byte for one function_call: arguments given as a JSON string
    are parsed and written again with sorted keys and no whitespace (so a harness that
    re-serialises them changes nothing); the layout is spelled out here, not taken from
    gym_fingerprint.py."""
    import hashlib
    import struct

    from reassembler.formats.gym_fingerprint import afp

    def field(tag: int, text: str) -> bytes:
        data = text.encode()
        return struct.pack(">BQ", tag, len(data)) + data

    expected = hashlib.sha256(
        b"nemo-gym-lineage" + field(2, "t1") + field(3, "read") + field(4, '{"n":1,"path":"a.py"}')
    ).hexdigest()
    for arguments in ('  {"path" : "a.py", "n": 1}  ', '{"n":1,"path":"a.py"}', {"path": "a.py", "n": 1}):
        item = {"type": "function_call", "call_id": "t1", "name": "read", "arguments": arguments}
        assert afp([item]) == expected, arguments
    not_json = {"type": "function_call", "call_id": "t1", "name": "read", "arguments": "  not json  "}
    assert (
        afp([not_json])
        == hashlib.sha256(b"nemo-gym-lineage" + field(2, "t1") + field(3, "read") + field(4, "not json")).hexdigest()
    )


def test_the_span_is_the_longest_even_when_a_shorter_one_hashes_the_same(night, build):
    """An assistant message with empty content adds no field to afp, so afp of [a, empty]
    equals afp of [a]: the call's span is the longer one (CONTRACT.md 3.1 b). Here the
    empty message ends the output; a shorter span would leave it to match no call."""
    empty = {"type": "message", "role": "assistant", "content": ""}
    calls = [
        call("c1", None, [101, 102], [11, 12], [answer("first")]),
        call("c2", "c1", [201], [21], [answer("last"), empty]),
    ]
    assert afp([answer("last"), empty]) == afp([answer("last")])
    night.add("gym_g0", calls, [answer("first"), answer("last"), empty], evidence=GYM)
    built = build(night)
    assert built.audit["gym_g0"]["status"] == "ok", built.audit["gym_g0"]["detail"]
    assert built.rows_of("gym_g0")[0]["model_call_ids"] == ["c1", "c2"]
