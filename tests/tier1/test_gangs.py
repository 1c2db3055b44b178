"""Gangs (docs/GANGS.md, docs/PROTOCOL.md section 12): a job's tasks placed all or nothing
across nodes, on the sans-IO node cores of tests/corenet.py (every message through the real
codec), the compiled core and the same file run as plain Python."""

from __future__ import annotations

from types import ModuleType

import pytest

from rdmasched import messages as msg
from rdmasched._wire import MessageError
from rdmasched.daemon import core as compiled_core
from rdmasched.scheduler import Task, gang
from rdmasched.scheduler.gang import (
    GANG_INCOMPLETE,
    GANG_TOO_LARGE,
    GANG_WAITING,
    GangError,
    Phase,
    wait_reason,
)
from rdmasched.scheduler.reasons import Code
from tests.codec import through_codec
from tests.corenet import DEAD_AFTER_NS, HEARTBEAT_NS, MS, Cluster
from tests.tier1.test_node_core_compiled import _pure_core


@pytest.fixture(params=["loaded", "python"])
def core(request: pytest.FixtureRequest) -> ModuleType:
    """The node core as imported (compiled where built), and daemon/core.py run as plain
    Python."""
    return compiled_core if request.param == "loaded" else _pure_core()


def member(i: int, node: int, job: int, priority: int = 10) -> Task:
    return Task(i, job, priority, 50 * MS, origin=node)


def declare(c: Cluster, node: int, job: int, ids: range | list[int], size: int) -> None:
    """Submit members `ids` of gang `job` of `size` on `node`, deliver what follows."""
    for i in ids:
        c.do(node, c.cores[node].submit(member(i, node, job), c.now, size))
    c.deliver()


def starts(c: Cluster, origin: int, ids: range | list[int]) -> dict[int, list[int]]:
    """Member id -> the nodes it was started on (from what the handlers saw)."""
    got: dict[int, list[int]] = {i: [] for i in ids}
    for n in c.cores:
        for _, o, tid, _slot in c.of(n, "start"):
            if o == origin and tid in got:
                got[tid].append(n)
    return got


def held_anywhere(c: Cluster) -> int:
    """Slots held (reserved, nothing started) on every node, for others' gangs or own."""
    own = sum(len(g.local) for x in c.cores.values() for g in x.gangs.gangs.values())
    return own + sum(len(x.gangs.holds) for x in c.cores.values())


def free(c: Cluster) -> dict[int, int]:
    return {n: x.scheduler.free_slots() for n, x in c.cores.items()}


def complete_all(c: Cluster, origin: int, ids: range | list[int]) -> None:
    """Every member of `ids` (of `origin`) running somewhere completes there."""
    for n, x in c.cores.items():
        for t in x.scheduler.running():
            if t.origin == origin and t.id in ids:
                c.do(n, x.complete(t.id, origin, 1, c.now))
    c.deliver()


def test_partial_gang_holds_no_slot(core: ModuleType) -> None:
    c = Cluster(3, slots=2, core=core)
    c.advance(3 * HEARTBEAT_NS)  # load hints known
    declare(c, 0, 7, [1, 2], 4)
    g = c.cores[0].gangs
    assert wait_reason(g, 1) == wait_reason(g, 2) == GANG_INCOMPLETE
    assert starts(c, 0, [1, 2]) == {1: [], 2: []}
    assert held_anywhere(c) == 0 and free(c) == {0: 2, 1: 2, 2: 2}
    assert c.cores[0].scheduler.queued() == []  # not queued either: it waits in its gang
    # an ordinary task takes a slot at once, the partial gang in the way of nothing
    c.do(0, c.cores[0].dispatch(Task(50, 1, 10, MS, origin=0), c.now))
    assert ("start", 0, 50, 1) in c.seen[0] or ("start", 0, 50, 0) in c.seen[0]
    c.advance(10 * HEARTBEAT_NS)
    assert held_anywhere(c) == 0 and wait_reason(g, 1) == GANG_INCOMPLETE
    declare(c, 0, 7, [3, 4], 4)  # complete: placed, every member once
    got = starts(c, 0, [1, 2, 3, 4])
    assert all(len(v) == 1 for v in got.values()), got
    assert wait_reason(g, 1) is None and g.gangs[7].phase is Phase.RUNNING
    assert held_anywhere(c) == 0
    assert sum(free(c).values()) == 6 - 5


def test_gang_larger_than_the_cluster_waits(core: ModuleType) -> None:
    c = Cluster(2, slots=2, core=core)
    c.advance(3 * HEARTBEAT_NS)
    declare(c, 0, 9, range(1, 6), 5)
    g = c.cores[0].gangs
    assert all(wait_reason(g, i) == GANG_TOO_LARGE for i in range(1, 6))
    c.advance(20 * HEARTBEAT_NS)
    assert starts(c, 0, range(1, 6)) == {i: [] for i in range(1, 6)}
    assert held_anywhere(c) == 0 and free(c) == {0: 2, 1: 2}
    assert c.sent[0, 1, msg.Dispatch(0, 0).encode()[0]] == 0  # no reservation ever sent
    assert wait_reason(g, 1, origin=1) is None  # known on its coordinator only
    # the rest of the cluster runs as before
    c.do(1, c.cores[1].submit(Task(60, 2, 10, MS, origin=1), c.now))
    assert ("start", 1, 60, 1) in c.seen[1] or ("start", 1, 60, 0) in c.seen[1]


def test_gang_waits_for_capacity_then_runs(core: ModuleType) -> None:
    c = Cluster(2, slots=2, core=core)
    for n in (0, 1):
        c.do(n, c.cores[n].dispatch(Task(80 + n, 3, 10, MS, origin=n), c.now))
    c.advance(3 * HEARTBEAT_NS)
    declare(c, 0, 4, [1, 2, 3], 3)
    g = c.cores[0].gangs
    c.advance(10 * HEARTBEAT_NS)
    assert wait_reason(g, 1) == GANG_WAITING
    assert starts(c, 0, [1, 2, 3]) == {1: [], 2: [], 3: []}
    assert held_anywhere(c) == 0
    c.do(1, c.cores[1].complete(81, 1, 1, c.now))  # node 1's slot frees: now it fits
    c.advance(10 * HEARTBEAT_NS)
    got = starts(c, 0, [1, 2, 3])
    assert all(len(v) == 1 for v in got.values()), got
    assert wait_reason(g, 1) is None
    complete_all(c, 0, [1, 2, 3])
    assert 4 not in g.gangs and g.n["finished"] == 1


@pytest.mark.parametrize("seed_offset", [0, 1, 2])
def test_competing_gangs_never_deadlock(core: ModuleType, seed_offset: int) -> None:
    """Two gangs of 3 on 4 slots: each fits alone, not both. Declared at once on two
    nodes, their first reservations refuse each other; one is placed after the back-off,
    the other waits holding nothing, and runs once the first is done."""
    c = Cluster(2, slots=2, core=core)
    c.advance(3 * HEARTBEAT_NS)
    for n in (0, 1):
        c.cores[n].gangs.rng.seed(seed_offset * 10 + n)
    for n in (0, 1):  # both declared before either's messages arrive
        for i in (1, 2, 3):
            c.do(n, c.cores[n].submit(member(i, n, 5), c.now, 3))
    c.deliver()
    # the first attempts collided: each refused the other, both aborted, nothing is held
    assert [c.cores[n].gangs.n["attempts_failed"] for n in (0, 1)] == [1, 1]
    assert held_anywhere(c) == 0 and free(c) == {0: 2, 1: 2}
    for _ in range(200):
        c.advance(HEARTBEAT_NS)
        running = [
            n
            for n in (0, 1)
            if 5 in c.cores[n].gangs.gangs and c.cores[n].gangs.gangs[5].phase is Phase.RUNNING
        ]
        if running:
            break
    assert len(running) == 1, "neither gang was placed: deadlock or livelock"
    winner, loser = running[0], 1 - running[0]
    got = starts(c, winner, [1, 2, 3])
    assert all(len(v) == 1 for v in got.values()), got
    assert starts(c, loser, [1, 2, 3]) == {1: [], 2: [], 3: []}
    c.advance(10 * HEARTBEAT_NS)
    assert wait_reason(c.cores[loser].gangs, 1) == GANG_WAITING
    assert held_anywhere(c) == 0  # the waiting gang holds nothing
    assert sum(free(c).values()) == 1
    complete_all(c, winner, [1, 2, 3])
    c.advance(20 * HEARTBEAT_NS)
    got = starts(c, loser, [1, 2, 3])
    assert all(len(v) == 1 for v in got.values()), got
    complete_all(c, loser, [1, 2, 3])
    assert all(not x.gangs.gangs for x in c.cores.values())
    assert held_anywhere(c) == 0 and free(c) == {0: 2, 1: 2}


def test_node_dies_under_a_placed_gang_it_is_placed_again_whole(core: ModuleType) -> None:
    c = Cluster(3, slots=2, core=core)
    c.advance(3 * HEARTBEAT_NS)
    declare(c, 0, 6, [1, 2, 3, 4], 4)
    first = starts(c, 0, [1, 2, 3, 4])
    assert all(len(v) == 1 for v in first.values()), first
    peers = sorted({v[0] for v in first.values()} - {0})
    assert peers, first
    dead = peers[0]
    survivors = [n for n in c.cores if n != dead]
    c.down.add(dead)
    c.advance(DEAD_AFTER_NS + 10 * HEARTBEAT_NS)
    g = c.cores[0].gangs
    gang = g.gangs[6]
    assert gang.restarts == 1 and gang.phase is Phase.RUNNING
    # every member that ran on a live node was stopped (cancelled) before the new start
    for i, (n,) in first.items():
        if n != dead:
            assert ("preempt", 0, i) in [s[:3] for s in c.of(n, "preempt")], (i, n)
            assert any(s[3] for s in c.of(n, "preempt") if s[2] == i)  # with cancel
    again = starts(c, 0, [1, 2, 3, 4])
    for nodes in again.values():
        assert len(nodes) == 2 and nodes[1] in survivors, again
    running = [
        (n, t.id) for n in survivors for t in c.cores[n].scheduler.running() if t.origin == 0
    ]
    assert sorted(i for _, i in running) == [1, 2, 3, 4]
    # it says so: the redispatch events name the lost node
    texts = [e.reason for e in c.cores[0].scheduler.explain(1)]
    assert any(f"node {dead} died under gang 6" in t and "placed again" in t for t in texts)
    assert held_anywhere(c) == 0


def test_gang_fails_past_its_restarts_and_says_so(core: ModuleType) -> None:
    c = Cluster(3, slots=2, core=core)
    c.cores[0].gangs.max_restarts = 0
    c.advance(3 * HEARTBEAT_NS)
    declare(c, 0, 8, [1, 2, 3], 3)
    first = starts(c, 0, [1, 2, 3])
    dead = next(v[0] for v in first.values() if v[0] != 0)
    c.down.add(dead)
    c.advance(DEAD_AFTER_NS + 10 * HEARTBEAT_NS)
    g = c.cores[0].gangs
    assert 8 not in g.gangs and "failed" in g.failed[8] and f"node {dead}" in g.failed[8]
    assert g.stats()["failed"] == 1
    assert all(
        not [t for t in c.cores[n].scheduler.running() if t.origin == 0]
        for n in c.cores
        if n != dead
    )
    texts = [e.reason for e in c.cores[0].scheduler.explain(1)]
    assert any("gang 8 failed" in t for t in texts)
    assert wait_reason(g, 1) is None


def test_hold_expires_when_the_coordinator_dies(core: ModuleType) -> None:
    """A reservation held for a coordinator that dies before it commits is given back."""
    c = Cluster(2, slots=2, core=core)
    c.advance(3 * HEARTBEAT_NS)
    c.do(0, c.cores[0].dispatch(Task(90, 1, 10, MS, origin=0), c.now))
    c.do(0, c.cores[0].dispatch(Task(91, 1, 10, MS, origin=0), c.now))
    c.advance(3 * HEARTBEAT_NS)
    for i in (1, 2):  # node 0 full: both members reserved on node 1
        c.do(0, c.cores[0].submit(member(i, 0, 3), c.now, 2))
    c.down.add(0)  # dies with the reservations on their way
    c.deliver()
    assert len(c.cores[1].gangs.holds) == 0  # lost with node 0
    c.down.discard(0)
    # again, the answers lost instead: node 1 holds, node 0 never commits
    c2 = Cluster(2, slots=2, core=core)
    c2.advance(3 * HEARTBEAT_NS)
    for t in (90, 91):
        c2.do(0, c2.cores[0].dispatch(Task(t, 1, 10, MS, origin=0), c2.now))
    c2.advance(3 * HEARTBEAT_NS)
    for i in (1, 2):
        c2.do(0, c2.cores[0].submit(member(i, 0, 3), c2.now, 2))
    c2.deliver_one(*c2.wire.popleft())
    c2.deliver_one(*c2.wire.popleft())
    assert len(c2.cores[1].gangs.holds) == 2 and c2.cores[1].scheduler.free_slots() == 0
    c2.down.add(0)
    c2.wire.clear()
    c2.advance(DEAD_AFTER_NS + 5 * HEARTBEAT_NS)
    assert c2.cores[1].gangs.holds == {} and c2.cores[1].scheduler.free_slots() == 2


def test_bad_gang_input_is_refused_and_counted(core: ModuleType) -> None:
    c = Cluster(2, slots=2, core=core)
    x = c.cores[0]
    x.submit(member(1, 0, 2), c.now, 3)
    x.submit(member(2, 0, 2), c.now, 4)  # another count for gang 2
    x.submit(member(1, 0, 2), c.now, 3)  # a repeated id
    assert x.rejected.get("GangError") == 2
    assert len(x.gangs.gangs[2].members) == 1
    with pytest.raises(GangError):
        x.gangs.declare(member(9, 0, 2), 0, c.now)
    # a gang DISPATCH from a node that is not the member's origin: refused
    m = msg.Dispatch(5, 1, 10, 0, 0, origin=0, gang=True)
    c.do(1, c.cores[1].receive(through_codec(m, src=0, load=0, dst=1), 0, c.now))
    assert c.cores[1].gangs.holds  # from its origin: held
    m2 = msg.Dispatch(6, 1, 10, 0, 0, origin=1, gang=True)
    c.do(1, c.cores[1].receive(through_codec(m2, src=0, load=0, dst=1), 0, c.now))
    assert c.cores[1].rejected.get("bad-gang") == 1


def test_gang_flags_on_the_wire() -> None:
    """The handshake's messages round-trip the codec; a GANG PREEMPT needs JOB and CANCEL."""
    for m in (
        msg.Dispatch(5, 7, 10, 3, 0, origin=2, gang=True),
        msg.Dispatch(5, 7, 10, 3, 0, origin=2, gang=True, commit=True),
        msg.Preempt(0, 7, 11, cancel=True, whole_job=True, gang=True),
        msg.Complete(5, 7, 0, 0, msg.HELD),
        msg.Complete(5, 7, 0, 0, msg.REFUSED),
    ):
        assert msg.decode(through_codec(m, src=2, load=0, dst=1)) == m
    with pytest.raises(MessageError):
        msg.Dispatch(5, 7, commit=True)
    bad = msg.Preempt(0, 7, 11, cancel=True, whole_job=False, gang=True)
    with pytest.raises(MessageError):
        msg.decode(through_codec(bad, src=2, load=0, dst=1))


def test_a_target_that_held_and_died_before_the_commit_gets_none(core: ModuleType) -> None:
    """Node 2 answers HELD, then its lane closes; node 1's HELD comes after: the attempt is
    refused (no COMMIT to the dead node), node 1's hold given back, and the gang, larger
    than what is left, waits GangTooLarge."""
    c = Cluster(3, slots=2, core=core)
    c.advance(3 * HEARTBEAT_NS)
    for i in range(1, 6):
        c.do(0, c.cores[0].submit(member(i, 0, 4), c.now, 5))
    to1 = [w for w in c.wire if w[1] == 1]
    assert to1 and len(to1) < len(c.wire)  # reservations for both peers
    c.wire = type(c.wire)(w for w in c.wire if w[1] != 1)
    c.deliver()  # node 2 holds its member and answers
    assert len(c.cores[2].gangs.holds) == 1
    c.down.add(2)
    c.do(0, c.cores[0].peer_lost(2, "lane closed", c.now))
    c.wire.extend(to1)
    c.deliver()
    dispatch = msg.Dispatch(0, 0).encode()[0]
    assert c.sent[0, 2, dispatch] == 1  # its reservation, and no COMMIT after it
    assert not [x for x in c.arrived[2] if x[1].flags & 0x40]
    g = c.cores[0].gangs
    c.advance(5 * HEARTBEAT_NS)
    assert wait_reason(g, 1) == GANG_TOO_LARGE
    assert c.cores[1].gangs.holds == {} and c.cores[1].scheduler.free_slots() == 2
    assert c.cores[0].scheduler.free_slots() == 2
    assert starts(c, 0, range(1, 6)) == {i: [] for i in range(1, 6)}


def test_cancelling_a_gang_on_its_coordinator_stops_it_everywhere(core: ModuleType) -> None:
    """`preempt(job=J, cancel=True)` on the coordinator: every member cancelled where it
    runs, the gang forgotten (its job can be a new gang), nothing held."""
    c = Cluster(2, slots=2, core=core)
    c.advance(3 * HEARTBEAT_NS)
    declare(c, 0, 3, [1, 2, 3], 3)
    first = starts(c, 0, [1, 2, 3])
    assert sorted(n for v in first.values() for n in v) == [0, 0, 1]
    c.do(0, c.cores[0].preempt(None, 3, True, c.now))
    c.deliver()
    for i, (n,) in first.items():
        assert any(s[2] == i and s[3] for s in c.of(n, "preempt")), (i, n)
    assert free(c) == {0: 2, 1: 2} and held_anywhere(c) == 0
    g = c.cores[0].gangs
    assert 3 not in g.gangs and g.n["cancelled"] == 1 and c.cores[0].rejections == 0
    assert c.cores[0].peers.held_count() == 0
    c.advance(3 * HEARTBEAT_NS)
    declare(c, 0, 3, [4, 5], 2)  # the job is free for a new gang
    assert all(len(v) == 1 for v in starts(c, 0, [4, 5]).values())


def test_why_and_the_waiting_counts_say_a_gang_members_reason(core: ModuleType) -> None:
    # a waiting member is in no queue of the scheduler: gang.why and gang.waiting_counts
    # say why it waits (what /why and rdmasched_tasks_waiting show for it)
    c = Cluster(2, slots=2, core=core)
    c.advance(3 * HEARTBEAT_NS)
    declare(c, 0, 7, [1, 2], 4)
    declare(c, 0, 9, range(11, 16), 5)
    g = c.cores[0].gangs
    (r,) = gang.why(g, 1)
    assert r.code is Code.GANG_INCOMPLETE and r.message == "gang 7 has 2/4 members submitted"
    (r,) = gang.why(g, 11)
    assert r.code is Code.GANG_TOO_LARGE and r.message == "gang 9 needs 5 slots; the cluster has 4"
    assert gang.why(g, 99) == [] and gang.why(g, 1, origin=1) == []
    counts = gang.waiting_counts(g)
    assert counts == {"GangIncomplete": 2, "GangTooLarge": 5, "GangWaitingForCapacity": 0}
    declare(c, 0, 7, [3, 4], 4)  # complete: placed, no reason any more
    starts(c, 0, [1, 2, 3, 4])
    assert gang.why(g, 1) == [] and gang.waiting_counts(g)["GangIncomplete"] == 0


# ---- a waiting gang is tried the moment capacity may have appeared (docs/GANGS.md) ----------
def _one_busy_slot_each(core: ModuleType) -> Cluster:
    """Two nodes of 2 slots, one slot busy on each (tasks 80 and 81), and gang 4 of 3 members
    declared on node 0: it fits the cluster, not its free slots, so it waits."""
    c = Cluster(2, slots=2, core=core)
    for n in (0, 1):
        c.do(n, c.cores[n].dispatch(Task(80 + n, 3, 10, MS, origin=n), c.now))
    c.advance(3 * HEARTBEAT_NS)
    declare(c, 0, 4, [1, 2, 3], 3)
    assert wait_reason(c.cores[0].gangs, 1) == GANG_WAITING
    return c


def test_a_waiting_gang_is_tried_when_a_slot_frees_on_its_coordinator(core: ModuleType) -> None:
    c = _one_busy_slot_each(core)
    c.do(0, c.cores[0].complete(80, 0, 1, c.now))  # node 0's slot frees
    c.deliver()  # no time passes: the gang is not left to the next heartbeat
    got = starts(c, 0, [1, 2, 3])
    assert all(len(v) == 1 for v in got.values()), got
    assert wait_reason(c.cores[0].gangs, 1) is None


def test_a_waiting_gang_is_tried_when_a_peers_load_hint_falls(core: ModuleType) -> None:
    c = _one_busy_slot_each(core)
    c.do(1, c.cores[1].complete(81, 1, 1, c.now))  # node 1's slot frees; node 0 cannot know
    c.deliver()
    assert starts(c, 0, [1, 2, 3]) == {1: [], 2: [], 3: []}
    # node 1's next heartbeat carries its lower hint: node 0 tries the gang on receiving it,
    # not at its own next heartbeat
    c.do(1, c.cores[1].tick(c.now, c.now))
    c.deliver()
    got = starts(c, 0, [1, 2, 3])
    assert all(len(v) == 1 for v in got.values()), got


@pytest.mark.parametrize("seed_offset", [0, 1, 2])
def test_a_refused_attempt_backs_off_by_its_answer_time(core: ModuleType, seed_offset: int) -> None:
    """Two gangs that collide (test_competing_gangs_never_deadlock): their answers came at
    once, so the back-off is BACKOFF_MIN_NS-scale, not a heartbeat; a `Wake` at its end
    tries again. One gang is placed within a millisecond (the heartbeat is 20 ms)."""
    c = Cluster(2, slots=2, core=core)
    c.advance(3 * HEARTBEAT_NS)
    for n in (0, 1):
        c.cores[n].gangs.rng.seed(seed_offset * 10 + n)
    for n in (0, 1):
        for i in (1, 2, 3):
            c.do(n, c.cores[n].submit(member(i, n, 5), c.now, 3))
    c.deliver()
    assert [c.cores[n].gangs.n["attempts_failed"] for n in (0, 1)] == [1, 1]
    assert all(c.wakes[n] for n in (0, 1)), c.wakes  # each asked to be woken
    c.advance(MS, step=1_000)
    running = [
        n
        for n in (0, 1)
        if 5 in c.cores[n].gangs.gangs and c.cores[n].gangs.gangs[5].phase is Phase.RUNNING
    ]
    assert len(running) == 1, [c.cores[n].gangs.gangs[5].describe() for n in (0, 1)]
    assert all(len(v) == 1 for v in starts(c, running[0], [1, 2, 3]).values())
