"""Every setting of the nightly job, with its one default, resolved in one place.

The command line (`Settings.from_cli`), the DAG's tasks and the operator
(`Settings.from_params`, from the DAG params) all build a `Settings` here, so a default
changes in one line and the README's table quotes these values. This module imports
nothing heavy: the DAG file reads the defaults when it is parsed.

| setting | default | what it bounds |
|---|---|---|
| duckdb.memory_limit | 128MB | DuckDB memory of every connection |
| duckdb.threads | 2 | DuckDB threads of every connection |
| duckdb.temp_directory | <output>/_tmp/duckdb | DuckDB spill folder (one per process) |
| duckdb.lock_wait_seconds | 60 | wait for another client of the warehouse file |
| shards / workers | 1 / 1 (DAG: 4 shards, one task each) | parallelism |
| max_mask_rate | 1.0 (DAG: 0.5) | refuse to publish above this mask rate |
| max_line_bytes | 16 MiB | longest JSON line read |
| batch_rows / batch_tokens | 16,384 calls / 1,000,000 tokens | one batch of a shard |
| token_cache_bytes | 64 MiB | decoded token row groups kept |
| max_row_group_bytes | 64 MiB | largest token row group decoded; its rows are reject rows beyond |
| token_read_ahead_bytes | 128 MiB | decoded ahead in the load; then 1/4 of it beside the shard (one process; 0: off) |
| retention_nights | 30 | nights of per-call tables kept in the warehouse |
| Thresholds | mask rate 0.2, one reason 0.1, rise 0.05, rejects 0 | the quality gate's alerts |
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Literal

from .errors import InputError

Mode = Literal["select", "terminal"]
OffchainPolicy = Literal["selected", "strict"]
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
        if self.mode not in ("select", "terminal"):
            raise InputError(f"mode must be select or terminal, not {self.mode!r}")
        if self.offchain not in ("selected", "strict"):
            raise InputError(f"offchain must be selected or strict, not {self.offchain!r}")


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
    max_rejects: int | None = 0  # rejected input lines


@dataclass(frozen=True)
class Settings:
    options: Options = field(default_factory=Options)
    duckdb: DuckDBSettings = field(default_factory=DuckDBSettings)
    shards: int = 1
    workers: int = 1
    max_mask_rate: float = 1.0
    allow_empty: bool = False
    max_line_bytes: int = MAX_LINE_BYTES
    batch_rows: int = 16_384
    batch_tokens: int = 1_000_000
    token_cache_bytes: int = 64 << 20
    max_row_group_bytes: int = 64 << 20  # a token row group decoding to more is not read (reject rows)
    token_read_ahead_bytes: int = 128 << 20  # one-process builds: decoded while the night loads
    retention_nights: int = 30

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Settings:
        """From the DAG's params (or the operator's fields): flat names, strings allowed."""

        def get(name: str, default, cast):
            value = params.get(name)
            return default if value is None or value == "" else cast(value)

        d = cls()
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
            max_mask_rate=get("max_mask_rate", d.max_mask_rate, float),
            allow_empty=get("allow_empty", d.allow_empty, _bool),
            max_line_bytes=get("max_line_bytes", d.max_line_bytes, int),
            batch_rows=get("batch_rows", d.batch_rows, int),
            batch_tokens=get("batch_tokens", d.batch_tokens, int),
            token_cache_bytes=get("token_cache_bytes", d.token_cache_bytes, int),
            max_row_group_bytes=get("max_row_group_bytes", d.max_row_group_bytes, int),
            retention_nights=get("retention_nights", d.retention_nights, int),
        )


def _bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


DEFAULTS = Settings()
