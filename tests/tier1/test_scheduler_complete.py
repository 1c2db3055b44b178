"""COMPLETE of a task queued after it yielded (issue 20 item 2; docs/SCHEDULER.md, "Preemption").

A preempt handler that yields while its work goes on (the PyTorch integration's compute
task: a step cannot stop midway) has its task requeued; when the work then finishes, its
COMPLETE ends the task: dropped from the queue, recorded with its own rule, never started
again. A COMPLETE of a queued task that never ran is still refused.
"""

from __future__ import annotations

import pytest

from rdmasched.scheduler import Decision, FakeClock, Scheduler, Start, Task, TaskState
from rdmasched.scheduler.errors import TaskStateError, UnknownTaskError
from rdmasched.scheduler.events import RULE_TEXT, Rule


def make(nslots: int) -> Scheduler:
    return Scheduler(nslots, clock=FakeClock(1_000_000), starvation_us=1000)


def T(tid: int, prio: int) -> Task:
    return Task(id=tid, job=0, priority=prio, cost_ns=1000)


def test_complete_of_a_task_queued_after_its_yield_ends_it() -> None:
    s = make(1)
    s.dispatch(T(1, 10))
    s.dispatch(T(2, 20))  # preempts 1
    assert s.yielded(1, 500) == []  # requeued: 2 holds the slot
    task = s.get(1)
    assert task.state is TaskState.QUEUED
    assert s.complete(1) == []  # its work finished after the yield: done, no slot to free
    assert task.state is TaskState.DONE
    assert s.queued() == [] and s.stats().queue_len == 0
    ev = s.explain(1)[-1]
    assert ev.decision is Decision.COMPLETE and ev.rule == "done_queued"
    assert ev.reason == RULE_TEXT[Rule.DONE_QUEUED]
    # the slot 2 frees goes to no one: task 1 is not started again
    assert s.complete(2) == []
    assert s.stats().free_slots == 1 and s.stats().completions == 2
    assert s.stats().rejected == {}
    with pytest.raises(UnknownTaskError):
        s.complete(1)


def test_a_task_requeued_again_after_it_restarted_can_still_complete_while_queued() -> None:
    s = make(1)
    s.dispatch(T(1, 10))
    s.dispatch(T(2, 20))
    s.yielded(1, 0)
    (start,) = s.complete(2)  # 1 takes its slot back
    assert isinstance(start, Start) and start.task.id == 1
    s.dispatch(T(3, 30))  # preempts it again
    s.yielded(1, 0)
    assert s.complete(1) == []
    assert [t.id for t in s.running()] == [3] and s.queued() == []


def test_complete_of_a_queued_task_that_never_ran_is_still_refused() -> None:
    s = make(1)
    s.dispatch(T(1, 10))
    s.dispatch(T(2, 5))  # queued behind 1: it never started
    with pytest.raises(TaskStateError, match="queued"):
        s.complete(2)
    # nor does a task that finished and whose id came back count as having yielded
    s.dispatch(T(3, 20))  # preempts 1
    s.yielded(1, 0)
    s.complete(1)
    s.dispatch(T(1, 1))  # the id again, a new task: queued, never ran
    with pytest.raises(TaskStateError, match="queued"):
        s.complete(1)
    assert s.stats().rejected == {"bad state": 2}
