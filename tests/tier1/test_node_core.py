"""The sans-IO node core (rdmasched/daemon/core.py), driven by hand: no thread, no lane, no
clock. Several cores exchange their `Send` effects through a list on a fake clock, each
message encoded and decoded by the real codec (rdmasched._wire) as a lane would deliver
it; the handlers' answers go back to the core as the threaded `Node` gives them.
"""

from __future__ import annotations

from typing import Any

from rdmasched import messages as msg
from rdmasched.daemon.core import (
    MarkDead,
    NodeCore,
    PreemptTask,
    RunSync,
    Send,
    SetLoad,
    SetTimer,
    Start,
)
from rdmasched.limits import NO_SLOT
from tests.codec import through_codec
from tests.corenet import DEAD_AFTER_NS, HEARTBEAT_NS, MS, Cluster, task


def test_sync_is_released_on_every_member_once_all_are_ready() -> None:
    c = Cluster(3)
    c.deliver()
    for i, core in c.cores.items():
        c.do(i, core.define_group(7, frozenset(c.cores), c.now))
    c.do(0, c.cores[0].sync_ready(7, 0, c.now))
    c.do(1, c.cores[1].sync_ready(7, 0, c.now))
    c.deliver()
    assert not any(c.of(i, "sync") for i in c.cores)  # node 2 is not ready yet
    c.do(2, c.cores[2].sync_ready(7, 0, c.now))
    c.deliver()
    for i in c.cores:
        assert c.of(i, "sync") == [("sync", 7, 0, 0)]


def test_a_sync_ready_before_the_group_is_defined_is_kept() -> None:
    c = Cluster(2)
    c.do(0, c.cores[0].define_group(1, frozenset({0, 1}), c.now))
    c.do(0, c.cores[0].sync_ready(1, 0, c.now))
    c.deliver()  # node 1 has not defined group 1 yet
    assert c.cores[1].sync_early_kept == 1
    c.do(1, c.cores[1].define_group(1, frozenset({0, 1}), c.now))
    c.do(1, c.cores[1].sync_ready(1, 0, c.now))
    c.deliver()
    assert c.of(0, "sync") == c.of(1, "sync") == [("sync", 1, 0, 0)]


def test_a_peers_preempt_stops_the_task_and_it_runs_again() -> None:
    c = Cluster(2)
    c.do(1, c.cores[1].dispatch(task(5, origin=1), c.now))
    assert c.of(1, "start") == [("start", 1, 5, 0)]
    trigger = c.now - 3000
    c.wire.append((0, 1, msg.Preempt(5, 1, trigger_ns=trigger)))
    c.deliver()
    # stopped with the trigger of the PREEMPT, requeued with its progress, started again
    assert c.of(1, "preempt") == [("preempt", 1, 5, False, trigger)]
    assert c.of(1, "start") == [("start", 1, 5, 0), ("start", 1, 5, 0)]
    assert c.cores[1].scheduler.lookup(5, 1).progress_ns == c.progress_step  # type: ignore[union-attr]


def test_a_released_sync_preempts_compute_when_no_slot_is_free() -> None:
    c = Cluster(2)
    for i, core in c.cores.items():
        c.do(i, core.define_group(3, frozenset(c.cores), c.now))
        c.do(i, core.dispatch(task(1, origin=i), c.now))
    c.do(0, c.cores[0].sync_ready(3, 4, c.now))
    sent = c.now
    c.now += 50_000
    c.do(1, c.cores[1].sync_ready(3, 4, c.now))
    c.deliver()
    # each releases the step on the other's SYNC_READY, and counts the reaction from when
    # the other sent it; both preempt their compute task for the sync, which completes
    # when the handler returns, and the compute task runs again
    assert c.of(0, "preempt") == [("preempt", 0, 1, False, c.now)]
    assert c.of(1, "preempt") == [("preempt", 1, 1, False, sent)]
    for i in c.cores:
        assert c.of(i, "sync") == [("sync", 3, 4, 0)]
        assert c.of(i, "start") == [("start", i, 1, 0), ("start", i, 1, 0)]


def test_an_overlapping_groups_release_runs_beside_the_compute_it_serves() -> None:
    # the same, the group overlapping: the handler runs with slot NO_SLOT, nothing is
    # preempted, the compute task keeps its slot, and the sync's end frees nothing
    c = Cluster(2)
    for i, core in c.cores.items():
        c.do(i, core.define_group(3, frozenset(c.cores), c.now, overlap=True))
        c.do(i, core.dispatch(task(1, origin=i), c.now))
    c.do(0, c.cores[0].sync_ready(3, 4, c.now))
    c.do(1, c.cores[1].sync_ready(3, 4, c.now))
    c.deliver()
    for i, core in c.cores.items():
        assert c.of(i, "sync") == [("sync", 3, 4, NO_SLOT)]
        assert c.of(i, "preempt") == []
        assert c.of(i, "start") == [("start", i, 1, 0)]
        assert [t.id for t in core.scheduler.running()] == [1]
        assert core.scheduler.stats().sync_releases == 1
        assert core.beside == set() and core.rejections == 0  # ended by sync_done


def test_an_overlapping_sync_whose_handler_said_later_ends_with_complete() -> None:
    # on_sync returned LATER: the work goes on, and the driver's complete(task id) ends it
    # (nothing held in the scheduler: no rejection, nothing freed, nothing sent)
    c = Cluster(1)
    core = c.cores[0]
    c.do(0, core.define_group(3, frozenset({0}), c.now, overlap=True))
    c.do(0, core.dispatch(task(1, origin=0), c.now))
    (run,) = [e for e in core.sync_ready(3, 0, c.now) if isinstance(e, RunSync)]
    assert run.slot == NO_SLOT and core.beside == {run.task.id}
    assert core.complete(run.task.id, None, 0, c.now) == []
    assert core.beside == set() and core.rejections == 0
    assert [t.id for t in core.scheduler.running()] == [1]


def test_forwarded_work_runs_on_the_peer_and_its_completion_comes_back() -> None:
    c = Cluster(2)
    c.deliver()
    c.do(0, c.cores[0].submit(task(1, origin=0), c.now))  # takes node 0's one slot
    c.do(0, c.cores[0].submit(task(2, origin=0), c.now))  # node 1 is idle: sent there
    c.deliver()
    assert c.of(1, "start") == [("start", 0, 2, 0)]
    assert c.cores[0].peers.held_count() == 1
    c.do(1, c.cores[1].complete(2, 0, 4 * MS, c.now))
    c.deliver()
    assert c.of(0, "completed") == [("completed", 2, 1)]
    assert c.cores[0].peers.held_count() == 0


def test_a_busy_peer_hands_submitted_work_back_to_its_origin() -> None:
    c = Cluster(2)
    c.deliver()
    c.do(0, c.cores[0].submit(task(1, origin=0), c.now))
    c.do(1, c.cores[1].dispatch(task(9, origin=1, priority=200), c.now))
    # node 0 still believes node 1 idle (no message from it since): it sends task 2 there
    c.do(0, c.cores[0].submit(task(2, origin=0), c.now))
    c.do(0, c.cores[0].complete(1, None, MS, c.now))  # node 0's slot is free meanwhile
    c.deliver()
    # node 1 (busy, and node 0 now lighter) hands it back; node 0 runs it itself
    assert not [s for s in c.of(1, "start") if s[1] == 0]
    assert c.of(0, "start") == [("start", 0, 1, 0), ("start", 0, 2, 0)]
    assert c.cores[0].peers.held_count() == 0


def test_a_dead_peers_tasks_are_placed_again_and_the_peer_rejoins_without_running_them() -> None:
    c = Cluster(2)
    c.deliver()
    c.do(0, c.cores[0].submit(task(1, origin=0), c.now))
    c.do(0, c.cores[0].submit(task(2, origin=0), c.now))
    c.deliver()
    assert c.of(1, "start") == [("start", 0, 2, 0)]
    c.down.add(1)  # node 1 stops (SIGSTOP): it neither runs nor reads its lanes
    c.advance(DEAD_AFTER_NS + 3 * HEARTBEAT_NS)
    assert c.of(0, "dead") == [("dead", 1)]
    assert c.cores[0].members.dead() == [1]
    # node 0 placed task 2 again: its slot is busy and no peer is alive, so it waits here
    assert [t.id for t in c.cores[0].scheduler.queued()] == [2]
    c.do(0, c.cores[0].complete(1, None, MS, c.now))
    assert c.of(0, "start")[-1] == ("start", 0, 2, 0)
    # node 1 comes back; it learns from node 0's heartbeat that it was declared dead,
    # cancels its run of task 2 before anything else, and rejoins as a new incarnation
    c.down.discard(1)
    c.now += HEARTBEAT_NS
    inc = c.cores[1].members.inc
    c.do(1, c.cores[1].stalled(DEAD_AFTER_NS + 3 * HEARTBEAT_NS, c.now))
    c.advance(3 * HEARTBEAT_NS)
    assert c.cores[1].members.inc > inc
    assert c.of(1, "preempt") == [("preempt", 0, 2, True, 0)]
    assert c.cores[0].members.alive() == [1]
    assert ("revive", 1) in c.seen[0]
    # task 2 ran once on each incarnation that held it, the first run cancelled
    assert [s for s in c.of(1, "start") if s[2] == 2] == [("start", 0, 2, 0)]


def test_a_message_from_an_ended_incarnation_is_ignored() -> None:
    c = Cluster(2)
    c.deliver()
    c.down.add(1)
    c.advance(DEAD_AFTER_NS + 3 * HEARTBEAT_NS)
    assert c.cores[0].members.dead() == [1]
    stale = c.cores[0].stale_msgs
    c.down.discard(1)
    c.wire.append((1, 0, msg.Dispatch(4, 1, 10, origin=1, submitted=True)))
    c.deliver()
    assert c.cores[0].stale_msgs == stale + 1
    assert not c.of(0, "start")


def test_bad_input_is_counted_and_the_core_goes_on() -> None:
    c = Cluster(2)
    c.deliver()
    assert c.cores[0].complete(77, None, 0, c.now) == []
    assert c.cores[0].rejected == {"unknown-task": 1}
    c.wire.append((1, 0, msg.Preempt(12345)))
    c.deliver()
    assert c.cores[0].rejected == {"unknown-task": 2}
    c.do(0, c.cores[0].submit(task(1, origin=0), c.now))
    assert c.of(0, "start") == [("start", 0, 1, 0)]


def test_every_input_carries_its_time() -> None:
    """The core reads no clock: what it records is the `now` it was given."""
    c = Cluster(1)
    core = c.cores[0]
    core.dispatch(task(1, origin=0), 123_456_789)
    assert [e.t_ns for e in core.scheduler.explain(1)] == [123_456_789]
    effects = core.tick(555 * MS)
    assert effects[-1] == SetTimer(555 * MS + HEARTBEAT_NS)


def test_a_coordinator_decides_with_one_core_per_node() -> None:
    """The central baseline's use: cores that know no peer, fed every member's SYNC_READY."""
    cores = {
        n: NodeCore(
            n,
            {n: ""},
            slots=1,
            inc=1,
            dead_after_ns=DEAD_AFTER_NS,
            heartbeat_ns=HEARTBEAT_NS,
            now=0,
            sync_cost_ns=MS,
        )
        for n in (0, 1)
    }
    for n, core in cores.items():
        core.define_group(2, frozenset(cores), 0)
        assert core.dispatch(task(1, origin=n), 1)[0] == Start(core.scheduler.get(1, n), 0)
    assert cores[0].member_ready(2, 0, 0, 5, 10) == []
    effects = cores[0].member_ready(2, 0, 1, 7, 11)
    kinds = [type(e) for e in effects]
    assert kinds[:2] == [PreemptTask, RunSync]  # the compute task makes way for the sync
    assert isinstance(effects[0], PreemptTask) and effects[0].trigger_ns == 7
    assert not any(isinstance(e, Send) for e in effects)  # it knows no peer: no message


def test_silence_before_open_does_not_count() -> None:
    """A node whose start-up (lanes, a verbs bootstrap in a slow VM) took longer than
    dead_after must not declare its peers dead on its first tick: their silence counts
    from when it opened, not from when it was constructed (a tier-3 run saw both nodes
    declare each other dead during their first connection set-up)."""
    t0 = 10_000 * MS
    core = NodeCore(
        0,
        {0: "rack", 1: "rack"},
        slots=1,
        inc=1,
        dead_after_ns=DEAD_AFTER_NS,
        heartbeat_ns=HEARTBEAT_NS,
        now=t0,
    )
    opened = t0 + 5 * DEAD_AFTER_NS  # the bootstrap took five times dead_after
    core.open(opened)
    effects = core.tick(opened + HEARTBEAT_NS, opened + HEARTBEAT_NS)
    assert not [e for e in effects if isinstance(e, MarkDead)]
    # and silence after open still counts (ticks every heartbeat, as the loop runs them)
    dead: list[int] = []
    t = opened + HEARTBEAT_NS
    while t <= opened + DEAD_AFTER_NS + 2 * HEARTBEAT_NS:
        t += HEARTBEAT_NS
        dead += [e.peer for e in core.tick(t, t) if isinstance(e, MarkDead)]
    assert dead == [1]


def _core(me: int, inc: int = 1) -> NodeCore:
    return NodeCore(
        me,
        {0: "rack", 1: "rack"},
        slots=1,
        inc=inc,
        dead_after_ns=DEAD_AFTER_NS,
        heartbeat_ns=HEARTBEAT_NS,
        now=0,
    )


def _heartbeats(effects: list[Any]) -> list[msg.Heartbeat]:
    return [
        e.message for e in effects if isinstance(e, Send) and isinstance(e.message, msg.Heartbeat)
    ]


def test_a_first_incarnation_is_not_answered_a_restarted_one_is() -> None:
    """docs/PROTOCOL.md 4.2: two nodes that start together each write one heartbeat on
    their lane; the first heartbeat of the other is admitted without an answer (it waits
    for no acknowledgement, and this node's own first heartbeat named its incarnation).
    A later incarnation of it (a restart) is answered at once, acknowledging it; so is a
    peer's first heartbeat that comes before this node opened."""
    a, b = _core(0), _core(1)
    from_a = _heartbeats(a.open(0))
    from_b = _heartbeats(b.open(0))
    assert len(from_a) == len(from_b) == 1
    assert _heartbeats(b.receive(through_codec(from_a[0], src=0, dst=1), 0, MS)) == []
    assert _heartbeats(a.receive(through_codec(from_b[0], src=1, dst=0), 1, MS)) == []
    assert a.members.views[1].inc == 1 and b.members.views[0].inc == 1
    # node 0 restarts as incarnation 2: node 1 answers at once, acknowledging it
    a2 = _core(0, inc=2)
    again = _heartbeats(a2.open(2 * MS))
    answer = _heartbeats(b.receive(through_codec(again[0], src=0, dst=1), 0, 3 * MS))
    assert len(answer) == 1 and answer[0].incarnations["ack"] == 2
    # a node that has not opened yet answers a first heartbeat (it told nothing yet)
    c = _core(1)
    answer = _heartbeats(c.receive(through_codec(from_a[0], src=0, dst=1), 0, MS))
    assert len(answer) == 1 and answer[0].incarnations["ack"] == 1


def test_effects_follow_the_decisions_in_order_whether_or_not_each_is_one_effect() -> None:
    # _act writes the effects over the scheduler's action list when every action is one
    # effect (a start, a preemption) and makes a list otherwise (a cancel has none): the
    # same effects, in the order of the decisions, either way; the trigger only on a
    # preemption
    c = Cluster(2, slots=1)
    core = c.cores[1]
    fx = core.dispatch(task(5, origin=1), c.now)
    assert [type(e) for e in fx] == [Start, SetLoad] and fx[0].task.id == 5
    fx = core.dispatch(task(6, origin=1, priority=20), c.now)  # preempts 5
    assert [type(e) for e in fx] == [PreemptTask, Start]
    assert (fx[0].victim.id, fx[0].slot, fx[0].cancel, fx[0].trigger_ns) == (5, 0, False, 0)
    assert (fx[1].task.id, fx[1].slot) == (6, 0)
    assert core.dispatch(task(7, origin=1, priority=5), c.now) == [SetLoad(2000)]  # queued
    fx = core.preempt(None, 1, True, c.now)  # job 1: 7 cancelled, 6 stopped, 5 cancelling
    assert [type(e) for e in fx] == [PreemptTask, SetLoad]
    assert (fx[0].victim.id, fx[0].cancel, fx[0].trigger_ns) == (6, True, c.now)
    assert fx[1] == SetLoad(0)
