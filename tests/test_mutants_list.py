"""The mutation list (scripts/mutants.json) still applies to the code: each mutation names a
file that exists, a line found on exactly one of its lines, a change, and test files that
exist. A move or an edit that leaves a mutation stale fails here, not weeks later when
someone runs scripts/mutants.py."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_mutation_applies_to_exactly_one_line_and_names_tests_that_exist():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import mutants
    finally:
        sys.path.pop(0)
    assert len(mutants.MUTANTS) > 150
    stale = []
    for m in mutants.MUTANTS:
        path = REPO / m.path
        found = sum(m.line in line for line in path.read_text().splitlines()) if path.exists() else 0
        if (
            found != 1
            or m.line == m.becomes
            or not m.tests
            or not all((REPO / t.split("::")[0]).exists() for t in m.tests)
        ):
            stale.append(f"{m.name}: {m.path} has {found} lines with {m.line!r}; tests {m.tests}")
    assert not stale, "\n".join(stale)
