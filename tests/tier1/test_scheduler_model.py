"""The scheduler against a naive reference model, on random operation sequences.

The model restates the rules of docs/SCHEDULER.md in the plainest way (lists, sorts, no
heaps, no lazy deletion); hypothesis drives both with the same operations and checks that
they take the same decisions.  A second test runs the pure-Python module against the
compiled one (when it is built) and checks that their events are identical.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rdmasched.scheduler import Cancel, FakeClock, Preempt, Scheduler, Start, Task, core

STARVE_NS = 1_000_000  # starvation_us=1000
AGING_NS = 10_000  # aging_us=10


@dataclass
class M:  # a task as the model sees it
    id: int
    prio: int
    enq: int
    since: int = 0
    qseq: int = 0
    state: str = "N"  # N(ew), Q(ueued), R(unning), P(reempting), C(ancelling)
    slot: int = -1
    started: int = 0
    outranked: bool = False  # preempted for a higher-priority task, not yet yielded


class Model:
    def __init__(self, nslots: int, aging: bool) -> None:
        self.free = list(range(nslots - 1, -1, -1))
        self.tasks: dict[int, M] = {}
        self.aging = aging
        self.seq = itertools.count(1)
        self.qseq = itertools.count(1)

    def key(self, t: M) -> tuple[int, ...]:
        if t.prio == 255:
            return (0, t.enq, 0, t.enq, t.id)
        if self.aging:
            return (1, t.enq + (254 - t.prio) * AGING_NS, -t.prio, t.enq, t.id)
        return (1, -t.prio, t.enq, t.enq, t.id)

    def queued(self) -> list[M]:
        return [t for t in self.tasks.values() if t.state == "Q"]

    def starved(self, now: int) -> list[M]:
        s = [t for t in self.queued() if t.prio != 255 and now - t.since >= STARVE_NS]
        return sorted(s, key=lambda t: (t.since, t.qseq))

    def order(self, now: int) -> list[int]:
        q = self.queued()
        syncs = sorted((t for t in q if t.prio == 255), key=self.key)
        starved = self.starved(now)
        rest = sorted((t for t in q if t.prio != 255 and t not in starved), key=self.key)
        return [t.id for t in syncs + starved + rest]

    def run(self, t: M, slot: int) -> None:
        t.state, t.slot, t.started = "R", slot, next(self.seq)

    def enqueue(self, t: M, now: int) -> None:
        t.state, t.since, t.qseq = "Q", now, next(self.qseq)

    def fill(self, slot: int, now: int, out: list[Any]) -> None:
        q = self.queued()
        if not q:
            self.free.append(slot)
            return
        head = min(q, key=self.key)
        pick = head
        starved = self.starved(now)
        if head.prio != 255 and starved and starved[0] is not head:
            pick = starved[0]
        self.run(pick, slot)
        out.append(("start", pick.id, slot))

    def place(self, t: M, now: int) -> list[Any]:
        if self.free:
            slot = self.free.pop()
            self.run(t, slot)
            return [("start", t.id, slot)]
        out = self.outrank(t, now)
        if out is None:
            self.enqueue(t, now)
            return []
        return out

    def outrank(self, t: M, now: int) -> list[Any] | None:
        """No slot free: `t` preempts the lowest running task if it outranks it and would
        head the queue."""
        running = [x for x in self.tasks.values() if x.state == "R"]
        victim = min(running, key=lambda x: (x.prio, -x.started))
        if t.prio > victim.prio:
            q = self.queued()
            heads = not q or (
                (t.prio == 255 or not self.starved(now))
                and self.key(t) < min(self.key(x) for x in q)
            )
            if heads:
                victim.state, victim.outranked = "P", True
                slot = victim.slot
                self.run(t, slot)
                return [
                    ("preempt", victim.id, slot, t.id, False),
                    ("start", t.id, slot),
                ]
        return None

    def dispatch(self, tid: int, prio: int, now: int) -> list[Any]:
        t = self.tasks[tid] = M(tid, prio, now)
        return self.place(t, now)

    def complete(self, tid: int, now: int) -> list[Any]:
        t = self.tasks.pop(tid)
        out: list[Any] = []
        if t.state == "R":
            self.fill(t.slot, now, out)
        return out

    def yielded(self, tid: int, now: int) -> list[Any]:
        t = self.tasks[tid]
        if t.state == "C":
            del self.tasks[tid]
            return []
        outranked, t.outranked = t.outranked, False
        if self.free:
            slot = self.free.pop()
            self.run(t, slot)
            return [("start", tid, slot)]
        out = self.outrank(t, now) if outranked else None
        if out is None:
            self.enqueue(t, now)
            return []
        return out

    def preempt(self, tid: int, cancel: bool, now: int) -> list[Any]:
        t = self.tasks[tid]
        out: list[Any] = []
        if t.state == "Q":
            if cancel:
                del self.tasks[tid]
                out.append(("cancel", tid))
        elif t.state == "P":
            if cancel:
                t.state = "C"
        elif t.state == "R":
            t.state = "C" if cancel else "P"
            t.enq = now
            out.append(("preempt", tid, t.slot, None, cancel))
            self.fill(t.slot, now, out)
        return out


def summary(actions: list[Any]) -> list[Any]:
    out: list[Any] = []
    for a in actions:
        if isinstance(a, Start):
            out.append(("start", a.task.id, a.slot))
        elif isinstance(a, Preempt):
            by = None if a.by is None else a.by.id
            out.append(("preempt", a.victim.id, a.slot, by, a.cancel))
        elif isinstance(a, Cancel):
            out.append(("cancel", a.task.id))
    return out


_dispatch = st.tuples(st.just("dispatch"), st.sampled_from([0, 10, 100, 100, 101, 200, 254]))
_complete = st.tuples(st.just("complete"), st.integers(0, 15))
op = st.one_of(
    # weighted by repetition: mostly arrivals and completions, as on a real node
    _dispatch,
    _dispatch,
    _dispatch,
    _complete,
    _complete,
    st.tuples(st.just("yield"), st.integers(0, 15)),
    st.tuples(st.just("preempt"), st.integers(0, 31), st.booleans()),
    st.tuples(st.just("advance"), st.sampled_from([0, 1, 250, 500, 1000])),
    st.tuples(st.just("advance"), st.sampled_from([250, 500])),
    st.tuples(st.just("sync"), st.just(0)),
)


def drive(sched: Any, clock: FakeClock, ops: list[Any], model: Model | None) -> list[Any]:
    """Apply ``ops``; check against ``model`` if given; return every action summary."""
    log: list[Any] = []
    next_id = itertools.count(1)
    step = itertools.count(0)
    sched.define_group(1, {0}, lambda g, s: Task(id=10_000 + s, job=0, priority=0, cost_ns=0))
    held: list[int] = []  # ids dispatched and not finished (in order)
    pending: list[int] = []  # preempted, not yet yielded
    for o in ops:
        now = clock()
        kind = o[0]
        if kind == "dispatch":
            tid = next(next_id)
            got = summary(sched.dispatch(Task(id=tid, job=0, priority=o[1], cost_ns=1)))
            want = None if model is None else model.dispatch(tid, o[1], now)
            held.append(tid)
        elif kind == "sync":
            s = next(step)
            got = summary(sched.sync_ready(1, s, 0))
            tid = 10_000 + s
            want = None if model is None else model.dispatch(tid, 255, now)
            held.append(tid)
        elif kind == "complete":
            running = [t.id for t in sched.running()]
            if not running:
                continue
            tid = running[o[1] % len(running)]
            got = summary(sched.complete(tid))
            want = None if model is None else model.complete(tid, now)
            held.remove(tid)
        elif kind == "yield":
            if not pending:
                continue
            tid = pending.pop(o[1] % len(pending))
            cancelled = sched.get(tid).state.name == "CANCELLING"
            got = summary(sched.yielded(tid, 5))
            want = None if model is None else model.yielded(tid, now)
            if cancelled:
                held.remove(tid)
        elif kind == "preempt":
            if not held:
                continue
            tid = held[o[1] % len(held)]  # queued, running or being preempted
            got = summary(sched.preempt(tid, cancel=o[2]))
            want = None if model is None else model.preempt(tid, o[2], now)
            if any(a[0] == "cancel" for a in got):
                held.remove(tid)
        else:
            clock.advance_us(o[1])
            continue
        for a in got:
            if a[0] == "preempt" and a[1] not in pending:
                pending.append(a[1])
        log.append((o, got))
        if model is not None:
            event(f"{kind} -> {sorted({a[0] for a in got})}")
            assert got == want, (o, got, want)
            assert [t.id for t in sched.queued()] == model.order(clock())
        # invariants, model or not
        assert sched.free_slots() + len(sched.running()) == sched.nslots
        assert sched.free_slots() == 0 or not sched.queued()
    st = sched.stats()
    if st.events_dropped == 0:  # every event is counted once: decisions + completions
        assert st.events_recorded == len(sched.events())
        assert st.decisions == sum(1 for e in sched.events() if e.decision != "complete")
    return log


@pytest.mark.parametrize("aging", [False, True])
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=10, max_size=150), nslots=st.integers(1, 3))
def test_scheduler_matches_the_reference_model(aging: bool, ops: list[Any], nslots: int) -> None:
    clock = FakeClock(0)
    kw: dict[str, Any] = {"aging_us": AGING_NS // 1000} if aging else {}
    s = Scheduler(nslots, clock=clock, starvation_us=STARVE_NS // 1000, **kw)
    drive(s, clock, ops, Model(nslots, aging))


def _pure_core() -> ModuleType:
    """core.py loaded as plain Python, whether or not the compiled module is built."""
    assert core.__file__ is not None
    src = core.__file__.rsplit("/", 1)[0] + "/core.py"
    spec = importlib.util.spec_from_file_location("rdmasched_scheduler_core_pure", src)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(core.IMPLEMENTATION != "compiled", reason="compiled core not built")
@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op, max_size=120), nslots=st.integers(1, 4))
def test_compiled_and_pure_python_take_identical_decisions(ops: list[Any], nslots: int) -> None:
    pure = _pure_core()
    assert pure.IMPLEMENTATION == "python"
    runs = []
    for cls in (Scheduler, pure.Scheduler):
        clock = FakeClock(0)
        s = cls(nslots, clock=clock, starvation_us=1000)
        log = drive(s, clock, ops, None)
        runs.append((log, s.events(), s.stats().as_dict()))
    assert runs[0] == runs[1]


@pytest.mark.skipif(core.IMPLEMENTATION != "compiled", reason="compiled core not built")
def test_compiled_core_is_not_older_than_its_source() -> None:
    """A stale build shadows core.py on import: every test would run the old code."""
    assert core.__file__ is not None
    here = os.path.dirname(core.__file__)
    built = os.path.getmtime(core.__file__)
    for src in ("core.py", "core.pxd", "task.pxd"):
        assert os.path.getmtime(os.path.join(here, src)) <= built, (
            f"{src} changed after {os.path.basename(core.__file__)} was built: "
            "rebuild it (python setup.py build_ext --inplace) or delete it"
        )


@pytest.mark.skipif(core.IMPLEMENTATION != "compiled", reason="compiled core not built")
def test_the_compiled_core_runs_on_the_compiled_task() -> None:
    """setup.py builds task.py with the core: the core's typed fast path needs it (a core
    built against the extension-type Task refuses a plain one), and a stale task build
    would shadow task.py."""
    from rdmasched.scheduler import task

    assert task.__file__ is not None and not task.__file__.endswith(".py")
    built = os.path.getmtime(task.__file__)
    here = os.path.dirname(task.__file__)
    for src in ("task.py", "task.pxd"):
        assert os.path.getmtime(os.path.join(here, src)) <= built, f"rebuild: {src} is newer"
