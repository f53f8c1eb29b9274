"""Fault injection: one night per reason code. The faulty rollout is masked with exactly
that code (and the call it names); the healthy rollout of the same group is untouched."""

from __future__ import annotations

import json

import pytest

from nights import answer, call, reasoning, tool_output, worked_example, worked_example_local
from reassembler.producer.capture import resign
from reassembler.reasons import Reason
from reassembler.settings import Options

GOOD_COMPACTED = [[101, 102, 103, 11, 12, 201, 21, 22], [301, 302, 31, 501, 502, 51, 52]]
GOOD_PLAIN = [[101, 102, 103, 11, 12, 201, 21, 22, 301, 302, 31, 401, 41, 501, 502, 51, 52]]


def by_id(rows: list[dict], call_id: str) -> dict:
    return next(r for r in rows if r["model_call_id"] == call_id)


def set_lists(token: dict, ids=None, mask=None, lp=None) -> None:
    if ids is not None:
        token["token_ids_delta"] = ids
    if mask is not None:
        token["token_mask_delta"] = mask
    if lp is not None:
        token["generation_logprobs_delta"] = lp


# name -> (inject(night), expected failed_call_id, options, compaction in the faulty rollout)
def _rollout(night, compaction=True, **record):
    return worked_example(night, "grp_g1", compaction=compaction, **record)


def f_rollout_failed(n):
    _rollout(n, failure_reason="sandbox crashed", reward=None)  # no measured reward: contract 3.0 item 1


def f_invalid_reward(n):
    _rollout(n, reward=float("nan"))


def f_empty_ledger(n):
    _rollout(n)
    n.ledger = [r for r in n.ledger if r["rollout_id"] != "grp_g1"]
    n.tokens = [r for r in n.tokens if r["rollout_id"] != "grp_g1"]


def f_duplicate_call_id(n):
    ledger, _ = _rollout(n)
    n.ledger.append(dict(by_id(ledger, "c2")))


def f_capture_poisoned(n):
    _rollout(n)
    n.ledger.append(
        {"rollout_id": "grp_g1", "model_call_id": "c6", "parent_call_id": "c5", "failure_reason": "capture timed out"}
    )


def f_unmatched_output(n):
    _rollout(n)
    n.rollouts[-1]["output"][3] = reasoning("r2, edited")


def f_ambiguous_output(n):
    ledger, tokens = _rollout(n)
    twin = call("c2b", "c1", [201], [23, 24], [reasoning("r2"), answer("a2")])
    from reassembler.producer.capture import stage_rollout

    c1 = call("c1", None, [101, 102, 103], [11, 12], [])
    [_, (l2, t2)] = stage_rollout("grp_g1", [c1, twin])
    n.ledger.append(l2)
    n.tokens.append(t2)


def f_empty_selection(n):
    _rollout(n)
    n.rollouts[-1]["output"] = [tool_output("only an observation")]


def f_out_of_capture_order(n):
    ledger, _ = _rollout(n)
    i, j = n.ledger.index(by_id(ledger, "c1")), n.ledger.index(by_id(ledger, "c2"))
    n.ledger[i], n.ledger[j] = n.ledger[j], n.ledger[i]


def f_terminal_not_last(n):
    _rollout(n, terminal_model_call_id="c3")


def f_missing_root(n):
    _rollout(n)
    n.rollouts[-1]["output"] = n.rollouts[-1]["output"][3:]


def f_broken_chain(n):
    _rollout(n)
    out = n.rollouts[-1]["output"]
    n.rollouts[-1]["output"] = out[:5] + out[8:]  # drop c3's items and its tool output


def f_missing_tokens(n):
    _, tokens = _rollout(n)
    n.tokens.remove(by_id(tokens, "c3"))


def f_duplicate_tokens(n):
    _, tokens = _rollout(n)
    n.tokens.append(dict(by_id(tokens, "c3")))


def f_unsupported_version(n):
    ledger, _ = _rollout(n)
    by_id(ledger, "c3")["digest_version"] = 3


def f_field_mismatch(n):
    _, tokens = _rollout(n)
    by_id(tokens, "c3")["weight_version"] = 9


def f_invalid_record(n):
    ledger, tokens = _rollout(n)
    resign(by_id(ledger, "c3"), by_id(tokens, "c3"), mode="token_in")


def f_length_mismatch(n):
    ledger, tokens = _rollout(n)
    resign(by_id(ledger, "c3"), by_id(tokens, "c3"), cum_len=4)


def f_parent_length_mismatch(n):
    ledger, tokens = _rollout(n)
    resign(by_id(ledger, "c5"), by_id(tokens, "c5"), prev_len=4, cum_len=8)


def f_invalid_token(n):
    _, tokens = _rollout(n)
    set_lists(by_id(tokens, "c5"), ids=[501, 502, 51, -1])


def f_invalid_mask(n):
    _, tokens = _rollout(n)
    set_lists(by_id(tokens, "c5"), mask=[0.0, 0.0, 1.0, 0.0], lp=[0.0, 0.0, -0.5, 0.0])


def f_empty_generation(n):
    _, tokens = _rollout(n)
    set_lists(by_id(tokens, "c5"), mask=[0.0] * 4, lp=[0.0] * 4)


def f_invalid_logprob(n):
    _, tokens = _rollout(n)
    set_lists(by_id(tokens, "c5"), lp=[-0.1, 0.0, -0.5, -0.5])


def f_digest_mismatch(n):
    _, tokens = _rollout(n)
    set_lists(by_id(tokens, "c5"), ids=[501, 502, 51, 53])


def f_chain_hash_mismatch(n):
    ledger, tokens = _rollout(n)
    resign(by_id(ledger, "c5"), by_id(tokens, "c5"), chain_hash="ab" * 32)


def f_cumulative_hash_mismatch(n):
    ledger, tokens = _rollout(n)
    resign(by_id(ledger, "c5"), by_id(tokens, "c5"), cumulative_hash="cd" * 32)


def f_missing_terminal(n):
    _rollout(n, compaction=False, terminal_model_call_id="c9")


def f_missing_parent(n):
    ledger, tokens = _rollout(n, compaction=False)
    resign(by_id(ledger, "c5"), by_id(tokens, "c5"), parent_call_id="ghost")


def f_lineage_cycle(n):
    ledger, _ = _rollout(n, compaction=False)
    by_id(ledger, "c1")["parent_call_id"] = "c5"


def f_order_mismatch(n):
    ledger, _ = _rollout(n, compaction=False)
    i, j = n.ledger.index(by_id(ledger, "c3")), n.ledger.index(by_id(ledger, "c4"))
    n.ledger[i], n.ledger[j] = n.ledger[j], n.ledger[i]


def f_history_rewritten(n):
    _rollout(n, compaction=True)


# NeMo Gym's own capture (CONTRACT.md 9): the faulty rollout in local mode, or rebuilt by Gym
def f_producer_masked(n):
    chain = [
        call("c1", None, [101, 102, 103], [11, 12], [reasoning("r1"), answer("a1")]),
        call("c2", "c1", [201], [21, 22], [reasoning("r2"), answer("a2")]),
    ]
    n.add_rebuilt("grp_g1", chain, mask_sample=True)


def f_mixed_capture(n):
    _rollout(n)
    worked_example_local(n, "grp_g1")
    n.rollouts.pop()  # one result line, capture in both families


def f_capture_retired(n):
    worked_example_local(n, "grp_g1")
    n.local_files["grp_g1"] = {"state": {"retired": True}}


def f_capture_incomplete(n):
    worked_example_local(n, "grp_g1")
    n.local_files["grp_g1"] = {"incomplete": ["c4"]}


def f_prefix_mismatch(n):
    from reassembler.formats.gym_local import tokens_digest

    c5 = next(e for e in worked_example_local(n, "grp_g1") if e["model_call_id"] == "c5")
    c5["prompt_token_ids"][1] = 399  # c3's second token, changed in c5's full prompt
    full = c5["prompt_token_ids"] + c5["generation_token_ids"]
    c5["digest"] = tokens_digest([b"".join(i.to_bytes(8, "big") for i in full)], len(full))


STRICT, TERMINAL = Options(offchain="strict"), Options(mode="terminal")
CASES = {
    Reason.ROLLOUT_FAILED: (f_rollout_failed, None, Options()),
    Reason.INVALID_REWARD: (f_invalid_reward, None, Options()),
    Reason.PRODUCER_MASKED: (f_producer_masked, None, Options()),
    Reason.MIXED_CAPTURE: (f_mixed_capture, None, Options()),
    Reason.CAPTURE_RETIRED: (f_capture_retired, None, Options()),
    Reason.CAPTURE_INCOMPLETE: (f_capture_incomplete, None, Options()),
    Reason.EMPTY_LEDGER: (f_empty_ledger, None, Options()),
    Reason.DUPLICATE_CALL_ID: (f_duplicate_call_id, None, Options()),
    Reason.CAPTURE_POISONED: (f_capture_poisoned, None, STRICT),
    Reason.UNMATCHED_OUTPUT: (f_unmatched_output, None, Options()),
    Reason.AMBIGUOUS_OUTPUT: (f_ambiguous_output, None, Options()),
    Reason.EMPTY_SELECTION: (f_empty_selection, None, Options()),
    Reason.OUT_OF_CAPTURE_ORDER: (f_out_of_capture_order, "c2", Options()),
    Reason.TERMINAL_NOT_LAST: (f_terminal_not_last, "c5", Options()),
    Reason.MISSING_ROOT: (f_missing_root, "c2", Options()),
    Reason.BROKEN_CHAIN: (f_broken_chain, "c5", Options()),
    Reason.MISSING_PARENT: (f_missing_parent, "c5", TERMINAL),
    Reason.LINEAGE_CYCLE: (f_lineage_cycle, "c5", TERMINAL),
    Reason.ORDER_MISMATCH: (f_order_mismatch, "c5", TERMINAL),
    Reason.MISSING_TOKENS: (f_missing_tokens, "c3", Options()),
    Reason.DUPLICATE_TOKENS: (f_duplicate_tokens, "c3", Options()),
    Reason.UNSUPPORTED_VERSION: (f_unsupported_version, "c3", Options()),
    Reason.FIELD_MISMATCH: (f_field_mismatch, "c3", Options()),
    Reason.INVALID_RECORD: (f_invalid_record, "c3", Options()),
    Reason.LENGTH_MISMATCH: (f_length_mismatch, "c3", Options()),
    Reason.PARENT_LENGTH_MISMATCH: (f_parent_length_mismatch, "c5", Options()),
    Reason.PREFIX_MISMATCH: (f_prefix_mismatch, "c5", Options()),
    Reason.INVALID_TOKEN: (f_invalid_token, "c5", Options()),
    Reason.INVALID_MASK: (f_invalid_mask, "c5", Options()),
    Reason.EMPTY_GENERATION: (f_empty_generation, "c5", Options()),
    Reason.INVALID_LOGPROB: (f_invalid_logprob, "c5", Options()),
    Reason.DIGEST_MISMATCH: (f_digest_mismatch, "c5", Options()),
    Reason.CHAIN_HASH_MISMATCH: (f_chain_hash_mismatch, "c5", Options()),
    Reason.CUMULATIVE_HASH_MISMATCH: (f_cumulative_hash_mismatch, "c5", Options()),
    Reason.MISSING_TERMINAL: (f_missing_terminal, "c9", TERMINAL),
    Reason.HISTORY_REWRITTEN: (f_history_rewritten, "c5", TERMINAL),
}


def test_every_reason_code_has_a_fault_fixture_and_a_description():
    from reassembler.reasons import DESCRIPTIONS

    assert set(CASES) == set(Reason) == set(DESCRIPTIONS)


@pytest.mark.parametrize("reason", list(CASES), ids=lambda r: r.value)
def test_fault_masks_only_its_rollout(reason, night, build):
    inject, failed_call, options = CASES[reason]
    compacted_good = options.mode == "select"
    worked_example(night, "grp_g0", compaction=compacted_good, reward=1.0)
    inject(night)
    built = build(night, options)
    bad = built.audit["grp_g1"]
    assert (bad["status"], bad["reason"]) == ("masked", reason.value), bad["detail"]
    assert bad["failed_call_id"] == failed_call
    assert bad["advantage"] is None and bad["n_segments"] == 0
    assert built.rows_of("grp_g1") == []
    good = built.audit["grp_g0"]
    assert good["status"] == "ok"
    assert good["advantage"] == 0.0  # the only valid rollout of its group
    assert [r["input_ids"] for r in built.rows_of("grp_g0")] == (GOOD_COMPACTED if compacted_good else GOOD_PLAIN)


def test_a_diagnosis_beside_a_measured_reward_trains_and_counts_in_its_group(night, build):
    """NeMo Gym's failure_kind / failure_reason on a sample it still measured validly
    (contract 3.0 item 1, version 5): the rollout trains, its group's advantages include it,
    and its audit row keeps the diagnosis in metadata."""
    worked_example(night, "grp_g0", reward=1.0)
    _rollout(night, reward=0.0, failure_reason="tool timed out twice", failure_kind="degraded_tool")
    built = build(night)
    degraded, other = built.audit["grp_g1"], built.audit["grp_g0"]
    assert (degraded["status"], degraded["reason"]) == ("ok", None)
    assert json.loads(degraded["metadata"]) == {
        "failure_kind": "degraded_tool",
        "failure_reason": "tool timed out twice",
    }
    assert other["advantage"] == pytest.approx(-degraded["advantage"]) and other["advantage"] > 0.5
    assert [r["advantage"] for r in built.rows_of("grp_g1")] == [degraded["advantage"]] * 2


def test_a_diagnosis_never_overwrites_the_lines_own_metadata_keys(night, build):
    worked_example(night, "grp_g0", reward=1.0)
    _rollout(
        night,
        reward=0.0,
        failure_reason="tool timed out",
        failure_kind="degraded_tool",
        metadata={"failure_kind": "the harness's own", "seed": 7},
    )
    got = build(night).audit["grp_g1"]
    assert got["status"] == "ok"
    assert json.loads(got["metadata"]) == {
        "failure_kind": "the harness's own",
        "seed": 7,
        "failure_reason": "tool timed out",
    }


def test_a_rollout_with_no_capture_says_so_and_one_with_ledger_rows_is_staged(night, build):
    worked_example(night, "grp_g0", reward=1.0)
    f_empty_ledger(night)
    built = build(night)
    assert (built.audit["grp_g1"]["reason"], built.audit["grp_g1"]["capture"]) == ("empty_ledger", None)
    assert built.audit["grp_g0"]["capture"] == "staged"
    assert {r["capture"] for r in built.rows_of("grp_g0")} == {"staged"}


def test_poison_row_off_chain_is_counted_not_masked_under_the_default_policy(night, build):
    f_capture_poisoned(night)
    built = build(night)
    audit = built.audit["grp_g1"]
    assert audit["status"] == "ok"
    assert (audit["n_offchain"], audit["n_offchain_faults"]) == (2, 1)  # c4 and the poison row


def test_strict_policy_masks_a_faulty_off_chain_call_with_its_own_reason(night, build):
    ledger, tokens = worked_example(night, "grp_g1")
    set_lists(by_id(tokens, "c4"), ids=[401, 42])  # c4 is off-chain: its digest no longer matches
    assert build(night).audit["grp_g1"]["status"] == "ok"
    strict = build(night, STRICT).audit["grp_g1"]
    assert (strict["reason"], strict["failed_call_id"]) == ("digest_mismatch", "c4")


# Every version field, as CONTRACT.md 2.2 and 2.3 state what is supported: schema_version 2
# or 3, digest_version 2, extras_digest_version 1. Written out here, never read from the code.
UNSUPPORTED = {"schema_version": [1, 4], "digest_version": [1, 3], "extras_digest_version": [0, 2]}
VERSION_CASES = [
    # (field, value, on which side) -> the contract's reason: a ledger row outside the supported
    # set, or a null anywhere, is unsupported_version; a token row that merely differs from a
    # supported ledger row disagrees with it (field_mismatch)
    *[(f, v, "ledger", "unsupported_version") for f, values in UNSUPPORTED.items() for v in values],
    *[(f, None, "ledger", "unsupported_version") for f in UNSUPPORTED],
    *[(f, None, "token", "unsupported_version") for f in UNSUPPORTED],
    *[(f, v, "token", "field_mismatch") for f, values in UNSUPPORTED.items() for v in values],
    *[(f, v, "both", "unsupported_version") for f, values in UNSUPPORTED.items() for v in values],
]


@pytest.mark.parametrize("field, value, side, reason", VERSION_CASES, ids=lambda x: str(x))
def test_every_version_field_out_of_the_supported_set(field, value, side, reason, night, build):
    worked_example(night, "grp_g0", compaction=True, reward=1.0)
    ledger, tokens = _rollout(night)
    if side in ("ledger", "both"):
        by_id(ledger, "c3")[field] = value
    if side in ("token", "both"):
        by_id(tokens, "c3")[field] = value
    built = build(night)
    bad = built.audit["grp_g1"]
    assert (bad["reason"], bad["failed_call_id"]) == (reason, "c3"), bad["detail"]
    assert built.audit["grp_g0"]["status"] == "ok"


def test_the_supported_versions_build(night, build):
    """The other side of the set above: schema_version 3 is supported as well as 2."""
    ledger, tokens = _rollout(night)
    for row in (*ledger, *tokens):
        row["schema_version"] = 3
    for led, tok in zip(ledger, tokens):
        resign(led, tok)
    assert build(night).audit["grp_g1"]["status"] == "ok"


def test_token_checks_of_one_call_do_not_depend_on_the_others_in_its_batch(night, build):
    """One batch: grp_g1's c5 has a logprob list shorter than its mask (length_mismatch),
    grp_g2's c5 a logprob that is not 0.0 under mask 0 (invalid_logprob). Each is masked
    with its own reason; the unequal lengths of one call do not switch the other's check off."""
    worked_example(night, "grp_g0", compaction=True, reward=1.0)
    _, tokens = worked_example(night, "grp_g1", compaction=True)
    set_lists(by_id(tokens, "c5"), lp=[0.0, 0.0, -0.5])  # 3 logprobs for 4 tokens
    _, tokens = worked_example(night, "grp_g2", compaction=True)
    set_lists(by_id(tokens, "c5"), lp=[0.0, -0.25, -0.5, -0.5])  # mask 0 at token 2
    built = build(night)
    assert built.summary.numbers.audit_rows == 3
    short, under = built.audit["grp_g1"], built.audit["grp_g2"]
    assert (short["reason"], short["failed_call_id"]) == ("length_mismatch", "c5")
    assert (under["reason"], under["failed_call_id"], under["detail"]) == (
        "invalid_logprob",
        "c5",
        "1 logprobs not 0.0 under mask 0",
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_logprob_that_is_not_finite_is_invalid_logprob(bad, night, build):
    """Under mask 1, where a logprob may be anything else (the other invalid_logprob fixture
    is a logprob that is not 0.0 under mask 0)."""
    worked_example(night, "grp_g0", compaction=True, reward=1.0)
    _, tokens = _rollout(night)
    set_lists(by_id(tokens, "c5"), lp=[0.0, 0.0, -0.5, bad])
    bad_row = build(night).audit["grp_g1"]
    assert (bad_row["reason"], bad_row["failed_call_id"], bad_row["detail"]) == (
        "invalid_logprob",
        "c5",
        "1 logprobs not finite",
    )


def test_an_output_item_id_picks_the_call_that_produced_it(night, build):
    """Two calls produced items of one fingerprint (a retried call), with different item ids:
    the output item's id says which one the agent kept (CONTRACT.md 3.1 a: ids equal where
    both sides carry one), where fingerprints alone would be ambiguous_output."""
    c1 = call("c1", None, [101, 102], [11], [answer("a1", "msg_1")])
    retry = call("c2a", "c1", [201], [21], [answer("a2", "msg_2a")])
    kept = call("c2b", "c1", [201], [22], [answer("a2", "msg_2b")])
    night.add("grp_g1", [c1, retry, kept], [answer("a1", "msg_1"), answer("a2", "msg_2b")])
    built = build(night)
    assert built.audit["grp_g1"]["status"] == "ok", built.audit["grp_g1"]["detail"]
    assert built.rows_of("grp_g1")[0]["model_call_ids"] == ["c1", "c2b"]
