"""docs/trainers.md's snippets, run as written on a built night: the selection by evidence,
padded batches and packed sequences equal the rows they came from, token for token."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from nights import Night, worked_example
from reassembler.build import build_night

DOC = Path(__file__).resolve().parents[1] / "docs" / "trainers.md"
DS = "2026-11-28"


def snippets() -> list[str]:
    found = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert len(found) == 3, "read, padded batches, packed sequences"
    return found


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainers")
    n = Night(root / "n", ds=DS)
    worked_example(n, "a_g0", compaction=True, reward=1.0)  # two rows of 3 and 7 tokens
    worked_example(n, "a_g1", compaction=False, reward=0.0)  # one row
    build_night(n.write(), root / "out", DS)
    return root / "out"


def test_the_snippets_give_batches_equal_to_the_rows(output):
    namespace = {"OUTPUT": str(output)}
    for code in snippets():
        exec(code, namespace)
    rows = pq.read_table(output / "rows").to_pylist()
    assert namespace["rows"].num_rows == len(rows) == 3 and all(r["evidence"] == "digest" for r in rows)
    batch, lengths = namespace["batch"], namespace["lengths"]
    assert batch["input_ids"].shape == (3, max(len(r["input_ids"]) for r in rows))
    for k, r in enumerate(rows):
        n = len(r["input_ids"])
        assert lengths[k] == n
        assert batch["input_ids"][k, :n].tolist() == r["input_ids"] and not batch["input_ids"][k, n:].any()
        assert batch["loss_mask"][k, :n].tolist() == r["loss_mask"] and not batch["loss_mask"][k, n:].any()
        assert np.array_equal(batch["logprobs"][k, :n], np.asarray(r["logprobs"], np.float32))
        weight = r["advantage"] * r["rollout_weight"]
        assert np.allclose(namespace["per_token"][k, :n], np.asarray(r["loss_mask"]) * weight)
    starts = namespace["cu_seqlens"]
    for k, r in enumerate(rows):
        assert namespace["packed_ids"][starts[k] : starts[k + 1]].tolist() == r["input_ids"]
        assert namespace["packed_mask"][starts[k] : starts[k + 1]].tolist() == r["loss_mask"]
        assert namespace["position_ids"][starts[k] : starts[k + 1]].tolist() == list(range(len(r["input_ids"])))
