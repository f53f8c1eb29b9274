"""A night's input cut into load parts (docs/deploy-celery.md: the load in parts).

A part is a share of the night's files that is parsed and checked on its own, on any
worker (load/part_load.py), into Parquet in the run's folder; the warehouse task then
merges the parts (load/merge.py). The cut is made once, from the night's listing, and
written to the run's folder as `load/plan.json`, so every part task and the merge see the
same files whatever arrives later. Invariants of a plan:

- every file of the night is in exactly one part, whole (a file is never cut);
- each kind (rollout files, ledger files, token files, failures files, local-mode
  captures) is cut into contiguous runs in reading order, run k in part k, balanced by bytes:
  so part k's rollout lines all come before part k+1's, and the merge numbers them in order;
- a NeMo Gym local-mode capture (its entries, intents, incomplete and state files) is one
  unit: its files are always in one part.

The number of parts: `Settings.load_parts`, else one per PART_BYTES of input (at least 1).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace

from .. import storage
from ..errors import InputError
from ..formats.gym_local import capture_file
from ..formats.night import NightFiles

SEAL = "seal"  # a marker's (or the plan's) own SHA-256, of the rest of it as canonical JSON


def sealed(marker: dict) -> bytes:
    """A step's marker as written: its JSON with `seal`, the SHA-256 of the rest, so that a
    marker edited since (a count changed by hand) is told from the step's own."""
    import hashlib

    body = {k: v for k, v in marker.items() if k != SEAL}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({**body, SEAL: hashlib.sha256(canonical).hexdigest()}, indent=1, sort_keys=True).encode()


def seal_holds(marker: dict) -> bool:
    """Whether a marker read back is the one `sealed` wrote."""
    import hashlib

    body = {k: v for k, v in marker.items() if k != SEAL}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return marker.get(SEAL) == hashlib.sha256(canonical).hexdigest()


PART_BYTES = 256 << 20  # the default: one part per this much input
BUCKET_BYTES = 16 << 10  # never more merge buckets than one per this much input (a rollout or a few each)
log = logging.getLogger(__name__)


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


PLAN = "plan.json"
PLAN_VERSION = 2  # 2: the merge's buckets


@dataclass(frozen=True)
class LoadPlan:
    """The night (every file) and its parts (each a NightFiles holding its share only)."""

    night: NightFiles
    parts: list[NightFiles]
    input_bytes: int
    buckets: int = 1  # the merge's fan-out: each part splits its per-call rows into as many (merge/)

    @property
    def plan_id(self) -> str:
        """A digest of the plan: a part's marker names the plan it was parsed for."""
        import hashlib

        return hashlib.sha256(self.to_json()).hexdigest()[:16]

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "version": PLAN_VERSION,
                "night": asdict(self.night),
                "parts": [asdict(p) for p in self.parts],
                "input_bytes": self.input_bytes,
                "buckets": self.buckets,
            },
            indent=1,
            sort_keys=True,  # canonical: the plan read back (sealed, its keys sorted) has the same plan_id
        ).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> LoadPlan:
        try:
            plan = json.loads(data)
        except ValueError as e:
            raise InputError(f"{where}: the load plan is unreadable ({e}); plan the load again") from None
        if not isinstance(plan, dict):
            raise InputError(f"{where}: the load plan is not a JSON object; plan the load again")
        if plan.get("version") != PLAN_VERSION:
            raise InputError(
                f"{where}: load plan of version {plan.get('version')}, expected {PLAN_VERSION}; plan the load again"
            )
        if SEAL in plan and not seal_holds(plan):  # write_plan seals it: changed since, by hand or a damaged store
            raise InputError(f"{where}: the load plan was changed since it was planned; plan the load again")
        plan.pop(SEAL, None)
        try:
            return cls(
                NightFiles(**plan["night"]),
                [NightFiles(**p) for p in plan["parts"]],
                plan["input_bytes"],
                plan["buckets"],
            )
        except (KeyError, TypeError) as e:
            raise InputError(f"{where}: the load plan lacks or mistypes {e}; plan the load again") from None


def default_parts(input_bytes: int) -> int:
    return max(1, -(-input_bytes // PART_BYTES))


def _cut(units: list[tuple[list[str], int]], parts: int) -> list[list[str]]:
    """Units (files of one unit, bytes) cut into `parts` contiguous runs of about equal bytes."""
    total = sum(size for _, size in units)
    out: list[list[str]] = [[] for _ in range(parts)]
    before = 0
    for files, size in units:
        # the unit goes to the part its middle byte falls in
        k = min(parts - 1, (2 * before + size) * parts // (2 * total)) if total else 0
        out[k].extend(files)
        before += size
    return out


def plan_parts(night: NightFiles, parts: int | None = None, buckets: int = 1, asked: bool = True) -> LoadPlan:
    """Cut `night` into `parts` parts (None: one per PART_BYTES; never more than the files of
    its kind with the most), whose per-call rows the merge takes in `buckets` buckets (never
    more than one per BUCKET_BYTES of input; a warning says so when they were `asked` for,
    an info line when they follow the shards). Sizes come from the
    listing on object storage, a stat locally; a file gone since counts 0 bytes (its read
    is what fails, naming it)."""
    kinds = {
        "rollouts": ("rollouts", night.rollouts),
        "failures": ("rollouts", night.failures),
        "ledger": ("ledger", night.ledger),
        "captures": ("ledger", night.captures),
        "tokens": ("tokens", night.tokens),
    }
    locations = [night.path(folder, rel) for folder, rels in kinds.values() for rel in rels]
    size_of = dict(zip(locations, storage.sizes(locations, missing=0)))
    total = sum(size_of.values())
    n = parts or default_parts(total)
    most = max(1, max(len(rels) for _, rels in kinds.values()))  # a part is whole files: never more parts
    if n > most:
        log.warning("load parts %d lowered to %d (the night's input is %d files of one kind at most)", n, most, most)
        n = most
    fill = max(1, -(-total // BUCKET_BYTES))  # a bucket per BUCKET_BYTES of input at most
    if buckets > fill:
        log.log(logging.WARNING if asked else logging.INFO, "merge buckets %d lowered to %d (one per %s of the "
                "night's %s of input)", buckets, fill, _size(BUCKET_BYTES), _size(total))  # fmt: skip
        buckets = fill
    cuts: dict[str, list[list[str]]] = {}
    for kind, (folder, rels) in kinds.items():
        if kind == "captures":  # a rollout's capture files are one unit, units in key order
            by_key: dict[str, list[str]] = {}
            for rel in rels:
                key, _ = capture_file(rel) or ("", "")
                by_key.setdefault(key, []).append(rel)
            units = [(by_key[key], sum(size_of[night.path(folder, r)] for r in by_key[key])) for key in sorted(by_key)]
        else:
            units = [([rel], size_of[night.path(folder, rel)]) for rel in rels]
        cuts[kind] = _cut(units, n)
    shares = [
        replace(  # sidecars: the night's, not a part's
            night,
            rollouts=cuts["rollouts"][k],
            failures=cuts["failures"][k],
            ledger=cuts["ledger"][k],
            captures=cuts["captures"][k],
            tokens=cuts["tokens"][k],
            sidecars=[],
        )
        for k in range(n)
    ]
    return LoadPlan(night, shares, total, max(1, buckets))


def plan_location(folder: str) -> str:
    return storage.join(folder, "load", PLAN)


def part_folder(folder: str, k: int) -> str:
    return storage.join(folder, "load", f"part-{k:05d}")


STARTED = "started.json"  # in a run's folder: when its load was planned (publish/protocol.py's collect_runs)


def write_plan(folder: str, plan: LoadPlan) -> None:
    """The plan into the run's folder, sealed (its SHA-256 in it: read_plan refuses it changed),
    after the time it was planned (the run is in flight from then: another run's load leaves
    its folder alone)."""
    from datetime import UTC, datetime

    started = {"planned_at": datetime.now(UTC).isoformat(timespec="microseconds")}
    storage.write_bytes(storage.join(folder, STARTED), json.dumps(started).encode())
    storage.write_bytes(plan_location(folder), sealed(json.loads(plan.to_json())))


def read_plan(folder: str) -> LoadPlan:
    where = plan_location(folder)
    try:
        return LoadPlan.from_json(storage.read_bytes(where), where)
    except FileNotFoundError:
        raise InputError(
            f"{where}: this run's load plan is gone: its folder was removed (a load of the night by another run "
            "removes the folders of runs not in flight), or the plan task did not run; run the night again"
        ) from None
