"""submit(), power-of-two choices, spill-back and dead peers."""

from __future__ import annotations

import random
from typing import TypeVar

import pytest

from rdmasched.scheduler import (
    Action,
    Decision,
    FakeClock,
    Forward,
    PeerTable,
    Scheduler,
    Start,
    Task,
    TaskState,
)
from rdmasched.scheduler.errors import UnknownTaskError
from rdmasched.scheduler.placement import can_spill, choose_peer

A = TypeVar("A", Start, Forward)


def first(actions: list[Action], kind: type[A]) -> A:
    """The first action, checked to be a ``kind``."""
    a = actions[0]
    assert isinstance(a, kind), a
    return a


def T(tid: int, prio: int = 100, hops: int = 0) -> Task:
    return Task(id=tid, job=0, priority=prio, cost_ns=1, hops=hops)


# --- choose_peer ------------------------------------------------------------------------


def test_choose_peer_picks_the_lighter_of_two() -> None:
    loads = {1: 900, 2: 100}
    doms = {1: "r1", 2: "r1"}
    for seed in range(20):
        assert choose_peer(loads, doms, "r1", random.Random(seed)) == 2


def test_choose_peer_is_two_random_choices_not_the_global_minimum() -> None:
    loads = {p: p for p in range(1, 11)}  # peer 1 is the lightest
    doms = dict.fromkeys(loads, "r")
    picks = {choose_peer(loads, doms, "r", random.Random(seed)) for seed in range(200)}
    assert 1 in picks and len(picks) > 3  # spreads load; never the heaviest
    assert 10 not in picks


def test_choose_peer_prefers_the_same_domain() -> None:
    loads = {1: 800, 2: 0, 3: 700}
    doms = {1: "a", 2: "b", 3: "a"}
    for seed in range(20):
        assert choose_peer(loads, doms, "a", random.Random(seed)) == 3
    # unless no peer of the domain is under the bound
    for seed in range(20):
        assert choose_peer(loads, doms, "a", random.Random(seed), max_load=500) == 2


def test_choose_peer_excludes_self_and_dead_and_may_find_none() -> None:
    loads = {0: 0, 1: 10, 2: 20}
    doms = dict.fromkeys(loads, "a")
    r = random.Random(1)
    assert choose_peer(loads, doms, "a", r, self_id=0, dead={1}) == 2
    assert choose_peer(loads, doms, "a", r, self_id=0, dead={1, 2}) is None
    assert choose_peer({}, {}, "a", r) is None
    assert choose_peer(loads, doms, "a", r, max_load=0) is None


def test_spill_is_bounded_by_max_hops() -> None:
    assert can_spill(0, 2) and can_spill(1, 2)
    assert not can_spill(2, 2) and not can_spill(0, 0)


# --- PeerTable --------------------------------------------------------------------------


def test_peer_table_tracks_liveness_and_loads() -> None:
    clock = FakeClock(0)
    pt = PeerTable(clock=clock, dead_after_us=100)
    pt.add(1, "a")
    pt.add(2, "b")
    assert pt.loads() == {}  # no hint heard yet
    pt.seen(1, 300)
    pt.seen(2, 100)
    assert pt.loads() == {1: 300, 2: 100} and pt.domains == {1: "a", 2: "b"}
    clock.advance_us(60)
    pt.seen(1, 350)
    clock.advance_us(41)  # 2 silent for 101 us: dead; 1 heard 41 us ago
    assert pt.dead() == [2] and pt.alive() == [1]
    assert pt.loads() == {1: 350}
    pt.seen(2, 5)  # it came back (a restarted daemon)
    assert pt.alive() == [1, 2]


def test_peer_table_returns_held_tasks_once_when_a_peer_dies() -> None:
    clock = FakeClock(0)
    pt = PeerTable(clock=clock, dead_after_us=100)
    pt.seen(1, 0)
    pt.seen(2, 0)
    a, b, c = T(10), T(11), T(12)
    pt.hold(1, a)
    pt.hold(1, b)
    pt.hold(2, c)
    assert pt.release(1, 11) is b
    assert pt.release(1, 11) is None
    assert pt.reap() == []
    clock.advance_us(101)
    pt.seen(2, 0)
    assert pt.reap() == [(1, [a])]
    assert pt.reap() == []  # reported once
    assert pt.held(2) == [c]


# --- Scheduler.submit -------------------------------------------------------------------


def cluster(nslots: int = 1) -> tuple[Scheduler, PeerTable, FakeClock]:
    clock = FakeClock(0)
    pt = PeerTable(clock=clock, dead_after_us=1000)
    pt.add(1, "a")
    pt.add(2, "a")
    pt.add(3, "b")
    s = Scheduler(
        nslots,
        clock=clock,
        starvation_us=1000,
        node_id=0,
        peers=pt,
        domain="a",
        max_hops=2,
        rng=random.Random(0),
    )
    return s, pt, clock


def test_submit_runs_locally_when_there_is_room() -> None:
    s, pt, _ = cluster()
    pt.seen(1, 0)
    a = s.submit(T(1))
    assert isinstance(a[0], Start) and a[0].task.hops == 0


def test_submit_forwards_to_a_lighter_peer_when_full() -> None:
    s, pt, _ = cluster()
    pt.seen(1, 900)
    pt.seen(2, 100)
    pt.seen(3, 0)  # lighter, but another domain
    s.submit(T(1))
    a = s.submit(T(2))
    fwd = first(a, Forward)
    assert a == [Forward(fwd.task, 2)]
    assert fwd.task.hops == 1 and fwd.task.state is TaskState.FORWARDED
    assert pt.held(2) == [fwd.task]
    ev = s.events()[-1]
    assert ev.decision is Decision.FORWARD and ev.task_id == 2
    with pytest.raises(UnknownTaskError):
        s.get(2)  # no longer ours to run


def test_submit_keeps_the_task_when_no_peer_is_lighter() -> None:
    s, pt, _ = cluster()
    for p in (1, 2, 3):
        pt.seen(p, 5000)
    s.submit(T(1))
    assert s.submit(T(2)) == []  # queued here: own load would be 2000
    assert [t.id for t in s.queued()] == [2]


def test_spill_back_stops_at_max_hops() -> None:
    s, pt, _ = cluster()
    pt.seen(1, 0)
    pt.seen(2, 0)
    s.submit(T(1))
    assert isinstance(s.submit(T(2, hops=1))[0], Forward)
    assert s.submit(T(3, hops=2)) == []  # at the bound: it stays, queued
    assert s.get(3).state is TaskState.QUEUED


def test_a_dead_peers_tasks_are_dispatched_again() -> None:
    s, pt, clock = cluster()
    pt.seen(1, 0)
    s.submit(T(1))  # runs here
    fwd = s.submit(T(2))
    assert first(fwd, Forward).peer == 1
    clock.advance_us(500)
    assert s.check_peers() == []  # nobody is dead yet
    clock.advance_us(501)  # peer 1 silent for 1001 us
    s.complete(1)  # our slot is free now
    a = s.check_peers()
    assert a == [Start(first(a, Start).task, 0)] and first(a, Start).task.id == 2
    assert [e.decision for e in s.explain(2)][-2:] == [
        Decision.REDISPATCH,
        Decision.START,
    ]
    assert s.stats().redispatches == 1


def test_remote_complete_releases_a_forwarded_task() -> None:
    s, pt, _ = cluster()
    pt.seen(1, 0)
    s.submit(T(1))
    s.submit(T(2))
    s.remote_complete(1, 2)
    assert pt.held(1) == []
    assert s.explain(2)[-1].decision is Decision.COMPLETE
    with pytest.raises(UnknownTaskError):
        s.remote_complete(1, 2)


def test_remote_complete_from_the_node_a_peer_spilled_to() -> None:
    # Forwarded to peer 1, which spilled it on to peer 2: peer 2 reports the completion.
    s, pt, _ = cluster()
    pt.seen(1, 0)
    s.submit(T(1))
    s.submit(T(2))
    assert [t.id for t in pt.held(1)] == [2]
    s.remote_complete(2, 2)
    assert pt.held(1) == []
    assert s.explain(2)[-1].decision is Decision.COMPLETE


def test_submit_without_a_peer_table_is_a_local_dispatch() -> None:
    s = Scheduler(1, clock=FakeClock(0), starvation_us=10)
    s.submit(T(1))
    assert s.submit(T(2)) == []
    assert [t.id for t in s.queued()] == [2]
