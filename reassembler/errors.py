"""Every way the job can stop, each with its exit code and a one-line message.

The command line prints `reassembler: error: <message>` and exits with the code; the DAG
fails its task with the same message. A message names the file or setting and says what
to change. Nothing here is a data fault of a rollout: those mask the rollout
(reasons.py) and the night still builds.

| code | exception          | meaning                                                        |
|------|--------------------|----------------------------------------------------------------|
| 0    |                    | the night was built (masked rollouts included)                 |
| 1    | AuditCheckFailed   | the staged night broke an invariant; nothing was published     |
| 2    | InputError         | bad usage or unusable input (a file, a folder, an option)      |
| 3    | OutputBusy         | another build holds the output, or the warehouse is locked     |
| 4    | ResourceExhausted  | out of memory or disk: the message says which limit or path    |
| 5    |                    | `reassembler gate`: the night breached an alert threshold      |
| 6    | StoreError         | object storage: unreachable, access denied, or no such bucket  |
| 70   | (anything else)    | a bug: the message names it; REASSEMBLER_DEBUG=1 shows the trace |
"""

from __future__ import annotations

import errno
import re

EXIT_OK = 0
EXIT_AUDIT = 1
EXIT_USAGE = 2
EXIT_BUSY = 3
EXIT_RESOURCES = 4
EXIT_GATE = 5
EXIT_STORE = 6
EXIT_BUG = 70


class ReassemblerError(Exception):
    """Base of the job's own errors; `exit_code` is what the command line returns."""

    exit_code = EXIT_BUG


class AuditCheckFailed(ReassemblerError):
    """The staged night breaks an invariant; nothing was published."""

    exit_code = EXIT_AUDIT


class InputError(ReassemblerError):
    """Unusable input or bad usage: the night cannot be built. One line naming the file."""

    exit_code = EXIT_USAGE


class OutputBusy(ReassemblerError):
    """Another process holds the output (a build) or the warehouse file (any DuckDB client)."""

    exit_code = EXIT_BUSY


class StoreError(ReassemblerError):
    """Object storage cannot be used: the endpoint does not answer, the credentials are
    refused, or the bucket does not exist (storage.py)."""

    exit_code = EXIT_STORE


class ResourceExhausted(ReassemblerError):
    """Out of memory (DuckDB's memory_limit or the machine) or out of disk."""

    exit_code = EXIT_RESOURCES


_MEMORY_USED = re.compile(r"\(\d+(\.\d+)? [KMGT]?i?B/\d+(\.\d+)? [KMGT]?i?B used\)")
# what DuckDB says of a database file that is cut short or whose blocks fail their checksum
_DAMAGED = re.compile(
    r"Corrupt database file|Could not read enough bytes|checksum .* does not match|not a valid DuckDB database"
    r"|database file .* is (corrupt|truncated)|Failed to read database header|block at location \d+",
    re.IGNORECASE,
)
_FILE_IN_MESSAGE = re.compile(r'file "([^"]+)"')


def damaged_warehouse(text: str, warehouse=None) -> InputError:
    """The one line for a warehouse file DuckDB cannot read back: which file, and how to go on."""
    named = _FILE_IN_MESSAGE.search(text)
    path = named.group(1) if named else (warehouse or "<output>/warehouse.duckdb")
    return InputError(
        f"{path}: the warehouse file is damaged ({text}); the published partitions were not touched. "
        "Move the file aside (keep it to inspect) and run the build again: it starts a new warehouse, "
        "and the audit/ partitions keep the earlier nights' record"
    )


def classify(exc: BaseException, settings=None, warehouse=None) -> ReassemblerError | None:
    """Turn an error raised by DuckDB, Arrow or the OS into one of ours, or None.
    `warehouse`: the path of the warehouse file, for the message when it is damaged."""
    import duckdb

    if isinstance(exc, ReassemblerError):
        return exc
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    named = _FILE_IN_MESSAGE.search(text)
    if (
        isinstance(exc, duckdb.Error)
        and _DAMAGED.search(text)
        and (named is None or named.group(1).endswith((".duckdb", ".duckdb.wal")))
    ):
        return damaged_warehouse(text, warehouse)
    limit = getattr(settings, "memory_limit", None)
    # DuckDB's buffer manager says "... (3.6 MiB/3.8 MiB used)" however it words the rest
    # (a checkpoint: "could not allocate block ...", "failed to pin block ...")
    out_of_memory = "Out of Memory" in text or _MEMORY_USED.search(text) is not None
    if isinstance(exc, (duckdb.OutOfMemoryException, MemoryError)) or out_of_memory:
        return ResourceExhausted(
            f"out of memory{f' at memory_limit {limit}' if limit else ''} ({text}); "
            "raise --memory-limit (DAG: duckdb_memory_limit) or use more shards"
        )
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "No space left on device" in text:
        where = getattr(exc, "filename", None)
        return ResourceExhausted(
            f"no space left on device{f' writing {where}' if where else ''} ({text}); "
            "free space there, or point --output / --temp-directory at a larger disk"
        )
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return InputError(f"{exc.filename or text}: not writable ({exc.strerror or text})")
    if isinstance(exc, duckdb.IOException) and "Could not set lock" in text:
        return OutputBusy(f"the warehouse is locked by another process: {text}")
    if isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException)):
        return InputError(f"unreadable input: {text}")
    if isinstance(exc, FileNotFoundError):
        return InputError(str(exc))
    if type(exc).__module__.split(".")[0] in ("botocore", "urllib3") or (
        isinstance(exc, OSError) and "AWS Error" in text
    ):
        # an object-storage failure that reached here without its object (storage/ names it
        # where it can): still the store's, never a bug
        return StoreError(f"object storage error ({type(exc).__name__}: {text[:300]})")
    return None
