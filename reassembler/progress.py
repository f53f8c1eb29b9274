"""Progress a person can see: work done out of a known total, and its rate.

    with Progress("load", total_bytes, BYTES) as progress:
        ...
        progress.advance(n)          # from any thread

Where it shows:

- on a terminal (`reassembler build` with stderr a terminal: `show_bars(True)`), a bar
  (rich), redrawn as work is done, left on screen when the step ends;
- otherwise a log line at INFO every REPORT_SECONDS (10 s) while work is done, and one when
  the step ends, `load: 1.2 GB of 4.0 GB (30%), 85.1 MB/s`: an Airflow task's log, or the
  command's stderr with -v. Without a terminal there is never a bar.

The total is what the step knows before it starts (the input's bytes, the tokens of a
shard's plan); work past it shows as 100%.

Worker processes (`--workers N`: load parts and shards side by side) draw nothing themselves:
bars from several processes would garble the terminal. When the parent draws bars it opens
`Relayed()`, hands its queue to each worker (`relay_to`, the pool's initializer), and draws one
bar per worker step, from the messages each step's Progress sends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("reassembler.progress")

REPORT_SECONDS = 10.0
RELAY_SECONDS = 0.1  # a worker sends its progress to the drawing parent at most this often
_bars = False
_clock = time.monotonic  # a test moves it


@dataclass(frozen=True)
class Unit:
    name: str  # after the numbers ("" for bytes)
    scale: tuple[tuple[float, str], ...]
    spaced: bool  # a space between number and suffix: 1.2 MB, 1.2M


BYTES = Unit("", ((1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1, "B")), spaced=True)
TOKENS = Unit("tokens", ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")), spaced=False)


_relay = None  # a worker process's queue to the parent that draws its bars


def show_bars(on: bool) -> None:
    """Draw bars on the terminal from now on (the command, when stderr is one)."""
    global _bars
    _bars = on


def bars_shown() -> bool:
    return _bars


def relay_to(queue) -> None:
    """In a worker process: send every Progress's start, advance and end to `queue` (the
    parent's Relayed draws them); None: log lines, as without a terminal."""
    global _bars, _relay
    _bars, _relay = False, queue


def _bar_columns(bytes_unit: bool):
    from rich.progress import BarColumn, DownloadColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn

    amounts = DownloadColumn() if bytes_unit else TextColumn("{task.completed:,.0f}/{task.total:,.0f}")
    return (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        amounts,
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
    )


class Relayed:
    """The parent's bars of its workers' steps: one bar per step, drawn from the messages of
    the workers' Progress (`queue`, given to each worker by `relay_to`). Use as a context
    around the pool; its thread ends with it."""

    def __init__(self, context):
        from rich.console import Console
        from rich.progress import Progress as Bar

        self.queue = context.Queue()
        self._bars: dict[bool, Bar] = {}
        self._console = Console(stderr=True)
        self._Bar = Bar
        self._tasks: dict[str, tuple[Any, Any, float, Unit]] = {}
        self._thread = threading.Thread(target=self._draw, name="progress-relay", daemon=True)

    def __enter__(self) -> Relayed:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.queue.put(None)
        self._thread.join(timeout=10)
        for bar in self._bars.values():
            bar.stop()

    def _bar(self, bytes_unit: bool):
        if bytes_unit not in self._bars:  # one table a unit: byte and token columns differ
            self._bars[bytes_unit] = self._Bar(*_bar_columns(bytes_unit), console=self._console, transient=False)
            self._bars[bytes_unit].start()
        return self._bars[bytes_unit]

    def _draw(self) -> None:
        while (message := self.queue.get()) is not None:
            kind, key, *rest = message
            if kind == "start":
                what, total, bytes_unit = rest
                bar = self._bar(bytes_unit)
                task = bar.add_task(what, total=total or None, rate="")
                self._tasks[key] = (bar, task, _clock(), BYTES if bytes_unit else TOKENS)
            elif key in self._tasks:
                bar, task, started, unit = self._tasks[key]
                done = rest[0]
                elapsed = _clock() - started
                rate = _amount(done / elapsed if elapsed > 0 else 0.0, unit)
                bar.update(task, completed=done, rate=f"{rate} {unit.name}/s" if unit.name else f"{rate}/s")


def _amount(value: float, unit: Unit) -> str:
    size, suffix = next((s for s in unit.scale if abs(value) >= s[0]), unit.scale[-1])
    number = f"{value / size:.1f}" if size > 1 else f"{value:.0f}"
    return f"{number} {suffix}".rstrip() if unit.spaced else f"{number}{suffix}"


class Progress:
    def __init__(self, what: str, total: int, unit: Unit = BYTES):
        self.what, self.total, self.unit = what, max(0, int(total)), unit
        self.done = 0
        self._lock = threading.Lock()
        self._started = self._reported = _clock()
        self._bar = None
        self._key = f"{os.getpid()}-{id(self)}"
        if _relay is not None:
            _relay.put(("start", self._key, what, self.total, unit is BYTES))
        elif _bars:
            from rich.console import Console
            from rich.progress import Progress as Bar

            self._bar = Bar(*_bar_columns(unit is BYTES), console=Console(stderr=True), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(what, total=self.total or None, rate="")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close(ok=exc[0] is None)

    def _rate_text(self, elapsed: float) -> str:
        rate = _amount(self.done / elapsed if elapsed > 0 else 0.0, self.unit)
        return f"{rate} {self.unit.name}/s" if self.unit.name else f"{rate}/s"

    def line(self) -> str:
        """`what: done of total (percent), rate`."""
        elapsed = _clock() - self._started
        share = f" ({min(100.0, 100.0 * self.done / self.total):.0f}%)" if self.total else ""
        unit = f" {self.unit.name}" if self.unit.name else ""
        return (
            f"{self.what}: {_amount(self.done, self.unit)} of {_amount(self.total, self.unit)}{unit}{share}, "
            f"{self._rate_text(elapsed)}"
        )

    def advance(self, n: int) -> None:
        if n <= 0:
            return
        with self._lock:
            self.done += int(n)
            now = _clock()
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done, rate=self._rate_text(now - self._started))
            elif _relay is not None:
                if now - self._reported >= RELAY_SECONDS:
                    self._reported = now
                    _relay.put(("advance", self._key, self.done))
            elif now - self._reported >= REPORT_SECONDS:
                self._reported = now
                log.info("%s", self.line())

    def close(self, ok: bool = True) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None
            elif _relay is not None:
                _relay.put(("advance", self._key, self.done))
            elif ok:
                log.info("%s (done in %.1f s)", self.line(), _clock() - self._started)


class _NoBars:
    def __enter__(self):
        return None

    def __exit__(self, *exc) -> None:
        return None


def worker_bars(context):
    """Around a pool of worker processes: a context whose value is the queue to hand each
    worker (`relay_to`) when this process draws bars, else None (the workers log)."""
    if not _bars:
        return _NoBars()

    class _Queue(Relayed):
        def __enter__(self):
            super().__enter__()
            return self.queue

    return _Queue(context)
