"""Stage probes on the daemon's message path (rdmasched/daemon/probe.py) and the loop
thread's tuning options (rdmasched/daemon/tuning.py)."""

from __future__ import annotations

import os

import pytest

from rdmasched.daemon.probe import AllocCounter, Probe, StageClock, StageCounter
from rdmasched.daemon.tuning import LoopTuning
from rdmasched.errors import ArgumentError


def test_the_stage_clock_records_one_row_per_preempt_whose_handler_ran() -> None:
    t = iter(range(100, 10_000, 10))
    probe = StageClock(lambda: next(t))
    probe.mark(0)
    probe.mark(1)  # polled at 100
    for trigger in (50, 60):
        probe.mark(2)
        probe.preempt_seen(trigger)
        probe.mark(3)
        probe.mark(4)  # handler entered
        probe.mark(5)
    probe.mark(2)  # a heartbeat: no PREEMPT, no handler
    probe.mark(3)
    probe.mark(4)
    probe.mark(5)
    assert len(probe) == 2
    st = probe.stages_ns()
    assert st["written -> polled"] == [50, 40]
    assert st["polled -> taken"] == [10, 40]
    assert st["taken -> decided"] == [10, 10] and st["decided -> handler"] == [10, 10]
    assert st["written -> handler"] == [80, 100]


def test_only_the_stage_clock_asks_for_the_trigger_stamp() -> None:
    # the driver reads a PREEMPT's trigger stamp (an int made) and calls preempt_seen inside
    # the core stage only for a probe that uses it: the counters count the path without it
    # (tests/tier2/test_bench_stages.py runs the stage clock on the real path)
    assert StageClock(lambda: 0).wants_trigger
    assert not Probe().wants_trigger
    assert not AllocCounter.wants_trigger and not StageCounter.wants_trigger


def test_the_stage_counter_counts_only_its_stage() -> None:
    pytest.importorskip("rdmasched._callgrind")
    probe = StageCounter("core")
    for point in (0, 1, 2, 3, 4, 5, 2, 3, 5):
        probe.mark(point)
    assert probe.count == 2 and not probe._on  # on at every 2, off at the next point
    with pytest.raises(ValueError, match="unknown stage"):
        StageCounter("nope")


def test_tuning_options_are_checked() -> None:
    with pytest.raises(ArgumentError, match="not a CPU"):
        LoopTuning(cpu=10_000)
    with pytest.raises(ArgumentError, match=r"1\.\.99"):
        LoopTuning(fifo=0)
    assert not LoopTuning() and LoopTuning(gc_freeze=True)


def test_tuning_applies_to_the_calling_thread_only() -> None:
    import threading

    before = os.sched_getaffinity(0)
    cpu = max(before)
    seen: list[set[int]] = []

    def body() -> None:
        done = LoopTuning(cpu=cpu, gc_freeze=True).apply()
        assert done[0] == f"pinned to CPU {cpu}" and done[1].startswith("gc frozen")
        seen.append(os.sched_getaffinity(0))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    import gc

    gc.unfreeze()
    assert seen == [{cpu}] and os.sched_getaffinity(0) == before
