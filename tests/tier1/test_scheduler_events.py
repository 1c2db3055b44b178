"""The decision log: a bounded ring, explain(), JSON-lines export."""

from __future__ import annotations

import json

from rdmasched.scheduler import Decision, Event, FakeClock, Scheduler, Task
from rdmasched.scheduler.events import from_dict, to_jsonl


def T(tid: int, prio: int = 100) -> Task:
    return Task(id=tid, job=0, priority=prio, cost_ns=1)


def test_ring_is_bounded_and_keeps_the_newest() -> None:
    clock = FakeClock(0)
    s = Scheduler(1, clock=clock, starvation_us=10, events=4)
    for i in range(1, 7):
        clock.advance(1)
        s.dispatch(T(i))
    evs = s.events()
    assert len(evs) == 4
    assert [e.task_id for e in evs] == [3, 4, 5, 6]
    assert [e.t_ns for e in evs] == [3, 4, 5, 6]
    st = s.stats()
    assert st.events_recorded == 6 and st.events_dropped == 2


def test_explain_names_the_task_as_subject_or_beaten() -> None:
    clock = FakeClock(0)
    s = Scheduler(1, clock=clock, starvation_us=10_000)
    s.dispatch(T(1, 10))
    clock.advance(5)
    s.dispatch(T(2, 50))  # preempts 1
    s.yielded(1, 3)
    ex = s.explain(1)
    assert [(e.decision, e.task_id) for e in ex] == [
        (Decision.START, 1),
        (Decision.PREEMPT, 1),
        (Decision.START, 2),  # 2 started by beating 1
        (Decision.REQUEUE, 1),
    ]
    assert ex[2].beaten == (1,) and "outranks" in ex[2].reason
    assert all(isinstance(e, Event) for e in ex)
    assert s.explain(12345) == []


def test_events_export_as_json_lines() -> None:
    clock = FakeClock(0)
    s = Scheduler(1, clock=clock, starvation_us=10)
    s.dispatch(T(1, 10))
    s.dispatch(T(2, 50))
    lines = list(s.events_jsonl())
    assert len(lines) == 3
    dicts = [json.loads(x) for x in lines]
    assert dicts[-1] == {
        "t_ns": 0,
        "decision": "start",
        "task_id": 2,
        "reason": dicts[-1]["reason"],
        "beaten": [1],
    }
    assert [from_dict(d) for d in dicts] == s.events()
    assert list(to_jsonl(s.events())) == lines
