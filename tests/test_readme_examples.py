"""The README's command lines, run as written (optional parts left out, data/ under a test
folder) on the night `make run` writes (seed 7, 240 rollouts): each exits as the README's exit
table says, and the rollout the explain example names is in that night."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from commands import cli

README = Path(__file__).resolve().parents[1] / "README.md"


def commands() -> list[list[str]]:
    """The `reassembler ...` lines of the README's command-line block, synth first, each
    without its [optional] parts and trailing comments."""
    block = README.read_text().split("## The command line", 1)[1].split("```", 2)[1]
    out = []
    for line in block.splitlines():
        if not line.startswith("reassembler "):
            continue
        line = line.split("#", 1)[0]
        while re.search(r"\[[^\[\]]*\]", line):  # nested optional groups, innermost first
            line = re.sub(r"\[[^\[\]]*\]", "", line)
        out.append(shlex.split(line)[1:])
    return sorted(out, key=lambda args: args[0] != "synth")


@pytest.mark.timeout(900)
def test_the_readmes_commands_run_on_the_make_run_night(tmp_path):
    found = commands()
    assert [args[0] for args in found] == ["synth", "build", "explain", "report", "gate"]
    for args in found:
        args = [a.replace("data/", f"{tmp_path}/data/") for a in args]
        res = cli(*args, timeout=600)
        if args[0] == "gate":  # a night of faults may breach: exit 5 with one line saying which threshold
            assert res.returncode in (0, 5), res.stderr
            continue
        assert res.returncode == 0, (args, res.stderr)
        if args[0] == "explain":
            assert f"rollout {args[-1]} (group" in res.stdout and "result: " in res.stdout
