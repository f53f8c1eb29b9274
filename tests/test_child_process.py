"""The load's child processes (load/child_process.py): their records are taken as they
are written, a record half written is waited for, and the last one is given only once the
child has ended well."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reassembler.load.child_process import ChildProcess


@pytest.fixture
def child(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # child_scripts.py, in the child

    def start(**work) -> ChildProcess:
        return ChildProcess("child_scripts", "test child", json.dumps(work).encode())

    return start


def test_a_childs_records_are_taken_while_it_still_runs(child, tmp_path):
    flag = tmp_path / "flag"
    proc = child(script="streams", flag=str(flag))
    try:
        records = proc.records(last="lines")
        assert next(records) == ("rows", [1])
        flag.touch()  # the child goes on only now: the first record came before its end
        assert list(records) == [("lines", "parent took the first record")]
    finally:
        proc.close()


def test_a_record_half_written_is_waited_for(child):
    proc = child(script="half")
    try:
        assert list(proc.records(last="lines")) == [("rows", list(range(1000))), ("lines", 1)]
    finally:
        proc.close()


def test_the_last_record_of_a_child_that_fails_is_not_given(child):
    proc = child(script="dies")
    try:
        records = proc.records(last="lines")
        assert next(records) == ("rows", [1])
        with pytest.raises(RuntimeError) as raised:
            next(records)
        assert str(raised.value) == "test child process ended with exit code 3: MemoryError: the last thing it said"
    finally:
        proc.close()


def test_a_child_keeps_pandas_out(child):
    """pyarrow imports pandas (0.3-0.5 s) the first time it is handed a Python list, only to
    ask whether it is a DataFrame: a child of the load never has it imported."""
    proc = child(script="pandas")
    try:
        assert list(proc.records(last="lines")) == [("lines", {"rows": 3, "pandas": False})]
    finally:
        proc.close()
