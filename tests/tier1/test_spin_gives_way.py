"""A thread spinning in a wait gives its CPU to any other thread ready to run there (issue 21,
bench peers c: a daemon spinning after a preemption held the core its rank's reader was
woken on, so the preempting task's start waited for the spin to end).

The spinner and a CPU-bound process are pinned to the same CPU. Left to the kernel, two
runnable processes share it about evenly; a spin that gives way leaves nearly all of it to
the other process. The test compares the two processes' CPU time over the same window
(each one's /proc schedstat), a share and not a duration, so a slow or loaded host moves
both alike.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

import pytest

from rdmasched._ring import Batch, LaneSet
from rdmasched.transport import shm

#: the spinner's wait and the other process's run, s: both outlast the window measured
SPIN_S = 1.5
WINDOW_S = 0.8
#: the other process's share of the CPU: about 0.5 if the spinner keeps its turns
GIVES_WAY = 0.8

_ctx = mp.get_context("fork")


def _on_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _spin_in_wait(cpu: int, name: str, ready: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    lanes = LaneSet()  # no lane, no doorbell: nothing comes, it spins the whole wait
    ready.set()
    lanes.wait(Batch(4), SPIN_S * 1e6, SPIN_S * 1e6)


def _spin_in_poll(cpu: int, name: str, ready: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    with shm.create_lane(name, 16) as rx:
        ready.set()
        assert rx.poll(SPIN_S * 1e6) is None  # busy until the timeout: nothing is sent


def _burn(cpu: int, go: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    go.wait()
    t0 = time.monotonic()
    while time.monotonic() - t0 < SPIN_S:
        pass


@pytest.mark.parametrize("spinner", [_spin_in_wait, _spin_in_poll], ids=["wait", "poll"])
def test_a_spinning_waiter_leaves_its_cpu_to_a_thread_ready_to_run(
    spinner: Any, lane_name: Any
) -> None:
    cpu = sorted(os.sched_getaffinity(0))[0]
    ready, go = _ctx.Event(), _ctx.Event()
    s = _ctx.Process(target=spinner, args=(cpu, lane_name(), ready))
    b = _ctx.Process(target=_burn, args=(cpu, go))
    try:
        s.start()
        b.start()
        assert ready.wait(30)
        go.set()
        time.sleep(0.1)  # both running, the spinner past its first microseconds
        s0, b0 = _on_cpu_ns(s.pid), _on_cpu_ns(b.pid)
        time.sleep(WINDOW_S)
        spun, burned = _on_cpu_ns(s.pid) - s0, _on_cpu_ns(b.pid) - b0
    finally:
        for p in (s, b):  # both end by themselves (the spinner's lane removed as it returns)
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(30)
    assert s.exitcode == 0 and b.exitcode == 0
    share = burned / max(1, burned + spun)
    assert share >= GIVES_WAY, (
        f"the spinner kept its turns: the other process got {share:.0%} of the CPU they "
        f"shared ({burned / 1e9:.3f} s against the spinner's {spun / 1e9:.3f} s)"
    )
