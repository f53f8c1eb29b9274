"""Reassemble one shard of a night: stream its planned calls (load/shard_plan.py: the
ledger columns and each call's token-row location, sorted by the load) with their token
rows, in batches of whole groups, and write its rows and audit rows to the run's folder.
A shard reads only the output store: its plan and the token files.

Memory is bounded by the batch: the plan is read a row group at a time; a batch is cut at
a group boundary once it holds `batch_rows` calls or `batch_tokens` tokens (a group too big
for one batch between two of its rollouts: open_group.py). Each batch then goes through
four threads in turn (`_Pipeline`): its token rows are read and checked per token
(token_store.py, tokens.py), its calls checked and hashed in columns (checks.py), its
rollouts reassembled one by one in Python (rollout.py, the main thread) and its rows and
audit rows written, while the batches before and after it are in the other stages. A few
batches are in flight at most.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..load.shard_plan import PlannedCalls, read_rollouts, read_token_groups
from ..load.token_store import TokenStore
from ..progress import TOKENS, Progress
from ..settings import Settings
from .batch import verify_batch
from .checks import BatchChecks
from .open_group import OpenGroup
from .rollout import Outcome
from .rows import AUDIT_SCHEMA, ROW_SCHEMA, ROW_WRITE_OPTIONS, WRITTEN_FIELDS, audit_table, row_tables
from .tokens import TokenBatch

ROW_GROUP_ROWS = 256
log = logging.getLogger(__name__)


@dataclass
class ShardResult:
    shard: int
    n_rollouts: int = 0
    n_ok: int = 0
    n_rows: int = 0
    n_tokens: int = 0
    reasons: Counter = field(default_factory=Counter)

    @property
    def n_masked(self) -> int:
        return self.n_rollouts - self.n_ok

    def add(self, outcomes: list[Outcome]) -> None:
        self.n_rollouts += len(outcomes)
        self.n_ok += sum(o.ok for o in outcomes)
        self.reasons.update(o.reason.value for o in outcomes if o.reason is not None)

    def summary(self) -> str:
        """A few log lines: the shard's counts, then its mask reasons one per line."""
        lines = [
            f"shard {self.shard}: {self.n_rollouts} rollouts, {self.n_ok} ok, {self.n_masked} masked, "
            f"{self.n_rows} rows, {self.n_tokens:,} tokens"
        ]
        lines += [f"  {reason:<26}{n:>6}" for reason, n in self.reasons.most_common()]
        return "\n".join(lines)


def _units(call_batches, rollouts: Iterator[dict], batch_rows: int, batch_tokens: int):
    """(rollouts, call table, open group) triples in output order, each holding whole
    groups but the open group: None, or the group the unit ends inside of. A unit is cut at
    the first group boundary once it holds `batch_rows` calls or `batch_tokens` tokens (as
    the ledger declares them); a group that alone holds twice that is cut between two of
    its rollouts (its unit ends inside it, and the next one goes on with it). The first
    units are smaller (1/8, 1/4, 1/2 of that), so that the threads beside the main thread
    have its first unit ready soon."""
    pending: list[pa.RecordBatch] = []
    buffered = tokens = 0
    ramp = 8  # the first unit is 1/8 of a full one, the next 1/4, ...
    queued = iter(rollouts)
    head: list[dict] = []

    def take_rollouts(before_group: str | None, before_rollout: str | None = None) -> list[dict]:
        out: list[dict] = []
        while True:
            if not head:
                nxt = next(queued, None)
                if nxt is None:
                    return out
                head.append(nxt)
            if before_rollout is not None:
                if head[0]["rollout_id"] == before_rollout:
                    return out
            elif before_group is not None and head[0]["group_id"] >= before_group:
                return out
            out.append(head.pop())

    for batch in call_batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        buffered += batch.num_rows
        tokens += pc.sum(batch.column("delta_len")).as_py() or 0
        if buffered < batch_rows // ramp and tokens < batch_tokens // ramp:
            continue
        table = pa.Table.from_batches(pending)
        groups = table.column("group_id")
        last = groups[-1].as_py()
        cut = pc.index(groups, last).as_py()
        open_group = None
        if cut == 0:  # one group fills the buffer: keep reading until it ends, or cut it
            if buffered < 2 * batch_rows and tokens < 2 * batch_tokens:
                continue
            cut = _rollout_cut(table, batch_rows, batch_tokens)
            if cut == 0:  # one rollout: whole, whatever it holds
                continue
            rollout = table.column("rollout_id")[cut].as_py()
            open_group = last
            yield take_rollouts(last, rollout), table.slice(0, cut), open_group
        else:
            yield take_rollouts(last), table.slice(0, cut), None
        ramp = max(1, ramp // 2)
        pending = table.slice(cut).to_batches()
        buffered = table.num_rows - cut
        tokens = pc.sum(table.column("delta_len").slice(cut)).as_py() or 0
    table = pa.Table.from_batches(pending, schema=call_batches.schema)
    yield take_rollouts(None), table, None


def _rollout_cut(table: pa.Table, batch_rows: int, batch_tokens: int) -> int:
    """Where to cut calls of one group (`table`, two batches' worth or more) between two of
    its rollouts: the first rollout boundary once a batch's calls or tokens are reached, so
    that the units of a large group hold about a batch each, not two; else the start of its
    last rollout (0: one rollout holds them all)."""
    ids = table.column("rollout_id")
    n = len(ids)
    tokens = np.cumsum(table.column("delta_len").fill_null(0).to_numpy(zero_copy_only=False))
    full = min(batch_rows, int(np.searchsorted(tokens, batch_tokens, side="left")) + 1, n - 1)
    starts = np.flatnonzero(pc.not_equal(ids.slice(1), ids.slice(0, n - 1)).to_numpy(zero_copy_only=False)) + 1
    after = starts[starts >= max(full, 1)]
    if len(after):
        return int(after[0])
    return int(starts[-1]) if len(starts) else 0


def run_shard(
    ds: str, shard: int, settings: Settings, run_id: str, staging: str, plans: str | None = None
) -> ShardResult:
    """Write staging/rows/part-<shard>.parquet and staging/audit/part-<shard>.parquet from
    the shard's plan (load/shard_plan.py; in the run's folder unless `plans` names another)
    and the token files it names: the warehouse is not opened."""
    plans = plans or staging
    rollouts = read_rollouts(plans, shard)
    units = _units(PlannedCalls(plans, shard), rollouts, settings.batch_rows, settings.batch_tokens)
    result = ShardResult(shard)
    with (  # the pipeline's threads stop before the store's read-ahead does
        TokenStore(settings.token_cache_bytes, settings.max_row_group_bytes) as store,
        _Pipeline(staging, shard, run_id, ds, settings) as pipeline,
    ):
        groups, tokens = read_token_groups(plans, shard)
        store.read_ahead(groups, settings.token_cache_bytes)
        with Progress(f"shard {shard}", tokens, TOKENS) as progress:
            for rollouts_, table, checks, open_group in _prepared(units, store, pipeline):
                outcomes, batch = verify_batch(rollouts_, table, checks.tokens, settings.options, checks=checks)
                batch.drop_hash_buffers()  # the rows need the token arrays only
                for o in outcomes:  # and a few fields of each rollout's record
                    o.rollout = {k: o.rollout.get(k) for k in WRITTEN_FIELDS}
                del rollouts_
                pipeline.write(outcomes, batch, open_group)
                result.add(outcomes)
                progress.advance(pc.sum(table.column("delta_len")).as_py() or 0)
                log.debug("shard %d: %d rollouts, %d ok", shard, result.n_rollouts, result.n_ok)
    result.n_rows, result.n_tokens = pipeline.n_rows, pipeline.n_tokens
    for line in result.summary().splitlines():
        log.info("%s", line)
    return result


class _Pipeline:
    """The shard's two Parquet writers and the three threads beside the main thread, one
    task at a time each, in order:

    - `reader`: reads the token row groups of the batches ahead (pyarrow decodes them on
      its own threads), flattens their token lists, checks them per token and converts
      them to big-endian for the digests (tokens.TokenBatch);
    - `checks`: computes those batches' verdicts and hashes (checks.BatchChecks: numpy,
      pyarrow and hashlib, which release the GIL on big buffers);
    - `writer`: builds and writes the rows and audit rows of the batches done (it alone
      touches the Parquet writers).

    The main thread meanwhile runs the current batch's rollouts, in Python."""

    def __init__(self, staging: str, shard: int, run_id: str, ds: str, settings: Settings):
        name = f"part-{shard:05d}.parquet"
        self.run_id, self.ds, self.options = run_id, ds, settings.options
        self.scratch = settings.duckdb.temp_directory or None  # an open group's spill (open_group.py)
        self.open: OpenGroup | None = None
        # an object appears whole when its stream closes; a local file is written in place
        # (the run's own folder: nothing reads it before the publish)
        self.sinks = [storage.open_output(storage.join(staging, kind, name)) for kind in ("rows", "audit")]
        self.rows_out = pq.ParquetWriter(self.sinks[0], ROW_SCHEMA, **ROW_WRITE_OPTIONS)
        self.audit_out = pq.ParquetWriter(self.sinks[1], AUDIT_SCHEMA)
        self.reader, self.checks, self.writer = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"shard{shard}-{role}")
            for role in ("read", "checks", "write")
        )
        self.writes: deque[Future] = deque()
        self.n_rows = self.n_tokens = 0

    def __enter__(self) -> _Pipeline:
        return self

    def _write(self, outcomes: list[Outcome], batch: TokenBatch, open_group: str | None) -> None:
        """A batch's rows and audit rows, in order: those of the group the batch before left
        open (spilled; written out once it ends), those of whole groups, then those of the
        group this batch leaves open (spilled)."""
        k = 0
        if self.open is not None:
            k = next((i for i, o in enumerate(outcomes) if o.rollout["group_id"] != self.open.group_id), len(outcomes))
            self._spill(outcomes[:k], batch)
            if k < len(outcomes) or open_group != self.open.group_id:  # it ended
                self.open.close(self.rows_out, self.audit_out, self.options, ROW_GROUP_ROWS)
                self.open = None
        end = len(outcomes)
        if open_group is not None and self.open is None:
            end = next((i for i, o in enumerate(outcomes) if o.rollout["group_id"] == open_group), end)
        self._rows(outcomes[k:end], batch)
        if end < len(outcomes):
            assert open_group is not None, "internal: rollouts spilled for no open group"
            self.open = OpenGroup(open_group, self.scratch)
            self._spill(outcomes[end:], batch)

    def _pieces(self, outcomes: list[Outcome], batch: TokenBatch) -> Iterator[pa.Table]:
        """The outcomes' rows a piece at a time (rows may repeat their tokens), counted."""
        for rows in row_tables(outcomes, batch, self.ds):
            self.n_rows += rows.num_rows
            self.n_tokens += int(pc.sum(rows.column("n_tokens")).as_py() or 0)
            yield rows

    def _rows(self, outcomes: list[Outcome], batch: TokenBatch) -> None:
        for rows in self._pieces(outcomes, batch):
            if rows.num_rows:
                self.rows_out.write_table(rows, row_group_size=ROW_GROUP_ROWS)
        self.audit_out.write_table(audit_table(outcomes, batch, self.run_id, self.ds))

    def _spill(self, outcomes: list[Outcome], batch: TokenBatch) -> None:
        """Rollouts of the open group: into its spill (their advantages wait for its end)."""
        if not outcomes or self.open is None:
            return
        self.open.add(outcomes, self._pieces(outcomes, batch), audit_table(outcomes, batch, self.run_id, self.ds))

    def write(self, outcomes: list[Outcome], batch: TokenBatch, open_group: str | None = None) -> None:
        while len(self.writes) >= WRITES_QUEUED:  # bound the memory of batches waiting
            self.writes.popleft().result()  # re-raises a failed write
        self.writes.append(self.writer.submit(self._write, outcomes, batch, open_group))

    def __exit__(self, *exc) -> None:
        try:
            while self.writes and exc[0] is None:
                self.writes.popleft().result()
        finally:
            for pool in (self.reader, self.checks, self.writer):
                pool.shutdown(wait=True, cancel_futures=True)
            if self.open is not None:  # a failed shard: the spill goes
                self.open.discard()
            self.rows_out.close()
            self.audit_out.close()
            storage.close_outputs(self.sinks, ok=exc[0] is None)  # objects uploaded only when the shard succeeded


BATCHES_AHEAD = 2  # batches read and checked ahead of the main thread
WRITES_QUEUED = 1  # batches done and not yet written


def _prepared(units, store: TokenStore, pipeline: _Pipeline):
    """(rollouts, call table, checks) per unit, in order: the token rows of the next units
    are read and checked per token on the reader thread and their verdicts and hashes
    computed on the checks thread while the main thread runs the current one."""

    def read(unit) -> Future:
        rollouts, table, open_group = unit
        tokens = store.fetch(table.column("t_file"), table.column("t_row"))
        # the token lists flattened, checked per token and converted for the digests, here:
        # the checks thread, the slowest stage, is left the verdicts and the hashes
        batch = TokenBatch(tokens.column("ids"), tokens.column("mask"), tokens.column("logprobs"))
        batch.be_buffers()
        return pipeline.checks.submit(
            lambda: (rollouts, table, BatchChecks(table, tokens, batch).hash_all(), open_group)
        )

    ahead: deque[Future] = deque()
    while True:
        while len(ahead) < BATCHES_AHEAD and (unit := next(units, None)) is not None:
            ahead.append(pipeline.reader.submit(read, unit))
        if not ahead:
            return
        yield ahead.popleft().result().result()
