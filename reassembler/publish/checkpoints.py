"""Test-only pause and kill points, inert unless their environment variables are set.

`REASSEMBLER_TEST_KILL_AT=<step>` kills the process with SIGKILL at that step (a real kill,
for the crash tests of publish); `REASSEMBLER_TEST_PAUSE_AT=<step>` waits there while the
file named by `REASSEMBLER_TEST_PAUSE_FILE` exists (at most 120 s), so a test can run a
second build against a first one that holds the output.
"""

from __future__ import annotations

import os
import signal
import time


def checkpoint(step: str) -> None:
    if os.environ.get("REASSEMBLER_TEST_KILL_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("REASSEMBLER_TEST_PAUSE_AT") == step:
        flag = os.environ.get("REASSEMBLER_TEST_PAUSE_FILE", "")
        deadline = time.monotonic() + 120
        while flag and os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.05)
