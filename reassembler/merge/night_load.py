"""One night's load, and every helper it runs, owned by one object.

    with NightLoad(input_dir, ds, settings) as load:      # the rollout children start here
        summary = load.into(con)                          # the night into the warehouse

The helpers are child processes, started as the object is entered when the night is big
enough to be worth them, and handed to the load: the rollout parse's (rollout_lines.py),
and the readers of NeMo Gym's local-mode captures (capture_children.py), idle until the
load knows which rollouts are theirs. Leaving the object stops and reaps them, whatever
happened (an error, a KeyboardInterrupt). Nothing else runs beside the load: the ledger is
parsed on the caller's thread, the token lists are read later by the shards
(docs/performance.md says why each helper stays or went).

This module imports nothing heavy (no pyarrow, DuckDB or numpy): the `reassembler build`
command enters a NightLoad before it imports them, so the children parse while it does
(`into` imports the rest). The command and the Airflow load task use it the same way.
"""

from __future__ import annotations

from ..formats.night import NightFiles, find_night
from ..load import capture_children, rollout_lines
from ..load.parts import LoadPlan, plan_parts
from ..settings import DEFAULTS, Settings


class NightLoad:
    def __init__(self, input_dir, ds: str, settings: Settings = DEFAULTS):
        self.night: NightFiles = find_night(input_dir, ds)
        self.settings = settings
        self._children: rollout_lines.InBackground | None = None
        self._readers: capture_children.CaptureChildren | None = None
        self.plan: LoadPlan | None = None

    @property
    def ds(self) -> str:
        return self.night.ds

    def __enter__(self) -> NightLoad:
        try:
            self.plan = plan_parts(
                self.night, self.settings.load_parts, self.settings.buckets, self.settings.merge_buckets is not None
            )
            if len(self.plan.parts) == 1:  # parts of their own start their own helpers
                self._children = rollout_lines.start(
                    self.night, self.settings.max_line_bytes, self.settings.max_rollout_tokens
                )
                self._readers = capture_children.start(self.night)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._children is not None:
            self._children.close()
            self._children = None
        if self._readers is not None:
            self._readers.close()
            self._readers = None

    def into(self, con, scratch=None, calls=None):
        """Replace the night in the warehouse behind `con` (merge.run.load_night), with the
        rollout lines the children parsed and the local-mode captures the readers read;
        they are done with once it returns. `scratch`: where the token rows the load
        derives go (the run's staging folder); `calls`: where its per-call rows go."""
        from .run import load_night

        try:
            return load_night(con, self.night, self.settings, self._children, scratch, self._readers, self.plan, calls)
        finally:
            self.close()


class PartsLoaded:
    """A night whose load parts and merge steps already ran (the DAG's mapped tasks) into
    the run's folder `staging`: its plan read from there; `into` only commits it."""

    def __init__(self, staging: str, settings: Settings = DEFAULTS):
        from ..load.parts import read_plan

        self.staging, self.settings = staging, settings
        self.plan = read_plan(staging)
        self.night = self.plan.night

    @property
    def ds(self) -> str:
        return self.night.ds

    def into(self, con, scratch=None, calls=None):
        """The merged night into the warehouse behind `con` (merge.commit.commit_merge)."""
        from .commit import commit_merge

        return commit_merge(con, self.plan, self.staging, calls)
