"""Property (CONTRACT.md 10.5): for random verifiers trace graphs (forks, several roots,
compaction attempts accepted or not, prompt-only branches, nodes without tokens), a built
night's rows are exactly the trainable root-to-leaf branches that hold a sampled token, in
leaf order, each the branch's tokens end to end; the audit counts them. The expectation is
computed here from the graph alone, in plain lists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import read_partition
from reassembler.build import build_night
from reassembler.producer.verifiers import episode, episode_line, prompt_node, sampled_node, trace
from reassembler.settings import Settings

DS = "2026-12-01"
TOKEN = st.integers(0, 2**31 - 1)
LOGPROB = st.integers(-99999, 0).map(lambda v: v / 10_000)  # as verifiers writes them: 4 decimals


@st.composite
def graphs(draw) -> list[dict]:
    """A trace's nodes: acyclic (each node's parent comes before it in a random order, so
    parents may sit at higher indices), with a few roots, forks, and compaction links."""
    n = draw(st.integers(1, 10))
    order = draw(st.permutations(list(range(n))))
    nodes: list[dict] = [{}] * n
    for k, i in enumerate(order):
        parent = None if k == 0 or draw(st.integers(0, 5)) == 0 else order[draw(st.integers(0, k - 1))]
        links = []
        if draw(st.integers(0, 3)) == 0:
            links.append((draw(st.integers(0, n - 1)), "compaction_attempt"))
        if draw(st.integers(0, 3)) == 0:
            links.append((draw(st.integers(0, n - 1)), draw(st.sampled_from(["compaction", "subagent_call"]))))
        if draw(st.booleans()):
            generated = draw(st.lists(TOKEN, min_size=1, max_size=4))
            logprobs = draw(st.lists(LOGPROB, min_size=len(generated), max_size=len(generated)))
            nodes[i] = sampled_node(draw(st.lists(TOKEN, max_size=3)), generated, logprobs, parent, links)
        else:
            nodes[i] = prompt_node(draw(st.lists(TOKEN, max_size=4)), parent, "user", links)
    return nodes


def expected_rows(nodes: list[dict], exactly_once: bool = True) -> list[dict]:
    """verifiers' Trace.branches, then the rows of 10.5, from the graph alone: a sampled node
    trains on the first trainable branch that holds it, later ones carry it as context, and
    a branch left with nothing to train is no row (`exactly_once` False: contract version 4,
    every branch trains every sampled node on it)."""
    parents = [node.get("parent") for node in nodes]
    leaves = [i for i in range(len(nodes)) if i not in parents]
    attempts = {
        i for i, node in enumerate(nodes) if any(x["type"] == "compaction_attempt" for x in node["semantic_parents"])
    }
    accepted = {x["node"] for node in nodes for x in node["semantic_parents"] if x["type"] == "compaction"}
    rows = []
    trained: set[int] = set()
    for leaf in leaves:
        if leaf in attempts and leaf not in accepted:
            continue
        path, k = [], leaf
        while k is not None:
            path.insert(0, k)
            k = parents[k]
        ids, mask, logprobs = [], [], []
        for k in path:
            node = nodes[k]
            owned_before = exactly_once and k in trained
            ids += node["token_ids"]
            mask += [int(m and not owned_before) for m in node["mask"]]
            lps = iter(node["logprobs"])
            logprobs += [next(lps) if m and not owned_before else 0.0 for m in node["mask"]]
        if 1 in mask:
            trained |= {k for k in path if True in nodes[k]["mask"]}
            rows.append(
                {
                    "input_ids": ids,
                    "loss_mask": mask,
                    "logprobs": logprobs,
                    "prompt_len": mask.index(1),
                    "model_call_ids": [str(k) for k in path if nodes[k]["sampled"]],
                    "nodes": path,
                }
            )
    return rows


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(traces=st.lists(graphs(), min_size=1, max_size=4))
def test_rows_are_the_trainable_branches_with_a_sampled_token(tmp_path_factory, traces):
    root = tmp_path_factory.mktemp("graphs")
    folder = root / "in" / "rollouts" / f"ds={DS}"
    folder.mkdir(parents=True)
    with open(folder / "traces.jsonl", "w") as fh:
        for k, nodes in enumerate(traces):
            fh.write(episode_line(episode(f"ep{k}", [trace(nodes)], group="g")))
    build_night(root / "in", root / "out", DS, Settings(allow_empty=True))
    rows = read_partition(Path(root / "out"), "rows", DS)
    audit = {a["rollout_id"]: a for a in read_partition(Path(root / "out"), "audit", DS)}
    assert len(audit) == len(traces)
    for k, nodes in enumerate(traces):
        want, got, a = expected_rows(nodes), [r for r in rows if r["rollout_id"] == f"ep{k}"], audit[f"ep{k}"]
        if not any(node["token_ids"] for node in nodes):
            assert (a["reason"], got) == ("missing_tokens", [])
            continue
        if not want:
            assert (a["reason"], got) == ("empty_selection", [])
            continue
        assert a["status"] == "ok" and a["n_segments"] == len(want) == len(got)
        for index, (w, g) in enumerate(zip(want, got)):
            assert (g["segment_index"], g["segment_count"]) == (index, len(want))
            assert g["input_ids"] == w["input_ids"] and g["loss_mask"] == w["loss_mask"]
            assert np.array_equal(np.asarray(g["logprobs"], np.float32), np.asarray(w["logprobs"], np.float32))
            assert (g["prompt_len"], g["model_call_ids"]) == (w["prompt_len"], w["model_call_ids"])
        sampled = {i for i, node in enumerate(nodes) if node["sampled"]}
        selected = {i for w in want for i in w["nodes"] if i in sampled}
        assert (a["n_ledger_calls"], a["n_selected"], a["n_offchain"]) == (
            len(sampled),
            len(selected),
            len(sampled - selected),
        )
        assert a["n_roots"] == sum(node.get("parent") is None for node in nodes)
        assert a["n_tokens"] == sum(len(w["input_ids"]) for w in want)
        # every sampled token on a trainable branch trains on exactly one row (10.5, version 5) ...
        on_rows = {i for w in expected_rows(nodes, exactly_once=False) for i in w["nodes"]}
        sampled_tokens = sum(sum(nodes[i]["mask"]) for i in on_rows)
        assert sum(g["n_generated"] for g in got) == sum(sum(g["loss_mask"]) for g in got) == sampled_tokens
        # ... and the rows are otherwise version 4's: the same branches' tokens, those left with nothing dropped
        before = iter(w["input_ids"] for w in expected_rows(nodes, exactly_once=False))
        assert all(any(g["input_ids"] == ids for ids in before) for g in got)  # a subsequence, in order
