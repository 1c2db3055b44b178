"""No thrash (issue 22 item 6): the run quantum and the preemption budgets govern the
preemptions among ordinary tasks; sync and critical tasks preempt at once; a task held back
by the quantum gets the slot when it ends (``tick()`` at ``wake_at()``); an adversarial
stream of high-priority tasks preempts a bounded number of times.  Run on the compiled core
and on its Python source."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from types import ModuleType
from typing import Any

import pytest

from rdmasched.scheduler import FakeClock, Preempt, Task, core
from rdmasched.scheduler.events import Decision

US = 1000
MS = 1_000_000


def _pure_core() -> ModuleType:
    """core.py loaded as plain Python, whether or not the compiled module is built."""
    assert core.__file__ is not None
    src = core.__file__.rsplit("/", 1)[0] + "/core.py"
    spec = importlib.util.spec_from_file_location("rdmasched_scheduler_core_nothrash", src)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


IMPLS = ["default", "python"]


@pytest.fixture(params=IMPLS)
def make(request: pytest.FixtureRequest) -> Any:
    cls = core.Scheduler if request.param == "default" else _pure_core().Scheduler

    def make(nslots: int = 1, **kw: Any) -> tuple[Any, FakeClock]:
        clock = FakeClock(1 * MS)
        kw.setdefault("starvation_us", 10**9)
        return cls(nslots, clock=clock, **kw), clock

    return make


def T(tid: int, prio: int, job: int = 0) -> Task:
    return Task(id=tid, job=job, priority=prio, cost_ns=1000)


def kinds(actions: list[Any]) -> list[tuple[str, int]]:
    return [
        (type(a).__name__, (a.victim if isinstance(a, Preempt) else a.task).id) for a in actions
    ]


def test_the_quantum_holds_an_ordinary_preemption_until_it_ends(make: Any) -> None:
    s, clock = make(quantum_us=1000)
    assert s.governs()
    s.dispatch(T(1, 10))
    clock.advance_us(300)
    assert s.dispatch(T(2, 100)) == []  # outranks, but task 1 ran 0.3 of its 1 ms
    assert s.wake_at() == 1 * MS + 1 * MS  # started + quantum
    q = [e for e in s.explain(2) if e.decision is Decision.QUEUE][-1]
    assert q.rule == "quantum"
    clock.advance_us(699)
    assert s.tick() == []  # not yet: nothing happens before wake_at
    clock.advance_us(1)
    assert kinds(s.tick()) == [("Preempt", 1), ("Start", 2)]
    assert s.wake_at() is None and s.tick() == []
    s.yielded(1, 300 * US)
    assert [t.id for t in s.queued()] == [1]


def test_sync_and_critical_tasks_preempt_at_once(make: Any) -> None:
    s, _clock = make(2, quantum_us=10_000, critical_priority=200)
    s.dispatch(T(1, 10))
    s.dispatch(T(2, 20))
    out = s.dispatch(T(3, 200))  # critical: at once, the quantum does not hold it
    assert kinds(out) == [("Preempt", 1), ("Start", 3)]
    s.define_group(7, [0], lambda g, step: Task(1000 + step, 0, 255, 0))
    out = s.sync_ready(7, 0, 0)  # a sync task: at once too
    assert kinds(out) == [("Preempt", 2), ("Start", 1000)]
    assert s.wake_at() is None


def test_a_governed_preemption_takes_a_task_past_its_quantum(make: Any) -> None:
    """The lowest running task is young; another below the newcomer has run its quantum:
    that one goes (lowest priority, then most recently started, among those free to go)."""
    s, clock = make(2, quantum_us=1000)
    s.dispatch(T(1, 20))
    clock.advance_us(2000)
    s.dispatch(T(2, 10))  # the lowest, but it just started
    out = s.dispatch(T(3, 100))
    assert kinds(out) == [("Preempt", 1), ("Start", 3)]


def test_a_task_budget_stops_its_preemptions_for_good(make: Any) -> None:
    s, _clock = make(task_budget=2)
    s.dispatch(T(1, 10))
    for n, tid in enumerate((2, 3)):
        out = s.dispatch(T(tid, 100 + n))
        assert kinds(out) == [("Preempt", 1), ("Start", tid)]
        s.yielded(1, 0)
        s.complete(tid)  # task 1 runs again
    assert s.running()[0].id == 1
    assert s.dispatch(T(4, 150)) == []  # its budget (2) is spent
    assert [e.rule for e in s.explain(4)] == ["budget"]
    assert s.wake_at() is None  # it never frees: no wake
    assert kinds(s.dispatch(T(5, 220))) == [("Preempt", 1), ("Start", 5)]  # critical


def test_a_job_budget_counts_over_its_window(make: Any) -> None:
    s, clock = make(2, job_budget=1, job_window_us=5000)
    s.dispatch(T(1, 10, job=9))
    s.dispatch(T(2, 10, job=9))
    assert kinds(s.dispatch(T(3, 100))) == [("Preempt", 2), ("Start", 3)]
    t0 = clock()
    clock.advance_us(10)
    assert s.dispatch(T(4, 100)) == []  # job 9 had its 1 preemption in this window
    assert s.wake_at() == t0 + 5 * MS
    clock.advance_us(4990)
    assert kinds(s.tick()) == [("Preempt", 1), ("Start", 4)]


def _adversary(s: Any, clock: FakeClock, arrivals: int, gap_us: int) -> Counter[int]:
    """Background work on every slot, then a stream of ever higher-priority ordinary tasks,
    one every ``gap_us``, each preempted task yielding at once; ``tick()`` at every wake."""
    nslots = s.nslots
    for i in range(nslots):
        s.dispatch(T(1 + i, 1, job=1 + i % 2))
    victims: Counter[int] = Counter()

    def run(actions: list[Any]) -> None:
        pending = list(actions)
        while pending:
            a = pending.pop(0)
            if isinstance(a, Preempt):
                victims[a.victim.id] += 1
                pending += s.yielded(a.victim.id, 0, a.victim.origin)

    for k in range(arrivals):
        t_next = clock() + gap_us * US
        while (w := s.wake_at()) is not None and w <= t_next:
            clock.advance(max(0, w - clock()))
            run(s.tick())
        clock.advance(max(0, t_next - clock()))
        # priorities 2..199, rising: each newcomer outranks everything that runs
        run(s.dispatch(T(1000 + k, 2 + k * 197 // arrivals, job=3 + k % 5)))
    return victims


def test_an_adversarial_stream_preempts_a_bounded_number_of_times(make: Any) -> None:
    arrivals, gap_us, nslots = 2000, 10, 4
    span_us = arrivals * gap_us
    s, clock = make(nslots, quantum_us=1000)
    victims = _adversary(s, clock, arrivals, gap_us)
    # each slot changes hands by preemption at most once per quantum
    bound = nslots * (span_us // 1000 + 1)
    assert 0 < sum(victims.values()) <= bound
    assert s.stats().preemptions == sum(victims.values())
    # without the quantum the same stream preempts on (nearly) every arrival: the bound bites
    s0, clock0 = make(nslots)
    assert sum(_adversary(s0, clock0, arrivals, gap_us).values()) > 5 * bound
    # a task budget bounds each task, a job budget each job per window
    s, clock = make(nslots, task_budget=3)
    assert max(_adversary(s, clock, arrivals, gap_us).values()) <= 3


def test_the_job_budget_bounds_a_job_per_window(make: Any) -> None:
    s, clock = make(4, job_budget=2, job_window_us=2000)
    log: list[tuple[int, int]] = []
    nslots = s.nslots
    for i in range(nslots):
        s.dispatch(T(1 + i, 1, job=1 + i % 2))
    for k in range(1000):
        clock.advance_us(10)
        while (w := s.wake_at()) is not None and w <= clock():
            acts = s.tick()
            for a in acts:
                if isinstance(a, Preempt):
                    log.append((a.victim.job, clock()))
                    s.yielded(a.victim.id, 0)
        for a in s.dispatch(T(1000 + k, 2 + k // 6, job=3 + k % 5)):
            if isinstance(a, Preempt):
                log.append((a.victim.job, clock()))
                s.yielded(a.victim.id, 0)
    assert log
    for job in {j for j, _ in log}:
        at = sorted(t for j, t in log if j == job)
        for i in range(len(at) - 2):  # no 3 within one 2 ms window
            assert at[i + 2] - at[i] >= 2 * MS


def test_bad_settings_are_refused(make: Any) -> None:
    for kw in (
        {"quantum_us": -1},
        {"task_budget": -1},
        {"job_window_us": 0},
        {"critical_priority": 256},
        {"quantum_us": True},
    ):
        with pytest.raises(ValueError):
            make(**kw)


def test_off_by_default_nothing_is_governed(make: Any) -> None:
    s, _clock = make()
    assert not s.governs()
    s.dispatch(T(1, 10))
    assert isinstance(s.dispatch(T(2, 11))[0], Preempt)
    assert s.yielded(1, 0) == [] and s.wake_at() is None and s.tick() == []


def test_a_task_id_used_again_starts_with_a_fresh_budget(make: Any) -> None:
    """Ids are unique among the tasks held: once task 1 completed, a new task 1 is another
    task, and the preemptions of the first do not count against it."""
    s, _ = make(task_budget=1)
    s.dispatch(T(1, 10))
    s.dispatch(T(2, 100))  # preempts task 1: its one preemption
    s.yielded(1, 0)
    s.complete(2)
    s.complete(1)  # task 1 ran again and is done
    s.dispatch(T(1, 10))  # a new task 1
    assert kinds(s.dispatch(T(3, 100))) == [("Preempt", 1), ("Start", 3)]
