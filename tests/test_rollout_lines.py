"""Rollout lines parsed by a child process (rollout_lines.py) load exactly what this process
loads: the same rows, the same reject rows and messages, the same errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from nights import DS, worked_example
from reassembler.cli import main
from reassembler.errors import InputError
from reassembler.formats.night import find_night
from reassembler.load import rollout_lines
from reassembler.load.json_lines import json_lines
from reassembler.load.read import load_night
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


@pytest.fixture(params=["spawned", "forked"])
def child_kind(request, monkeypatch) -> str:
    """Children as a new interpreter, or forked from this process (what the command does at
    its start; forced here, where pyarrow is loaded: the child only parses in Python)."""
    monkeypatch.setattr(rollout_lines, "_can_fork", lambda: request.param == "forked")
    return request.param


def _load(inp, out, background_bytes: int, monkeypatch) -> tuple:
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", background_bytes)
    started = []
    real_start = rollout_lines.start
    monkeypatch.setattr(rollout_lines, "start", lambda *a: started.append(real_start(*a)) or started[-1])
    with connect(out) as con:
        summary = load_night(con, find_night(inp, DS), max_line_bytes=4096)
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


def test_a_child_process_loads_what_this_process_loads(tmp_path, odd_night, monkeypatch, child_kind):
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
    night = find_night(odd_night, DS)
    (odd_night / "rollouts" / f"ds={DS}" / "z-more.jsonl").unlink()
    messages = []
    for bytes_ in (1 << 40, 0):
        monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", bytes_)
        with connect(tmp_path / f"out{bytes_}") as con, pytest.raises(InputError) as err:
            load_night(con, night)
        messages.append(str(err.value))
    assert messages[0] == messages[1] == "z-more.jsonl: cannot open (No such file or directory)"


def test_a_child_that_dies_fails_the_load_and_leaves_no_half_night(tmp_path, odd_night, monkeypatch):
    with connect(tmp_path / "out") as con:
        load_night(con, find_night(odd_night, DS))  # a night loaded before
        before = con.execute("SELECT * FROM rollouts ORDER BY ALL").fetchall()
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # exits 1 at once, writes nothing
    with connect(tmp_path / "out") as con:
        with pytest.raises(RuntimeError, match="rollout parser process ended with exit code 1"):
            load_night(con, find_night(odd_night, DS))
        assert con.execute("SELECT * FROM rollouts ORDER BY ALL").fetchall() == before  # the earlier load stands


@pytest.mark.parametrize("output", ["", "not a pickle"])
def test_a_child_that_leaves_no_readable_results_fails_the_load(tmp_path, odd_night, monkeypatch, output):
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\nprintf '{output}'\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    monkeypatch.setattr(sys, "executable", str(fake))
    with connect(tmp_path / "out") as con, pytest.raises(RuntimeError, match="left unreadable results"):
        load_night(con, find_night(odd_night, DS))


def test_rollouts_parsed_early_from_another_listing_are_parsed_again(tmp_path, odd_night, monkeypatch):
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    early = rollout_lines.start(find_night(odd_night, DS), 16 << 20)
    assert early is not None
    with open(odd_night / "rollouts" / f"ds={DS}" / "late.jsonl", "w") as fh:  # written after it started
        fh.write(json.dumps({"rollout_id": "late_g9", "group_id": "late", "slot": 0, "output": []}) + "\n")
    with connect(tmp_path / "out") as con:
        load_night(con, find_night(odd_night, DS), background=early)
        ids = [r for (r,) in con.execute("SELECT rollout_id FROM rollouts ORDER BY rollout_seq").fetchall()]
    assert ids == ["late_g9", "grp_g0", "grp_g1", "long", "floats_and_unicode"]


def test_the_command_builds_the_same_rows_with_the_child(tmp_path, odd_night, monkeypatch):
    rows = []
    for name, bytes_ in (("here", 1 << 40), ("child", 0)):
        monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", bytes_)
        out = tmp_path / name
        assert main(["build", "--input", str(odd_night), "--output", str(out), "--ds", DS]) == 0
        rows.append(pq.read_table(out / "rows" / f"ds={DS}").to_pylist())
    assert rows[0] == rows[1] and len(rows[0]) == 3


class _Collected:
    """Rows and reject rows in the order they are handed over."""

    def __init__(self):
        self.rows, self.rejects = [], []

    def add(self, reject: dict) -> None:
        self.rejects.append(reject)


def _parsed_here(night) -> tuple[int, list, list]:
    got = _Collected()
    lines = rollout_lines.parse_rollouts(night, 4096, got.rows.append, got)
    return lines, got.rows, got.rejects


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
def test_children_over_parts_hand_over_what_this_process_parses(odd_night, parts, child_kind):
    """The same rows (numbered across parts), the same reject rows in the same order, the
    same count of lines, whichever part a repeated rollout_id falls in."""
    night = find_night(odd_night, DS)
    here = _parsed_here(night)
    background = rollout_lines.InBackground(night, 4096, rollout_lines.split(night, parts))
    try:
        got = _Collected()
        lines = background.results(got.rows.append, got)
    finally:
        background.close()
    assert (lines, got.rows, got.rejects) == here
    assert sum("already seen" in r["error"] for r in got.rejects) == 2  # grp_g0 twice more


def test_a_big_night_is_parsed_by_several_children_and_loads_the_same(tmp_path, odd_night, monkeypatch, child_kind):
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
    with connect(tmp_path / "out") as con:
        with pytest.raises(RuntimeError, match="rollout parser process ended with exit code 1"):
            load_night(con, find_night(odd_night, DS))
        assert con.execute("SELECT * FROM rollouts ORDER BY ALL").fetchall() == before


def test_a_file_gone_after_the_night_was_split_is_the_same_one_line_error(tmp_path, odd_night, monkeypatch, child_kind):
    night = find_night(odd_night, DS)
    _several_children(monkeypatch)
    early = rollout_lines.start(night, 4096)
    assert early is not None and len(early._children) > 1
    (odd_night / "rollouts" / f"ds={DS}" / "z-more.jsonl").unlink()
    with connect(tmp_path / "out") as con, pytest.raises(InputError) as err:
        load_night(con, night, background=early, max_line_bytes=4096)
    assert str(err.value) == "z-more.jsonl: cannot open (No such file or directory)"


def test_only_a_process_with_no_thread_and_no_native_library_forks():
    """This test process has pyarrow and DuckDB loaded: it spawns. A process that has imported
    only what the command imports before it starts the children forks."""
    assert not rollout_lines._can_fork()
    probe = (
        "import reassembler.cli, reassembler.load.rollout_lines as r, reassembler.formats.night; print(r._can_fork())"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "True\n"


def _interrupted() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "dies, said",
    [
        (lambda: os._exit(3), "exit code 3: no output"),
        (_interrupted, "exit code 1: KeyboardInterrupt"),
    ],
)
def test_a_forked_child_that_dies_fails_the_load_and_says_how(tmp_path, odd_night, monkeypatch, dies, said):
    with connect(tmp_path / "out") as con:
        load_night(con, find_night(odd_night, DS))
        before = con.execute("SELECT * FROM rollouts ORDER BY ALL").fetchall()
    monkeypatch.setattr(rollout_lines, "_can_fork", lambda: True)
    monkeypatch.setattr(rollout_lines, "BACKGROUND_BYTES", 0)
    monkeypatch.setattr(rollout_lines, "_parse_to", lambda *a: dies())
    with connect(tmp_path / "out") as con:
        with pytest.raises(RuntimeError, match=f"rollout parser process ended with {said}"):
            load_night(con, find_night(odd_night, DS))
        assert con.execute("SELECT * FROM rollouts ORDER BY ALL").fetchall() == before


def test_closing_stops_a_forked_child_that_is_still_parsing(odd_night, monkeypatch):
    monkeypatch.setattr(rollout_lines, "_can_fork", lambda: True)
    monkeypatch.setattr(rollout_lines, "_parse_to", lambda *a: time.sleep(60))
    background = rollout_lines.InBackground(find_night(odd_night, DS), 4096)
    (child,) = background._children
    pid = child._proc.pid
    assert not background.done()
    started = time.monotonic()
    background.close()
    assert time.monotonic() - started < 10
    with pytest.raises(ChildProcessError):  # killed and reaped: no zombie left behind
        os.waitpid(pid, os.WNOHANG)


def test_the_command_forks_its_child_and_builds_the_same_rows(tmp_path, odd_night):
    """`reassembler build` as a user runs it, in a process of its own: the child is forked
    (counted), and the rows are those of a build that parses in this process."""
    here = tmp_path / "here"
    assert main(["build", "--input", str(odd_night), "--output", str(here), "--ds", DS]) == 0
    forked = tmp_path / "forked"
    script = (
        "import sys, reassembler.load.rollout_lines as r\n"
        "r.BACKGROUND_BYTES = 0\n"
        "made = []\n"
        "class Counted(r._Forked):\n"
        "    def __init__(self, *a):\n"
        "        made.append(1)\n"
        "        super().__init__(*a)\n"
        "r._Forked = Counted\n"
        "from reassembler.cli import entry\n"
        "rc = entry(sys.argv[1:])\n"
        "print('forked', len(made))\n"
        "sys.exit(rc)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, "build", "--input", str(odd_night), "--output", str(forked), "--ds", DS],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "forked 1"
    rows = [pq.read_table(out / "rows" / f"ds={DS}").to_pylist() for out in (here, forked)]
    assert rows[0] == rows[1] and len(rows[0]) == 3
