"""Task identity (origin, id), who may move a task, and the records of forwarded tasks.

Issue 7 items 5, 6 and 16: two nodes using the same task id, a task spilled on to a third
node, a record of a forwarded task that outlived the task.
"""

from __future__ import annotations

import random

import pytest

from rdmasched.scheduler import (
    Action,
    Cancel,
    Decision,
    DuplicateTaskError,
    FakeClock,
    Forward,
    InvalidTaskError,
    PeerTable,
    Preempt,
    Scheduler,
    Start,
    Task,
)


def node(me: int, peers: list[int], clock: FakeClock, nslots: int = 1) -> Scheduler:
    pt = PeerTable(clock=clock, dead_after_us=1000)
    for p in peers:
        pt.add(p, "a")
    s = Scheduler(
        nslots,
        clock=clock,
        starvation_us=10_000,
        node_id=me,
        peers=pt,
        domain="a",
        max_hops=2,
        rng=random.Random(0),
    )
    _TABLES[id(s)] = (s, pt)  # the scheduler is kept alive, so its id stays its own
    return s


_TABLES: dict[int, tuple[Scheduler, PeerTable]] = {}


def table(s: Scheduler) -> PeerTable:
    """The PeerTable `s` was built with (the compiled core does not expose it)."""
    return _TABLES[id(s)][1]


def T(tid: int, origin: int, hops: int = 0) -> Task:
    return Task(id=tid, job=0, priority=100, cost_ns=1, origin=origin, hops=hops)


def wire(t: Task) -> Task:
    """The task as the receiving node rebuilds it from a DISPATCH."""
    return Task(t.id, t.job, t.priority, t.cost_ns, t.progress_ns, t.payload, t.origin, t.hops)


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_the_same_id_from_two_origins_are_two_tasks() -> None:
    clock = FakeClock(0)
    a, b = node(0, [1], clock), node(1, [0], clock, nslots=2)
    table(a).seen(1, 0)
    assert kinds(b.submit(T(42, 1))) == ["Start"]  # b's own task 42 runs on b
    a.submit(T(40, 0))  # a is full
    fwd = a.submit(T(42, 0))
    assert isinstance(fwd[0], Forward) and fwd[0].peer == 1
    got = b.receive(wire(fwd[0].task), 0)
    assert isinstance(got[0], Start) and got[0].task.origin == 0  # not a duplicate
    assert b.get(42).origin == 1 and b.get(42, origin=0).origin == 0
    assert sorted(t.origin for t in b.find(42)) == [0, 1]
    assert b.complete(42, origin=0) == [] and b.get(42).origin == 1  # the right one ended
    a.remote_complete(1, 42)
    assert table(a).held(1) == [] and b.stats().rejected == {}


def test_a_duplicate_id_is_caught_at_the_origin() -> None:
    clock = FakeClock(0)
    a = node(0, [1], clock)
    table(a).seen(1, 0)
    a.submit(T(1, 0))
    assert isinstance(a.submit(T(42, 0))[0], Forward)
    with pytest.raises(DuplicateTaskError, match="peer 1"):
        a.submit(T(42, 0))  # still out on peer 1
    with pytest.raises(DuplicateTaskError):
        a.place_on(T(42, 0), 1)
    a.remote_complete(1, 42)
    assert isinstance(a.submit(T(42, 0))[0], Forward)  # completed: the id is free again


def test_a_refused_forward_comes_back_to_its_origin_and_is_placed_again() -> None:
    clock = FakeClock(0)
    a, b = node(0, [1], clock), node(1, [0], clock)
    table(a).seen(1, 0)
    table(b).seen(0, 5000)
    a.submit(T(1, 0))
    t = a.submit(T(7, 0))[0]
    assert isinstance(t, Forward)
    bad = wire(t.task)
    bad.priority = 255  # b refuses it (only a sync task may have 255)
    back = b.receive(bad, 0)
    assert isinstance(back[0], Forward) and back[0].peer == 0
    assert b.stats().rejected == {"invalid task": 1}
    with pytest.raises(InvalidTaskError):
        a.receive(wire(back[0].task), 1)  # the origin sees the bad task itself ...
    assert table(a).held(1) == []  # ... which is no longer held by b
    ok = wire(t.task)
    table(b).seen(0, 0)  # the origin looks idle to b now
    b.submit(T(9, 1))  # and b is full
    back = b.receive(ok, 0)
    assert kinds(back) == ["Forward"] and back[0].peer == 0  # spilled back to its origin
    assert kinds(a.receive(wire(back[0].task), 1)) == []  # queued at its origin (hops 2)
    assert table(a).held(1) == [] and a.get(7).hops == 2


def test_only_the_origin_moves_a_task_to_a_third_node() -> None:
    # A -> B -> C would leave A believing B holds it; B may only hand it back to A.
    clock = FakeClock(0)
    b = node(1, [0, 2], clock)
    table(b).seen(0, 5000)  # the origin is busier than b ...
    table(b).seen(2, 0)  # ... and node 2 is idle
    b.submit(T(1, 1))  # b is full
    assert b.submit(T(5, 0, hops=1)) == []  # queued at b, never sent to node 2
    assert b.get(5, origin=0).hops == 1
    table(b).seen(0, 0)  # the origin is idle now: back to it
    got = b.submit(T(6, 0, hops=1))
    assert isinstance(got[0], Forward) and got[0].peer == 0
    assert table(b).held_count() == 0  # b keeps no record of a task that is not its own


def test_a_task_that_came_back_and_completed_is_not_dispatched_again() -> None:
    # issue 7 item 16: forwarded to B, spilled back, run and completed on its origin; B
    # dies later: the task must not run again.
    clock = FakeClock(0)
    a, b = node(0, [1], clock), node(1, [0], clock)
    table(a).seen(1, 0)
    table(b).seen(0, 0)
    a.submit(T(1, 0))
    fwd = a.submit(T(2, 0))[0]
    assert isinstance(fwd, Forward) and table(a).held(1) == [fwd.task]
    b.submit(T(3, 1))  # b is full: it hands task 2 back
    back = b.receive(wire(fwd.task), 0)[0]
    assert isinstance(back, Forward) and back.peer == 0
    assert a.receive(wire(back.task), 1) == []  # queued behind task 1 at a
    assert table(a).held(1) == []
    started = a.complete(1)
    assert isinstance(started[0], Start) and started[0].task.id == 2
    assert a.complete(2) == []
    clock.advance_us(2000)  # b silent: dead
    assert a.check_peers() == []
    assert a.stats().redispatches == 0


def test_a_gone_peer_s_tasks_here_are_dropped_and_ours_placed_again() -> None:
    clock = FakeClock(0)
    s = node(0, [1, 2], clock, nslots=1)
    table(s).seen(1, 0)
    table(s).seen(2, 5000)
    assert kinds(s.receive(T(10, 1), 1)) == ["Start"]  # node 1's task runs here
    assert kinds(s.receive(T(11, 1, hops=2), 1)) == []  # and one waits
    mine = s.submit(T(12, 0))[0]
    assert isinstance(mine, Forward) and mine.peer == 1
    acts = s.peer_gone(1)
    by_kind = {type(a).__name__: a for a in acts}
    assert isinstance(by_kind["Cancel"], Cancel) and by_kind["Cancel"].task.id == 11
    pre = by_kind["Preempt"]
    assert isinstance(pre, Preempt) and pre.victim.id == 10 and pre.cancel
    st = by_kind["Start"]
    assert isinstance(st, Start) and st.task.id == 12  # ours, placed again, here
    assert s.yielded(10, 0, origin=1) == []  # dropped once it stopped
    assert s.stats().drops == 2 and s.stats().redispatches == 1
    assert [e.decision for e in s.explain(12)][-2:] == [Decision.REDISPATCH, Decision.START]
    assert table(s).is_dead(1) and 1 not in table(s).loads()


def test_drop_origin_none_drops_every_foreign_task() -> None:
    clock = FakeClock(0)
    s = node(0, [1, 2], clock, nslots=2)
    s.receive(T(1, 1), 1)
    s.submit(T(1, 0))
    s.receive(T(1, 2, hops=2), 2)  # queued
    acts = s.drop_origin(None)
    assert sorted(kinds(acts)) == ["Cancel", "Preempt"]
    assert [t.origin for t in s.find(1)] == [0, 1]  # 1's is being cancelled
    s.yielded(1, 0, origin=1)
    assert [t.origin for t in s.find(1)] == [0]


def test_after_a_rejoin_only_what_a_peer_held_before_is_placed_again() -> None:
    # The origin rejoined (a new incarnation): peer 1 drops the tasks it held for the old
    # one, and acknowledges; a task forwarded to peer 1 after the rejoin must stay there.
    clock = FakeClock(0)
    s = node(0, [1, 2], clock)
    table(s).seen(1, 0)
    s.submit(T(1, 0))
    old = s.submit(T(2, 0))[0]
    assert isinstance(old, Forward) and old.peer == 1
    table(s).mark_stale()  # the rejoin
    new = s.submit(T(3, 0))[0]
    assert isinstance(new, Forward) and new.peer == 1
    table(s).seen(1, 5000)
    table(s).seen(2, 0)
    again = s.replace_held(1, "peer 1 dropped it")
    assert kinds(again) == ["Forward"]  # task 2 placed again, on node 2 ...
    assert [t.id for t in table(s).held(1)] == [3]  # ... task 3 stays where it is
    assert [t.id for t in table(s).held(2)] == [2]
    assert s.stats().redispatches == 1 and s.replace_held(1, "again") == []


def test_lookup_is_get_without_the_exception() -> None:
    clock = FakeClock(0)
    s = node(3, [1], clock, nslots=2)
    s.receive(T(8, 1), 1)
    assert s.lookup(8) is None and s.lookup(8, origin=1) is s.get(8, origin=1)
