"""One ledger row joined with its token rows, and the record checks that need no other call.

`Call` is what select, cut and finalize work on. Its token lists live in a shared
`TokenBatch`; `token_rows` are its row numbers there (none, one, or several when the
token store holds duplicates).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .digests import staged_call_digest
from .gym_fingerprint import VERSION as FINGERPRINT_VERSION
from .reasons import Masked, Reason
from .records import HEX64, SHARED_FIELDS, VERSION_DEFAULTS

VERSION_FIELDS = tuple(VERSION_DEFAULTS)

SUPPORTED_SCHEMA = (2, 3)
SUPPORTED_DIGEST = (2,)
SUPPORTED_EXTRAS = (1,)


@dataclass(slots=True, eq=False)
class Call:
    rollout_id: str
    capture_seq: int
    model_call_id: str
    parent_call_id: str | None
    mode: str | None
    prev_len: int | None
    delta_len: int | None
    cum_len: int | None
    weight_version: int | None
    schema_version: int | None
    digest_version: int | None
    extras_digest_version: int | None
    digest: str | None
    extras_digest: str | None
    chain_hash: str | None
    cumulative_hash: str | None
    staging_key: str
    response_id: str | None
    output_items: list[tuple[str | None, str]] | None  # None: the row carries no output_items
    output_fingerprint: str | None  # NeMo Gym's evidence, only when usable (version 2, 64 hex)
    failure_reason: str | None
    token_rows: list[int] = field(default_factory=list)
    token_fields: dict | None = None  # the t_ columns of the first token row, unprefixed
    _fault: tuple | None = None

    @property
    def is_poison(self) -> bool:
        return self.failure_reason is not None

    @property
    def is_root(self) -> bool:
        """A poison row is never a root (CONTRACT.md 3.6): it says nothing of its place."""
        return self.parent_call_id is None and self.failure_reason is None

    @property
    def token_row(self) -> int:
        return self.token_rows[0]

    # -- checks of CONTRACT.md 3.3, in table order. `fault_*` raise Masked.

    def check_record(self, batch) -> None:
        """missing/duplicate tokens, versions, shared fields, invariants, lengths."""
        cid = self.model_call_id
        if not self.token_rows:
            raise Masked(Reason.MISSING_TOKENS, f"no token row with staging_key {self.staging_key}", cid)
        if len(self.token_rows) > 1:
            raise Masked(
                Reason.DUPLICATE_TOKENS, f"{len(self.token_rows)} token rows with staging_key {self.staging_key}", cid
            )
        if (
            self.schema_version not in SUPPORTED_SCHEMA
            or self.digest_version not in SUPPORTED_DIGEST
            or self.extras_digest_version not in SUPPORTED_EXTRAS
        ):
            raise Masked(
                Reason.UNSUPPORTED_VERSION,
                f"schema {self.schema_version}, digest {self.digest_version}, extras {self.extras_digest_version}",
                cid,
            )
        tok = self.token_fields
        assert tok is not None  # a token row was found above
        null_versions = [n for n in VERSION_FIELDS if tok[n] is None]
        if null_versions:
            raise Masked(Reason.UNSUPPORTED_VERSION, f"token row: {', '.join(null_versions)} null", cid)
        for name in SHARED_FIELDS:
            mine, theirs = getattr(self, name), tok[name]
            if mine != theirs:
                raise Masked(Reason.FIELD_MISMATCH, f"{name}: ledger {mine!r} != token row {theirs!r}", cid)
        # a captured row: parse_ledger_row guarantees every custody field (versions checked above)
        assert self.prev_len is not None and self.delta_len is not None and self.cum_len is not None
        assert self.weight_version is not None
        if self.is_root:
            if self.mode != "text" or self.prev_len != 0:
                raise Masked(
                    Reason.INVALID_RECORD,
                    f"root must have mode text and prev_len 0 (mode {self.mode!r}, prev_len {self.prev_len})",
                    cid,
                )
        elif self.mode != "token_in" or self.prev_len <= 0:
            raise Masked(
                Reason.INVALID_RECORD,
                f"child must have mode token_in and prev_len > 0 (mode {self.mode!r}, prev_len {self.prev_len})",
                cid,
            )
        if self.weight_version < 0:
            raise Masked(Reason.INVALID_RECORD, f"weight_version {self.weight_version} < 0", cid)
        for name in ("digest", "extras_digest", "chain_hash", "cumulative_hash"):
            if not HEX64.fullmatch(getattr(self, name)):
                raise Masked(Reason.INVALID_RECORD, f"{name} is not 64 lowercase hex digits", cid)
        if self.delta_len < 1:
            raise Masked(Reason.LENGTH_MISMATCH, f"delta_len {self.delta_len} < 1", cid)
        if self.cum_len != self.prev_len + self.delta_len:
            raise Masked(
                Reason.LENGTH_MISMATCH,
                f"cum_len {self.cum_len} != prev_len {self.prev_len} + delta_len {self.delta_len}",
                cid,
            )
        row = self.token_row
        for name, n in (
            ("token_ids_delta", batch.n_ids[row]),
            ("token_mask_delta", batch.n_mask[row]),
            ("generation_logprobs_delta", batch.n_lp[row]),
        ):
            if n != self.delta_len:
                got = "null" if n < 0 else f"{n} items"
                raise Masked(Reason.LENGTH_MISMATCH, f"{name} is {got}, delta_len {self.delta_len}", cid)

    def check_tokens(self, batch) -> memoryview:
        """token ids, mask, logprobs, then the staged-record digest. Returns the call's
        token ids as big-endian u64 bytes (for the chain and cumulative hashes)."""
        fault = batch.token_fault(self.token_row)
        if fault:
            raise Masked(fault[0], fault[1], self.model_call_id)
        ids_be, mask_be, lp_be = batch.be_views(self.token_row)
        # check_record passed: every field below is set
        assert self.schema_version is not None and self.digest_version is not None
        assert self.extras_digest_version is not None and self.mode is not None
        assert self.prev_len is not None and self.delta_len is not None and self.cum_len is not None
        assert self.weight_version is not None and self.extras_digest is not None and self.digest is not None
        assert self.chain_hash is not None and self.cumulative_hash is not None
        recomputed = staged_call_digest(
            schema_version=self.schema_version,
            digest_version=self.digest_version,
            extras_digest_version=self.extras_digest_version,
            rollout_id=self.rollout_id,
            model_call_id=self.model_call_id,
            parent_call_id=self.parent_call_id,
            mode=self.mode,
            prev_len=self.prev_len,
            delta_len=self.delta_len,
            cum_len=self.cum_len,
            weight_version=self.weight_version,
            ids_be=ids_be,
            mask_be=mask_be,
            logprobs_be=lp_be,
            extras_digest=self.extras_digest,
            chain_hash=self.chain_hash,
            cumulative_hash=self.cumulative_hash,
        )
        if recomputed != self.digest:
            raise Masked(
                Reason.DIGEST_MISMATCH,
                f"recomputed {recomputed[:16]}.. != ledger {self.digest[:16]}..",
                self.model_call_id,
            )
        return ids_be

    def record_fault(self, batch) -> Masked | None:
        """The first record check of this call that fails on its own (off-chain faults)."""
        if self._fault is None:
            try:
                if self.is_poison:
                    raise Masked(Reason.CAPTURE_POISONED, f"poison row: {self.failure_reason}", self.model_call_id)
                self.check_record(batch)
                self.check_tokens(batch)
                self._fault = (None,)
            except Masked as m:
                self._fault = (m,)
        return self._fault[0]


def _evidence(fingerprint: str | None, version: int | None) -> str | None:
    """NeMo Gym's output_fingerprint counts as evidence only at version 2 and as 64 hex."""
    if version == FINGERPRINT_VERSION and fingerprint is not None and HEX64.fullmatch(fingerprint):
        return fingerprint
    return None


def calls_from_rows(rows: list[dict]) -> list[Call]:
    """Group the joined rows of one rollout (capture order, one per token row) into calls.
    `rows` carry `_row`, the row number in the unit's TokenBatch, and `token_fields`, the
    token row's scalar columns (absent token row: `t_file` is null)."""
    calls: list[Call] = []
    for r in rows:
        if calls and calls[-1].capture_seq == r["capture_seq"]:
            calls[-1].token_rows.append(r["_row"])
            continue
        call = Call(
            rollout_id=r["rollout_id"],
            capture_seq=r["capture_seq"],
            model_call_id=r["model_call_id"],
            parent_call_id=r["parent_call_id"],
            mode=r["mode"],
            prev_len=r["prev_len"],
            delta_len=r["delta_len"],
            cum_len=r["cum_len"],
            weight_version=r["weight_version"],
            schema_version=r["schema_version"],
            digest_version=r["digest_version"],
            extras_digest_version=r["extras_digest_version"],
            digest=r["digest"],
            extras_digest=r["extras_digest"],
            chain_hash=r["chain_hash"],
            cumulative_hash=r["cumulative_hash"],
            staging_key=r["staging_key"],
            response_id=r["response_id"],
            output_items=None
            if r["output_items"] is None
            else [(i["id"], i["fingerprint"]) for i in r["output_items"]],
            output_fingerprint=_evidence(r["output_fingerprint"], r["fingerprint_version"]),
            failure_reason=r["failure_reason"],
        )
        if r["t_file"] is not None:
            call.token_rows.append(r["_row"])
            call.token_fields = r["token_fields"]
        calls.append(call)
    return calls
