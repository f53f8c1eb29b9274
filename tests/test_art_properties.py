"""Properties of OpenPipe ART's branches (CONTRACT.md 13.5) over random trajectories of
exchanges: calls that extend a branch, regenerate from one, start over after a rewrite, change
the tool list, with one or two choices. Every prefix of tokens sampled anywhere is trained on
exactly one row (ART's first-occurrence mask: a shared sampled prefix trains once), and every
row's tokens are its last call's prompt ids and output ids."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reassembler.formats.art import _calls, _check_call, read_trajectory
from reassembler.formats.art_branches import branch_tokens, build_branches, first_occurrence

TOOLS = [None, [{"type": "function", "function": {"name": "search"}}]]


@st.composite
def trajectories(draw) -> dict:
    ids = st.lists(st.integers(5, 40), min_size=1, max_size=4)
    made: list[tuple[list, list, list, object]] = []  # (messages, prompt, output, tools) each choice gave
    exchanges = []
    for k in range(draw(st.integers(1, 6))):
        action = draw(st.sampled_from(["extend", "extend", "regenerate", "rewrite"])) if made else "rewrite"
        tools = draw(st.sampled_from(TOOLS))
        if action == "rewrite":
            messages = [{"role": "system", "content": "s"}, {"role": "user", "content": f"u{k}"}]
            prompt = [1, *draw(ids)]
        else:
            before, before_prompt, before_out, tools_before = draw(st.sampled_from(made))
            tools = tools_before if draw(st.booleans()) else tools
            if action == "regenerate":
                messages, prompt = before, list(before_prompt)
            else:
                k_out = len(made)
                messages = [*before, {"role": "user", "content": f"u{k}.{k_out}"}]
                prompt = [*before_prompt, *before_out, 2, *draw(ids)]
        choices = []
        for i in range(draw(st.integers(1, 2))):
            out = draw(ids)
            content = f"a{k}.{i}"
            choices.append(
                {
                    "index": i,
                    "finish_reason": "stop",
                    "token_ids": out,
                    "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": -0.5} for t in out]},
                    "message": {"role": "assistant", "content": content},
                }
            )
            made.append(([*messages, {"role": "assistant", "content": content}], prompt, out, tools))
        exchanges.append(
            {
                "start_time": f"2026-01-01T00:00:{k:02d}Z",
                "end_time": f"2026-01-01T00:00:{k:02d}.5Z",
                "request": {"model": "agent@1", "messages": messages, "tools": tools},
                "response": {"choices": choices, "prompt_token_ids": prompt},
            }
        )
    return {"exchanges": {"chat_completions": exchanges}, "reward": 1.0}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(trajectories())
def test_every_sampled_prefix_trains_on_exactly_one_row_and_rows_are_their_last_calls_tokens(t):
    calls = _calls(t["exchanges"]["chat_completions"])
    for c in calls:
        _check_call(c)
    branches = build_branches(calls)
    tokens = [branch_tokens(b) for b in branches]
    masks = first_occurrence(tokens)
    sampled: set[tuple[int, ...]] = set()
    trained: dict[tuple[int, ...], int] = {}
    for b, m in zip(tokens, masks):
        assert not (m & ~b.sampled).any()  # only sampled tokens train
        for i in np.flatnonzero(b.sampled):
            sampled.add(tuple(b.ids[: i + 1].tolist()))
        for i in np.flatnonzero(m):
            key = tuple(b.ids[: i + 1].tolist())
            trained[key] = trained.get(key, 0) + 1
    assert set(trained) == sampled and set(trained.values()) <= {1}
    for b, branch in zip(tokens, branches):  # a branch's tokens: its last call's prompt + output
        last = branch.sources[-1]
        choice = next(c for c in last.call.choices if c.index == last.choice)
        assert b.ids.tolist() == [*last.call.prompt_ids.tolist(), *choice.ids.tolist()]
    got = read_trajectory(t, 1.0)  # the rows: the branches that train a token, in ART's order
    assert got.reason is None, got.detail
    assert [r.ids.tolist() for r in got.rows] == [b.ids.tolist() for b, m in zip(tokens, masks) if m.any()]
    assert sum(int(r.mask.sum()) for r in got.rows) == len(sampled)
