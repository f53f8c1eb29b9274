"""A child process for tests/test_child_process.py: `_child()` runs the script its stdin
names, writing records as load/child_process.py's children do."""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path

from reassembler.load.child_process import FRAME, Records


def _child() -> None:
    work = json.loads(sys.stdin.read())
    records = Records()
    if work["script"] == "streams":  # its first record, then waits until the parent has it
        records.put("rows", [1])
        flag, deadline = Path(work["flag"]), time.monotonic() + 20
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        records.put("lines", "parent took the first record" if flag.exists() else "parent waited for the end")
    elif work["script"] == "half":  # a record written in two pieces, 0.3 s apart
        body = pickle.dumps(("rows", list(range(1000))))
        records.out.write(FRAME.pack(len(body)) + body[:100])
        records.out.flush()
        time.sleep(0.3)
        records.out.write(body[100:])
        records.out.flush()
        records.put("lines", 1)
    elif work["script"] == "pandas":  # what pyarrow does with a Python list here
        import pyarrow as pa

        table = pa.table({"ids": pa.array([1, 2, 3])})
        records.put("lines", {"rows": table.num_rows, "pandas": "pandas" in sys.modules})
    elif work["script"] == "dies":  # every record written, two lines on stderr, then a failed exit
        records.put("rows", [1])
        records.put("lines", 1)
        records.out.flush()
        sys.stderr.write("warming up\nMemoryError: the last thing it said\n\n")
        sys.stderr.flush()
        os._exit(3)
