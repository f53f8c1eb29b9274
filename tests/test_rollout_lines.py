"""Rollout lines parsed by child processes (rollout_lines.py, started by load.NightLoad) load
exactly what this process loads: the same rows, the same reject rows and messages, the same
errors; and the NightLoad that started them stops them, whatever happens."""

from __future__ import annotations

import json
import os
import sys

import pyarrow.parquet as pq
import pytest

from nights import DS, worked_example
from reassembler.cli import main
from reassembler.errors import InputError
from reassembler.formats.night import find_night
from reassembler.load import rollout_lines
from reassembler.load.json_lines import json_lines
from reassembler.merge.night_load import NightLoad
from reassembler.merge.run import load_night
from reassembler.settings import Settings
from reassembler.warehouse import connect

EVERY_KIND_OF_LINE = [
    b"{not json\n",
    b"\n",  # blank: skipped, not a line of its own
    b'{"rollout_id": "dup_key", "rollout_id": "again", "group_id": "g", "slot": 0, "output": []}\n',
    json.dumps({"rollout_id": "grp_g0", "group_id": "grp", "slot": 5, "reward": 1, "output": []}).encode() + b"\n",
    json.dumps({"group_id": "grp", "slot": 6, "reward": 1, "output": []}).encode() + b"\n",
    b"[1, 2]\n",
    b'{"rollout_id": "latin1_\xe9", "group_id": "g", "slot": 0, "output": []}\n',  # not UTF-8
    b'{"rollout_id": "long", "group_id": "g", "slot": 0, "output": [], "pad": "' + b"x" * 5000 + b'"}\n',
    json.dumps(
        {
            "rollout_id": "floats_and_unicode",
            "group_id": "grp2",
            "slot": 0,
            "reward": 0.25,
            "metadata": {"note": "é ✓", "t": 1e-7},
            "output": [
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ñ 0.1"}]},
                {"type": "function_call", "name": "f", "arguments": '{"x": 1.5, "y": [1, 2]}', "call_id": "c"},
            ],
        },
        ensure_ascii=False,
    ).encode()
    + b"\n",
]


@pytest.fixture
def odd_night(night):
    worked_example(night, "grp_g0", compaction=True, reward=1.0)
    worked_example(night, "grp_g1", compaction=False, reward=0.0)
    inp = night.write()
    with open(inp / "rollouts" / f"ds={DS}" / "rollouts.jsonl", "ab") as fh:
        fh.writelines(EVERY_KIND_OF_LINE)
    with open(inp / "rollouts" / f"ds={DS}" / "z-more.jsonl", "wb") as fh:  # a second file, read after
        fh.write(json.dumps({"rollout_id": "grp_g0", "group_id": "grp", "slot": 9, "output": []}).encode() + b"\n")
    return inp


def _load(inp, out, background_bytes: int, monkeypatch) -> tuple:
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", background_bytes)
    started = []
    real_start = rollout_lines.start
    monkeypatch.setattr(rollout_lines, "start", lambda *a: started.append(real_start(*a)) or started[-1])
    with connect(out) as con, NightLoad(inp, DS, Settings(max_line_bytes=4096)) as load:
        summary = load.into(con)
        rollouts = con.execute("SELECT * EXCLUDE (ds) FROM rollouts ORDER BY rollout_seq").fetchall()
        rejects = con.execute("SELECT * FROM rejects ORDER BY ALL").fetchall()
    return summary, rollouts, rejects, [s is not None for s in started]


@pytest.mark.parametrize("child_done", [True, False])
def test_the_child_loads_the_same_whether_it_is_done_before_the_ledger_or_after(
    tmp_path, odd_night, monkeypatch, child_done
):
    """load_night inserts the child's rows first when the child is done by then, else the
    ledger first: the night loaded is the same either way."""
    here = _load(odd_night, tmp_path / "here", 1 << 40, monkeypatch)
    monkeypatch.setattr(rollout_lines.InBackground, "done", lambda self: child_done)
    child = _load(odd_night, tmp_path / "child", 0, monkeypatch)
    assert child[3] == [True] and child[:3] == here[:3]
    with connect(tmp_path / "here", read_only=True) as a, connect(tmp_path / "child", read_only=True) as b:
        query = "SELECT * EXCLUDE (ds) FROM ledger ORDER BY capture_seq"
        assert a.execute(query).fetchall() == b.execute(query).fetchall()


def test_a_child_process_loads_what_this_process_loads(tmp_path, odd_night, monkeypatch):
    here = _load(odd_night, tmp_path / "here", 1 << 40, monkeypatch)
    child = _load(odd_night, tmp_path / "child", 0, monkeypatch)
    assert (here[3], child[3]) == ([False], [True])  # each path taken as meant
    assert child[:3] == here[:3]
    summary, rollouts, rejects, _ = child
    assert [r[1] for r in rollouts] == ["grp_g0", "grp_g1", "floats_and_unicode"]
    errors = [r[4] for r in rejects if r[1] == "rollouts"]
    assert len(errors) == 8 and summary.rollouts.read == 11
    assert any("not valid JSON" in e for e in errors) and any("duplicate key" in e for e in errors)
    assert any("over the 4,096-byte limit" in e for e in errors) and any("already seen" in e for e in errors)


def test_the_child_ignores_modules_in_the_working_folder(tmp_path, odd_night, monkeypatch):
    """A json.py (or reassembler/) in the folder the job runs from shadows nothing in the child."""
    work = tmp_path / "cwd"
    (work / "reassembler").mkdir(parents=True)
    (work / "json.py").write_text("raise ImportError('the working folder was on the path')\n")
    (work / "reassembler" / "__init__.py").write_text("raise ImportError('the working folder was on the path')\n")
    monkeypatch.chdir(work)
    assert _load(odd_night, tmp_path / "out", 0, monkeypatch)[3] == [True]


def test_a_file_gone_since_the_listing_is_the_same_one_line_error(tmp_path, odd_night, monkeypatch):
    messages = []
    for bytes_ in (1 << 40, 0):
        monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", bytes_)
        load = NightLoad(odd_night, DS)
        (odd_night / "rollouts" / f"ds={DS}" / "z-more.jsonl").rename(tmp_path / "aside")
        with connect(tmp_path / f"out{bytes_}") as con, load, pytest.raises(InputError) as err:
            load.into(con)
        (tmp_path / "aside").rename(odd_night / "rollouts" / f"ds={DS}" / "z-more.jsonl")
        messages.append(str(err.value))
    assert messages[0] == messages[1] == "z-more.jsonl: cannot open (No such file or directory)"


def test_a_child_that_dies_fails_the_load_and_leaves_no_half_night(tmp_path, odd_night, monkeypatch):
    with connect(tmp_path / "out") as con:
        load_night(con, find_night(odd_night, DS))  # a night loaded before
        before = con.execute("SELECT * FROM rollouts ORDER BY ALL").fetchall()
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # exits 1 at once, writes nothing
    with connect(tmp_path / "out") as con, NightLoad(odd_night, DS) as load:
        with pytest.raises(RuntimeError, match="rollout parser process ended with exit code 1"):
            load.into(con)
        assert con.execute("SELECT * FROM rollouts ORDER BY ALL").fetchall() == before  # the earlier load stands


@pytest.mark.parametrize("output", ["", "not a pickle"])
def test_a_child_that_leaves_no_readable_results_fails_the_load(tmp_path, odd_night, monkeypatch, output):
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\nprintf '{output}'\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    monkeypatch.setattr(sys, "executable", str(fake))
    with connect(tmp_path / "out") as con, NightLoad(odd_night, DS) as load:
        with pytest.raises(RuntimeError, match="left unreadable results"):
            load.into(con)


def test_the_command_builds_the_same_rows_with_the_child(tmp_path, odd_night, monkeypatch):
    rows = []
    for name, bytes_ in (("here", 1 << 40), ("child", 0)):
        monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", bytes_)
        out = tmp_path / name
        assert main(["build", "--input", str(odd_night), "--output", str(out), "--ds", DS]) == 0
        rows.append(pq.read_table(out / "rows" / f"ds={DS}").to_pylist())
    assert rows[0] == rows[1] and len(rows[0]) == 3


class _Collected:
    """Rows, reject rows and the calls of the rows taken (as gym_capture.GymCapture keeps
    them), in the order they are handed over."""

    def __init__(self):
        self.rows, self.rejects, self.calls = [], [], []
        self._taken: list[str] = []

    def add_row(self, row: dict) -> None:
        self.rows.append(row)
        self._taken.append(row["rollout_id"])

    def add(self, reject: dict) -> None:
        self.rejects.append(reject)

    def derived(self, chunk) -> None:
        taken, self._taken = self._taken, []
        if chunk is not None:
            kept = chunk.of(taken)
            self.calls += [(c, t) for c, t in zip(kept.calls.to_pylist(), kept.tokens.to_pylist(), strict=True)]


def _parsed_here(night) -> tuple[int, list, list, list]:
    got = _Collected()
    lines = rollout_lines.parse_here(night, 4096, got.add_row, got, got.derived)
    return lines, got.rows, got.rejects, got.calls


def test_the_rollout_lines_cut_into_parts_hold_every_line_once(odd_night):
    """Whatever the number of parts, they hold every line once, in reading order, cut
    between lines (a repeated id, a long line, a blank line fall wherever the cuts do)."""
    night = find_night(odd_night, DS)

    def lines_of(rel, lines=None) -> list:
        return [(rel, line, raw) for line, raw, _ in json_lines(night.path("rollouts", rel), rel, 4096, lines=lines)]

    whole = [x for rel in night.rollouts for x in lines_of(rel)]
    for parts in range(2, 12):
        split = rollout_lines.split(night, parts)
        assert 1 < len(split) <= parts
        assert [x for part in split for rel, lines in part for x in lines_of(rel, lines)] == whole, parts


@pytest.mark.parametrize("parts", [2, 3, 5, 8])
def test_children_over_parts_hand_over_what_this_process_parses(odd_night, parts):
    """The same rows (numbered across parts), the same reject rows in the same order, the
    same count of lines, the same calls carried by the rows kept, whichever part a repeated
    rollout_id falls in: a Gym-rebuilt line repeated in the second file (with other tokens)
    keeps no call of its own."""
    first, again = (
        odd_night / "rollouts" / f"ds={DS}" / "rollouts.jsonl",
        odd_night / "rollouts" / f"ds={DS}" / "z-more.jsonl",
    )
    first.write_bytes(json.dumps(_rebuilt_line("rebuilt_r", [3, 4])).encode() + b"\n" + first.read_bytes())
    with open(again, "ab") as fh:  # in the last part, the first in the first part
        fh.write(json.dumps(_rebuilt_line("rebuilt_r", [7, 8, 9])).encode() + b"\n")
    night = find_night(odd_night, DS)
    here = _parsed_here(night)
    keys = [(c["staging_key"], t["token_ids_delta"]) for c, t in here[3]]
    assert keys == [("rebuilt_r/gym-rebuilt-item-0", [1, 2, 3, 4]), ("rebuilt_r/gym-rebuilt-item-1", [5, 6])]
    background = rollout_lines.InBackground(night, 4096, rollout_lines.split(night, parts))
    try:
        got = _Collected()
        lines = background.results(got.add_row, got, got.derived)
    finally:
        background.close()
    assert (lines, got.rows, got.rejects, got.calls) == here
    assert sum("already seen" in r["error"] for r in got.rejects) == 3  # grp_g0 twice more, rebuilt_r


def _rebuilt_line(rollout_id: str, generated: list[int]) -> dict:
    """A Gym-rebuilt result line (CONTRACT.md 9.10) of two token items."""
    first = {
        "prompt_token_ids": [1, 2],
        "generation_token_ids": generated,
        "generation_log_probs": [-0.5] * len(generated),
    }
    second = {"prompt_token_ids": [1, 2, *generated, 5], "generation_token_ids": [6], "generation_log_probs": [-1.0]}
    items = [
        dict(first, type="message", role="assistant", content="hi"),
        dict(second, type="message", role="assistant", content="yo"),
    ]
    return {
        "rollout_id": rollout_id,
        "group_id": "g9",
        "slot": 0,
        "reward": 1,
        "_ng_token_capture": {},
        "response": {"output": items},
    }


def test_a_big_night_is_parsed_by_several_children_and_loads_the_same(tmp_path, odd_night, monkeypatch):
    here = _load(odd_night, tmp_path / "here", 1 << 40, monkeypatch)
    monkeypatch.setattr(rollout_lines, "PART_BYTES", 1)
    monkeypatch.setattr(rollout_lines.os, "cpu_count", lambda: 3)
    children = []
    real = rollout_lines.InBackground.__init__
    monkeypatch.setattr(
        rollout_lines.InBackground, "__init__", lambda self, *a: real(self, *a) or children.append(len(self._children))
    )
    parts = _load(odd_night, tmp_path / "parts", 0, monkeypatch)
    assert len(children) == 1 and children[0] > 1 and parts[3] == [True]
    assert parts[:3] == here[:3]


def _several_children(monkeypatch) -> None:
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    monkeypatch.setattr(rollout_lines, "PART_BYTES", 1)
    monkeypatch.setattr(rollout_lines.os, "cpu_count", lambda: 3)


def test_several_children_that_die_fail_the_load_and_leave_the_night_before(tmp_path, odd_night, monkeypatch):
    with connect(tmp_path / "out") as con:
        load_night(con, find_night(odd_night, DS))
        before = con.execute("SELECT * FROM rollouts ORDER BY ALL").fetchall()
    _several_children(monkeypatch)
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with connect(tmp_path / "out") as con, NightLoad(odd_night, DS) as load:
        with pytest.raises(RuntimeError, match="rollout parser process ended with exit code 1"):
            load.into(con)
        assert con.execute("SELECT * FROM rollouts ORDER BY ALL").fetchall() == before


def test_a_file_gone_after_the_night_was_split_is_the_same_one_line_error(tmp_path, odd_night, monkeypatch):
    _several_children(monkeypatch)
    with connect(tmp_path / "out") as con, NightLoad(odd_night, DS, Settings(max_line_bytes=4096)) as load:
        assert load._children is not None and len(load._children._children) > 1
        (odd_night / "rollouts" / f"ds={DS}" / "z-more.jsonl").unlink()
        with pytest.raises(InputError) as err:
            load.into(con)
    assert str(err.value) == "z-more.jsonl: cannot open (No such file or directory)"


def test_leaving_the_night_load_stops_a_child_still_parsing(tmp_path, odd_night, monkeypatch):
    """A child blocked on a file (a named pipe put in place of a rollout file once the night
    was listed: nothing ever writes to it) is killed and reaped when the NightLoad is left,
    here by an error in the body: no process, and no zombie, is left behind."""
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    load = NightLoad(odd_night, DS)
    more = odd_night / "rollouts" / f"ds={DS}" / "z-more.jsonl"
    more.unlink()
    os.mkfifo(more)
    with pytest.raises(KeyboardInterrupt), load:
        [child] = load._children._children
        proc = child._proc._proc  # the Popen behind child_process.ChildProcess
        assert proc.poll() is None  # still parsing: blocked on the pipe
        raise KeyboardInterrupt
    assert load._children is None and proc.returncode is not None  # killed, and waited for
    with pytest.raises(ChildProcessError):  # reaped: no zombie left behind
        os.waitpid(proc.pid, os.WNOHANG)
