"""How the DAG's tasks share the one DuckDB warehouse: the pool, when the deployment made
one, else the warehouse's own locks.

DuckDB lets one process write the warehouse file. With `REASSEMBLER_WAREHOUSE_POOL` set
(read when the DAG is parsed; `make airflow` sets it and creates the pool), the tasks that
open the warehouse take slots of that pool: 4 slots, writers take all 4, readers 1, so no
task holds a worker slot while it waits. Without it they run in Airflow's default pool and
wait for the warehouse's locks (the output lock, then DuckDB's lock of the file) for up to
LOCK_WAIT_WITHOUT_POOL seconds, which serialises them just as well, a worker slot held
meanwhile. A missing pool can so never leave a run waiting unseen: the pool is used only
where the deployment says it exists.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

POOL_SLOTS = 4
LOCK_WAIT_WITHOUT_POOL = 3600.0


def warehouse_pool() -> str | None:
    """The pool named by REASSEMBLER_WAREHOUSE_POOL, or None (read when the DAG is parsed)."""
    return os.environ.get("REASSEMBLER_WAREHOUSE_POOL") or None


def warehouse_queue() -> str:
    """The Celery queue of the tasks that open the warehouse: REASSEMBLER_WAREHOUSE_QUEUE,
    else Airflow's default queue (read when the DAG is parsed: the dag-processor's
    environment must carry it too). A deployment serves it from the one worker that holds
    the DuckDB file; the shards run on any worker (they read the output store only)."""
    return os.environ.get("REASSEMBLER_WAREHOUSE_QUEUE") or "default"


def reader(pool: str | None) -> dict[str, Any]:
    """The arguments of a task that opens the warehouse read-only: its queue, and the pool."""
    return {"queue": warehouse_queue(), **({"pool": pool} if pool else {})}


def writer(pool: str | None) -> dict[str, Any]:
    """The arguments of a task that writes the warehouse: its queue, every slot of the pool."""
    return {"queue": warehouse_queue(), **({"pool": pool, "pool_slots": POOL_SLOTS} if pool else {})}


def task_settings(params, pool: str | None):
    """The core's Settings from a run's params; out of the pool, a longer wait for the
    warehouse. Every task that reads or writes the stores takes its settings here, and so
    its object-storage credentials: the run's `aws_conn_id` Connection (connections.py)."""
    from reassembler.settings import Settings

    from .connections import use_connection

    use_connection(params)
    settings = Settings.from_params(params or {})
    if pool in (None, "default_pool"):
        wait = max(settings.duckdb.lock_wait_seconds, LOCK_WAIT_WITHOUT_POOL)
        settings = replace(settings, duckdb=replace(settings.duckdb, lock_wait_seconds=wait))
    return settings
