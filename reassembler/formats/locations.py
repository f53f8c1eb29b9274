"""Where a night's three inputs are: each a location template, resolved for one night.

A template names the rollouts, the ledger (capture folder) or the token store of any night,
with placeholders filled from the night: `{ds}` (2026-11-28), `{yyyy}`, `{mm}`, `{dd}`, and
`{input}` (the `--input` root). Resolved, it is one of

- a folder (local or `s3://`): the partition, read as CONTRACT.md section 2 says;
- a file: that file alone (for rollouts, with Gym's sidecars of the same stem beside it,
  contract 2.1);
- a glob (`*`, `?`, `[...]` in some path segment): the files under the longest plain folder
  whose relative path matches it segment by segment (`*` never crosses a `/`).

A layout is the three templates at once: `contract` (this project's `<input>/rollouts/ds=D/`,
`ledger/ds=D/`, `tokens/ds=D/`) or `gym`, NeMo Gym's own per-night output folder: the results
file(s) `*.jsonl` directly in it (with their `_failures` / `_materialized_inputs` sidecars),
`token_id_capture/` as the ledger folder, and the staged dump in `staged/` when there is one.
A template given on its own replaces its layout's. The rollouts may be several templates
(`--rollouts` repeated, the DAG param a list): a night of NeMo Gym results in one folder and
verifiers traces in another is one night, read location after location.

`Inputs` is what a run was told (the CLI's flags, the DAG's settings); `resolve` gives each
kind's `Location` for one night. Nothing here lists or opens a file (formats/night.py does).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import date
from fnmatch import fnmatchcase

from .. import storage
from ..errors import InputError

KINDS = ("rollouts", "ledger", "tokens")
LAYOUTS: dict[str, dict[str, str]] = {
    "contract": {
        "rollouts": "{input}/rollouts/ds={ds}",
        "ledger": "{input}/ledger/ds={ds}",
        "tokens": "{input}/tokens/ds={ds}",
    },
    "gym": {
        "rollouts": "{input}",
        "ledger": "{input}/token_id_capture",
        "tokens": "{input}/staged",
    },
    "art": {  # OpenPipe ART's model folder: the train steps history.jsonl records on the night (CONTRACT.md 13.2)
        "rollouts": "{input}/trajectories/train/*.parquet",
        "ledger": "{input}/ledger",
        "tokens": "{input}/tokens",
    },
}
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class Inputs:
    """A run's input settings: the root, the layout, and any template given on its own."""

    input: str | None = None
    layout: str = "contract"
    rollouts: str | tuple[str, ...] | list[str] | None = None  # several: a tuple of two or more (a list is taken)
    ledger: str | None = None
    tokens: str | None = None

    def __post_init__(self):
        if isinstance(self.rollouts, list | tuple):  # one template stays a string, none is None
            several = tuple(dict.fromkeys(str(r) for r in self.rollouts if r not in (None, "")))
            object.__setattr__(self, "rollouts", None if not several else several[0] if len(several) == 1 else several)
        if self.input is not None:
            object.__setattr__(self, "input", storage.location(self.input))
        if self.layout not in LAYOUTS:
            raise InputError(f"unknown input layout {self.layout!r}; choose one of {', '.join(LAYOUTS)}")
        if self.input is None and any("{input}" in t for t in self.rollout_templates()):
            raise InputError("no input root: give --input, or a location for each of --rollouts, --ledger, --tokens")

    @classmethod
    def of(cls, value) -> Inputs:
        """`value` as Inputs: Inputs, a dict of its fields, the text `text()` wrote, or a
        plain location (the contract's layout under it)."""
        if isinstance(value, Inputs):
            return value
        if isinstance(value, dict):
            return cls(**{k: v for k, v in value.items() if v not in (None, "")})
        text = str(value)
        if text.startswith("{"):
            return cls.of(json.loads(text))
        return cls(input=storage.location(text))

    def template(self, kind: str) -> str:
        """The kind's template (the rollouts': the first of several)."""
        return self.rollout_templates()[0] if kind == "rollouts" else getattr(self, kind) or LAYOUTS[self.layout][kind]

    def rollout_templates(self) -> list[str]:
        """Every rollouts template, in reading order."""
        if isinstance(self.rollouts, tuple | list):  # __post_init__ keeps several as a tuple
            return list(self.rollouts)
        return [self.rollouts or LAYOUTS[self.layout]["rollouts"]]

    def is_plain(self) -> bool:
        """The contract's layout under a root, no template of its own."""
        return self.layout == "contract" and not any(getattr(self, k) for k in KINDS)

    def text(self) -> str:
        """One line for the run history (runs.input_dir): the root when plain, else JSON
        of the settings; `Inputs.of` reads both back."""
        if self.is_plain():
            return str(self.input)
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, sort_keys=True)

    def resolve(self, ds: str) -> dict[str, Location]:
        """Each kind's location for night `ds`. Without an input root, `{input}` is the
        folder of the rollouts location (a verifiers run given as `--rollouts` alone: its
        ledger and tokens folders are missing, as verifiers writes none)."""
        rollouts = self.rollout_locations(ds)[0]
        root = self.input if self.input is not None else rollouts.folder
        return {"rollouts": rollouts} | {
            kind: Location.parse(fill(self.template(kind), ds, root), kind) for kind in KINDS[1:]
        }

    def rollout_locations(self, ds: str) -> list[Location]:
        """Each rollouts location for night `ds`, in reading order (`resolve` gives the first)."""
        return [Location.parse(fill(t, ds, self.input), "rollouts") for t in self.rollout_templates()]

    def wheres(self, ds: str) -> dict[str, str | list[str]]:
        """Each kind's location as named for night `ds` (the rollouts: a list when several),
        for the run history and the logs."""
        named: dict[str, str | list[str]] = {k: loc.where for k, loc in self.resolve(ds).items()}
        several = [loc.where for loc in self.rollout_locations(ds)]
        if len(several) > 1:
            named["rollouts"] = several
        return named


def templates(value) -> str | list[str] | None:
    """A rollouts setting as written in the environment or an Airflow Variable: one template,
    or several as a JSON list (`["/gym/{ds}", "/runs/{ds}/*/traces.jsonl"]`)."""
    if value is None or isinstance(value, list | tuple):
        return None if value is None else [str(t) for t in value]
    text = str(value).strip()
    if text.startswith("["):
        try:
            listed = json.loads(text)
        except ValueError as e:
            raise InputError(f"rollouts setting {text!r}: not a JSON list of templates ({e})") from None
        if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
            raise InputError(f"rollouts setting {text!r}: a JSON list of templates (strings)")
        return listed
    return text or None


def _match(parts: list[str], want: list[str]) -> bool:
    if not want:
        return not parts
    if want[0] == "**":
        return any(_match(parts[k:], want[1:]) for k in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], want[0]) and _match(parts[1:], want[1:])


@dataclass(frozen=True)
class Location:
    """One input of one night: the folder its files are listed from, and, for a file or a
    glob, the pattern their paths relative to it must match."""

    kind: str
    folder: str
    pattern: str | None = None  # None: every file of the kind in the folder

    @classmethod
    def parse(cls, where: str, kind: str) -> Location:
        where = storage.location(where).rstrip("/") or "/"
        segments = where.split("/")
        globbed = next((k for k, s in enumerate(segments) if GLOB.search(s)), None)
        odd = next((s for s in segments if "**" in s and s != "**"), None)
        if odd is not None:
            raise InputError(f"{where}: '**' stands for any number of folders only as a whole segment, not in {odd!r}")
        if globbed is not None:
            if globbed == 0 or (where.startswith(storage.S3) and globbed < 3):
                raise InputError(f"{where}: the {kind} pattern needs a plain folder before its first wildcard")
            return cls(kind, "/".join(segments[:globbed]), "/".join(segments[globbed:]))
        if storage.is_file(where):
            folder, _, name = where.rpartition("/")
            return cls(kind, folder, name)
        return cls(kind, where)

    @property
    def where(self) -> str:
        """The location as it was named (after its placeholders were filled)."""
        return storage.join(self.folder, self.pattern) if self.pattern else self.folder

    @property
    def deep(self) -> bool:
        """Whether the pattern reaches below its folder (more segments, or `**`)."""
        return bool(self.pattern and ("/" in self.pattern or "**" in self.pattern))

    def matches(self, rel: str) -> bool:
        """Segment by segment, `**` standing for any number of folders (none included)."""
        if self.pattern is None:
            return True
        return _match(rel.split("/"), self.pattern.split("/"))


def fill(template: str, ds: str, root: str | None) -> str:
    """`template` with its placeholders filled for night `ds` (InputError naming an unknown one)."""
    day = date.fromisoformat(ds)
    values = {"ds": ds, "yyyy": f"{day.year:04d}", "mm": f"{day.month:02d}", "dd": f"{day.day:02d}"}
    if root is not None:  # the root first: it may hold placeholders of its own (s3://lab/gym/{ds})
        template = template.replace("{input}", str(root).rstrip("/"))

    def one(m: re.Match) -> str:
        if m.group(1) not in values:
            known = ", ".join("{" + k + "}" for k in [*values, "input"])
            raise InputError(f"{template}: unknown placeholder {m.group(0)} (known: {known})")
        return values[m.group(1)]

    return PLACEHOLDER.sub(one, template)


def real(loc: str) -> str:
    """A location with its links resolved (locally; object storage has none)."""
    import os

    loc = storage.location(loc)
    return loc if storage.is_remote(loc) else os.path.realpath(loc)


def allowed_roots(ds: str, roots: list[str]) -> list[str]:
    """The deployment's allowed input roots for night `ds` ({ds} filled), links resolved."""
    return [real(fill(r.strip(), ds, None)).rstrip("/") for r in roots if r.strip()]


def inside(where: str, allowed: list[str]) -> bool:
    """Whether a resolved location is one of `allowed` or lies under one."""
    return any(where == root or where.startswith(root + "/") for root in allowed)


def confine(inputs: Inputs, ds: str, kinds: list[str], roots: list[str]) -> None:
    """InputError unless each of `kinds` (the locations someone else chose, e.g. in a DAG's
    trigger form) resolves, for night `ds`, to a folder at or under one of `roots` (the
    deployment's allowed input roots). Local folders are compared with their links resolved,
    so neither `..` nor a link leads out; object storage by its bucket and prefix."""
    allowed = allowed_roots(ds, roots)
    resolved = inputs.resolve(ds)
    chosen = [
        (kind, loc)
        for kind in kinds
        for loc in (inputs.rollout_locations(ds) if kind == "rollouts" else [resolved[kind]])
    ]
    for kind, loc in chosen:
        if not inside(real(loc.folder), allowed):
            raise InputError(
                f"{loc.where}: the {kind} location given for this run lies outside the allowed input "
                f"roots ({', '.join(allowed) or 'none'}); a deployment allows more with "
                "REASSEMBLER_ALLOWED_INPUT_ROOTS (or the Variable reassembler_allowed_input_roots)"
            )
