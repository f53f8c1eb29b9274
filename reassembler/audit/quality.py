"""Capture quality of one night, from the warehouse alone (no token reads): the numbers of
the nightly report (report_html.py), and the quality gate that turns them into alerts.

`night_quality` gathers, for one night and the nights before it:

- the headline (rollouts, ok, masked, mask rate, rows, tokens published, tokens and rows
  lost to masking, rejected input lines) and its change against the trailing 7 nights;
- trends over the last `nights` nights and the mask reasons of each;
- per reason: count, share, the step that raises it, its meaning, a few example rollouts
  with the trace of their selection and lineage (replayed from the ledger);
- mask-rate breakdowns by capture (staged, NeMo Gym local mode, Gym-rebuilt lines), weight
  version, model server, metadata keys and rollout size;
- compaction: rollouts with several roots, segments per rollout, off-chain calls and faults,
  and what compaction-aware selection keeps that ordinary capture (`--mode terminal`) masks;
- rejected input by source and kind, with the first lines of each kind.

`gate` checks a night against `Thresholds` and returns the breaches; `record_verdict`
keeps the verdict in the warehouse's `quality` table, which the report shows.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import date

from ..reasons import DESCRIPTIONS, STEPS, Reason
from ..settings import REPORT_NIGHTS, Thresholds
from ..warehouse import run_script, sql

TRAILING = 7
CALL_BUCKETS = (5, 10, 20, 40)
TOKEN_BUCKETS = (10_000, 50_000, 200_000)
MAX_KEY_VALUES = 30  # a metadata key with more distinct values is no default breakdown
CAPTURE_LABELS = {  # which capture a rollout was read from (CONTRACT.md 9)
    "staged": "staged",
    "local": "NeMo Gym local mode",
    "rebuilt": "Gym-rebuilt line",
    "verifiers": "verifiers trace",
    "envelope": "Gym compaction envelope",
    "art": "OpenPipe ART",
    "none": "none (no capture; given-up samples)",
    "unknown": "unknown (past the retention)",
}


def _bucket(value: int, edges: tuple[int, ...]) -> tuple[int, str]:
    """(order, label) of the size bucket holding `value`."""
    lo = 0
    for k, edge in enumerate(edges):
        if value <= edge:
            return k, f"{lo + 1 if lo else 0:,}-{edge:,}"
        lo = edge
    return len(edges), f"> {edges[-1]:,}"


def _rates(groups: dict, ordered: bool = False) -> list[dict]:
    """One entry per value: its rollouts, masked ones and mask rate. `ordered`: the keys are
    (order, label) and give the order; else the values come most frequent first."""
    out = []
    for value, masked in sorted(groups.items()) if ordered else groups.items():
        n = len(masked)
        label = value[1] if ordered else value
        out.append({"value": label, "rollouts": n, "masked": sum(masked), "mask_rate": sum(masked) / n if n else 0.0})
    return out if ordered else sorted(out, key=lambda r: (-r["rollouts"], r["value"]))


def _version(wv) -> tuple[int, str]:
    """A weight version's place on its axis: in numeric order, the rollouts without one last."""
    return (2**63, "(no ledger)") if wv is None else (int(wv), str(wv))


def _breakdowns(rollouts: list[dict], by: list[str] | None) -> tuple[dict[str, list[dict]], list[str]]:
    metadata = [json.loads(r["metadata"]) if r["metadata"] else {} for r in rollouts]
    if by is None:  # keys present on most rollouts, with few enough values to read
        counts = Counter(k for m in metadata if isinstance(m, dict) for k in m)
        by = [
            k
            for k, n in counts.most_common()
            if n * 2 >= len(rollouts)
            and len({json.dumps(m.get(k)) for m in metadata if isinstance(m, dict)}) <= MAX_KEY_VALUES
        ]
    groups: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for r, m in zip(rollouts, metadata):
        masked = r["status"] == "masked"
        groups["capture"][CAPTURE_LABELS.get(r["capture"], r["capture"])].append(masked)
        wv = r["weight_version"]
        groups["weight version"][_version(wv)].append(masked)
        groups["model server"][r["model_server"] or "(one capture folder)"].append(masked)
        for key in by:
            v = m.get(key) if isinstance(m, dict) else None
            groups[f"metadata: {key}"][str(v) if v is not None else "(none)"].append(masked)
        groups["calls per rollout"][_bucket(r["n_ledger_calls"] or 0, CALL_BUCKETS)].append(masked)
        groups["declared tokens"][_bucket(r["declared_tokens"] or 0, TOKEN_BUCKETS)].append(masked)
    sizes = ("weight version", "calls per rollout", "declared tokens")  # in their own order
    return {name: _rates(g, ordered=name in sizes) for name, g in groups.items()}, by


def _compaction(rollouts: list[dict]) -> dict:
    ok = [r for r in rollouts if r["status"] == "ok"]
    # terminal mode masks these history_rewritten: several roots, or a verifiers trace of several rows
    saved = [
        r
        for r in ok
        if (r["n_roots"] or 0) > 1 or (r.get("capture") in ("verifiers", "envelope") and r["n_segments"] > 1)
    ]
    return {
        "compacted": sum((r["n_roots"] or 0) > 1 for r in rollouts),
        "segments": dict(sorted(Counter(r["n_segments"] for r in ok).items())),
        "offchain_calls": sum(r["n_offchain"] or 0 for r in rollouts),
        "offchain_faults": sum(r["n_offchain_faults"] or 0 for r in rollouts),
        "saved_rollouts": len(saved),
        "saved_rows": sum(r["n_segments"] for r in saved),
        "saved_tokens": sum(r["n_tokens"] for r in saved),
    }


def _diagnosed(rollouts: list[dict]) -> list[dict]:
    """Rollouts whose producer named a failure beside its verdict (NeMo Gym's `failure_kind`,
    kept in the audit's metadata: CONTRACT.md 3.0 item 1), by kind: how many trained (a
    degraded sample still measured validly) and how many were masked."""
    kinds: dict[str, list[bool]] = defaultdict(list)
    for r in rollouts:
        m = json.loads(r["metadata"]) if r["metadata"] else None
        if isinstance(m, dict) and (m.get("failure_kind") is not None or m.get("failure_reason") is not None):
            kinds[str(m.get("failure_kind") or "(no kind)")].append(r["status"] == "ok")
    return [
        {"failure_kind": k, "rollouts": len(v), "ok": sum(v), "masked": len(v) - sum(v)}
        for k, v in sorted(kinds.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]


def _art(rollouts: list[dict]) -> dict:
    """OpenPipe ART's rollouts (CONTRACT.md 13.6): the groups whose ok rollouts' rewards are
    all equal (advantage 0 on every row: ART drops them from its batch, the rows are kept),
    and the rollouts stored as a duplicate of an earlier one of their group."""
    art = [r for r in rollouts if r.get("capture") == "art"]
    groups: dict[str, set] = defaultdict(set)
    for r in art:
        if r["status"] == "ok":
            groups[r["group_id"]].add(r["reward"])
    flat = [g for g, rewards in groups.items() if len(rewards) == 1]
    duplicates = sum("duplicate_of" in (json.loads(r["metadata"] or "{}") or {}) for r in art)
    return {
        "rollouts": len(art),
        "zero_variance_groups": len(flat),
        "zero_variance_rollouts": sum(r["group_id"] in set(flat) and r["status"] == "ok" for r in art),
        "duplicates": duplicates,
    }


MASKED_COLUMNS = (
    "ds",
    "rollout_id",
    "group_id",
    "slot",
    "reason",
    "failed_call_id",
    "detail",
    "capture",
    "agent",
    "env",
    "model_server",
    "declared_tokens",
)


def masked_rollouts(con, ds: str) -> list[dict]:
    """Every masked rollout of night `ds` with what an auditor filters by (agent, env, model
    server, capture: the audit table's codes, `local` not its label) and the tokens its ledger
    declared, in output order (the report's list and its CSV / Parquet downloads, which
    carry the night as `ds`)."""
    cur = con.execute(sql("quality_rollouts"), {"ds": ds})
    names = [d[0] for d in cur.description]
    out = []
    for row in cur.fetchall():
        r = dict(zip(names, row), ds=ds)
        if r["status"] == "masked":
            r["capture"] = r["audit_capture"]
            out.append({k: r[k] for k in MASKED_COLUMNS})
    return out


def masked_file(ds: str, suffix: str) -> str:
    """The name of a night's masked-rollouts download (`masked-2026-11-28.csv`): each night's
    file downloads under a name of its own."""
    return f"masked-{ds}.{suffix}"


def night_quality(
    con, ds: str, nights: int = REPORT_NIGHTS, by: list[str] | None = None, examples: int = 3, traces: bool = True
) -> dict:
    """Everything the report shows for night `ds` (a JSON-able dict)."""
    from .explain import ledger_trace

    params = {"ds": ds, "nights": nights}
    trend = _trend(con, ds, nights)
    night = next((r for r in trend if r["ds"] == ds), None)
    if night is None:
        return {"ds": ds, "night": None, "trend": trend}
    before = [r for r in trend if r["ds"] < ds][-TRAILING:]
    keys = ("rollouts", "ok", "masked", "mask_rate", "rows", "tokens", "tokens_lost", "rows_lost", "rejects")
    baseline = {k: sum(r[k] for r in before) / len(before) for k in keys} if before else None

    reasons_by_night = [
        {"ds": d.isoformat(), "reason": r, "n": n} for d, r, n in con.execute(sql("quality_reasons"), params).fetchall()
    ]
    tonight = [x for x in reasons_by_night if x["ds"] == ds]
    example_rows = con.execute(sql("quality_examples"), {"ds": ds, "per_reason": examples}).fetchall()
    by_reason: dict[str, list[dict]] = defaultdict(list)
    for reason, rid, failed, detail in example_rows:
        by_reason[reason].append(
            {
                "rollout_id": rid,
                "failed_call_id": failed,
                "detail": detail,
                "trace": ledger_trace(con, ds, rid) if traces else [],
            }
        )
    reasons = [
        {
            "reason": x["reason"],
            "n": x["n"],
            "share": x["n"] / night["rollouts"],
            "step": STEPS[Reason(x["reason"])],
            "meaning": DESCRIPTIONS[Reason(x["reason"])],
            "examples": by_reason.get(x["reason"], []),
        }
        for x in tonight
    ]

    cur = con.execute(sql("quality_rollouts"), {"ds": ds})
    names = [d[0] for d in cur.description]
    rollouts = [dict(zip(names, row)) for row in cur.fetchall()]
    breakdowns, keys_used = _breakdowns(rollouts, by)
    masked = [r for r in rollouts if r["status"] == "masked"]
    lost: dict[str, int] = defaultdict(int)
    by_capture: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in masked:
        lost[r["reason"]] += r["declared_tokens"] or 0
        capture = str(r["capture"])
        by_capture[r["reason"]][CAPTURE_LABELS.get(capture, capture)] += 1
    for x in reasons:
        x["tokens_lost"] = lost.get(x["reason"], 0)
    rejects = [
        {"source": s, "kind": k, "n": n, "first": first}
        for s, k, n, first in con.execute(sql("quality_rejects"), {"ds": ds}).fetchall()
    ]
    verdicts = _verdicts(con, ds, nights)
    return {
        "ds": ds,
        "night": night,
        "baseline": baseline,
        "trailing_nights": len(before),
        "trend": trend,
        "reasons_by_night": reasons_by_night,
        "reasons": reasons,
        "breakdowns": breakdowns,
        "metadata_keys": keys_used,
        "compaction": _compaction(rollouts),
        "diagnosed": _diagnosed(rollouts),
        "art": _art(rollouts),
        "reason_by_capture": {reason: dict(captures) for reason, captures in by_capture.items()},
        "rejects": rejects,
        "verdicts": verdicts,
    }


def _table_exists(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name]).fetchone()[0])


def _trend(con, ds: str, nights: int) -> list[dict]:
    cur = con.execute(sql("quality_nights"), {"ds": ds, "nights": nights})
    names = [d[0] for d in cur.description]
    trend = [dict(zip(names, row)) for row in cur.fetchall()]
    for row in trend:
        row["ds"] = row["ds"].isoformat() if isinstance(row["ds"], date) else str(row["ds"])
        row["mask_rate"] = float(row["mask_rate"])
    return trend


def _verdicts(con, ds: str, nights: int) -> list[dict]:
    if not _table_exists(con, "quality"):  # a warehouse no build of this version has written yet
        return []
    return [
        {
            "ds": d.isoformat(),
            "verdict": v,
            "breaches": breaches_of(json.loads(b or "[]")),
            "checks": json.loads(b or "[]"),
            "checked_at": str(t),
        }
        for d, v, b, t in con.execute(sql("quality_verdicts"), {"ds": ds, "nights": nights}).fetchall()
    ]


def nights_overview(con) -> dict:
    """Every published night's headline and gate verdict (the report's index page)."""
    latest = con.execute("SELECT max(ds) FROM runs").fetchone()[0]
    if latest is None:
        return {"trend": [], "verdicts": []}
    return {"trend": _trend(con, latest.isoformat(), 100_000), "verdicts": _verdicts(con, latest.isoformat(), 100_000)}


WARN_SHARE = 0.8  # a check whose value reaches this share of its limit warns before it breaches


def gate_checks(quality: dict, thresholds: Thresholds) -> list[dict]:
    """Every enabled check of the gate on a night: its value against its limit, the margin
    left (limit - value), and its status: `breach` above the limit, `warn` from WARN_SHARE of
    the limit up to it (at the limit included), else `ok`; with a one-line message.

    A rate check (mask rate, one reason's share, the rise) over its limit on a night of fewer
    than `thresholds.min_rollouts` rollouts warns instead: a few rollouts make no rate. The
    rejects check counts rejected input lines but a file's crash-torn final line; torn lines
    are a check of their own that warns (limit None)."""
    night, checks = quality["night"], []
    t = thresholds
    small = night["rollouts"] < t.min_rollouts

    def check(name: str, value, limit, text: str, rate: bool = False) -> None:
        if value > limit:
            status = "breach"
        elif limit > 0 and value >= WARN_SHARE * limit:
            status = "warn"
        else:
            status = "ok"
        sign = ">" if status == "breach" else "<="
        message = f"{text} {sign} {limit:.3f}" if isinstance(limit, float) else f"{text} {sign} {limit}"
        if status == "breach" and rate and small:
            status = "warn"
            message += f" (warns only: {night['rollouts']} rollouts, under the gate's minimum of {t.min_rollouts})"
        checks.append(
            {
                "check": name,
                "value": value,
                "threshold": limit,
                "margin": limit - value,
                "status": status,
                "message": message,
            }
        )

    if t.max_mask_rate is not None:
        check(
            "mask_rate",
            night["mask_rate"],
            t.max_mask_rate,
            f"mask rate {night['mask_rate']:.3f} ({night['masked']}/{night['rollouts']})",
            rate=True,
        )
    if t.max_reason_rate is not None:
        for r in quality["reasons"]:
            check(
                f"reason:{r['reason']}",
                r["share"],
                t.max_reason_rate,
                f"{r['reason']} masks {r['share']:.3f} of rollouts ({r['n']})",
                rate=True,
            )
    base = quality.get("baseline")
    if t.max_mask_rate_rise is not None and base is not None:
        rise = night["mask_rate"] - base["mask_rate"]
        check(
            "mask_rate_rise",
            rise,
            t.max_mask_rate_rise,
            f"mask rate {night['mask_rate']:.3f} is {rise:+.3f} over the trailing "
            f"{quality['trailing_nights']}-night mean {base['mask_rate']:.3f}",
            rate=True,
        )
    torn = night.get("torn_lines") or 0
    if t.max_rejects is not None:
        rejects = night["rejects"] - torn
        check(
            "rejects",
            rejects,
            t.max_rejects,
            f"{rejects} rejected input lines" + (f" (and {torn} torn)" if torn else ""),
        )
    if torn:
        checks.append(
            {
                "check": "torn_final_lines",
                "value": torn,
                "threshold": None,
                "margin": None,
                "status": "warn",
                "message": f"{torn} files end in a torn line (a producer stopped mid-write): rejected, no breach",
            }
        )
    return checks


def gate(quality: dict, thresholds: Thresholds) -> list[dict]:
    """The breached thresholds of a night, each with its numbers and a one-line message."""
    return [c for c in gate_checks(quality, thresholds) if c["status"] == "breach"]


def check_lines(checks: list[dict]) -> list[str]:
    """One line a check: status, name, value against limit, margin (the gate's output)."""

    def shown(x) -> str:
        return f"{x:.3f}" if isinstance(x, float) else "-" if x is None else str(x)

    return [
        f"{c['status']:<7}{c['check']:<34}{shown(c['value']):>9} against limit {shown(c['threshold']):>7}, "
        f"margin {shown(c['margin'])}"
        for c in checks
    ] or ["no check enabled"]


def breaches_of(checks: list[dict]) -> list[dict]:
    """The breaches among a recorded verdict's checks (a verdict recorded before checks had a
    status lists its breaches only)."""
    return [c for c in checks if c.get("status", "breach") == "breach"]


GATE_JSON_VERSION = 1  # `reassembler gate --json`'s shape (README, Alerts): a new key is no new version


def gate_document(ds: str, checks: list[dict], thresholds: Thresholds) -> dict:
    """What `reassembler gate --json` prints, for a monitoring system: the verdict (`breached`
    when a check breached, else `warn` when one warned, else `ok`), the exit code that goes
    with it, and every check with its value, limit, level (ok, warn, breach), margin (limit -
    value; null for a check without a limit) and one-line message."""
    from ..errors import EXIT_GATE

    levels = {c["status"] for c in checks}
    verdict = "breached" if "breach" in levels else "warn" if "warn" in levels else "ok"
    return {
        "version": GATE_JSON_VERSION,
        "ds": ds,
        "verdict": verdict,
        "exit_code": EXIT_GATE if verdict == "breached" else 0,
        "min_rollouts": thresholds.min_rollouts,
        "checks": [
            {
                "check": c["check"],
                "value": c["value"],
                "limit": c["threshold"],
                "level": c["status"],
                "margin": c["margin"],
                "message": c["message"],
            }
            for c in checks
        ],
    }


def record_verdict(con, ds: str, run_id: str | None, checks: list[dict]) -> None:
    """The night's verdict with every check it ran (quality.breaches: JSON, each with its status)."""
    verdict = "breached" if breaches_of(checks) else "ok"
    run_script(con, "record_verdict", {"ds": ds, "run_id": run_id, "verdict": verdict, "breaches": json.dumps(checks)})
