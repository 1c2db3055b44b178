"""The decision log: a bounded ring, explain(), JSON-lines export."""

from __future__ import annotations

import json
import random

import pytest

from rdmasched.scheduler import (
    Decision,
    Event,
    FakeClock,
    Forward,
    PeerTable,
    Preempt,
    Scheduler,
    Start,
    Task,
    UnknownTaskError,
)
from rdmasched.scheduler.events import CAUSE_KIND, RULE_TEXT, Rule, from_dict, to_jsonl


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
        "seq": 2,
        "node": 0,
        "rule": "outranks",
        "slot": 0,
        "origin": 0,
        "job": 0,
        "priority": 50,
        "n_beaten": 1,
        "beaten_origin": 0,
        "wait_ns": 0,
        "queued": 0,
        "running": 1,
    }
    assert [from_dict(d) for d in dicts] == s.events()
    assert list(to_jsonl(s.events())) == lines


# --- complete decision events (issue 11 item 1) -------------------------------------------


def test_a_start_from_the_queue_records_every_field() -> None:
    clock = FakeClock(1000)
    s = Scheduler(2, clock=clock, starvation_us=1_000_000, node_id=7)
    s.dispatch(Task(id=1, job=11, priority=10, cost_ns=1, origin=7))
    s.dispatch(Task(id=2, job=11, priority=10, cost_ns=1, origin=7))
    clock.advance(100)
    s.dispatch(Task(id=3, job=12, priority=10, cost_ns=1, origin=4))  # queued
    clock.advance(50)
    s.dispatch(Task(id=4, job=12, priority=5, cost_ns=1, origin=7))  # queued, behind 3
    s.dispatch(Task(id=5, job=12, priority=5, cost_ns=1, origin=7))  # queued, behind 4
    clock.advance(250)
    s.cause(CAUSE_KIND["COMPLETE"], 9, 42, 1234)  # the message being handled
    s.complete(2)
    ev = s.events()[-1]
    assert ev.decision is Decision.START and ev.task_id == 3
    assert (ev.node, ev.slot, ev.origin, ev.job, ev.priority) == (7, 1, 4, 12, 10)
    assert ev.rule == "head" and ev.reason == RULE_TEXT[Rule.HEAD]
    assert ev.beaten == (4,) and ev.beaten_origin == 7 and ev.n_beaten == 2
    assert ev.wait_ns == 300  # queued at 1100, started at 1400
    assert (ev.cause, ev.cause_src, ev.cause_seq, ev.cause_sent_ns) == ("COMPLETE", 9, 42, 1234)
    assert (ev.queued, ev.running) == (2, 2)
    done = s.events()[-2]
    assert done.decision is Decision.COMPLETE and done.task_id == 2 and done.slot == 1
    s.cause(0, 0, 0, 0)  # a local call: no message caused it
    s.complete(1)
    assert s.events()[-1].cause is None and s.events()[-1].task_id == 4


def test_preemption_records_the_victim_and_the_slot() -> None:
    clock = FakeClock(0)
    s = Scheduler(1, clock=clock, starvation_us=1_000_000)
    s.dispatch(Task(id=1, job=0, priority=10, cost_ns=1))
    acts = s.dispatch(Task(id=2, job=0, priority=90, cost_ns=1))
    assert isinstance(acts[0], Preempt)
    pre, start = s.events()[-2:]
    assert (pre.decision, pre.task_id, pre.rule, pre.slot) == (Decision.PREEMPT, 1, "victim", 0)
    assert (start.rule, start.beaten, start.n_beaten, start.slot) == ("outranks", (1,), 1, 0)


def test_sync_tasks_record_their_group_and_step() -> None:
    clock = FakeClock(0)
    s = Scheduler(1, clock=clock, starvation_us=1_000_000)
    s.define_group(5, [0, 1], lambda g, step: Task(id=1000 + step, job=g, priority=0, cost_ns=1))
    s.sync_ready(5, 3, 0)
    acts = s.sync_ready(5, 3, 1)
    assert isinstance(acts[0], Start)
    rel, start = s.events()[-2:]
    assert rel.decision is Decision.RELEASE and rel.reason == "group 5 step 3 complete"
    assert (rel.group, rel.step, start.group, start.step) == (5, 3, 5, 3)
    assert start.priority == 255


def test_a_forward_records_the_peer_that_lost_the_power_of_two_choice() -> None:
    clock = FakeClock(0)
    pt = PeerTable(clock=clock, dead_after_us=1000)
    for p in (1, 2, 3):
        pt.add(p, "a")
    s = Scheduler(
        1, clock=clock, starvation_us=1000, node_id=0, peers=pt, domain="a", rng=random.Random(1)
    )
    pt.seen(1, 900)
    pt.seen(2, 100)
    pt.seen(3, 300)
    s.submit(Task(id=1, job=0, priority=10, cost_ns=1))
    acts = s.submit(Task(id=2, job=0, priority=10, cost_ns=1))
    assert isinstance(acts[0], Forward)
    ev = s.events()[-1]
    loads = {1: 900, 2: 100, 3: 300}
    assert ev.decision is Decision.FORWARD and ev.rule == "lighter_peer"
    assert ev.peer == acts[0].peer and ev.lost_peer in loads and ev.lost_peer != ev.peer
    assert (ev.peer_load, ev.lost_load) == (loads[ev.peer], loads[ev.lost_peer])
    assert ev.peer_load <= ev.lost_load and ev.my_load == 2000
    assert ev.reason == f"to peer {ev.peer}: load {ev.peer_load} < 2000"


def test_a_wrapped_ring_counts_and_reports_what_it_lost() -> None:
    clock = FakeClock(0)
    s = Scheduler(1, clock=clock, starvation_us=10, events=3)
    for i in range(1, 6):
        s.dispatch(T(i))  # start, then four queues
    assert [e.seq for e in s.events()] == [2, 3, 4]
    got, missed = s.events_since(0)
    assert [e.seq for e in got] == [2, 3, 4] and missed == 2
    got, missed = s.events_since(4)
    assert [e.seq for e in got] == [4] and missed == 0
    assert s.events_since(5) == ([], 0)
    st = s.stats()
    assert (st.events_recorded, st.events_dropped) == (5, 2)


def test_texts_of_rejections_are_kept_while_their_event_is_in_the_ring() -> None:
    clock = FakeClock(0)
    s = Scheduler(1, clock=clock, starvation_us=10, events=2)
    for i in range(5):
        with pytest.raises(UnknownTaskError):
            s.complete(100 + i)
    evs = s.events()
    assert [e.task_id for e in evs] == [103, 104]
    assert all(e.decision is Decision.REJECT and e.reason.startswith("unknown task") for e in evs)
    s.dispatch(T(1))
    s.dispatch(T(2))  # the rejections' slots now hold a start and a queue: their own reasons
    assert [e.reason for e in s.events()] == [RULE_TEXT[Rule.FREE_SLOT], RULE_TEXT[Rule.NO_SLOT]]


def test_events_off_records_nothing_and_decides_the_same() -> None:
    runs = []
    for n in (0, 64):
        clock = FakeClock(0)
        s = Scheduler(2, clock=clock, starvation_us=10, events=n)
        acts = []
        for i in range(1, 20):
            clock.advance(3)
            acts.append([type(a).__name__ for a in s.dispatch(T(i, 10 * (i % 4)))])
            if i % 3 == 0:
                running = s.running()
                acts.append([type(a).__name__ for a in s.complete(running[0].id)])
        runs.append((acts, s.stats().starts, s.stats().queued))
        if n == 0:
            assert s.events() == [] and s.stats().events_recorded == 0
    assert runs[0] == runs[1]


def test_old_traces_without_the_new_fields_still_read() -> None:
    d = {"t_ns": 5, "decision": "start", "task_id": 3, "reason": "free slot", "beaten": []}
    ev = from_dict(d)
    assert ev.slot is None and ev.rule is None and ev.as_dict() == d


def test_a_task_taken_in_again_is_recorded_with_its_new_fields() -> None:
    # the ring copies a task's fields when the scheduler takes it in (Task.tel_*): a Task
    # object used again (as the benchmark's pool does) is recorded with its new id and
    # priority, a job that is not a u64 as absent, an origin past 2**32 as it is
    clock = FakeClock(0)
    s = Scheduler(1, clock=clock, starvation_us=10_000)
    t = Task(id=7, job=3, priority=10, cost_ns=1)
    s.dispatch(t)
    s.complete(7)
    t.id, t.priority, t.job = 8, 20, -1
    s.dispatch(t)
    big = Task(id=9, job=1 << 64, priority=30, cost_ns=1, origin=(1 << 40) + 5)
    s.dispatch(big)  # outranks 8: preempts it
    evs = s.events()
    assert [(e.decision, e.task_id, e.priority, e.job) for e in evs] == [
        (Decision.START, 7, 10, 3),
        (Decision.COMPLETE, 7, 10, 3),
        (Decision.START, 8, 20, None),
        (Decision.PREEMPT, 8, 20, None),
        (Decision.START, 9, 30, None),
    ]
    assert evs[-1].origin == (1 << 40) + 5
    assert (evs[-1].beaten, evs[-1].beaten_origin) == ((8,), 0)


def test_the_cause_keeps_the_low_bits_of_the_source_and_sequence_number() -> None:
    # cause() packs kind, src (24 bits) and seq (32 bits) into one word and keeps the send
    # time, a u64 (compiled, all in C: no int is made per message)
    s = Scheduler(1, clock=FakeClock(0), starvation_us=1_000_000)
    s.cause(CAUSE_KIND["PREEMPT"], (1 << 24) + 9, (1 << 32) + 42, (1 << 64) - 1)
    s.dispatch(T(1))
    ev = s.events()[-1]
    assert (ev.cause, ev.cause_src, ev.cause_seq) == ("PREEMPT", 9, 42)
    assert ev.cause_sent_ns == (1 << 64) - 1


def test_a_placement_with_no_loser_records_none_for_it() -> None:
    s = Scheduler(1, clock=FakeClock(0), starvation_us=1_000_000)
    s.place_on(T(1), 5)
    ev = s.events()[-1]
    assert (ev.decision, ev.peer, ev.lost_peer) == (Decision.FORWARD, 5, None)
    assert (ev.peer_load, ev.lost_load, ev.my_load) == (0, None, 0)
