"""Calls the load derives from a rollout line (load/derived_calls.py) and their token rows
in memory (load/derived_tokens.py's `derived_tokens`, what `reassembler explain` reads):
each call's parent, and each call row's place in the token rows it is given with."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from reassembler.formats.gym_rebuilt import RebuiltRow
from reassembler.formats.token_file import CANONICAL
from reassembler.load.derived_calls import TokenRow, rebuilt_calls
from reassembler.load.derived_tokens import derived_tokens


def _piece(ids: list[int], generated: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mask = np.array([0.0] * (len(ids) - generated) + [1.0] * generated, np.float32)
    return np.array(ids, np.int64), mask, -mask / 2


def test_a_rebuilt_lines_calls_are_a_chain_each_the_parent_of_the_next():
    built = RebuiltRow(3, pieces=[_piece([1, 2, 3], 1), _piece([4, 5], 1), _piece([6], 1)])
    calls = list(rebuilt_calls(built))
    assert [(c.call_id, c.parent, c.mode) for c in calls] == [
        ("gym-rebuilt-item-0", None, "text"),
        ("gym-rebuilt-item-1", "gym-rebuilt-item-0", "token_in"),
        ("gym-rebuilt-item-2", "gym-rebuilt-item-1", "token_in"),
    ]
    assert [c.ids.tolist() for c in calls] == [[1, 2, 3], [4, 5], [6]]
    assert list(rebuilt_calls(RebuiltRow(0))) == []


def test_explains_derived_token_rows_are_the_call_rows_own_numbered_from_0():
    rows = {
        "r/b": TokenRow("r/b", np.array([7, 8], np.int64), np.array([0, 1], np.float32), np.array([0, -1], np.float32)),
        "r/a": TokenRow("r/a", np.array([5], np.int64), np.array([1], np.float32), np.array([-2], np.float32)),
    }
    calls = pa.table(
        {
            "staging_key": ["r/a", "r/missing", "r/b"],
            "t_file": pa.array(["x", "x", "x"], pa.string()),
            "t_row": pa.array([9, 9, 9], pa.int64()),
        }
    )
    table, tokens = derived_tokens(calls, rows)
    assert table.column("t_file").to_pylist() == ["(derived)", None, "(derived)"]
    assert table.column("t_row").to_pylist() == [0, None, 2]
    assert tokens.schema == CANONICAL and tokens.num_rows == 3
    assert tokens.column("ids").to_pylist() == [[5], None, [7, 8]]
    for k, key in enumerate(table.column("staging_key").to_pylist()):  # each call row finds its own tokens
        t_row = table.column("t_row")[k].as_py()
        if t_row is not None:
            assert tokens.column("ids")[t_row].as_py() == rows[key].ids.tolist()
            assert tokens.column("logprobs")[t_row].as_py() == rows[key].logprobs.tolist()
