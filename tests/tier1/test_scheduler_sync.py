"""SYNC_READY: a group's sync task is released only when every member reported the step."""

from __future__ import annotations

import pytest

from rdmasched.limits import NO_SLOT
from rdmasched.scheduler import Decision, FakeClock, Preempt, Scheduler, Start, Task
from rdmasched.scheduler.errors import (
    DuplicateTaskError,
    StaleStepError,
    UnknownGroupError,
    UnknownMemberError,
)


def make(nslots: int = 2) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock(0)
    return Scheduler(nslots, clock=clock, starvation_us=1000), clock


def step_task(group: int, step: int) -> Task:
    return Task(id=(group << 32) | step, job=group, priority=0, cost_ns=10)


def test_release_only_when_every_member_reported() -> None:
    s, _ = make(2)
    s.define_group(5, {1, 2, 3}, step_task)
    assert s.sync_ready(5, 0, 1) == []
    assert s.sync_ready(5, 0, 2) == []
    assert s.sync_ready(5, 0, 2) == []  # a repeated report changes nothing
    assert s.pending_sync(5) == {0: frozenset({1, 2})}
    a = s.sync_ready(5, 0, 3)
    assert len(a) == 1 and isinstance(a[0], Start)
    t = a[0].task
    assert t.id == 5 << 32 and t.priority == 255 and t.group == 5 and t.is_sync
    assert s.pending_sync(5) == {}
    kinds = [e.decision for e in s.explain(t.id)]
    assert kinds == [Decision.RELEASE, Decision.START]


def test_steps_are_counted_separately() -> None:
    s, _ = make(2)
    s.define_group(1, {1, 2}, step_task)
    s.sync_ready(1, 0, 1)
    s.sync_ready(1, 1, 1)  # member 1 runs ahead
    s.sync_ready(1, 1, 2)  # step 1 complete before step 0
    assert s.stats().sync_releases == 1
    # step 0 was overtaken: it is now stale and its partial reports were dropped
    assert s.pending_sync(1) == {}
    with pytest.raises(StaleStepError):
        s.sync_ready(1, 0, 2)


def test_sync_task_preempts_compute_when_no_slot_is_free() -> None:
    s, clock = make(2)
    s.dispatch(Task(id=1, job=0, priority=10, cost_ns=1))
    clock.advance(1)
    s.dispatch(Task(id=2, job=0, priority=200, cost_ns=1))
    s.define_group(9, {0}, step_task)
    a = s.sync_ready(9, 4, 0)
    assert isinstance(a[0], Preempt) and a[0].victim.id == 1 and a[0].by is not None
    assert isinstance(a[1], Start) and a[1].task.is_sync and a[1].slot == a[0].slot


def test_a_second_sync_task_queues_behind_the_first_when_all_slots_sync() -> None:
    s, _ = make(1)
    s.define_group(1, {0}, step_task)
    s.define_group(2, {0}, step_task)
    s.sync_ready(1, 0, 0)
    assert s.sync_ready(2, 0, 0) == []
    assert [t.group for t in s.queued()] == [2]


def test_sync_ready_for_an_unknown_group_is_rejected_and_counted() -> None:
    s, _ = make(1)
    with pytest.raises(UnknownGroupError) as ei:
        s.sync_ready(77, 0, 1)
    assert isinstance(ei.value, KeyError) and "77" in str(ei.value)
    assert s.stats().rejected == {"unknown group": 1}
    assert s.events()[-1].decision is Decision.REJECT
    # still works
    s.define_group(77, {1}, step_task)
    assert isinstance(s.sync_ready(77, 0, 1)[0], Start)


def test_sync_ready_from_a_non_member_is_rejected() -> None:
    s, _ = make(1)
    s.define_group(1, {1, 2}, step_task)
    with pytest.raises(UnknownMemberError):
        s.sync_ready(1, 0, 3)
    with pytest.raises(StaleStepError):
        s.sync_ready(1, -1, 1)
    assert s.stats().rejected == {"unknown member": 1, "stale step": 1}
    assert s.pending_sync(1) == {}


def test_group_definition_errors() -> None:
    s, _ = make(1)
    with pytest.raises(ValueError):
        s.define_group(1, set(), step_task)
    s.define_group(1, {1}, step_task)
    with pytest.raises(ValueError):
        s.define_group(1, {2}, step_task)  # already defined
    s.drop_group(1)
    with pytest.raises(UnknownGroupError):
        s.drop_group(1)
    s.define_group(1, {2}, step_task)


def test_a_sync_task_with_a_duplicate_id_is_rejected() -> None:
    s, _ = make(1)
    s.define_group(1, {0}, lambda g, st: Task(id=1, job=0, priority=0, cost_ns=1))
    s.dispatch(Task(id=1, job=0, priority=10, cost_ns=1))
    with pytest.raises(DuplicateTaskError):
        s.sync_ready(1, 0, 0)
    assert s.stats().rejected == {"duplicate task": 1}


def test_an_overlapping_groups_sync_task_takes_no_slot_and_preempts_nothing() -> None:
    # overlap=True: the sync runs beside the running tasks (a collective that overlaps the
    # compute it serves): every slot stays as it was, and nothing is held for it
    s, clock = make(2)
    s.dispatch(Task(id=1, job=0, priority=10, cost_ns=1))
    clock.advance(1)
    s.dispatch(Task(id=2, job=0, priority=200, cost_ns=1))
    s.define_group(9, {0}, step_task, overlap=True)
    a = s.sync_ready(9, 4, 0)
    assert len(a) == 1 and isinstance(a[0], Start), a
    t = a[0].task
    assert t.is_sync and t.step == 4 and a[0].slot == NO_SLOT and t.slot == NO_SLOT
    assert sorted(x.id for x in s.running()) == [1, 2]
    assert s.stats().preemptions == 0 and s.stats().sync_releases == 1
    assert s.lookup(t.id) is None  # not held: there is nothing to complete
    assert [e.decision for e in s.explain(t.id)] == [Decision.RELEASE]
    # with a free slot too: it takes none, and the slot stays free for compute
    s2, _ = make(1)
    s2.define_group(3, {0}, step_task, overlap=True)
    (start,) = s2.sync_ready(3, 0, 0)
    assert start.slot == NO_SLOT and s2.free_slots() == 1
    # the group's steps still release once each, in order
    with pytest.raises(StaleStepError):
        s2.sync_ready(3, 0, 0)
    assert s2.sync_ready(3, 1, 0)[0].task.step == 1


def test_an_overlapping_sync_task_with_a_held_tasks_id_is_rejected() -> None:
    # an overlapping sync task is not held, but its id may still not be one a held task has
    s, _ = make(1)
    s.dispatch(Task(id=(7 << 32) | 0, job=0, priority=1, cost_ns=1))
    s.define_group(7, {0}, step_task, overlap=True)
    with pytest.raises(DuplicateTaskError):
        s.sync_ready(7, 0, 0)
    assert s.pending_sync(7) == {0: frozenset({0})}  # not released: it stays pending
