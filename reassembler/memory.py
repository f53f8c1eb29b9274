"""How the pipeline's steps use memory (the build's steps, and the load's child processes).

`step_memory()`: pyarrow allocates through jemalloc, and Python's cycle collector runs
rarely, while a step runs (docs/performance.md has the figures).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

import pyarrow as pa


@contextmanager
def step_memory():
    """How a step uses memory: pyarrow allocates through jemalloc (its default, mimalloc,
    handed each freed batch's pages back to the kernel and faulted fresh zeroed ones in), and
    Python's cycle collector runs rarely meanwhile (the steps allocate many short-lived
    containers; at the default thresholds it cost ~6% of a shard's CPU). Reference counting
    frees everything else as usual."""
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # a pyarrow built without jemalloc keeps its default
        pass
    thresholds = gc.get_threshold()
    gc.set_threshold(STEP_GC_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


STEP_GC_THRESHOLD = 200_000  # container allocations between two young-generation collections


def give_back() -> None:
    """Between two steps of one process (a one-process build's load and its shards): collect
    the cycles the step left and hand the C heap's free pages back to the kernel (glibc's
    malloc_trim; a no-op elsewhere), so the next step does not start on top of them."""
    import ctypes
    import ctypes.util

    gc.collect()
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        trim = None
    if trim is not None:
        trim(0)
