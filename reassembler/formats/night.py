"""The input folder of one night (CONTRACT.md section 2): its rollout, ledger and token files,
in reading order. Lists files only; nothing here opens them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import storage
from ..errors import InputError
from .gym_local import CAPTURE_SUFFIXES, capture_file

# NeMo Gym's local capture mode writes TokenEntry records as <rollout_id>.tokens.jsonl beside
# the lineage files: token arrays, not ledger rows (CONTRACT.md 2, 9.2).
NOT_LEDGER_SUFFIX = ".tokens.jsonl"
# NeMo Gym's rollout collection writes these beside its results file <stem>.jsonl (CONTRACT.md
# 2.1): its failed attempts (read), and the dispatched inputs and metrics (not read).
FAILURES_SUFFIX = "_failures.jsonl"
SIDECAR_SUFFIXES = ("_materialized_inputs.jsonl", "_aggregate_metrics.json")


@dataclass(frozen=True)
class NightFiles:
    root: str  # a location (storage.py): a local path or an s3:// URI
    ds: str
    rollouts: list[str]  # paths relative to their partition folder, in reading order
    ledger: list[str]
    tokens: list[str]  # empty when the night has no tokens folder (CONTRACT.md 9.2)
    sidecars: list[str] = field(default_factory=list)  # Gym's inputs and metrics beside its results: not read
    failures: list[str] = field(default_factory=list)  # Gym's <stem>_failures.jsonl, in rollouts/
    captures: list[str] = field(default_factory=list)  # local-mode capture files, directly in ledger/
    has_tokens: bool = True  # whether tokens/ds=<ds>/ exists

    def path(self, kind: str, rel: str) -> str:
        """The location of a file of the night (storage.py), or of a partition folder (rel "")."""
        return storage.join(self.root, kind, f"ds={self.ds}", rel)


# each partition: the suffix of its files, and whether its subfolders are read
_KINDS: tuple[tuple[str, str | tuple[str, ...], bool], ...] = (
    ("rollouts", (".jsonl", ".json"), False),
    ("ledger", ".jsonl", True),
    ("tokens", ".parquet", False),
)


def find_night(input_dir, ds: str) -> NightFiles:
    """The night's files. The tokens folder may be missing when the ledger folder holds no
    ledger file (a NeMo Gym local-mode night: CONTRACT.md 9.2); every other missing folder
    is an InputError naming it."""
    root = storage.location(input_dir)
    storage.check_bucket(root)
    if storage.is_remote(root):
        return _find_objects(root, ds)
    found: dict[str, list[str]] = {}
    for kind, suffix, recursive in _KINDS:
        part = storage.join(root, kind, f"ds={ds}")
        if (
            kind == "tokens"
            and not storage.is_dir(part)
            and not found["ledger"]
            and storage.is_dir(storage.join(root, "ledger"))
        ):
            found[kind] = []
            continue
        if not storage.is_dir(part):
            raise _missing(root, ds, kind)
        found[kind] = storage.list_files(part, suffix, recursive, NOT_LEDGER_SUFFIX if kind == "ledger" else None)
    captures = storage.list_files(storage.join(root, "ledger", f"ds={ds}"), CAPTURE_SUFFIXES, False)
    has_tokens = storage.is_dir(storage.join(root, "tokens", f"ds={ds}"))
    return _night(root, ds, found, captures, has_tokens)


def _find_objects(root: str, ds: str) -> NightFiles:
    """find_night on object storage: the three partitions listed at once, each once (a
    prefix exists when it holds an object), instead of a round trip per question."""
    parts = [storage.join(root, kind, f"ds={ds}") for kind, _, _ in _KINDS]
    listed = dict(zip(parts, storage.map_ahead(lambda p: storage.list_files(p, "", True), parts, True)))
    found: dict[str, list[str]] = {}
    for (kind, suffix, recursive), part in zip(_KINDS, parts):
        everything = listed[part]
        if kind == "tokens" and not everything and not found["ledger"] and storage.is_dir(storage.join(root, "ledger")):
            found[kind] = []
            continue
        if not everything:
            raise _missing(root, ds, kind)
        found[kind] = storage.select(everything, suffix, recursive, NOT_LEDGER_SUFFIX if kind == "ledger" else None)
    captures = storage.select(listed[parts[1]], tuple(CAPTURE_SUFFIXES), False)
    return _night(root, ds, found, captures, bool(listed[parts[2]]))


def _missing(root: str, ds: str, kind: str) -> InputError:
    part = storage.join(root, kind, f"ds={ds}")
    present = [k for k in ("rollouts", "ledger", "tokens") if storage.is_dir(storage.join(root, k))]
    hint = (
        f"{root} holds {', '.join(k + '/' for k in present)} but no night {ds} in {kind}/"
        if present
        else f"{root} is not an input root: it holds none of rollouts/, ledger/, tokens/"
    )
    return InputError(
        f"{part}: input partition folder is missing ({hint}; expected "
        f"{root}/rollouts/ds={ds}/, {root}/ledger/ds={ds}/ and {root}/tokens/ds={ds}/)"
    )


def _night(root: str, ds: str, found: dict[str, list[str]], captures: list[str], has_tokens: bool) -> NightFiles:
    listed = found["rollouts"]
    sidecars = [rel for rel in listed if rel.endswith(SIDECAR_SUFFIXES)]
    failures = [rel for rel in listed if rel.endswith(FAILURES_SUFFIX)]
    rollouts = [rel for rel in listed if rel.endswith(".jsonl") and rel not in sidecars and rel not in failures]
    return NightFiles(
        root,
        ds,
        rollouts,
        found["ledger"],
        found["tokens"],
        sidecars,
        failures,
        [rel for rel in captures if capture_file(rel) is not None],
        has_tokens=has_tokens,
    )
