"""The folder tree is the pipeline: each stage of the core imports only the stages before it
and what lies beneath them all, never a later one (read from the modules' own imports)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "reassembler"
# floors, lowest first: a module may import its own floor and the floors below it
FLOORS = [
    {
        "buckets",
        "errors",
        "memory",
        "progress",
        "reasons",
        "settings",
        "storage",
        "table_file",
        "wide_sort",
    },  # beneath all
    {"formats"},
    {"warehouse", "call_tables"},
    {"load"},
    {"merge"},
    {"verify"},
    {"publish"},
    {"audit"},
    {"build"},
    {"cli", "cli_args"},
]
APART = {"producer"}  # writes capture; the job never imports it (cli's synth command does)


def floor_of(module: str) -> int:
    top = module.split(".")[0]
    for k, names in enumerate(FLOORS):
        if top in names:
            return k
    raise AssertionError(f"{module}: no floor (add it to FLOORS)")


def imports(path: Path) -> set[str]:
    """The reassembler modules `path` imports, as dotted names under the package."""
    module = path.relative_to(PACKAGE).with_suffix("").parts
    package = list(module[:-1]) if module[-1] != "__init__" else list(module[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] if node.module else [".".join(base + [a.name]) for a in node.names]
                found.update(n for n in names if n)
            elif node.module and node.module.startswith("reassembler."):
                found.add(node.module[len("reassembler.") :])
        elif isinstance(node, ast.Import):
            found.update(a.name[len("reassembler.") :] for a in node.names if a.name.startswith("reassembler."))
    return found


def test_no_stage_imports_a_later_one():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if module.split(".")[0] in APART or module == "__init__":
            continue
        for target in imports(path):
            if target.split(".")[0] in APART:
                if module not in ("cli", "cli_args"):
                    wrong.append(f"{module} imports {target} (the producer side)")
                continue
            if floor_of(target) > floor_of(module):
                wrong.append(f"{module} imports {target}, a later stage")
    assert wrong == []


def test_the_producer_side_uses_only_the_formats():
    for path in sorted((PACKAGE / "producer").glob("*.py")):
        for target in imports(path):
            assert target.split(".")[0] in {"formats", "producer", "reasons"}, (path.name, target)


def test_every_package_of_the_core_says_what_it_is():
    for package in ("formats", "load", "verify", "publish", "audit"):
        init = PACKAGE / package / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), package
