"""Scheduler rules on a fake clock: dispatch, order, aging, preemption, completion."""

from __future__ import annotations

from typing import Any, TypeVar

import pytest

from rdmasched.scheduler import (
    Action,
    Cancel,
    Decision,
    FakeClock,
    Preempt,
    Scheduler,
    Start,
    Task,
    TaskState,
)
from rdmasched.scheduler.errors import (
    DuplicateTaskError,
    InvalidTaskError,
    SchedulerError,
    TaskStateError,
    UnknownJobError,
    UnknownTaskError,
)

STARVE_US = 1000


def make(nslots: int = 2, **kw: Any) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock(1_000_000)
    kw.setdefault("starvation_us", STARVE_US)
    return Scheduler(nslots, clock=clock, **kw), clock


def T(tid: int, prio: int = 100, job: int = 0, cost_ns: int = 1000) -> Task:
    return Task(id=tid, job=job, priority=prio, cost_ns=cost_ns)


A = TypeVar("A", Start, Preempt, Cancel)


def first(actions: list[Action], kind: type[A]) -> A:
    """The first action, checked to be a ``kind``."""
    a = actions[0]
    assert isinstance(a, kind), a
    return a


def started(actions: list[Any]) -> list[tuple[int, int]]:
    return [(a.task.id, a.slot) for a in actions if isinstance(a, Start)]


def fill(s: Scheduler, clock: FakeClock, prios: list[int], first_id: int = 1) -> None:
    """Dispatch one task per priority, 1 us apart."""
    for i, p in enumerate(prios):
        s.dispatch(T(first_id + i, p))
        clock.advance_us(1)


# --- DISPATCH ---------------------------------------------------------------------------


def test_dispatch_starts_at_once_on_a_free_slot() -> None:
    s, _ = make(2)
    a = s.dispatch(T(1))
    assert a == [Start(first(a, Start).task, 0)]
    assert started(s.dispatch(T(2))) == [(2, 1)]
    assert s.free_slots() == 0
    assert [t.id for t in s.running()] == [1, 2]
    assert s.running()[0].state is TaskState.RUNNING and s.running()[0].slot == 0


def test_dispatch_with_no_free_slot_queues_when_not_outranking() -> None:
    s, _ = make(1)
    s.dispatch(T(1, 100))
    assert s.dispatch(T(2, 100)) == []  # equal priority never preempts
    assert s.dispatch(T(3, 50)) == []
    assert [t.id for t in s.queued()] == [2, 3]
    assert s.get(2).state is TaskState.QUEUED
    assert s.explain(2)[-1].decision is Decision.QUEUE


def test_complete_frees_the_slot_and_starts_the_next() -> None:
    s, clock = make(1)
    fill(s, clock, [100, 100])
    a = s.complete(1)
    assert started(a) == [(2, 0)]
    assert s.get(2).state is TaskState.RUNNING
    assert s.complete(2) == []
    assert s.free_slots() == 1 and s.queued() == []


# --- order and tie-breaking -------------------------------------------------------------


def test_queue_order_is_priority_then_enqueue_time() -> None:
    s, clock = make(1)
    fill(s, clock, [200, 10, 50, 50, 90])  # task 1 runs; 2..5 queue
    order = []
    for tid in (1, 5, 3, 4, 2):
        a = s.complete(tid)
        order += [x for x, _ in started(a)]
    assert order == [5, 3, 4, 2]


def test_tie_same_priority_same_instant_goes_to_lower_id() -> None:
    s, _ = make(1)
    s.dispatch(T(1))
    for tid in (9, 4, 7):  # same priority, same instant
        s.dispatch(T(tid))
    assert [t.id for t in s.queued()] == [4, 7, 9]
    assert started(s.complete(1)) == [(4, 0)]


def test_start_from_queue_names_the_runner_up_as_beaten() -> None:
    s, clock = make(1)
    fill(s, clock, [100, 50, 80])
    s.complete(1)  # 3 (prio 80) starts ahead of 2 (prio 50)
    ev = s.explain(3)[-1]
    assert ev.decision is Decision.START and ev.beaten == (2,)
    assert any(e.decision is Decision.START and e.task_id == 3 for e in s.explain(2))


# --- starvation cap and aging -----------------------------------------------------------


def test_starvation_cap_lets_an_old_low_priority_task_go_first() -> None:
    s, clock = make(1)  # starvation 1000 us
    s.dispatch(T(1, 200))
    s.dispatch(T(2, 0))  # low priority, waits from now
    # higher-priority work keeps coming and is served first while 2 is not yet starved
    nid = 10
    for _ in range(3):
        clock.advance_us(300)
        s.dispatch(T(nid, 150))
        running = s.running()[0].id
        assert [x for x, _ in started(s.complete(running))] == [nid]
        nid += 1
    assert s.get(2).state is TaskState.QUEUED
    clock.advance_us(100)  # 2 has now waited exactly 1000 us: the cap
    s.dispatch(T(nid, 254))  # even the highest compute priority queues behind it
    assert [x for x, _ in started(s.complete(s.running()[0].id))] == [2]
    ev = s.explain(2)[-1]
    assert ev.decision is Decision.START and "starv" in ev.reason and ev.beaten == (nid,)


def test_not_starved_one_ns_before_the_cap() -> None:
    s, clock = make(1)
    s.dispatch(T(1, 200))
    s.dispatch(T(2, 0))
    clock.advance(STARVE_US * 1000 - 1)
    s.dispatch(T(3, 1))
    assert started(s.complete(1)) == [(3, 0)]


def test_sync_tasks_still_go_before_a_starved_task() -> None:
    s, clock = make(1)
    s.dispatch(T(1, 255 - 1))
    s.dispatch(T(2, 0))
    clock.advance_us(STARVE_US * 2)
    s.define_group(7, {0}, lambda g, step: Task(id=1000 + step, job=0, priority=0, cost_ns=1))
    # the sync task preempts the running compute task right away
    a = s.sync_ready(7, 0, member=0)
    assert isinstance(a[0], Preempt) and a[0].victim.id == 1
    s.yielded(1, progress_ns=5)
    assert started(s.complete(1000)) == [(2, 0)]  # then the starved task


def test_aging_raises_rank_one_level_per_aging_us() -> None:
    s, clock = make(1, aging_us=10)
    s.dispatch(T(1, 200))
    s.dispatch(T(2, 10))  # waits
    clock.advance_us(25)  # 2 is now at rank 12.5
    s.dispatch(T(3, 12))
    s.dispatch(T(4, 13))
    # ranks now: 2 -> 12.5, 3 -> 12, 4 -> 13
    assert [t.id for t in s.queued()] == [4, 2, 3]
    assert started(s.complete(1)) == [(4, 0)]


def test_aging_equal_rank_breaks_tie_by_priority() -> None:
    s, clock = make(1, aging_us=10)
    s.dispatch(T(1, 200))
    s.dispatch(T(2, 10))
    clock.advance_us(20)  # 2 is at rank 12 exactly
    s.dispatch(T(3, 12))
    assert [t.id for t in s.queued()] == [3, 2]


def test_without_aging_priority_is_strict_until_the_cap() -> None:
    s, clock = make(1)
    s.dispatch(T(1, 200))
    s.dispatch(T(2, 10))
    clock.advance_us(STARVE_US - 1)
    s.dispatch(T(3, 11))
    assert [t.id for t in s.queued()] == [3, 2]


# --- preemption by priority -------------------------------------------------------------


def test_outranking_dispatch_preempts_the_lowest_priority_running_task() -> None:
    s, clock = make(3)
    fill(s, clock, [100, 20, 60])  # slots 0, 1, 2
    new = T(9, 150)
    a = s.dispatch(new)
    assert len(a) == 2
    p, st = a
    assert isinstance(p, Preempt) and isinstance(st, Start)
    assert (p.victim.id, p.slot, p.by, p.cancel) == (2, 1, new, False)
    assert (st.task, st.slot) == (new, 1)
    assert s.get(2).state is TaskState.PREEMPTING
    assert s.explain(9)[-1].beaten == (2,)


def test_victim_tie_goes_to_the_most_recently_started() -> None:
    s, clock = make(3)
    fill(s, clock, [20, 20, 20])  # started in order 1, 2, 3
    a = s.dispatch(T(9, 21))
    assert first(a, Preempt).victim.id == 3
    s.yielded(3, 0)
    a = s.dispatch(T(10, 21))
    assert first(a, Preempt).victim.id == 2


def test_lower_or_equal_priority_does_not_preempt() -> None:
    s, clock = make(2)
    fill(s, clock, [100, 100])
    assert s.dispatch(T(3, 100)) == []
    assert s.dispatch(T(4, 99)) == []


def test_no_preemption_for_a_task_that_ranks_behind_the_queue_head() -> None:
    s, clock = make(1)
    s.dispatch(T(1, 200))
    s.dispatch(T(2, 5))
    clock.advance_us(STARVE_US)
    s.dispatch(T(3, 100))
    assert started(s.complete(1)) == [(2, 0)]  # 2 starved: runs ahead of 3
    # 4 outranks the running task (50 > 5) but ranks behind the queued 3: no preemption
    assert s.dispatch(T(4, 50)) == []
    assert [t.id for t in s.queued()] == [3, 4]
    # 5 outranks both the running task and the queue head: it preempts
    a = s.dispatch(T(5, 150))
    assert isinstance(a[0], Preempt) and a[0].victim.id == 2


def test_preempted_victim_is_requeued_with_its_progress_and_resumes_first() -> None:
    s, clock = make(1)
    s.dispatch(T(1, 50))
    clock.advance_us(5)
    s.dispatch(T(2, 50))  # queued behind 1
    s.dispatch(T(3, 200))  # preempts 1
    a = s.yielded(1, progress_ns=4321)
    assert a == []
    t1 = s.get(1)
    assert t1.state is TaskState.QUEUED and t1.progress_ns == 4321
    assert [t.id for t in s.queued()] == [1, 2]  # keeps its place: enqueued before 2
    a = s.complete(3)
    assert started(a) == [(1, 0)] and first(a, Start).task.progress_ns == 4321
    assert [e.decision for e in s.explain(1) if e.task_id == 1] == [
        Decision.START,
        Decision.PREEMPT,
        Decision.REQUEUE,
        Decision.START,
    ]


def test_yielded_restarts_at_once_when_a_slot_is_free() -> None:
    s, _ = make(1)
    s.dispatch(T(1, 50))
    s.dispatch(T(2, 200))
    s.complete(2)  # slot free before the victim has yielded
    assert started(s.yielded(1, 10)) == [(1, 0)]


def test_victim_outranking_the_task_that_took_its_slot_meanwhile_preempts_it() -> None:
    # 1 (100) is preempted by 2 (200), and 2 finishes before 1's handler returns: the slot
    # goes to the queue head, 3 (10). When 1 yields it outranks 3, as it would have on
    # arrival: it takes the slot back (found by the torch integration: a bucket sync's
    # slot went to co-located work while the step's compute task was still yielding).
    s, clock = make(1)
    s.dispatch(T(1, 100))
    s.dispatch(T(3, 10))
    clock.advance_us(1)
    first(s.dispatch(T(2, 200)), Preempt)
    assert started(s.complete(2)) == [(3, 0)]
    a = s.yielded(1, 10)
    p = first(a, Preempt)
    assert (p.victim.id, p.slot, p.by.id if p.by else None) == (3, 0, 1)
    assert started(a) == [(1, 0)]
    assert s.get(1).progress_ns == 10


def test_victim_of_a_peer_preempt_does_not_take_the_slot_back() -> None:
    # A peer's PREEMPT gives the slot away on purpose: the requeued task competes in the
    # queue, it does not preempt the task that took its slot.
    s, clock = make(1)
    fill(s, clock, [100, 50])
    s.preempt(1)
    assert s.yielded(1, 0) == []
    assert s.get(1).state is TaskState.QUEUED


def test_sync_tasks_are_never_preempted_by_compute() -> None:
    s, _ = make(1)
    s.define_group(1, {0}, lambda g, st: T(100 + st, 0))
    s.sync_ready(1, 0, 0)
    assert s.running()[0].priority == 255
    assert s.dispatch(T(2, 254)) == []


# --- PREEMPT from a peer ----------------------------------------------------------------


def test_peer_preempt_of_a_running_task_requeues_it_and_fills_the_slot() -> None:
    s, clock = make(1)
    fill(s, clock, [100, 50])
    a = s.preempt(1)
    assert isinstance(a[0], Preempt)
    assert (a[0].victim.id, a[0].slot, a[0].by, a[0].cancel) == (1, 0, None, False)
    assert started(a[1:]) == [(2, 0)]
    assert s.yielded(1, 77) == []
    assert s.get(1).state is TaskState.QUEUED and s.get(1).progress_ns == 77


def test_peer_preempt_requeue_goes_behind_tasks_of_its_priority() -> None:
    s, clock = make(2)
    fill(s, clock, [100, 100, 100])  # 1, 2 run; 3 queued
    s.preempt(1)  # slot 0 goes to 3
    s.yielded(1, 0)
    s.dispatch(T(4, 100))
    # 1 was requeued after 3 started and before 4 arrived; the wait restarts from now
    assert [t.id for t in s.queued()] == [1, 4]
    assert s.get(1).enqueued_ns == clock()


def test_peer_preempt_with_cancel_drops_the_task_after_it_yields() -> None:
    s, _ = make(1)
    s.dispatch(T(1))
    a = s.preempt(1, cancel=True)
    assert first(a, Preempt).cancel is True and s.get(1).state is TaskState.CANCELLING
    assert s.free_slots() == 1
    assert s.yielded(1, 5) == []
    with pytest.raises(UnknownTaskError):
        s.get(1)
    assert s.explain(1)[-1].decision is Decision.CANCEL


def test_peer_preempt_cancel_of_a_queued_task_removes_it_from_the_queue() -> None:
    s, clock = make(1)
    fill(s, clock, [100, 90, 80])
    a = s.preempt(2, cancel=True)
    assert len(a) == 1 and isinstance(a[0], Cancel) and a[0].task.id == 2
    assert [t.id for t in s.queued()] == [3]
    assert started(s.complete(1)) == [(3, 0)]
    assert s.complete(3) == []  # the cancelled task never starts


def test_peer_preempt_requeue_of_a_queued_task_leaves_it_queued() -> None:
    s, clock = make(1)
    fill(s, clock, [100, 90])
    assert s.preempt(2) == []
    assert s.get(2).state is TaskState.QUEUED
    assert s.explain(2)[-1].decision is Decision.KEEP


def test_peer_preempt_of_a_whole_job() -> None:
    s, _ = make(3)
    s.dispatch(T(1, 100, job=7))
    s.dispatch(T(2, 100, job=8))
    s.dispatch(T(3, 100, job=7))
    s.dispatch(T(4, 90, job=7))  # queued
    s.dispatch(T(5, 80, job=8))  # queued
    a = s.preempt(job=7, cancel=True)
    victims = sorted(x.victim.id for x in a if isinstance(x, Preempt))
    cancelled = [x.task.id for x in a if isinstance(x, Cancel)]
    assert victims == [1, 3] and cancelled == [4]
    assert [x for x, _ in started(a)] == [5]  # the only other queued task
    for tid in (1, 3):
        s.yielded(tid, 0)
    assert sorted(t.id for t in s.running()) == [2, 5]
    assert s.free_slots() == 1


def test_peer_preempt_of_a_job_fills_the_freed_slots_in_the_order_of_its_tasks() -> None:
    # every target is off its slot before any slot is filled, and the slots go to the
    # queue in the order the job's tasks were stopped (three: the first freed slot and the
    # two after it take different paths in _stop)
    s, clock = make(3)
    fill(s, clock, [100, 100, 100])  # tasks 1-3 of job 0 on slots 0-2
    for tid, p in ((4, 90), (5, 80), (6, 70)):  # queued, job 9
        s.dispatch(Task(id=tid, job=9, priority=p, cost_ns=1000))
    a = s.preempt(job=0)
    assert [(x.victim.id, x.slot) for x in a[:3] if isinstance(x, Preempt)] == [
        (1, 0),
        (2, 1),
        (3, 2),
    ]
    assert started(a[3:]) == [(4, 0), (5, 1), (6, 2)] and len(a) == 6
    assert s.free_slots() == 0


def test_peer_preempt_of_one_task_gives_its_slot_to_the_queue_head() -> None:
    s, clock = make(1)
    fill(s, clock, [100, 90])
    a = s.preempt(1)
    assert [type(x) for x in a] == [Preempt, Start] and started(a) == [(2, 0)]
    assert s.free_slots() == 0


def test_peer_preempt_needs_exactly_one_of_task_and_job() -> None:
    s, _ = make(1)
    with pytest.raises(ValueError):
        s.preempt()
    with pytest.raises(ValueError):
        s.preempt(1, job=2)


# --- bad input: counted, raised, and the scheduler keeps working -----------------------


def test_unknown_task_in_preempt_is_rejected_and_counted() -> None:
    s, _ = make(1)
    s.dispatch(T(1))
    with pytest.raises(UnknownTaskError) as ei:
        s.preempt(42)
    assert isinstance(ei.value, KeyError) and isinstance(ei.value, SchedulerError)
    assert "42" in str(ei.value)
    st = s.stats()
    assert st.rejected == {"unknown task": 1} and st.rejections == 1
    ev = s.explain(42)[-1]
    assert ev.decision is Decision.REJECT and ev.reason.startswith("unknown task")
    # still works
    assert s.dispatch(T(2)) == [] and started(s.complete(1)) == [(2, 0)]


def test_unknown_job_in_preempt_is_rejected() -> None:
    s, _ = make(1)
    with pytest.raises(UnknownJobError):
        s.preempt(job=3)
    assert s.stats().rejected == {"unknown job": 1}


def test_bad_dispatches_are_rejected_and_leave_no_trace() -> None:
    s, _ = make(1)
    s.dispatch(T(1))
    with pytest.raises(DuplicateTaskError):
        s.dispatch(T(1))
    for bad in (T(2, 256), T(2, -1), T(-5), T(1 << 64), T(2, 255), T(2, cost_ns=-1)):
        with pytest.raises(InvalidTaskError):
            s.dispatch(bad)
    assert s.stats().rejected == {"duplicate task": 1, "invalid task": 6}
    assert s.queued() == [] and [t.id for t in s.running()] == [1]


def test_complete_of_unknown_or_queued_task_is_rejected() -> None:
    s, _ = make(1)
    s.dispatch(T(1))
    s.dispatch(T(2))
    with pytest.raises(UnknownTaskError):
        s.complete(99)
    with pytest.raises(TaskStateError):
        s.complete(2)
    with pytest.raises(TaskStateError):
        s.yielded(1, 0)  # running, was never preempted
    assert s.get(2).state is TaskState.QUEUED
    assert s.stats().rejected == {"unknown task": 1, "bad state": 2}
    assert started(s.complete(1)) == [(2, 0)]


def test_complete_while_being_preempted_drops_the_task() -> None:
    s, _ = make(1)
    s.dispatch(T(1, 10))
    s.dispatch(T(2, 20))  # preempts 1
    assert s.complete(1) == []  # it finished while the handler ran
    with pytest.raises(UnknownTaskError):
        s.yielded(1, 0)
    assert [t.id for t in s.running()] == [2] and s.queued() == []


def test_yielded_rejects_negative_progress() -> None:
    s, _ = make(1)
    s.dispatch(T(1, 10))
    s.dispatch(T(2, 20))
    with pytest.raises(InvalidTaskError):
        s.yielded(1, -1)
    s.yielded(1, 1)
    assert s.get(1).state is TaskState.QUEUED


def test_constructor_checks_its_arguments() -> None:
    clock = FakeClock()
    with pytest.raises(ValueError):
        Scheduler(0, clock=clock, starvation_us=10)
    with pytest.raises(ValueError):
        Scheduler(1, clock=clock, starvation_us=0)
    with pytest.raises(ValueError):
        Scheduler(1, clock=clock, starvation_us=10, aging_us=0)
    with pytest.raises(ValueError):
        Scheduler(1, clock=clock, starvation_us=10, events=-1)  # 0 is events off


# --- load hint and stats ----------------------------------------------------------------


def test_load_hint_is_permille_of_slots_busy_or_wanted() -> None:
    s, clock = make(4)
    assert s.load_hint() == 0
    s.dispatch(T(1))
    assert s.load_hint() == 250
    fill(s, clock, [100] * 5, first_id=2)  # 4 running, 2 queued
    assert s.load_hint() == 1500
    big, _ = make(1)
    for i in range(70):
        big.dispatch(T(i + 1))
    assert big.load_hint() == 0xFFFF  # u16, saturates


def test_stats_count_decisions_and_describe_every_field() -> None:
    s, clock = make(1)
    fill(s, clock, [10, 10])  # start, queue
    s.dispatch(T(3, 50))  # preempt + start
    s.yielded(1, 0)  # requeue
    s.complete(3)  # complete + start
    st = s.stats()
    assert (st.starts, st.queued, st.preemptions, st.requeues, st.completions) == (
        3,
        1,
        1,
        1,
        1,
    )
    # 3 starts + queue + preempt + requeue; a completion is not a decision
    assert st.decisions == 6
    assert (st.running, st.queue_len, st.free_slots) == (1, 1, 0)
    desc = type(st).describe()
    assert set(desc) == set(st.as_dict()) and all(v.strip() for v in desc.values())


def test_a_task_taken_in_keeps_the_key_it_is_held_under() -> None:
    s, _ = make(1, node_id=3)
    t = Task(id=7, job=0, priority=10, cost_ns=1, origin=9)
    assert t.held_key == -1  # not held yet (never a key)
    s.dispatch(t)
    assert t.held_key == t.key == (9 << 64) | 7
    assert s.lookup(7, 9) is t


def test_preempt_task_decides_as_preempt_and_refuses_a_task_not_held() -> None:
    s, _ = make(1)
    t = T(1, prio=10)
    s.dispatch(t)
    s.dispatch(T(2, prio=5))  # queued: takes the slot the PREEMPT frees
    acts = s.preempt_task(t)
    assert first(acts, Preempt) == Preempt(t, 0, None, False)
    assert started(acts) == [(2, 0)]
    assert t.state is TaskState.PREEMPTING
    # a task of the same id and origin that is not the one held, one never taken in, and
    # one no longer held (completed) are refused, and nothing changes
    with pytest.raises(UnknownTaskError):
        s.preempt_task(T(2, prio=5))
    with pytest.raises(UnknownTaskError):
        s.preempt_task(T(3))
    s.yielded(1, 0)
    done = s.lookup(2)
    assert done is not None
    s.complete(2)  # task 1 starts again
    with pytest.raises(UnknownTaskError):
        s.preempt_task(done)
    assert [x.id for x in s.running()] == [1]


def test_preempt_task_with_cancel_drops_a_queued_task_by_its_held_key() -> None:
    s, _ = make(1)
    s.dispatch(T(1, prio=10))
    q = T(2, prio=5)
    s.dispatch(q)
    assert first(s.preempt_task(q, True), Cancel) == Cancel(q)
    assert s.lookup(2) is None and q.state is TaskState.CANCELLED
    assert s.stats().queue_len == 0
