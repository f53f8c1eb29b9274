"""The `reassembler` command as an operator runs it: a subprocess, with its real exit code,
messages and kills."""

from __future__ import annotations

import os
import subprocess
import sys


def cli(*args, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reassembler.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def one_line_error(res: subprocess.CompletedProcess) -> str:
    """The error the command printed: one line, no traceback."""
    err = res.stderr.strip()
    assert "Traceback" not in res.stderr and "\n" not in err, res.stderr
    assert err.startswith("reassembler: error: "), err
    return err
