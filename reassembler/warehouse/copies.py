"""The warehouse's copies in the output store: the job's memory of every night survives the
worker whose disk holds the DuckDB file.

Every step that commits a night's state in the file (its load, its publish, the gate's
verdict) leaves a copy of the whole file in the output store, as object storage wants it: first the immutable
`<output>/_warehouse/warehouse-<generation>.duckdb`, then the small pointer
`<output>/_warehouse/latest.json` (generation, file, bytes, SHA-256, night, run, schema
version), written last. The file records its own generation (table `warehouse_copies`).
Opening the warehouse (`connect`) compares the two:

- no local file, and a copy in the store: the copy is restored first, checked against its
  pointer, and a warning says so. A worker never starts an empty history beside a published
  one;
- a local file of an older generation than the store's (an older night's file: a disk
  restored from a backup, a worker that missed nights, a file created before the copy was
  restored): it is set aside as `<file>.stale-<generation>` and the copy restored;
- a local file of the same or a newer generation (a copy that failed after its commit): kept;
  the next commit copies it.

A night makes three copies (after its load, its publish and its gate); the last KEEP copies
stay (a week of nights to go back to), older ones are deleted once the pointer names a newer
one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from .. import storage
from ..errors import StoreError

COPIES = "_warehouse"  # under the output root
POINTER = "latest.json"
KEEP = 21
CHUNK = 8 << 20
log = logging.getLogger(__name__)


def _folder(output) -> str:
    return storage.join(storage.location(output), COPIES)


def latest(output) -> dict | None:
    """The store's pointer to its newest copy, or None when no copy was ever made."""
    where = storage.join(_folder(output), POINTER)
    if not storage.exists(where):
        return None
    try:
        pointer = json.loads(storage.read_bytes(where))
        int(pointer["generation"]), str(pointer["file"]), int(pointer["bytes"]), str(pointer["sha256"])
    except (ValueError, KeyError, TypeError) as e:
        raise StoreError(f"{where}: not a warehouse copy pointer ({e}); restore one from {_folder(output)}") from None
    return pointer


def generation(con) -> int:
    """The generation of the open warehouse: its newest copy's, 0 before any."""
    has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'warehouse_copies'").fetchone()[0]
    if not has:
        return 0
    return con.execute("SELECT coalesce(max(generation), 0) FROM warehouse_copies").fetchone()[0]


def save(con, path: Path, output, ds: str | None, run_id: str | None, schema: int) -> dict:
    """Copy the open warehouse (the writer's connection `con` on the file `path`) into the
    store as the next generation, the pointer last; returns the pointer. The caller holds
    the output lock: no other writer runs."""
    pointer = latest(output) or {}
    gen = max(generation(con), int(pointer.get("generation", 0))) + 1
    con.execute("INSERT INTO warehouse_copies VALUES (?, CAST(? AS DATE), ?, now()::TIMESTAMP)", [gen, ds, run_id])
    con.execute("CHECKPOINT")  # every change in the file itself, none in its WAL
    name = f"warehouse-{gen:010d}.duckdb"
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as src, storage.open_output(storage.join(_folder(output), name)) as dst:
        while block := src.read(CHUNK):
            digest.update(block)
            size += len(block)
            dst.write(block)
    new = {
        "generation": gen,
        "file": name,
        "bytes": size,
        "sha256": digest.hexdigest(),
        "ds": ds,
        "run_id": run_id,
        "schema_version": schema,
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    storage.write_bytes(storage.join(_folder(output), POINTER), json.dumps(new, sort_keys=True).encode())
    _prune(output, gen)
    return new


def _prune(output, newest: int) -> None:
    folder = _folder(output)
    old = []
    for rel in storage.list_files(folder, ".duckdb", recursive=False):
        stem = Path(rel).stem
        if stem.startswith("warehouse-") and stem[len("warehouse-") :].isdigit():
            if int(stem[len("warehouse-") :]) <= newest - KEEP:
                old.append(storage.join(folder, rel))
    storage.delete_many(old)


def restore(output, path: Path, pointer: dict, local: int, why: str) -> None:
    """Put the store's copy named by `pointer` at `path` (whole, checked against the pointer,
    then moved into place); a file already there (generation `local`) is set aside as
    `<file>.stale-<local>`, never deleted. `why` goes into the warning."""
    where = storage.join(_folder(output), pointer["file"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".restore-", dir=path.parent)
    digest, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as dst, storage.open_input(where) as src:
            while block := src.read(CHUNK):
                digest.update(block)
                size += len(block)
                dst.write(block)
        if (size, digest.hexdigest()) != (int(pointer["bytes"]), pointer["sha256"]):
            raise StoreError(
                f"{where}: {size:,} bytes with SHA-256 {digest.hexdigest()[:12]}..., not the {int(pointer['bytes']):,} "
                f"bytes and {pointer['sha256'][:12]}... its pointer {POINTER} recorded; the warehouse was not restored"
            )
        for old in (path, path.with_name(path.name + ".wal")):
            if old.exists():
                old.rename(old.with_name(f"{old.name}.stale-{local}"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.warning(
        "restored the warehouse %s from %s (generation %s, night %s, run %s): %s",
        path,
        where,
        pointer["generation"],
        pointer.get("ds"),
        pointer.get("run_id"),
        why,
    )


def restore_missing(output, path: Path) -> bool:
    """Before opening: no local file, and a copy in the store: restore it. Returns whether it did."""
    if path.exists():
        return False
    pointer = latest(output)
    if pointer is None:
        return False
    restore(output, path, pointer, 0, "no local file")
    return True


def newer_copy(con, output) -> dict | None:
    """After opening: the store's pointer when it names a newer generation than the open file's."""
    pointer = latest(output)
    if pointer is None or int(pointer["generation"]) <= generation(con):
        return None
    return pointer


def replace_stale(output, path: Path, pointer: dict, local: int) -> None:
    """The local file (generation `local`) is older than the store's copy: set it aside, restore."""
    restore(output, path, pointer, local, f"the local file was generation {local}, older than the store's copy")
