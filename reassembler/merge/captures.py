"""The merge's half of NeMo Gym's own capture (load/gym_capture.py reads it in the parts):
given-up samples, which capture each rollout is read from, and which part's derived calls it
keeps, decided once over the whole night's rollouts (merge/rollouts.py), never per call.
"""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa

from ..errors import InputError
from ..formats.night import NightFiles
from ..load.gym_capture import GymSummary, capture_files
from ..load.inserter import ROLLOUT_ROWS, Inserter, IntoWarehouse
from ..warehouse import run_script, sql

GIVE_UP_ATTEMPTS = 3  # NeMo Gym's default NEMO_GYM_MAX_ROLLOUT_ATTEMPTS (CONTRACT.md 2.1)


def decide(
    con, night: NightFiles, rollout_count: int, failures_read: int, failures_rejected: int = 0
) -> tuple[GymSummary, set[str]]:
    """The merge's half (merge/rollouts.py), over the parts' per-rollout tables (p_samples,
    p_failures, p_outcomes, p_calls) once the rollouts (m_kept) are in: given-up samples,
    which capture each rollout is read from (its columns set), and `derived_owners`, the
    part and kind whose derived calls each rollout keeps (the merge's buckets take them).
    Returns the summary and the failed attempts' keys."""
    summary = GymSummary(failures_read=failures_read, failures_rejected=failures_rejected)
    failed = _given_up(con, night, summary, rollout_count)
    [[summary.rebuilt]] = con.execute("SELECT count(*) FROM m_kept WHERE capture = 'rebuilt'").fetchall()
    every = capture_files(night.captures, None)
    keys = pa.table(
        {
            "rollout_id": pa.array(sorted(every), pa.string()),
            "entries": pa.array([every[k].entries for k in sorted(every)], pa.string()),
        }
    )
    con.register("capture_keys", keys)
    decisions = con.execute(sql("merge_captures"), {"ds": night.ds}).fetchall()
    con.unregister("capture_keys")
    columns: list[dict] = []
    owners: list[tuple[int, str, str]] = []
    for key, entries, is_rollout, from_line, staged, part, n_lines, reason, detail, call_id, error in decisions:
        if from_line:
            continue  # read from its own line only (a rebuilt line 9.10, a verifiers trace 10.3)
        if not is_rollout:
            if key not in failed:
                summary.not_read.append(key)
            continue
        if staged:
            if entries is not None:
                summary.mixed += 1
                columns.append(
                    {
                        "rollout_id": key,
                        "capture": "staged",
                        "capture_reason": "mixed_capture",
                        "capture_detail": f"ledger rows and {entries}: neither is read",
                    }
                )
            continue
        if error is not None:
            raise InputError(error)
        assert part is not None, f"internal: capture {key} was read by no part"
        summary.local_rollouts += 1
        summary.local_entries += n_lines
        column: dict[str, str | None] = {"rollout_id": key, "capture": "local"}
        if reason is not None:
            summary.local_masked += 1
            column.update(capture_reason=reason, capture_detail=detail, capture_call_id=call_id)
        columns.append(column)
        owners.append((part, key, "local"))
    owned = pa.table(
        {
            "part": pa.array([p for p, _, _ in owners], pa.int64()),
            "rollout_id": pa.array([r for _, r, _ in owners], pa.string()),
            "kind": pa.array([k for _, _, k in owners], pa.string()),
        }
    )
    con.register("local_owners", owned)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE derived_owners AS SELECT part, rollout_id, kind FROM local_owners "
        "UNION ALL SELECT part, rollout_id, capture FROM m_kept "
        "WHERE capture IN ('rebuilt', 'verifiers', 'envelope', 'art')"
    )
    con.unregister("local_owners")
    con.register("captures", pa.Table.from_pylist(columns, schema=CAPTURE_COLUMNS))
    run_script(con, "set_capture", {"ds": night.ds})
    con.unregister("captures")
    return summary, failed


def _given_up(con, night: NightFiles, summary: GymSummary, rollout_count: int) -> set[str]:
    """The failed attempts' keys, and a rollout row per given-up sample (CONTRACT.md 2.1):
    a sample no result line of the night has, whose attempts ended terminal or reached
    GIVE_UP_ATTEMPTS, named after its last attempt (files by name, then lines)."""
    rows = con.execute(
        "SELECT file, line, key, task, sample, terminal, failure_class FROM p_failures ORDER BY part, line_order"
    ).fetchall()
    failed = {key for _, _, key, *_ in rows}
    if not rows:
        return failed
    samples = set(
        con.execute(
            "SELECT DISTINCT s.task, s.sample FROM p_samples s JOIN m_kept k USING (part, rollout_id) "
            "SEMI JOIN p_failures f ON f.task = s.task AND f.sample = s.sample"
        ).fetchall()
    )
    keys = {
        k
        for (k,) in con.execute(
            "SELECT DISTINCT rollout_id FROM m_kept SEMI JOIN p_failures f ON f.key = m_kept.rollout_id"
        ).fetchall()
    }
    per_sample: dict[tuple[int, int], list[tuple[str, int, dict]]] = defaultdict(list)
    for rel, line, key, task, sample, terminal, failure_class in rows:
        if task is not None and sample is not None:
            per_sample[(task, sample)].append(
                (rel, line, {"key": key, "terminal": terminal, "failure_class": failure_class})
            )
    seq = rollout_count
    given_up = Inserter(IntoWarehouse(con, "insert_rollouts", night.ds), ROLLOUT_ROWS)
    for sample, attempts in sorted(per_sample.items()):
        if sample in samples:
            continue  # a result line of the night has it
        if not (any(r["terminal"] for _, _, r in attempts) or len(attempts) >= GIVE_UP_ATTEMPTS):
            continue  # Gym would dispatch it again on resume
        rel, line, last = attempts[-1]
        if last["key"] in keys:
            continue
        seq += 1
        keys.add(last["key"])
        summary.given_up += 1
        given_up.add(
            {
                "rollout_seq": seq,
                "rollout_id": last["key"],
                "group_id": str(sample[0]),
                "slot": sample[1],
                "failure_reason": last["failure_class"],
                "n_output_items": 0,
                "source_file": rel,
                "source_line": line,
                "capture": "none",
            }
        )
    given_up.flush()
    return failed


CAPTURE_COLUMNS = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("capture", pa.string()),
        ("capture_reason", pa.string()),
        ("capture_detail", pa.string()),
        ("capture_call_id", pa.string()),
    ]
)
