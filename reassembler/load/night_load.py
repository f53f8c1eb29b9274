"""One night's load, and every helper it runs, owned by one object.

    with NightLoad(input_dir, ds, settings) as load:      # the rollout children start here
        summary = load.into(con)                          # the night into the warehouse

The helpers are the rollout parse's child processes (rollout_lines.py), started as the
object is entered when the night is big enough to be worth them, and handed to the load;
leaving the object stops and reaps them, whatever happened (an error, a KeyboardInterrupt).
Nothing else runs beside the load: the ledger is parsed on the caller's thread, the token
lists are read later by the shards (docs/performance.md says why each helper stays or went).

This module imports nothing heavy (no pyarrow, DuckDB or numpy): the `reassembler build`
command enters a NightLoad before it imports them, so the children parse while it does
(`into` imports the rest). The command and the Airflow load task use it the same way.
"""

from __future__ import annotations

from ..formats.night import NightFiles, find_night
from ..settings import DEFAULTS, Settings
from . import rollout_lines


class NightLoad:
    def __init__(self, input_dir, ds: str, settings: Settings = DEFAULTS):
        self.night: NightFiles = find_night(input_dir, ds)
        self.settings = settings
        self._children: rollout_lines.InBackground | None = None

    @property
    def ds(self) -> str:
        return self.night.ds

    def __enter__(self) -> NightLoad:
        self._children = rollout_lines.start(self.night, self.settings.max_line_bytes)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._children is not None:
            self._children.close()
            self._children = None

    def into(self, con, scratch=None):
        """Replace the night in the warehouse behind `con` (load.read.load_night), with the
        rollout lines the children parsed; they are done with once it returns. `scratch`:
        where the token rows the load derives go (the run's staging folder)."""
        from .read import load_night

        try:
            return load_night(con, self.night, self.settings, self._children, scratch)
        finally:
            self.close()
