"""Mutation check: apply single-line mutations to a copy of the core, one at a time, run the
tests that should notice each, and print which were killed and which survived.

Run by hand before a stop (all of them: ~25 minutes on 2 cores, most of it the baseline run
of every test file named; not part of `make test`):

    .venv/bin/python scripts/mutants.py            # every mutation
    .venv/bin/python scripts/mutants.py -k select  # those whose name contains "select"
    .venv/bin/python scripts/mutants.py -k lease -k grace  # either

The mutations are data, in `scripts/mutants.json` beside this runner: each names a file of
the repository, a line as it is (it must occur exactly once), the line that replaces it, and
the test files to run. The copy is made once (the working
tree's files, committed or not); each mutation is applied to it, tested, and undone. Exit 1
when a mutation survives or no longer applies (the code it names changed: update the list).
The list covers the contract's check families: digests, select, cut, finalize, the
per-token checks, advantages, the publish invariants, the version and gate defaults, and
NeMo Gym's own capture (local-mode entries, rebuilt lines, failures files), verifiers traces;
and around them
the publish protocol (grace periods, path-safe run ids, recovery), the output lease, object
storage (retries, batch deletes, conditional writes), the shard plan, a token row group's
pages against its footer, and the report server's path guards. A mutation names the one
test that catches it where its file is slow.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    line: str
    becomes: str
    tests: tuple[str, ...]


LIST = Path(__file__).with_suffix(".json")  # the mutations: data, beside this runner


def load(path: Path = LIST) -> list[Mutant]:
    """The mutations of `path`: sections (`about`: what they cover), each a list of
    {name, path, line, becomes, tests}."""
    import json

    data = json.loads(path.read_text())
    if data.get("version") != 1:
        raise SystemExit(f"{path}: version {data.get('version')!r}, this runner reads 1")
    out = [
        Mutant(m["name"], m["path"], m["line"], m["becomes"], tuple(m["tests"]))
        for s in data["sections"]
        for m in s["mutants"]
    ]
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: a mutation name repeats")
    return out


MUTANTS = load()


def copy_tree(dest: Path) -> None:
    """The working tree's files (committed or not), without the venv and build output."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for rel in listed:
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_tests(tree: Path, tests: tuple[str, ...]) -> bool:
    """Whether the tests pass in `tree` (its own package first on the path)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "tests"), str(tree / "plugins")]))
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout", "60", *tests],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    return res.returncode == 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", action="append", default=[], help="only the mutations whose name contains this (repeatable)")
    args = p.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.k or any(k in m.name for k in args.k)]
    with tempfile.TemporaryDirectory(prefix="reassembler-mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        probe = subprocess.run(
            [sys.executable, "-c", "import reassembler; print(reassembler.__file__)"],
            cwd=tree,
            env=dict(os.environ, PYTHONPATH=str(tree)),
            capture_output=True,
            text=True,
        )
        assert probe.stdout.strip().startswith(str(tree)), f"the copy is not what gets imported: {probe.stdout}"
        baseline = sorted({t for m in chosen for t in m.tests})
        if not run_tests(tree, tuple(baseline)):
            print("the tests fail on the unmutated code: fix them first")
            return 1
        survivors, stale = [], []
        for m in chosen:
            path = tree / m.path
            original = path.read_text()
            lines = [k for k, line in enumerate(original.splitlines()) if m.line in line]
            if len(lines) != 1:
                stale.append(m)
                print(f"STALE     {m.name}: {m.path} holds {len(lines)} lines with {m.line!r}", flush=True)
                continue
            path.write_text(original.replace(m.line, m.becomes, 1))
            started = time.monotonic()
            try:
                passed = run_tests(tree, m.tests)
            finally:
                path.write_text(original)
            verdict = "SURVIVED" if passed else "killed"
            print(f"{verdict:<9} {m.name} ({m.path}, {time.monotonic() - started:.0f} s)", flush=True)
            if passed:
                survivors.append(m)
    print(f"\n{len(chosen) - len(survivors) - len(stale)} of {len(chosen)} killed", end="")
    print(f"; survived: {', '.join(m.name for m in survivors)}" if survivors else "", end="")
    print(f"; stale: {', '.join(m.name for m in stale)}" if stale else "")
    return 1 if survivors or stale else 0


if __name__ == "__main__":
    sys.exit(main())
