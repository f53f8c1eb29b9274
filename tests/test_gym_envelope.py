"""NeMo Gym 0.7.0 compaction-agent result lines (CONTRACT.md 11): the night Gym's own
compaction agent wrote (tests/data/gym-0.7.0-compaction/, its expected outcome), each check
of 11.4 on an envelope with its tokens written out, the rows of 11.5, the digest, version 2
and the renamed contract, a night mixing every capture, and the command line."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest

from commands import cli
from conftest import read_partition
from reassembler.build import build_night
from reassembler.formats.gym_envelope import canonical_digest, describe, read_envelope
from reassembler.load.envelope_lines import envelope_calls
from reassembler.producer.gym_envelope import Envelope, EnvelopeCall, envelope_line, envelope_record
from reassembler.settings import Options, Settings

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "gym-0.7.0-compaction"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
DS = EXPECTED["ds"]

# ---------------------------------------------------------------- the night Gym's agent wrote

BUILDS = {"select": Options(), "strict": Options(offchain="strict"), "terminal": Options(mode="terminal")}


def build(root: Path, out: Path, options: Options = Options(), ds: str = DS, **kw):
    summary = build_night(root, out, ds, Settings(options=options, **kw))
    rows = read_partition(out, "rows", ds)
    audit = {a["rollout_id"]: a for a in read_partition(out, "audit", ds)}
    return summary, rows, audit


@pytest.fixture(scope="module", params=list(BUILDS))
def fixture_night(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"envelope-{request.param}")
    return (request.param, out, *build(FIXTURE, out, BUILDS[request.param]))


def test_the_fixture_night_builds_exactly_its_expected_rows_and_audit(fixture_night):
    mode, out, summary, rows, audit = fixture_night
    assert not (FIXTURE / "tokens").exists()  # no token store: the lines carry every call's tokens
    assert len(audit) == len(EXPECTED["rollouts"]) == summary.load.n_rollouts == 6
    by_row = {r["row_id"]: r for r in rows}
    n_rows = 0
    for e in EXPECTED["rollouts"]:
        got = audit[e["rollout_id"]]
        want = e["terminal"] if mode == "terminal" else e
        assert (got["group_id"], got["slot"]) == (e["group_id"], e["slot"])
        assert (got["status"], got["reason"]) == (want["status"], want["reason"]), e["rollout_id"]
        assert got["capture"] == "envelope"
        if want["status"] == "masked":
            assert got["advantage"] is None and got["evidence"] is None
            if want["reason"] != "history_rewritten":
                assert (got["failed_call_id"], got["detail"]) == (e["failed_call_id"], e["detail"])
            continue
        assert got["evidence"] == "digest"
        for key in ("n_ledger_calls", "n_selected", "n_segments", "n_offchain", "n_offchain_faults", "n_roots"):
            assert got[key] == e[key], key
        assert (got["n_tokens"], got["n_generated"], got["reward"]) == (e["n_tokens"], e["n_generated"], e["reward"])
        if mode != "terminal":
            assert got["advantage"] == pytest.approx(e["advantage"], abs=1e-9)
        for want_row in e["rows"]:
            row = by_row.pop(want_row["row_id"])
            n_rows += 1
            assert row["input_ids"] == want_row["input_ids"] and row["loss_mask"] == want_row["loss_mask"]
            assert np.array_equal(np.asarray(row["logprobs"], np.float32), np.asarray(want_row["logprobs"], np.float32))
            for key in ("prompt_len", "n_tokens", "n_generated", "model_call_ids", "segment_index", "segment_count"):
                assert row[key] == want_row[key], key
            assert row["rollout_weight"] == want_row["rollout_weight"]
            assert (row["weight_version_min"], row["weight_version_max"]) == (None, None)
            assert (row["advantage"], row["reward"]) == (got["advantage"], got["reward"])
            assert (row["capture"], row["evidence"], row["env"]) == ("envelope", "digest", None)
            assert (row["agent"], row["temperature"]) == ("simple_agent_with_compaction", 1.0)
    assert not by_row and n_rows == (1 if mode == "terminal" else 8)


def test_the_torn_final_line_is_a_rejected_input_line_and_the_retired_capture_is_not_read(fixture_night):
    _, out, summary, *_ = fixture_night
    assert summary.load.rollouts.read == 7 and summary.load.rollouts.rejected == 1
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        rejects = con.execute("SELECT source, file, line FROM rejects").fetchall()
        captures = con.execute("SELECT DISTINCT capture FROM rollouts").fetchall()
    assert rejects == [("rollouts", "rollouts.jsonl", 7)]  # 8-5's retired state file is no reject either
    assert captures == [("envelope",)]


def test_a_night_of_envelope_lines_needs_no_ledger_folder(tmp_path):
    root = tmp_path / "in"
    shutil.copytree(FIXTURE / "rollouts", root / "rollouts")
    _, rows, audit = build(root, tmp_path / "out")
    assert len(rows) == 8 and len(audit) == 6
    (root / "rollouts" / f"ds={DS}" / "rollouts.jsonl").write_text('{"reward": 1.0}\n')
    with pytest.raises(Exception, match="input partition folder is missing"):
        build(root, tmp_path / "out2")  # no envelope line: the ledger is required as before


# ---------------------------------------------------------------- the checks, tokens written out

# call 0: prompt [1, 2], generates [3, 4]; call 1 appends: [1, 2, 3, 4, 5] -> [6];
# call 2 starts segment 1 after a rewrite: [9, 5] -> [7]
CALLS = [
    EnvelopeCall([1, 2], [3, 4], [-0.5, -0.25]),
    EnvelopeCall([1, 2, 3, 4, 5], [6], [-1.0]),
    EnvelopeCall([9, 5], [7], [-2.0], starts_segment=True),
]


def line(**kw) -> dict:
    return envelope_record(Envelope(3, 0, [copy.deepcopy(c) for c in CALLS], **kw))


def test_the_rows_are_the_segments_with_their_tokens():
    got = read_envelope(line())
    assert got.reason is None and got.evidence == "digest" and got.rows == [[0, 1], [2]]
    s0 = np.concatenate([got.calls[k].ids for k in (0, 1)])
    assert s0.tolist() == [1, 2, 3, 4, 5, 6]
    assert np.concatenate([got.calls[k].mask for k in (0, 1)]).tolist() == [0, 0, 1, 1, 0, 1]
    assert np.concatenate([got.calls[k].logprobs for k in (0, 1)]).tolist() == [0, 0, -0.5, -0.25, 0, -1.0]
    assert (got.calls[2].ids.tolist(), got.calls[2].mask.tolist()) == ([9, 5, 7], [0, 0, 1])
    assert got.prompt_lens == [2, 2] and got.shape()["call_ids"] == [
        ["completion-000001-000300", "completion-000002-000300"],
        ["completion-000003-000300"],
    ]


def test_an_ineligible_call_is_context_and_a_segment_of_ineligible_calls_is_no_row():
    record = line()
    record["response"]["model_call_metadata"][1]["eligible"] = False
    got = read_envelope(record)
    assert got.rows == [[0, 1], [2]] and got.calls[1].mask.tolist() == [0, 0]
    assert got.calls[1].logprobs.tolist() == [0.0, 0.0]
    record["response"]["model_call_metadata"][2]["eligible"] = False
    assert read_envelope(record).rows == [[0, 1]]
    for r in record["response"]["model_call_metadata"]:
        r["eligible"] = False
    got = read_envelope(record)
    assert (got.reason.value, got.detail) == ("empty_selection", "no call is eligible for training")


def _meta(k: int):
    return lambda r: r["response"]["model_call_metadata"][k]


def _item(k: int):  # the token item of call k (a reasoning item before each, a tool output between)
    return lambda r: r["response"]["output"][3 * k + 1]


def _contract(r):
    return r["response"]["context_compaction_contract"]


def _generation(r):
    return _contract(r)["generation_contract"]


def _set(where, key, value):
    def change(r):
        where(r)[key] = value

    return change


def _redigest(k: int):
    """Call k's evidence digest recomputed from its (changed) token item: a consistent edit."""

    def change(r):
        item = _item(k)(r)
        _meta(k)(r)["generation_evidence_digest"] = canonical_digest(
            item["prompt_token_ids"], item["generation_token_ids"], item["generation_log_probs"]
        )

    return change


def _both(*changes):
    def change(r):
        for c in changes:
            c(r)

    return change


C0, C1, C2 = "completion-000001-000300", "completion-000002-000300", "completion-000003-000300"

CASES = [
    # name, change, reason, failed call, detail (a part of it)
    ("mask_sample", _set(lambda r: r, "mask_sample", True), "producer_masked", None, '"failure_kind":null'),
    (
        "both contract keys",
        lambda r: r["response"].__setitem__("rollout_trace_contract", {}),
        "unsupported_version",
        None,
        "both",
    ),
    (
        "contract not an object",
        lambda r: r["response"].__setitem__("context_compaction_contract", [1]),
        "unsupported_version",
        None,
        "not an object",
    ),
    ("schema_version 4", _set(_contract, "schema_version", 4), "unsupported_version", None, "schema_version 4"),
    ("schema_version true", _set(_contract, "schema_version", True), "unsupported_version", None, "schema_version"),
    ("mode", _set(_contract, "mode", "best_effort"), "unsupported_version", None, "mode"),
    ("contract rollout_id", _set(_contract, "rollout_id", ""), "invalid_record", None, "rollout_id"),
    ("generation_contract", _set(_contract, "generation_contract", None), "invalid_record", None, "generation"),
    ("contract id", _set(_generation, "generation_contract_id", 7), "invalid_record", None, "generation_contract_id"),
    ("training_eligible type", _set(_generation, "training_eligible", "yes"), "invalid_record", None, "boolean"),
    ("reasons type", _set(_generation, "incomplete_reasons", "x"), "invalid_record", None, "incomplete_reasons"),
    ("eligible with reasons", _set(_generation, "training_eligible", True), "invalid_record", None, "beside"),
    (
        "evidence not an array",
        lambda r: r["response"].__setitem__("model_call_metadata", {}),
        "invalid_record",
        None,
        "model_call_metadata",
    ),
    (
        "boundary_events not an array",
        lambda r: r["response"].__setitem__("boundary_events", {}),
        "invalid_record",
        None,
        "boundary_events",
    ),
    (
        "boundary event without id",
        lambda r: r["response"]["boundary_events"][0].pop("event_id"),
        "invalid_record",
        None,
        "boundary event 0",
    ),
    (
        "two events on one step",
        lambda r: r["response"]["boundary_events"].append({"event_id": "other", "applies_to_step": 3}),
        "invalid_record",
        None,
        "two boundary events apply to step 3",
    ),
    (
        "one event id twice",
        lambda r: r["response"]["boundary_events"].append(
            {"event_id": r["response"]["boundary_events"][0]["event_id"], "applies_to_step": 9}
        ),
        "invalid_record",
        None,
        "appears twice",
    ),
    (
        "training_eligible false beyond the identity gaps",
        lambda r: _generation(r)["incomplete_reasons"].append("sampling_params_not_reported"),
        "producer_masked",
        None,
        "training_eligible false: exact_chat_template",
    ),
    (
        "training_eligible false with no reason",
        _set(_generation, "incomplete_reasons", []),
        "producer_masked",
        None,
        "training_eligible false: no reason given",
    ),
    (
        "no token item",
        lambda r: [item.pop("generation_token_ids") for item in r["response"]["output"][1::3]],
        "missing_tokens",
        None,
        "no output item",
    ),
    (
        "a token item lost",
        lambda r: r["response"]["output"][4].pop("generation_token_ids"),
        "missing_tokens",
        None,
        "3 evidence records for 2",
    ),
    (
        "an evidence record lost",
        lambda r: r["response"]["model_call_metadata"].pop(),
        "unmatched_output",
        None,
        "output item 7",
    ),
    ("prompt not an array", _set(_item(1), "prompt_token_ids", None), "invalid_record", C1, "call 1 (output item 4)"),
    (
        "record not an object",
        lambda r: r["response"]["model_call_metadata"].__setitem__(1, "x"),
        "invalid_record",
        None,
        "not an object",
    ),
    ("turn_id a string", _set(_meta(1), "turn_id", "2"), "invalid_record", C1, "turn_id"),
    ("completion_id empty", _set(_meta(1), "completion_id", ""), "invalid_record", None, "completion_id"),
    ("segment_index negative", _set(_meta(1), "segment_index", -1), "invalid_record", C1, "segment_index"),
    ("append flag", _set(_meta(1), "expected_append_compatible", "no"), "invalid_record", C1, "expected_append"),
    ("event id a number", _set(_meta(2), "compaction_event_id", 5), "invalid_record", C2, "compaction_event_id"),
    ("eligible a string", _set(_meta(1), "eligible", "x"), "invalid_record", C1, "eligible"),
    ("media_ids an object", _set(_meta(1), "media_ids", {}), "invalid_record", C1, "media_ids"),
    ("digest missing", _set(_meta(1), "generation_evidence_digest", None), "invalid_record", C1, "digest"),
    ("logprobs short", _set(_item(0), "generation_log_probs", [-0.5]), "length_mismatch", C0, "1 log prob"),
    (
        "empty generation",
        _both(_set(_item(0), "generation_token_ids", []), _set(_item(0), "generation_log_probs", [])),
        "empty_generation",
        C0,
        "empty",
    ),
    ("token a boolean", _set(_item(0), "generation_token_ids", [3, True]), "invalid_token", C0, "not an integer"),
    ("token a float", _set(_item(0), "prompt_token_ids", [1, 2.0]), "invalid_token", C0, "not an integer"),
    ("token 2**31", _set(_item(0), "generation_token_ids", [3, 2**31]), "invalid_token", C0, "2147483648"),
    ("token negative", _set(_item(0), "prompt_token_ids", [-1, 2]), "invalid_token", C0, "-1"),
    ("token past int64", _set(_item(0), "prompt_token_ids", [2**70, 2]), "invalid_token", C0, "int64"),
    ("logprob null", _set(_item(0), "generation_log_probs", [-0.5, None]), "invalid_logprob", C0, "null"),
    ("logprob a string", _set(_item(0), "generation_log_probs", [-0.5, "x"]), "invalid_logprob", C0, "number"),
    ("logprob > 0", _set(_item(0), "generation_log_probs", [-0.5, 0.5]), "invalid_logprob", C0, "0.5 > 0"),
    (
        "a token changed after the digest",
        _set(_item(1), "generation_token_ids", [8]),
        "digest_mismatch",
        C1,
        "call 1 (output item 4): evidence digest",
    ),
    (
        "a log probability changed after the digest",
        _set(_item(1), "generation_log_probs", [-1.0000001]),
        "digest_mismatch",
        C1,
        "evidence digest",
    ),
    ("rollout_id of another rollout", _set(_meta(1), "rollout_id", "other"), "field_mismatch", C1, "rollout_id"),
    ("another generation contract", _set(_meta(1), "generation_contract_id", "g"), "field_mismatch", C1, "contract"),
    ("media", _set(_meta(1), "media_ids", ["img-1"]), "unsupported_version", C1, "1 media ids"),
    ("a turn_id gap", _set(_meta(1), "turn_id", 3), "broken_chain", C1, "turn_id 3, expected 2"),
    ("first call appends", _set(_meta(0), "expected_append_compatible", True), "field_mismatch", C0, "first call"),
    (
        "first call under a boundary",
        lambda r: r["response"]["boundary_events"].append({"event_id": "b1", "applies_to_step": 1}),
        "field_mismatch",
        C0,
        "first call declares a boundary",
    ),
    ("first call in segment 1", _set(_meta(0), "segment_index", 1), "field_mismatch", C0, "segment_index 1"),
    (
        "an appending call that does not extend",
        _both(_set(_item(1), "prompt_token_ids", [1, 2, 3, 9, 5]), _redigest(1)),
        "prefix_mismatch",
        C1,
        "position 3",
    ),
    (
        "an appending call under a boundary",
        lambda r: r["response"]["boundary_events"].append({"event_id": "b2", "applies_to_step": 2}),
        "field_mismatch",
        C1,
        "boundary event b2 applies to it",
    ),
    (
        "an appending call names an event",
        _set(_meta(1), "compaction_event_id", "b"),
        "field_mismatch",
        C1,
        "append-compatible, yet compaction_event_id",
    ),
    (
        "a break with no boundary event",
        lambda r: r["response"]["boundary_events"].clear(),
        "prefix_mismatch",
        C2,
        "call 2: the prompt breaks from the previous call and no boundary event applies to step 3",
    ),
    (
        "a boundary with no break",
        _both(_set(_item(2), "prompt_token_ids", [1, 2, 3, 4, 5, 6, 9]), _redigest(2)),
        "field_mismatch",
        C2,
        "declares a rewrite the prompt does not show",
    ),
    (
        "a new segment with neither boundary nor break",
        _both(
            lambda r: r["response"]["boundary_events"].clear(),
            _set(_item(2), "prompt_token_ids", [1, 2, 3, 4, 5, 6, 9]),
            _redigest(2),
        ),
        "field_mismatch",
        C2,
        "no boundary event and an unbroken prompt",
    ),
    ("the event id differs", _set(_meta(2), "compaction_event_id", "b9"), "field_mismatch", C2, "!= boundary"),
    ("a segment index skipped", _set(_meta(2), "segment_index", 2), "field_mismatch", C2, "segment_index 2"),
    ("an epoch apart", _set(_meta(2), "context_epoch", 0), "field_mismatch", C2, "context_epoch 0, expected 1"),
    ("segment_id changed inside", _set(_meta(1), "segment_id", "s-x"), "field_mismatch", C1, "segment_id"),
    (
        "a boundary that starts no segment",
        lambda r: r["response"]["boundary_events"].append({"event_id": "late", "applies_to_step": 9}),
        "field_mismatch",
        None,
        "boundary event late (step 9) starts no segment",
    ),
]


@pytest.mark.parametrize(("name", "change", "reason", "call", "detail"), CASES, ids=[c[0] for c in CASES])
def test_each_check_masks_its_rollout_with_its_reason(name, change, reason, call, detail):
    record = line()
    assert read_envelope(record).reason is None
    change(record)
    got = read_envelope(record)
    assert got.reason is not None, name
    assert (got.reason.value, got.call_id) == (reason, call), got.detail
    assert detail in got.detail and got.rows == [] and got.calls == {}


def test_the_checks_run_in_the_contracts_order():
    """Two faults at once: the earlier check of 11.4 names the rollout's reason."""
    order = [
        ("mask_sample", "producer_masked"),
        ("schema_version 4", "unsupported_version"),
        ("contract rollout_id", "invalid_record"),
        ("training_eligible false with no reason", "producer_masked"),
        ("an evidence record lost", "unmatched_output"),
        ("logprobs short", "length_mismatch"),
        ("token 2**31", "invalid_token"),
        ("logprob null", "invalid_logprob"),
        ("a token changed after the digest", "digest_mismatch"),
        ("rollout_id of another rollout", "field_mismatch"),
        ("media", "unsupported_version"),
        ("a turn_id gap", "broken_chain"),
        ("a break with no boundary event", "prefix_mismatch"),
    ]
    changes = {name: change for name, change, *_ in CASES}
    for (first, reason), (second, _) in zip(order, order[1:]):
        record = line()
        changes[second](record)
        changes[first](record)
        assert read_envelope(record).reason.value == reason, (first, second)


def test_the_three_identity_gaps_alone_admit_a_line_and_eligible_true_without_reasons_too():
    assert read_envelope(line()).reason is None  # Gym 0.7.0 writes false with exactly the three gaps
    assert read_envelope(line(training_eligible=True, incomplete_reasons=[])).reason is None


def test_version_2_lines_compare_the_evidence_copy_and_say_their_tokens_are_unvouched():
    record = line(version=2)
    got = read_envelope(record)
    assert (got.reason, got.evidence, got.rows) == (None, "none", [[0, 1], [2]])
    assert got.metadata["verification_skipped"] is True and got.kind == "context_compaction_contract v2"
    record["response"]["completion_evidence"][1]["sampled_token_ids"] = [8]
    got = read_envelope(record)
    assert (got.reason.value, got.call_id) == ("digest_mismatch", C1)
    record = line(version=2)
    record["response"]["completion_evidence"][0]["sampled_logprobs"] = [-0.5, "x"]
    assert read_envelope(record).reason.value == "digest_mismatch"  # not a number in the copy: a mismatch
    record = line(version=2)
    record["response"]["completion_evidence"][0].pop("prompt_token_ids")
    assert read_envelope(record).reason.value == "invalid_record"


def test_the_renamed_rollout_trace_contract_is_read_like_version_3():
    record = line(version=None)
    contract = record["response"]["rollout_trace_contract"]
    assert "schema_version" not in contract and "mode" not in contract
    got = read_envelope(record)
    assert (got.reason, got.evidence, got.kind, got.rows) == (None, "digest", "rollout_trace_contract", [[0, 1], [2]])
    _set(_item(1), "generation_token_ids", [8])(record)
    assert read_envelope(record).reason.value == "digest_mismatch"


def test_a_log_probability_of_minus_infinity_masks_and_one_of_exactly_zero_trains():
    record = line()
    _item(0)(record)["generation_log_probs"] = [-0.5, float("-inf")]  # JSON's -Infinity, as Python reads it
    got = read_envelope(record)
    assert (got.reason.value, got.call_id, got.detail) == (
        "invalid_logprob",
        C0,
        "call 0 (output item 1): a log probability is not finite",
    )
    record = line()
    _both(_set(_item(0), "generation_log_probs", [-0.5, 0.0]), _redigest(0))(record)
    got = read_envelope(record)
    assert got.reason is None and got.calls[0].logprobs.tolist() == [0.0, 0.0, -0.5, 0.0]


def test_a_generation_contract_without_training_eligible_is_not_eligible():
    record = line()
    _generation(record).pop("training_eligible")
    assert read_envelope(record).reason is None  # the three identity gaps alone still admit it
    _generation(record)["incomplete_reasons"] = []
    got = read_envelope(record)
    assert (got.reason.value, got.detail) == ("producer_masked", "training_eligible false: no reason given")


def test_a_prompt_equal_to_the_previous_calls_tokens_extends_it():
    calls = [EnvelopeCall([1, 2], [3, 4], [-0.5, -0.25]), EnvelopeCall([1, 2, 3, 4], [6], [-1.0])]
    got = read_envelope(envelope_record(Envelope(3, 0, calls)))
    assert got.reason is None and got.rows == [[0, 1]]
    assert (got.calls[1].ids.tolist(), got.calls[1].mask.tolist()) == ([6], [1])


def test_each_derived_call_s_parent_is_the_call_before_it_in_its_segment():
    calls = [
        EnvelopeCall([1, 2], [3], [-0.5]),
        EnvelopeCall([1, 2, 3, 4], [5], [-1.0]),
        EnvelopeCall([1, 2, 3, 4, 5, 6], [7], [-1.0]),
        EnvelopeCall([9], [8], [-2.0], starts_segment=True),
    ]
    got = read_envelope(envelope_record(Envelope(3, 0, calls)))
    assert got.rows == [[0, 1, 2], [3]]
    derived = [(c.call_id, c.parent, c.mode, c.ids.tolist()) for c in envelope_calls(got)]
    assert derived == [
        ("0", None, "text", [1, 2, 3]),
        ("1", "0", "token_in", [4, 5]),
        ("2", "1", "token_in", [6, 7]),
        ("3", None, "text", [9, 8]),
    ]


def test_explain_walks_every_call_a_record_or_an_item_short_included():
    record = line()
    record["response"]["model_call_metadata"].pop()  # 3 token items, 2 records
    walked = [s for s in describe(record, read_envelope(record)) if s.startswith("  call ")]
    assert [s.split(":")[0] for s in walked] == [
        "  call 0 (output item 1)",
        "  call 1 (output item 4)",
        "  call 2 (output item 7)",
    ]
    assert walked[2].startswith("  call 2 (output item 7): None, step None")
    record = line()
    record["response"]["output"][7].pop("generation_token_ids")  # 2 token items, 3 records
    walked = [s for s in describe(record, read_envelope(record)) if s.startswith("  call ")]
    assert len(walked) == 3 and walked[2].startswith(f"  call 2 (no output item): {C2}, step 3, segment 1")


# ---------------------------------------------------------------- the digest


def _gym_canonical_digest(value: dict) -> str:
    """history.py:88-96 as contract 11.1 quotes it, for the vectors below."""
    return hashlib.sha256(
        json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    ).hexdigest()


@pytest.mark.parametrize(
    "logprobs",
    [[-1e-05], [-13.765823364257812], [-0.0], [-0.5, -1e-05, -13.765823364257812, -0.0, -1e-300, -123456789.0]],
)
def test_the_digest_is_gyms_canonical_digest_whatever_the_float_formatting(logprobs):
    prompt, generated = [151644, 8948, 0], list(range(len(logprobs)))
    expected = _gym_canonical_digest(
        {"prompt_token_ids": prompt, "sampled_token_ids": generated, "sampled_logprobs": logprobs}
    )
    assert canonical_digest(prompt, generated, logprobs) == expected
    # an integer log probability is hashed as the float Gym held: repr(float(0)) is "0.0"
    assert canonical_digest([1], [2], [0]) == _gym_canonical_digest(
        {"prompt_token_ids": [1], "sampled_token_ids": [2], "sampled_logprobs": [0.0]}
    )


def test_digest_vectors_pinned():
    """Hex digests pinned once (11.4 check 8.6's text, byte for byte): a change of encoding
    (orjson's 1e-5 for Python's 1e-05, spaces, key order) changes them."""
    assert (
        canonical_digest([1, 2], [3], [-1e-05])
        == hashlib.sha256(b'{"prompt_token_ids":[1,2],"sampled_logprobs":[-1e-05],"sampled_token_ids":[3]}').hexdigest()
    )
    assert (
        canonical_digest([7], [8, 9], [-13.765823364257812, -0.0])
        == hashlib.sha256(
            b'{"prompt_token_ids":[7],"sampled_logprobs":[-13.765823364257812,-0.0],"sampled_token_ids":[8,9]}'
        ).hexdigest()
    )


def test_the_fixtures_digests_are_recomputed_byte_exact():
    """Every call of the fixture's ok lines: the digest Gym's own code recorded equals ours."""
    path = FIXTURE / "rollouts" / f"ds={DS}" / "rollouts.jsonl"
    checked = 0
    for raw in path.read_bytes().splitlines()[:6]:
        response = json.loads(raw)["response"]
        items = [i for i in response["output"] if i.get("generation_token_ids") is not None]
        for item, record in zip(items, response["model_call_metadata"]):
            recomputed = canonical_digest(
                item["prompt_token_ids"], item["generation_token_ids"], item["generation_log_probs"]
            )
            checked += recomputed == record["generation_evidence_digest"]
    assert checked == 4 + 4 + 5 + 4 - 1 + 4 + 2  # 8-3's changed token is the one mismatch


# ---------------------------------------------------------------- builds, as a user runs them


def write_night(root: Path, envelopes: list, name: str = "rollouts.jsonl") -> Path:
    folder = root / "rollouts" / f"ds={DS}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "a") as fh:
        for env in envelopes:
            fh.write(envelope_line(env))
    return root


def test_rollout_checks_come_first_and_a_diagnosis_beside_a_reward_trains(tmp_path):
    root = write_night(
        tmp_path / "in",
        [
            Envelope(1, 0, CALLS, reward=1.0, failure_kind="tool_timeout", failure_reason="a tool timed out"),
            Envelope(1, 1, CALLS, reward=None, failure_kind="crash", failure_reason="the env crashed"),
            Envelope(1, 2, CALLS, reward=None),
            Envelope(1, 3, CALLS, reward=0.0),
        ],
    )
    _, rows, audit = build(root, tmp_path / "out")
    assert (audit["1-1"]["reason"], audit["1-1"]["detail"]) == ("rollout_failed", "the env crashed")
    assert audit["1-2"]["reason"] == "invalid_reward"
    assert audit["1-0"]["status"] == "ok" and audit["1-0"]["advantage"] == pytest.approx(1.0, abs=1e-5)  # with 1-3
    assert json.loads(audit["1-0"]["metadata"])["failure_kind"] == "tool_timeout"
    assert {r["row_id"] for r in rows} == {"1-0_s0", "1-0_s1", "1-3_s0", "1-3_s1"}


def test_the_command_builds_explains_and_reports_an_envelope_night(tmp_path):
    out = tmp_path / "out"
    res = cli("build", "--input", FIXTURE, "--output", out, "--ds", DS)
    assert res.returncode == 0, res.stderr
    assert "6 NeMo Gym compaction-agent lines (2 masked by their envelope checks)" in res.stdout
    res = cli("explain", "--output", out, "--ds", DS, "8-1")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "capture: a NeMo Gym compaction-agent line" in text and "line rollouts.jsonl:2" in text
    assert "boundary event boundary-000004-0fb68144172b applies to step 4 (recency)" in text
    assert "call 3 (output item 11): completion-000004-194f32d3e598, step 4, segment 1, starts a segment" in text
    assert "row 8-1_s1: calls [completion-000004-194f32d3e598], 140 tokens, 28 generated, prompt_len 112" in text
    res = cli("explain", "--output", out, "--ds", DS, "8-3", "--json")
    replay = json.loads(res.stdout)
    assert replay["result"]["reason"] == "digest_mismatch"
    assert replay["result"]["failed_call_id"] == "completion-000003-e5eaa5762a1d"
    res = cli("report", "--output", out, "--html")
    assert res.returncode == 0, res.stderr
    page = (out / "reports" / f"ds={DS}" / "index.html").read_text()
    assert "Gym compaction envelope" in page


def test_the_layout_gym_finds_envelope_lines_in_gyms_results_folder(tmp_path):
    run = tmp_path / "gym" / DS
    run.mkdir(parents=True)
    shutil.copy(FIXTURE / "rollouts" / f"ds={DS}" / "rollouts.jsonl", run / "rollouts.jsonl")
    out = tmp_path / "out"
    res = cli("build", "--layout", "gym", "--input", str(tmp_path / "gym" / "{ds}"), "--output", out, "--ds", DS)
    assert res.returncode == 0, res.stderr
    assert len(read_partition(out, "rows", DS)) == 8


def test_a_night_mixing_every_capture_builds_each_as_alone(tmp_path):
    """Staged (the Gym fixture), local mode, verifiers and envelope lines in one night: each
    rollout's rows and audit row as its night alone builds them; `capture` and `evidence` on
    every row."""
    sources = {
        "staged": DATA / "gym-0.7.0",
        "local": DATA / "gym-0.7.0-local",
        "verifiers": DATA / "verifiers-0.4.0",
        "envelope": FIXTURE,
    }
    mixed = tmp_path / "mixed"
    alone: dict[str, tuple] = {}
    for name, src in sources.items():
        src_ds = json.loads((src / "expected.json").read_text())["ds"]
        single = tmp_path / name
        shutil.copytree(src, single, ignore=shutil.ignore_patterns("expected.json", "README.md", "empty-night"))
        for kind in ("rollouts", "ledger", "tokens"):
            folder = single / kind / f"ds={src_ds}"
            if folder.exists():
                folder.rename(single / kind / f"ds={DS}")
        if name == "envelope":  # Gym's task 8 is in the local-mode night too: the envelope's becomes task 18
            results = single / "rollouts" / f"ds={DS}" / "rollouts.jsonl"
            results.write_bytes(results.read_bytes().replace(b'"_ng_task_index":8,', b'"_ng_task_index":18,'))
            for f in (single / "ledger" / f"ds={DS}").iterdir():
                f.rename(f.with_name("1" + f.name))
        for kind in ("rollouts", "ledger", "tokens"):  # into the mixed night, the rollout files' names apart
            for f in (single / kind / f"ds={DS}").glob("*") if (single / kind).exists() else ():
                target = mixed / kind / f"ds={DS}" / (f"{name}-{f.name}" if kind == "rollouts" else f.name)
                if f.name == "traces.jsonl":
                    target = target.with_name(f"{name}.traces.jsonl")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, target)
        alone[name] = build(single, tmp_path / f"out-{name}")[1:]
    (mixed / "tokens" / f"ds={DS}").mkdir(parents=True, exist_ok=True)
    _, rows, audit = build(mixed, tmp_path / "out-mixed")
    want_rows = {r["row_id"]: r for _, (rs, _) in alone.items() for r in rs}
    want_audit = {k: a for _, (_, au) in alone.items() for k, a in au.items()}
    for a in (*audit.values(), *want_audit.values()):
        a.pop("run_id")
    got_rows = {r["row_id"]: r for r in rows}
    assert got_rows.keys() == want_rows.keys() and audit.keys() == want_audit.keys()
    assert got_rows == want_rows and audit == want_audit
    assert {r["capture"] for r in rows} == {"staged", "local", "verifiers", "envelope"}
    assert all(r["evidence"] == ("none" if r["capture"] == "verifiers" else "digest") for r in rows)
