"""The public entry point of verification (CONTRACT.md 3): a batch of whole groups of
rollouts, with their calls and token rows, to outcomes (ok with their segments, or masked
with a reason) and advantages. The shard runs it batch after batch; `reassembler explain`
runs it for one rollout."""

from __future__ import annotations

import pyarrow as pa

from ..settings import Options
from .advantage import assign_advantages
from .calls import calls_from_heads
from .checks import BatchChecks
from .rollout import Outcome, reassemble_rollout
from .tokens import TokenBatch


def verify_batch(
    rollouts: list[dict],
    table: pa.Table,
    tokens: pa.Table,
    options: Options,
    trace: dict[str, list[str]] | None = None,
    checks: BatchChecks | None = None,
) -> tuple[list[Outcome], TokenBatch]:
    """Verify whole groups of rollouts: `rollouts` (sql/shard_rollouts.sql's records, in
    output order), `table` their calls' rows (sql/shard_calls.sql: one per token row, capture
    order), `tokens` those token rows, row for row, in the canonical columns of
    formats/token_file.py; `checks` their verdicts, when a stage before computed them (the
    shard's checks thread). Returns each rollout's outcome, advantages assigned, and the
    batch's tokens the rows are cut from. `trace`: collects each rollout's steps (explain)."""
    if checks is None:
        checks = BatchChecks(table, tokens).hash_all()
    by_rollout: dict[str, list] = {}
    for call in calls_from_heads(checks.heads, checks.starts, checks.counts):
        by_rollout.setdefault(call.rollout_id, []).append(call)
    outcomes = []
    for r in rollouts:
        calls = by_rollout.pop(r["rollout_id"], [])
        outcomes.append(
            reassemble_rollout(
                r, calls, checks, options, None if trace is None else trace.setdefault(r["rollout_id"], [])
            )
        )
    if by_rollout:
        raise RuntimeError(f"internal: calls streamed for rollouts outside the batch: {sorted(by_rollout)[:3]}")
    assign_advantages(outcomes, options.std_normalize, options.leave_one_out)
    return outcomes, checks.batch
