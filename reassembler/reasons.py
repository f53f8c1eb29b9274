"""Reason codes: why a rollout was masked (CONTRACT.md section 3).

Each code is defined once, here, with the step of the pipeline that raises it and one line
a person reading the audit table can act on. Everything else imports these names.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # 3.0 rollout checks
    ROLLOUT_FAILED = "rollout_failed"
    INVALID_REWARD = "invalid_reward"
    # 9 which capture is read, and its own checks (NeMo Gym's local mode and rebuilt lines)
    PRODUCER_MASKED = "producer_masked"
    MIXED_CAPTURE = "mixed_capture"
    CAPTURE_RETIRED = "capture_retired"
    CAPTURE_INCOMPLETE = "capture_incomplete"
    EMPTY_LEDGER = "empty_ledger"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    CAPTURE_POISONED = "capture_poisoned"
    # 3.1 select
    UNMATCHED_OUTPUT = "unmatched_output"
    AMBIGUOUS_OUTPUT = "ambiguous_output"
    EMPTY_SELECTION = "empty_selection"
    OUT_OF_CAPTURE_ORDER = "out_of_capture_order"
    TERMINAL_NOT_LAST = "terminal_not_last"
    # 3.2 cut
    MISSING_ROOT = "missing_root"
    BROKEN_CHAIN = "broken_chain"
    # 3.3 finalize: the walk
    MISSING_PARENT = "missing_parent"
    LINEAGE_CYCLE = "lineage_cycle"
    ORDER_MISMATCH = "order_mismatch"
    # 3.3 finalize: per-call checks, in the order they run
    MISSING_TOKENS = "missing_tokens"
    DUPLICATE_TOKENS = "duplicate_tokens"
    UNSUPPORTED_VERSION = "unsupported_version"
    FIELD_MISMATCH = "field_mismatch"
    INVALID_RECORD = "invalid_record"
    LENGTH_MISMATCH = "length_mismatch"
    PARENT_LENGTH_MISMATCH = "parent_length_mismatch"
    PREFIX_MISMATCH = "prefix_mismatch"
    INVALID_TOKEN = "invalid_token"
    INVALID_MASK = "invalid_mask"
    EMPTY_GENERATION = "empty_generation"
    INVALID_LOGPROB = "invalid_logprob"
    DIGEST_MISMATCH = "digest_mismatch"
    CHAIN_HASH_MISMATCH = "chain_hash_mismatch"
    CUMULATIVE_HASH_MISMATCH = "cumulative_hash_mismatch"
    # 3.5 terminal mode
    MISSING_TERMINAL = "missing_terminal"
    HISTORY_REWRITTEN = "history_rewritten"


DESCRIPTIONS: dict[Reason, str] = {
    Reason.ROLLOUT_FAILED: "the harness reported a failure for the rollout",
    Reason.INVALID_REWARD: "the reward is missing or not finite",
    Reason.PRODUCER_MASKED: "NeMo Gym excluded the rollout itself (mask_sample: true in its result line)",
    Reason.MIXED_CAPTURE: "the rollout has both ledger rows and a local-mode .tokens.jsonl: neither is read",
    Reason.CAPTURE_RETIRED: "NeMo Gym retired the local capture and the result line holds no rebuilt tokens",
    Reason.CAPTURE_INCOMPLETE: "local capture lost a call (torn last line, .incomplete, state flag, lone intent)",
    Reason.EMPTY_LEDGER: "the ledger holds no call for the rollout",
    Reason.DUPLICATE_CALL_ID: "two ledger rows share one model_call_id",
    Reason.CAPTURE_POISONED: "a call was admitted but not captured (strict off-chain policy)",
    Reason.UNMATCHED_OUTPUT: "no call produced the output item at this index",
    Reason.AMBIGUOUS_OUTPUT: "several calls could have produced the output item at this index",
    Reason.EMPTY_SELECTION: "nothing selected: no generated output item (verifiers: no trainable branch samples)",
    Reason.OUT_OF_CAPTURE_ORDER: "the selected calls are not in increasing capture order",
    Reason.TERMINAL_NOT_LAST: "the declared terminal call is not the last selected call",
    Reason.MISSING_ROOT: "the first selected call is not a root: the history is incomplete",
    Reason.BROKEN_CHAIN: "a selected call's parent is not the call selected before it",
    Reason.MISSING_PARENT: "the walk to the root reached a parent the ledger (or the trace) does not hold",
    Reason.LINEAGE_CYCLE: "the walk to the root visited a call (or a trace's node) twice",
    Reason.ORDER_MISMATCH: "the leaf-to-root walk does not give back the chain",
    Reason.MISSING_TOKENS: "no token row for the call's staging_key (verifiers: no node holds a token id)",
    Reason.DUPLICATE_TOKENS: "the token store holds several rows for the call's staging_key",
    Reason.UNSUPPORTED_VERSION: "schema, digest, extras (or verifiers trace) version not supported",
    Reason.FIELD_MISMATCH: "the ledger and the token row disagree on a field",
    Reason.INVALID_RECORD: "root/child invariants broken (parent, mode, prev_len), or a trace's JSON types",
    Reason.LENGTH_MISMATCH: "lengths disagree with each other or with the token lists",
    Reason.PARENT_LENGTH_MISMATCH: "the parent's cum_len is not the child's prev_len",
    Reason.PREFIX_MISMATCH: "the child's prompt does not start with its parent's tokens (local or rebuilt capture)",
    Reason.INVALID_TOKEN: "a token id outside [0, 2**31)",
    Reason.INVALID_MASK: "a mask value other than 0/1, or a 1 before a 0 (verifiers: or on an unsampled node)",
    Reason.EMPTY_GENERATION: "the call generated no token (no mask 1)",
    Reason.INVALID_LOGPROB: "a logprob not finite, or not 0.0 under mask 0 (verifiers: or above 0)",
    Reason.DIGEST_MISMATCH: "a recomputed digest differs (staged record, or NeMo Gym's local-mode tokens)",
    Reason.CHAIN_HASH_MISMATCH: "the recomputed chain hash differs from the ledger's",
    Reason.CUMULATIVE_HASH_MISMATCH: "the hash of the joined row differs from the leaf's cumulative_hash",
    Reason.MISSING_TERMINAL: "terminal mode: the leaf call is unknown or a poison row",
    Reason.HISTORY_REWRITTEN: "terminal mode: several roots (context compaction), or a trace of several rows",
}

# The step of the pipeline that raises each code (the audit report groups by it).
STEPS: dict[Reason, str] = {}
for _step, _codes in (
    (
        "rollout checks",
        "ROLLOUT_FAILED INVALID_REWARD PRODUCER_MASKED MIXED_CAPTURE CAPTURE_RETIRED CAPTURE_INCOMPLETE "
        "EMPTY_LEDGER DUPLICATE_CALL_ID CAPTURE_POISONED",
    ),
    ("select", "UNMATCHED_OUTPUT AMBIGUOUS_OUTPUT EMPTY_SELECTION OUT_OF_CAPTURE_ORDER TERMINAL_NOT_LAST"),
    ("cut", "MISSING_ROOT BROKEN_CHAIN"),
    ("finalize", "MISSING_PARENT LINEAGE_CYCLE ORDER_MISMATCH MISSING_TERMINAL HISTORY_REWRITTEN"),
    (
        "record checks",
        "MISSING_TOKENS DUPLICATE_TOKENS UNSUPPORTED_VERSION FIELD_MISMATCH INVALID_RECORD "
        "LENGTH_MISMATCH PARENT_LENGTH_MISMATCH PREFIX_MISMATCH INVALID_TOKEN INVALID_MASK EMPTY_GENERATION "
        "INVALID_LOGPROB DIGEST_MISMATCH CHAIN_HASH_MISMATCH CUMULATIVE_HASH_MISMATCH",
    ),
):
    STEPS.update({Reason[c]: _step for c in _codes.split()})


class Masked(Exception):
    """Raised inside the per-rollout steps: the rollout is masked with `reason`."""

    def __init__(self, reason: Reason, detail: str | None = None, call_id: str | None = None):
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason
        self.detail = detail
        self.call_id = call_id
