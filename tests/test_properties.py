"""Property-based tests: random chains, compactions and off-chain attempts rebuild exactly
the captured tokens; any single corrupted token masks the rollout."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inmemory import reassemble
from nights import answer, call, reasoning, tool_output
from reassembler.producer.capture import stage_rollout

token = st.integers(min_value=0, max_value=2**31 - 1)


def _tool_call(k: int) -> dict:
    return {
        "type": "function_call",
        "id": f"fc_{k}",
        "call_id": f"call_{k}",
        "name": "run",
        "arguments": json.dumps({"step": k}),
    }


@st.composite
def episodes(draw, gym: bool = False):
    """A rollout: chains (compactions) of calls, some with rejected attempts before them.
    `gym`: items as NeMo Gym's evidence needs them (at least one model-authored item a call,
    sometimes several, reasoning optional)."""
    n_chains = draw(st.integers(1, 4))
    calls, accepted, chains, output = [], [], [], []
    prev = None
    k = 0
    for _ in range(n_chains):
        chain = []
        for i in range(draw(st.integers(1, 5))):
            k += 1
            root = i == 0
            prompt = draw(st.lists(token, min_size=1 if root else 0, max_size=6))
            generated = draw(st.lists(token, min_size=1, max_size=6))
            parent = None if root else prev.call_id
            if gym:
                items = ([reasoning(f"think {k}", f"rs_{k}")] if draw(st.booleans()) else []) + draw(
                    st.sampled_from([[answer(f"answer {k}")], [_tool_call(k)], [answer(f"answer {k}"), _tool_call(k)]])
                )
            else:
                items = [reasoning(f"think {k}", f"rs_{k}")] + ([answer(f"answer {k}")] if draw(st.booleans()) else [])
            if not root and draw(st.integers(0, 3)) == 0:  # a rejected attempt, left off-chain
                calls.append(
                    call(
                        f"x{k}",
                        parent,
                        prompt,
                        draw(st.lists(token, min_size=1, max_size=4)),
                        [reasoning(f"rejected {k}")],
                    )
                )
            if root and prev is not None and draw(st.booleans()):  # a summarizer before the rewrite
                calls.append(call(f"sum{k}", prev.call_id, [7], [8], [answer(f"summary {k}")]))
            cc = call(f"c{k}", parent, prompt, generated, items, logprob=-float(k % 7) / 8)
            calls.append(cc)
            accepted.append(cc)
            chain.append(cc)
            output.extend(items)
            if draw(st.booleans()):
                output.append(tool_output(f"observation {k}"))
            prev = cc
        chains.append(chain)
    return calls, chains, output


def _record(output):
    return {"rollout_id": "g_g0", "group_id": "g", "slot": 0, "reward": 1.0, "output": output}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes())
def test_rows_are_exactly_the_captured_chains(episode):
    _check_rows(episode, "items")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes(gym=True))
def test_rows_are_exactly_the_captured_chains_selected_by_gym_fingerprints(episode):
    _check_rows(episode, "fingerprint")


def _check_rows(episode, evidence: str):
    calls, chains, output = episode
    outcome, batch = reassemble(_record(output), stage_rollout("g_g0", calls, evidence=evidence))
    assert outcome.ok, (outcome.reason, outcome.detail)
    assert len(outcome.segments) == len(chains)
    assert outcome.n_offchain == len(calls) - sum(len(c) for c in chains)
    for seg, chain in zip(outcome.segments, chains):
        assert [c.model_call_id for c in seg.calls] == [c.call_id for c in chain]
        expected_ids = np.concatenate([np.asarray(c.ids, dtype=np.int64) for c in chain])
        expected_mask = np.concatenate([np.asarray(c.mask, dtype=np.float32) for c in chain])
        expected_lp = np.concatenate([np.asarray(c.logprobs, dtype=np.float32) for c in chain])
        rows = np.asarray(seg.token_rows)
        offsets, ids, mask, lp = batch.gather(rows, np.array([len(rows)]))
        assert ids.tolist() == expected_ids.tolist()
        assert mask.tolist() == expected_mask.astype(np.int8).tolist()
        assert lp.dtype == np.float32 and lp.tolist() == expected_lp.tolist()
        assert int(batch.zeros[rows[0]]) == int((np.asarray(chain[0].mask) == 0).sum())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes(), st.data())
def test_any_corrupted_token_of_an_accepted_call_masks_the_rollout(episode, data):
    calls, chains, output = episode
    staged = stage_rollout("g_g0", calls)
    accepted = [c.call_id for chain in chains for c in chain]
    target = data.draw(st.sampled_from(accepted))
    _, token = next(s for s in staged if s[0]["model_call_id"] == target)
    ids = np.array(token["token_ids_delta"], copy=True)
    pos = data.draw(st.integers(0, len(ids) - 1))
    ids[pos] = data.draw(st.integers(-5, 2**31 + 5).filter(lambda v: v != ids[pos]))
    token["token_ids_delta"] = ids
    outcome, _ = reassemble(_record(output), staged)
    assert not outcome.ok
    assert outcome.reason.value in ("digest_mismatch", "invalid_token")
    assert outcome.failed_call_id == target


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=40), min_size=1, max_size=4),
    batch_rows=st.integers(2, 12),
)
def test_a_shard_cuts_its_calls_into_units_of_about_a_batch_whatever_its_groups(groups, batch_rows):
    """A shard's units (verify/shard.py: `_units`) give every call once, in order, each with
    exactly its rollouts; a unit ends inside a group (the open group) only between two of
    its rollouts, and then holds about one batch: at most `batch_rows` calls plus the rest
    of the rollout that reaches it, never two batches' worth."""
    import pyarrow as pa

    from reassembler.verify.shard import _units

    rows = {"group_id": [], "rollout_id": [], "delta_len": []}
    rollouts = []
    for g, calls in enumerate(groups):
        for r, n in enumerate(calls):
            rollouts.append({"group_id": f"g{g:02d}", "rollout_id": f"g{g:02d}r{r:03d}"})
            for _ in range(n):
                rows["group_id"].append(f"g{g:02d}")
                rows["rollout_id"].append(f"g{g:02d}r{r:03d}")
                rows["delta_len"].append(1)
    table = pa.table(rows)

    class Batches(list):
        schema = table.schema

    units = list(_units(Batches(table.to_batches(max_chunksize=3)), iter(rollouts), batch_rows, 10**9))
    assert pa.concat_tables([t for _, t, _ in units]).equals(table)
    assert [r for rs, _, _ in units for r in rs] == rollouts
    for rs, t, open_group in units:
        assert [r["rollout_id"] for r in rs] == list(dict.fromkeys(t.column("rollout_id").to_pylist()))
        if open_group is not None:
            assert t.column("group_id")[-1].as_py() == open_group
            assert t.num_rows <= batch_rows + 4 - 1
