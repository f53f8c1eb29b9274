"""The input of one night (CONTRACT.md section 2): its rollout, ledger and token files, in
reading order, from where the run's locations point (formats/locations.py). Lists files
only; nothing here opens them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace

from .. import storage
from ..errors import InputError
from .art_files import HISTORY, is_art_file, step_of, steps_recorded_on
from .gym_envelope import CONTRACT_KEYS
from .gym_local import CAPTURE_SUFFIXES, capture_file
from .locations import Inputs, Location, allowed_roots, inside, real
from .verifiers import is_traces_file

# NeMo Gym's local capture mode writes TokenEntry records as <rollout_id>.tokens.jsonl beside
# the lineage files: token arrays, not ledger rows (CONTRACT.md 2, 9.2).
NOT_LEDGER_SUFFIX = ".tokens.jsonl"
# NeMo Gym's rollout collection writes these beside its results file <stem>.jsonl (CONTRACT.md
# 2.1): its failed attempts (read), and the dispatched inputs and metrics (not read).
FAILURES_SUFFIX = "_failures.jsonl"
SIDECAR_SUFFIXES = ("_materialized_inputs.jsonl", "_aggregate_metrics.json")


@dataclass(frozen=True)
class NightFiles:
    root: str  # the input root (a location: storage.py), or the rollouts folder when none was given
    ds: str
    rollouts: list[str]  # paths relative to their kind's folder, in reading order
    ledger: list[str]
    tokens: list[str]  # empty when the night has no tokens folder (CONTRACT.md 9.2)
    sidecars: list[str] = field(default_factory=list)  # Gym's inputs and metrics beside its results: not read
    failures: list[str] = field(default_factory=list)  # Gym's <stem>_failures.jsonl, in rollouts/
    captures: list[str] = field(default_factory=list)  # local-mode capture files, directly in ledger/
    has_tokens: bool = True  # whether the tokens location exists
    folders: dict[str, str] = field(default_factory=dict)  # each kind's folder; empty: the contract's under root
    locations: dict[str, str] = field(default_factory=dict)  # each kind's location as resolved (recorded)
    inputs: str = ""  # the run's input settings (formats/locations.py: Inputs.text), for the run history
    # several rollouts locations: each one's folder (folders["rollouts"] is the one they share)
    rollout_folders: list[str] = field(default_factory=list)
    art_model: str | None = None  # --layout art: ART's model folder's name and its project (CONTRACT.md 13.3, 13.5)
    art_project: str | None = None

    def path(self, kind: str, rel: str) -> str:
        """The location of a file of the night (storage.py), or of a kind's folder (rel "")."""
        if kind in self.folders:
            return storage.join(self.folders[kind], rel)
        return storage.join(self.root, kind, f"ds={self.ds}", rel)

    @property
    def remote(self) -> bool:
        """Whether any of its files is on object storage."""
        return any(storage.is_remote(f) for f in (self.folders or {"": self.root}).values())


# each kind: the suffix of its files, and whether its subfolders are read
_KINDS: dict[str, tuple[str | tuple[str, ...], bool]] = {
    "rollouts": ((".jsonl", ".json", ".parquet"), False),  # .parquet: OpenPipe ART's trajectory files (13)
    "ledger": (".jsonl", True),
    "tokens": (".parquet", False),
}


def find_night(where, ds: str) -> NightFiles:
    """The night's files, from `where`: an input root in the contract's layout, or the
    run's `Inputs` (formats/locations.py). The tokens location may be missing when the ledger
    holds no ledger file (a NeMo Gym local-mode night: CONTRACT.md 9.2), and the ledger and
    tokens locations when the rollouts hold a verifiers traces file (10.2) or a NeMo Gym
    compaction-envelope line (11.2.3); every other missing
    location, and a file pattern that matches nothing, is an InputError naming it; so is a
    file that two locations would both read."""
    inputs = Inputs.of(where)
    resolved = inputs.resolve(ds)
    several = inputs.rollout_locations(ds)
    every = [*several, *list(resolved.values())[1:]]
    remote = {storage.split(loc.folder)[0]: loc.folder for loc in every if storage.is_remote(loc.folder)}
    for folder in remote.values():  # each bucket once: a clear error before any listing
        storage.check_bucket(folder)
    listings = _Listings()
    listings.prefetch(sorted({loc.folder for loc in every if storage.is_remote(loc.folder)}))
    found: dict[str, list[str]] = {}
    present: dict[str, bool] = {}
    if len(several) > 1:  # the rollouts of several locations: relative to the folder they share
        resolved["rollouts"] = _rollouts_of(several, listings, inputs, ds, found)
        present["rollouts"] = True
    for kind, (suffix, recursive) in _KINDS.items():
        if kind in found:
            continue
        loc = resolved[kind]
        exclude = NOT_LEDGER_SUFFIX if kind == "ledger" else None
        rels, present[kind] = listings.files(loc, suffix, recursive, exclude)
        if not present[kind] or (loc.pattern and not rels):
            if kind == "tokens" and not found["ledger"] and present["ledger"]:
                found[kind] = []  # a night without ledger files needs no token store (9.2)
                continue
            if kind != "rollouts" and not present[kind] and _carry_tokens(found["rollouts"], resolved["rollouts"]):
                found[kind] = []  # a verifiers run, Gym's compaction agent: no ledger nor token store (10.2, 11.2)
                continue
            raise _missing(inputs, resolved, ds, kind)
        found[kind] = rels
    captures = listings.files(resolved["ledger"], tuple(CAPTURE_SUFFIXES), False)[0] if present["ledger"] else []
    if resolved["rollouts"].pattern and len(several) == 1 and inputs.layout != "art":
        found["rollouts"] = _with_sidecars(found["rollouts"], listings.everything(resolved["rollouts"]))
    if inputs.layout == "art":
        found["rollouts"] = _art_steps(inputs, resolved["rollouts"], found["rollouts"], ds)
    _read_once(resolved, found, captures)
    folders = {kind: loc.folder for kind, loc in resolved.items()}
    night = _night(
        inputs.input or several[0].folder,
        ds,
        found,
        captures,
        present["tokens"],
        folders,
        {kind: loc.where for kind, loc in resolved.items()},
        inputs.text(),
    )
    if len(several) > 1:
        return replace(night, rollout_folders=[loc.folder for loc in several])
    if inputs.layout == "art" and inputs.input:
        model = storage.location(inputs.input).rstrip("/")
        project = model.rsplit("/", 3)[-3] if model.count("/") >= 3 else None
        return replace(night, art_model=storage.name(model), art_project=project)
    return night


def _art_steps(inputs: Inputs, rollouts: Location, rels: list[str], ds: str) -> list[str]:
    """--layout art (13.2.2): the train files whose step history.jsonl records on `ds`; a
    step it does not record: the file's modification time, as a UTC date."""
    assert inputs.input is not None
    try:
        history = storage.read_bytes(storage.join(storage.location(inputs.input), HISTORY), 64 << 20).decode(
            "utf-8", "replace"
        )
    except FileNotFoundError:
        history = ""
    on_ds, recorded = steps_recorded_on(history, ds)
    out = []
    for rel in rels:
        step = step_of(rel)
        if step in on_ds:
            out.append(rel)
        elif step not in recorded and storage.modified(storage.join(rollouts.folder, rel)).date().isoformat() == ds:
            out.append(rel)
    return out


def _rollouts_of(
    several: list[Location], listings: _Listings, inputs: Inputs, ds: str, found: dict[str, list[str]]
) -> Location:
    """The rollout files of several locations, in the order given (each location's in its
    own order, with Gym's sidecars beside a results file it names), into found["rollouts"]
    relative to the deepest folder they share, which the returned Location names (nothing
    lists it). Each location must exist and match a file, as one location must; every
    location on one store (one bucket); a file two of them name is an InputError."""
    suffix, recursive = _KINDS["rollouts"]
    stores = {storage.split(loc.folder)[0] if storage.is_remote(loc.folder) else "local" for loc in several}
    if len(stores) > 1:
        raise InputError(
            f"rollouts locations {', '.join(loc.where for loc in several)}: several rollouts locations of one night "
            "must be on one store (one bucket, or all local)"
        )
    common = _shared_folder([loc.folder for loc in several])
    rels: list[str] = []
    named: dict[str, str] = {}
    for loc in several:
        mine, exists = listings.files(loc, suffix, recursive)
        if not exists or (loc.pattern and not mine):
            problem = "matches no file" if loc.pattern else "is missing"
            raise InputError(f"{loc.where}: the rollouts location of night {ds} {problem} (one of several)")
        if loc.pattern:
            mine = _with_sidecars(mine, listings.everything(loc))
        for rel in mine:
            full = storage.join(loc.folder, rel)
            if full in named:
                raise InputError(f"{full}: both rollouts locations {named[full]} and {loc.where} name it")
            named[full] = loc.where
            rels.append(storage.relative(common, full))
    found["rollouts"] = rels
    return Location("rollouts", common)


def _shared_folder(folders: list[str]) -> str:
    """The deepest folder holding every one of `folders` (locally at least `/`)."""
    split = [f.rstrip("/").split("/") for f in folders]
    shared: list[str] = []
    for segments in zip(*split):
        if len(set(segments)) > 1:
            break
        shared.append(segments[0])
    return "/".join(shared) or "/"


_ENVELOPE_KEYS = tuple(f'"{key}"'.encode() for key in CONTRACT_KEYS)


def _carry_tokens(rels: list[str], rollouts: Location) -> bool:
    """Whether the rollouts carry every call's tokens themselves: a verifiers traces file
    (10.2, by its name), or a NeMo Gym compaction-envelope line (11.2.3: a contract key in
    some line; read only when the ledger location is missing, a block at a time, up to the
    first one found)."""
    if any(map(is_traces_file, rels)) or any(map(is_art_file, rels)):
        return True  # verifiers traces, OpenPipe ART trajectory files (13.2.1)
    keep = max(map(len, _ENVELOPE_KEYS)) - 1
    for rel in rels:
        try:
            with storage.open_input(storage.join(rollouts.folder, rel)) as fh:
                tail = b""
                while block := fh.read(1 << 20):
                    if any(key in tail + block for key in _ENVELOPE_KEYS):
                        return True
                    tail = block[-keep:]
        except OSError:
            continue  # the load names the file
    return False


def check_output_apart(night: NightFiles, output, **local) -> None:
    """InputError when the output root is an input location of the night or lies inside one
    (rows, audit and the warehouse would land beside the capture, and a later night's listing
    would read them): each compared as written and, locally, with its links resolved. The
    same for each local place in `local` (warehouse=, temp_directory=: the warehouse file and
    the DuckDB spill folder), which write files too."""
    places = [("input", night.root), *night.folders.items()]
    if night.rollout_folders:  # several: each location, not the folder they share
        places = [(k, f) for k, f in places if k != "rollouts"]
        places += [("rollouts", f) for f in night.rollout_folders]
    written = [("output", str(output), "an output root")] + [
        (name.replace("_", " "), str(where), f"a {name.replace('_', ' ')}") for name, where in local.items() if where
    ]

    def forms(loc: str) -> set[str]:
        return {loc} if storage.is_remote(loc) else {loc, os.path.realpath(loc)}

    for what, where, choose in written:
        out = storage.location(where)
        for kind, folder in places:
            if not folder:
                continue
            for o in forms(out):
                for f in forms(storage.location(folder)):
                    if o == f or o.startswith(f.rstrip("/") + "/"):
                        relation = "is" if o == f else "lies inside"
                        raise InputError(
                            f"{where}: the {what} {relation} the {kind} location {folder}; "
                            f"choose {choose} outside the night's input"
                        )


def confine_files(night: NightFiles, kinds: list[str], roots: list[str]) -> None:
    """InputError unless every file the night reads of `kinds` (the locations someone else
    chose, e.g. in a DAG's trigger form) resolves, links followed, inside the allowed
    `roots` (formats/locations.py's confine checks the locations' folders; this, each file
    in them: a link to a file outside is refused, naming it)."""
    allowed = allowed_roots(night.ds, roots)
    of_kind = {
        "rollouts": [*night.rollouts, *night.failures, *night.sidecars],
        "ledger": [*night.ledger, *night.captures],
        "tokens": night.tokens,
    }
    for kind in kinds:
        for rel in of_kind[kind]:
            where = night.path(kind, rel)
            resolved = real(where)
            if not inside(resolved, allowed):
                raise InputError(
                    f"{where}: a file of the {kind} location given for this run resolves to {resolved}, outside the "
                    f"allowed input roots ({', '.join(allowed) or 'none'})"
                )


class _Listings:
    """Each folder listed once, whichever kinds name it: on object storage everything under
    it at once (a prefix exists when it holds an object), locally a walk per suffix."""

    def __init__(self):
        self._seen: dict[tuple, list[str]] = {}

    def prefetch(self, folders: list[str]) -> None:
        """List these object-storage folders side by side (a round trip each, at once)."""
        for folder, listed in zip(folders, storage.map_ahead(lambda f: storage.list_files(f, "", True), folders, True)):
            self._seen[(folder,)] = listed

    def _list(self, folder: str, suffix, recursive: bool, exclude) -> list[str]:
        if storage.is_remote(folder):
            key: tuple = (folder,)
            if key not in self._seen:
                self._seen[key] = storage.list_files(folder, "", True)
            return storage.select(self._seen[key], suffix, recursive, exclude)
        key = (folder, suffix, recursive, exclude)
        if key not in self._seen:
            self._seen[key] = storage.list_files(folder, suffix, recursive, exclude)
        return self._seen[key]

    def files(self, loc: Location, suffix, recursive: bool, exclude=None) -> tuple[list[str], bool]:
        """(the kind's files at `loc`, whether `loc`'s folder exists)."""
        deep = recursive or loc.deep
        rels = [rel for rel in self._list(loc.folder, suffix, deep, exclude) if loc.matches(rel)]
        if storage.is_remote(loc.folder):
            exists = bool(self._list(loc.folder, "", True, None))
        else:
            exists = storage.is_dir(loc.folder)
        return rels, exists

    def everything(self, loc: Location) -> set[str]:
        return set(self._list(loc.folder, "", loc.deep, None))


def _with_sidecars(results: list[str], beside: set[str]) -> list[str]:
    """The results files a rollouts pattern matched, with the sidecars Gym writes beside
    each (<stem>_failures.jsonl, ...: contract 2.1) when they are there."""
    out = set(results)
    for rel in results:
        if rel.endswith(".jsonl") and not rel.endswith((FAILURES_SUFFIX, *SIDECAR_SUFFIXES)):
            stem = rel[: -len(".jsonl")]
            out.update(stem + s for s in (FAILURES_SUFFIX, *SIDECAR_SUFFIXES) if stem + s in beside)
    return sorted(out)


def _read_once(resolved: dict[str, Location], found: dict[str, list[str]], captures: list[str]) -> None:
    """InputError when two locations would read the same file (say, --rollouts and --ledger
    naming one folder of .jsonl files)."""
    owner: dict[str, str] = {}
    lists = [(kind, found[kind]) for kind in _KINDS] + [("ledger", captures)]
    for kind, rels in lists:
        for rel in rels:
            where = storage.join(resolved[kind].folder, rel)
            real = where if storage.is_remote(where) else os.path.realpath(where)  # links followed
            if owner.setdefault(real, kind) != kind:
                raise InputError(
                    f"{where}: both the {owner[real]} location ({resolved[owner[real]].where}) and the {kind} "
                    f"location ({resolved[kind].where}) would read it"
                    + (f" (it is {real})" if real != where else "")
                    + "; point them at different files"
                )


def _missing(inputs: Inputs, resolved: dict[str, Location], ds: str, kind: str) -> InputError:
    loc = resolved[kind]
    if not inputs.is_plain():
        problem = "matches no file" if loc.pattern else "is missing"
        origin = inputs.template(kind) + ("" if getattr(inputs, kind) else f", layout {inputs.layout}")
        if inputs.input is None and "{input}" in inputs.template(kind):
            origin += "; no --input: {input} is the rollouts location's folder"
        return InputError(f"{loc.where}: the {kind} location of night {ds} {problem} (from {origin})")
    root = str(inputs.input)
    part = loc.folder
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


def _night(
    root: str,
    ds: str,
    found: dict[str, list[str]],
    captures: list[str],
    has_tokens: bool,
    folders: dict[str, str],
    locations: dict[str, str],
    inputs: str,
) -> NightFiles:
    listed = found["rollouts"]
    sidecars = [rel for rel in listed if rel.endswith(SIDECAR_SUFFIXES)]
    failures = [rel for rel in listed if rel.endswith(FAILURES_SUFFIX)]
    rollouts = [
        rel
        for rel in listed
        if (rel.endswith(".jsonl") and rel not in sidecars and rel not in failures) or is_art_file(rel)
    ]
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
        folders=folders,
        locations=locations,
        inputs=inputs,
    )


SETTLE_SECONDS = 30.0  # a local results file changed more recently than this may still grow


def still_written(night: NightFiles, settle: float = SETTLE_SECONDS) -> str | None:
    """Why NeMo Gym's results of the night are not whole yet, or None. Only for the gym
    layout, whose rollout collection writes the results file when the rollouts are done:
    no results file yet, an empty one, one whose last line has no newline, or (local disk,
    where a file grows in place; an object appears whole) one changed in the last `settle`
    seconds. Other layouts keep their rule: the locations exist (and the marker, if set)."""
    if not night.inputs or Inputs.of(night.inputs).layout != "gym":
        return None
    if not night.rollouts:
        return f"{night.locations.get('rollouts', night.path('rollouts', ''))}: no results file yet"
    for rel in night.rollouts:
        where = night.path("rollouts", rel)
        size = storage.size(where)
        if size == 0:
            return f"{where}: the results file is empty (still being written)"
        if storage.read_ranges(where, [(size - 1, 1)], size)[0] != b"\n":
            return f"{where}: the results file's last line is not complete (still being written)"
        if not storage.is_remote(where) and time.time() - os.stat(where).st_mtime < settle:
            return f"{where}: the results file changed in the last {settle:g} s (still being written)"
    return None
