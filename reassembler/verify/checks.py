"""The per-call checks of a batch (CONTRACT.md 3.3), computed in columns, and their verdicts.

`BatchChecks` runs once per batch, off the main thread (shard.py's prepare stage):

1. **record checks, in columns**: for every call at once, with pyarrow compute and numpy
   over the batch, the first failing check in the contract's order: missing_tokens,
   duplicate_tokens, unsupported_version (ledger, then token row), field_mismatch,
   invalid_record, length_mismatch; then the token checks of its token row (tokens.py's
   counts): invalid_token, invalid_mask, empty_generation, invalid_logprob;
2. **the parent join, in columns**: each call's parent inside its rollout (`parent`), by
   (rollout_id, model_call_id);
3. **hashes** (`hash_all`): the staged-record digest of every call that passed 1, and its
   chain hash from its parent's ledger chain_hash. hashlib releases the GIL on the token
   payloads, so this runs beside the main thread. Using the parent's *ledger* hash is exact:
   finalize checks a chain root to leaf, so a call's chain hash is only looked at once its
   parent's recomputed hash has equalled the ledger's.

The per-rollout code (finalize.py, rollout.py) then only looks verdicts up: `record`,
`tokens` and `chain` raise `Masked` for a call that failed; a call that passed costs a list
lookup. The message of a failure names values, so it is written by the scalar check below
(`_explain_record`, `_explain_tokens`), run for that one call only. What needs the chain
(parent lengths, the cumulative hash of the joined row) stays in finalize.py.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..formats.digests import STAGED_FIELDS, chain_hash, staged_call_digest, staged_digest_of
from ..formats.fields import LEDGER_DIGESTS, SHARED_FIELDS, VERSION_DEFAULTS
from ..formats.records import HEX64, HEX64_PATTERN
from ..reasons import Masked, Reason
from .calls import Call, call_starts, token_row_counts
from .tokens import TokenBatch

VERSION_FIELDS = tuple(VERSION_DEFAULTS)
SUPPORTED_SCHEMA = (2, 3)
SUPPORTED_DIGEST = (2,)
SUPPORTED_EXTRAS = (1,)


def _np(column, fill) -> np.ndarray:
    return pc.fill_null(column, fill).to_numpy(zero_copy_only=False)


def _null(column) -> np.ndarray:
    return column.is_null().to_numpy(zero_copy_only=False)


def _true(column) -> np.ndarray:
    """A boolean column as numpy, null as False."""
    return pc.fill_null(column, False).to_numpy(zero_copy_only=False)


def _first(fails: list[tuple[Reason, np.ndarray]], n: int) -> list[Reason | None]:
    """Per call, the first reason whose flag is set (in list order), else None."""
    code = np.zeros(n, dtype=np.int8)
    for k in range(len(fails) - 1, -1, -1):
        code[fails[k][1]] = k + 1
    reasons: list[Reason | None] = [None] + [reason for reason, _ in fails]
    return [reasons[c] for c in code.tolist()]


def record_verdicts(heads: pa.Table, toks: pa.Table, counts: np.ndarray, batch: TokenBatch, rows: np.ndarray):
    """The first failing record check of each call (None: all passed). `heads`: the calls'
    ledger columns, `toks`: their first token row's scalar columns, `rows`: that row's
    number in `batch`."""
    n = heads.num_rows
    unsupported = (
        ~np.isin(_np(heads.column("schema_version"), -1), SUPPORTED_SCHEMA)
        | ~np.isin(_np(heads.column("digest_version"), -1), SUPPORTED_DIGEST)
        | ~np.isin(_np(heads.column("extras_digest_version"), -1), SUPPORTED_EXTRAS)
    )
    null_versions = np.zeros(n, dtype=bool)
    for name in VERSION_FIELDS:
        null_versions |= _null(toks.column(name))
    mismatch = np.zeros(n, dtype=bool)
    for name in SHARED_FIELDS:
        mine, theirs = heads.column(name), toks.column(name)
        same = _true(pc.equal(mine, theirs)) | (_null(mine) & _null(theirs))
        mismatch |= ~same
    mode = heads.column("mode")
    prev = _np(heads.column("prev_len"), -1)
    root = _null(heads.column("parent_call_id")) & _null(heads.column("failure_reason"))
    invalid = np.where(
        root,
        ~_true(pc.equal(mode, "text")) | (prev != 0),
        ~_true(pc.equal(mode, "token_in")) | (prev <= 0),
    )
    invalid |= _np(heads.column("weight_version"), -1) < 0
    for name in LEDGER_DIGESTS:
        invalid |= ~_true(pc.match_substring_regex(heads.column(name), HEX64_PATTERN))
    delta = _np(heads.column("delta_len"), 0)
    lengths = (delta < 1) | (_np(heads.column("cum_len"), -1) != prev + delta)
    for counted in (batch.n_ids, batch.n_mask, batch.n_lp):
        lengths |= counted[rows] != delta
    return _first(
        [
            (Reason.MISSING_TOKENS, counts == 0),
            (Reason.DUPLICATE_TOKENS, counts > 1),
            (Reason.UNSUPPORTED_VERSION, unsupported),
            (Reason.UNSUPPORTED_VERSION, null_versions),
            (Reason.FIELD_MISMATCH, mismatch),
            (Reason.INVALID_RECORD, invalid),
            (Reason.LENGTH_MISMATCH, lengths),
        ],
        n,
    )


def token_verdicts(batch: TokenBatch, rows: np.ndarray) -> list[Reason | None]:
    """The first failing token check of each call's token row (tokens.py's counts)."""
    return _first(
        [
            (Reason.INVALID_TOKEN, batch.bad_ids[rows] > 0),
            (Reason.INVALID_MASK, batch.bad_mask_values[rows] > 0),
            (Reason.INVALID_MASK, batch.mask_drops[rows] > 0),
            (Reason.EMPTY_GENERATION, batch.ones[rows] == 0),
            (Reason.INVALID_LOGPROB, batch.bad_lp[rows] > 0),
            (Reason.INVALID_LOGPROB, batch.lp_under_zero[rows] > 0),
        ],
        len(rows),
    )


def parent_index(heads: pa.Table) -> np.ndarray:
    """Each call's parent inside its rollout: its number in the batch, -1 for none."""
    sep = "\x1f"
    own = pc.binary_join_element_wise(heads.column("rollout_id"), heads.column("model_call_id"), sep)
    parent = pc.binary_join_element_wise(heads.column("rollout_id"), heads.column("parent_call_id"), sep)
    return _np(pc.index_in(parent, value_set=own), -1).astype(np.int64)


class BatchChecks:
    """Verdicts of every call of one batch. `table`: its call rows (sql/shard_calls.sql),
    `tokens`: their token rows, row for row (token_store.py's canonical columns); `batch`:
    those rows' TokenBatch, when the caller built it already (shard.py's reader thread)."""

    def __init__(self, table: pa.Table, tokens: pa.Table, batch: TokenBatch | None = None):
        self.table, self.tokens = table, tokens
        if batch is None:
            batch = TokenBatch(tokens.column("ids"), tokens.column("mask"), tokens.column("logprobs"))
        self.batch = batch
        self.starts = call_starts(table)
        self.counts = token_row_counts(table, self.starts)
        take = pa.array(self.starts, pa.int64())
        self.heads = table.take(take)
        toks = tokens.drop_columns(["ids", "mask", "logprobs"]).take(take)
        self.record_reason = record_verdicts(self.heads, toks, self.counts, self.batch, self.starts)
        self.token_reason = token_verdicts(self.batch, self.starts)
        self._derived_verdicts()
        self.parent = parent_index(self.heads)
        self.digests: list[str | None] = [None] * len(self.starts)
        self.chains: list[str | None] = [None] * len(self.starts)
        self._faults: dict[int, Masked | None] = {}

    def _derived_verdicts(self) -> None:
        """Calls the load derived from NeMo Gym's own capture (CONTRACT.md 9) were checked
        there: a local-mode entry's first failing check is on its ledger row (`entry_fault`),
        a rebuilt line's items have none. Their staged-record checks do not apply."""
        capture = self.heads.column("capture")
        if capture.null_count == len(capture):
            return
        faults = self.heads.column("entry_fault").to_pylist()
        for k in np.flatnonzero(~_null(capture)).tolist():
            if faults[k] is not None:
                self.record_reason[k] = Reason(faults[k])
            else:  # an unresolved entry (a poison row) has no token row, as a staged one
                self.record_reason[k] = Reason.MISSING_TOKENS if self.counts[k] == 0 else None
            self.token_reason[k] = None

    def hash_all(self) -> BatchChecks:
        """Staged digests and chain hashes of the calls that passed their record and token
        checks (see the module docstring). Returns self, for a thread pool's future."""
        staged = _null(self.heads.column("capture"))
        todo = [
            k
            for k, (r, t) in enumerate(zip(self.record_reason, self.token_reason))
            if r is None and t is None and staged[k]
        ]
        if not todo:
            return self
        take = pa.array(todo, pa.int64())
        h = self.heads.take(take)
        fields = [h.column(n).to_pylist() for n in STAGED_FIELDS]
        chains = self.heads.column("chain_hash").to_pylist()
        parents = self.parent[todo].tolist()
        b = self.batch
        rows = self.starts[todo]
        ids, mask, lp = b.be_buffers()
        id_at, id_n = (8 * b.id_starts[rows]).tolist(), (8 * b.n_ids[rows]).tolist()
        mask_at, mask_n = (4 * b.mask_starts[rows]).tolist(), (4 * b.n_mask[rows]).tolist()
        lp_at, lp_n = (4 * b.lp_starts[rows]).tolist(), (4 * b.n_lp[rows]).tolist()
        parent_ids = fields[STAGED_FIELDS.index("parent_call_id")]
        for j, (k, values) in enumerate(zip(todo, zip(*fields))):
            ids_be = ids[id_at[j] : id_at[j] + id_n[j]]
            self.digests[k] = staged_digest_of(
                values,
                ids_be,
                mask[mask_at[j] : mask_at[j] + mask_n[j]],
                lp[lp_at[j] : lp_at[j] + lp_n[j]],
            )
            p = parents[j]
            if parent_ids[j] is None:
                self.chains[k] = chain_hash(None, ids_be)
            elif p >= 0 and chains[p] is not None and HEX64.fullmatch(chains[p]):
                self.chains[k] = chain_hash(chains[p], ids_be)
        return self

    # -- lookups, for the per-rollout steps

    def record(self, call: Call) -> None:
        """check_record of CONTRACT.md 3.3 (missing/duplicate tokens .. length_mismatch);
        for a call derived from NeMo Gym's own capture, the load's verdict."""
        reason = self.record_reason[call.index]
        if reason is None:
            return
        if call.capture is not None and call.entry_fault is not None:
            raise Masked(reason, call.entry_detail, call.model_call_id)
        _raise(_explain_record(call, self._token_fields(call), self.batch))

    def tokens_and_digest(self, call: Call) -> None:
        """The token checks of the call's row, then its staged-record digest."""
        if self.token_reason[call.index] is not None:
            _raise(_explain_tokens(call, self.batch))
        if call.capture is not None:
            return  # checked at the load, its own digest included
        recomputed = self.digests[call.index]
        if recomputed is None:  # not hashed ahead (the checks before it failed): hash it now
            recomputed = _staged_digest(call, self.batch)
        if recomputed != call.digest:
            assert call.digest is not None
            raise Masked(
                Reason.DIGEST_MISMATCH,
                f"recomputed {recomputed[:16]}.. != ledger {call.digest[:16]}..",
                call.model_call_id,
            )

    def chain(self, call: Call, parent: Call | None) -> None:
        """The call's chain hash from its parent's (the parent passed: ledger = recomputed)."""
        if call.capture is not None:
            return  # NeMo Gym's own capture has no chain hash
        recomputed = self.chains[call.index]
        if recomputed is None or (parent is not None and self.parent[call.index] != parent.index):
            recomputed = chain_hash(None if parent is None else parent.chain_hash, self.ids_be(call))
        assert call.chain_hash is not None  # checked by record()
        if recomputed != call.chain_hash:
            raise Masked(
                Reason.CHAIN_HASH_MISMATCH,
                f"recomputed {recomputed[:16]}.. != ledger {call.chain_hash[:16]}..",
                call.model_call_id,
            )

    def ids_be(self, call: Call) -> memoryview:
        return self.batch.be_views(call.row)[0]

    def joined_ids_be(self, calls: list[Call]) -> list[memoryview]:
        """The calls' big-endian ids end to end, in as few slices as the batch allows."""
        return self.batch.ids_be_of([c.row for c in calls])

    def record_fault(self, call: Call) -> Masked | None:
        """The first check of this call that fails on its own (off-chain calls)."""
        if call.index not in self._faults:
            try:
                if call.is_poison:
                    raise Masked(Reason.CAPTURE_POISONED, f"poison row: {call.failure_reason}", call.model_call_id)
                self.record(call)
                self.tokens_and_digest(call)
                self._faults[call.index] = None
            except Masked as m:
                # kept without its traceback, whose frames would refer back to this batch
                self._faults[call.index] = m.with_traceback(None)
        return self._faults[call.index]

    def _token_fields(self, call: Call) -> dict | None:
        if call.n_token_rows == 0:
            return None
        return self.tokens.drop_columns(["ids", "mask", "logprobs"]).slice(call.row, 1).to_pylist()[0]


def _raise(fault: Masked | None) -> None:
    """Raise `fault` if any, without a reference cycle: the traceback holds this frame, and
    this frame must not hold the exception (it would keep the whole batch alive)."""
    if fault is not None:
        try:
            raise fault
        finally:
            fault = None


# -- the scalar checks: the message of a call that failed (and the reference the columns follow)


def _explain_record(call: Call, tok: dict | None, batch: TokenBatch) -> Masked | None:
    cid = call.model_call_id

    def fail(reason: Reason, detail: str) -> Masked:
        return Masked(reason, detail, cid)

    if call.n_token_rows == 0:
        return fail(Reason.MISSING_TOKENS, f"no token row with staging_key {call.staging_key}")
    if call.n_token_rows > 1:
        return fail(Reason.DUPLICATE_TOKENS, f"{call.n_token_rows} token rows with staging_key {call.staging_key}")
    if (
        call.schema_version not in SUPPORTED_SCHEMA
        or call.digest_version not in SUPPORTED_DIGEST
        or call.extras_digest_version not in SUPPORTED_EXTRAS
    ):
        return fail(
            Reason.UNSUPPORTED_VERSION,
            f"schema {call.schema_version}, digest {call.digest_version}, extras {call.extras_digest_version}",
        )
    assert tok is not None  # a token row was found above
    null_versions = [n for n in VERSION_FIELDS if tok[n] is None]
    if null_versions:
        return fail(Reason.UNSUPPORTED_VERSION, f"token row: {', '.join(null_versions)} null")
    for name in SHARED_FIELDS:
        mine, theirs = getattr(call, name), tok[name]
        if mine != theirs:
            return fail(Reason.FIELD_MISMATCH, f"{name}: ledger {mine!r} != token row {theirs!r}")
    # a captured row: parse_ledger_row guarantees every custody field (versions checked above)
    assert call.prev_len is not None and call.delta_len is not None and call.cum_len is not None
    assert call.weight_version is not None
    if call.is_root:
        if call.mode != "text" or call.prev_len != 0:
            return fail(
                Reason.INVALID_RECORD,
                f"root must have mode text and prev_len 0 (mode {call.mode!r}, prev_len {call.prev_len})",
            )
    elif call.mode != "token_in" or call.prev_len <= 0:
        return fail(
            Reason.INVALID_RECORD,
            f"child must have mode token_in and prev_len > 0 (mode {call.mode!r}, prev_len {call.prev_len})",
        )
    if call.weight_version < 0:
        return fail(Reason.INVALID_RECORD, f"weight_version {call.weight_version} < 0")
    for name in LEDGER_DIGESTS:
        if not HEX64.fullmatch(getattr(call, name)):
            return fail(Reason.INVALID_RECORD, f"{name} is not 64 lowercase hex digits")
    if call.delta_len < 1:
        return fail(Reason.LENGTH_MISMATCH, f"delta_len {call.delta_len} < 1")
    if call.cum_len != call.prev_len + call.delta_len:
        return fail(
            Reason.LENGTH_MISMATCH,
            f"cum_len {call.cum_len} != prev_len {call.prev_len} + delta_len {call.delta_len}",
        )
    row = call.row
    for name, n in (
        ("token_ids_delta", batch.n_ids[row]),
        ("token_mask_delta", batch.n_mask[row]),
        ("generation_logprobs_delta", batch.n_lp[row]),
    ):
        if n != call.delta_len:
            got = "null" if n < 0 else f"{n} items"
            return fail(Reason.LENGTH_MISMATCH, f"{name} is {got}, delta_len {call.delta_len}")
    return None


def _explain_tokens(call: Call, batch: TokenBatch) -> Masked | None:
    fault = batch.token_fault(call.row)
    return Masked(fault[0], fault[1], call.model_call_id) if fault else None


def _staged_digest(call: Call, batch: TokenBatch) -> str:
    ids_be, mask_be, lp_be = batch.be_views(call.row)
    # record() passed: every field below is set
    assert call.schema_version is not None and call.digest_version is not None
    assert call.extras_digest_version is not None and call.mode is not None
    assert call.prev_len is not None and call.delta_len is not None and call.cum_len is not None
    assert call.weight_version is not None and call.extras_digest is not None
    assert call.chain_hash is not None and call.cumulative_hash is not None
    return staged_call_digest(
        schema_version=call.schema_version,
        digest_version=call.digest_version,
        extras_digest_version=call.extras_digest_version,
        rollout_id=call.rollout_id,
        model_call_id=call.model_call_id,
        parent_call_id=call.parent_call_id,
        mode=call.mode,
        prev_len=call.prev_len,
        delta_len=call.delta_len,
        cum_len=call.cum_len,
        weight_version=call.weight_version,
        ids_be=ids_be,
        mask_be=mask_be,
        logprobs_be=lp_be,
        extras_digest=call.extras_digest,
        chain_hash=call.chain_hash,
        cumulative_hash=call.cumulative_hash,
    )
