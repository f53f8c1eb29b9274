"""`make airflow-stop`: stop every process `make airflow` started, and say so only once they
are gone and their ports are free.

`scripts/airflow_services.sh` starts each service as the leader of a session of its own
(`setsid`) and records `<AIRFLOW_HOME>/services/<name>.pid` (its pid and start time, so a
pid reused by another program is never signalled), and the ports the services listen on in
`ports`. Stopping sends SIGTERM to every process of those sessions (the
scheduler's LocalExecutor workers and their task processes, which move to process groups of
their own, stay in the session), waits up to --wait seconds (the scheduler waits for its
running tasks), then sends SIGKILL to what is left and waits again. The pid records are
removed only when nothing of a session runs any more; then the ports are checked. Stopping
twice, or with nothing started, is fine. Exit 0 when all is stopped and free, else 1
saying what still runs or listens. Linux only (sessions are read from /proc).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path


def session_members(sid: int) -> list[int]:
    """Every process whose session is `sid` (field 6 of /proc/<pid>/stat)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
            members.append(int(entry))
    return members


def start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, field 22 of /proc/<pid>/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_gone(sessions: dict[str, int], seconds: float) -> dict[str, list[int]]:
    """Wait until no process of these sessions runs, at most `seconds`; what still runs."""
    deadline = time.monotonic() + seconds
    while True:
        left = {name: members for name, sid in sessions.items() if (members := session_members(sid))}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True, help="where airflow_services.sh keeps its pid records")
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait after SIGTERM before SIGKILL")
    args = p.parse_args(argv)
    run = Path(args.run_dir)
    records = sorted(run.glob("*.pid")) if run.is_dir() else []
    sessions = {}
    for record in records:
        try:
            pid, started = (int(x) for x in record.read_text().split()[:2])
        except (OSError, ValueError):
            record.unlink(missing_ok=True)  # unreadable: nothing to stop by it
            continue
        leader = start_time(pid)
        if leader is not None and leader != started:
            record.unlink(missing_ok=True)  # the pid is another process's now: ours ended long ago
            continue
        sessions[record.stem] = pid
    running = {name: members for name, sid in sessions.items() if (members := session_members(sid))}
    for name in set(sessions) - set(running):
        (run / f"{name}.pid").unlink(missing_ok=True)  # already gone
    if running:
        print(f"stopping {', '.join(f'{n} ({len(m)} processes)' for n, m in sorted(running.items()))}", flush=True)
        signal_all([pid for members in running.values() for pid in members], signal.SIGTERM)
        left = wait_gone({n: sessions[n] for n in running}, args.wait)
        if left:
            print(f"still running after {args.wait:g} s: {', '.join(sorted(left))}; sending SIGKILL", flush=True)
            signal_all([pid for members in left.values() for pid in members], signal.SIGKILL)
            left = wait_gone({n: sessions[n] for n in left}, 10)
        for name in set(running) - set(left):
            (run / f"{name}.pid").unlink(missing_ok=True)
        if left:
            print(f"could not stop: {', '.join(f'{n} (pids {m})' for n, m in sorted(left.items()))}", file=sys.stderr)
            return 1
    ports_file = run / "ports"
    ports = [int(x) for x in ports_file.read_text().split()] if ports_file.exists() else []
    deadline = time.monotonic() + 10
    while (busy := [port for port in ports if listening(port)]) and time.monotonic() < deadline:
        time.sleep(0.2)  # a socket closes a moment after its process
    if busy:
        print(f"stopped the services, but ports {busy} still answer (another program?)", file=sys.stderr)
        return 1
    ports_file.unlink(missing_ok=True)
    if running:
        print(f"Airflow services stopped: {', '.join(sorted(running))}; ports {ports} free")
    else:
        print("no Airflow service of this repo is running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
