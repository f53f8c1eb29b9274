"""Publish a staged night: verify its numbers, then swap whole partitions in.

Shards write into `<output>/_staging/<ds>/<run_id>/{rows,audit}/`. `verify_staged` runs
sql/audit_checks.sql over those files; `publish_staged` then replaces
`<output>/{rows,audit}/ds=<ds>/` by renaming directories (same filesystem, so each swap is
atomic): a reader sees the old partition or the new one, never a mix of files. Each
published partition carries a `_SUCCESS` file naming the run.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from .warehouse import run_script, sql

KINDS = ("rows", "audit")


class AuditCheckFailed(Exception):
    """The staged night breaks an invariant; nothing was published."""


@dataclass(frozen=True)
class NightNumbers:
    rollouts_in: int
    audit_rows: int
    audit_rollouts: int
    ok_rollouts: int
    n_rows: int
    rollouts_in_rows: int
    reasons: dict

    @property
    def masked(self) -> int:
        return self.audit_rows - self.ok_rollouts

    @property
    def mask_rate(self) -> float:
        return self.masked / self.audit_rows if self.audit_rows else 0.0


def staging_dir(output: Path, ds: str, run_id: str) -> Path:
    return Path(output) / "_staging" / ds / run_id


def partition_dir(output: Path, kind: str, ds: str) -> Path:
    return Path(output) / kind / f"ds={ds}"


def _files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("part-*.parquet"))


def verify_staged(con, staging: Path, ds: str, max_mask_rate: float = 1.0) -> NightNumbers:
    audit_files, rows_files = _files(staging / "audit"), _files(staging / "rows")
    if not audit_files:
        raise AuditCheckFailed(f"{staging}: no staged audit files (did every shard run?)")
    params = {"ds": ds, "audit_files": audit_files, "rows_files": rows_files}
    values = con.execute(sql("audit_checks"), params).fetchone()
    reasons = dict(con.execute(sql("mask_reasons"), {"audit_files": audit_files}).fetchall())
    numbers = NightNumbers(*values, reasons=reasons)
    problems = []
    if numbers.audit_rows != numbers.rollouts_in:
        problems.append(f"rollouts in {numbers.rollouts_in} != audit rows {numbers.audit_rows}")
    if numbers.audit_rollouts != numbers.audit_rows:
        problems.append(f"audit rows {numbers.audit_rows} but {numbers.audit_rollouts} distinct rollouts")
    if numbers.ok_rollouts != numbers.rollouts_in_rows:
        problems.append(f"ok rollouts {numbers.ok_rollouts} != distinct rollouts in rows {numbers.rollouts_in_rows}")
    if numbers.mask_rate > max_mask_rate:
        top = ", ".join(f"{r} {n}" for r, n in list(reasons.items())[:5])
        problems.append(f"mask rate {numbers.mask_rate:.3f} ({numbers.masked}/{numbers.audit_rows}) "
                        f"above the limit {max_mask_rate:.3f}; top reasons: {top}")
    if problems:
        raise AuditCheckFailed(f"night {ds} not published: " + "; ".join(problems))
    return numbers


def _swap(new: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    old = target.with_name(target.name + ".old")
    if old.exists():  # left by a crash between the two renames below
        shutil.rmtree(old)
    if target.exists():
        os.rename(target, old)
    os.rename(new, target)
    if old.exists():
        shutil.rmtree(old)


def publish_staged(con, output: Path, staging: Path, ds: str, run_id: str, numbers: NightNumbers,
                   run_info: dict) -> dict[str, Path]:
    marker = json.dumps({"run_id": run_id, **asdict(numbers)}, sort_keys=True)
    published = {}
    for kind in KINDS:
        (staging / kind / "_SUCCESS").write_text(marker + "\n")
        target = partition_dir(output, kind, ds)
        _swap(staging / kind, target)
        published[kind] = target
    shutil.rmtree(staging, ignore_errors=True)
    audit_files = _files(published["audit"])
    con.execute("BEGIN TRANSACTION")
    run_script(con, "publish_audit", {"ds": ds, "audit_files": audit_files})
    con.execute(sql("record_run"), {"ds": ds, "run_id": run_id, "n_rows": numbers.n_rows, **run_info})
    con.execute("COMMIT")
    return published
