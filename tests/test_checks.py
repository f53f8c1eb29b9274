"""The record and token checks computed in columns for a whole batch (checks.py) agree
with the per-call checks, call by call: both pass, or both fail with the same reason
(hypothesis, over batches of calls with random faults in every checked field)."""

from __future__ import annotations

import gc
import math

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from inmemory import SCHEMA, tables
from nights import DS, Night, worked_example
from reassembler.build import build_night
from reassembler.formats.fields import SHARED_FIELDS
from reassembler.load.token_store import CANONICAL
from reassembler.producer.synth import SynthConfig, synth_night
from reassembler.settings import Options, Settings
from reassembler.verify.calls import calls_from_table
from reassembler.verify.checks import BatchChecks, _explain_record, _explain_tokens

HEX = "0f" * 32
DIGESTS = st.sampled_from([HEX] * 12 + [HEX.upper(), "xyz", "0" * 63])


@st.composite
def call(draw, k: int) -> tuple[dict, list[dict]]:
    """One call's ledger fields and its token rows (none, one or two), each field now and
    then wrong, the token row's fields now and then different from the ledger's."""
    root = draw(st.booleans())
    prev = draw(st.sampled_from([0] * 6 + [5, -1])) if root else draw(st.sampled_from([5] * 6 + [0, -2]))
    delta = draw(st.sampled_from([3, 3, 3, 0, 2]))
    ledger = {
        "group_id": "g",
        "rollout_id": "r",
        "capture_seq": k,
        "model_call_id": f"c{k}",
        "parent_call_id": None if root else f"c{k - 1}",
        "mode": draw(st.sampled_from(["text"] * 6 + ["token_in"] if root else ["token_in"] * 6 + ["text", None])),
        "prev_len": prev,
        "delta_len": delta,
        "cum_len": draw(st.sampled_from([prev + delta] * 6 + [prev + delta + 1])),
        "weight_version": draw(st.sampled_from([1] * 6 + [0, -1])),
        "schema_version": draw(st.sampled_from([2] * 6 + [3, 1, None])),
        "digest_version": draw(st.sampled_from([2] * 6 + [3, None])),
        "extras_digest_version": draw(st.sampled_from([1] * 6 + [2])),
        "digest": draw(DIGESTS),
        "extras_digest": draw(DIGESTS),
        "chain_hash": draw(DIGESTS),
        "cumulative_hash": draw(DIGESTS),
        "staging_key": f"r/c{k}",
        "failure_reason": draw(st.sampled_from([None] * 6 + ["boom"])),
    }
    tokens = []
    for _ in range(draw(st.sampled_from([1, 1, 1, 1, 0, 2]))):
        token = {name: ledger[name] for name in SHARED_FIELDS}
        if draw(st.integers(0, 7)) == 0:  # one field differs, or a version is null
            name = draw(st.sampled_from(SHARED_FIELDS + ("schema_version", "digest_version")))
            token[name] = (
                None
                if name.endswith("version")
                else (token[name] or 0) * 2 + 1
                if isinstance(token[name], int)
                else f"{token[name]}x"
            )
        n = max(delta, 0) + draw(st.sampled_from([0, 0, 0, 0, 1, -1]))
        n = max(n, 0)
        zeros = draw(st.integers(0, n))
        mask = [0.0] * zeros + [1.0] * (n - zeros)
        lp = [0.0] * zeros + [-0.5] * (n - zeros)
        ids = list(range(10, 10 + n))
        faults = ["id", "mask value", "mask order", "last mask 0", "logprob", "logprob under 0", "short logprobs"]
        fault = draw(st.sampled_from([""] * 4 + faults))
        if fault == "id" and n:
            ids[-1] = draw(st.sampled_from([-1, 2**31]))
        elif fault == "mask value" and n:
            mask[0] = 0.5
        elif fault == "mask order" and zeros and n > zeros:
            mask[0], mask[-1] = 1.0, 0.0
        elif fault == "last mask 0" and n - zeros >= 2:  # one 1 -> 0 step
            mask[-1] = 0.0
        elif fault == "logprob" and n:
            lp[-1] = float("nan")
        elif fault == "logprob under 0" and zeros:
            lp[0] = -1.0
        elif fault == "short logprobs" and n:  # its own length_mismatch; the batch's other calls go row by row
            lp = lp[:-1]
        token.update(ids=ids, mask=mask, logprobs=lp)
        tokens.append(token)
    return ledger, tokens


def _tables(calls: list[tuple[dict, list[dict]]]) -> tuple[pa.Table, pa.Table]:
    """A batch's call rows (one per token row, or one without) and its token rows."""
    rows, tokens = [], []
    for ledger, token_rows in calls:
        for j, token in enumerate(token_rows or [None]):
            rows.append({**{n: None for n in SCHEMA.names}, **ledger, "t_file": "f" if token else None, "t_row": j})
            tokens.append({n: None for n in CANONICAL.names} | (token or {}))
    return pa.Table.from_pylist(rows, schema=SCHEMA), pa.Table.from_pylist(tokens, schema=CANONICAL)


@st.composite
def batch(draw):
    return _tables([draw(call(k)) for k in range(draw(st.integers(1, 8)))])


def _good(k: int, mask: list[float], lp: list[float] | None = None, ids: list[int] | None = None) -> tuple:
    """A root call whose ledger row and token row agree; its tokens as given."""
    n = len(mask)
    ledger = {
        "group_id": "g",
        "rollout_id": "r",
        "capture_seq": k,
        "model_call_id": f"c{k}",
        "parent_call_id": None,
        "mode": "text",
        "prev_len": 0,
        "delta_len": n,
        "cum_len": n,
        "weight_version": 1,
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "digest": HEX,
        "extras_digest": HEX,
        "chain_hash": HEX,
        "cumulative_hash": HEX,
        "staging_key": f"r/c{k}",
        "failure_reason": None,
    }
    token = {name: ledger[name] for name in SHARED_FIELDS}
    default_lp = [0.0 if m == 0.0 else -0.5 for m in mask]
    token.update(ids=ids or list(range(10, 10 + n)), mask=mask, logprobs=default_lp if lp is None else lp)
    return ledger, [token]


# The cases that matter, drawn in every run (a fresh clone has no .hypothesis/ to remember them)
PINNED = {
    "a logprob under mask 0 beside a call of unequal lengths": [
        _good(0, [0.0, 1.0, 1.0], lp=[0.0, -0.5]),
        _good(1, [0.0, 1.0, 1.0], lp=[-1.0, -0.5, -0.5]),
    ],
    "an id past 2**31 beside a mask that steps down": [
        _good(0, [0.0, 1.0], ids=[10, 2**31]),
        _good(1, [1.0, 0.0, 1.0]),
    ],
    "a last mask 0": [_good(0, [0.0, 1.0, 0.0])],
    "a mask value of 0.5 and a NaN logprob": [
        _good(0, [0.5, 1.0]),
        _good(1, [0.0, 1.0], lp=[0.0, float("nan")]),
    ],
    "no generated token beside a good call": [_good(0, [0.0, 0.0]), _good(1, [0.0, 1.0])],
    "two token rows of one call": [(_good(0, [0.0, 1.0])[0], _good(0, [0.0, 1.0])[1] * 2), _good(1, [1.0])],
    "a token row's version null": [
        (_good(0, [1.0])[0], [dict(_good(0, [1.0])[1][0], schema_version=None)]),
        _good(1, [0.0, 1.0]),
    ],
}


def token_reason(ids: list[int], mask: list[float], lp: list[float]) -> str | None:
    """CONTRACT.md 3.3's per-token checks of one token row, in their order, in plain Python
    over the lists themselves: the reference the batch's columns are held to."""
    if any(not 0 <= i < 2**31 for i in ids):
        return "invalid_token"
    if any(m not in (0.0, 1.0) for m in mask):
        return "invalid_mask"
    if any(a == 1.0 and b == 0.0 for a, b in zip(mask, mask[1:])):
        return "invalid_mask"
    if 1.0 not in mask:
        return "empty_generation"
    if any(math.isnan(x) or math.isinf(x) for x in lp):
        return "invalid_logprob"
    if any(m == 0.0 and x != 0.0 for m, x in zip(mask, lp)):
        return "invalid_logprob"
    return None


def _pinned(test):
    for calls in PINNED.values():
        test = example(_tables(calls))(test)
    return test


@settings(max_examples=300, deadline=None)
@given(batch())
@_pinned
def test_columns_and_per_call_checks_agree(tables):
    table, tokens = tables
    checks = BatchChecks(table, tokens)
    scalar_fields = tokens.drop_columns(["ids", "mask", "logprobs"]).to_pylist()
    lists = tokens.select(["ids", "mask", "logprobs"]).to_pylist()
    for c in calls_from_table(table):
        tok = scalar_fields[c.row] if c.n_token_rows else None
        expected = _explain_record(c, tok, checks.batch)
        assert checks.record_reason[c.index] == (expected.reason if expected else None), c
        if expected is None:
            expected = _explain_tokens(c, checks.batch)
            assert checks.token_reason[c.index] == (expected.reason if expected else None), c
            # and both equal the reference over this call's own lists, whatever else the batch holds
            row = lists[c.row]
            assert checks.token_reason[c.index] == token_reason(row["ids"], row["mask"], row["logprobs"]), c


def test_good_calls_pass_every_check_and_their_hashes_are_the_ledgers(tmp_path):
    """The worked example (compaction: two chains): no verdict, and the staged digest and
    chain hash computed ahead for each call equal what the capture recorded."""
    night = Night(tmp_path)
    ledger, tokens = worked_example(night, "grp_g0", compaction=True)
    _, table, token_table = tables(night.rollouts[0], list(zip(ledger, tokens)))
    checks = BatchChecks(table, token_table).hash_all()
    assert checks.record_reason == checks.token_reason == [None] * len(ledger)
    assert checks.digests == [row["digest"] for row in ledger]
    assert checks.chains == [row["chain_hash"] for row in ledger]


def test_a_finished_batch_is_freed_without_the_cycle_collector(tmp_path):
    """Masked rollouts raise exceptions whose tracebacks hold the batch's frames: none of
    them may form a cycle with the batch, or every batch of a night stays in memory until
    the cycle collector runs (which the build runs rarely)."""
    inp = tmp_path / "input"
    synth_night(inp, DS, SynthConfig(rollouts=40, seed=3, fault_rate=0.6))
    gc.collect()
    gc.disable()
    try:
        build_night(inp, tmp_path / "out", DS, Settings(batch_rows=64, options=Options(offchain="strict")))
        # type(), not isinstance(): isinstance reads __class__, which a lazy module proxy another
        # test of this worker left (Airflow's cloudpickle loader) turns into an import
        alive = [o for o in gc.get_objects() if type(o) is BatchChecks]
    finally:
        gc.enable()
    assert alive == []
