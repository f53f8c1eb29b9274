"""Merge a night's load parts (load/part_load.py) into the warehouse: the serial step.

The parts' Parquet tables are read into DuckDB temporary tables, each row with its part's
number (`p_<table>`), streamed from local files or from object storage (by range, through
storage.py's retried reads); then, in one transaction that replaces the night:

- token keys and the parts' reject rows go in as they are;
- rollout rows: the first line of each id in the night's reading order is kept (a line of
  an id an earlier part holds becomes the reject row one process would have written), and
  rows are numbered across the night;
- ledger lines: numbered across the night (each part numbered its own from 1);
- NeMo Gym's capture: given-up samples, which capture each rollout is read from, the derived
  calls and token rows it keeps (load/gym_capture.py: decide);
- what needs the whole night: ledger rows of no rollout and token rows no ledger row asks
  for (reject rows), an empty night, the counts.

The outcome is the same for any cut of the night into parts: the parts are cut in reading
order (load/parts.py), and every number the merge gives follows that order.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..errors import InputError
from ..settings import DEFAULTS, Settings
from ..warehouse import run_script, sql
from .gym_capture import decide
from .inserter import REJECT_BATCH, Inserter, IntoWarehouse
from .json_lines import ROLLOUT_DECODER, decode, guess_ids, reject, seen_before
from .part_load import MARKER
from .parts import LoadPlan, part_folder
from .read import LoadSummary, SourceCount, reject_orphans, token_dir

TABLES = (
    "rollouts",
    "ledger",
    "rejects",
    "token_keys",
    "derived_keys",
    "samples",
    "failures",
    "outcomes",
)


def read_markers(plan: LoadPlan, folder: str) -> list[dict]:
    """Each part's marker; a part without one did not finish (RuntimeError naming it)."""
    out = []
    for k in range(len(plan.parts)):
        where = storage.join(part_folder(folder, k), MARKER)
        try:
            marker = json.loads(storage.read_bytes(where))
        except FileNotFoundError:
            raise RuntimeError(f"{where}: load part {k} of {len(plan.parts)} has not finished") from None
        if marker.get("plan") != plan.plan_id:
            raise RuntimeError(f"{where}: load part {k} was parsed for another load plan; run it again")
        out.append(marker)
    return out


def _stage(con, name: str, folder: str, parts: int) -> None:
    """p_<name>: the table `name` of every part, each row with its part's number, streamed
    a row group at a time."""
    locations = [storage.join(part_folder(folder, k), f"{name}.parquet") for k in range(parts)]
    files = [pq.ParquetFile(storage.open_parquet(loc)) for loc in locations]
    schema = files[0].schema_arrow.append(pa.field("part", pa.int64()))

    def batches():
        for k, file in enumerate(files):
            for g in range(file.num_row_groups):
                table = file.read_row_group(g)
                table = table.append_column("part", pa.repeat(pa.scalar(k, pa.int64()), table.num_rows))
                yield from table.cast(schema).to_batches()

    con.register("part_rows", pa.RecordBatchReader.from_batches(schema, batches()))
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE p_{name} AS SELECT * FROM part_rows")
    except BaseException:
        try:  # on an aborted transaction this fails too: the first error is the one to report
            con.unregister("part_rows")
        except Exception:  # noqa: BLE001, S110 - the error in flight is re-raised below
            pass
        raise
    con.unregister("part_rows")


def merge_parts(con, plan: LoadPlan, folder: str, settings: Settings = DEFAULTS) -> LoadSummary:
    """Replace the night in the warehouse behind `con` with its parts' tables (their markers
    all written: RuntimeError otherwise); a night from which no rollout could be read is
    refused (InputError) unless `settings.allow_empty`."""
    night, ds = plan.night, plan.night.ds
    markers = read_markers(plan, folder)
    con.execute("BEGIN TRANSACTION")
    try:
        run_script(con, "clear_night", {"ds": ds})
        for name in TABLES:
            _stage(con, name, folder, len(plan.parts))
        con.execute(sql("insert_token_rows"), {"ds": ds})
        con.execute(sql("merge_rejects"), {"ds": ds})
        run_script(con, "merge_rollouts", {"ds": ds})
        rejects = Inserter(IntoWarehouse(con, "insert_rejects", ds), REJECT_BATCH)
        _reject_repeated(con, plan, rejects)
        bases, before = [], 0
        for marker in markers:
            bases.append(before)
            before += marker["ledger_lines"]
        con.register("part_bases", pa.table({"part": list(range(len(bases))), "base": bases}))
        run_script(con, "merge_ledger", {"ds": ds})
        con.unregister("part_bases")
        [[rollouts_loaded]] = con.execute("SELECT count(*) FROM m_kept").fetchall()
        counted = dict(
            (capture, (n, masked))
            for capture, n, masked in con.execute(
                "SELECT capture, count(*), count(capture_reason) FROM rollouts "
                "WHERE ds = CAST($ds AS DATE) AND capture IN ('verifiers', 'envelope') GROUP BY capture",
                {"ds": ds},
            ).fetchall()
        )
        rollout_lines = sum(m["rollout_lines"] for m in markers)
        gym, failed = decide(con, night, rollouts_loaded, sum(m["failures_read"] for m in markers))
        rejects.flush()
        if rollouts_loaded == 0 and not settings.allow_empty:
            raise InputError(
                f"{night.path('rollouts', '')}: no rollout could be read ({len(night.rollouts)} files, "
                f"{rollout_lines} lines); an empty night is published only with --allow-empty"
            )
        con.register("failed_attempts", pa.table({"rollout_id": pa.array(sorted(failed), pa.string())}))
        tokens = sql("night_token_rows")
        reject_orphans(con, night, tokens)
        counts = dict(con.execute(sql("count_rejects"), {"ds": ds}).fetchall())
        [loaded] = con.execute(sql("count_loaded", tokens=tokens), {"ds": ds, "token_dir": token_dir(night)}).fetchall()
        con.unregister("failed_attempts")
        ledger_used, token_rows, ledger_failed = loaded
        [[n_ledger_rows]] = con.execute(
            "SELECT count(*) FROM ledger WHERE ds = CAST($ds AS DATE) AND capture IS NULL", {"ds": ds}
        ).fetchall()
        for name in (*TABLES, "kept", "repeated"):
            con.execute(f"DROP TABLE IF EXISTS {'m' if name in ('kept', 'repeated') else 'p'}_{name}")
        con.execute("DROP TABLE IF EXISTS derived_owners")
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except Exception:  # noqa: BLE001, S110 - the error that aborted the merge is the one reported
            pass
        raise
    token_rows += sum(m["too_big_rows"] for m in markers)  # read, and rejected
    summary = LoadSummary(
        rollouts=SourceCount(rollout_lines, rollouts_loaded, counts.get("rollouts", 0)),
        ledger=SourceCount(
            sum(m["ledger_lines"] for m in markers), ledger_used, counts.get("ledger", 0), ledger_failed
        ),
        tokens=SourceCount(token_rows, token_rows - counts.get("tokens", 0), counts.get("tokens", 0)),
        n_ledger_rows=n_ledger_rows,
        n_token_files=len(night.tokens),
        sidecars=tuple(night.sidecars),
        gym=gym,
        other_rejects=counts.get("failures", 0) + counts.get("capture", 0),
        traces=counted.get("verifiers", (0, 0)),
        envelopes=counted.get("envelope", (0, 0)),
    )
    for name in ("rollouts", "ledger", "tokens"):
        c = getattr(summary, name)
        if c.read != c.loaded + c.rejected + c.failed_attempts:  # every line and token row is accounted for
            raise RuntimeError(f"internal: {name} {c}")
    return summary


def _reject_repeated(con, plan: LoadPlan, rejects: Inserter) -> None:
    """The reject row of each rollout whose id (or verifiers Episode id) an earlier part
    holds: the one a single process writes for a repeated id, its raw line read again (a
    rare case)."""
    repeated = con.execute(
        "SELECT source_file, source_line, rollout_id, capture, episode FROM m_repeated "
        "ORDER BY part, source_file, source_line"
    ).fetchall()
    by_file: dict[str, list[tuple[int, str, str | None, str | None]]] = {}
    for rel, line, rid, capture, episode in repeated:
        by_file.setdefault(rel, []).append((line, rid, capture, episode))
    for rel, rows in by_file.items():
        raws = _lines_at(plan.night.path("rollouts", rel), {line for line, *_ in rows})
        for line, rid, capture, episode in rows:
            raw = raws.get(line, b"")
            if capture != "verifiers":
                ids = guess_ids(decode(raw, ROLLOUT_DECODER))
                reject(rejects, "rollouts", rel, line, str(seen_before(rid)), raw, *ids)
            elif episode is not None:  # a repeated Episode: as load/verifiers_traces.py rejects it
                reject(rejects, "rollouts", rel, line, str(seen_before(episode, "Episode id")), raw, episode)
            else:
                reject(rejects, "rollouts", rel, line, str(seen_before(rid)), raw, rid)


def _lines_at(path: str, numbers: set[int]) -> dict[int, bytes]:
    last = max(numbers)
    out = {}
    with storage.open_input(path) as fh:
        for k, raw in enumerate(fh, start=1):
            if k in numbers:
                out[k] = raw
            if k >= last:
                break
    return out
