"""Hierarchical liveness and placement at scale (issue 8 items 5 and 6), on sans-IO cores
with a topology (tests/corenet.py's Cluster): heartbeats only over a node's own links,
deaths and rejoins spread as news on them, placement inside the leaf first and across
leaves from the domain summaries. docs/SCALE.md, "Liveness" and "Placement", is the contract.
"""

from __future__ import annotations

import random

import msgpack
import pytest

from rdmasched import messages as msg
from rdmasched.daemon.membership import FAR_MAX, NEWS_MAX, NEWS_REPEAT, SUMMARIES_PER_BEAT
from rdmasched.topology import Topology
from tests.codec import through_codec
from tests.corenet import DEAD_AFTER_NS, HEARTBEAT_NS, MS, Cluster, task

#: 8 leaves of 8 nodes in 2 pods: a leaf dragonfly, 9 links per node, 3 hops
T64 = Topology.generate(nodes=64, leaf=8, pod=32)


def far_node(t: Topology, me: int) -> int:
    """A node of another leaf that `me` has no link to."""
    links = set(t.neighbours(me))
    return next(n for n in range(len(t)) if n != me and n not in links and t.leaf(n) != t.leaf(me))


def starts(c: Cluster, origin: int, tid: int) -> list[int]:
    """The nodes that started task `tid` of `origin`, in order of their ids."""
    return [n for n in c.cores for s in c.of(n, "start") if s[1:3] == (origin, tid)]


def test_heartbeats_go_only_over_links() -> None:
    c = Cluster(64, topology=T64)
    c.advance(DEAD_AFTER_NS + 2 * HEARTBEAT_NS)
    assert not [s for s in c.unlinked if isinstance(s[2], msg.Heartbeat)]
    for n, core in c.cores.items():
        assert core.links == frozenset(T64.neighbours(n))
        assert set(core.members.views) == set(core.links)  # no view of a far node
        assert core.members.dead() == []


def test_without_a_topology_every_node_heartbeats_every_node() -> None:
    c = Cluster(4)
    c.advance(2 * HEARTBEAT_NS)
    assert not c.unlinked
    for n, core in c.cores.items():
        assert set(core.members.views) == set(c.cores) - {n}


def test_a_far_holders_death_reaches_its_origin_within_the_bound_and_its_task_runs_once() -> None:
    c = Cluster(64, topology=T64)
    c.advance(2 * HEARTBEAT_NS)
    x = far_node(T64, 0)
    c.do(0, c.cores[0].dispatch_to(x, task(1, origin=0), c.now))
    c.deliver()
    assert starts(c, 0, 1) == [x]
    # and x's task 7 runs on node 0 (x knew no incarnation of node 0: it asked first)
    c.do(x, c.cores[x].dispatch_to(0, task(7, origin=x), c.now))
    c.deliver()
    assert starts(c, x, 7) == [0]
    c.advance(HEARTBEAT_NS, step=MS)
    last = c.timers[x] - HEARTBEAT_NS  # x's last heartbeat: the last message of it heard
    c.down.add(x)  # x stops (SIGSTOP): it neither runs nor reads its lanes
    while not c.cores[0].members.is_dead(x):
        assert c.now < last + 3 * DEAD_AFTER_NS, "the origin never learned of the death"
        c.advance(MS, step=MS)
    # the bound of docs/SCALE.md "Liveness": dead_after + (hops - 1) heartbeat periods,
    # plus this harness's timer granularity (1 ms per hop)
    bound = DEAD_AFTER_NS + (T64.plan.hops - 1) * HEARTBEAT_NS
    assert c.now - last <= bound + T64.plan.hops * MS
    # node 0 cancelled x's task 7, and placed task 1 again: it runs once more, here
    assert c.of(0, "preempt") == [("preempt", x, 7, True, 0)]
    assert sorted(starts(c, 0, 1)) == sorted([x, 0])
    assert c.cores[0].peers.held_count() == 0
    # every node heard it, at most one heartbeat period later per hop
    c.advance(T64.plan.hops * HEARTBEAT_NS)
    assert all(core.members.is_dead(x) for n, core in c.cores.items() if n != x)
    # x comes back: it learns from its links that it was declared dead, cancels its run of
    # task 1 before anything else, and rejoins as a new incarnation that everyone admits
    inc = c.cores[x].members.inc
    c.down.discard(x)
    c.do(x, c.cores[x].stalled(c.now - last, c.now))
    c.advance(T64.plan.hops * HEARTBEAT_NS + HEARTBEAT_NS)
    assert c.cores[x].members.inc > inc
    assert c.of(x, "preempt") == [("preempt", 0, 1, True, 0)]
    assert all(not core.members.is_dead(x) for n, core in c.cores.items() if n != x)
    assert sorted(starts(c, 0, 1)) == sorted([x, 0])  # never again


def test_a_restarted_far_node_is_a_new_incarnation_and_is_not_handed_its_old_tasks() -> None:
    c = Cluster(64, topology=T64)
    c.advance(2 * HEARTBEAT_NS)
    x = far_node(T64, 0)
    c.do(0, c.cores[0].dispatch_to(x, task(1, origin=0), c.now))
    c.deliver()
    assert starts(c, 0, 1) == [x]
    # task 2 is on its way to x when x restarts (a new process, a later incarnation,
    # before any node declared the old one dead): the DISPATCH reaches the new process
    c.do(0, c.cores[0].dispatch_to(x, task(2, origin=0), c.now))
    old = c.cores[x].members.inc
    c.restart(x, old + 1000)
    c.deliver()
    c.advance(T64.plan.hops * HEARTBEAT_NS + HEARTBEAT_NS)
    # every node knows the new incarnation, none holds it dead
    assert all(core.members.far_inc(x) == old + 1000 for n, core in c.cores.items() if n != x)
    # the new incarnation started neither task (the old one ended with both): node 0
    # placed them again, and each started once more, elsewhere
    restarted_at = c.seen[x].index(("restarted", old + 1000))
    assert not [s for s in c.seen[x][restarted_at:] if s[0] == "start"]
    for tid in (1, 2):
        assert len([n for n in starts(c, 0, tid) if n != x]) == 1, (tid, starts(c, 0, tid))
    holders = [n for tid in (1, 2) for n in starts(c, 0, tid) if n != x]
    assert c.cores[0].peers.held_count() == len([n for n in holders if n != 0])


@pytest.mark.slow
def test_news_and_summaries_stay_bounded_at_1000_nodes() -> None:
    t = Topology.generate(nodes=1000, leaf=8, pod=64)
    c = Cluster(1000, topology=t)
    c.advance(2 * HEARTBEAT_NS)
    gone = list(range(0, 1000, 23))[: NEWS_MAX + 8]  # more deaths than a beat carries
    c.down.update(gone)
    c.wire.clear()
    for g in gone:  # killed: their links see the lanes closed (no dead_after to wait)
        for n in t.neighbours(g):
            if n not in c.down:
                c.do(n, c.cores[n].peer_lost(g, "lane closed", c.now))
    sizes: list[int] = []
    live = [core for n, core in c.cores.items() if n not in gone]
    # each hop takes at most ceil(changes x NEWS_REPEAT / NEWS_MAX) periods (docs/SCALE.md)
    per_hop = -(-len(gone) * NEWS_REPEAT // NEWS_MAX)
    rounds = 0
    while not all(core.members.is_dead(g) for core in live for g in gone):
        rounds += 1
        assert rounds <= t.plan.hops * per_hop, "the news did not spread within the bound"
        c.advance(HEARTBEAT_NS)
        for core in c.cores.values():
            meta = core.members.heartbeat_meta(min(core.links))
            meta.update(core.gossip_meta(consume=False))
            sizes.append(len(msgpack.packb(meta)))
            assert len(core.members.far) <= FAR_MAX
            assert len(core.summaries) <= core.SUMMARY_MAX
            assert len(core.members.views) == len(core.links)
    assert max(sizes) < 4096  # one heartbeat's metadata, whatever N
    for core in live:
        news = core.gossip_meta(consume=False)
        assert len(news.get("news", ())) <= NEWS_MAX
        assert len(news.get("sum", ())) <= 1 + SUMMARIES_PER_BEAT
    assert not [s for s in c.unlinked if isinstance(s[2], msg.Heartbeat)]


def test_placement_prefers_a_light_peer_of_the_leaf() -> None:
    c = Cluster(64, topology=T64)
    c.advance(2 * HEARTBEAT_NS)
    leaf = [n for n in range(64) if T64.leaf(n) == T64.leaf(0)]
    c.do(0, c.cores[0].dispatch(task(1, origin=0), c.now))  # node 0's one slot
    for i in range(2, 2 + len(leaf) - 1):  # one for each idle peer of the leaf
        c.do(0, c.cores[0].submit(task(i, origin=0), c.now))
        c.deliver()
        c.advance(HEARTBEAT_NS)  # its load hint comes back on its heartbeat
    # outside the leaf, node 0's links and the summaries' nodes are as idle as the leaf's
    # peers, but every task went to a peer of the leaf (to one that proved busy, the
    # task came back and waits at node 0: power of two choices on stale hints)
    forwards = [
        e.reason
        for i in range(2, 2 + len(leaf) - 1)
        for e in c.cores[0].scheduler.explain(i)
        if e.decision.value == "forward"
    ]
    assert forwards and all(int(r.split()[2].rstrip(":")) in leaf for r in forwards), forwards
    where = [n for i in range(2, 2 + len(leaf) - 1) for n in starts(c, 0, i)]
    assert len(where) >= len(leaf) // 2 and set(where) <= set(leaf[1:])
    assert len(set(where)) == len(where)  # one each: the hints came back in time
    assert not [s for s in c.unlinked if isinstance(s[2], msg.Dispatch)]


def test_placement_goes_across_leaves_only_when_the_leaf_is_loaded() -> None:
    c = Cluster(64, topology=T64)
    leaf = [n for n in range(64) if T64.leaf(n) == T64.leaf(0)]
    c.do(0, c.cores[0].dispatch(task(1, origin=0), c.now))
    for n in leaf[1:]:  # every peer of the leaf busier than node 0 would be with one more
        c.do(n, c.cores[n].dispatch(task(1, origin=n), c.now))
        c.do(n, c.cores[n].dispatch(task(2, origin=n), c.now))
    c.advance(2 * HEARTBEAT_NS)  # the loads, and the domain summaries, travel
    c.do(0, c.cores[0].submit(task(5, origin=0), c.now))
    c.deliver()
    (where,) = starts(c, 0, 5)
    assert T64.leaf(where) != T64.leaf(0)
    assert len(T64.path(0, where)) - 1 <= T64.plan.hops
    # only the chosen node was written to outside the links: no polling
    assert {d for s, d, m in c.unlinked if s == 0} <= {where}
    c.do(where, c.cores[where].complete(5, 0, MS, c.now))
    c.deliver()
    assert c.of(0, "completed") == [("completed", 5, where)]
    assert c.cores[0].peers.held_count() == 0


def test_a_summary_alone_makes_no_far_view_and_its_node_gets_a_task_without_a_round_trip() -> None:
    """A far view is kept for a node this node has business with, not for every node a
    summary named (at 100,000 nodes the nodes the summaries went through were FAR_MAX views
    at every node); a task sent to a summary's node still goes at once, behind its notice,
    with the incarnation the summary named (docs/SCALE.md, "Liveness")."""
    c = Cluster(64, topology=T64)
    c.advance(3 * HEARTBEAT_NS)  # the summaries travel, and a tick reads them
    core = c.cores[0]
    named = {s[2]: s[3] for leaf, s in core.summaries.items() if leaf != T64.leaf(0)}
    far = sorted(set(named) - core.links)
    assert far, "no summary named a far node: the test shows nothing"
    assert not core.members.far, "views made from summaries alone"
    x = far[0]
    c.unlinked.clear()
    c.do(0, core.dispatch_to(x, task(5, origin=0), c.now))  # sent, not yet delivered
    kinds = [type(m).__name__ for s, d, m in c.unlinked if s == 0]
    assert kinds == ["Heartbeat", "Dispatch"], kinds  # the notice, then the task: no asking
    assert {d for s, d, m in c.unlinked} == {x}
    assert core.members.far_inc(x) == named[x] > 0
    c.deliver()
    assert starts(c, 0, 5) == [x]
    # a node no summary names is asked first (its incarnation is not known): the notice
    # alone, the DISPATCH when the answer comes
    y = next(n for n in range(64) if n not in core.links and n not in named and n != 0)
    c.unlinked.clear()
    c.do(0, core.dispatch_to(y, task(6, origin=0), c.now))
    assert [type(m).__name__ for s, d, m in c.unlinked if s == 0] == ["Heartbeat"]
    c.deliver()
    assert starts(c, 0, 6) == [y]


def test_a_full_summary_table_forgets_the_summary_heard_longest_ago() -> None:
    """With more leaves than SUMMARY_MAX, a new leaf's summary takes the place of the one
    heard longest ago (of those heard at one time, the first kept), never this node's own
    leaf's; checked against that rule written plainly, entries and their order, over
    heartbeats whose summaries come at repeated times, as updates and as new leaves."""
    t = Topology.generate(nodes=1024, leaf=8, pod=64)  # 128 leaves
    me = 0
    c = Cluster(1, topology=t)
    core = c.make_core(me, 100)
    core.open(c.now)
    link = min(core.links)
    mine = t.leaf(me)
    model: dict[int, list[int]] = {}
    rng = random.Random(7)
    now = c.now
    versions: dict[int, int] = {}
    evicted = 0
    for beat in range(400):
        now += rng.choice((0, 0, MS))  # several beats at one time: ties in "heard"
        sums = []
        for _ in range(1 + SUMMARIES_PER_BEAT):
            node = rng.randrange(len(t))
            leaf = t.leaf(node)
            v = versions[leaf] = versions.get(leaf, 0) + rng.choice((0, 1, 1))
            sums.append([leaf, v, rng.randrange(4), node, 1])
        hb = msg.Heartbeat(now, 0, 0, {"inc": 1, "sum": sums})
        core.receive(through_codec(hb, src=link, dst=me), link, now)
        for leaf, v, load, node, inc in sums:  # the rule, plainly
            cur = model.get(leaf)
            if cur is not None and v <= cur[0]:
                continue
            if cur is None and len(model) >= core.SUMMARY_MAX:
                oldest = min((k for k in model if k != mine), key=lambda k: model[k][4])
                del model[oldest]
                evicted += 1
            model[leaf] = [v, load, node, inc, now]
        assert list(core.summaries.items()) == list(model.items()), beat
    assert evicted > 100, "the table never filled: the test shows nothing"
