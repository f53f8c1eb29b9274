"""The input folder of one night (CONTRACT.md section 2): its rollout, ledger and token files,
in reading order. Lists files only; nothing here opens them.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

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
    root: Path
    ds: str
    rollouts: list[str]  # paths relative to their partition folder, in reading order
    ledger: list[str]
    tokens: list[str]  # empty when the night has no tokens folder (CONTRACT.md 9.2)
    sidecars: list[str] = field(default_factory=list)  # Gym's inputs and metrics beside its results: not read
    failures: list[str] = field(default_factory=list)  # Gym's <stem>_failures.jsonl, in rollouts/
    captures: list[str] = field(default_factory=list)  # local-mode capture files, directly in ledger/
    has_tokens: bool = True  # whether tokens/ds=<ds>/ exists

    def path(self, kind: str, rel: str) -> Path:
        return self.root / kind / f"ds={self.ds}" / rel


def _list_files(part: Path, suffix: str | tuple[str, ...], recursive: bool, exclude: str | None = None) -> list[str]:
    """Files ending in `suffix` in a partition folder (and its subfolders when `recursive`),
    as sorted relative paths. Symbolic links are followed; a dangling link, an unreadable
    entry, a link loop, or anything but a file or folder (a named pipe, a socket, a device:
    reading it could block) is an InputError naming it: nothing is skipped silently."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()

    def visit(folder: Path, rel: str) -> None:
        st = folder.stat()
        if (st.st_dev, st.st_ino) in seen:
            raise InputError(f"{folder}: symbolic link loop (this folder is reached twice)")
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise InputError(f"{folder}: cannot list the folder ({e.strerror})") from e
        for entry in entries:
            name = f"{rel}{entry.name}"
            try:
                entry.name.encode("utf-8")
            except UnicodeEncodeError:  # undecodable bytes, kept by Python as lone surrogates
                raise InputError(f"{folder}: the name {ascii(entry.name)} is not valid UTF-8; rename it") from None
            try:
                is_dir, is_file = entry.is_dir(), entry.is_file()
            except OSError as e:
                raise InputError(f"{folder / entry.name}: cannot read ({e.strerror})") from e
            if not (is_dir or is_file):
                try:
                    mode = os.stat(entry.path).st_mode
                except FileNotFoundError:
                    if not (entry.name.endswith(suffix) or recursive):
                        continue  # a link that would not be read either way
                    raise InputError(
                        f"{folder / entry.name}: dangling symbolic link (points to {os.readlink(entry.path)})"
                    ) from None
                except OSError as e:
                    raise InputError(f"{folder / entry.name}: cannot read ({e.strerror})") from e
                # a FIFO, socket or device: reading it could block or never end
                raise InputError(f"{folder / entry.name}: not a regular file ({_kind(mode)}); only files are read")
            if is_dir:
                if recursive:
                    visit(Path(entry.path), name + "/")
            elif is_file and entry.name.endswith(suffix) and not (exclude and entry.name.endswith(exclude)):
                if not os.access(entry.path, os.R_OK):
                    raise InputError(f"{folder / entry.name}: file is not readable")
                found.append(name)

    visit(part, "")
    return sorted(found)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file or folder"


def find_night(input_dir: str | Path, ds: str) -> NightFiles:
    """The night's files. The tokens folder may be missing when the ledger folder holds no
    ledger file (a NeMo Gym local-mode night: CONTRACT.md 9.2); every other missing folder
    is an InputError naming it."""
    root = Path(input_dir)
    found: dict[str, list[str]] = {}
    for kind, suffix, recursive in (
        ("rollouts", (".jsonl", ".json"), False),
        ("ledger", ".jsonl", True),
        ("tokens", ".parquet", False),
    ):
        part = root / kind / f"ds={ds}"
        if kind == "tokens" and not part.is_dir() and not found["ledger"] and (root / "ledger").is_dir():
            found[kind] = []
            continue
        if not part.is_dir():
            present = [k for k in ("rollouts", "ledger", "tokens") if (root / k).is_dir()]
            hint = (
                f"{root} holds {', '.join(k + '/' for k in present)} but no night {ds} in {kind}/"
                if present
                else f"{root} is not an input root: it holds none of rollouts/, ledger/, tokens/"
            )
            raise InputError(
                f"{part}: input partition folder is missing ({hint}; expected "
                f"{root}/rollouts/ds={ds}/, {root}/ledger/ds={ds}/ and {root}/tokens/ds={ds}/)"
            )
        found[kind] = _list_files(part, suffix, recursive, NOT_LEDGER_SUFFIX if kind == "ledger" else None)
    listed = found["rollouts"]
    sidecars = [rel for rel in listed if rel.endswith(SIDECAR_SUFFIXES)]
    failures = [rel for rel in listed if rel.endswith(FAILURES_SUFFIX)]
    rollouts = [rel for rel in listed if rel.endswith(".jsonl") and rel not in sidecars and rel not in failures]
    captures = _list_files(root / "ledger" / f"ds={ds}", CAPTURE_SUFFIXES, False)
    return NightFiles(
        root,
        ds,
        rollouts,
        found["ledger"],
        found["tokens"],
        sidecars,
        failures,
        [rel for rel in captures if capture_file(rel) is not None],
        has_tokens=(root / "tokens" / f"ds={ds}").is_dir(),
    )
