"""What a Celery deployment of the DAG needs from this package.

`worker_name` is Airflow's `[core] hostname_callable` on the workers of `make
airflow-celery`: several workers on one host otherwise record the same hostname on their
task instances, and which worker ran a task could not be told apart.
"""

from __future__ import annotations

import os
import socket


def worker_name() -> str:
    """REASSEMBLER_WORKER_NAME when the worker's environment sets it, else the host's name."""
    return os.environ.get("REASSEMBLER_WORKER_NAME") or socket.getfqdn()
