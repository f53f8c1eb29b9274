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
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("reassembler.progress")

REPORT_SECONDS = 10.0
_bars = False
_clock = time.monotonic  # a test moves it


@dataclass(frozen=True)
class Unit:
    name: str  # after the numbers ("" for bytes)
    scale: tuple[tuple[float, str], ...]
    spaced: bool  # a space between number and suffix: 1.2 MB, 1.2M


BYTES = Unit("", ((1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1, "B")), spaced=True)
TOKENS = Unit("tokens", ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")), spaced=False)


def show_bars(on: bool) -> None:
    """Draw bars on the terminal from now on (the command, when stderr is one)."""
    global _bars
    _bars = on


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
        if _bars:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            amounts = DownloadColumn() if unit is BYTES else TextColumn("{task.completed:,.0f}/{task.total:,.0f}")
            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                amounts,
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
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
            elif now - self._reported >= REPORT_SECONDS:
                self._reported = now
                log.info("%s", self.line())

    def close(self, ok: bool = True) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None
            elif ok:
                log.info("%s (done in %.1f s)", self.line(), _clock() - self._started)
