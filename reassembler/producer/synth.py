"""`reassembler synth`: a realistic synthetic night, with faults and the expected outcomes.

Each rollout is an agent episode of 5 to 40 accepted calls: a root call with a long prompt,
then tool turns (a function_call item, its function_call_output observation carried as the
next call's mask-0 tokens), ending with an assistant message. Some rollouts compact their
context (a summarizer call left off-chain, then a new root); some calls are retried (the
rejected attempt stays off-chain); some rollouts carry a poison row.

Each group is written in one of seven producer shapes (SHAPES):

- `plain`: the contract's own layout (rollout_id/group_id/slot, per-item `output_items`,
  shared ledger files);
- `lineage`: one `<rollout_id>.lineage.jsonl` per rollout in a server subfolder, rows
  without rollout_id, `staging_digest`, opaque staging keys, `response.output`, still with
  `output_items`;
- `gym`: exactly what NeMo Gym 0.7.0 writes: result lines with `_ng_task_index` /
  `_ng_rollout_index` and no ids, the flat capture folder (`<task>-<sample>.lineage.jsonl`
  beside its `.tokens.lock`, now and then a local-mode `.tokens.jsonl` that is no ledger
  file), rows without version fields or `output_items` but with `output_fingerprint`,
  poison rows `{model_call_id, failure_reason}`, the terminal declared by `response.id`,
  tool-call arguments re-serialised by the harness; token rows in their own files, half of
  them without version columns;
- `local`: NeMo Gym's local capture mode (CONTRACT.md 9): Gym's result lines, and per
  rollout `R.tokens.jsonl` with its intents, state and lock files in the flat capture
  folder, no ledger or token row; full prompts or delta prompts (`local_delta`);
- `rebuilt`: result lines NeMo Gym rebuilt itself (9.10): the last chain's tokens in
  `response.output`, `_ng_token_capture`, the capture retired (a state tombstone);
- `verifiers`: PrimeIntellect verifiers' Episode lines in `traces.jsonl` (10): each call an
  observation node and a sampled node, each compaction a summary attempt that the next
  root accepts (every other one after an attempt it does not), no ledger or token row;
- `envelope`: result lines NeMo Gym's compaction agent writes (11): every call's tokens in
  `response.output`, its evidence digest, a boundary event at each compaction.

Token files of the other shapes cycle through every accepted column type.

`--fault-rate` picks that share of rollouts and injects one fault each, cycling through
FAULTS (the next kind the rollout's shape can carry: SHAPE_FAULTS) so that every reason
code appears. The expected outcome of every rollout under the
default options, under `--offchain strict` and (where the generator can tell) under
`--mode terminal` is written to `<output>/_expected/ds=<ds>/outcomes.jsonl`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ..formats.fields import VERSION_DEFAULTS
from ..formats.gym_local import tokens_digest
from ..reasons import Reason as R
from .capture import (
    TOKEN_FILE_VARIANTS,
    CapturedCall,
    TokenFileTypes,
    as_gym_lineage_row,
    resign,
    stage_rollout,
    write_token_file,
)
from .config import SynthConfig
from .gym_envelope import FAULTS as ENVELOPE_FAULTS
from .gym_envelope import Envelope, EnvelopeCall, envelope_record
from .gym_envelope import inject as inject_envelope
from .gym_local import local_entries, rebuilt_output, write_local_capture
from .verifiers import FAULTS as VERIFIERS_FAULTS
from .verifiers import call_nodes, episode, episode_line, inject, trace

SHAPES = ("plain", "lineage", "gym", "local", "rebuilt", "verifiers", "envelope")
GYM_SHAPES = ("gym", "local", "rebuilt", "envelope")  # result lines as NeMo Gym writes them

# fault kind -> (reason under select mode, reason under terminal mode or None = not predicted,
#                needs a rollout without compaction)
FAULTS: dict[str, tuple[R | None, R | None, bool]] = {
    "rollout_failed": (R.ROLLOUT_FAILED, R.ROLLOUT_FAILED, False),
    "invalid_reward": (R.INVALID_REWARD, R.INVALID_REWARD, False),
    "empty_ledger": (R.EMPTY_LEDGER, R.EMPTY_LEDGER, False),
    "duplicate_call_id": (R.DUPLICATE_CALL_ID, R.DUPLICATE_CALL_ID, False),
    "unmatched_output": (R.UNMATCHED_OUTPUT, None, False),
    "ambiguous_output": (R.AMBIGUOUS_OUTPUT, None, True),
    "empty_selection": (R.EMPTY_SELECTION, None, False),
    "swapped_capture": (R.OUT_OF_CAPTURE_ORDER, R.ORDER_MISMATCH, True),
    "terminal_not_last": (R.TERMINAL_NOT_LAST, None, False),
    "missing_terminal": (R.TERMINAL_NOT_LAST, R.MISSING_TERMINAL, False),
    "missing_root": (R.MISSING_ROOT, None, False),
    "broken_chain": (R.BROKEN_CHAIN, None, False),
    "missing_tokens": (R.MISSING_TOKENS, None, False),
    "duplicate_tokens": (R.DUPLICATE_TOKENS, None, False),
    "unsupported_version": (R.UNSUPPORTED_VERSION, None, False),
    "field_mismatch": (R.FIELD_MISMATCH, None, False),
    "invalid_record": (R.INVALID_RECORD, None, False),
    "length_mismatch": (R.LENGTH_MISMATCH, None, False),
    "parent_length_mismatch": (R.PARENT_LENGTH_MISMATCH, None, False),
    "invalid_token": (R.INVALID_TOKEN, None, False),
    "invalid_mask": (R.INVALID_MASK, None, False),
    "empty_generation": (R.EMPTY_GENERATION, None, False),
    "invalid_logprob": (R.INVALID_LOGPROB, None, False),
    "digest_mismatch": (R.DIGEST_MISMATCH, None, False),
    "chain_hash_mismatch": (R.CHAIN_HASH_MISMATCH, None, False),
    "cumulative_hash_mismatch": (R.CUMULATIVE_HASH_MISMATCH, None, False),
    "dangling_parent": (None, R.MISSING_PARENT, True),
    "lineage_cycle": (None, R.LINEAGE_CYCLE, True),
    "poisoned": (None, None, True),  # ok under selected; capture_poisoned under strict
    # NeMo Gym's own capture (CONTRACT.md 9)
    "mixed_capture": (R.MIXED_CAPTURE, R.MIXED_CAPTURE, False),
    "capture_incomplete": (R.CAPTURE_INCOMPLETE, R.CAPTURE_INCOMPLETE, False),
    "capture_retired": (R.CAPTURE_RETIRED, R.CAPTURE_RETIRED, False),
    "prefix_mismatch": (R.PREFIX_MISMATCH, None, False),
    "producer_masked": (R.PRODUCER_MASKED, R.PRODUCER_MASKED, False),
}
_STAGED_ONLY = {"mixed_capture", "capture_incomplete", "capture_retired", "prefix_mismatch", "producer_masked"}
_STAGED = [f for f in FAULTS if f not in _STAGED_ONLY]
# the faults each shape can carry: local mode has no token rows, staged digests or chain
# hashes; a rebuilt line has only its token items
SHAPE_FAULTS: dict[str, set[str]] = {
    "plain": set(_STAGED),
    "lineage": set(_STAGED),
    "gym": set(_STAGED) | {"mixed_capture"},
    "local": set(_STAGED)
    - {
        "missing_tokens",
        "duplicate_tokens",
        "invalid_mask",
        "chain_hash_mismatch",
        "cumulative_hash_mismatch",
        "dangling_parent",
        "lineage_cycle",
    }
    | {"capture_incomplete", "capture_retired", "prefix_mismatch"},
    "verifiers": set(VERIFIERS_FAULTS),
    "envelope": set(ENVELOPE_FAULTS),
    "rebuilt": {
        "rollout_failed",
        "invalid_reward",
        "producer_masked",
        "missing_tokens",
        "invalid_record",
        "length_mismatch",
        "invalid_token",
        "empty_generation",
        "invalid_logprob",
        "prefix_mismatch",
    },
}
# local mode checks these as Gym's reader checks a line: the whole rollout, in either mode
LOCAL_ROLLOUT_CHECKS = {"duplicate_call_id", "unsupported_version", "field_mismatch", "invalid_record"}


@dataclass
class _Rollout:
    rid: str
    calls: list[CapturedCall] = field(default_factory=list)  # capture order
    accepted: list[CapturedCall] = field(default_factory=list)
    output: list[dict] = field(default_factory=list)
    has_poison: bool = False


class _Gen:
    def __init__(self, cfg: SynthConfig):
        self.cfg, self.rng = cfg, np.random.default_rng(cfg.seed)

    def tokens(self, span: tuple[int, int]) -> np.ndarray:
        n = int(self.rng.integers(span[0], span[1] + 1))
        return (self.rng.zipf(1.2, n) - 1) % self.cfg.vocab

    def call(self, rid, cid, parent, prompt_span, final: bool, wv: int, tag: str = "") -> CapturedCall:
        prompt = self.tokens(prompt_span)
        gen = self.tokens(self.cfg.generated_tokens)
        ids = np.concatenate([prompt, gen])
        mask = np.concatenate([np.zeros(len(prompt), np.float32), np.ones(len(gen), np.float32)])
        lp = np.concatenate(
            [np.zeros(len(prompt), np.float32), -self.rng.exponential(0.7, len(gen)).astype(np.float32)]
        )
        n = int(self.rng.integers(1, 10**9))
        items = [
            {
                "type": "reasoning",
                "id": f"rs_{rid}_{cid}",
                "summary": [{"type": "summary_text", "text": f"thinking {tag}{n}"}],
            }
        ]
        if final:
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "id": f"msg_{rid}_{cid}",
                    "content": [{"type": "output_text", "text": f"answer {tag}{n}"}],
                }
            )
        else:
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{rid}_{cid}",
                    "call_id": f"call_{cid}",
                    "name": "search",
                    "arguments": json.dumps({"q": f"query {tag}{n}"}),
                }
            )
        return CapturedCall(cid, parent, ids, mask, lp, items, wv)

    def rollout(self, rid: str, fault: str | None) -> _Rollout:
        cfg, rng = self.cfg, self.rng
        out = _Rollout(rid)
        n = int(rng.integers(cfg.min_calls, cfg.max_calls + 1))
        no_compaction = fault is not None and FAULTS[fault][2]
        compactions = set()
        if not no_compaction and n >= 4 and rng.random() < cfg.compaction_rate:
            compactions = (
                set(rng.choice(np.arange(2, n - 1), size=min(2, n - 3), replace=False).tolist())
                if rng.random() < 0.3
                else {int(rng.integers(2, n - 1))}
            )
        wv = int(rng.integers(3, 6))
        twin_at = int(rng.integers(1, n)) if fault == "ambiguous_output" else None
        poison_at = (
            int(rng.integers(1, n))
            if fault == "poisoned" or (fault is None and rng.random() < cfg.poison_rate)
            else None
        )
        out.output.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "task"}]})
        prev: CapturedCall | None = None
        for i in range(n):
            cid = f"call-{i:03d}"
            final = i == n - 1
            parent = prev.call_id if prev is not None else None
            if i in compactions:  # summarizer (off-chain), then a new root with the summary
                out.calls.append(self.call(rid, f"sum-{i:03d}", parent, (20, 60), True, wv, "summary "))
                call = self.call(rid, cid, None, cfg.prompt_tokens, final, wv)
            elif i == 0:
                call = self.call(rid, cid, None, cfg.prompt_tokens, final, wv)
            else:
                call = self.call(rid, cid, parent, cfg.observation_tokens, final, wv)
                if rng.random() < cfg.retry_rate:  # a rejected attempt, captured first
                    out.calls.append(
                        self.call(rid, f"{cid}-try", parent, cfg.observation_tokens, final, wv, "rejected ")
                    )
                if i == twin_at:  # the same items produced twice by siblings
                    twin = self.call(rid, f"{cid}-twin", parent, cfg.observation_tokens, final, wv)
                    twin.items = [dict(it) for it in call.items]
                    out.calls.append(twin)
            if i == poison_at:
                out.calls.append(CapturedCall(f"{cid}-lost", parent, [], [], [], [], wv, poison="capture timed out"))
                out.has_poison = True
            out.calls.append(call)
            out.accepted.append(call)
            out.output.extend(call.items)
            if not final:
                out.output.append(
                    {
                        "type": "function_call_output",
                        "call_id": f"call_{cid}",
                        "output": f"result {i}",
                        "status": "completed",
                    }
                )
            prev = call
        return out


def _bogus_hash(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


class _Injector:
    """One fault applied to a staged rollout (its ledger and token rows, and its record), in
    place: one small method per fault kind of FAULTS, named after it."""

    def __init__(self, ro: _Rollout, record: dict, staged: list, rng):
        self.ro, self.record, self.staged, self.rng = ro, record, staged, rng
        self.acc_ids = [c.call_id for c in ro.accepted]
        self.pos = {l["model_call_id"]: k for k, (l, _) in enumerate(staged)}
        self.children = [k for k, c in enumerate(ro.accepted) if c.parent is not None]

    def apply(self, fault: str) -> None:
        getattr(self, fault)()

    def _pick(self, indices=None) -> tuple[dict, dict]:
        """The ledger and token rows of an accepted call, chosen at random among `indices`."""
        k = int(self.rng.choice(indices if indices is not None else range(len(self.acc_ids))))
        return self.staged[self.pos[self.acc_ids[k]]]

    def _drop_call_from_output(self, k: int) -> None:
        drop = {it["id"] for it in self.ro.accepted[k].items} | {f"call_{self.acc_ids[k]}"}
        self.record["output"] = [
            it for it in self.record["output"] if it.get("id") not in drop and it.get("call_id") not in drop
        ]

    # rollout checks
    def rollout_failed(self):  # a failure with no measured reward (a diagnosis beside one trains: 3.0 item 1)
        self.record["failure_reason"] = "environment crashed"
        self.record["reward"] = None

    def invalid_reward(self):
        self.record["reward"] = float("nan")

    def empty_ledger(self):
        self.staged.clear()

    def duplicate_call_id(self):
        ledger, _ = self._pick()
        self.staged.append((dict(ledger), None))

    # select and cut
    def unmatched_output(self):  # the harness edited a tool call: no call produced it
        out = self.record["output"]
        k = int(self.rng.choice([j for j, it in enumerate(out) if it["type"] == "function_call"]))
        out[k] = dict(out[k], arguments=json.dumps({"q": "edited"}))

    def empty_selection(self):
        self.record["output"] = [it for it in self.record["output"] if it["type"] == "function_call_output"] or [
            {"type": "message", "role": "user", "content": []}
        ]

    def swapped_capture(self):
        k = int(self.rng.integers(1, len(self.acc_ids) - 2))
        a, b = self.pos[self.acc_ids[k]], self.pos[self.acc_ids[k + 1]]
        self.staged[a], self.staged[b] = self.staged[b], self.staged[a]

    def terminal_not_last(self):
        self.record["terminal_model_call_id"] = self.acc_ids[-2]

    def missing_terminal(self):
        self.record["terminal_model_call_id"] = "call-that-never-was"

    def missing_root(self):
        self._drop_call_from_output(0)

    def broken_chain(self):
        accepted = self.ro.accepted
        k = int(self.rng.choice([j for j in range(1, len(accepted) - 1) if accepted[j + 1].parent is not None]))
        self._drop_call_from_output(k)

    # record checks
    def missing_tokens(self):
        ledger, _ = self._pick()
        self.staged[self.pos[ledger["model_call_id"]]] = (ledger, None)

    def duplicate_tokens(self):
        _, token = self._pick()
        self.staged.append((None, dict(token)))

    def unsupported_version(self):
        ledger, token = self._pick()
        ledger["schema_version"] = token["schema_version"] = 9

    def field_mismatch(self):
        _, token = self._pick()
        token["weight_version"] += 1

    def invalid_record(self):
        ledger, token = self._pick(self.children)
        ledger["mode"] = token["mode"] = "text"

    def length_mismatch(self):
        ledger, token = self._pick()
        ledger["cum_len"] += 1
        token["cum_len"] += 1

    def parent_length_mismatch(self):
        for side in self._pick(self.children):
            side["prev_len"] += 1
            side["cum_len"] += 1

    def invalid_token(self):
        self._token_values("invalid_token")

    def invalid_mask(self):
        self._token_values("invalid_mask")

    def empty_generation(self):
        self._token_values("empty_generation")

    def invalid_logprob(self):
        self._token_values("invalid_logprob")

    def digest_mismatch(self):
        self._token_values("digest_mismatch")

    def _token_values(self, fault: str):
        """Change one token list value of an accepted call, leaving its digest as it was."""
        _, token = self._pick()
        for name in ("token_ids_delta", "token_mask_delta", "generation_logprobs_delta"):
            token[name] = np.array(token[name], copy=True)
        ids, mask, lp = token["token_ids_delta"], token["token_mask_delta"], token["generation_logprobs_delta"]
        if fault == "invalid_token":
            ids[int(self.rng.integers(len(ids)))] = -5
        elif fault == "invalid_mask":
            mask[-1], lp[-1] = 0.0, 0.0
        elif fault == "empty_generation":
            mask[:], lp[:] = 0.0, 0.0
        elif fault == "invalid_logprob":
            lp[-1] = np.nan
        else:  # digest_mismatch
            ids[-1] = (ids[-1] + 1) % 1000

    def chain_hash_mismatch(self):
        resign(*self._pick(), chain_hash=_bogus_hash(self.ro.rid + "chain"))

    def cumulative_hash_mismatch(self):
        resign(*self._pick([len(self.acc_ids) - 1]), cumulative_hash=_bogus_hash(self.ro.rid + "cumulative"))

    # made while generating or staging the rollout, nothing left to change here: the twin call
    # (ambiguous_output) and the poison row (poisoned) by _Gen.rollout, the late calls
    # (dangling_parent, lineage_cycle) by synth_night
    def ambiguous_output(self):
        pass

    def dangling_parent(self):
        pass

    def lineage_cycle(self):
        pass

    def poisoned(self):
        pass

    def mixed_capture(self):  # written beside the ledger by synth_night
        pass


assert all(callable(getattr(_Injector, f, None)) for f in SHAPE_FAULTS["gym"]), "every staged fault needs an injector"


class _Writer:
    """Streams the night's files: rollouts, ledger (plain and Gym-style), token Parquet."""

    def __init__(self, root: Path, ds: str, cfg: SynthConfig):
        self.cfg, self.ds = cfg, ds
        self.part = {k: root / k / f"ds={ds}" for k in ("rollouts", "ledger", "tokens")}
        for kind in ("rollouts", "ledger"):  # the tokens folder once a night has ledger files (close)
            self.part[kind].mkdir(parents=True, exist_ok=True)
        self.expected_dir = root / "_expected" / f"ds={ds}"
        self.expected_dir.mkdir(parents=True, exist_ok=True)
        self.rollouts = open(self.part["rollouts"] / "rollouts-00000.jsonl", "w")
        self.expected = open(self.expected_dir / "outcomes.jsonl", "w")
        self.plain_ledger: TextIO | None = None
        self.plain_count = 0
        self.plain_files = 0
        self.token_rows: list[dict] = []
        self.gym_token_rows: list[dict] = []
        self.token_files = 0
        self.gym_token_files = 0
        self.gym_files = 0
        self._traces: TextIO | None = None

    def traces(self) -> TextIO:
        """verifiers' traces.jsonl in the rollouts partition (CONTRACT.md 10)."""
        if self._traces is None:
            self._traces = open(self.part["rollouts"] / "traces.jsonl", "w")
        return self._traces

    def ledger_lines(self, rid: str, lines: list[dict], shape: str) -> None:
        if shape == "gym":  # Gym's flat capture folder: lineage file, lock file, maybe local tokens
            if not lines:
                return
            folder = self.part["ledger"]
            with open(folder / f"{rid}.lineage.jsonl", "w") as fh:
                for line in lines:
                    fh.write(json.dumps(line, sort_keys=True) + "\n")
            (folder / f"{rid}.tokens.lock").touch()
            self.gym_files += 1
            if self.gym_files % 10 == 1:  # a local-mode companion beside ledger rows: ignored (CONTRACT.md 2)
                (folder / f"{rid}.tokens.intents").write_text("call-000\n")
            return
        if shape == "lineage":
            server = f"policy-server-{int(hashlib.md5(rid.encode()).hexdigest(), 16) % 3}"
            path = self.part["ledger"] / server / f"{rid}.lineage.jsonl"
            path.parent.mkdir(exist_ok=True)
            with open(path, "w") as fh:
                for line in lines:
                    fh.write(json.dumps(line) + "\n")
            return
        if self.plain_ledger is None or self.plain_count >= self.cfg.rollouts_per_ledger_file:
            if self.plain_ledger:
                self.plain_ledger.close()
            self.plain_ledger = open(self.part["ledger"] / f"ledger-{self.plain_files:05d}.jsonl", "w")
            self.plain_files += 1
            self.plain_count = 0
        self.plain_count += 1
        for line in lines:
            self.plain_ledger.write(json.dumps(line) + "\n")

    def tokens(self, rows: list[dict], shape: str) -> None:
        if shape == "gym":
            self.gym_token_rows.extend(rows)
            if len(self.gym_token_rows) >= self.cfg.token_rows_per_file:
                self.flush_gym_tokens()
            return
        self.token_rows.extend(rows)
        if len(self.token_rows) >= self.cfg.token_rows_per_file:
            self.flush_tokens()

    def flush_tokens(self) -> None:
        if self.token_rows:
            variant = TOKEN_FILE_VARIANTS[self.token_files % len(TOKEN_FILE_VARIANTS)]
            write_token_file(self.part["tokens"] / f"tokens-{self.token_files:05d}.parquet", self.token_rows, variant)
            self.token_files += 1
            self.token_rows = []

    def flush_gym_tokens(self) -> None:
        """Gym's StagedCallRecords, as a framework token store dumps them; every other file
        leaves out the version columns (Gym's defaults 2/2/1 apply)."""
        if self.gym_token_rows:
            rows, k = self.gym_token_rows, self.gym_token_files
            versions = k % 2 == 1 or any(r[v] != d for r in rows for v, d in VERSION_DEFAULTS.items())
            write_token_file(
                self.part["tokens"] / f"gym-staged-{k:05d}.parquet", rows, TokenFileTypes(version_columns=versions)
            )
            self.gym_token_files += 1
            self.gym_token_rows = []

    def close(self) -> None:
        self.flush_tokens()
        self.flush_gym_tokens()
        if any(f.suffix == ".jsonl" and not f.name.endswith(".tokens.jsonl") for f in self.part["ledger"].rglob("*")):
            self.part["tokens"].mkdir(parents=True, exist_ok=True)  # staged capture: its token store, maybe empty
        for fh in (self.rollouts, self.expected, self.plain_ledger, self._traces):
            if fh:
                fh.close()


def _as_gym_result(
    record: dict, task: int, sample: int, ro: _Rollout, declared: bool, fault: str | None, reserialise: bool = True
) -> dict:
    """A rollout record as NeMo Gym's rollout_collection writes it: no ids, `_ng_*` indices,
    the terminal declared by `response.id` (a response id no call served when it is not),
    and (`reserialise`) tool-call arguments re-serialised by the harness (compact JSON)."""
    gym = {k: v for k, v in record.items() if k not in ("rollout_id", "group_id", "slot", "terminal_model_call_id")}
    gym.update(_ng_task_index=task, _ng_rollout_index=sample)
    if fault in ("terminal_not_last", "missing_terminal"):
        if fault == "missing_terminal":  # an explicit declaration naming no call
            gym["terminal_model_call_id"] = record["terminal_model_call_id"]
        else:  # the harness scored the call before the last
            gym["response"]["id"] = f"resp_{ro.accepted[-2].call_id}"
    elif declared:
        gym["response"]["id"] = f"resp_{ro.accepted[-1].call_id}"
    if reserialise:
        gym["response"]["output"] = [
            dict(it, arguments=json.dumps(json.loads(it["arguments"]), separators=(",", ":")))
            if it.get("type") == "function_call"
            else it
            for it in gym["response"]["output"]
        ]
    return gym


def _expect(status_reason: R | None, n_segments: int) -> dict:
    if status_reason is None:
        return {"status": "ok", "reason": None, "n_segments": n_segments}
    return {"status": "masked", "reason": status_reason.value, "n_segments": 0}


def synth_night(output: str | Path, ds: str, cfg: SynthConfig = SynthConfig()) -> dict:
    """Write one synthetic night under `output`; return counts."""
    gen = _Gen(cfg)
    writer = _Writer(Path(output), ds, cfg)
    staged_kinds = SHAPE_FAULTS["plain"]
    cycles = {
        s: [f for f in FAULTS if f in kinds and f not in staged_kinds]
        + [f for f in FAULTS if f in kinds and f in staged_kinds]
        for s, kinds in SHAPE_FAULTS.items()
    }
    fault_count = dict.fromkeys(SHAPE_FAULTS, 0)
    n_faulty = int(round(cfg.rollouts * cfg.fault_rate))
    faulty = set(gen.rng.choice(cfg.rollouts, size=n_faulty, replace=False).tolist()) if n_faulty else set()
    totals: dict[str, Any] = {"rollouts": cfg.rollouts, "calls": 0, "tokens": 0, "faults": {}}
    shape = SHAPES[0]
    for index in range(cfg.rollouts):
        group, slot = divmod(index, cfg.group_size)
        if slot == 0:  # a group is written in one shape: Gym derives group ids from its task index
            shape = SHAPES[int(gen.rng.choice(len(SHAPES), p=np.asarray(cfg.shape_shares) / sum(cfg.shape_shares)))]
            shape = cfg.only_shape or shape
        gym = shape == "gym"
        rid = f"{group}-{slot}" if shape in GYM_SHAPES else f"grp{group:05d}_g{slot}"
        fault = None
        if index in faulty:  # each shape cycles through its own kinds, the ones only it has first
            cycle = cycles[shape]
            fault = cycle[fault_count[shape] % len(cycle)]
            fault_count[shape] += 1
            totals["faults"][fault] = totals["faults"].get(fault, 0) + 1
        ro = gen.rollout(rid, fault)
        if shape == "verifiers":
            _verifiers_trace(writer, gen, ro, fault, group, totals)
            continue
        if shape == "envelope":
            _envelope_line(writer, gen, ro, fault, group, slot, totals)
            continue
        if shape in ("local", "rebuilt"):
            _gym_own_capture(writer, gen, cfg, ro, shape, fault, group, slot, totals)
            continue
        if shape == "lineage":
            key = lambda r, c: hashlib.sha1(f"{r}/{c}".encode()).hexdigest()  # noqa: E731
        else:
            key = lambda r, c: f"{r}/{c}"  # noqa: E731
        stage = partial(
            stage_rollout,
            schema_version=3 if shape == "lineage" else 2,
            staging_key=key,
            evidence="fingerprint" if gym else "items",
        )
        staged = stage(rid, ro.calls)
        record = {
            "rollout_id": rid,
            "group_id": f"grp{group:05d}",
            "slot": slot,
            "reward": float(np.round(gen.rng.random(), 3)),
            "output": [dict(i) for i in ro.output],
            "metadata": {"agent": "synth-swe", "env": "synthetic", "fault": fault},
        }
        declared = fault not in ("dangling_parent", "lineage_cycle") and gen.rng.random() < 0.5
        if declared and not gym:
            record["terminal_model_call_id"] = ro.accepted[-1].call_id
        if fault == "dangling_parent" or fault == "lineage_cycle":
            extra = [
                gen.call(rid, "late-a", ro.accepted[-1].call_id, cfg.observation_tokens, True, 1, "late "),
                gen.call(rid, "late-b", ro.accepted[-1].call_id, cfg.observation_tokens, True, 1, "late "),
            ]
            extra_staged = stage(rid, ro.calls + extra)[-2:]
            (late_a, late_a_tokens), (late_b, late_b_tokens) = extra_staged
            assert late_a_tokens is not None and late_b_tokens is not None  # captured calls
            if fault == "dangling_parent":
                extra_staged = extra_staged[:1]
                resign(late_a, late_a_tokens, parent_call_id="call-never-captured")
            else:
                resign(late_a, late_a_tokens, parent_call_id="late-b")
                resign(late_b, late_b_tokens, parent_call_id="late-a")
            staged.extend(extra_staged)
        if fault is not None:
            _Injector(ro, record, staged, gen.rng).apply(fault)

        n_roots_accepted = sum(c.parent is None for c in ro.accepted)
        select_reason, terminal_reason, _ = FAULTS[fault] if fault else (None, None, False)
        ledger_lines = [l for l, _ in staged if l is not None]
        if fault is None or fault == "poisoned":
            roots = sum(l["parent_call_id"] is None and l["failure_reason"] is None for l in ledger_lines)
            terminal_reason = R.HISTORY_REWRITTEN if roots > 1 else None
            terminal = _expect(terminal_reason, 1)
        elif (
            fault in ("dangling_parent", "lineage_cycle", "swapped_capture", "missing_terminal")
            or FAULTS[fault][1] == select_reason
        ):
            terminal = _expect(terminal_reason, 1)
        else:
            terminal = None
        expected = {
            "rollout_id": rid,
            "shape": shape,
            "fault": fault,
            "select": _expect(select_reason, n_roots_accepted),
            "strict": _expect(R.CAPTURE_POISONED if ro.has_poison else select_reason, n_roots_accepted),
            "terminal": terminal,
        }
        if shape != "plain":
            record["response"] = {"id": f"resp_{rid}", "object": "response", "output": record.pop("output")}
        if shape == "lineage":
            for line in ledger_lines:
                del line["rollout_id"]
                if "digest" in line:
                    line["staging_digest"] = line["digest"]
                    line["digest"] = _bogus_hash(line["model_call_id"] + "response-digest")
        if gym:
            record = _as_gym_result(record, group, slot, ro, declared, fault)
            ledger_lines = [as_gym_lineage_row(line) for line in ledger_lines]
        writer.rollouts.write(json.dumps(record) + "\n")
        writer.expected.write(json.dumps(expected) + "\n")
        writer.ledger_lines(rid, ledger_lines, shape)
        if fault == "mixed_capture":  # a local-mode entries file beside the lineage file
            (writer.part["ledger"] / f"{rid}.tokens.jsonl").write_text('{"prompt_token_ids": [1, 2]}\n')
        token_rows = [t for _, t in staged if t is not None]
        writer.tokens(token_rows, shape)
        totals["calls"] += len(ledger_lines)
        totals["tokens"] += int(sum(len(t["token_ids_delta"]) for t in token_rows))
    writer.close()
    totals["token_files"] = writer.token_files + writer.gym_token_files
    return totals


class _LocalInjector:
    """One fault applied to a local-mode rollout: its entries (dicts, capture order), the
    arguments of its other files (`files`) and its record; record-level faults as staged."""

    def __init__(self, ro: _Rollout, record: dict, entries: list[dict], files: dict, rng):
        self.ro, self.record, self.entries, self.files, self.rng = ro, record, entries, files, rng
        self.by_id = {e["model_call_id"]: e for e in entries}
        self.accepted = [self.by_id[c.call_id] for c in ro.accepted]
        self.children = [e for e in self.accepted if e["parent_resolution"] == "resolved"]

    def apply(self, fault: str) -> None:
        method = getattr(self, fault, None)
        if method is None:  # the rollout record's faults, as for staged capture
            _Injector(self.ro, self.record, [], self.rng).apply(fault)
        else:
            method()

    def _pick(self, among: list[dict]) -> dict:
        return among[int(self.rng.integers(len(among)))]

    @staticmethod
    def _resign(e: dict) -> None:
        """The entry's cum_len and digest for its arrays as they now are (a full prompt)."""
        full = e["prompt_token_ids"] + e["generation_token_ids"]
        e["cum_len"] = len(full)
        e["digest"] = tokens_digest([np.asarray(full, dtype=">u8").tobytes()], len(full))

    def _full_prompt(self, e: dict) -> list[int]:
        """The entry's full prompt (a delta prompt rebuilt from its parents)."""
        if not e["prompt_is_delta"]:
            return list(e["prompt_token_ids"])
        parent = self.by_id[e["parent_call_id"]]
        return self._full_prompt(parent) + parent["generation_token_ids"] + e["prompt_token_ids"]

    def empty_ledger(self):
        self.entries.clear()
        self.files["absent"] = True

    def duplicate_call_id(self):
        self.entries.append(dict(self._pick(self.accepted), created_at=0.5))

    def swapped_capture(self):
        k = int(self.rng.integers(1, len(self.accepted) - 2))
        a, b = self.entries.index(self.accepted[k]), self.entries.index(self.accepted[k + 1])
        self.entries[a], self.entries[b] = self.entries[b], self.entries[a]

    def unsupported_version(self):
        self._pick(self.accepted)["schema_version"] = 2

    def field_mismatch(self):
        self._pick(self.accepted)["rollout_id"] = "someone-else"

    def invalid_record(self):
        self._pick(self.children)["parent_resolution"] = "root"

    def length_mismatch(self):
        self._pick(self.accepted)["cum_len"] += 1

    def parent_length_mismatch(self):
        e = self._pick(self.children)
        parent = self.by_id[e["parent_call_id"]]
        e["prompt_token_ids"] = self._full_prompt(e)[: parent["cum_len"] - 1]
        e["prompt_is_delta"] = False
        self._resign(e)

    def prefix_mismatch(self):
        e = self._pick(self.children)
        prompt = self._full_prompt(e)
        prompt[0] = (prompt[0] + 1) % 1000
        e["prompt_token_ids"], e["prompt_is_delta"] = prompt, False
        self._resign(e)

    def invalid_token(self):
        self._pick(self.accepted)["generation_token_ids"][-1] = -5

    def empty_generation(self):
        e = self.accepted[-1]  # the leaf: no call continues it
        e["cum_len"] -= len(e["generation_token_ids"])
        e["generation_token_ids"], e["generation_log_probs"] = [], []

    def invalid_logprob(self):
        self._pick(self.accepted)["generation_log_probs"][-1] = None

    def digest_mismatch(self):
        ids = self._pick(self.accepted)["generation_token_ids"]
        ids[-1] = (ids[-1] + 1) % 1000

    def capture_incomplete(self):
        if self.rng.random() < 0.5:
            self.files["intents"] = [e["model_call_id"] for e in self.entries] + ["call-lost"]
        else:
            self.files["incomplete"] = ["call-lost"]

    def capture_retired(self):
        self.files["state"] = {"retired": True}

    def ambiguous_output(self):  # made by _Gen.rollout: the twin call
        pass

    def poisoned(self):  # made by _Gen.rollout: an unresolved entry
        pass


class _RebuiltInjector:
    """One fault applied to a Gym-rebuilt result line: its token items, or its marks."""

    def __init__(self, ro: _Rollout, record: dict, rng):
        self.ro, self.record, self.rng = ro, record, rng
        self.items = [i for i in record["response"]["output"] if "generation_token_ids" in i]

    def apply(self, fault: str) -> None:
        if fault in ("rollout_failed", "invalid_reward"):
            _Injector(self.ro, self.record, [], self.rng).apply(fault)
        else:
            getattr(self, fault)()

    def _pick(self) -> dict:
        return self.items[int(self.rng.integers(len(self.items)))]

    def producer_masked(self):
        self.record["mask_sample"] = True

    def missing_tokens(self):
        for item in self.items:
            item["generation_token_ids"], item["generation_log_probs"] = [], []

    def invalid_record(self):
        self._pick()["prompt_token_ids"] = None

    def length_mismatch(self):
        self._pick()["generation_log_probs"].pop()

    def invalid_token(self):
        self._pick()["generation_token_ids"][-1] = -5

    def empty_generation(self):
        self.items[-1]["generation_token_ids"], self.items[-1]["generation_log_probs"] = [], []

    def invalid_logprob(self):
        self._pick()["generation_log_probs"][-1] = None

    def prefix_mismatch(self):
        item = self.items[int(self.rng.integers(1, len(self.items)))]
        item["prompt_token_ids"][0] = (item["prompt_token_ids"][0] + 1) % 1000


assert all(callable(getattr(_LocalInjector, f, None)) or hasattr(_Injector, f) for f in SHAPE_FAULTS["local"])
assert all(callable(getattr(_RebuiltInjector, f, None)) or hasattr(_Injector, f) for f in SHAPE_FAULTS["rebuilt"])


def _gym_own_capture(
    writer: _Writer,
    gen: _Gen,
    cfg: SynthConfig,
    ro: _Rollout,
    shape: str,
    fault: str | None,
    group: int,
    slot: int,
    totals: dict,
) -> None:
    """A rollout of the `local` or `rebuilt` shape: NeMo Gym's result line, its capture files
    and its expected outcome (CONTRACT.md 9)."""
    rid, rng = ro.rid, gen.rng
    record = {
        "reward": float(np.round(rng.random(), 3)),
        "output": [dict(i) for i in ro.output],
        "metadata": {"agent": "synth-swe", "env": "synthetic", "fault": fault, "capture": shape},
    }
    declared = rng.random() < 0.5
    folder = writer.part["ledger"]
    roots = sum(c.parent is None for c in ro.accepted)
    select_reason, terminal_reason, _ = FAULTS[fault] if fault else (None, None, False)
    if shape == "local":
        delta = int(hashlib.md5(rid.encode()).hexdigest(), 16) % 1000 < cfg.local_delta * 1000
        entries = local_entries(rid, ro.calls, delta=delta)
        files: dict = {}
        if fault is not None:
            _LocalInjector(ro, record, entries, files, rng).apply(fault)
        if fault is None or fault == "poisoned":
            root_entries = sum(c.parent is None and c.poison is None for c in ro.calls)
            terminal = _expect(R.HISTORY_REWRITTEN if root_entries > 1 else None, 1)
        elif fault in LOCAL_ROLLOUT_CHECKS:
            terminal = _expect(select_reason, 1)
        elif fault in ("swapped_capture", "missing_terminal") or terminal_reason == select_reason:
            terminal = _expect(terminal_reason, 1)
        else:
            terminal = None
        expected = {
            "select": _expect(select_reason, roots),
            "strict": _expect(R.CAPTURE_POISONED if ro.has_poison else select_reason, roots),
            "terminal": terminal,
        }
        if not files.pop("absent", False):
            write_local_capture(folder, rid, entries, **files)
        totals["calls"] += len(entries)
        totals["tokens"] += int(sum(len(c.ids) for c in ro.calls if c.poison is None))
    else:
        last_root = max(k for k, c in enumerate(ro.accepted) if c.parent is None)
        chain = ro.accepted[last_root:]
        record["output"] = rebuilt_output(chain)
        record["_ng_token_capture"] = {"chains": roots, "delivered_fraction": round(len(chain) / len(ro.accepted), 3)}
        record["response"] = {"id": f"resp_{rid}", "object": "response", "output": record.pop("output")}
        if fault is not None:
            _RebuiltInjector(ro, record, rng).apply(fault)
        expected = {k: _expect(select_reason, 1) for k in ("select", "strict", "terminal")}
        folder.mkdir(parents=True, exist_ok=True)
        tombstone = {"entry_digests": {}, "frozen": True, "incomplete": False, "indexed_size": 0, "retired": True}
        (folder / f"{rid}.tokens.state.json").write_text(json.dumps(tombstone, sort_keys=True) + "\n")
        (folder / f"{rid}.tokens.lock").touch()
        totals["calls"] += len(chain)
        totals["tokens"] += int(sum(len(c.ids) for c in chain))
    if "response" not in record:
        record["response"] = {"id": f"resp_{rid}", "object": "response", "output": record.pop("output")}
    result = _as_gym_result(record, group, slot, ro, declared and shape == "local", fault, reserialise=False)
    if shape == "rebuilt":  # Gym keeps the original response id
        result["response"]["id"] = f"resp_{ro.accepted[-1].call_id}"
    writer.rollouts.write(json.dumps(result) + "\n")
    writer.expected.write(json.dumps({"rollout_id": rid, "shape": shape, "fault": fault, **expected}) + "\n")


def _verifiers_trace(writer: _Writer, gen: _Gen, ro: _Rollout, fault: str | None, group: int, totals: dict) -> None:
    """A rollout of the `verifiers` shape: an Episode line of one trace, its accepted calls
    and compaction summaries as nodes (retries, twins and poison rows are not written: a
    verifiers graph would train them as branches of their own), and its expected outcome
    (CONTRACT.md 10)."""
    rid = hashlib.md5(f"verifiers-{ro.rid}".encode()).hexdigest()
    nodes: list[dict] = []
    accepted = {c.call_id for c in ro.accepted}
    last: int | None = None  # the last accepted call's sampled node
    summary: int | None = None  # a compaction's accepted attempt, for the next root to name
    for c in ro.calls:
        if c.call_id.startswith("sum-"):
            assert last is not None
            attempt = [(last, "compaction_attempt")]
            if len(nodes) % 2:  # an attempt the harness did not accept, first
                call_nodes(nodes, last, c, attempt)
            summary = call_nodes(nodes, last, c, attempt)
        elif c.call_id in accepted:
            links = [(summary, "compaction")] if c.parent is None and summary is not None else []
            last = call_nodes(nodes, None if c.parent is None else last, c, links)
            summary = None if c.parent is None else summary
    rewards = {"correct": {"score": float(np.round(gen.rng.random(), 3)), "weight": 1.0}}
    ep = episode(rid, [trace(nodes, rewards, trace_id=f"trace-{rid[:8]}")], group=f"vf{group:05d}")
    if fault is not None:
        inject(ep, fault, gen.rng)
    writer.traces().write(episode_line(ep))
    reason = R(VERIFIERS_FAULTS[fault]) if fault else None
    rows = sum(c.parent is None for c in ro.accepted)
    expected = {
        "select": _expect(reason, rows),
        "strict": _expect(reason, rows),
        "terminal": _expect(reason or (R.HISTORY_REWRITTEN if rows > 1 else None), 1),
    }
    writer.expected.write(json.dumps({"rollout_id": rid, "shape": "verifiers", "fault": fault, **expected}) + "\n")
    totals["calls"] += sum(n["sampled"] is True for n in nodes)
    totals["tokens"] += sum(len(n["token_ids"]) for n in nodes)


def _envelope_line(
    writer: _Writer, gen: _Gen, ro: _Rollout, fault: str | None, group: int, slot: int, totals: dict
) -> None:
    """A rollout of the `envelope` shape: the result line NeMo Gym's compaction agent writes
    (CONTRACT.md 11), its accepted calls as the agent's steps (each call's prompt the whole
    request: the segment's tokens so far, then the call's new mask-0 tokens), a new segment
    under a boundary event at every root after the first; retries, summaries and poison rows
    are not written (the agent declares only the calls it kept). And its expected outcome."""
    calls: list[EnvelopeCall] = []
    seen: list[int] = []
    for c in ro.accepted:
        ids, mask, logprobs = np.asarray(c.ids), np.asarray(c.mask), np.asarray(c.logprobs)
        new, generated = ids[mask == 0].tolist(), ids[mask == 1].tolist()
        starts = c.parent is None
        prompt = new if starts else seen + new
        if starts and seen and prompt[: len(seen)] == seen:  # a rewrite shows as a break
            prompt = [(prompt[0] + 1) % gen.cfg.vocab] + prompt[1:]
        calls.append(EnvelopeCall(prompt, generated, logprobs[mask == 1].tolist(), starts_segment=starts))
        seen = prompt + generated
    if fault == "prefix_mismatch" and len(calls) < 2:
        fault = "digest_mismatch"  # one call breaks from nothing
    record = envelope_record(Envelope(group, slot, calls, reward=float(np.round(gen.rng.random(), 3))))
    if fault is not None:
        inject_envelope(record, fault, gen.rng)
    writer.rollouts.write(json.dumps(record, separators=(",", ":")) + "\n")
    reason = R(ENVELOPE_FAULTS[fault]) if fault else None
    rows = len(record["response"]["boundary_events"]) + 1 if reason is None else 0
    expected = {
        "select": _expect(reason, rows),
        "strict": _expect(reason, rows),
        "terminal": _expect(reason or (R.HISTORY_REWRITTEN if rows > 1 else None), 1),
    }
    writer.expected.write(
        json.dumps({"rollout_id": f"{group}-{slot}", "shape": "envelope", "fault": fault, **expected}) + "\n"
    )
    totals["calls"] += len(calls)
    totals["tokens"] += sum(len(c.prompt) + len(c.generated) for c in calls)


def read_expected(output: str | Path, ds: str) -> dict[str, dict]:
    path = Path(output) / "_expected" / f"ds={ds}" / "outcomes.jsonl"
    with open(path) as fh:
        return {e["rollout_id"]: e for e in map(json.loads, fh)}
