"""The `reassembler` command (CONTRACT.md section 6).

Exit codes (errors.py): 0 the night was built (masked rollouts included); 1 the staged night
failed its audit checks (nothing published); 2 bad usage or unusable input; 3 the output or
the warehouse is busy; 4 out of memory or disk; 5 (`gate`) the night breached an alert
threshold; 70 a bug. Every error is one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from . import progress, storage
from .errors import EXIT_BUG, EXIT_GATE, EXIT_OK, EXIT_USAGE, InputError, classify
from .formats.locations import LAYOUTS, Inputs
from .producer.config import SynthConfig
from .settings import (
    DEFAULTS,
    GATE_DEFAULTS,
    MEMORY_LIMIT,
    MODES,
    OFFCHAIN_POLICIES,
    REPORT_NIGHTS,
    Settings,
    Thresholds,
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


VERBOSE_HELP = "log progress to stderr (-v: steps and summaries, -vv: every batch)"


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="reassembler", description=__doc__.splitlines()[0], formatter_class=_Help)
    p.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
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
        help="where the three inputs sit under --input: contract (rollouts/ds=D/, ledger/ds=D/, tokens/ds=D/) or "
        "gym (NeMo Gym's night folder: results *.jsonl, token_id_capture/, staged/) (default: REASSEMBLER_LAYOUT)",
    )
    for kind, what in (
        ("rollouts", "the rollout records"),
        ("ledger", "the ledger (capture folder)"),
        ("tokens", "the token store"),
    ):
        b.add_argument(
            f"--{kind}",
            default=os.environ.get(f"REASSEMBLER_{kind.upper()}") or None,
            metavar="TEMPLATE",
            help=f"where {what} of a night are, instead of the layout's: a folder, a file or a glob, local or "
            f"s3://, with {{ds}} {{yyyy}} {{mm}} {{dd}} {{input}} filled from the night "
            f"(default: REASSEMBLER_{kind.upper()})",
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
    b.add_argument(
        "--workers",
        type=_positive,
        default=DEFAULTS.workers,
        help="shards (and load parts) to run at once, in worker processes",
    )
    b.add_argument(
        "--load-parts",
        type=_positive,
        default=DEFAULTS.load_parts,
        help="parts the night's input is parsed in (default: one per 256 MiB of input)",
    )
    b.add_argument(
        "--merge-buckets",
        type=_positive,
        default=DEFAULTS.merge_buckets,
        help="buckets of rollouts the night is merged in, in worker processes (default: as many as shards)",
    )
    b.add_argument(
        "--max-mask-rate",
        type=_rate,
        default=DEFAULTS.max_mask_rate,
        help="refuse to publish a night whose share of masked rollouts is above this",
    )
    b.add_argument("--memory-limit", type=_memory, default=DEFAULTS.duckdb.memory_limit, help="DuckDB memory_limit")
    b.add_argument("--threads", type=_positive, default=DEFAULTS.duckdb.threads, help="DuckDB threads")
    b.add_argument("--temp-directory", default=None, help="DuckDB spill folder (None: <output>/_tmp/duckdb)")
    b.add_argument(
        "--lock-wait",
        type=_seconds,
        default=DEFAULTS.duckdb.lock_wait_seconds,
        help="seconds to wait for another client of the warehouse file",
    )
    b.add_argument(
        "--allow-empty",
        action="store_true",
        help="publish a night from which no rollout could be read (refused by default)",
    )
    b.add_argument(
        "--max-line-bytes",
        type=_positive,
        default=DEFAULTS.max_line_bytes,
        help="longest JSON line read; a longer one is a reject row",
    )
    b.add_argument(
        "--max-rollout-tokens",
        type=_positive,
        default=DEFAULTS.max_rollout_tokens,
        help="tokens a verifiers rollout's rows may hold, shared context counted on every branch; more is masked",
    )
    b.add_argument(
        "--retention-nights",
        type=_positive,
        default=DEFAULTS.retention_nights,
        help="nights of per-call tables (rollouts, ledger) kept in the warehouse",
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
    g.add_argument("--max-mask-rate", type=_rate, default=d.max_mask_rate, help="share of masked rollouts")
    g.add_argument(
        "--max-reason-rate", type=_rate, default=d.max_reason_rate, help="share of rollouts masked by any one reason"
    )
    g.add_argument(
        "--max-mask-rate-rise",
        type=_rate,
        default=d.max_mask_rate_rise,
        help="rise of the mask rate over the trailing 7-night mean",
    )
    g.add_argument("--max-rejects", type=int, default=d.max_rejects, help="rejected input lines")
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


def _scaled(span: tuple[int, int], scale: float) -> tuple[int, int]:
    return max(1, int(span[0] * scale)), max(1, int(span[1] * scale))


def run(args) -> int:
    if args.command == "build":
        from .merge.night_load import NightLoad
        from .warehouse import warehouse_path

        settings = Settings.from_cli(args)
        warehouse = warehouse_path(args.output, args.warehouse)  # a missing --warehouse: said before any work
        # entered before the heavy imports below: the rollout children parse meanwhile
        inputs = Inputs(args.input, args.layout, args.rollouts, args.ledger, args.tokens)
        with NightLoad(inputs, args.ds, settings) as load:
            from .build import build_loaded

            s = build_loaded(load, args.output, warehouse_file=warehouse)
        n = s.numbers
        print(
            f"built ds={args.ds} in {s.seconds:.1f}s: {n.audit_rows} rollouts, {n.ok_rollouts} ok, "
            f"{n.masked} masked ({n.mask_rate:.1%}), {n.n_rows} rows; {s.load.n_rejects} rejected input rows"
        )
        print("input:   " + "\n         ".join(s.load.lines()))
        if n.reasons:
            print("mask reasons: " + ", ".join(f"{r} {c}" for r, c in n.reasons.items()))
        print(
            f"rows:  {args.output}/rows/ds={args.ds}/\naudit: {args.output}/audit/ds={args.ds}/\n"
            f"manifest: {args.output}/_published/ds={args.ds}.json\nwarehouse: {warehouse} (run {s.run_id})"
        )
        from .publish.protocol import read_manifest

        manifest, _ = read_manifest(args.output, args.ds)
        replaced = (manifest or {}).get("replaces") if (manifest or {}).get("run_id") == s.run_id else None
        if replaced and replaced.get("run_id"):
            print(f"replaced: run {replaced['run_id']}, the night's previous publish (kept for the grace period)")
    elif args.command == "synth":
        if args.min_calls > args.max_calls or args.min_calls < 5:
            raise InputError("synth: --min-calls must be >= 5 and <= --max-calls")
        if storage.is_remote(args.output):
            raise InputError(f"synth: --output {args.output}: synth writes a local folder; upload it after")
        from .producer.synth import synth_night

        d = SynthConfig()
        cfg = SynthConfig(
            rollouts=args.rollouts,
            group_size=args.group_size,
            seed=args.seed,
            fault_rate=args.fault_rate,
            min_calls=args.min_calls,
            max_calls=args.max_calls,
            compaction_rate=args.compaction_rate,
            prompt_tokens=_scaled(d.prompt_tokens, args.token_scale),
            observation_tokens=_scaled(d.observation_tokens, args.token_scale),
            generated_tokens=_scaled(d.generated_tokens, args.token_scale),
        )
        t = synth_night(args.output, args.ds, cfg)
        faults = sum(t["faults"].values())
        print(
            f"synth ds={args.ds}: {t['rollouts']} rollouts, {t['calls']} calls, {t['tokens']} tokens in "
            f"{t['token_files']} token files; {faults} rollouts with an injected fault"
        )
        print(f"input: {args.output}  expected outcomes: {args.output}/_expected/ds={args.ds}/outcomes.jsonl")
    elif args.command == "explain":
        from .audit.explain import explain

        replay = explain(args.output, args.ds, args.rollout_id, args.warehouse)
        print(json.dumps(replay.to_dict(), indent=2) if args.json else replay.text())
    elif args.command == "report" and args.html:
        from .build import report_step
        from .warehouse import Warehouse

        by = [k.strip() for k in args.by.split(",") if k.strip()] if args.by else None
        page = report_step(Warehouse(args.output, path=args.warehouse), args.ds, nights=args.nights, by=by)
        if page is None:
            raise InputError(f"{args.output}: no published night{' ' + args.ds if args.ds else ''} in the warehouse")
        print(f"report: {page}\nindex:  {storage.join(storage.location(args.output), 'reports', 'index.html')}")
    elif args.command == "report":
        from .audit.report_text import report

        print(report(args.output, args.warehouse))
    elif args.command == "gate":
        from .audit.quality import breaches_of, check_lines
        from .build import gate_step
        from .warehouse import Warehouse

        thresholds = Thresholds(args.max_mask_rate, args.max_reason_rate, args.max_mask_rate_rise, args.max_rejects)
        checks = gate_step(Warehouse(args.output, path=args.warehouse), args.ds, None, thresholds)
        print("\n".join(check_lines(checks)))  # every check: value against limit, margin, status
        breaches = breaches_of(checks)
        if breaches:
            print(
                f"reassembler: quality gate breached for ds={args.ds}: " + "; ".join(b["message"] for b in breaches),
                file=sys.stderr,
            )
            return EXIT_GATE
        warned = sum(c["status"] == "warn" for c in checks)
        print(f"quality gate passed for ds={args.ds}" + (f" ({warned} near the limit)" if warned else ""))
    return 0


def _unknown_options(p: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The first `--option` of `argv` its command does not know, with the nearest known one:
    reported before argparse would report a required option as missing (`--ouput` for
    `--output`)."""
    import difflib

    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    command = next((a for a in argv if a in sub.choices), None)
    known = set(p._option_string_actions)
    if command is not None:
        known |= set(sub.choices[command]._option_string_actions)
    for arg in argv:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if name.startswith("--") and name not in known:
            near = difflib.get_close_matches(name, sorted(k for k in known if k.startswith("--")), n=1)
            where = f"`{command}`" if command else "reassembler"
            help_of = f"reassembler {command} --help" if command else "reassembler --help"
            return (
                f"{where} has no option {name}" + (f": did you mean {near[0]}?" if near else "") + f" (see `{help_of}`)"
            )
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    try:
        unknown = _unknown_options(p, argv)
        if unknown is not None:
            raise UsageError(unknown)
        args = p.parse_args(argv)
    except UsageError as e:
        print(f"reassembler: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    logger = logging.getLogger("reassembler")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG))
    progress.show_bars(args.command == "build" and sys.stderr.isatty())  # a bar only on a terminal
    try:
        return _main(args)
    finally:
        progress.show_bars(False)
        logger.removeHandler(handler)


def _main(args) -> int:
    settings = None
    try:
        if args.command == "build":
            settings = Settings.from_cli(args).duckdb
        return run(args)
    except BrokenPipeError:
        # the reader of our output went away (`| head`): the work itself is done
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("reassembler: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place every error becomes one line
        output = getattr(args, "output", None)
        named = getattr(args, "warehouse", None) or (
            output and not output.startswith("s3://") and f"{output}/warehouse.duckdb"
        )
        known = classify(e, settings, named)
        if known is None:
            if os.environ.get("REASSEMBLER_DEBUG"):
                raise
            print(
                f"reassembler: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                "(set REASSEMBLER_DEBUG=1 for the traceback)",
                file=sys.stderr,
            )
            return EXIT_BUG
        message = str(known).replace("\n", " ")
        print(f"reassembler: error: {message}", file=sys.stderr)
        return known.exit_code


class _KeepPandasOut:
    """pyarrow and DuckDB import pandas (0.3-0.5 s, most of it CPU) the first time they are
    handed Python objects, only to ask whether those are DataFrames; the command never hands
    them one. Installed by `entry` only, so a process that imports this package (tests,
    Airflow workers, notebooks) keeps pandas. (A meta path finder: `find_spec` is all
    the import system asks of one.)"""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not used by the reassembler command", name=name)
        return None


def entry(argv: list[str] | None = None) -> int:
    """The `reassembler` command: `main` in a process of its own, set up as the build runs
    best (docs/performance.md): Arrow allocates through jemalloc, also inside its Parquet and
    JSON readers (its default, mimalloc, cost ~100 MiB of peak memory here), numpy's OpenBLAS
    starts no idle threads, and pandas stays out. These are set here, for this process, before
    anything imports pyarrow or numpy; a process that imports the package (an Airflow worker,
    a notebook) keeps its own settings."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if "pandas" not in sys.modules:
        sys.meta_path.insert(0, _KeepPandasOut())
    return main(argv)


if __name__ == "__main__":
    sys.exit(entry())
