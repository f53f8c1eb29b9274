"""NeMo Gym's fixture nights (tests/data/gym-0.7.0*) laid out as Gym leaves them in its own
output folder of a night, and the published tables of a build to compare."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq

DATA = Path(__file__).parent / "data"
STAGED_DS, LOCAL_DS = "2026-11-29", "2026-11-28"


def gym_folder(dest: Path, fixture: str, ds: str) -> Path:
    """The fixture night as NeMo Gym leaves it in its own output folder of the night:
    `rollouts.jsonl` with its sidecars, `token_id_capture/`, the staged dump in `staged/`."""
    src, night = DATA / fixture, dest / ds
    (night / "token_id_capture").mkdir(parents=True)
    shutil.copy(src / "rollouts" / f"ds={ds}" / "part-000.jsonl", night / "rollouts.jsonl")
    (night / "rollouts_materialized_inputs.jsonl").write_text('{"responses_create_params": {"input": []}}\n')
    for f in (src / "ledger" / f"ds={ds}").iterdir():
        shutil.copy(f, night / "token_id_capture" / f.name)
    if (src / "tokens").exists():
        shutil.copytree(src / "tokens" / f"ds={ds}", night / "staged")
    return night


def tables(out: Path, ds: str) -> dict:
    """The published rows and audit, in a stable order, without the run's id."""
    got = {}
    for kind in ("rows", "audit"):
        t = pq.read_table(out / kind / f"ds={ds}", partitioning=None)
        t = t.drop_columns([c for c in ("run_id",) if c in t.column_names])
        got[kind] = sorted(t.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))
    return got
