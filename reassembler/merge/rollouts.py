"""The merge's global step (merge/__init__.py): what needs every rollout of the night at
once, over the load parts' per-rollout tables only (their rollout rows, samples, failures,
local-mode outcomes, and their calls counted per rollout), never a call:

- the first line of each rollout id and of each verifiers Episode is kept (the reject rows
  of the others written from their raw lines, a rare case), rows numbered across the night;
- given-up samples, which capture each rollout is read from, the derived calls it keeps
  (load/gym_capture.py: decide) and where their numbers start (`derived_base`: after every
  ledger line, in rollout order, as one process numbered them);
- verifiers slots, an empty night refused, the shard ranges (sql/merge_plan.sql).

Written into the run's folder (merge/staging.py): `rollouts.parquet` (the night's rollout
rows), `decisions.parquet` (per rollout, split by bucket: kept or a failed attempt, its
group, slot, shard, sort bucket, derived calls and the part's row of its line), `groups.parquet` (per group: shard), the
repeated lines' reject rows among the night's per-call files, then the marker.
"""

from __future__ import annotations

from dataclasses import asdict

import pyarrow as pa

from .. import call_tables, storage
from ..errors import InputError
from ..formats.fields import ROLLOUT_ROW, ddl
from ..load import shard_plan
from ..load.gym_capture import CAPTURE_SEQ_BASE
from ..load.inserter import REJECT_BATCH, Inserter, IntoWarehouse
from ..load.json_lines import ROLLOUT_DECODER, decode, guess_ids, reject, seen_before
from ..load.parts import LoadPlan
from ..settings import DEFAULTS, Settings
from ..warehouse import run_script
from .captures import decide
from .staging import (
    handed,
    merge_dir,
    part_files,
    read_part_markers,
    scratch,
    stage,
    write_bucketed,
    write_in_order,
    write_marker,
    write_query,
)

NAME = "rollouts"
DECISIONS = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("kept", pa.bool_()),
        ("failed", pa.bool_()),
        ("group_id", pa.string()),
        ("slot", pa.int32()),
        ("shard", pa.int32()),
        ("owner_part", pa.int64()),
        ("owner_kind", pa.string()),
        ("derived_base", pa.int64()),
        ("sort_bucket", pa.int64()),
        ("line_part", pa.int64()),
        ("line_seq", pa.int64()),
    ]
)


def merge_rollouts(plan: LoadPlan, folder: str, calls: tuple[str, str], settings: Settings = DEFAULTS) -> dict:
    """The global step of the night of `plan` (its parts in `folder`, all finished:
    RuntimeError otherwise); `calls`: the output and run the night's per-call files go to.
    Returns its marker."""
    night, ds = plan.night, plan.night.ds
    markers = read_part_markers(plan, folder)
    out = merge_dir(folder)
    shards = settings.shards
    con = scratch(settings.duckdb)
    try:
        run_script(con, "schema", rollouts_columns=ddl(ROLLOUT_ROW))
        run_script(con, "night_rollouts")
        call_tables.open_night(con)
        for name in ("rollouts", "samples", "failures", "outcomes"):
            stage(con, f"p_{name}", part_files(plan, folder, name, markers, whole=True))
        stage(con, "p_calls", part_files(plan, folder, "calls_by_rollout", markers, whole=True))
        run_script(con, "merge_rollouts", {"ds": ds})
        rejects = Inserter(IntoWarehouse(con, "insert_rejects", ds), REJECT_BATCH)
        _reject_repeated(con, plan, rejects)
        rejects.flush()
        [[rollouts_loaded]] = con.execute("SELECT count(*) FROM m_kept").fetchall()
        rollout_lines = sum(m["rollout_lines"] for m in markers)
        failures = (sum(m["failures_read"] for m in markers), sum(m.get("failures_rejected", 0) for m in markers))
        gym, failed = decide(con, night, rollouts_loaded, *failures)
        if rollouts_loaded == 0 and not settings.allow_empty:
            raise InputError(
                f"{night.path('rollouts', '')}: no rollout could be read ({len(night.rollouts)} files, "
                f"{rollout_lines} lines); an empty night is published only with --allow-empty"
            )
        counted = {
            capture: [n, masked]
            for capture, n, masked in con.execute(
                "SELECT capture, count(*), count(capture_reason) FROM rollouts "
                "WHERE capture IN ('verifiers', 'envelope') GROUP BY capture"
            ).fetchall()
        }
        con.register("failed_keys", pa.table({"rollout_id": pa.array(sorted(failed), pa.string())}))
        run_script(
            con,
            "merge_plan",
            {"ds": ds, "shards": shards, "base": CAPTURE_SEQ_BASE, "bucket_rows": shard_plan.BUCKET_ROWS},
        )
        reader = con.sql("SELECT * FROM m_decisions").to_arrow_reader(65_536)
        write_bucketed(reader, storage.join(out, "decisions.parquet"), "rollout_id", plan.buckets, DECISIONS)
        con.unregister("failed_keys")
        write_in_order(con, storage.join(out, "rollouts.parquet"), "rollouts", "rollout_seq")
        write_query(con, storage.join(out, "groups.parquet"), "SELECT * FROM m_groups ORDER BY group_id")
        output, run = calls
        repeated = call_tables.night_folder(output, "rejects", ds, run)
        n_repeated = write_query(
            con,
            storage.join(repeated, "rollouts.parquet"),
            "SELECT * EXCLUDE (ds) FROM temp.rejects",
            schema=call_tables.schemas()["rejects"],
        )
        rejected = dict(con.execute("SELECT source, count(*) FROM temp.rejects GROUP BY source").fetchall())
    finally:
        con.close()
    marker = {
        "plan": plan.plan_id,
        "rollout_lines": rollout_lines,
        "rollouts_loaded": rollouts_loaded,
        "repeated_rejects": n_repeated,
        "rejects": rejected,
        "gym": asdict(gym),
        "traces": counted.get("verifiers", [0, 0]),
        "envelopes": counted.get("envelope", [0, 0]),
        "shards": shards,
        "files": handed(out, ["decisions.parquet", "rollouts.parquet", "groups.parquet"]),
    }
    write_marker(folder, NAME, marker)
    return marker


def _reject_repeated(con, plan: LoadPlan, rejects: Inserter) -> None:
    """The reject row of each rollout whose id (or verifiers Episode id) an earlier line of
    the night holds: the one a single process writes for a repeated id, its raw line read
    again (a rare case)."""
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
