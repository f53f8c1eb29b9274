"""NeMo Gym's own capture beside the staged ledger (CONTRACT.md 2.1, 9): which capture each
rollout is read from, its failed attempts, and the token rows the load derives.

The night's load (read.py) hands every rollout row to `GymCapture.rollout` before it is
inserted, then calls `finish` once the rollouts and the ledger are in:

- a **Gym-rebuilt** result line (9.10: NeMo Gym's marks, or token items while its capture's
  state file says retired) becomes one call per token item, with the tokens that item adds
  as its token row; the line's checks were made as it was parsed (formats/gym_rebuilt.py);
- Gym's **failures** files (`*_failures.jsonl`) name failed attempts, whose capture is not
  read and makes no reject row, and the samples Gym gave up on, which get a rollout row
  masked `rollout_failed`;
- every other rollout is read from its **ledger** rows (staged capture), from its
  **local-mode** files (load/local_capture.py) when it has no ledger row, or from neither
  (`mixed_capture` when it has both).

Derived token rows (local mode, rebuilt lines) go to Parquet files in the run's scratch
folder (load/derived_tokens.py; one more per child process that read local-mode captures,
load/capture_children.py), and their keys into token_rows: from there on the shards treat
them as any token row. Calls derived here are numbered after the
ledger's (CAPTURE_SEQ_BASE), each rollout's in its own capture order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from .. import storage
from ..errors import InputError
from ..formats.fields import LEDGER
from ..formats.gym_local import capture_file, parse_state, valid_key
from ..formats.night import NightFiles
from ..formats.records import RecordError, parse_failure
from .capture_children import CaptureChildren
from .derived_calls import REBUILT, DerivedChunk, rebuilt_calls, token_rows
from .derived_tokens import DerivedTokens
from .inserter import LEDGER_BATCH, Inserter, Sink
from .json_lines import DECODER, json_lines, reject
from .local_capture import CaptureFiles, LocalRollout, TokenRow, read_capture, read_captures

CAPTURE_SEQ_BASE = 1 << 40  # calls derived here come after every ledger line


@dataclass
class GymSummary:
    """What the load read of NeMo Gym's own capture, for the load's summary."""

    failures_read: int = 0
    failures_rejected: int = 0
    given_up: int = 0
    local_rollouts: int = 0
    local_entries: int = 0
    local_masked: int = 0
    rebuilt: int = 0
    mixed: int = 0
    not_read: list[str] = field(default_factory=list)  # capture keys of no rollout and no failed attempt

    def lines(self) -> list[str]:
        out = []
        if self.failures_read:
            out.append(
                f"{'failures':<9}{self.failures_read} read = {self.failures_read - self.failures_rejected} "
                f"failed attempts + {self.failures_rejected} rejected; {self.given_up} given-up samples "
                "(one audit row each, masked rollout_failed)"
            )
        if self.local_rollouts or self.rebuilt or self.mixed:
            out.append(
                f"{'gym':<9}{self.local_rollouts} rollouts from local-mode capture ({self.local_entries} entries; "
                f"{self.local_masked} masked by their capture checks), {self.rebuilt} Gym-rebuilt result lines"
                + (f", {self.mixed} with both ledger rows and local entries (mixed_capture)" if self.mixed else "")
            )
        if self.not_read:
            keys = ", ".join(self.not_read[:5]) + (", ..." if len(self.not_read) > 5 else "")
            out.append(
                f"{'not read':<9}{len(self.not_read)} local-mode captures of no rollout and no failed attempt: {keys}"
            )
        return out


class GymCapture:
    """A load part's share of NeMo Gym's own capture (load/part_load.py): the rebuilt result
    lines among its rollout rows (`rollout`), then its failures files and local-mode captures
    (`read`), into the part's tables. What needs the whole night (which rollout is read from
    which capture, given-up samples) is the merge's: `decide`."""

    def __init__(
        self,
        ledger: Sink,
        night: NightFiles,
        rejects: Inserter,
        scratch: str,
        max_line_bytes: int,
        readers: CaptureChildren | None = None,
        done: Callable[..., None] | None = None,
        every_capture: list[str] | None = None,
    ):
        self.night, self.rejects, self.max_line_bytes = night, rejects, max_line_bytes
        self._done = done or (lambda *locations: None)  # the load's progress: these files are read
        self.captures = capture_files(night.captures, rejects)  # this part's
        # every capture of the night, for a rebuilt line's state file (another part may hold it)
        self._every = self.captures if every_capture is None else capture_files(every_capture, None)
        self.rebuilt: set[str] = set()
        self.samples: list[dict] = []  # (rollout_id, task, sample) of the rows that carry one
        self.failures: list[dict] = []  # the failures files' rows, in reading order
        self.failures_read = 0
        self.failures_rejected = 0
        self.outcomes: list[dict] = []  # one per local-mode capture read
        self._scratch = scratch
        self._readers = readers
        self._tokens: DerivedTokens | None = None
        self.calls = Inserter(ledger, LEDGER_BATCH)  # the part's ledger table
        self._seq = CAPTURE_SEQ_BASE
        self.token_files: list[str] = []  # the derived token files (read)
        self.token_keys: list[pa.Table | None] = []  # their keys, file by file (DerivedTokens.keys)
        self._taken: list[str] = []  # rollouts whose carried calls are taken (`derived`)

    @property
    def tokens(self) -> DerivedTokens:
        if self._tokens is None:
            self._tokens = DerivedTokens(self._scratch)
        return self._tokens

    def _call(self, row: dict) -> None:
        self._seq += 1
        row["capture_seq"] = self._seq
        self.calls.add(row)

    def _retired(self, key: str) -> bool:
        files = self._every.get(key)
        if files is None or files.state is None:
            return False
        try:
            return parse_state(storage.read_bytes(self.night.path("ledger", files.state)))["retired"]
        except (OSError, ValueError):
            return False

    # -- rollout lines, as they are loaded

    def rollout(self, row: dict) -> dict:
        """Take a rollout row's NeMo Gym fields off (records.parse_rollout) before it is
        inserted. The calls a Gym-rebuilt line, an envelope line or a verifiers trace
        carries came in columns with the row's chunk (`carried_calls`): noted here as taken
        (a rebuilt line's only when its capture is read), written by `derived`."""
        rid = row["rollout_id"]
        sample = row.pop("gym_sample", None)
        if sample is not None:
            self.samples.append({"rollout_id": rid, "task": sample[0], "sample": sample[1]})
        trace = row.pop("verifiers", None) or row.pop("art", None)
        envelope = row.pop("gym_envelope", None)
        if trace is not None or envelope is not None:
            # a verifiers trace's rows' nodes (CONTRACT.md 10), an envelope line's calls (11)
            if envelope is not None:
                row.update(envelope)  # its capture columns (carried_calls)
            self._taken.append(rid)
            return row
        gym = row.pop("gym_rebuilt", None)
        if gym is None or not (gym["marked"] or self._retired(rid)):
            return row
        self.rebuilt.add(rid)
        row.update(
            capture=REBUILT,
            capture_reason=gym["reason"],
            capture_detail=gym["detail"],
            n_token_items=gym["n_items"],
        )
        self._taken.append(rid)
        return row

    def derived(self, chunk: DerivedChunk | None) -> None:
        """The derived calls of a chunk of rollout rows, once `rollout` has seen its rows:
        those of the rows taken, numbered in row and call order, and their token rows."""
        taken, self._taken = self._taken, []
        if chunk is None:
            return
        chunk = chunk.of(taken)
        n = chunk.calls.num_rows
        if not n:
            return
        seq = pa.array(range(self._seq + 1, self._seq + 1 + n), pa.int64())
        self._seq += n
        self.calls.add_table(chunk.calls.set_column(0, LEDGER[0].name, seq))
        self.tokens.add_table(chunk.tokens)

    # -- after the rollouts and the ledger

    def read(self) -> None:
        """The part's failures files (rows, kept for the merge), then every local-mode
        capture of the part but those of its own rebuilt lines: whether a rollout is read
        from it is the merge's to decide (`decide`), so a capture's read error is kept as
        its outcome and raised only if the rollout is."""
        self._read_failures()
        self._done(*(self.night.path("rollouts", rel) for rel in self.night.failures))
        local = [self.captures[key] for key in sorted(self.captures) if key not in self.rebuilt]
        folder = self.night.path("ledger", "")
        if self._readers is not None and local:  # child processes (capture_children.py)
            for files, outcome in zip(local, self._readers.read(folder, local, self._scratch), strict=True):
                self._local(files, outcome)
            self.token_files += self._readers.token_files
            self.token_keys += self._readers.token_keys
        else:
            for files, outcome in zip(local, read_captures(folder, local), strict=True):
                self._local(files, outcome)
        self._done(*(self.night.path("ledger", rel) for rel in self.night.captures))  # those read or not
        self.calls.flush()
        path = None if self._tokens is None else self._tokens.close()
        if path is not None and self._tokens is not None:
            self.token_files.insert(0, path)
            self.token_keys.insert(0, self._tokens.keys())

    def _local(self, files: CaptureFiles, local: LocalRollout | InputError) -> None:
        self._done(
            *(
                self.night.path("ledger", rel)
                for rel in (files.entries, files.intents, files.incomplete, files.state)
                if rel
            )
        )
        outcome: dict = {"rollout_id": files.key, "entries": files.entries}
        if isinstance(local, InputError):
            self.outcomes.append(dict(outcome, error=str(local)))
            return
        outcome.update(n_lines=local.n_lines)
        if local.reason is not None:
            outcome.update(
                capture_reason=local.reason.value, capture_detail=local.detail, capture_call_id=local.call_id
            )
        self.outcomes.append(outcome)
        for call in local.calls:
            self._call(call)
        for token_row in local.tokens:
            self.tokens.add(token_row)

    def _read_failures(self) -> None:
        for rel in self.night.failures:
            path = self.night.path("rollouts", rel)
            for line, raw, value in json_lines(path, rel, self.max_line_bytes, DECODER):
                self.failures_read += 1
                try:
                    if isinstance(value, RecordError):
                        raise value
                    row = parse_failure(value)
                except RecordError as e:
                    reject(self.rejects, "failures", rel, line, str(e), raw)
                    self.failures_rejected += 1
                    continue
                self.failures.append(dict(row, file=rel, line=line, line_order=len(self.failures)))


def capture_files(rels: list[str], rejects: Inserter | None) -> dict[str, CaptureFiles]:
    """The capture keys of these files with their files; a file of a key NeMo Gym would not
    write is a reject row (when `rejects` is given)."""
    out: dict[str, CaptureFiles] = {}
    for rel in rels:
        key, role = capture_file(rel) or ("", "")
        if not valid_key(key):
            if rejects is not None:
                reject(
                    rejects,
                    "capture",
                    rel,
                    0,
                    f"{key!r} is not a capture key NeMo Gym writes (letters, digits, ._-)",
                    b"",
                )
            continue
        setattr(out.setdefault(key, CaptureFiles(key)), role, rel)
    return out


# -- one rollout again, for `reassembler explain` (the derived file went with the staging folder)


def derive_again(night: NightFiles, rollout: dict) -> tuple[dict[str, TokenRow], list[str]]:
    """The token rows a local-mode, Gym-rebuilt, envelope or verifiers rollout's calls were derived
    with, read again from the night's files as they are now, by staging key; and the
    entries' (or the trace's nodes') walk."""
    rid = rollout["rollout_id"]
    if rollout.get("capture") == "envelope":
        from . import envelope_lines
        from .json_lines import ROLLOUT_DECODER, decode

        raw = _line(night.path("rollouts", rollout["source_file"]), rollout["source_line"])
        return envelope_lines.derive_again(decode(raw, ROLLOUT_DECODER), rid)
    if rollout.get("capture") == "art":
        from . import art_trajectories

        return art_trajectories.derive_again(night, rollout)
    if rollout.get("capture") == "verifiers":
        from . import verifiers_traces

        raw = _line(night.path("rollouts", rollout["source_file"]), rollout["source_line"])
        return verifiers_traces.derive_again(raw, rid)
    if rollout.get("capture") == "rebuilt":
        from ..formats.gym_rebuilt import rebuild
        from .json_lines import ROLLOUT_DECODER, decode

        raw = _line(night.path("rollouts", rollout["source_file"]), rollout["source_line"])
        built = rebuild(decode(raw, ROLLOUT_DECODER))
        return token_rows(rid, rebuilt_calls(built)), [
            f"Gym-rebuilt line {rollout['source_file']}:{rollout['source_line']}: {built.n_items} token items"
        ]
    files = CaptureFiles(rid)
    for rel in night.captures:
        key, role = capture_file(rel) or ("", "")
        if key == rid:
            setattr(files, role, rel)
    local = read_capture(night.path("ledger", ""), files)
    return {r.staging_key: r for r in local.tokens}, local.walk


def _line(path: str, number: int) -> bytes:
    with storage.open_input(path) as fh:
        for k, raw in enumerate(fh, start=1):
            if k == number:
                return raw
    return b""
