"""Progress a person can see (reassembler/progress.py): in a log, a line every 10 s of work
and one at the end, done out of the total and a rate; on a terminal, `reassembler build`
draws bars; piped, it draws none. The load's total is the night's input bytes, a shard's
its plan's tokens, and each reaches exactly 100%."""

from __future__ import annotations

import logging
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commands import cli
from conftest import Clock
from nights import DS
from reassembler import progress


@pytest.fixture
def clock(monkeypatch):
    clock = Clock(1000.0)
    monkeypatch.setattr(progress, "_clock", clock)
    monkeypatch.setattr(progress, "_bars", False)
    return clock


def test_a_log_line_every_ten_seconds_of_work_and_one_at_the_end(clock, caplog):
    caplog.set_level(logging.INFO, "reassembler.progress")
    with progress.Progress("load", 476_000_000) as p:
        for _ in range(25):  # 25 s, 10 MB a second
            clock.now += 1
            p.advance(10_000_000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "load: 100.0 MB of 476.0 MB (21%), 10.0 MB/s",
        "load: 200.0 MB of 476.0 MB (42%), 10.0 MB/s",
        "load: 250.0 MB of 476.0 MB (53%), 10.0 MB/s (done in 25.0 s)",
    ]


def test_tokens_and_work_past_the_total(clock, caplog):
    caplog.set_level(logging.INFO, "reassembler.progress")
    p = progress.Progress("shard 3", 6_800_000, progress.TOKENS)
    clock.now += 2
    p.advance(7_000_000)
    p.advance(0)
    p.advance(-5)  # nothing done: not counted
    p.close()
    assert [r.getMessage() for r in caplog.records] == [
        "shard 3: 7.0M of 6.8M tokens (100%), 3.5M tokens/s (done in 2.0 s)"
    ]


def test_a_step_that_fails_says_nothing_at_its_end(clock, caplog):
    caplog.set_level(logging.INFO, "reassembler.progress")
    with pytest.raises(RuntimeError), progress.Progress("load", 10) as p:
        p.advance(5)
        raise RuntimeError("boom")
    assert caplog.records == []


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    res = cli("synth", "--output", root / "input", "--ds", DS, "--rollouts", 40, "--seed", "2")
    assert res.returncode == 0, res.stderr
    return root


def _input_bytes(inp: Path) -> int:
    return sum(p.stat().st_size for p in inp.rglob("*") if p.is_file() and f"ds={DS}" in p.parts)


def test_the_load_and_each_shard_reach_their_totals_in_the_log(night, tmp_path):
    res = cli("-v", "build", "--input", night / "input", "--output", tmp_path / "out", "--ds", DS, "--shards", "2")
    assert res.returncode == 0, res.stderr
    [load] = re.findall(r"INFO (load: .*)", res.stderr)
    total = _input_bytes(night / "input")
    assert re.fullmatch(r"load: ([\d.]+) MB of \1 MB \(100%\), [\d.]+ MB/s \(done in [\d.]+ s\)", load), load
    assert float(load.split()[1]) == round(total / 1e6, 1)
    shards = re.findall(r"INFO (shard \d: .* tokens \(100%\).*)", res.stderr)
    assert [s.split(":")[0] for s in shards] == ["shard 0", "shard 1"], res.stderr
    assert "━" not in res.stderr  # not a terminal: no bar


def test_piped_the_build_draws_no_bar_and_prints_what_it_printed(night, tmp_path):
    res = cli("build", "--input", night / "input", "--output", tmp_path / "out", "--ds", DS)
    assert res.returncode == 0 and res.stderr == "", res.stderr


def _on_a_terminal(argv: list[str]) -> str:
    """What a person at a shell sees: stderr (and stdout) a pseudo-terminal."""
    main, other = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=other, stderr=other, env=env)
    os.close(other)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=120) == 0
    os.close(main)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode("utf-8", "replace"))


def test_on_a_terminal_the_build_draws_bars_for_the_load_and_the_shards(night, tmp_path):
    argv = [sys.executable, "-m", "reassembler.cli", "build", "--input", str(night / "input")]
    argv += ["--output", str(tmp_path / "out"), "--ds", DS, "--shards", "2"]
    text = _on_a_terminal(argv)
    assert "━" in text and "100%" in text
    assert re.search(r"load\s+━+\s+100%", text) and re.search(r"shard 1\s+━+\s+100%", text), text[-2000:]
    assert "built ds=2026-11-28" in text


def test_with_workers_the_parent_draws_a_bar_for_every_load_part_and_shard(night, tmp_path):
    argv = [sys.executable, "-m", "reassembler.cli", "build", "--input", str(night / "input")]
    argv += ["--output", str(tmp_path / "out"), "--ds", DS, "--shards", "3", "--load-parts", "2", "--workers", "2"]
    text = _on_a_terminal(argv)
    for what in ("load part 0", "load part 1", "shard 0", "shard 1", "shard 2"):
        assert re.search(rf"{what}\s+━+\s+100%", text), (what, text[-3000:])
    assert "built ds=2026-11-28" in text


def test_amounts_change_unit_exactly_at_its_size():
    assert (
        progress._amount(1e6, progress.BYTES) == "1.0 MB" and progress._amount(999_999, progress.BYTES) == "1000.0 KB"
    )
    assert progress._amount(1e3, progress.TOKENS) == "1.0k" and progress._amount(999, progress.TOKENS) == "999"
