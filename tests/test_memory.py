"""How a step uses memory (memory.py): pyarrow on jemalloc and the young generation collected
rarely while it runs, the collector's thresholds given back after (a failure too), and the
cycles a step left collected between two steps."""

from __future__ import annotations

import gc
import weakref

import pyarrow as pa
import pytest

from reassembler.memory import STEP_GC_THRESHOLD, give_back, step_memory


def test_a_step_runs_on_jemalloc_with_the_young_generation_collected_rarely():
    before, pool = gc.get_threshold(), pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())  # whatever an earlier test of this process left
    try:
        with step_memory():
            assert gc.get_threshold() == (STEP_GC_THRESHOLD, *before[1:])
            assert pa.default_memory_pool().backend_name == "jemalloc"  # this pyarrow has it
    finally:
        pa.set_memory_pool(pool)
    assert gc.get_threshold() == before


def test_the_collectors_thresholds_come_back_when_a_step_fails():
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), step_memory():
        raise RuntimeError("the step failed")
    assert gc.get_threshold() == before


def test_the_cycles_a_step_left_are_collected_between_two_steps():
    class Node:
        pass

    gc.disable()  # only give_back may collect here
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None
        give_back()
        assert gone() is None
    finally:
        gc.enable()
