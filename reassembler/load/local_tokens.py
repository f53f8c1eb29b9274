"""A local-mode rollout's token lists as arrays, and each entry's full sequence F, a delta
prompt rebuilt from its parent's (CONTRACT.md 9.5), for local_capture.py and local_calls.py.

Every full sequence is hashed: a chain of n calls hashes about n/2 times its tokens; no
token is looked at in a Python loop. A rollout's token lists are converted together
(`Flat`): its entries' prompts and generations end to end as one int64 array and its
big-endian copy, with the mask and log probabilities of token rows laid out alike, so an
entry's own sequence, a chain of delta entries' F, and most token rows are slices of them.
A list that is not of its type (or an id beyond int64) sends the rollout to entry-by-entry
conversion, which names the first such line.
"""

from __future__ import annotations

import array
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from ..formats.gym_local import Entry, float_array, int_array
from ..reasons import Reason
from .entry_reader import EntryLines

TOKEN_LIMIT = 2**31


class Masked(Exception):
    """A rollout check that failed: its reason, detail, and the call it names."""

    def __init__(self, reason: Reason, detail: str, call_id: str | None = None):
        self.reason, self.detail, self.call_id = reason, detail, call_id


@dataclass
class Parsed:
    entry: Entry
    prompt: np.ndarray | None  # None: an id beyond int64
    generated: np.ndarray | None
    logprobs: np.ndarray
    flat: Flat | None = None  # the rollout's arrays these are views of, when read in one batch
    at: int = 0  # where its prompt starts in flat.ids


def converted(entry: Entry) -> Parsed:
    """The entry's token lists as arrays, each in one call; a list of the wrong type is a
    line Gym's validator refuses."""

    def ids(name: str, values: list) -> np.ndarray | None:
        try:
            return int_array(values)
        except OverflowError:
            return None  # an integer beyond int64: invalid_token, where its call is checked
        except TypeError:
            raise Masked(
                Reason.INVALID_RECORD, f"line {entry.line}: {name} is not a list of integers", entry.model_call_id
            ) from None

    prompt = ids("prompt_token_ids", entry.prompt)
    generated = ids("generation_token_ids", entry.generated)
    try:
        logprobs = float_array(entry.logprobs)
    except TypeError:
        raise Masked(
            Reason.INVALID_RECORD,
            f"line {entry.line}: generation_log_probs is not a list of numbers",
            entry.model_call_id,
        ) from None
    return Parsed(entry, prompt, generated, logprobs)


def first_list_problem(entries: list[Entry]) -> None:
    """Raise the first of these entries' token lists that is not a list of its type: a
    line's lists are checked before the lines after it (a rare path: one is failing)."""
    for entry in entries:
        if isinstance(entry.prompt, list):  # else arrays DuckDB read, of their type
            converted(entry)


class Flat:
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
    def of(cls, entries: list[Entry]) -> list[Parsed] | None:
        """The entries' token lists as views of one Flat; None when a list is not of its
        type or an id is beyond int64 (`converted`, entry by entry, then says which)."""
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
    def of_columns(cls, entries: list[Entry], columns: EntryLines) -> list[Parsed]:
        """The same, of entries whose lists are already arrays, views of `columns`' (all its
        lines' lists end to end: these when no line was a repeat left out)."""
        if len(entries) == len(columns.lines):
            return cls._views(entries, columns.ids, columns.logprobs)
        ids = np.concatenate([np.zeros(0, np.int64)] + [a for e in entries for a in (e.prompt, e.generated)])
        logprobs = np.concatenate([np.zeros(0, np.float64)] + [e.logprobs for e in entries])
        return cls._views(entries, ids, logprobs)

    @classmethod
    def _views(cls, entries: list[Entry], ids: np.ndarray, logprobs: np.ndarray) -> list[Parsed]:
        sizes = np.array([(len(e.prompt), len(e.generated)) for e in entries], dtype=np.int64).reshape(-1, 2)
        flat = cls(ids, logprobs, sizes)
        ends = np.cumsum(sizes.ravel()).tolist()
        lp_ends = np.cumsum(sizes[:, 1]).tolist()
        out, at, lp_at = [], 0, 0
        for k, entry in enumerate(entries):
            mid, end, lp_end = ends[2 * k], ends[2 * k + 1], lp_ends[k]
            out.append(Parsed(entry, flat.ids[at:mid], flat.ids[mid:end], flat.read_logprobs[lp_at:lp_end], flat, at))
            at, lp_at = end, lp_end
        return out


class Seq(NamedTuple):
    """A full sequence: its big-endian pieces end to end, and its length in tokens; `span`
    when it is one run of bytes of a rollout's flat buffer (flat, start, end), as a chain of
    delta entries written one after the other is: then it is hashed in one call."""

    pieces: list[memoryview]
    n: int
    span: tuple[Flat, int, int] | None = None

    def then(self, own: Seq) -> Seq:
        """This sequence followed by `own`."""
        if self.span is not None and own.span is not None:
            flat, start, end = self.span
            if own.span[0] is flat and own.span[1] == end:
                return Seq([flat.be[start : own.span[2]]], self.n + own.n, (flat, start, own.span[2]))
        return Seq(self.pieces + own.pieces, self.n + own.n)


class Sequences:
    """Each entry's full sequence F (its full prompt, then its generated ids) as big-endian
    pieces, a delta prompt rebuilt from its parent's (CONTRACT.md 9.5)."""

    def __init__(self, by_id: dict[str, Parsed]):
        self.by_id = by_id
        self._own: dict[str, Seq] = {}
        self._full: dict[str, Seq] = {}

    def full(self, p: Parsed) -> Seq:
        """F(p) in pieces; Masked (for `p`) when a delta prompt's parents cannot be followed."""
        known = self._full.get(p.entry.model_call_id)
        if known is not None:
            return known
        chain = [p]  # p, then the parents its delta prompt is rebuilt from, up to a known F
        while chain[-1].entry.prompt_is_delta and chain[-1].entry.model_call_id not in self._full:
            parent_id = chain[-1].entry.parent_call_id or ""
            parent = self.by_id.get(parent_id)
            if parent is None:
                raise Masked(
                    Reason.MISSING_PARENT,
                    f"delta prompt of {chain[-1].entry.model_call_id} on {parent_id}, which is not an entry",
                    p.entry.model_call_id,
                )
            if any(c is parent for c in chain):
                raise Masked(Reason.LINEAGE_CYCLE, f"delta prompts loop back to {parent_id}", p.entry.model_call_id)
            chain.append(parent)
        top = chain.pop()
        seq = self._full.get(top.entry.model_call_id)
        if seq is None:  # a full prompt: its own ids are its F
            seq = self._full[top.entry.model_call_id] = self.own(top)
        for q in reversed(chain):
            seq = seq.then(self.own(q))
            self._full[q.entry.model_call_id] = seq
        return seq

    def own(self, p: Parsed) -> Seq:
        cid = p.entry.model_call_id
        if cid not in self._own:
            if p.prompt is None or p.generated is None:
                raise Masked(Reason.INVALID_TOKEN, "a token id beyond 64 bits", cid)
            n = len(p.prompt) + len(p.generated)
            if p.flat is not None:  # a slice of the rollout's big-endian ids: its prompt, then its generation
                start, end = 8 * p.at, 8 * (p.at + n)
                self._own[cid] = Seq([p.flat.be[start:end]], n, (p.flat, start, end))
            else:
                self._own[cid] = Seq([a.astype(">u8").data.cast("B") for a in (p.prompt, p.generated)], n)
        return self._own[cid]


def full_ids(seq: Seq) -> np.ndarray:
    return np.frombuffer(b"".join(seq.pieces), dtype=">u8").astype(np.int64)
