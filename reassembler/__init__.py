"""Rebuild verified training rows from one night of NeMo Gym token capture (README.md).

The process settings below are read by numpy and Arrow as they load, so they are set
before any module of this package imports them (a value already set in the environment
wins). Every entry point (the `reassembler` command, the Airflow tasks, the tests) imports
this package first.
"""

import os

# numpy's OpenBLAS starts no thread pool (its threads spin for a while after start; nothing
# here multiplies matrices).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# jemalloc for every Arrow allocation, the ones inside the Parquet and JSON readers too
# (build._steady_memory sets pyarrow's own default, which those do not use): under mimalloc
# each batch faulted fresh zeroed pages in; with it peak RSS is ~35-50 MiB lower.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
