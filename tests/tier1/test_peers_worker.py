"""bench peers' rdmasched worker (`rdmasched.bench.peers._Worker`, docs/BENCH.md "How each
system is set up"): a task of at most `INLINE_NS` runs in the dispatch handler, on the
reader's own thread, and completes there; a longer one goes to a work thread, so that the
reader stays free for the rank's other notices, and a preemption stops it with its progress."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from rdmasched.bench import peers


class _Client:
    def __init__(self) -> None:
        self.completed: list[tuple[int, int]] = []  # (task id, the completing thread)
        self.handlers: dict[str, Any] = {}

    def on_dispatch(self, fn: Any) -> None:
        self.handlers["dispatch"] = fn

    def on_preempt(self, fn: Any) -> None:
        self.handlers["preempt"] = fn

    def complete(self, tid: int) -> None:
        self.completed.append((tid, threading.get_ident()))


def _task(tid: int, cost_ns: int, progress_ns: int = 0) -> Any:
    return SimpleNamespace(id=tid, cost_ns=cost_ns, progress_ns=progress_ns)


def test_a_no_op_runs_and_completes_in_the_dispatch_handler() -> None:
    c = _Client()
    w = peers._Worker(c, 2)
    started: list[int] = []
    w.done = lambda tid, start: started.append(start)
    t0 = time.monotonic_ns()
    c.handlers["dispatch"](_task(7, 0), 0)
    assert c.completed == [(7, threading.get_ident())]  # before the handler returned
    assert len(started) == 1 and started[0] >= t0
    assert not w.runs
    w.pool.shutdown()


def test_a_long_task_runs_on_a_work_thread_and_a_preemption_gives_its_progress() -> None:
    c = _Client()
    w = peers._Worker(c, 2)
    task = _task(8, 10**9)  # 1 s: it waits on its stop event
    c.handlers["dispatch"](task, 0)
    assert not c.completed and 8 in w.runs
    time.sleep(0.05)
    progress = c.handlers["preempt"](task, 0, False)
    assert 40_000_000 <= progress < 10**9
    w.pool.shutdown(wait=True)
    assert not c.completed  # preempted: the daemon starts it again for what is left
    # what is left is short: it runs at once, on this thread, and keeps its first start
    first = w.first[8]
    got: list[int] = []
    w.done = lambda tid, start: got.append(start)
    c.handlers["dispatch"](_task(8, 10**9, 10**9 - peers.INLINE_NS), 0)
    assert c.completed == [(8, threading.get_ident())] and got == [first]
