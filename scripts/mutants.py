"""Mutation check: apply single-line mutations to a copy of the core, one at a time, run the
tests that should notice each, and print which were killed and which survived.

Run by hand before a stop (all of them: ~25 minutes on 2 cores, most of it the baseline run
of every test file named; not part of `make test`):

    .venv/bin/python scripts/mutants.py            # every mutation
    .venv/bin/python scripts/mutants.py -k select  # those whose name contains "select"
    .venv/bin/python scripts/mutants.py -k lease -k grace  # either

Each mutation names a file of the repository, a line as it is (it must occur exactly once),
the line that replaces it, and the test files to run. The copy is made once (the working
tree's files, committed or not); each mutation is applied to it, tested, and undone. Exit 1
when a mutation survives or no longer applies (the code it names changed: update the list).
The list covers the contract's check families: digests, select, cut, finalize, the
per-token checks, advantages, the publish invariants, the version and gate defaults, and
NeMo Gym's own capture (local-mode entries, rebuilt lines, failures files), verifiers traces;
and around them
the publish protocol (grace periods, path-safe run ids, recovery), the output lease, object
storage (retries, batch deletes, conditional writes), the shard plan, a token row group's
pages against its footer, and the report server's path guards. A mutation names the one
test that catches it where its file is slow.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    line: str
    becomes: str
    tests: tuple[str, ...]


REASONS = "tests/test_reason_codes.py"
GYM = "tests/test_gym_local.py"
CHILDREN = "tests/test_capture_children.py"
VERIFIERS = "tests/test_verifiers.py"
VERIFIERS_PROPERTY = "tests/test_verifiers_properties.py"
ENVELOPE = "tests/test_gym_envelope.py"
UI = "plugins/reassembler_airflow/quality_ui.py"
MUTANTS = [
    # versions and defaults (the four survivors of the independent mutation run)
    Mutant(
        "schema version 1 accepted",
        "reassembler/verify/checks.py",
        "SUPPORTED_SCHEMA = (2, 3)",
        "SUPPORTED_SCHEMA = (1, 2, 3)",
        (REASONS,),
    ),
    Mutant(
        "digest version 3 accepted",
        "reassembler/verify/checks.py",
        "SUPPORTED_DIGEST = (2,)",
        "SUPPORTED_DIGEST = (2, 3)",
        (REASONS,),
    ),
    Mutant(
        "extras version 2 accepted",
        "reassembler/verify/checks.py",
        "SUPPORTED_EXTRAS = (1,)",
        "SUPPORTED_EXTRAS = (1, 2)",
        (REASONS,),
    ),
    Mutant(
        "logprob under mask 0 skipped beside unequal lengths",
        "reassembler/verify/tokens.py",
        "for i in np.flatnonzero((self.n_mask == self.n_lp) & (self.n_mask > 0)):",
        "for i in np.flatnonzero((self.n_mask == self.n_lp) & (self.n_mask > 0))[:0]:",
        (REASONS, "tests/test_tokens.py"),
    ),
    Mutant(
        "logprob under mask 0 skipped beside unequal lengths (the column/per-call property, pinned)",
        "reassembler/verify/tokens.py",
        "for i in np.flatnonzero((self.n_mask == self.n_lp) & (self.n_mask > 0)):",
        "for i in np.flatnonzero((self.n_mask == self.n_lp) & (self.n_mask > 0))[:0]:",
        ("tests/test_checks.py",),
    ),
    Mutant(
        "ok rollouts = rollouts in rows not checked",
        "reassembler/publish/staged.py",
        "if numbers.ok_rollouts != numbers.rollouts_in_rows:",
        "if False:",
        ("tests/test_publish.py",),
    ),
    Mutant(
        "gate's reason rate 0.2",
        "reassembler/settings.py",
        "max_reason_rate: float | None = 0.1",
        "max_reason_rate: float | None = 0.2",
        ("tests/test_docs.py",),
    ),
    # publish invariants
    Mutant(
        "audit rows = rollouts in not checked",
        "reassembler/publish/staged.py",
        "if numbers.audit_rows != numbers.rollouts_in:",
        "if False:",
        ("tests/test_publish.py",),
    ),
    Mutant(
        "each rollout once not checked",
        "reassembler/publish/staged.py",
        "if numbers.audit_rollouts != numbers.audit_rows:",
        "if False:",
        ("tests/test_publish.py",),
    ),
    Mutant(
        "mask rate limit inclusive",
        "reassembler/publish/staged.py",
        "if numbers.mask_rate > max_mask_rate:",
        "if numbers.mask_rate >= max_mask_rate:",
        ("tests/test_publish.py",),
    ),
    Mutant(
        "the load's count not checked",
        "reassembler/publish/staged.py",
        "if numbers.rollouts_in != n_loaded:",
        "if False:",
        ("tests/test_warehouse.py",),
    ),
    Mutant(
        "an empty night replaces one",
        "reassembler/publish/staged.py",
        "if numbers.audit_rows == 0 and not allow_empty:",
        "if False:",
        ("tests/test_warehouse.py",),
    ),
    # the commit (one manifest per night) and the output lease
    Mutant(
        "the conditional put on S3 is unconditional",
        "reassembler/storage/conditional.py",
        'condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}',
        "condition: dict = {}",
        ("tests/test_object_storage.py::test_the_conditional_put_itself",),
    ),
    Mutant(
        "the local conditional put never conflicts",
        "reassembler/storage/conditional.py",
        "        if read_versioned(loc)[1] != version:",
        "        if False:",
        ("tests/test_store_retry.py::test_conditional_writes",),
    ),
    Mutant(
        "a lost conditional put's own write not recognised",
        "reassembler/storage/conditional.py",
        "                if current == data and tag is not None:",
        "                if False:",
        ("tests/test_store_faults.py::test_a_conditional_put_whose_answer_is_lost_commits_once",),
    ),
    Mutant(
        "a lease taken over is deleted by its old holder",
        "reassembler/publish/lock.py",
        "                if self.version is None or storage.delete_if(path, self.version):",
        "                if self.version is None or storage.delete(path) is None:",
        ("tests/test_lease.py",),
    ),
    Mutant(
        "a lease that cannot be deleted is left live",
        "reassembler/publish/lock.py",
        "                storage.put_if(path, json.dumps(info).encode(), self.version)",
        "                pass",
        ("tests/test_lease.py",),
    ),
    Mutant(
        "an earlier run's objects stay in the partition",
        "reassembler/publish/protocol.py",
        "    storage.delete_many([storage.join(output, key) for key in sorted(present - wanted.keys())])",
        "    storage.delete_many([storage.join(output, key) for key in sorted(present - wanted.keys())][:0])",
        ("tests/test_object_storage.py::test_a_kill_at_every_publish_step_on_s3",),
    ),
    # the retry policy of every object-storage request
    Mutant(
        "a reset mid-body is not retried",
        "reassembler/storage/retry.py",
        "            be.HTTPClientError,  # a response stream broken mid-body, among others",
        "            KeyboardInterrupt,",
        ("tests/test_store_retry.py",),
    ),
    Mutant(
        "pyarrow's short range read is not retried",
        "reassembler/storage/retry.py",
        '    "aws error internal_failure",',
        '    "aws error internal_failure (never)",',
        ("tests/test_store_retry.py",),
    ),
    Mutant(
        "throttling gets the transient budget",
        "reassembler/storage/retry.py",
        "            limit = budget_seconds() * (1.0 if kind == THROTTLE else TRANSIENT_SHARE)",
        "            limit = budget_seconds() * TRANSIENT_SHARE",
        ("tests/test_store_retry.py",),
    ),
    Mutant(
        "no jitter",
        "reassembler/storage/retry.py",
        "            delay = _random.uniform(0, min(cap, base * 2 ** (attempt - 1)))",
        "            delay = min(cap, base * 2 ** (attempt - 1))",
        ("tests/test_store_retry.py",),
    ),
    Mutant(
        "a batch delete's failed keys not retried",
        "reassembler/storage/s3.py",
        "                raise _BatchFailed(failed[0])",
        "                pass",
        ("tests/test_store_retry.py",),
    ),
    Mutant(
        "a replaced run's files deleted at once",
        "reassembler/publish/protocol.py",
        'keep |= {path_safe(r["run_id"]) for r in manifest.get("superseded", []) if _age(r["at"]) < GRACE_SECONDS}',
        "pass",
        ("tests/test_publish.py",),
    ),
    Mutant(
        "a local partition swapped by two renames",
        "reassembler/publish/protocol.py",
        "_exchange(fresh, target)  # now `fresh` holds the previous files",
        "storage.delete_tree(target); os.rename(fresh, target); os.makedirs(fresh)",
        ("tests/test_publish.py",),
    ),
    Mutant(
        "an expired lease is never taken over",
        "reassembler/publish/lock.py",
        'if data is None or info.get("until", 0) < time.time():',
        "if data is None:",
        ("tests/test_object_storage.py::test_a_held_lease_makes_a_second_build_fail_naming_its_holder",),
    ),
    # the grace period, path-safe run ids, recovery alone (publish/protocol.py)
    Mutant(
        "a superseded run's grace counted from its own commit",
        "reassembler/publish/protocol.py",
        'return [{"run_id": previous["run_id"], "at": now}, *live]',
        'return [{"run_id": previous["run_id"], "at": previous["committed_at"]}, *live]',
        ("tests/test_publish.py",),
    ),
    Mutant(
        "a superseded run listed past its grace period",
        "reassembler/publish/protocol.py",
        'live = [r for r in previous.get("superseded", []) if _age(r["at"]) < GRACE_SECONDS]',
        'live = [r for r in previous.get("superseded", []) if _age(r["at"]) < 2 * GRACE_SECONDS]',
        ("tests/test_publish.py",),
    ),
    Mutant(
        "a replaced local partition dated by its files",
        "reassembler/publish/protocol.py",
        "os.utime(fresh, (replaced, replaced))",
        "pass",
        ("tests/test_publish.py",),
    ),
    Mutant(
        "a replaced local partition removed within its grace period",
        "reassembler/publish/protocol.py",
        "if _clock() - entry.stat().st_mtime > GRACE_SECONDS:",
        "if _clock() - entry.stat().st_mtime > 0:",
        ("tests/test_publish.py",),
    ),
    Mutant(
        "a replaced local partition never removed",
        "reassembler/publish/protocol.py",
        "            storage.delete_tree(entry.path)",
        "            pass",
        ("tests/test_publish.py",),
    ),
    Mutant(
        "partition files named by the raw run id",
        "reassembler/publish/protocol.py",
        "tag = path_safe(run_id)",
        "tag = run_id",
        ("tests/test_publish.py",),
    ),
    Mutant(
        "the committed run's folder looked for by its raw id",
        "reassembler/publish/protocol.py",
        'keep.add(path_safe(manifest["run_id"]))',
        'keep.add(manifest["run_id"])',
        ("tests/test_publish.py",),
    ),
    Mutant(
        "superseded runs' folders looked for by their raw ids",
        "reassembler/publish/protocol.py",
        'keep |= {path_safe(r["run_id"]) for r in',
        'keep |= {r["run_id"] for r in',
        ("tests/test_publish.py",),
    ),
    Mutant(
        "recovery trusts the warehouse alone",
        "reassembler/publish/protocol.py",
        'if {f"{kind}/ds={ds}/{rel}" for rel in rels} != set(manifest["partitions"][kind]):',
        "if False:",
        ("tests/test_object_storage.py::test_recover_alone_finishes_a_night_killed_after_its_commit_on_s3",),
    ),
    Mutant(
        "recovery on S3 copies nothing that is missing",
        "reassembler/publish/protocol.py",
        "            if key not in present",
        "            if key not in present and False",
        ("tests/test_object_storage.py::test_recover_alone_finishes_a_night_killed_after_its_commit_on_s3",),
    ),
    # object storage (storage/)
    Mutant(
        "a batch delete sends only its first 1,000 keys",
        "reassembler/storage/s3.py",
        "parts = [keys[k : k + 1000] for k in range(0, len(keys), 1000)]",
        "parts = [keys[:1000]]",
        ("tests/test_store_retry.py",),
    ),
    Mutant(
        "a conditional put on a deleted object succeeds",
        "reassembler/storage/conditional.py",
        'if code in _CONFLICT_CODES or (version is not None and code in ("NoSuchKey", "404")):',
        "if code in _CONFLICT_CODES:",
        ("tests/test_store_retry.py",),
    ),
    # the shard's plan (load/shard_plan.py)
    Mutant(
        "token row groups listed in file order",
        "reassembler/load/shard_plan.py",
        "order = np.argsort(first)  # the order the shard first needs them",
        "order = np.arange(len(first))",
        ("tests/test_read.py",),
    ),
    Mutant(
        "a token row's group found one off at its start",
        "reassembler/load/shard_plan.py",
        'groups[idx] = np.searchsorted(self.starts[name], rows[idx], side="right") - 1',
        'groups[idx] = np.searchsorted(self.starts[name], rows[idx], side="left") - 1',
        ("tests/test_read.py",),
    ),
    Mutant(
        "rows gathered with the mask's values as log probabilities",
        "reassembler/verify/tokens.py",
        "_join(self.lp, self.lp_starts[rows], lens, np.float32),",
        "_join(self.mask, self.lp_starts[rows], lens, np.float32),",
        ("tests/test_properties.py",),
    ),
    # a token row group's pages held to its footer (formats/parquet_pages.py, token_file.py)
    Mutant(
        "a footer that understates its pages decoded all the same",
        "reassembler/formats/token_file.py",
        "        if why is not None:",
        "        if False:",
        ("tests/test_token_file_pages.py",),
    ),
    Mutant(
        "pages holding more values than declared pass",
        "reassembler/formats/parquet_pages.py",
        "if found.values != chunk.values:",
        "if found.values < chunk.values:",
        ("tests/test_token_file_pages.py",),
    ),
    Mutant(
        "a v2 data page's values not counted",
        "reassembler/formats/parquet_pages.py",
        "if kind in (_DATA_PAGE, _DATA_PAGE_V2):",
        "if kind == _DATA_PAGE:",
        ("tests/test_token_file_pages.py",),
    ),
    Mutant(
        "a chunk cut short by the end of the file passes",
        "reassembler/formats/parquet_pages.py",
        "if len(data) != chunk.length:",
        "if False:",
        ("tests/test_token_file_pages.py",),
    ),
    # progress (progress.py and the load's and shards' totals)
    Mutant(
        "a progress line only after more than 10 s",
        "reassembler/progress.py",
        "elif now - self._reported >= REPORT_SECONDS:",
        "elif now - self._reported > REPORT_SECONDS:",
        ("tests/test_progress.py",),
    ),
    Mutant(
        "the ledger files never counted as done",
        "reassembler/load/read.py",
        'done(*(night.path("ledger", rel) for rel, _ in chunk.files))',
        "pass",
        ("tests/test_progress.py",),
    ),
    Mutant(
        "a shard's planned tokens not recorded",
        "reassembler/load/shard_plan.py",
        'self.tokens += max(0, pc.sum(table.column("delta_len")).as_py() or 0)',
        "pass",
        ("tests/test_progress.py",),
    ),
    # digests (CONTRACT.md 4)
    Mutant(
        "chain prefix",
        "reassembler/formats/digests.py",
        'PREFIX_CHAIN = b"nemo-gym-staging-chain-v1"',
        'PREFIX_CHAIN = b"nemo-gym-staging-chain-v2"',
        ("tests/test_digests.py", REASONS),
    ),
    Mutant(
        "cumulative prefix",
        "reassembler/formats/digests.py",
        'PREFIX_CUMULATIVE = b"nemo-gym-staging-prefix-v2"',
        'PREFIX_CUMULATIVE = b"nemo-gym-staging-prefix-v1"',
        ("tests/test_digests.py",),
    ),
    Mutant(
        "staged call prefix",
        "reassembler/formats/digests.py",
        'PREFIX_CALL = b"nemo-gym-staging-call-v2"',
        'PREFIX_CALL = b"nemo-gym-staging-call-v1"',
        ("tests/test_digests.py",),
    ),
    Mutant(
        "ids as little-endian",
        "reassembler/formats/digests.py",
        'ids.astype(">u8").data.cast("B"),',
        'ids.astype("<u8").data.cast("B"),',
        ("tests/test_digests.py", REASONS),
    ),
    Mutant(
        "digest compared never",
        "reassembler/verify/checks.py",
        "if recomputed != call.digest:",
        "if False:",
        (REASONS,),
    ),
    Mutant(
        "chain hash compared never",
        "reassembler/verify/checks.py",
        "if recomputed != call.chain_hash:",
        "if False:",
        (REASONS,),
    ),
    Mutant(
        "cumulative hash compared never",
        "reassembler/verify/finalize.py",
        "if joined != leaf.cumulative_hash:",
        "if False:",
        (REASONS,),
    ),
    Mutant(
        "afp prefix",
        "reassembler/formats/gym_fingerprint.py",
        'PREFIX = b"nemo-gym-lineage"',
        'PREFIX = b"nemo-gym-lineage-v2"',
        ("tests/test_gym_evidence.py",),
    ),
    Mutant(
        "afp arguments not re-serialised",
        "reassembler/formats/gym_fingerprint.py",
        "        return _cj(parsed)",
        "        return _utf8(value)",
        ("tests/test_gym_evidence.py",),
    ),
    Mutant(
        "item fingerprint keeps status",
        "reassembler/formats/items.py",
        '_NOT_HASHED = ("id", "status", *TOKEN_FIELDS)',
        '_NOT_HASHED = ("id", *TOKEN_FIELDS)',
        ("tests/test_items.py", "tests/test_worked_example.py"),
    ),
    # select (CONTRACT.md 3.1)
    Mutant(
        "select: a tie goes to the first candidate",
        "reassembler/verify/select.py",
        "if len(candidates) > 1:",
        "if False:",
        (REASONS,),
    ),
    Mutant(
        "select: the shortest fingerprint span",
        "reassembler/verify/select.py",
        "span[id(c)] = (c, k)  # the largest k wins",
        "span.setdefault(id(c), (c, k))",
        ("tests/test_gym_evidence.py",),
    ),
    Mutant(
        "select: capture order not checked",
        "reassembler/verify/select.py",
        "if after.capture_seq <= before.capture_seq:",
        "if False:",
        (REASONS,),
    ),
    Mutant(
        "select: terminal not checked",
        "reassembler/verify/select.py",
        "if declared is not None and selected[-1].model_call_id not in declared:",
        "if False:",
        (REASONS,),
    ),
    Mutant(
        "select: items evidence ignores ids",
        "reassembler/verify/select.py",
        "if pfp != gfp or (pid and gid and pid != gid):",
        "if pfp != gfp:",
        ("tests/test_properties.py", "tests/test_worked_example.py", REASONS, "tests/test_items.py"),
    ),
    # cut (3.2)
    Mutant(
        "cut: any call continues the chain",
        "reassembler/verify/cut.py",
        "elif i > 0 and call.parent_call_id == selected[i - 1].model_call_id:",
        "elif i > 0:",
        (REASONS, "tests/test_properties.py"),
    ),
    Mutant(
        "cut: no new chain at a root",
        "reassembler/verify/cut.py",
        "        if call.is_root:",
        "        if call.is_root and i == 0:",
        ("tests/test_worked_example.py", REASONS),
    ),
    # finalize (3.3)
    Mutant(
        "finalize: walk not compared to the chain",
        "reassembler/verify/finalize.py",
        "if [c.model_call_id for c in walk] != [c.model_call_id for c in chain]:",
        "if False:",
        (REASONS,),
    ),
    Mutant(
        "finalize: parent length not checked",
        "reassembler/verify/finalize.py",
        "if k > 0 and chain[k - 1].cum_len != call.prev_len:",
        "if False:",
        (REASONS,),
    ),
    Mutant(
        "finalize: cycle not detected",
        "reassembler/verify/finalize.py",
        "        if call.model_call_id in seen:",
        "        if False:",
        (REASONS,),
    ),
    # per-token checks
    Mutant(
        "token ids up to 2**32",
        "reassembler/verify/tokens.py",
        "TOKEN_LIMIT = 2**31",
        "TOKEN_LIMIT = 2**32",
        (REASONS, "tests/test_tokens.py", "tests/test_checks.py"),
    ),
    Mutant(
        "mask 1 before 0 allowed",
        "reassembler/verify/tokens.py",
        "np.less(m[1:], m[:-1], out=drop[1:])",
        "np.less(m[1:], m[:-1], out=drop[1:]); drop[:] = False",
        (REASONS, "tests/test_checks.py"),
    ),
    Mutant(
        "non-finite logprobs allowed",
        "reassembler/verify/tokens.py",
        "self.bad_lp = _per_row(~np.isfinite(lp), self.lp_starts)",
        "self.bad_lp = _per_row(np.isnan(lp) & False, self.lp_starts)",
        (REASONS, "tests/test_checks.py"),
    ),
    Mutant(
        "empty generation allowed",
        "reassembler/verify/checks.py",
        "(Reason.EMPTY_GENERATION, batch.ones[rows] == 0),",
        "(Reason.EMPTY_GENERATION, batch.ones[rows] < 0),",
        (REASONS, "tests/test_checks.py"),
    ),
    Mutant(
        "lengths not compared to the lists",
        "reassembler/verify/checks.py",
        "        lengths |= counted[rows] != delta",
        "        pass",
        (REASONS, "tests/test_checks.py"),
    ),
    # advantages (3.4)
    Mutant(
        "advantage without +1e-6",
        "reassembler/verify/advantage.py",
        "EPS = 1e-6",
        "EPS = 0.0",
        ("tests/test_advantage.py",),
    ),
    Mutant(
        "sample std",
        "reassembler/verify/advantage.py",
        "adv = adv / (r.std() + EPS)",
        "adv = adv / (r.std(ddof=1) + EPS)",
        ("tests/test_advantage.py",),
    ),
    Mutant(
        "leave-one-out mean of all",
        "reassembler/verify/advantage.py",
        "mean = (r.sum() - r) / (n - 1) if leave_one_out else np.full(n, r.mean())",
        "mean = np.full(n, r.mean())",
        ("tests/test_advantage.py",),
    ),
    Mutant(
        "rollout weight 1",
        "reassembler/verify/rows.py",
        'meta["rollout_weight"].append(1.0 / k)',
        'meta["rollout_weight"].append(1.0)',
        ("tests/test_worked_example.py",),
    ),
    # NeMo Gym's own capture (contract v3, section 9)
    Mutant(
        "local entry digest not checked",
        "reassembler/load/local_calls.py",
        "    if recomputed != e.digest:",
        "    if False:",
        (GYM,),
    ),
    Mutant(
        "local full prompt prefix not checked",
        "reassembler/load/local_calls.py",
        '            if seqs.own(p).pieces[0][: 8 * prev] != b"".join(parent_full.pieces):',
        "            if False:",
        (GYM, REASONS),
    ),
    Mutant(
        "a delta chain hashed over bytes that are not its own",
        "reassembler/load/local_tokens.py",
        "            if own.span[0] is flat and own.span[1] == end:",
        "            if own.span[0] is flat:",
        (GYM,),
    ),
    Mutant(
        "a rollout's ids not checked once converted together",
        "reassembler/load/local_tokens.py",
        "        self.clean_ids = not len(ids) or bool(ids.min() >= 0 and ids.max() < TOKEN_LIMIT)",
        "        self.clean_ids = True",
        (GYM, REASONS),
    ),
    Mutant(
        "a rollout's log probabilities not checked once converted together",
        "reassembler/load/local_tokens.py",
        "        self.clean_logprobs = bool(np.isfinite(logprobs).all())",
        "        self.clean_logprobs = True",
        (GYM, REASONS),
    ),
    Mutant(
        "a full prompt's token row starts at its prompt, not after its parent",
        "reassembler/load/local_calls.py",
        "        start: int | None = prev  # F is its own prompt, then its generation",
        "        start: int | None = 0",
        (GYM,),
    ),
    Mutant(
        "a child's derived token rows left out",
        "reassembler/load/capture_children.py",
        "                self.token_files.append(path)",
        "                pass",
        (CHILDREN,),
    ),
    Mutant(
        "this process's share read out of key order",
        "reassembler/load/capture_children.py",
        "        yield from read_captures(folder, shares[0], threads=1)",
        "        yield from read_captures(folder, shares[0][::-1], threads=1)",
        (CHILDREN,),
    ),
    Mutant(
        "a killed child's exit code not looked at",
        "reassembler/load/child_process.py",
        "        if code is not None and code != 0:",
        "        if False:",
        (CHILDREN, "tests/test_rollout_lines.py"),
    ),
    Mutant(
        "dangling intent not incomplete",
        "reassembler/load/local_capture.py",
        "    if dangling:",
        "    if False:",
        (GYM,),
    ),
    Mutant(
        "local cum_len not checked",
        "reassembler/load/local_calls.py",
        "    if e.cum_len != n:",
        "    if False:",
        (GYM,),
    ),
    Mutant(
        "rebuilt prefix contiguity not checked",
        "reassembler/formats/gym_rebuilt.py",
        "        if len(p) < seen or not np.array_equal(p[:seen], sequence):",
        "        if False:",
        (GYM,),
    ),
    Mutant(
        "given up after 4 attempts",
        "reassembler/merge/captures.py",
        "GIVE_UP_ATTEMPTS = 3  # NeMo Gym's default NEMO_GYM_MAX_ROLLOUT_ATTEMPTS (CONTRACT.md 2.1)",
        "GIVE_UP_ATTEMPTS = 4",
        (GYM,),
    ),
    Mutant(
        "a failed attempt's ledger rows rejected",
        "sql/bucket_merge.sql",
        "FROM ledger l ANTI JOIN decisions d ON d.rollout_id = l.rollout_id",
        "FROM ledger l ANTI JOIN (SELECT * FROM decisions WHERE kept) d ON d.rollout_id = l.rollout_id",
        (GYM,),
    ),
    Mutant(
        "schema_version true read as 1",
        "reassembler/formats/gym_local.py",
        "if version != SCHEMA_VERSION or not _is_int(version):",
        "if version != SCHEMA_VERSION:",
        (GYM,),
    ),
    Mutant(
        "token_item_index one past the end accepted",
        "reassembler/formats/gym_local.py",
        "not 0 <= index < len(items)",
        "not 0 <= index <= len(items)",
        (GYM,),
    ),
    Mutant(
        "a negative token_item_index accepted",
        "reassembler/formats/gym_local.py",
        "not 0 <= index < len(items)",
        "not index < len(items)",
        (GYM,),
    ),
    Mutant(
        "entry digests over the padded line",
        "reassembler/formats/gym_local.py",
        'return hashlib.sha256(line.rstrip(b"\\n").strip()).hexdigest()',
        'return hashlib.sha256(line.rstrip(b"\\n")).hexdigest()',
        (GYM,),
    ),
    Mutant(
        "delta prompts that loop never stop",
        "reassembler/load/local_tokens.py",
        "if any(c is parent for c in chain):",
        "if False:",
        (GYM,),
    ),
    Mutant(
        "a rebuilt line's prompt ids not checked",
        "reassembler/formats/gym_rebuilt.py",
        "if (p.size and (p.min() < 0 or p.max() >= TOKEN_LIMIT)) or g.min() < 0 or g.max() >= TOKEN_LIMIT:",
        "if g.min() < 0 or g.max() >= TOKEN_LIMIT:",
        (GYM,),
    ),
    Mutant(
        "a rebuilt prompt equal to the sequence before refused",
        "reassembler/formats/gym_rebuilt.py",
        "if len(p) < seen or not np.array_equal(p[:seen], sequence):",
        "if len(p) <= seen or not np.array_equal(p[:seen], sequence):",
        (GYM,),
    ),
    Mutant(
        "only a sample's first failure may be terminal",
        "reassembler/merge/captures.py",
        'if not (any(r["terminal"] for _, _, r in attempts) or len(attempts) >= GIVE_UP_ATTEMPTS):',
        'if not (attempts[0][2]["terminal"] or len(attempts) >= GIVE_UP_ATTEMPTS):',
        (GYM,),
    ),
    Mutant(
        "a given-up sample named after its first attempt",
        "reassembler/merge/captures.py",
        "rel, line, last = attempts[-1]",
        "rel, line, last = attempts[0]",
        (GYM,),
    ),
    Mutant(
        "select: a span skips an unfingerprintable item",
        "reassembler/verify/select.py",
        "if field is None:  # this span and every longer one match nothing",
        "if field is None and False:",
        ("tests/test_gym_evidence.py",),
    ),
    # the report server's path guards, each alone (plugins/reassembler_airflow/quality_ui.py)
    Mutant(
        "a link loop under reports/ is a 500",
        UI,
        "except (OSError, ValueError, RuntimeError, ReassemblerError):",
        "except (OSError, ValueError, ReassemblerError):",
        ("tests/test_quality_ui.py",),
    ),
    Mutant(
        "a link out of reports/ is served",
        UI,
        "if not (target.is_relative_to(Path(base).resolve()) and target.is_file()):",
        "if not target.is_file():",
        ("tests/test_quality_ui.py",),
    ),
    Mutant(
        "`..` in a path on object storage passes",
        UI,
        'any(p in ("", ".", "..") for p in parts)',
        'any(p in ("", ".") for p in parts)',
        ("tests/test_object_storage.py::test_dot_dot_in_a_report_path_on_object_storage_is_404",),
    ),
    Mutant(
        "mixed capture read as staged",
        "reassembler/merge/captures.py",
        "            if entries is not None:",
        "            if False:",
        (GYM, REASONS),
    ),
    # verifiers traces (CONTRACT.md 10)
    Mutant(
        "an unaccepted compaction attempt trains",
        "reassembler/formats/verifiers_graph.py",
        "    return attempts - accepted",
        "    return attempts - attempts",
        (VERIFIERS,),
    ),
    Mutant(
        "an accepted compaction attempt trains nothing",
        "reassembler/formats/verifiers_graph.py",
        "    return attempts - accepted",
        "    return attempts",
        (VERIFIERS_PROPERTY,),
    ),
    Mutant(
        "a parent -1 read as the last node, as verifiers' walk does",
        "reassembler/formats/verifiers_graph.py",
        "        if p is not None and not 0 <= p < n:",
        "        if p is not None and not -n <= p < n:",
        (VERIFIERS,),
    ),
    Mutant(
        "a mask false after a true accepted",
        "reassembler/formats/verifiers_graph.py",
        "    if ones and not m[len(m) - ones :].all():",
        "    if False:",
        (VERIFIERS,),
    ),
    Mutant(
        "mask true on an unsampled node accepted",
        "reassembler/formats/verifiers_graph.py",
        "    if ones and sampled is not True:",
        "    if False:",
        (VERIFIERS,),
    ),
    Mutant(
        "a positive log probability accepted",
        "reassembler/formats/verifiers_graph.py",
        "    if (lp > 0).any():",
        "    if False:",
        (VERIFIERS,),
    ),
    Mutant(
        "a branch without a sampled token is a row",
        "reassembler/formats/verifiers_graph.py",
        "        if all(k in owner for k in sampled):",
        "        if sampled and all(k in owner for k in sampled):",
        (VERIFIERS_PROPERTY,),
    ),
    Mutant(
        "an untrainable trace is a rollout",
        "reassembler/formats/verifiers.py",
        '        if isinstance(agent, dict) and agent.get("trainable") is False:',
        "        if False:",
        (VERIFIERS,),
    ),
    Mutant(
        "a repeated Episode id read again across parts",
        "sql/merge_rollouts.sql",
        "FROM m_ranked WHERE occurrence = 1 AND first_episode;",
        "FROM m_ranked WHERE occurrence = 1;",
        (VERIFIERS,),
    ),
    Mutant(
        "a repeated Episode id read again after a line of no trainable trace",
        "reassembler/load/verifiers_traces.py",
        '        if value["id"] in episodes:  # the first line of an Episode id is the episode: one reject a rollout',
        "        if False:",
        (VERIFIERS,),
    ),
    Mutant(
        "verifiers slots against the reading order",
        "sql/merge_rollouts.sql",
        "PARTITION BY group_id ORDER BY rollout_seq) - 1 AS INTEGER) AS slot",
        "PARTITION BY group_id ORDER BY rollout_seq DESC) - 1 AS INTEGER) AS slot",
        (VERIFIERS,),
    ),
    Mutant(
        "a row's prompt_len from its first token row alone",
        "reassembler/verify/rows.py",
        "else prompt_len(batch, rows))",
        "else int(batch.zeros[rows[0]]))",
        (VERIFIERS_PROPERTY,),
    ),
    Mutant(
        "a trace's policy versions dropped",
        "reassembler/verify/rows.py",
        "versions = list(seg.versions or (c.weight_version",
        "versions = list((c.weight_version",
        (VERIFIERS,),
    ),
    Mutant(
        "the fast line reader trusts orjson with repeated keys",
        "reassembler/load/verifiers_traces.py",
        '    structure = decode(_FLAT.sub(b"[]", raw), DECODER)',
        "    structure = None",
        (VERIFIERS,),
    ),
    Mutant(
        "the fast line reader trusts orjson with integers past 64 bits",
        "reassembler/load/verifiers_traces.py",
        "    return decode(raw, DECODER) if _float_for_int(value) else value",
        "    return value",
        (VERIFIERS,),
    ),
    # contract version 5: NeMo Gym's compaction agent (11), diagnoses (3.0), exactly-once and
    # dropped traces (10.4, 10.5), where a row came from (5.3)
    Mutant(
        "envelope: the evidence digest is not compared",
        "reassembler/formats/gym_envelope_calls.py",
        '        elif record["generation_evidence_digest"] != recomputed:',
        "        elif False:",
        (ENVELOPE,),
    ),
    Mutant(
        "envelope: any incomplete reason admits the line",
        "reassembler/formats/gym_envelope.py",
        "    if reasons and set(reasons) <= IDENTITY_GAPS:",
        "    if reasons:",
        (ENVELOPE,),
    ),
    Mutant(
        "envelope: a turn_id gap passes",
        "reassembler/formats/gym_envelope_calls.py",
        '        if record["turn_id"] != k + 1:  # 8.9',
        "        if False:  # 8.9",
        (ENVELOPE,),
    ),
    Mutant(
        "envelope: a boundary event that starts no segment passes",
        "reassembler/formats/gym_envelope_calls.py",
        "        if step not in started:",
        "        if False:",
        (ENVELOPE,),
    ),
    Mutant(
        "envelope: an ineligible call trains",
        "reassembler/formats/gym_envelope_calls.py",
        "            ones = np.full(len(g), 1.0 if eligible else 0.0, np.float32)",
        "            ones = np.full(len(g), 1.0, np.float32)",
        (ENVELOPE,),
    ),
    Mutant(
        "envelope: a version-2 line claims digest evidence",
        "reassembler/formats/gym_envelope.py",
        '    out = EnvelopeRollout(kind, "none" if v2 else "digest")',
        '    out = EnvelopeRollout(kind, "digest")',
        (ENVELOPE,),
    ),
    Mutant(
        "a diagnosis beside a measured reward masks (contract 4)",
        "reassembler/verify/rollout.py",
        '    if rollout["failure_reason"] is not None and rollout["reward"] is None:',
        '    if rollout["failure_reason"] is not None:',
        (REASONS,),
    ),
    Mutant(
        "verifiers: a shared sampled node trains on every branch (contract 4)",
        "reassembler/formats/verifiers_graph.py",
        "        if all(k in owner for k in sampled):",
        "        if not sampled:",
        (VERIFIERS,),
    ),
    Mutant(
        "verifiers: a dropped trace trains",
        "reassembler/formats/verifiers.py",
        "        if dropped is not None:",
        "        if False:",
        (VERIFIERS,),
    ),
    Mutant(
        "a 503 or 429 whose code is not listed is not throttling",
        "reassembler/storage/retry.py",
        "        if code in THROTTLE_CODES or status in (429, 503):",
        "        if code in THROTTLE_CODES:",
        ("tests/test_store_retry.py",),
    ),
    Mutant(
        "cleanup retries past a shorter REASSEMBLER_S3_RETRY_SECONDS",
        "reassembler/storage/retry.py",
        "    _local.budget = min(seconds, budget_seconds())",
        "    _local.budget = seconds",
        ("tests/test_store_retry.py",),
    ),
    Mutant(
        "a failed one of several parallel requests is dropped",
        "reassembler/storage/s3.py",
        "        future.result()",
        "        pass",
        ("tests/test_store_retry.py",),
    ),
    Mutant(
        "409 ConditionalRequestConflict is a store error, not a conflict",
        "reassembler/storage/conditional.py",
        '_CONFLICT_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")',
        '_CONFLICT_CODES = ("PreconditionFailed", "412")',
        ("tests/test_store_retry.py",),
    ),
    Mutant(
        "releasing a local lease already gone says it was taken over",
        "reassembler/storage/conditional.py",
        "        if current is not None and current != version:",
        "        if current != version:",
        ("tests/test_lease.py",),
    ),
    Mutant(
        "a list ending in a comma and a blank read by DuckDB",
        "reassembler/load/entry_reader.py",
        '        if text.rstrip(_BLANKS).endswith(b","):',
        '        if text.endswith(b","):',
        ("tests/test_entry_reader.py",),
    ),
    Mutant(
        "a footer understating a chunk's uncompressed size is trusted",
        "reassembler/formats/parquet_pages.py",
        "    if found.uncompressed > chunk.uncompressed:",
        "    if False:",
        ("tests/test_token_file_pages.py",),
    ),
    Mutant(
        "verifiers: rows past max_rollout_tokens are built",
        "reassembler/formats/verifiers_graph.py",
        "    if held > max_tokens:",
        "    if False:",
        (VERIFIERS,),
    ),
    Mutant(
        "verifiers: the rollout parser's children ignore max_rollout_tokens",
        "reassembler/load/rollout_lines.py",
        'chunks, part, args["max_rollout_tokens"], chunks.calls',
        "chunks, part, calls=chunks.calls",
        (VERIFIERS,),
    ),
    Mutant(
        "the merge reads the parts' pages without their CRCs",
        "reassembler/merge/staging.py",
        "            files.append(pq.ParquetFile(storage.open_parquet(loc), page_checksum_verification=True))",
        "            files.append(pq.ParquetFile(storage.open_parquet(loc)))",
        ("tests/test_load_parts.py",),
    ),
    Mutant(
        "the job's files written without page CRCs",
        "reassembler/table_file.py",
        'OPTIONS: dict[str, Any] = {"compression": "zstd", "compression_level": 1, "write_page_checksum": True}',
        'OPTIONS: dict[str, Any] = {"compression": "zstd", "compression_level": 1}',
        ("tests/test_load_parts.py",),
    ),
    Mutant(
        "a part file of another size or SHA-256 is read",
        "reassembler/merge/staging.py",
        "        if found != expected:",
        "        if False:",
        ("tests/test_load_parts.py",),
    ),
    Mutant(
        "a damaged part file ends in DuckDB's error, naming no file",
        "reassembler/merge/staging.py",
        "            raise failed[0] from None",
        "            pass",
        ("tests/test_load_parts.py",),
    ),
    Mutant(
        "a page header's list count drives the parser's loop",
        "reassembler/formats/parquet_pages.py",
        "        if n > len(buf) - pos:  # every element takes a byte at least: a count never drives the work",
        "        if False:",
        ("tests/test_token_file_pages.py",),
    ),
    Mutant(
        "a page header's map count drives the parser's loop",
        "reassembler/formats/parquet_pages.py",
        "        if 2 * n > len(buf) - pos:  # every entry takes two bytes at least",
        "        if False:",
        ("tests/test_token_file_pages.py",),
    ),
    Mutant(
        "a footer's chunk outside the file is read",
        "reassembler/formats/token_file.py",
        "        why = parquet_pages.outside(chunk, end)",
        "        why = None",
        ("tests/test_token_file_pages.py",),
    ),
    Mutant(
        "a dictionary of more entries than values is decoded",
        "reassembler/formats/parquet_pages.py",
        "    if found.entries > found.values:  # a dictionary holds the values' distinct ones: never more",
        "    if False:",
        ("tests/test_token_file_pages.py",),
    ),
    Mutant(
        "token pages that do not decode end in pyarrow's error, naming no file",
        "reassembler/formats/token_file.py",
        "        if isinstance(e, pa.ArrowMemoryError):  # out of memory stays what it is (exit 4)",
        "        if True:",
        ("tests/test_token_file_pages.py",),
    ),
    Mutant(
        "a rebuild's load replaces the published night at once",
        "sql/clear_night.sql",
        "DELETE FROM night_calls WHERE ds = CAST($ds AS DATE) AND ds NOT IN (SELECT ds FROM runs);",
        "DELETE FROM night_calls WHERE ds = CAST($ds AS DATE);",
        ("tests/test_warehouse.py",),
    ),
    Mutant(
        "a publish leaves the night's views on the run it replaced",
        "sql/publish_audit.sql",
        "INSERT INTO night_calls SELECT ds, run FROM loads WHERE ds = CAST($ds AS DATE) AND run = $run;",
        "SELECT 1;",
        ("tests/test_warehouse.py",),
    ),
    Mutant(
        "a rebuild's load deletes the published run's per-call files",
        "reassembler/build.py",
        "        call_tables.remove_other_runs(output, ds, {path_safe(run), *call_tables.current_runs(con, ds)})",
        "        call_tables.remove_other_runs(output, ds, {path_safe(run)})",
        ("tests/test_warehouse.py",),
    ),
    Mutant(
        "retention keeps the rows of a run neither current nor the latest load",
        "sql/retention.sql",
        "  AND NOT EXISTS (SELECT 1 FROM loads l WHERE l.ds = r.ds AND l.run = r.run);",
        "  AND false;",
        ("tests/test_warehouse.py",),
    ),
    Mutant(
        "a row group's strings are not counted in what it decodes to",
        "reassembler/formats/token_file.py",
        "        total += column.num_values * width if width else column.total_uncompressed_size + 8 * column.num_values",  # noqa: E501
        "        total += column.num_values * width if width else 0",
        ("tests/test_hostile_input.py",),
    ),
    Mutant(
        "a row group's columns are decoded whatever their footprint",
        "reassembler/formats/token_file.py",
        "    if footprint > bound:",
        "    if False:",
        ("tests/test_hostile_input.py",),
    ),
    Mutant(
        "strings a dictionary repeats are laid out unmeasured",
        "reassembler/formats/token_file.py",
        "    measured = [c.column for c in found if c.strings] if footprint + inflated > bound else []",
        "    measured = []",
        ("tests/test_hostile_input.py",),
    ),
    Mutant(
        "a batch's rows are built at once, whatever they repeat",
        "reassembler/verify/rows.py",
        "            if rows.tokens >= piece_tokens:",
        "            if False:",
        ("tests/test_verifiers.py",),
    ),
    Mutant(
        "a trace stores every row's path",
        "reassembler/formats/verifiers_graph.py",
        '            "leaves": [path[-1] for path in self.rows],',
        '            "leaves": [path[-1] for path in self.rows], "rows": self.rows,',
        ("tests/test_verifiers.py",),
    ),
    Mutant(
        "nodes without tokens get arrays of their own",
        "reassembler/formats/verifiers_graph.py",
        "        return _no_tokens()",
        "        pass",
        ("tests/test_verifiers.py",),
    ),
    Mutant(
        "a group cut over batches keeps the advantages of its parts",
        "reassembler/verify/open_group.py",
        "                    table = _with_advantages(table, ids, advantages).cast(schema)",
        "                    table = table.cast(schema)",
        ("tests/test_synth_night.py",),
    ),
    Mutant(
        "a group cut over batches is written as if whole",
        "reassembler/verify/shard.py",
        "            open_group = last",
        "            open_group = None",
        ("tests/test_synth_night.py",),
    ),
    Mutant(
        "a chunk is taken for the column its footer names",
        "reassembler/formats/parquet_pages.py",
        "    return metadata.schema.column(i).path",
        "    return metadata.row_group(metadata.num_row_groups - 1).column(i).path_in_schema",
        ("tests/test_hostile_input.py",),
    ),
    Mutant(
        "wide rows are sorted whole",
        "reassembler/wide_sort.py",
        '        f"JOIN (SELECT rowid AS plan_rowid, (row_number() OVER (ORDER BY {by}) - 1) // {int(rows)} AS {BUCKET} "',  # noqa: E501
        '        f"JOIN (SELECT rowid AS plan_rowid, (row_number() OVER (ORDER BY {by}) - 1) // {int(rows) * 10**9} AS {BUCKET} "',  # noqa: E501
        (
            "tests/test_load_parts.py::test_wide_rows_are_written_in_key_order_within_the_memory_limit",
            "tests/test_load_parts.py::test_a_buckets_per_call_files_are_written_in_order_within_the_memory_limit",
        ),
    ),
    Mutant(
        "a sort bucket's rows are given out as they came",
        "reassembler/wide_sort.py",
        "    table = table.take(pc.sort_indices(table, sort_keys=order))",
        "    table = table",
        ("tests/test_load_parts.py::test_a_buckets_per_call_files_are_written_in_order_within_the_memory_limit",),
    ),
    Mutant(
        "sort buckets are cut out of output order",
        "sql/merge_plan.sql",
        "                ORDER BY c.group_id ASC NULLS LAST, c.slot ASC NULLS LAST, c.rollout_id ASC NULLS LAST",
        "                ORDER BY c.rollout_id DESC",
        ("tests/test_synth_night.py::test_plans_sorted_in_spilled_buckets_of_one_rollout_change_nothing",),
    ),
    Mutant(
        "a large group is cut at two batches",
        "reassembler/verify/shard.py",
        "    after = starts[starts >= max(full, 1)]",
        "    after = starts[starts >= len(ids)]",
        ("tests/test_properties.py::test_a_shard_cuts_its_calls_into_units_of_about_a_batch_whatever_its_groups",),
    ),
    Mutant(
        "the held connection keeps its memory while the shards run",
        "reassembler/warehouse.py",
        "        self._held.execute(f\"SET memory_limit = '{REST_MEMORY}'\")",
        "        pass",
        ("tests/test_warehouse.py::test_a_one_process_build_lets_duckdb_keep_little_while_its_shards_run",),
    ),
    Mutant(
        "an in-memory load's temporary folder stays",
        "reassembler/merge/run.py",
        "        weakref.finalize(con, shutil.rmtree, folder, True)",
        "        pass",
        ("tests/test_read.py::test_a_load_without_a_run_folder_leaves_nothing_in_the_temporary_folder",),
    ),
    Mutant(
        "a shard's rollout records hold their items as Python objects",
        "reassembler/load/shard_plan.py",
        "    return [RolloutRecord(row, bulky, at) for at, row in enumerate(batch.to_pylist())]",
        "    return [RolloutRecord({**row, **{n: c[at].as_py() for n, c in bulky.items()}}, bulky, at)"
        " for at, row in enumerate(batch.to_pylist())]",
        (
            "tests/test_synth_night.py::test_a_shards_rollout_records_read_their_bulky_fields_from_the_plan_as_a_dict_would",
        ),
    ),
    Mutant(
        "a shard's items file is read out of step with its rollouts",
        "reassembler/load/shard_plan.py",
        '        if not table.column("rollout_id").combine_chunks().equals(ids):',
        "        if False:",
        (
            "tests/test_synth_night.py::test_a_shards_rollout_records_read_their_bulky_fields_from_the_plan_as_a_dict_would",
        ),
    ),
    Mutant(
        "a bucket keeps the items of every line of a rollout id, not the kept one's",
        "sql/bucket_merge.sql",
        "JOIN decisions d ON d.kept AND d.line_part = i.part AND d.line_seq = i.rollout_seq;",
        "JOIN decisions d ON d.kept AND d.rollout_id = i.rollout_id;",
        ("tests/test_load_parts.py::test_any_number_of_parts_and_buckets_gives_the_same_night",),
    ),
    Mutant(
        "a shard sorts its items in another order than its rollouts",
        "reassembler/load/shard_plan.py",
        'ITEM_ORDER = [("plan_group", "ascending"), ("plan_slot", "ascending"), ("rollout_id", "ascending")]',
        'ITEM_ORDER = [("plan_group", "ascending"), ("rollout_id", "ascending"), ("plan_slot", "ascending")]',
        ("tests/test_synth_night.py", "tests/test_verifiers.py"),
    ),
    Mutant(
        "a version-10 warehouse's items are dropped with their columns",
        "reassembler/warehouse.py",
        "                call_tables.export_items(con, output)  # the columns before they go",
        "                pass",
        (
            "tests/test_warehouse.py::test_a_warehouse_of_release_10_moves_its_rollouts_items_to_parquet_and_its_nights_stay_readable",
        ),
    ),
    Mutant(
        "retention keeps the rollouts' items files",
        "reassembler/call_tables.py",
        'PER_CALL = ("ledger", "token_rows", "rollout_items")  # retention deletes these (rejects are kept for good)',
        'PER_CALL = ("ledger", "token_rows")',
        ("tests/test_warehouse.py::test_retention_keeps_the_per_call_tables_of_the_newest_nights_only",),
    ),
    Mutant(
        "explain reads no items",
        "reassembler/audit/explain.py",
        "        record.update({name: found.get(name) for name in ITEMS})",
        "        pass",
        (
            "tests/test_warehouse.py::test_a_warehouse_of_release_10_moves_its_rollouts_items_to_parquet_and_its_nights_stay_readable",
        ),
    ),
    Mutant(
        "a shard runs its batches on top of what sorting its calls freed",
        "reassembler/build.py",
        "        give_back()  # what sorting them freed, before the batches",
        "        pass",
        ("tests/test_warehouse.py::test_a_one_process_build_gives_freed_memory_back_between_its_steps",),
    ),
    Mutant(
        "dead processes' temporary folders stay",
        "reassembler/warehouse.py",
        "    roots = {_spill_root(output_dir, settings), _scratch_root(settings), _reader_root(settings)}",
        "    roots = {_spill_root(output_dir, settings)}",
        ("tests/test_warehouse.py::test_spill_cleanup_also_clears_the_temporary_folders_of_dead_processes",),
    ),
    Mutant(
        "escaped backslashes are not paired before escaped quotes",
        "reassembler/load/json_lines.py",
        """    marks = raw.replace(b"\\\\\\\\", b"").replace(b'\\\\"', b"").translate(None, _NOT_MARK)""",
        """    marks = raw.replace(b'\\\\"', b"").translate(None, _NOT_MARK)""",
        ("tests/test_hostile_input.py::test_a_lines_depth_is_its_values_depth_whatever_its_strings_hold",),
    ),
    Mutant(
        "a line's depth counts the brackets inside its strings",
        "reassembler/load/json_lines.py",
        """    brackets = np.frombuffer(b"".join(marks.split(b'"')[::2]), np.uint8)""",
        """    brackets = np.frombuffer(marks.replace(b'"', b""), np.uint8)""",
        ("tests/test_hostile_input.py::test_a_lines_depth_is_its_values_depth_whatever_its_strings_hold",),
    ),
    Mutant(
        "a child's records are read only once it has ended",
        "reassembler/load/child_process.py",
        "        fd, offset, pause = self._out.fileno(), 0, POLL_FIRST",
        "        fd, offset, pause = self._out.fileno(), 0, self._proc.wait() * 0 + POLL_FIRST",
        ("tests/test_child_process.py::test_a_childs_records_are_taken_while_it_still_runs",),
    ),
    Mutant(
        "a record half written is read",
        "reassembler/load/child_process.py",
        "            if size is None or end < offset + FRAME.size + size:  # not all written yet",
        "            if size is None:",
        ("tests/test_child_process.py::test_a_record_half_written_is_waited_for",),
    ),
    Mutant(
        "a child's last record is given whatever its exit code",
        "reassembler/load/child_process.py",
        "                self._ended()  # its last record only once it ended well",
        "                pass",
        ("tests/test_child_process.py::test_the_last_record_of_a_child_that_fails_is_not_given",),
    ),
    Mutant(
        "a rollout repeated across parse parts keeps its carried calls",
        "reassembler/load/derived_calls.py",
        "        wanted = set(rollout_ids)",
        "        return self",
        ("tests/test_rollout_lines.py::test_children_over_parts_hand_over_what_this_process_parses",),
    ),
    Mutant(
        "a load child lets pandas in",
        "reassembler/load/child_process.py",
        """            f"keep_pandas_out(); from {module} import _child; _child()",""",
        """            f"from {module} import _child; _child()",""",
        ("tests/test_child_process.py::test_a_child_keeps_pandas_out",),
    ),
    Mutant(
        "a derived token row's key names the row after it",
        "reassembler/load/derived_tokens.py",
        "        rows = pa.array(np.arange(n, dtype=np.int64))  # each key's row in the file",
        "        rows = pa.array(np.arange(1, n + 1, dtype=np.int64))",
        ("tests/test_gym_local.py",),
    ),
    Mutant(
        "a derived token file's keys past their bound are dropped, not read back",
        "reassembler/load/derived_tokens.py",
        "            yield from key_batches([path])",
        "            pass",
        ("tests/test_capture_children.py::test_derived_keys_past_their_memory_bound_are_read_back_the_same",),
    ),
    Mutant(
        "a delta prompt read as if it were the whole prompt",
        "reassembler/load/local_tokens.py",
        "            seq = seq.then(self.own(q))",
        "            seq = self.own(q)",
        ("tests/test_gym_local.py::test_full_prompt_and_delta_entries_give_the_same_rows",),
    ),
    Mutant(
        "every row claims digest evidence",
        "reassembler/verify/rows.py",
        '    return "digest" if capture in DIGEST_CAPTURES else "none"',
        '    return "digest"',
        (ENVELOPE,),
    ),
]


def copy_tree(dest: Path) -> None:
    """The working tree's files (committed or not), without the venv and build output."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for rel in listed:
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_tests(tree: Path, tests: tuple[str, ...]) -> bool:
    """Whether the tests pass in `tree` (its own package first on the path)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "tests"), str(tree / "plugins")]))
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout", "60", *tests],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    return res.returncode == 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", action="append", default=[], help="only the mutations whose name contains this (repeatable)")
    args = p.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.k or any(k in m.name for k in args.k)]
    with tempfile.TemporaryDirectory(prefix="reassembler-mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        probe = subprocess.run(
            [sys.executable, "-c", "import reassembler; print(reassembler.__file__)"],
            cwd=tree,
            env=dict(os.environ, PYTHONPATH=str(tree)),
            capture_output=True,
            text=True,
        )
        assert probe.stdout.strip().startswith(str(tree)), f"the copy is not what gets imported: {probe.stdout}"
        baseline = sorted({t for m in chosen for t in m.tests})
        if not run_tests(tree, tuple(baseline)):
            print("the tests fail on the unmutated code: fix them first")
            return 1
        survivors, stale = [], []
        for m in chosen:
            path = tree / m.path
            original = path.read_text()
            lines = [k for k, line in enumerate(original.splitlines()) if m.line in line]
            if len(lines) != 1:
                stale.append(m)
                print(f"STALE     {m.name}: {m.path} holds {len(lines)} lines with {m.line!r}", flush=True)
                continue
            path.write_text(original.replace(m.line, m.becomes, 1))
            started = time.monotonic()
            try:
                passed = run_tests(tree, m.tests)
            finally:
                path.write_text(original)
            verdict = "SURVIVED" if passed else "killed"
            print(f"{verdict:<9} {m.name} ({m.path}, {time.monotonic() - started:.0f} s)", flush=True)
            if passed:
                survivors.append(m)
    print(f"\n{len(chosen) - len(survivors) - len(stale)} of {len(chosen)} killed", end="")
    print(f"; survived: {', '.join(m.name for m in survivors)}" if survivors else "", end="")
    print(f"; stale: {', '.join(m.name for m in stale)}" if stale else "")
    return 1 if survivors or stale else 0


if __name__ == "__main__":
    sys.exit(main())
