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
from .cli_args import UsageError, parser
from .errors import EXIT_BUG, EXIT_GATE, EXIT_OK, EXIT_USAGE, InputError, classify
from .formats.locations import Inputs, templates
from .load.child_process import keep_pandas_out
from .producer.config import SynthConfig
from .settings import (
    Settings,
    Thresholds,
    check_environment,
)

# The commands' modules (DuckDB, pyarrow: ~0.4 s) are imported by `run` when a command needs
# them; a build first starts parsing its rollout lines in child processes (load.NightLoad),
# which run while this one imports them.


def _scaled(span: tuple[int, int], scale: float) -> tuple[int, int]:
    return max(1, int(span[0] * scale)), max(1, int(span[1] * scale))


def run(args) -> int:
    if args.command == "build":
        from .merge.night_load import NightLoad
        from .warehouse import warehouse_path

        settings = getattr(args, "settings", None) or Settings.from_cli(args)
        warehouse = warehouse_path(args.output, args.warehouse)  # a missing --warehouse: said before any work
        # entered before the heavy imports below: the rollout children parse meanwhile
        rollouts = args.rollouts or templates(os.environ.get("REASSEMBLER_ROLLOUTS"))
        inputs = Inputs(args.input, args.layout, rollouts, args.ledger, args.tokens)
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
        from .audit.quality import breaches_of, check_lines, gate_document
        from .build import gate_step
        from .warehouse import Warehouse

        thresholds = Thresholds(
            args.max_mask_rate, args.max_reason_rate, args.max_mask_rate_rise, args.max_rejects, args.min_rollouts
        )
        checks = gate_step(Warehouse(args.output, path=args.warehouse), args.ds, None, thresholds)
        breaches = breaches_of(checks)
        if args.json:  # one JSON object on stdout, the same exit code (README, Alerts)
            document = gate_document(args.ds, checks, thresholds)
            print(json.dumps(document, sort_keys=True))
            return document["exit_code"]
        print("\n".join(check_lines(checks)))  # every check: value against limit, margin, status
        if breaches:
            print(
                f"reassembler: quality gate breached for ds={args.ds}: " + "; ".join(b["message"] for b in breaches),
                file=sys.stderr,
            )
            return EXIT_GATE
        warned = sum(c["status"] == "warn" for c in checks)
        print(
            f"quality gate passed for ds={args.ds}"
            + (f" ({warned} warning{'s' if warned > 1 else ''})" if warned else "")
        )
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
        check_environment()  # a setting of the environment that is not a number: exit 2 naming it
        if args.command == "build":
            args.settings = Settings.from_cli(args)  # once: its warnings (a fan-out lowered) said once
            settings = args.settings.duckdb
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


def entry(argv: list[str] | None = None) -> int:
    """The `reassembler` command: `main` in a process of its own, set up as the build runs
    best (docs/performance.md): Arrow allocates through jemalloc, also inside its Parquet and
    JSON readers (its default, mimalloc, cost ~100 MiB of peak memory here), numpy's OpenBLAS
    starts no idle threads, and pandas stays out. These are set here, for this process, before
    anything imports pyarrow or numpy; a process that imports the package (an Airflow worker,
    a notebook) keeps its own settings."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    keep_pandas_out()
    return main(argv)


if __name__ == "__main__":
    sys.exit(entry())
