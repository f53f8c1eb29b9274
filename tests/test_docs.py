"""The README quotes defaults and exit codes: they are read from its text here and held to
the code (the settings, the gate's thresholds, the DAG's params, the command line), so the
two cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reassembler.formats.verifiers import MAX_ROLLOUT_TOKENS
from reassembler.load.parts import PART_BYTES
from reassembler.settings import MAX_JSON_DEPTH

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def table_row(first_cell: str) -> list[str]:
    """The cells of the README table row whose first cell is `first_cell`."""
    for line in README.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no README table row {first_cell!r}")


def readme_gate() -> dict[str, float]:
    """The gate's defaults as the README's settings table states them."""
    cell = table_row("quality gate")[1]
    found = re.fullmatch(
        r"mask rate ([\d.]+), one reason ([\d.]+), rise ([\d.]+), rejects (\d+), min rollouts (\d+)", cell
    )
    assert found, cell
    names = ("max_mask_rate", "max_reason_rate", "max_mask_rate_rise", "max_rejects", "min_rollouts")
    return {n: float(v) for n, v in zip(names, found.groups())}


def test_the_gates_defaults_are_the_readmes():
    from reassembler.settings import Thresholds

    stated = readme_gate()
    assert {n: float(getattr(Thresholds(), n)) for n in stated} == stated
    # the Alerts paragraph says the same, param by param
    for name, value in stated.items():
        assert re.search(rf"`gate_{name}` \({value:g}\b", README), name


def test_the_dag_and_the_command_line_take_the_same_gate_defaults():
    from airflow.dag_processing.dagbag import DagBag

    from reassembler.cli import parser

    stated = readme_gate()
    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[1] / "dags")).dags["capture_rows_nightly"]
    assert {n: float(dag.params.get_param(f"gate_{n}").value) for n in stated} == stated
    args = parser().parse_args(["gate", "--output", "o", "--ds", "2026-11-28"])
    assert {n: float(getattr(args, n)) for n in stated} == stated


def _size(text: str) -> int:
    number, unit = re.fullmatch(r"([\d,]+) (MiB|KiB|B)", text).groups()
    return int(number.replace(",", "")) << {"MiB": 20, "KiB": 10, "B": 0}[unit]


@pytest.mark.parametrize(
    "row, check",
    [
        ("DuckDB memory limit / threads", lambda d, c: c[1] == f"{d.duckdb.memory_limit} / {d.duckdb.threads}"),
        ("nights of per-call tables kept", lambda d, c: c[1] == str(d.retention_nights)),
        (
            "load parts / merge buckets",
            lambda d, c: (
                (d.load_parts, d.merge_buckets) == (None, None)
                and c[1] == f"one per {PART_BYTES >> 20} MiB / the shards"
            ),
        ),
        ("refuse to publish above mask rate", lambda d, c: float(c[1]) == d.max_mask_rate),
        (
            "longest JSON line / deepest nesting / tokens a verifiers rollout's rows hold (CONTRACT.md 12.3)",
            lambda d, c: (
                c[1] == f"{d.max_line_bytes >> 20} MiB / {MAX_JSON_DEPTH} levels / 2^24"
                and d.max_rollout_tokens == 1 << 24 == MAX_ROLLOUT_TOKENS
            ),
        ),
        (
            "batch of a shard",
            lambda d, c: c[1] == f"{d.batch_rows:,} calls or {d.batch_tokens:,} tokens",
        ),
        (
            "token row-group cache / largest row group decoded",
            lambda d, c: [_size(x) for x in c[1].split(" / ")] == [d.token_cache_bytes, d.max_row_group_bytes],
        ),
    ],
)
def test_the_settings_table_states_the_defaults(row, check):
    from reassembler.settings import DEFAULTS

    assert check(DEFAULTS, table_row(row)), table_row(row)


def test_the_retry_budget_is_the_readmes():
    from reassembler.storage import retry

    cells = table_row("S3 retry budget of a request (throttling; other faults a third)")
    assert cells[1] == f"{retry.DEFAULT_BUDGET:g} s" and retry.TRANSIENT_SHARE == 1 / 3


def test_the_exit_code_table_is_the_codes():
    from reassembler import errors

    codes = {
        int(cells[0])
        for line in README.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])[0].isdigit()
    }
    assert codes == {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
