"""The `reassembler` command's arguments: every subcommand's options, their types and
defaults (the README's tables; tests/test_docs.py holds them to it), and the one-line usage
errors. What each command then does: cli.py.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from .errors import InputError
from .formats.locations import LAYOUTS
from .producer.config import SynthConfig
from .settings import (
    DEFAULTS,
    GATE_DEFAULTS,
    MEMORY_LIMIT,
    MODES,
    OFFCHAIN_POLICIES,
    REPORT_NIGHTS,
    parse_ds,
)

# The commands' modules (DuckDB, pyarrow: ~0.4 s) are imported by `run` when a command needs
# them; a build first starts parsing its rollout lines in child processes (load.NightLoad),
# which run while this one imports them.


def _ds(value: str) -> str:
    try:
        return parse_ds(value)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return n


def _memory(value: str) -> str:
    if not MEMORY_LIMIT.fullmatch(value.strip()):
        raise argparse.ArgumentTypeError(f"{value!r} is not a size such as 128MB or 2GB")
    return value


def _seconds(value: str) -> float:
    x = float(value)
    if x < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return x


def _options(p: argparse.ArgumentParser, *rows: tuple[str, Callable[[str], Any], Any, str]) -> None:
    """Options that each take one value: (flag, its type, its default, its help)."""
    for flag, kind, default, text in rows:
        p.add_argument(flag, type=kind, default=default, help=text)


def _rate(value: str) -> float:
    x = float(value)
    if not 0.0 <= x <= 1.0:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return x


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows every option's default."""


class UsageError(Exception):
    """A command line the parser refuses: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """No abbreviations (`--shard 2` is not `--shards 2`), and a usage error is one line
    naming the wrong argument (`main` prints it), not argparse's usage block: the usage is
    one `--help` away."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def installed_version() -> str:
    """The installed distribution's version (the wheel's, or the checkout's editable install)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reassembler")
    except PackageNotFoundError:
        return "unknown (not installed: pip install .)"


VERBOSE_HELP = "log progress to stderr (-v: steps and summaries, -vv: every batch)"


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="reassembler", description=__doc__.splitlines()[0], formatter_class=_Help)
    p.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    p.add_argument("--version", action="version", version=f"reassembler {installed_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, formatter_class=_Help)
        c.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP)
        return c

    b = command("build", "build one night: rows and audit partitions")
    b.add_argument(
        "--input",
        default=os.environ.get("REASSEMBLER_INPUT"),
        help="input root (a folder or s3://bucket/prefix): rollouts/, ledger/, tokens/ partitioned by ds= "
        "(default: REASSEMBLER_INPUT); with --layout gym, NeMo Gym's output folder of the night, {ds} in it",
    )
    b.add_argument(
        "--layout",
        choices=sorted(LAYOUTS),
        default=os.environ.get("REASSEMBLER_LAYOUT") or "contract",
        help="where the three inputs sit under --input: contract (rollouts/ds=D/, ledger/ds=D/, tokens/ds=D/), "
        "gym (NeMo Gym's night folder: results *.jsonl, token_id_capture/, staged/) or art (OpenPipe ART's model "
        "folder: the trajectories/train/ steps history.jsonl records on the night) (default: REASSEMBLER_LAYOUT)",
    )
    for kind, what in (
        ("rollouts", "the rollout records"),
        ("ledger", "the ledger (capture folder)"),
        ("tokens", "the token store"),
    ):
        several = kind == "rollouts"  # repeatable: a night read from several locations, in the order given
        b.add_argument(
            f"--{kind}",
            default=None if several else os.environ.get(f"REASSEMBLER_{kind.upper()}") or None,
            action="append" if several else "store",
            metavar="TEMPLATE",
            help=f"where {what} of a night are, instead of the layout's: a folder, a file or a glob, local or "
            f"s3://, with {{ds}} {{yyyy}} {{mm}} {{dd}} {{input}} filled from the night "
            + (
                "(repeat it to read several locations as one night; default: REASSEMBLER_ROLLOUTS, one template or "
                "a JSON list)"
                if several
                else f"(default: REASSEMBLER_{kind.upper()})"
            ),
        )
    _output(b, "output root (a folder or s3://bucket/prefix): rows/, audit/, reports/, _published/")
    b.add_argument("--ds", required=True, type=_ds, help="the night, YYYY-MM-DD")
    b.add_argument(
        "--mode",
        choices=MODES,
        default=DEFAULTS.options.mode,
        help="select: compaction-aware; terminal: ordinary capture, to compare against",
    )
    b.add_argument(
        "--offchain",
        choices=OFFCHAIN_POLICIES,
        default=DEFAULTS.options.offchain,
        help="strict: poison rows and faulty off-chain calls mask the rollout",
    )
    b.add_argument("--no-std-normalize", action="store_true", help="advantages without division by the group std")
    b.add_argument("--leave-one-out", action="store_true", help="baseline: the mean of the group's other rollouts")
    b.add_argument("--shards", type=_positive, default=DEFAULTS.shards, help="group ranges built one after the other")
    _options(
        b,
        ("--workers", _positive, DEFAULTS.workers, "shards (and load parts) to run at once, in worker processes"),
        (
            "--load-parts",
            _positive,
            DEFAULTS.load_parts,
            "parts the night's input is parsed in (default: one per 256 MiB of input)",
        ),
        (
            "--merge-buckets",
            _positive,
            DEFAULTS.merge_buckets,
            "buckets of rollouts the night is merged in, in worker processes (default: as many as shards)",
        ),
        (
            "--max-mask-rate",
            _rate,
            DEFAULTS.max_mask_rate,
            "refuse to publish a night whose share of masked rollouts is above this",
        ),
        ("--memory-limit", _memory, DEFAULTS.duckdb.memory_limit, "DuckDB memory_limit"),
        ("--threads", _positive, DEFAULTS.duckdb.threads, "DuckDB threads"),
        ("--temp-directory", str, None, "DuckDB spill folder (None: <output>/_tmp/duckdb)"),
        (
            "--lock-wait",
            _seconds,
            DEFAULTS.duckdb.lock_wait_seconds,
            "seconds to wait for another client of the warehouse file",
        ),
    )
    b.add_argument(
        "--allow-empty",
        action="store_true",
        help="publish a night from which no rollout could be read (refused by default)",
    )
    _options(
        b,
        (
            "--max-line-bytes",
            _positive,
            DEFAULTS.max_line_bytes,
            "longest JSON line read; a longer one is a reject row",
        ),
        (
            "--max-rollout-tokens",
            _positive,
            DEFAULTS.max_rollout_tokens,
            "tokens a verifiers rollout's rows may hold, shared context counted on every branch; more is masked",
        ),
        (
            "--retention-nights",
            _positive,
            DEFAULTS.retention_nights,
            "nights of per-call tables (rollouts, ledger) kept in the warehouse",
        ),
    )

    s = command("synth", "write a synthetic night with faults and expected outcomes")
    s.add_argument("--output", required=True, help="input root to write the night under")
    s.add_argument("--ds", required=True, type=_ds, help="the night, YYYY-MM-DD")
    s.add_argument("--rollouts", required=True, type=_positive, help="rollouts in the night")
    s.add_argument("--seed", type=int, default=SynthConfig.seed, help="random seed")
    s.add_argument("--group-size", type=_positive, default=SynthConfig.group_size, help="rollouts per group")
    s.add_argument(
        "--fault-rate", type=_rate, default=SynthConfig.fault_rate, help="share of rollouts with one injected fault"
    )
    s.add_argument("--min-calls", type=_positive, default=SynthConfig.min_calls, help="fewest calls a rollout")
    s.add_argument("--max-calls", type=_positive, default=SynthConfig.max_calls, help="most calls a rollout")
    s.add_argument(
        "--compaction-rate",
        type=_rate,
        default=SynthConfig.compaction_rate,
        help="share of rollouts whose history is compacted",
    )
    s.add_argument(
        "--token-scale", type=float, default=1.0, help="multiply every token length range (0.05 for tiny test nights)"
    )

    e = command("explain", "replay one rollout of a built night step by step")
    _output(e, "output root of the build")
    e.add_argument("--ds", required=True, type=_ds, help="the night, YYYY-MM-DD")
    e.add_argument("--json", action="store_true", help="print the replay as one JSON object")
    e.add_argument("rollout_id", help="the rollout to replay")

    r = command("report", "capture quality across the nights in the warehouse")
    _output(r, "output root of the builds")
    r.add_argument(
        "--html",
        action="store_true",
        help="write <output>/reports/ds=<ds>/index.html and the index page instead of a text table",
    )
    r.add_argument("--ds", type=_ds, default=None, help="the night of the HTML report (None: the latest)")
    r.add_argument("--nights", type=_positive, default=REPORT_NIGHTS, help="nights in the trends")
    r.add_argument(
        "--by",
        default=None,
        help="rollout metadata keys to break the mask rate down by, comma-separated "
        "(None: the keys present on most rollouts)",
    )

    g = command("gate", "check a published night against alert thresholds (exit 5 when breached)")
    _output(g, "output root of the builds")
    g.add_argument("--ds", required=True, type=_ds, help="the night, YYYY-MM-DD")
    d = GATE_DEFAULTS
    _options(
        g,
        ("--max-mask-rate", _rate, d.max_mask_rate, "share of masked rollouts"),
        ("--max-reason-rate", _rate, d.max_reason_rate, "share of rollouts masked by any one reason"),
        ("--max-mask-rate-rise", _rate, d.max_mask_rate_rise, "rise of the mask rate over the trailing 7-night mean"),
        ("--max-rejects", int, d.max_rejects, "rejected input lines (torn final lines not counted)"),
        ("--min-rollouts", int, d.min_rollouts, "the rate checks fail only a night of at least this many rollouts"),
    )
    g.add_argument("--json", action="store_true", help="print the checks and the verdict as one JSON object")
    return p


def _output(p: argparse.ArgumentParser, help: str) -> None:
    """--output and --warehouse, defaulting to REASSEMBLER_OUTPUT and REASSEMBLER_WAREHOUSE."""
    env = os.environ.get("REASSEMBLER_OUTPUT")
    p.add_argument("--output", default=env, required=not env, help=f"{help} (default: REASSEMBLER_OUTPUT)")
    p.add_argument(
        "--warehouse",
        default=os.environ.get("REASSEMBLER_WAREHOUSE"),
        help="the DuckDB warehouse file, a local path (default: REASSEMBLER_WAREHOUSE, else "
        "<output>/warehouse.duckdb; required when --output is on object storage)",
    )
