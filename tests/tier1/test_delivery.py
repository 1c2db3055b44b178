"""Nothing lost when a relay dies (issue 20 item 4; docs/PROTOCOL.md section 10, "Nothing
lost"): every task an origin places completes exactly once at its origin, or is placed
again, while relays on its routes die with DISPATCHes and COMPLETEs inside; a task sent
again is deduplicated by (origin, task) at its target. On sans-IO cores with a topology
(tests/corenet.py)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rdmasched.topology import Topology
from tests.corenet import DEAD_AFTER_NS, HEARTBEAT_NS, Cluster, task

#: 4 leaves of 4, each its own pod: a leaf dragonfly (3 hops; a leaf's gateways relay)
DRAGONFLY = Topology.generate(nodes=16, leaf=4, pod=4)
#: 4 leaves of 4 in one pod: the rail mesh of `rdmasched demo --nodes 16 --leaf 4` (2 hops)
RAIL_MESH = Topology.generate(nodes=16, leaf=4, pod=16)


class Run:
    """Origins place tasks on far targets while the cluster runs: each node's handler
    completes what it started one tick later (as a user's task would)."""

    def __init__(self, t: Topology, seed: int) -> None:
        self.t = t
        self.rng = random.Random(seed)
        self.c = Cluster(len(t), topology=t)
        self.c.advance(2 * HEARTBEAT_NS)
        #: (origin, task id) -> completions the origin saw (a COMPLETE, or its own run)
        self.done: Counter[tuple[int, int]] = Counter()
        self.placed: list[tuple[int, int]] = []
        self._started = dict.fromkeys(self.c.cores, 0)

    def far(self, me: int) -> list[int]:
        links = self.c.cores[me].links
        return [n for n in range(len(self.t)) if n != me and n not in links]

    def place(self, origin: int, tid: int, target: int) -> None:
        c = self.c
        c.do(origin, c.cores[origin].dispatch_to(target, task(tid, origin), c.now))
        self.placed.append((origin, tid))

    def step(self) -> None:
        """Complete what each live node started, deliver a few messages, let time pass."""
        c = self.c
        for n, core in c.cores.items():
            if n in c.down:
                continue
            starts = c.of(n, "start")
            for _, origin, tid, _slot in starts[self._started[n] :]:
                if origin == n:
                    self.done[origin, tid] += 1
                c.do(n, core.complete(tid, origin, 1000, c.now))
            self._started[n] = len(starts)
        for _ in range(min(self.rng.randint(1, 8), len(c.wire))):
            writer, to, m = c.wire.popleft()
            if c.passes(writer, to, m):
                c.deliver_one(writer, to, m)
        if not c.wire:
            c.advance(HEARTBEAT_NS)

    def settle(self) -> None:
        """Run until nothing is left to do, for at most a long while."""
        c = self.c
        end = c.now + 40 * DEAD_AFTER_NS
        while c.now < end:
            self.step()
            c.advance(HEARTBEAT_NS)

    def completions(self, origin: int) -> None:
        for _, tid, _node in self.c.of(origin, "completed"):
            self.done[origin, tid] += 1


def relays(t: Topology, a: int, b: int) -> set[int]:
    return set(t.path(a, b)[1:-1]) | set(t.path(b, a)[1:-1])


@pytest.mark.parametrize("t", [DRAGONFLY, RAIL_MESH], ids=["dragonfly", "rail-mesh"])
def test_a_relay_killed_with_dispatches_and_completes_inside_loses_no_task(t: Topology) -> None:
    """Node 0 streams tasks to a far node; the relay between them is killed with messages
    of the stream in its lanes both ways. Every task completes exactly once at node 0 and
    none is left held by a peer (before: some were held for good, told to nobody)."""
    r = Run(t, 0)
    c = r.c
    target = r.far(0)[-1]
    relay = sorted(relays(t, 0, target))[0]
    for k in range(40):
        r.place(0, k, target)
        r.step()
        if k == 30:
            c.down.add(relay)
    r.settle()
    r.completions(0)
    assert {k: n for k, n in r.done.items() if n != 1} == {}
    assert sorted(r.done) == sorted(r.placed)
    assert c.cores[0].peers.held_count() == 0
    assert c.cores[0].resent_tasks > 0


def test_a_task_sent_again_runs_once_and_is_answered_again_if_done() -> None:
    """The target deduplicates by (origin, task): a DISPATCH of a task it holds is ignored,
    one of a task it completed is answered with its COMPLETE again (not run twice)."""
    r = Run(RAIL_MESH, 1)
    c = r.c
    target = r.far(0)[0]
    r.place(0, 7, target)
    c.deliver()
    assert c.of(target, "start") == [("start", 0, 7, 0)]
    core0 = c.cores[0]
    t7 = core0.peers.held(target)[0]
    c.do(0, core0.resend(target, [t7], "a test"))  # while it runs: ignored
    c.deliver()
    assert len(c.of(target, "start")) == 1 and c.cores[target].dup_dispatches == 1
    c.do(target, c.cores[target].complete(7, 0, 1000, c.now))
    c.deliver()
    assert c.of(0, "completed") == [("completed", 7, target)]
    c.do(0, core0.resend(target, [t7], "a test"))  # done: its COMPLETE again, counted
    c.deliver()
    assert len(c.of(target, "start")) == 1 and c.cores[target].dup_dispatches == 2
    assert c.of(0, "completed") == [("completed", 7, target)]  # noticed once
    assert core0.dup_completes == 1 and not core0.rejected


@pytest.mark.parametrize("t", [DRAGONFLY, RAIL_MESH], ids=["dragonfly", "rail-mesh"])
@pytest.mark.parametrize("seed", range(8))
def test_random_relay_deaths_mid_stream_lose_no_task(t: Topology, seed: int) -> None:
    """The rule (docs/PROTOCOL.md 10, "Nothing lost"): origins in one leaf stream tasks to
    far nodes while random other nodes (relays, targets) are killed at random moments with
    messages in flight. Every task completes exactly once at its origin (where it ran, or
    as a COMPLETE: a target's death places its tasks again), and no origin is left holding
    one."""
    r = Run(t, seed)
    c, rng = r.c, r.rng
    origins = [n for n in range(len(t)) if t.leaf(n) == 0]
    others = [n for n in range(len(t)) if n not in origins]
    kills = sorted(rng.sample(range(5, 120), 2))
    victims = rng.sample(others, 2)
    tid = 0
    for tick in range(150):
        if kills and tick == kills[0]:
            kills.pop(0)
            c.down.add(victims.pop())
        if tick < 120:
            o = rng.choice(origins)
            targets = [n for n in r.far(o) if n not in c.down]
            r.place(o, tid, rng.choice(targets))
            tid += 1
        r.step()
    r.settle()
    for o in origins:
        r.completions(o)
        assert c.cores[o].peers.held_count() == 0, (o, c.cores[o].peers.holders())
    assert {k: n for k, n in r.done.items() if n != 1} == {}
    assert sorted(r.done) == sorted(r.placed)


def test_a_route_whose_relay_two_hops_on_is_dead_goes_around_it_without_a_loop() -> None:
    """Node 2's route to node 13 is [2, 0, 12, 13]; node 12 is dead, known everywhere. The
    message takes the first route from its sender that avoids every dead node (here
    [2, 14, 13]), the same on every node on the way: around only the next hop, node 0 sent
    it on to 1, which sent it back to 2, until the hop bound dropped it."""
    t = DRAGONFLY
    assert t.path(2, 13) == [2, 0, 12, 13]
    c = Cluster(16, topology=t)
    c.advance(2 * HEARTBEAT_NS)
    c.down.add(12)
    c.advance(DEAD_AFTER_NS + 4 * t.plan.hops * HEARTBEAT_NS)
    assert all(core.members.is_dead(12) for n, core in c.cores.items() if n != 12)
    c.arrived.clear()
    c.do(2, c.cores[2].dispatch_to(13, task(1, 2), c.now))
    c.deliver()
    assert [m.kind for _, m in c.arrived[13]][-1] == 1  # the DISPATCH (behind its notice)
    assert c.of(13, "start") == [("start", 2, 1, 0)]
    assert not any(core.relay_dropped for core in c.cores.values())
