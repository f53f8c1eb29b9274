"""Publish a staged night: verify its numbers, then move whole partitions in, with a journal
so that a crash at any point is rolled forward by the next run.

Shards write into `<output>/_staging/<ds>/<run_id>/{rows,audit}/`. `verify_staged` runs
sql/audit_checks.sql over those files and checks them against the night's load.
`publish_staged` then, under the output lock:

1. writes the journal `<output>/_publish/ds=<ds>.json` (run id, staging folder, run info)
   by an atomic rename: from here on the publish is decided and will be finished;
2. replaces the night's `audit` rows in the warehouse and records the run (one
   transaction, idempotent): a warehouse that cannot be written stops here, before any
   partition moves;
3. for rows, then audit: moves the published partition `<table>/ds=<ds>` out of the table
   folder into `<output>/_trash/`, then renames the staged folder to `<table>/ds=<ds>`;
   then refreshes the reader snapshots in `<output>/tables/`;
4. writes the manifest `<output>/_published/ds=<ds>.json` (run id and numbers);
5. deletes the journal, then the trash and the staging folder.

Every rename is of a whole folder on one filesystem, so at every instant each
`<table>/ds=<ds>` is one complete partition of one run, or absent (between the two renames
of step 3); nothing else ever sits in `rows/` or `audit/`. A crash after step 1 leaves the
journal: `recover` (run by every build and load before anything else) finishes steps 2-5
from it, so rows, audit, the warehouse and the manifest all name the same run again. A
crash before step 1 leaves only a staging folder, which the next load of that ds removes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import AuditCheckFailed
from ..warehouse import run_script, sql
from .checkpoints import checkpoint

KINDS = ("rows", "audit")
__all__ = ["AuditCheckFailed", "NightNumbers", "verify_staged", "publish_staged", "recover", "staging_dir"]


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


def path_safe(run_id: str) -> str:
    """A run id as a folder name: Airflow's run ids hold ':' and '+'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)


def staging_dir(output: Path, ds: str, run_id: str) -> Path:
    """Where the run stages the night; the run id itself is kept as it is everywhere else
    (audit rows, the runs table, the manifest)."""
    return Path(output) / "_staging" / ds / path_safe(run_id)


def partition_dir(output: Path, kind: str, ds: str) -> Path:
    return Path(output) / kind / f"ds={ds}"


def journal_path(output: Path, ds: str) -> Path:
    return Path(output) / "_publish" / f"ds={ds}.json"


def manifest_path(output: Path, ds: str) -> Path:
    return Path(output) / "_published" / f"ds={ds}.json"


def _files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("part-*.parquet"))


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, path)


def verify_staged(
    con, staging: Path, ds: str, max_mask_rate: float = 1.0, run_id: str | None = None, allow_empty: bool = False
) -> NightNumbers:
    """The staged night's numbers, checked against the invariants of CONTRACT.md 3.4 and
    against the night's load (sql/night_load.sql): the rollouts the load read are still in
    the warehouse, and no other run loaded the night since `run_id` did. A staged night of
    no rollout is refused unless `allow_empty`. AuditCheckFailed names every problem."""
    audit_files, rows_files = _files(staging / "audit"), _files(staging / "rows")
    if not audit_files:
        raise AuditCheckFailed(f"{staging}: no staged audit files (did every shard run?)")
    loaded_by, n_loaded = con.execute(sql("night_load"), {"ds": ds}).fetchone()
    if n_loaded is None:
        raise AuditCheckFailed(
            f"night {ds} not published: no load of it is recorded in the warehouse (published by "
            "another run since, or loaded by an older release); load it again"
        )
    if run_id is not None and loaded_by is not None and loaded_by != run_id:
        raise AuditCheckFailed(
            f"night {ds} not published: run {loaded_by} loaded it again after run {run_id} did; that run publishes it"
        )
    params = {"ds": ds, "audit_files": audit_files, "rows_files": rows_files}
    values = con.execute(sql("audit_checks"), params).fetchone()
    reasons = dict(con.execute(sql("mask_reasons"), {"audit_files": audit_files}).fetchall())
    rollouts_in, audit_rows, audit_rollouts, ok_rollouts, n_rows, rollouts_in_rows = values
    numbers = NightNumbers(rollouts_in, audit_rows, audit_rollouts, ok_rollouts, n_rows, rollouts_in_rows, reasons)
    problems = []
    if numbers.rollouts_in != n_loaded:
        problems.append(
            f"the load read {n_loaded} rollouts but the warehouse holds {numbers.rollouts_in} "
            "for this night (deleted or replaced since)"
        )
    if numbers.audit_rows == 0 and not allow_empty:
        problems.append("no rollout staged; an empty night replaces the published one only with --allow-empty")
    if numbers.audit_rows != numbers.rollouts_in:
        problems.append(f"rollouts in {numbers.rollouts_in} != audit rows {numbers.audit_rows}")
    if numbers.audit_rollouts != numbers.audit_rows:
        problems.append(f"audit rows {numbers.audit_rows} but {numbers.audit_rollouts} distinct rollouts")
    if numbers.ok_rollouts != numbers.rollouts_in_rows:
        problems.append(f"ok rollouts {numbers.ok_rollouts} != distinct rollouts in rows {numbers.rollouts_in_rows}")
    if numbers.mask_rate > max_mask_rate:
        top = ", ".join(f"{r} {n}" for r, n in list(reasons.items())[:5])
        problems.append(
            f"mask rate {numbers.mask_rate:.3f} ({numbers.masked}/{numbers.audit_rows}) "
            f"above the limit {max_mask_rate:.3f}; top reasons: {top}"
        )
    if problems:
        raise AuditCheckFailed(f"night {ds} not published: " + "; ".join(problems))
    return numbers


def publish_staged(
    con, output: Path, staging: Path, ds: str, run_id: str, numbers: NightNumbers, run_info: dict
) -> dict[str, Path]:
    """Steps 1-5 of the module docstring. The caller holds the output lock."""
    output = Path(output)
    for kind in KINDS:  # a night without ok rollouts has no rows file: publish an empty folder
        (staging / kind).mkdir(parents=True, exist_ok=True)
    journal = {"ds": ds, "run_id": run_id, "staging": str(staging), "numbers": asdict(numbers), "run_info": run_info}
    _write_atomically(journal_path(output, ds), json.dumps(journal, sort_keys=True))
    checkpoint("journal")
    _finish(con, output, journal)
    return {kind: partition_dir(output, kind, ds) for kind in KINDS}


def _finish(con, output: Path, journal: dict) -> None:
    ds, run_id, staging = journal["ds"], journal["run_id"], Path(journal["staging"])
    # the warehouse first: a warehouse that cannot be written (a damaged file) stops the
    # publish before any partition moves
    con.execute("BEGIN TRANSACTION")
    run_script(con, "publish_audit", {"ds": ds, "audit_files": _files(_audit_folder(output, journal))})
    run_script(
        con, "record_run", {"ds": ds, "run_id": run_id, "n_rows": journal["numbers"]["n_rows"], **journal["run_info"]}
    )
    con.execute("COMMIT")
    checkpoint("warehouse")
    trash = output / "_trash" / ds
    for kind in KINDS:
        staged, target = staging / kind, partition_dir(output, kind, ds)
        if not staged.exists():
            continue  # moved in before a crash
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            trash.mkdir(parents=True, exist_ok=True)
            os.rename(target, trash / f"{kind}-{uuid.uuid4().hex}")
            checkpoint(f"{kind}_aside")
        os.rename(staged, target)
        checkpoint(f"{kind}_in")
    export_tables(con, output)
    _write_atomically(manifest_path(output, ds), json.dumps({"run_id": run_id, **journal["numbers"]}, sort_keys=True))
    checkpoint("manifest")
    journal_path(output, ds).unlink()
    shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)


def _audit_folder(output: Path, journal: dict) -> Path:
    """Where the run's audit files are: still staged, or moved in before a crash."""
    staged = Path(journal["staging"]) / "audit"
    return staged if staged.exists() else partition_dir(output, "audit", journal["ds"])


def recover(con, output: Path) -> list[str]:
    """Finish every publish a crash interrupted (roll forward); the ds values finished."""
    done = []
    for path in sorted((Path(output) / "_publish").glob("ds=*.json")):
        journal = json.loads(path.read_text())
        _finish(con, Path(output), journal)
        done.append(journal["ds"])
    return done


def published_numbers(output: Path, ds: str, run_id: str) -> NightNumbers | None:
    """The numbers of the night as `run_id` published it, if the manifest names that run."""
    try:
        manifest = json.loads(manifest_path(output, ds).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("run_id") != run_id:
        return None
    return NightNumbers(**{f: manifest[f] for f in NightNumbers.__dataclass_fields__})


def pending(output: Path) -> list[str]:
    """The ds values whose publish was interrupted and awaits the next build."""
    return sorted(p.name[3:-5] for p in (Path(output) / "_publish").glob("ds=*.json"))


def export_tables(con, output: Path) -> None:
    """Reader snapshots of the warehouse's small tables, `<output>/tables/<table>.parquet`,
    replaced by an atomic rename, so analysts query them without ever locking the job out."""
    folder = Path(output) / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    for table in ("runs", "rejects"):
        tmp = folder / f".{table}.{os.getpid()}.tmp"
        con.execute(sql("export_table", table=table, path=str(tmp).replace("'", "''")))
        os.rename(tmp, folder / f"{table}.parquet")
