"""Publish a staged night: verify its numbers, then commit it with one manifest, written last.

The same protocol runs on a local folder and on object storage (storage.py), which has no
rename. Keys below are relative to the output root.

- Shards write the run's files under the run's own folder, and `verify_staged` checks its
  numbers against the night's load (staged.py).
- `publish_staged`, under the output lock, **commits** the night: it writes the manifest
  `_published/ds=<ds>.json` in one atomic step, conditional on the manifest it read (a
  rename decided under a lock file locally; on S3 a put with `If-None-Match: *` for a first
  publish, `If-Match: <etag>` of the manifest it replaces). Two publishers of one night can
  never both win; the loser gets OutputBusy and touches nothing of the winner's. The
  manifest names the run, its numbers, `files` (the run's files: what a trainer reads) and
  `partitions` (what `rows/ds=<ds>/` and `audit/ds=<ds>/` hold once applied).
- `apply` then makes everything else follow the manifest, and is idempotent: it makes the
  run the night's current one in the warehouse (its rollouts and per-call files; until now
  readers saw the run published before: sql/publish_audit.sql), replaces the night's audit
  rows and records the run; makes each partition folder hold exactly the run's files, named
  `part-<run>-<shard>.parquet` (locally: a folder of hard links swapped in with one
  `renameat2(RENAME_EXCHANGE)`, so the folder is at every instant one complete run and
  never absent; on S3: server-side copies, then the other objects deleted); refreshes the
  reader snapshots `tables/*.parquet`; and deletes the run folders of the night that no
  manifest needs any more.

A crash before the commit leaves the previous night as it was (the new run's folder is
removed by a later build of the night). A crash after it is finished by `recover`, which
every load and publish runs first: the warehouse, the partitions and the snapshots follow
the manifest again. A superseded run's files stay readable for `GRACE_SECONDS` after the
commit that replaced it (they are deleted by the first build of that night after that), so
a trainer that resolved the previous manifest can finish reading.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import time
from dataclasses import asdict
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq

from .. import call_tables, storage
from ..errors import AuditCheckFailed, OutputBusy, StoreError
from ..load.parts import STARTED
from ..settings import env_seconds
from ..warehouse import run_script, sql
from .checkpoints import checkpoint
from .staged import (  # the staged run, and the names its callers take from here
    KINDS,
    NightNumbers,
    _staged_audit,
    _staged_files,
    partition_dir,
    path_safe,
    runs_dir,
    staging_dir,
    verify_staged,
)

MANIFEST_VERSION = 1
# how long a superseded run's files stay after the commit that replaced it
GRACE_SECONDS = env_seconds("REASSEMBLER_GRACE_SECONDS")
__all__ = [
    "KINDS",
    "AuditCheckFailed",
    "NightNumbers",
    "partition_dir",
    "path_safe",
    "publish_staged",
    "recover",
    "runs_dir",
    "staging_dir",
    "verify_staged",
]


def manifest_path(output, ds: str) -> str:
    return storage.join(output, "_published", f"ds={ds}.json")


# ---------------------------------------------------------------- the manifest


def read_manifest(output, ds: str) -> tuple[dict | None, str | None]:
    """The night's committed manifest and its version tag, or (None, None)."""
    data, version = storage.read_versioned(manifest_path(output, ds))
    if data is None:
        return None, None
    try:
        manifest = json.loads(data)
    except ValueError:
        raise AuditCheckFailed(f"{manifest_path(output, ds)}: not a JSON manifest; move it aside") from None
    return manifest, version


def _clock() -> float:
    """Seconds since the epoch: every time the protocol compares (a test replaces it)."""
    return time.time()


def _now() -> str:
    return datetime.fromtimestamp(_clock(), UTC).isoformat(timespec="microseconds")


def publish_staged(con, output, staging, ds: str, run_id: str, numbers: NightNumbers, run_info: dict) -> dict[str, str]:
    """Commit the staged run with its manifest, then apply it (the module docstring). The
    caller holds the output lock; OutputBusy when another publisher committed the night
    since this one read the manifest."""
    output, staging = storage.location(output), str(staging)
    previous, version = read_manifest(output, ds)
    tag = path_safe(run_id)
    now = _now()
    files = {kind: [storage.relative(output, loc) for loc in locs] for kind, locs in _staged_files(staging).items()}
    manifest = {
        "version": MANIFEST_VERSION,
        "ds": ds,
        "run_id": run_id,
        "committed_at": now,
        "files": files,
        "partitions": {
            kind: [f"{kind}/ds={ds}/part-{tag}-{storage.name(key)[len('part-') :]}" for key in files[kind]]
            for kind in KINDS
        },
        "replaces": None if previous is None else {"run_id": previous.get("run_id")},
        # runs replaced less than GRACE_SECONDS ago, with when: their files stay readable
        "superseded": _superseded(previous, now),
        "numbers": asdict(numbers),
        "run_info": run_info,
    }
    checkpoint("commit")
    try:
        storage.put_if(manifest_path(output, ds), json.dumps(manifest, indent=1, sort_keys=True).encode(), version)
    except storage.Conflict:
        raise OutputBusy(
            f"{manifest_path(output, ds)}: another run committed night {ds} while this one published; "
            "its night stands and nothing of it was touched"
        ) from None
    checkpoint("manifest")
    try:
        apply(con, output, manifest)
    except StoreError as e:
        raise StoreError(
            f"{e} -- night {ds} is committed ({manifest_path(output, ds)}); the next build or publish of "
            "this output finishes applying it"
        ) from None
    return {kind: partition_dir(output, kind, ds) for kind in KINDS}


def _run_info(manifest: dict) -> dict:
    """The manifest's run_info as record_run.sql takes it: the input locations as JSON text
    (null for a manifest written before they were recorded)."""
    info = dict(manifest["run_info"])
    info["inputs"] = json.dumps(info["inputs"], sort_keys=True) if info.get("inputs") else None
    return info


def apply(con, output: str, manifest: dict) -> None:
    """Make the warehouse, the partitions and the snapshots follow a committed manifest."""
    ds, run_id = manifest["ds"], manifest["run_id"]
    if not storage.is_remote(output):
        _clear_replaced(output)
    audit_files = [storage.join(output, key) for key in manifest["files"]["audit"]]
    con.execute("BEGIN TRANSACTION")
    con.register("staged_audit", _staged_audit(audit_files, keep=False))
    try:
        run_script(con, "publish_audit", {"ds": ds, "run": path_safe(run_id)})
        run_script(
            con,
            "record_run",
            {
                "ds": ds,
                "run_id": run_id,
                "n_rows": manifest["numbers"]["n_rows"],
                **_run_info(manifest),
            },
        )
        con.execute("COMMIT")
    except BaseException:
        try:  # the error that aborted the transaction is the one reported, not its cleanup's
            con.execute("ROLLBACK")
            con.unregister("staged_audit")
        except Exception:  # noqa: BLE001, S110
            pass
        raise
    con.unregister("staged_audit")
    checkpoint("warehouse")
    current = set(call_tables.current_runs(con, ds))
    if current:  # the per-call files of the night's other runs (the one this replaced, failed loads)
        call_tables.remove_other_runs(output, ds, current)
    if call_tables.is_temporary(con):
        call_tables.define_views(con, output, temporary=True)  # the run's files, now the night's
    if storage.is_remote(output):
        _fill_objects(output, ds, manifest)
    else:
        for kind in KINDS:
            _fill_partition(output, ds, kind, manifest["files"][kind], manifest["partitions"][kind])
            checkpoint(f"{kind}_in")
    export_tables(con, output)
    collect_runs(output, ds, manifest)


def _fill_objects(output: str, ds: str, manifest: dict) -> None:
    """On object storage, make both partitions hold exactly the manifest's `partitions`:
    both listed at once, every missing file copied at once (server-side), then every other
    object deleted in one batch."""
    targets = [partition_dir(output, kind, ds) for kind in KINDS]
    listed = storage.map_ahead(lambda target: storage.list_files(target, ""), targets, True)
    present = {f"{kind}/ds={ds}/{rel}" for kind, rels in zip(KINDS, listed) for rel in rels}
    wanted = {k: source for kind in KINDS for k, source in zip(manifest["partitions"][kind], manifest["files"][kind])}
    storage.copy_many(
        [
            (storage.join(output, source), storage.join(output, key))
            for key, source in wanted.items()
            if key not in present
        ]
    )
    checkpoint("rows_copied")
    storage.delete_many([storage.join(output, key) for key in sorted(present - wanted.keys())])
    for kind in KINDS:
        checkpoint(f"{kind}_in")


def _fill_partition(output: str, ds: str, kind: str, sources: list[str], names: list[str]) -> None:
    """Make the local `<kind>/ds=<ds>/` hold exactly `names` (keys), copies of `sources`
    (keys): a folder of hard links swapped in at once."""
    target = partition_dir(output, kind, ds)
    wanted = dict(zip(names, sources))
    present = set(os.listdir(target)) if os.path.isdir(target) else set()
    if present == {storage.name(k) for k in wanted}:
        return  # applied before (a recovery, or a retry)
    fresh = storage.join(output, "_tmp", "publish", f"{kind}-{ds}-{os.getpid()}-{time.time_ns()}")
    os.makedirs(fresh)
    for key, source in wanted.items():
        storage.copy(storage.join(output, source), storage.join(fresh, storage.name(key)))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.isdir(target):
        _exchange(fresh, target)  # now `fresh` holds the previous files
        replaced = _clock()
        os.utime(fresh, (replaced, replaced))  # replaced now: kept for the grace period, for readers that opened it
    else:
        os.rename(fresh, target)


def _clear_replaced(output: str) -> None:
    """Delete the replaced partition folders (and what a publish killed while filling one
    left) once the grace period is over: a reader that listed a folder just before it was
    replaced still finds every file it listed."""
    folder = storage.join(output, "_tmp", "publish")
    if not os.path.isdir(folder):
        return
    for entry in os.scandir(folder):
        if _clock() - entry.stat().st_mtime > GRACE_SECONDS:
            storage.delete_tree(entry.path)


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: str, b: str) -> None:
    """Swap two folders in one step (Linux renameat2 RENAME_EXCHANGE)."""
    if _libc.renameat2(_AT_FDCWD, a.encode(), _AT_FDCWD, b.encode(), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), b)
        # a filesystem without the exchange: two renames, the folder briefly absent
        aside = f"{a}.old"
        os.rename(b, aside)
        os.rename(a, b)
        os.rename(aside, a)


def _superseded(previous: dict | None, now: str) -> list[dict]:
    """The runs a new commit supersedes, each with when: the run the previous manifest named
    (from now on), and those it listed whose grace period is not over."""
    if previous is None or "version" not in previous:
        return []
    live = [r for r in previous.get("superseded", []) if _age(r["at"]) < GRACE_SECONDS]
    return [{"run_id": previous["run_id"], "at": now}, *live]


def _age(when: str) -> float:
    return _clock() - datetime.fromisoformat(when).timestamp()


def collect_runs(output: str, ds: str, manifest: dict | None, current: str | None = None) -> None:
    """Delete the run folders of the night no reader needs: all but the committed run's,
    those of the runs it superseded less than GRACE_SECONDS ago, the `current` run's (its
    load parts are in it), and those of the runs in flight (another DAG run of the night,
    between its plan and its publish: `in_flight`)."""
    keep = set() if current is None else {path_safe(current)}
    named = set()  # the runs the manifest names: they published
    if manifest is not None and "version" in manifest:  # (a manifest of the release before names no run folder)
        keep.add(path_safe(manifest["run_id"]))
        named = {path_safe(r["run_id"]) for r in manifest.get("superseded", [])}
        keep |= {path_safe(r["run_id"]) for r in manifest.get("superseded", []) if _age(r["at"]) < GRACE_SECONDS}
    folder = runs_dir(output, ds)
    files = storage.list_files(folder, "", recursive=True)
    runs = {rel.split("/", 1)[0] for rel in files}
    if not storage.is_remote(folder) and os.path.isdir(folder):
        runs |= set(os.listdir(folder))
    keep |= {run for run in runs - keep - named if in_flight(storage.join(folder, run))}
    if storage.is_remote(folder):  # every object of those runs, 1,000 a request
        storage.delete_many([storage.join(folder, rel) for rel in files if rel.split("/", 1)[0] not in keep])
        return
    for run in sorted(runs - keep):
        storage.delete_tree(storage.join(folder, run))


def in_flight(run_folder: str) -> bool:
    """Whether the run of `run_folder` planned its load less than IN_FLIGHT_SECONDS ago and has
    not loaded it yet (its started.json, written with the plan, deleted by its load: load/parts.py,
    build.py): a DAG run of the night still parsing or merging, whose folder another run's load
    leaves alone. Of two such runs the later load wins: the other one's shards or audit checks
    then stop it, saying so. A folder without it, or planned longer ago, is a run loaded (the
    manifest's rules keep it or not) or one that failed."""
    try:
        started = json.loads(storage.read_bytes(storage.join(run_folder, STARTED), 4096))
        return _age(started["planned_at"]) < env_seconds("REASSEMBLER_IN_FLIGHT_SECONDS")
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return False


def clear_legacy(output, ds: str) -> None:
    """What the release before this one left of the night on a local output: its staging
    folder, its trash and the journal of a publish it did not finish (this build publishes
    the night again)."""
    output = storage.location(output)
    if storage.is_remote(output):
        return
    for leftover in (f"_staging/{ds}", f"_trash/{ds}"):
        storage.delete_tree(storage.join(output, leftover))
    storage.delete(storage.join(output, "_publish", f"ds={ds}.json"))


def recover(con, output, ds: str | None = None) -> list[str]:
    """Finish the publish of every night (or of `ds`) whose committed manifest the warehouse
    or the partitions do not follow yet (a crash after the commit); the ds values finished."""
    output = storage.location(output)
    nights = [ds] if ds is not None else committed_nights(output)
    done = []
    for night in nights:
        manifest, _ = read_manifest(output, night)
        if manifest is None or _applied(con, output, manifest):
            continue
        apply(con, output, manifest)
        done.append(night)
    return done


def committed_nights(output) -> list[str]:
    return [rel[3:-5] for rel in storage.list_files(storage.join(output, "_published"), ".json")]


def _applied(con, output: str, manifest: dict) -> bool:
    if "version" not in manifest:
        return True  # a manifest of the release before manifests committed (it renamed partitions in first)
    ds = manifest["ds"]
    rows = con.execute(
        "SELECT run_id FROM runs WHERE ds = CAST($ds AS DATE) ORDER BY published_at DESC LIMIT 1", {"ds": ds}
    ).fetchall()
    if not rows or rows[0][0] != manifest["run_id"]:
        return False
    folders = [partition_dir(output, kind, ds) for kind in KINDS]
    listed = storage.map_ahead(lambda f: storage.list_files(f, ".parquet"), folders, storage.is_remote(output))
    for kind, rels in zip(KINDS, listed):
        if {f"{kind}/ds={ds}/{rel}" for rel in rels} != set(manifest["partitions"][kind]):
            return False
    return True


def published_numbers(output, ds: str, run_id: str) -> NightNumbers | None:
    """The numbers of the night as `run_id` published it, if the manifest names that run."""
    try:
        manifest, _ = read_manifest(output, ds)
    except AuditCheckFailed:
        return None
    if manifest is None or manifest.get("run_id") != run_id:
        return None
    return NightNumbers(**manifest["numbers"])


def pending(con, output) -> list[str]:
    """The ds values committed but not yet applied everywhere (finished by the next build)."""
    output = storage.location(output)
    waiting = []
    for ds in committed_nights(output):
        manifest = read_manifest(output, ds)[0]
        if manifest is not None and not _applied(con, output, manifest):
            waiting.append(ds)
    return waiting


def export_tables(con, output) -> None:
    """Reader snapshots of the warehouse's small tables, `<output>/tables/<table>.parquet`,
    each replaced whole in one step, so analysts query them without ever locking the job out."""
    for table in ("runs", "rejects"):
        data = con.sql(sql("export_table", table=table)).to_arrow_table()
        sink = pa.BufferOutputStream()
        pq.write_table(data, sink)
        storage.write_bytes(storage.join(output, "tables", f"{table}.parquet"), sink.getvalue().to_pybytes())
