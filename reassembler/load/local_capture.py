"""NeMo Gym's local capture mode, read into the contract's calls (CONTRACT.md 9.2-9.6).

A local-mode rollout is one capture key R's files (formats/gym_local.py). `read_capture`
reads them whole, as Gym's own consumer does, and gives back either a rollout check that
failed (9.4: retired, incomplete, no entry, a line Gym's validator refuses, a repeated call
id, an entry that differs from Gym's index), or the rollout's calls as ledger rows plus one
token row per call: the call's new tokens after its parent's full sequence, with the mask
and log probabilities 9.6 derives (0 and 0.0 on the carried prompt, 1 and the generated log
probabilities on the generation).

Each call's own checks run here too, because only here are the full sequences at hand; the
first failing one is kept on its ledger row (`entry_fault`, `entry_detail`), and the shard
raises it where finalize checks that call (verify/checks.py), so a fault masks the rollout
only on a chain, and counts as an off-chain fault elsewhere. In this order:

    missing_parent / lineage_cycle   a resolved entry whose parent is not an entry of R
                                     (a delta prompt then cannot be rebuilt either)
    invalid_record                   cum_len or digest null
    length_mismatch                  cum_len != the length of the full sequence F
    parent_length_mismatch           the parent's cum_len is longer than the child's prompt
    prefix_mismatch                  a full prompt that does not start with the parent's F
    invalid_token                    an id outside [0, 2**31)
    empty_generation                 no generated token
    invalid_logprob                  a log probability null or not finite
    digest_mismatch                  the tokens digest of F differs from the entry's

(the per-token checks before the digest, as CONTRACT.md 3.3 orders them for staged calls).
Every full sequence is hashed: a chain of n calls hashes about n/2 times its tokens; no
token is looked at in a Python loop. A rollout's token lists are converted together
(`_Flat`): its entries' prompts and generations end to end as one int64 array and its
big-endian copy, with the mask and log probabilities of token rows laid out alike, so an
entry's own sequence, a chain of delta entries' F, and most token rows are slices of them.
A list that is not of its type (or an id beyond int64) sends the rollout to entry-by-entry
conversion, which names the first such line.
"""

from __future__ import annotations

import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import orjson
import pyarrow as pa

from .. import storage
from ..errors import InputError
from ..formats.gym_local import (
    Entry,
    LineProblem,
    entry_digest,
    float_array,
    int_array,
    parse_entry,
    parse_state,
    tokens_digest,
)
from ..formats.items import generated_items
from ..reasons import Reason
from .entry_reader import BATCH_BYTES, EntryLines, EntryReader

TOKEN_LIMIT = 2**31
UNRESOLVED = "unresolved_parent"  # the poison rows' failure_reason (CONTRACT.md 9.6)


@dataclass
class CaptureFiles:
    """One capture key's local-mode files: paths relative to the ledger partition."""

    key: str
    entries: str | None = None
    intents: str | None = None
    incomplete: str | None = None
    state: str | None = None


@dataclass
class TokenRow:
    staging_key: str
    ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray


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


class _Masked(Exception):
    def __init__(self, reason: Reason, detail: str, call_id: str | None = None):
        self.reason, self.detail, self.call_id = reason, detail, call_id


Fetched = dict[str, "bytes | OSError"]  # a capture's files read ahead (read_captures)


def _read(folder: str, rel: str | None, fetched: Fetched | None) -> bytes | None:
    if rel is None:
        return None
    got = None if fetched is None else fetched.get(rel)
    try:
        if got is None:
            return storage.read_bytes(storage.join(folder, rel))
        if isinstance(got, OSError):
            raise got
        return got
    except OSError as e:
        raise InputError(f"{rel}: cannot read ({e.strerror})") from e


def _id_lines(raw: bytes | None) -> list[str]:
    """The call ids of an intents or incomplete file: one a line ("" kept)."""
    if raw is None:
        return []
    lines = raw.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines


@dataclass
class _Parsed:
    entry: Entry
    prompt: np.ndarray | None  # None: an id beyond int64
    generated: np.ndarray | None
    logprobs: np.ndarray
    flat: _Flat | None = None  # the rollout's arrays these are views of, when read in one batch
    at: int = 0  # where its prompt starts in flat.ids


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
        stream = storage.read_many([storage.join(folder, rel) for rels in names for rel in rels])
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
        return storage.read_bytes(storage.join(folder, rel))
    except OSError as e:
        return e


def _read_batch(
    folder: str, batch: list[tuple[CaptureFiles, Fetched]], reader: EntryReader | None
) -> Iterator[LocalRollout | InputError]:
    contents = [fetched.get(files.entries or "") for files, fetched in batch]
    readable = [k for k, got in enumerate(contents) if isinstance(got, bytes) and got]
    texts = [got for got in contents if isinstance(got, bytes) and got]
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
        out.calls, out.tokens = _calls(files.key, files.entries or "", parsed, out.walk)
    except _Masked as m:
        out.reason, out.detail, out.call_id = m.reason, m.detail, m.call_id
        out.calls, out.tokens = [], []
    return out


def _rollout_checks(
    folder: str, files: CaptureFiles, out: LocalRollout, fetched: Fetched | None, columns: EntryLines | None
) -> list[_Parsed]:
    """CONTRACT.md 9.4 items 1-5 (item 6, strict's capture_poisoned, is the shard's)."""
    state = None
    raw_state = _read(folder, files.state, fetched)
    if raw_state is not None:
        try:
            state = parse_state(raw_state)
        except ValueError as e:
            raise _Masked(Reason.INVALID_RECORD, f"{files.state}: unreadable state file ({e})") from None
    if state is not None and state["retired"]:
        raise _Masked(Reason.CAPTURE_RETIRED, "the state file says retired: true and the result line has no tokens")
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
        raise _Masked(Reason.CAPTURE_INCOMPLETE, "torn_final_line")
    if lost:
        raise _Masked(Reason.CAPTURE_INCOMPLETE, "incomplete: " + ", ".join(repr(c) if not c else c for c in lost))
    if state is not None and state["incomplete"]:
        raise _Masked(Reason.CAPTURE_INCOMPLETE, "the state file says incomplete: true")
    if dangling:
        raise _Masked(Reason.CAPTURE_INCOMPLETE, "intents without an entry: " + ", ".join(dangling))
    if not lines:
        raise _Masked(Reason.EMPTY_LEDGER, f"no entry in {files.entries or files.key + '.tokens.jsonl'}")
    entries: list[Entry] = []
    kept: dict[str, bytes] = {}
    for number, raw, value in lines:  # each line's checks; its token lists are converted below
        if isinstance(value, Exception):
            _first_list_problem(entries)
            raise _Masked(Reason.INVALID_RECORD, f"line {number}: not valid JSON ({str(value).splitlines()[0]})")
        try:
            entry = parse_entry(value, raw, number, files.key)
        except LineProblem as e:
            _first_list_problem(entries)
            raise _Masked(e.reason, e.detail, e.call_id) from None
        cid = entry.model_call_id
        if cid in kept:
            if kept[cid] == raw.strip():
                continue  # Gym's append is idempotent: the same line twice is one entry
            _first_list_problem([*entries, entry])
            raise _Masked(Reason.DUPLICATE_CALL_ID, f"model_call_id {cid} on two different lines (line {number})")
        kept[cid] = raw.strip()
        entries.append(entry)
    parsed = (_Flat.of_columns(entries, columns) if columns is not None else _Flat.of(entries)) or [
        _converted(e) for e in entries
    ]
    if state is not None and state["indexed_size"] == len(data):
        stored = state["entry_digests"]
        for p in parsed:
            want = stored.get(p.entry.model_call_id)
            if want is None:
                continue
            got = entry_digest(p.entry.raw)
            if got != want:
                raise _Masked(Reason.DIGEST_MISMATCH, f"entry_digest {got} != {want}", p.entry.model_call_id)
    return parsed


def _converted(entry: Entry) -> _Parsed:
    """The entry's token lists as arrays, each in one call; a list of the wrong type is a
    line Gym's validator refuses."""

    def ids(name: str, values: list) -> np.ndarray | None:
        try:
            return int_array(values)
        except OverflowError:
            return None  # an integer beyond int64: invalid_token, where its call is checked
        except TypeError:
            raise _Masked(
                Reason.INVALID_RECORD, f"line {entry.line}: {name} is not a list of integers", entry.model_call_id
            ) from None

    prompt = ids("prompt_token_ids", entry.prompt)
    generated = ids("generation_token_ids", entry.generated)
    try:
        logprobs = float_array(entry.logprobs)
    except TypeError:
        raise _Masked(
            Reason.INVALID_RECORD,
            f"line {entry.line}: generation_log_probs is not a list of numbers",
            entry.model_call_id,
        ) from None
    return _Parsed(entry, prompt, generated, logprobs)


def _first_list_problem(entries: list[Entry]) -> None:
    """Raise the first of these entries' token lists that is not a list of its type: a
    line's lists are checked before the lines after it (a rare path: one is failing)."""
    for entry in entries:
        if isinstance(entry.prompt, list):  # else arrays DuckDB read, of their type
            _converted(entry)


class _Flat:
    """A rollout's token lists end to end, converted in a few calls for all its entries:
    each entry's prompt then its generated ids (`ids`, int64), the same ids big-endian as
    the digests hash them (`be`), and, laid out alike, the mask and log probabilities of a
    token row (0 and 0.0 on a prompt, 1 and the log probabilities on a generation): a token
    row whose carried tokens are the end of its own prompt is one slice of the three."""

    def __init__(self, ids: np.ndarray, logprobs: np.ndarray, sizes: np.ndarray):
        self.ids = ids
        self.be = ids.astype(">u8").data.cast("B")
        self.read_logprobs = logprobs  # float64, as read: the generations' end to end
        generated = np.repeat(np.tile(np.array([False, True]), len(sizes)), sizes.ravel())
        self.row_mask = generated.astype(np.float32)
        self.row_logprobs = np.zeros(len(ids), np.float32)
        self.row_logprobs[generated] = logprobs
        self.clean_ids = not len(ids) or bool(ids.min() >= 0 and ids.max() < TOKEN_LIMIT)
        self.clean_logprobs = bool(np.isfinite(logprobs).all())

    @classmethod
    def of(cls, entries: list[Entry]) -> list[_Parsed] | None:
        """The entries' token lists as views of one _Flat; None when a list is not of its
        type or an id is beyond int64 (`_converted`, entry by entry, then says which)."""
        ids = array.array("q")
        try:
            for entry in entries:
                ids.extend(entry.prompt)
                ids.extend(entry.generated)
            logprobs = pa.array([e.logprobs for e in entries], pa.list_(pa.float64()))
        except (TypeError, OverflowError, pa.ArrowException):
            return None
        return cls._views(
            entries, np.frombuffer(ids, dtype=np.int64), logprobs.flatten().to_numpy(zero_copy_only=False)
        )

    @classmethod
    def of_columns(cls, entries: list[Entry], columns: EntryLines) -> list[_Parsed]:
        """The same, of entries whose lists are already arrays, views of `columns`' (all its
        lines' lists end to end: these when no line was a repeat left out)."""
        if len(entries) == len(columns.lines):
            return cls._views(entries, columns.ids, columns.logprobs)
        ids = np.concatenate([np.zeros(0, np.int64)] + [a for e in entries for a in (e.prompt, e.generated)])
        logprobs = np.concatenate([np.zeros(0, np.float64)] + [e.logprobs for e in entries])
        return cls._views(entries, ids, logprobs)

    @classmethod
    def _views(cls, entries: list[Entry], ids: np.ndarray, logprobs: np.ndarray) -> list[_Parsed]:
        sizes = np.array([(len(e.prompt), len(e.generated)) for e in entries], dtype=np.int64).reshape(-1, 2)
        flat = cls(ids, logprobs, sizes)
        ends = np.cumsum(sizes.ravel()).tolist()
        lp_ends = np.cumsum(sizes[:, 1]).tolist()
        out, at, lp_at = [], 0, 0
        for k, entry in enumerate(entries):
            mid, end, lp_end = ends[2 * k], ends[2 * k + 1], lp_ends[k]
            out.append(_Parsed(entry, flat.ids[at:mid], flat.ids[mid:end], flat.read_logprobs[lp_at:lp_end], flat, at))
            at, lp_at = end, lp_end
        return out


class _Seq(NamedTuple):
    """A full sequence: its big-endian pieces end to end, and its length in tokens; `span`
    when it is one run of bytes of a rollout's flat buffer (flat, start, end), as a chain of
    delta entries written one after the other is: then it is hashed in one call."""

    pieces: list[memoryview]
    n: int
    span: tuple[_Flat, int, int] | None = None

    def then(self, own: _Seq) -> _Seq:
        """This sequence followed by `own`."""
        if self.span is not None and own.span is not None:
            flat, start, end = self.span
            if own.span[0] is flat and own.span[1] == end:
                return _Seq([flat.be[start : own.span[2]]], self.n + own.n, (flat, start, own.span[2]))
        return _Seq(self.pieces + own.pieces, self.n + own.n)


class _Sequences:
    """Each entry's full sequence F (its full prompt, then its generated ids) as big-endian
    pieces, a delta prompt rebuilt from its parent's (CONTRACT.md 9.5)."""

    def __init__(self, by_id: dict[str, _Parsed]):
        self.by_id = by_id
        self._own: dict[str, _Seq] = {}
        self._full: dict[str, _Seq] = {}

    def full(self, p: _Parsed) -> _Seq:
        """F(p) in pieces; _Masked (for `p`) when a delta prompt's parents cannot be followed."""
        known = self._full.get(p.entry.model_call_id)
        if known is not None:
            return known
        chain = [p]  # p, then the parents its delta prompt is rebuilt from, up to a known F
        while chain[-1].entry.prompt_is_delta and chain[-1].entry.model_call_id not in self._full:
            parent_id = chain[-1].entry.parent_call_id or ""
            parent = self.by_id.get(parent_id)
            if parent is None:
                raise _Masked(
                    Reason.MISSING_PARENT,
                    f"delta prompt of {chain[-1].entry.model_call_id} on {parent_id}, which is not an entry",
                    p.entry.model_call_id,
                )
            if any(c is parent for c in chain):
                raise _Masked(Reason.LINEAGE_CYCLE, f"delta prompts loop back to {parent_id}", p.entry.model_call_id)
            chain.append(parent)
        top = chain.pop()
        seq = self._full.get(top.entry.model_call_id)
        if seq is None:  # a full prompt: its own ids are its F
            seq = self._full[top.entry.model_call_id] = self.own(top)
        for q in reversed(chain):
            seq = seq.then(self.own(q))
            self._full[q.entry.model_call_id] = seq
        return seq

    def own(self, p: _Parsed) -> _Seq:
        cid = p.entry.model_call_id
        if cid not in self._own:
            if p.prompt is None or p.generated is None:
                raise _Masked(Reason.INVALID_TOKEN, "a token id beyond 64 bits", cid)
            n = len(p.prompt) + len(p.generated)
            if p.flat is not None:  # a slice of the rollout's big-endian ids: its prompt, then its generation
                start, end = 8 * p.at, 8 * (p.at + n)
                self._own[cid] = _Seq([p.flat.be[start:end]], n, (p.flat, start, end))
            else:
                self._own[cid] = _Seq([a.astype(">u8").data.cast("B") for a in (p.prompt, p.generated)], n)
        return self._own[cid]


def _ids(seq: _Seq) -> np.ndarray:
    return np.frombuffer(b"".join(seq.pieces), dtype=">u8").astype(np.int64)


def _calls(key: str, rel: str, parsed: list[_Parsed], walk: list[str]) -> tuple[list[dict], list[TokenRow]]:
    by_id = {p.entry.model_call_id: p for p in parsed}
    seqs = _Sequences(by_id)
    calls, tokens = [], []
    for p in parsed:
        e = p.entry
        poison = e.resolution == "unresolved"
        row: dict[str, Any] = {
            "rollout_id": key,
            "model_call_id": e.model_call_id,
            "parent_call_id": e.parent_call_id if e.resolution == "resolved" else None,
            "mode": None if poison else ("token_in" if e.resolution == "resolved" else "text"),
            "prev_len": None,
            "delta_len": None,
            "cum_len": e.cum_len,
            "weight_version": None,
            "schema_version": 1,
            "digest_version": 1,
            "extras_digest_version": None,
            "digest": e.digest,
            "extras_digest": None,
            "chain_hash": None,
            "cumulative_hash": None,
            "staging_key": f"{key}/{e.model_call_id}",
            "response_id": e.response_id,
            "admitted_at": None,
            "output_items": [{"id": i, "fingerprint": f} for i, f in generated_items(e.output_items)],
            "output_fingerprint": None,
            "fingerprint_version": None,
            "failure_reason": UNRESOLVED if poison else None,
            "source_file": rel,
            "source_line": e.line,
            "capture": "local",
            "entry_fault": None,
            "entry_detail": None,
        }
        calls.append(row)
        if poison:  # never a chain's call: no token row (a poison row, CONTRACT.md 3.6)
            walk.append(_describe(p, row))
            continue
        try:
            prev, token_row = _check(p, by_id, seqs, row["staging_key"])
            row["prev_len"] = prev
            tokens.append(token_row)
        except _Masked as m:
            row["entry_fault"], row["entry_detail"] = m.reason.value, m.detail
            tokens.append(_placeholder(row["staging_key"]))
        if row["prev_len"] is None:
            row["prev_len"] = 0 if e.resolution == "root" else _parent_cum_len(p, by_id)
        if e.cum_len is not None and row["prev_len"] is not None:
            row["delta_len"] = e.cum_len - row["prev_len"]
        walk.append(_describe(p, row))
    return calls, tokens


def _describe(p: _Parsed, row: dict) -> str:
    e = p.entry
    place = {"root": "root", "resolved": f"child of {e.parent_call_id}", "unresolved": "unresolved (a poison row)"}
    prompt = f"{'delta' if e.prompt_is_delta else 'full'} prompt of {len(e.prompt)} tokens"
    verdict = (
        f"{row['entry_fault']}: {row['entry_detail']}"
        if row["entry_fault"]
        else ("not checked (never on a chain)" if e.resolution == "unresolved" else "checks pass")
    )
    return (
        f"entry line {e.line} {e.model_call_id}: {place[e.resolution]}, {prompt}, {len(e.generated)} generated, "
        f"cum_len {e.cum_len}: {verdict}"
    )


def _parent_cum_len(p: _Parsed, by_id: dict[str, _Parsed]) -> int | None:
    parent = by_id.get(p.entry.parent_call_id or "")
    return None if parent is None else parent.entry.cum_len


def _placeholder(staging_key: str) -> TokenRow:
    """The token row of an entry whose checks failed: never part of a row."""
    return TokenRow(staging_key, np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32))


def _check(p: _Parsed, by_id: dict[str, _Parsed], seqs: _Sequences, staging_key: str) -> tuple[int, TokenRow]:
    """One entry's checks (the module docstring's order), and its token row: (prev_len, row)."""
    e = p.entry
    cid = e.model_call_id
    parent = None
    if e.resolution == "resolved":
        parent = by_id.get(e.parent_call_id or "")
        if parent is None:
            raise _Masked(Reason.MISSING_PARENT, f"parent {e.parent_call_id} is not an entry of the rollout", cid)
    full = seqs.full(p)  # a delta's parents: missing_parent, lineage_cycle
    if e.cum_len is None or e.digest is None:
        raise _Masked(
            Reason.INVALID_RECORD, f"line {e.line}: {'cum_len' if e.cum_len is None else 'digest'} is null", cid
        )
    n = full.n
    if e.cum_len != n:
        raise _Masked(Reason.LENGTH_MISMATCH, f"cum_len {e.cum_len} != {n} tokens in the full sequence", cid)
    assert p.prompt is not None and p.generated is not None  # seqs.full checked them
    prompt_len = n - len(p.generated)  # of the full prompt
    prev = 0
    if parent is not None:
        parent_full = seqs.full(parent)
        prev = parent.entry.cum_len if parent.entry.cum_len is not None else parent_full.n
        if prev > prompt_len:
            raise _Masked(
                Reason.PARENT_LENGTH_MISMATCH,
                f"parent {parent.entry.model_call_id} cum_len {prev} > this call's prompt of {prompt_len} tokens",
                cid,
            )
        if not e.prompt_is_delta:  # its own prompt, big-endian as hashed, against the parent's F
            if seqs.own(p).pieces[0][: 8 * prev] != b"".join(parent_full.pieces):
                raise _Masked(
                    Reason.PREFIX_MISMATCH,
                    f"the prompt does not start with parent {parent.entry.model_call_id}'s {prev} tokens",
                    cid,
                )
    for name, ids in (("prompt_token_ids", p.prompt), ("generation_token_ids", p.generated)):
        if (p.flat is None or not p.flat.clean_ids) and len(ids) and (ids.min() < 0 or ids.max() >= TOKEN_LIMIT):
            bad = np.flatnonzero((ids < 0) | (ids >= TOKEN_LIMIT))
            raise _Masked(Reason.INVALID_TOKEN, f"{name}[{bad[0]}] = {ids[bad[0]]}, outside [0, 2**31)", cid)
    if len(p.generated) == 0:
        raise _Masked(Reason.EMPTY_GENERATION, "generation_token_ids is empty", cid)
    clean = p.flat is not None and p.flat.clean_logprobs
    bad_lp = (
        np.zeros(0, np.int64) if clean or np.isfinite(p.logprobs.sum()) else np.flatnonzero(~np.isfinite(p.logprobs))
    )
    if len(bad_lp):
        value = p.logprobs[bad_lp[0]]
        shown = "null" if np.isnan(value) else value
        raise _Masked(Reason.INVALID_LOGPROB, f"generation_log_probs[{bad_lp[0]}] is {shown}", cid)
    recomputed = tokens_digest(full.pieces, n)
    if recomputed != e.digest:
        raise _Masked(Reason.DIGEST_MISMATCH, f"recomputed {recomputed[:16]}.. != entry {e.digest[:16]}..", cid)
    # the new tokens, from `start` in its own prompt, or F's after prev
    if not e.prompt_is_delta:
        start: int | None = prev  # F is its own prompt, then its generation
    elif parent is not None and prev == parent_full.n:
        start = 0  # a delta prompt on all of its parent's F
    else:
        start = None
    end = len(p.prompt) + len(p.generated)
    if p.flat is not None and start is not None:  # slices of the rollout's arrays
        a, b = p.at + start, p.at + end
        return prev, TokenRow(staging_key, p.flat.ids[a:b], p.flat.row_mask[a:b], p.flat.row_logprobs[a:b])
    if start is not None:
        ids = np.concatenate([p.prompt[start:], p.generated])
    else:
        ids = _ids(full)[prev:]
    carried = prompt_len - prev
    mask = np.concatenate([np.zeros(carried, np.float32), np.ones(len(p.generated), np.float32)])
    logprobs = np.concatenate([np.zeros(carried, np.float32), p.logprobs.astype(np.float32)])
    return prev, TokenRow(staging_key, ids, mask, logprobs)
