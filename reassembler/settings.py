"""Every setting of the nightly job, with its one default, resolved in one place.

`Settings` builds itself from the command line (`Settings.from_cli`) and from the DAG's params
(`Settings.from_params`, for every task and the operator), and says what the DAG's params are
(`dag_params`: their defaults, types, ranges and enums), so a default changes in one line and
the README's table quotes these values (tests/test_docs.py holds it to them). This module
imports nothing heavy: the DAG file reads it when it is parsed.

| setting | default | what it bounds |
|---|---|---|
| duckdb.memory_limit | 128MB | DuckDB memory of every connection |
| duckdb.threads | 2 | DuckDB threads of every connection |
| duckdb.temp_directory | <output>/_tmp/duckdb | DuckDB spill folder (one per process) |
| duckdb.lock_wait_seconds | 60 | wait for another client of the warehouse file |
| shards / workers | 1 / 1 (DAG: 4 shards, one task each) | parallelism |
| load_parts | one per 256 MiB of input | parts the load parses the night in (DAG: one task each) |
| merge_buckets | the shards | buckets of rollouts the night is merged in (DAG: one task each) |
| max_mask_rate | 1.0 (DAG: 0.5) | refuse to publish above this mask rate |
| max_line_bytes | 16 MiB | longest JSON line read |
| max_rollout_tokens | 16,777,216 | tokens a verifiers rollout's rows may hold, shared context each branch |
| batch_rows / batch_tokens | 16,384 calls / 1,000,000 tokens | one batch of a shard |
| token_cache_bytes | 64 MiB | decoded token row groups kept |
| max_row_group_bytes | 64 MiB | token bytes decoded at once; a larger row group is read in pieces of rows |
| retention_nights | 30 | nights of per-call tables kept in the warehouse |
| Thresholds | mask rate 0.2, one reason 0.1, rise 0.05, rejects 0 | the quality gate's alerts |
| REPORT_NIGHTS | 30 | nights in the report's trends |
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any, Literal, get_args

from .errors import InputError

Mode = Literal["select", "terminal"]
OffchainPolicy = Literal["selected", "strict"]
MODES: tuple[str, ...] = get_args(Mode)
OFFCHAIN_POLICIES: tuple[str, ...] = get_args(OffchainPolicy)
REPORT_NIGHTS = 30  # nights in the report's trends (the command's --nights, the DAG's report_nights)
MEMORY_LIMIT = re.compile(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
MAX_LINE_BYTES = 16 << 20
DS_PATTERN = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"  # a night: YYYY-MM-DD, ASCII digits only (JSON Schema's \\d is not)
# Deepest nesting of objects and arrays a JSON line may have; a deeper line is a reject row
# before any parser sees it (pyarrow's JSON reader crashes the process on ~50,000 levels,
# Python's recursion stops near 1,000; capture nests a dozen levels or so).
MAX_JSON_DEPTH = 128


def parse_ds(value) -> str:
    """A night, `YYYY-MM-DD`, checked to be a date that exists; InputError says what is wrong."""
    if not isinstance(value, str) or re.fullmatch(DS_PATTERN.strip("^$"), value) is None:
        raise InputError(f"ds must be a date written YYYY-MM-DD, got {value!r}")
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError as e:
        raise InputError(f"ds {value} is not a date: {e}") from None


@dataclass(frozen=True)
class Options:
    """How rollouts are turned into rows (CONTRACT.md 3)."""

    mode: Mode = "select"
    offchain: OffchainPolicy = "selected"
    std_normalize: bool = True
    leave_one_out: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise InputError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.offchain not in OFFCHAIN_POLICIES:
            raise InputError(f"offchain must be one of {', '.join(OFFCHAIN_POLICIES)}, not {self.offchain!r}")


# The fan-outs' ceilings (Settings.bounded): what one machine, and one Airflow DAG run
# (its mapped tasks: Airflow's max_map_length is 1024), survives.
THREADS_PER_CORE = 4
WORKERS_PER_CORE = 2
MAX_SHARDS = 256
MAX_PARTS = 1024
log = logging.getLogger(__name__)

# The settings read from the environment alone (README, Settings): each a number of seconds.
ENV_SECONDS = {
    "REASSEMBLER_GRACE_SECONDS": 3600.0,  # a superseded run's files stay readable (publish/protocol.py)
    "REASSEMBLER_IN_FLIGHT_SECONDS": 43200.0,  # a run of the night not yet published, planned since, is in flight
    "REASSEMBLER_LEASE_SECONDS": 120.0,  # the output lease on object storage (publish/lock.py)
    "REASSEMBLER_S3_RETRY_SECONDS": 60.0,  # the retry budget of one request (storage/retry.py)
}


def env_seconds(name: str) -> float:
    """The environment setting `name` (ENV_SECONDS: its default when unset or empty), or an
    InputError naming it: `REASSEMBLER_LEASE_SECONDS='2m': not a number of seconds`."""
    default = ENV_SECONDS[name]
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{name}={raw!r}: not a number of seconds >= 0 (unset: {default:g})")
    return value


def check_environment() -> None:
    """Every environment setting read (the command checks them before any work: exit 2)."""
    for name in ENV_SECONDS:
        env_seconds(name)


@dataclass(frozen=True)
class DuckDBSettings:
    """Resource limits for every DuckDB connection the job opens (set explicitly, always)."""

    memory_limit: str = "128MB"
    threads: int = 2
    temp_directory: str | None = None  # default: <output>/_tmp/duckdb (a folder per process)
    lock_wait_seconds: float = 60.0  # how long to wait for another client of the warehouse file

    def __post_init__(self):
        if not MEMORY_LIMIT.fullmatch(str(self.memory_limit).strip()):
            raise InputError(f"memory limit {self.memory_limit!r} is not a size such as 128MB or 2GB")
        if self.threads < 1:
            raise InputError(f"threads must be >= 1, not {self.threads}")
        if self.temp_directory and Path(self.temp_directory).exists() and not Path(self.temp_directory).is_dir():
            raise InputError(f"temp directory {self.temp_directory}: is a file, not a folder")


@dataclass(frozen=True)
class Thresholds:
    """The quality gate's alert thresholds (quality.py); None switches a check off."""

    max_mask_rate: float | None = 0.2  # share of masked rollouts
    max_reason_rate: float | None = 0.1  # share of rollouts masked by any one reason
    max_mask_rate_rise: float | None = 0.05  # mask rate minus the trailing 7-night mean
    max_rejects: int | None = 0  # rejected input lines (a crash-torn final line of a file not counted: it warns)
    # the rate checks (mask rate, one reason's rate, the rise) breach only on a night of at
    # least this many rollouts; on a smaller night a value over its limit warns (README)
    min_rollouts: int = 50


@dataclass(frozen=True)
class Settings:
    options: Options = field(default_factory=Options)
    duckdb: DuckDBSettings = field(default_factory=DuckDBSettings)
    shards: int = 1
    workers: int = 1
    load_parts: int | None = None  # None: one per load/parts.PART_BYTES of input
    merge_buckets: int | None = None  # None: as many as shards
    max_mask_rate: float = 1.0
    allow_empty: bool = False
    max_line_bytes: int = MAX_LINE_BYTES
    max_rollout_tokens: int = 1 << 24  # formats/verifiers.MAX_ROLLOUT_TOKENS (CONTRACT.md 12)
    batch_rows: int = 16_384
    batch_tokens: int = 1_000_000
    token_cache_bytes: int = 64 << 20
    max_row_group_bytes: int = 64 << 20  # a token row group decoding to more is read in pieces of rows
    retention_nights: int = 30

    @property
    def buckets(self) -> int:
        """The merge's fan-out: merge_buckets, else the shards."""
        return self.merge_buckets or self.shards

    def bounded(self, cores: int | None = None) -> Settings:
        """These settings with every fan-out within what a machine survives, each value
        lowered said in one warning line: DuckDB's threads at most THREADS_PER_CORE a core,
        worker processes at most WORKERS_PER_CORE a core, shards at most MAX_SHARDS, load
        parts and merge buckets at most MAX_PARTS (the night bounds those two further: never
        more parts than files, nor buckets than its input can fill: load/parts.py)."""
        cores = cores or os.cpu_count() or 1
        asked = {
            "threads": self.duckdb.threads,
            "workers": self.workers,
            "shards": self.shards,
            "load_parts": self.load_parts,
            "merge_buckets": self.merge_buckets,
        }
        limits = {
            "threads": (THREADS_PER_CORE * cores, f"{THREADS_PER_CORE} a core, {cores} cores here"),
            "workers": (WORKERS_PER_CORE * cores, f"{WORKERS_PER_CORE} a core, {cores} cores here"),
            "shards": (MAX_SHARDS, "the most one night is split in"),
            "load_parts": (MAX_PARTS, "the most one night is parsed in"),
            "merge_buckets": (MAX_PARTS, "the most one night is merged in"),
        }
        got: dict[str, int | None] = dict(asked)
        for name, (limit, why) in limits.items():
            value = asked[name]
            if value is not None and value > limit:
                got[name] = limit
                log.warning("%s %d lowered to %d (%s)", name.replace("_", " "), value, limit, why)
        if got == asked:
            return self
        return replace(
            self,
            duckdb=replace(self.duckdb, threads=int(got["threads"] or 1)),
            workers=int(got["workers"] or 1),
            shards=int(got["shards"] or 1),
            load_parts=got["load_parts"],
            merge_buckets=got["merge_buckets"],
        )

    @classmethod
    def from_cli(cls, args) -> Settings:
        """From `reassembler build`'s parsed arguments (cli.py's parser)."""
        d = cls()
        return cls(
            options=Options(args.mode, args.offchain, not args.no_std_normalize, args.leave_one_out),
            duckdb=DuckDBSettings(args.memory_limit, args.threads, args.temp_directory, args.lock_wait),
            shards=args.shards,
            workers=args.workers,
            load_parts=args.load_parts,
            merge_buckets=args.merge_buckets,
            max_mask_rate=args.max_mask_rate,
            allow_empty=args.allow_empty,
            max_line_bytes=args.max_line_bytes,
            max_rollout_tokens=args.max_rollout_tokens,
            batch_rows=d.batch_rows,
            batch_tokens=d.batch_tokens,
            token_cache_bytes=d.token_cache_bytes,
            max_row_group_bytes=d.max_row_group_bytes,
            retention_nights=args.retention_nights,
        ).bounded()

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Settings:
        """From the DAG's params (or the operator's fields): flat names, strings allowed."""

        def get(name: str, default, cast):
            value = params.get(name)
            return default if value is None or value == "" else cast(value)

        d = DAG_DEFAULTS
        return cls(
            options=Options(
                get("mode", d.options.mode, str),
                get("offchain", d.options.offchain, str),
                get("std_normalize", d.options.std_normalize, _bool),
                get("leave_one_out", d.options.leave_one_out, _bool),
            ),
            duckdb=DuckDBSettings(
                get("duckdb_memory_limit", d.duckdb.memory_limit, str),
                get("duckdb_threads", d.duckdb.threads, int),
                get("duckdb_temp_directory", None, str),
                get("duckdb_lock_wait_seconds", d.duckdb.lock_wait_seconds, float),
            ),
            shards=get("shards", d.shards, int),
            load_parts=get("load_parts", d.load_parts, int),
            merge_buckets=get("merge_buckets", d.merge_buckets, int),
            max_mask_rate=get("max_mask_rate", d.max_mask_rate, float),
            allow_empty=get("allow_empty", d.allow_empty, _bool),
            max_line_bytes=get("max_line_bytes", d.max_line_bytes, int),
            max_rollout_tokens=get("max_rollout_tokens", d.max_rollout_tokens, int),
            batch_rows=get("batch_rows", d.batch_rows, int),
            batch_tokens=get("batch_tokens", d.batch_tokens, int),
            token_cache_bytes=get("token_cache_bytes", d.token_cache_bytes, int),
            max_row_group_bytes=get("max_row_group_bytes", d.max_row_group_bytes, int),
            retention_nights=get("retention_nights", d.retention_nights, int),
        ).bounded()


def _bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


DEFAULTS = Settings()
DAG_DEFAULTS = Settings(shards=4, max_mask_rate=0.5)  # the DAG: a task per shard; refuse a night half masked
GATE_DEFAULTS = Thresholds()


def dag_params() -> dict[str, dict[str, Any]]:
    """The DAG params this module owns, as keyword arguments of Airflow's `Param` (the DAG
    file adds its own: ds, the input wait, the report's): default, type, range or enum, and a
    description the trigger form shows."""
    d, g = DAG_DEFAULTS, GATE_DEFAULTS
    rate = {"minimum": 0, "maximum": 1}
    return {
        "shards": dict(
            default=d.shards,
            type="integer",
            minimum=1,
            maximum=MAX_SHARDS,
            description="Group ranges reassembled as separate mapped tasks (in parallel).",
        ),
        "load_parts": dict(
            default=d.load_parts,
            type=["null", "integer"],
            minimum=1,
            maximum=MAX_PARTS,
            description="Parts the night's input is parsed in, as separate mapped tasks (in parallel). Empty: one "
            "per 256 MiB of input.",
        ),
        "merge_buckets": dict(
            default=d.merge_buckets,
            type=["null", "integer"],
            minimum=1,
            maximum=MAX_PARTS,
            description="Buckets of rollouts the night is merged in, as separate mapped tasks (in parallel). "
            "Empty: as many as shards.",
        ),
        "mode": dict(
            default=d.options.mode,
            enum=list(MODES),
            description="select: compaction-aware selection (the default). terminal: ordinary capture, one row "
            "from the last call (to compare against).",
        ),
        "offchain": dict(
            default=d.options.offchain,
            enum=list(OFFCHAIN_POLICIES),
            description="selected: calls outside every chain are counted, never mask. strict: a poison row or a "
            "faulty off-chain call masks the rollout.",
        ),
        "std_normalize": dict(
            default=d.options.std_normalize,
            type="boolean",
            description="Divide each group's advantages by its population std (+1e-6).",
        ),
        "leave_one_out": dict(
            default=d.options.leave_one_out,
            type="boolean",
            description="Use the mean of the group's other valid rollouts as the baseline.",
        ),
        "max_mask_rate": dict(
            default=d.max_mask_rate,
            type="number",
            **rate,
            description="Refuse to publish a night whose share of masked rollouts is above this.",
        ),
        "duckdb_memory_limit": dict(
            default=d.duckdb.memory_limit,
            type="string",
            pattern=r"^\d+(\.\d+)?\s*([KMGT]i?B|B)$",
            description="DuckDB memory_limit of every task.",
        ),
        "duckdb_threads": dict(
            default=d.duckdb.threads,
            type="integer",
            minimum=1,
            maximum=64,
            description=f"DuckDB threads of every task (at most {THREADS_PER_CORE} a core of the worker).",
        ),
        "duckdb_temp_directory": dict(
            default=None, type=["null", "string"], description="DuckDB spill folder. Empty: <output>/_tmp/duckdb."
        ),
        "retention_nights": dict(
            default=d.retention_nights,
            type="integer",
            minimum=1,
            description="Nights of per-call tables (rollouts, ledger) kept in the warehouse.",
        ),
        "gate_max_mask_rate": dict(
            default=g.max_mask_rate,
            type=["null", "number"],
            **rate,
            description="Alert when the night's mask rate is above this (empty: off).",
        ),
        "gate_max_reason_rate": dict(
            default=g.max_reason_rate,
            type=["null", "number"],
            **rate,
            description="Alert when one reason masks more than this share of rollouts.",
        ),
        "gate_max_mask_rate_rise": dict(
            default=g.max_mask_rate_rise,
            type=["null", "number"],
            **rate,
            description="Alert when the mask rate rises more than this over the trailing 7-night mean.",
        ),
        "gate_max_rejects": dict(
            default=g.max_rejects,
            type=["null", "integer"],
            minimum=0,
            description="Alert when more input lines than this were rejected.",
        ),
        "gate_min_rollouts": dict(
            default=g.min_rollouts,
            type="integer",
            minimum=0,
            description="The rate checks fail only a night of at least this many rollouts; below, they warn.",
        ),
        "report_nights": dict(
            default=REPORT_NIGHTS, type="integer", minimum=1, description="Nights shown in the report's trends."
        ),
    }


def thresholds_from_params(params: Mapping[str, Any]) -> Thresholds:
    """The gate's thresholds from the DAG's params (None switches one off)."""
    return Thresholds(
        params.get("gate_max_mask_rate"),
        params.get("gate_max_reason_rate"),
        params.get("gate_max_mask_rate_rise"),
        params.get("gate_max_rejects"),
        GATE_DEFAULTS.min_rollouts if params.get("gate_min_rollouts") is None else int(params["gate_min_rollouts"]),
    )
