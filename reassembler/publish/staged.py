"""The staged run of a night: where its files are, and the numbers it must satisfy before
it is published (CONTRACT.md 3.4; the publish itself: protocol.py).

- Shards write the run's files under the run's own folder,
  `_runs/ds=<ds>/<run>/{rows,audit}/part-<shard>.parquet` (`<run>`: the run id, path-safe).
  Nothing else ever writes there, and no file is changed once written.
- `verify_staged` checks the run's numbers against the night's load (sql/audit_checks.sql):

      invariant: every rollout the load read is audited once; the ok rollouts are those
                 with rows; the mask rate is within the limit; the run is the night's
                 latest load; an empty night replaces one only when allowed
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from .. import storage
from ..errors import AuditCheckFailed
from ..warehouse import sql

KINDS = ("rows", "audit")


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
    """A run id as a folder or file name: Airflow's run ids hold ':' and '+'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)


def runs_dir(output, ds: str) -> str:
    return storage.join(output, "_runs", f"ds={ds}")


def staging_dir(output, ds: str, run_id: str) -> str:
    """The run's own folder, where its shards write (a location: storage.py)."""
    return storage.join(runs_dir(output, ds), path_safe(run_id))


def partition_dir(output, kind: str, ds: str) -> str:
    return storage.join(output, kind, f"ds={ds}")


def _staged_files(staging: str) -> dict[str, list[str]]:
    """The run's files of each kind (both folders listed at once)."""
    folders = [storage.join(staging, kind) for kind in KINDS]
    listed = storage.map_ahead(lambda f: storage.list_files(f, ".parquet"), folders, storage.is_remote(staging))
    return {kind: [storage.join(f, rel) for rel in rels] for kind, f, rels in zip(KINDS, folders, listed)}


def _read_columns(locations: list[str], columns: list[str], schema: pa.Schema) -> pa.Table:
    remote = any(storage.is_remote(loc) for loc in locations)
    tables = list(storage.map_ahead(lambda loc: storage.read_parquet(loc, columns), locations, remote))
    return pa.concat_tables(tables) if tables else schema.empty_table()


# the staged audit rows read by verify_staged, for the publish that follows it in the same
# process (a run's files never change once written)
_last_audit: tuple[tuple[str, ...], pa.Table] | None = None


def _staged_audit(locations: list[str], keep: bool) -> pa.Table:
    """The audit rows of `locations`, read (and kept, when `keep`: verify_staged), or the
    rows verify_staged kept when they are of the same files (apply, right after it within
    publish_step, under the output lock)."""
    global _last_audit
    from ..verify.rows import AUDIT_SCHEMA

    kept, _last_audit = _last_audit, None
    if not keep and kept is not None and kept[0] == tuple(locations):
        return kept[1]
    table = _read_columns(locations, AUDIT_SCHEMA.names, AUDIT_SCHEMA)
    if keep:
        _last_audit = (tuple(locations), table)
    return table


def _register_staged(con, audit_files: list[str], rows_files: list[str]) -> None:
    """The run's audit rows (whole: a row per rollout) and its rows' rollout ids, for the
    checks, both read at once: DuckDB reads them from Arrow, wherever the files are."""
    remote = any(storage.is_remote(loc) for loc in audit_files + rows_files)
    ids = pa.schema([("rollout_id", pa.string())])
    jobs = [lambda: _staged_audit(audit_files, keep=True), lambda: _read_columns(rows_files, ["rollout_id"], ids)]
    audit, rows = storage.map_ahead(lambda job: job(), jobs, remote)
    con.register("staged_audit", audit)
    con.register("staged_rows", rows)


def _unregister_staged(con) -> None:
    con.unregister("staged_audit")
    con.unregister("staged_rows")


def verify_staged(
    con, staging: str, ds: str, max_mask_rate: float = 1.0, run_id: str | None = None, allow_empty: bool = False
) -> NightNumbers:
    """The staged night's numbers, checked against the invariants of CONTRACT.md 3.4 and
    against the night's load (sql/night_load.sql): the rollouts the load read are still in
    the warehouse, and no other run loaded the night since `run_id` did. A staged night of
    no rollout is refused unless `allow_empty`. AuditCheckFailed names every problem."""
    staging = str(staging)
    [(loaded_by, n_loaded)] = con.execute(sql("night_load"), {"ds": ds}).fetchall()
    if n_loaded is None:
        raise AuditCheckFailed(
            f"night {ds} not published: no load of it is recorded in the warehouse (published by "
            "another run since, or loaded by an older release); load it again"
        )
    if run_id is not None and loaded_by is not None and loaded_by != run_id:
        raise AuditCheckFailed(
            f"night {ds} not published: run {loaded_by} loaded it again after run {run_id} did; that run publishes it"
        )
    staged = _staged_files(staging)
    audit_files, rows_files = staged["audit"], staged["rows"]
    if not audit_files:
        raise AuditCheckFailed(f"{staging}: no staged audit files (did every shard run?)")
    _register_staged(con, audit_files, rows_files)
    try:
        [values] = con.execute(sql("audit_checks"), {"ds": ds}).fetchall()
        reasons = dict(con.execute(sql("mask_reasons")).fetchall())
    finally:
        _unregister_staged(con)
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
