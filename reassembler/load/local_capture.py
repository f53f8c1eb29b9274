"""NeMo Gym's local capture mode, read into the contract's calls (CONTRACT.md 9.2-9.6).

A local-mode rollout is one capture key R's files (formats/gym_local.py). `read_capture`
reads them whole, as Gym's own consumer does, and gives back either a rollout check that
failed (9.4: retired, incomplete, no entry, a line Gym's validator refuses, a repeated call
id, an entry that differs from Gym's index), or the rollout's calls as ledger rows plus one
token row per call: the call's new tokens after its parent's full sequence, with the mask
and log probabilities 9.6 derives (0 and 0.0 on the carried prompt, 1 and the generated log
probabilities on the generation).

The checks of each call are local_calls.py's; the token lists as arrays and the full
sequences they rebuild are local_tokens.py's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson

from .. import storage
from ..errors import InputError
from ..formats.gym_local import Entry, LineProblem, entry_digest, parse_entry, parse_state
from ..reasons import Reason
from .derived_calls import TokenRow
from .entry_reader import BATCH_BYTES, EntryLines, EntryReader
from .local_calls import UNRESOLVED, calls_of
from .local_tokens import TOKEN_LIMIT, Flat, Masked, Parsed, converted, first_list_problem

__all__ = ["TOKEN_LIMIT", "UNRESOLVED", "CaptureFiles", "LocalRollout", "TokenRow", "read_capture", "read_captures"]


@dataclass
class CaptureFiles:
    """One capture key's local-mode files: paths relative to the ledger partition."""

    key: str
    entries: str | None = None
    intents: str | None = None
    incomplete: str | None = None
    state: str | None = None


@dataclass
class LocalRollout:
    """What the load keeps of one local-mode rollout: the rollout check that failed, or its
    calls (ledger rows, capture order) and their token rows."""

    reason: Reason | None = None
    detail: str | None = None
    call_id: str | None = None
    calls: list[dict] = field(default_factory=list)
    tokens: list[TokenRow] = field(default_factory=list)
    n_lines: int = 0  # entry lines read (blank lines not counted)
    walk: list[str] = field(default_factory=list)  # each entry as read and checked (`reassembler explain`)


Fetched = dict[str, "bytes | OSError"]  # a capture's files read ahead (read_captures)

# A rollout's capture files are read whole, each line's token lists converted at once: what
# bounds the load's memory (README, choices). Past these the rollout is invalid_record, the
# file (or line) not parsed: 48 MiB of entries is ~6M ids (a 64 MiB file peaked at 0.93 GB); a line of 32 MiB ~4M.
MAX_FILE_BYTES = 48 << 20  # a capture file (entries, state, intents, incomplete); at most this is read
MAX_LINE_BYTES = 32 << 20  # an entries line


def _read(folder: str, rel: str | None, fetched: Fetched | None) -> bytes | None:
    if rel is None:
        return None
    got = None if fetched is None else fetched.get(rel)
    try:
        if got is None:
            got = storage.read_bytes(storage.join(folder, rel), MAX_FILE_BYTES)
        if isinstance(got, OSError):
            raise got
    except OSError as e:
        raise InputError(f"{rel}: cannot read ({e.strerror})") from e
    if len(got) > MAX_FILE_BYTES:
        raise Masked(
            Reason.INVALID_RECORD, f"{rel}: more than the {MAX_FILE_BYTES:,} bytes a capture file may hold; not read"
        )
    return got


def _id_lines(raw: bytes | None) -> list[str]:
    """The call ids of an intents or incomplete file: one a line ("" kept)."""
    if raw is None:
        return []
    lines = raw.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines


def read_captures(
    folder: str, captures: list[CaptureFiles], threads: int | None = None
) -> Iterator[LocalRollout | InputError]:
    """`read_capture` of each, in order (`threads`: DuckDB's, of its JSON reader; every
    core when not given); a capture whose files cannot be read is given as
    its InputError (whether that fails the night is the caller's: the rollout may not be
    read from it). The entries files are read in batches of about BATCH_BYTES, their token
    lists parsed by DuckDB in one query a batch (load/entry_reader.py; a file it cannot
    judge exactly is read line by line). On object storage the captures' files are fetched
    ahead on threads (storage.read_many, bounded in bytes): four small files a rollout would
    otherwise wait one round trip each."""
    if storage.is_remote(folder):
        names = [[rel for rel in (f.state, f.entries, f.incomplete, f.intents) if rel is not None] for f in captures]
        stream = storage.read_many([storage.join(folder, rel) for rels in names for rel in rels], limit=MAX_FILE_BYTES)
        fetches: Iterator[Fetched] = ({rel: next(stream)[1] for rel in rels} for rels in names)
    else:
        fetches = ({} if f.entries is None else {f.entries: _fetch(folder, f.entries)} for f in captures)
    reader: EntryReader | None = None
    try:
        batch: list[tuple[CaptureFiles, Fetched]] = []
        size = 0
        for files, fetched in zip(captures, fetches):
            got = fetched.get(files.entries or "")
            batch.append((files, fetched))
            size += len(got) if isinstance(got, bytes) else 0
            if size >= BATCH_BYTES:
                reader = reader or EntryReader(threads)
                yield from _read_batch(folder, batch, reader)
                batch, size = [], 0
        if batch:
            if size:
                reader = reader or EntryReader(threads)
            yield from _read_batch(folder, batch, reader)
    finally:
        if reader is not None:
            reader.close()


def _fetch(folder: str, rel: str) -> bytes | OSError:
    try:
        return storage.read_bytes(storage.join(folder, rel), MAX_FILE_BYTES)
    except OSError as e:
        return e


def _read_batch(
    folder: str, batch: list[tuple[CaptureFiles, Fetched]], reader: EntryReader | None
) -> Iterator[LocalRollout | InputError]:
    contents = [fetched.get(files.entries or "") for files, fetched in batch]
    # a file past the limit is read by nobody: its rollout is masked (read_capture)
    usable = [(k, got) for k, got in enumerate(contents) if isinstance(got, bytes) and 0 < len(got) <= MAX_FILE_BYTES]
    readable, texts = [k for k, _ in usable], [got for _, got in usable]
    # a local file DuckDB reads itself (a complete night's files do not change under the load)
    paths: list[str | None] | None = None
    if not storage.is_remote(folder):
        paths = [storage.join(folder, batch[k][0].entries or "") for k in readable]
    read = reader.read(texts, paths) if reader is not None and readable else []
    columns: dict[int, EntryLines | None] = dict(zip(readable, read))
    for k, (files, fetched) in enumerate(batch):
        try:
            yield read_capture(folder, files, fetched, columns.get(k))
        except InputError as e:
            yield e


def read_capture(
    folder: str, files: CaptureFiles, fetched: Fetched | None = None, columns: EntryLines | None = None
) -> LocalRollout:
    """The local-mode rollout of `files` (in the ledger partition `folder`); `fetched`:
    its files' contents, when read ahead; `columns`: its entries file's lines as DuckDB's
    JSON reader read them (load/entry_reader.py), else it is read line by line."""
    out = LocalRollout()
    try:
        parsed = _rollout_checks(folder, files, out, fetched, columns)
        out.calls, out.tokens = calls_of(files.key, files.entries or "", parsed, out.walk)
    except Masked as m:
        out.reason, out.detail, out.call_id = m.reason, m.detail, m.call_id
        out.calls, out.tokens = [], []
    return out


def _rollout_checks(
    folder: str, files: CaptureFiles, out: LocalRollout, fetched: Fetched | None, columns: EntryLines | None
) -> list[Parsed]:
    """CONTRACT.md 9.4 items 1-5 (item 6, strict's capture_poisoned, is the shard's)."""
    state = None
    raw_state = _read(folder, files.state, fetched)
    if raw_state is not None:
        try:
            state = parse_state(raw_state)
        except ValueError as e:
            raise Masked(Reason.INVALID_RECORD, f"{files.state}: unreadable state file ({e})") from None
    if state is not None and state["retired"]:
        raise Masked(Reason.CAPTURE_RETIRED, "the state file says retired: true and the result line has no tokens")
    data = _read(folder, files.entries, fetched) or b""
    lines: list[tuple[int, bytes, object]] = []  # (line number, bytes, decoded or the error)
    torn = False
    if columns is not None:  # each line decoded, its lists already arrays (load/entry_reader.py)
        lines = columns.lines  # type: ignore[assignment]
    else:
        raw_lines = data.split(b"\n")
        for k, raw in enumerate(raw_lines):
            if not raw.strip():
                continue
            if len(raw) > MAX_LINE_BYTES:
                raise Masked(
                    Reason.INVALID_RECORD,
                    f"line {k + 1} of {files.entries}: {len(raw):,} bytes, over the {MAX_LINE_BYTES:,} an entry line "
                    "may hold; not parsed",
                )
            try:
                value: object = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                if not b"\n".join(raw_lines[k + 1 :]).strip():
                    torn = True  # Gym's torn append: never acknowledged (9.3)
                    break
                value = e
            lines.append((k + 1, raw, value))
    out.n_lines = len(lines) + torn
    seen_ids = {
        v["model_call_id"] for _, _, v in lines if isinstance(v, dict) and isinstance(v.get("model_call_id"), str)
    }
    lost = _id_lines(_read(folder, files.incomplete, fetched))
    dangling = [
        cid for cid in dict.fromkeys(_id_lines(_read(folder, files.intents, fetched))) if cid and cid not in seen_ids
    ]
    if torn:
        raise Masked(Reason.CAPTURE_INCOMPLETE, "torn_final_line")
    if lost:
        raise Masked(Reason.CAPTURE_INCOMPLETE, "incomplete: " + ", ".join(repr(c) if not c else c for c in lost))
    if state is not None and state["incomplete"]:
        raise Masked(Reason.CAPTURE_INCOMPLETE, "the state file says incomplete: true")
    if dangling:
        raise Masked(Reason.CAPTURE_INCOMPLETE, "intents without an entry: " + ", ".join(dangling))
    if not lines:
        raise Masked(Reason.EMPTY_LEDGER, f"no entry in {files.entries or files.key + '.tokens.jsonl'}")
    entries: list[Entry] = []
    kept: dict[str, bytes] = {}
    for number, raw, value in lines:  # each line's checks; its token lists are converted below
        if isinstance(value, Exception):
            first_list_problem(entries)
            raise Masked(Reason.INVALID_RECORD, f"line {number}: not valid JSON ({str(value).splitlines()[0]})")
        try:
            entry = parse_entry(value, raw, number, files.key)
        except LineProblem as e:
            first_list_problem(entries)
            raise Masked(e.reason, e.detail, e.call_id) from None
        cid = entry.model_call_id
        if cid in kept:
            if kept[cid] == raw.strip():
                continue  # Gym's append is idempotent: the same line twice is one entry
            first_list_problem([*entries, entry])
            raise Masked(Reason.DUPLICATE_CALL_ID, f"model_call_id {cid} on two different lines (line {number})")
        kept[cid] = raw.strip()
        entries.append(entry)
    parsed = (Flat.of_columns(entries, columns) if columns is not None else Flat.of(entries)) or [
        converted(e) for e in entries
    ]
    if state is not None and state["indexed_size"] == len(data):
        stored = state["entry_digests"]
        for p in parsed:
            want = stored.get(p.entry.model_call_id)
            if want is None:
                continue
            got = entry_digest(p.entry.raw)
            if got != want:
                raise Masked(Reason.DIGEST_MISMATCH, f"entry_digest {got} != {want}", p.entry.model_call_id)
    return parsed
