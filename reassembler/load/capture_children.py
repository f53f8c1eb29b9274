"""Read a night's local-mode captures in child processes (NeMo Gym's local mode, CONTRACT.md 9).

Reading a local-mode rollout (load/local_capture.py: JSON lines, token lists to arrays, the
`nemo-gym-tokens` digest of every entry's full sequence) is Python holding the GIL, about
5 ms a rollout of the bench night, while the rest of the load waits for it. So a night with
at least CHILD_ROLLOUTS local-mode captures per core (two cores or more) is read by this
process and child processes beside it: one per further core (MAX_READERS readers in all),
each a new interpreter started as the night's load begins (load.NightLoad), so its imports
run beside the rollout parse. Each child then waits on its stdin for its share of the
rollouts, which the load knows only once the rollout lines and the ledger are in (`read`):
the captures in key order, cut in runs, the first this process's, a little longer than the
children's (CHILD_SHARE).

A child runs exactly `read_capture` over its rollouts, writes their token rows to a
derived-tokens file of its own in the run's folder (load/derived_tokens.py), and pickles
each rollout's outcome and ledger rows, without its token rows, in chunks
(child_process.py). `read` hands the outcomes over in key order, its own run (with token
rows) and then the children's, as one process would have read them; `token_files` names
the files the children wrote, `token_keys` their keys (as the children wrote them, never
read back). A child that cannot start leaves the night to this process; one that fails
re-raises its error here (an InputError stays an InputError, with the same message); one
killed fails the load, naming its exit code and the last line it wrote to stderr.
docs/performance.md has the figures.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..formats.gym_local import TOKENS_SUFFIX
from ..formats.night import NightFiles
from .child_process import ChildProcess, Records

if TYPE_CHECKING:  # imported when the reading begins: load.NightLoad starts children before numpy is loaded
    import pyarrow as pa

    from ..errors import InputError
    from .local_capture import CaptureFiles, LocalRollout

CHILD_ROLLOUTS = 64  # local-mode captures a core must have for the night to be read by children
MAX_READERS = 4  # this process and its children
CHUNK = 32  # rollouts a pickled chunk
# A child's share against this process's: a child also pickles what it read, which this
# process then unpickles and inserts after its own share (measured: docs/performance.md)
CHILD_SHARE = 0.85


def _cores() -> int:
    return os.cpu_count() or 1


class _Child:
    """One child process, started idle: its imports done, waiting on stdin for its work."""

    def __init__(self, number: int):
        self.number = number
        self._proc = ChildProcess(__name__, "local-mode capture reader")

    def give(self, folder: str, files: list[CaptureFiles], scratch: str) -> None:
        """Its share: the captures `files` of the ledger partition `folder`; token rows to
        a file of its own in `scratch`."""
        work = {
            "folder": folder,
            "files": [dataclasses.astuple(f) for f in files],  # CaptureFiles(*fields) again in the child
            "scratch": scratch,
            "name": f"derived-tokens-local-{self.number}.parquet",  # derived_tokens.NAME, then its own
        }
        self._proc.give(json.dumps(work).encode())

    def results(self) -> Iterator[LocalRollout | InputError | tuple[str, pa.Table | None] | None]:
        """The child's outcomes in order, as it writes them, and last (once it has ended well)
        the token file it wrote and its keys (None when it derived no token row)."""
        for kind, payload in self._proc.records(last="done"):
            if kind == "rollouts":
                yield from payload  # type: ignore[misc]
            else:  # "done": the last record, the token file
                yield payload  # type: ignore[misc]
                return

    def close(self) -> None:
        self._proc.close()


class CaptureChildren:
    """Child processes, started idle, that read, beside this process, the local-mode
    captures `read` gives them."""

    def __init__(self, count: int):
        self._children: list[_Child] = []
        try:
            for number in range(count):
                self._children.append(_Child(number))
        except BaseException:
            self.close()
            raise
        self.token_files: list[str] = []
        self.token_keys: list[pa.Table | None] = []  # per file of token_files, its keys (DerivedTokens.keys)

    def read(self, folder: str, files: list[CaptureFiles], scratch: str) -> Iterator[LocalRollout | InputError]:
        """The local-mode rollouts of `files` (in the ledger partition `folder`), in order:
        the first run read here, with its token rows; the children's without theirs, which
        are in `token_files` once all are read."""
        from ..errors import InputError
        from .local_capture import LocalRollout, read_captures

        weights = [1.0] + [CHILD_SHARE] * len(self._children)
        ends = [round(len(files) * w) for w in itertools.accumulate(w / sum(weights) for w in weights)][:-1]
        ends.append(len(files))
        shares = [files[a:b] for a, b in zip([0, *ends], ends)]
        for child, share in zip(self._children, shares[1:]):
            if share:
                child.give(folder, share, scratch)
        yield from read_captures(folder, shares[0], threads=1)  # a reader a core
        for child, share in zip(self._children, shares[1:]):
            if not share:
                continue
            outcomes = child.results()
            for _ in share:
                local = next(outcomes)
                assert isinstance(local, (LocalRollout, InputError))
                yield local
            written = next(outcomes)
            if written is not None:
                assert isinstance(written, tuple)
                path, keys = written
                self.token_files.append(path)
                self.token_keys.append(keys)

    def close(self) -> None:
        for child in self._children:
            child.close()


def start(night: NightFiles) -> CaptureChildren | None:
    """Idle child processes for the night's local-mode captures, if they are worth it: one
    per core beside this process's (MAX_READERS readers in all) when the night holds
    CHILD_ROLLOUTS capture files per reader; None otherwise, or when they cannot start (the
    load then reads them all itself)."""
    captures = sum(1 for rel in night.captures if rel.endswith(TOKENS_SUFFIX))
    readers = min(MAX_READERS, _cores(), captures // CHILD_ROLLOUTS)
    if readers < 2 or not sys.executable:
        return None
    try:
        return CaptureChildren(readers - 1)
    except OSError:
        return None


def _read(records: Records, work: dict) -> None:
    """The child's work: `read_capture` over its share, outcomes as records."""
    from .derived_tokens import DerivedTokens
    from .local_capture import CaptureFiles, LocalRollout, read_captures

    tokens = DerivedTokens(work["scratch"], work["name"])
    chunk: list[LocalRollout | InputError] = []
    for local in read_captures(work["folder"], [CaptureFiles(*fields) for fields in work["files"]], threads=1):
        if not isinstance(local, LocalRollout):  # a capture that cannot be read: its InputError, pickled
            chunk.append(local)
            continue
        for row in local.tokens:
            tokens.add(row)
        local.tokens, local.walk = [], []  # the walk is `reassembler explain`'s
        chunk.append(local)
        if len(chunk) >= CHUNK:
            records.put("rollouts", chunk)
            chunk = []
    if chunk:
        records.put("rollouts", chunk)
    path = tokens.close()
    records.put("done", None if path is None else (path, tokens.keys()))


def _child() -> None:
    from ..memory import step_memory
    from . import derived_tokens, local_capture  # noqa: F401 - imported while the load has no work for it yet

    work = json.loads(sys.stdin.buffer.read())
    records = Records()
    with step_memory():  # as the load step's
        records.run(lambda: _read(records, work))
