"""Stage probes on the daemon's message path (rdmasched/daemon/probe.py) and the loop
thread's tuning options (rdmasched/daemon/tuning.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from rdmasched.daemon import tuning
from rdmasched.daemon.probe import AllocCounter, Probe, StageClock, StageCounter
from rdmasched.daemon.tuning import LoopTuning
from rdmasched.errors import ArgumentError
from tests.waiting import wait_for


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


def test_a_slice_is_checked() -> None:
    for bad in (0, 99, 100_001, 1.5, True):
        with pytest.raises(ArgumentError, match=r"slice_us=.*100\.\.100000"):
            LoopTuning(slice_us=bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="SCHED_FIFO thread has no slice"):
        LoopTuning(fifo=5, slice_us=100)
    assert LoopTuning(slice_us=100) and LoopTuning(slice_us=100_000)


def _in_a_thread(fn: Callable[[], Any]) -> Any:
    import threading

    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_a_slice_applies_to_the_calling_thread_only_and_keeps_its_nice() -> None:
    import threading

    before = tuning.get_slice()

    def body() -> tuple[list[str], int | None, int]:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 5)
        done = LoopTuning(slice_us=300).apply()
        return done, tuning.get_slice(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    done, got, nice = _in_a_thread(body)
    assert nice == 5  # the slice request kept the thread's nice
    assert tuning.get_slice() == before  # the caller's own thread is untouched
    if before is None:  # a kernel without EEVDF's custom slices (before 6.12): one line
        assert len(done) == 1 and done[0].startswith("no EEVDF slice: "), done
        assert got is None
    else:
        assert done == ["EEVDF slice 300 us"] and got == 300


def test_a_slice_can_be_set_on_another_thread_of_the_process() -> None:
    import threading

    if tuning.get_slice() is None:
        pytest.skip("this kernel has no EEVDF custom slice (Linux 6.12+)")
    ready, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def body() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        stop.wait(10)

    t = threading.Thread(target=body)
    t.start()
    try:
        ready.wait(10)
        assert tuning.set_slice(250, tid[0]) is None
        assert tuning.get_slice(tid[0]) == 250
    finally:
        stop.set()
        t.join()
    # a thread that is gone: a reason, not an exception. join() returns before the kernel
    # has reaped the thread (a set on it then succeeded, 8 times in 2,000 here): wait for that
    wait_for(lambda: not os.path.exists(f"/proc/self/task/{tid[0]}"), "the thread to be gone")
    why = tuning.set_slice(250, tid[0])
    assert why is not None and str(tid[0]) in why, why
