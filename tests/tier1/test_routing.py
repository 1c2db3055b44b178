"""Relaying (issue 8 item 3): a message for a node without a direct lane crosses the route of
the topology, relayed by the cores on it, once, in order per (source, destination), within a
hop bound; relays that cannot go on are dropped and counted.

Every delivery in `Cluster` goes over a link of the topology (the harness asserts it) and
through the real codec, so `src`, `dst` and `relays` travel in the slot as on a lane.
"""

from __future__ import annotations

import itertools

import pytest

from rdmasched import _wire
from rdmasched import messages as msg
from rdmasched.daemon.core import MAX_RELAYS, NodeCore, Relay, Send
from rdmasched.errors import ConfigError
from rdmasched.topology import Topology
from tests.codec import through_codec
from tests.corenet import DEAD_AFTER_NS, HEARTBEAT_NS, Cluster, task

GROUP = 77  # a sync group no core defines: its SYNC_READYs are kept, nothing else happens


def topo() -> Topology:
    # 24 nodes in leaves of 4, at most 5 lanes per node: leaf-dragonfly, routes of 3 hops
    t = Topology.generate(nodes=24, leaf=4, pod=8, budget=5)
    assert max(len(t.neighbours(n)) for n in range(24)) <= 5
    return t


def far_pairs(t: Topology) -> list[tuple[int, int]]:
    """(src, dst) pairs whose route has three hops (two relays)."""
    return [(s, d) for s in range(len(t)) for d in range(len(t)) if len(t.path(s, d)) == 4]


def ready(step: int, member: int) -> msg.SyncReady:
    return msg.SyncReady(GROUP, step, member)


def test_send_to_an_unlinked_node_goes_to_the_next_hop_with_the_destination() -> None:
    t = topo()
    src, dst = far_pairs(t)[0]
    c = Cluster(24, topology=t)
    e = c.cores[src]._send(dst, ready(1, src))
    assert e == Send(t.route(src, dst), ready(1, src), dst)
    assert e.peer in c.cores[src].links and dst not in c.cores[src].links
    linked = t.neighbours(src)[0]
    assert c.cores[src]._send(linked, ready(1, src)) == Send(linked, ready(1, src), linked)


def test_a_burst_from_several_sources_arrives_once_and_in_order_over_three_hops() -> None:
    t = topo()
    c = Cluster(24, topology=t)
    c.deliver()
    dst = 23
    sources = [s for s, d in far_pairs(t) if d == dst][:4]
    assert len(sources) >= 3
    c.arrived.clear()
    relayed_before = sum(core.relayed for core in c.cores.values())
    n = 40
    # interleaved: every source sends step i before any sends step i + 1
    for i, s in itertools.product(range(n), sources):
        c.do(s, [c.cores[s]._send(dst, ready(i, s))])
    c.deliver()
    got = [(src, m.arg0) for src, m in c.arrived[dst] if m.kind == msg._SYNC_READY]
    for s in sources:
        assert [step for src, step in got if src == s] == list(range(n))  # once, in order
    assert len(got) == n * len(sources)
    # each crossed two relays, and the last one wrote relays = 2 into the slot
    assert all(m.relays == 2 for src, m in c.arrived[dst] if src in sources)
    assert sum(core.relayed for core in c.cores.values()) - relayed_before == 2 * n * len(sources)
    assert c.cores[dst].sync_early_kept == n * len(sources)  # the destination handled them
    assert all(not core.relay_dropped for core in c.cores.values())


def test_the_sender_of_a_relayed_message_is_its_origin() -> None:
    """A COMPLETE relayed twice is reported as completed on its origin node, not the last
    hop; the last hop's load hint is what the receiver keeps for the last hop."""
    t = topo()
    src, dst = far_pairs(t)[0]
    c = Cluster(24, topology=t)
    c.deliver()
    last_hop = t.path(src, dst)[-2]
    c.load[last_hop] = 345
    core = c.cores[dst]
    core.scheduler.place_on(task(9, dst), src)  # dst's task 9 is held on src
    c.do(src, [c.cores[src]._send(dst, msg.Complete(9, 1, 5, 5))])
    c.deliver()
    assert c.of(dst, "completed") == [("completed", 9, src)]
    assert core.peers.loads().get(last_hop) == 345
    assert src not in core.peers.loads()  # no load hint of the origin: it wrote no slot here


def test_the_hop_bound_drops_and_counts() -> None:
    t = topo()
    src, dst = far_pairs(t)[0]
    first, second = t.path(src, dst)[1:3]
    c = Cluster(24, topology=t)
    c.deliver()
    # the second relay of the route has a bound of 1 (a route of two relays needs 2): as a
    # message that went round a loop of inconsistent routes would find it
    c.cores[second].max_relays = 1
    c.arrived.clear()
    c.do(src, [c.cores[src]._send(dst, ready(1, src))])
    c.deliver()
    assert c.cores[first].relayed >= 1
    assert c.cores[second].relay_dropped == {"hop-bound": 1}
    assert not [m for s, m in c.arrived[dst] if s == src and m.kind == msg._SYNC_READY]


def test_a_relay_whose_next_hop_is_dead_routes_around_it() -> None:
    """The relay knows its link `second` is dead: it sends the message on the topology's
    first route from here that avoids it (docs/PROTOCOL.md section 10), within the bound."""
    t = topo()
    src, dst = far_pairs(t)[0]
    first, second = t.path(src, dst)[1:3]
    c = Cluster(24, topology=t)
    c.deliver()
    c.down.add(second)
    c.do(first, c.cores[first].peer_lost(second, "its lane closed", c.now))
    c.deliver()
    c.arrived.clear()
    before = c.cores[first].rerouted
    c.do(src, [c.cores[src]._send(dst, ready(1, src))])
    c.deliver()
    assert c.cores[first].rerouted > before and not c.cores[first].relay_dropped
    [(sender, m)] = c.arrived[dst]
    assert sender == src and m.relays <= MAX_RELAYS


def test_a_message_for_a_dead_node_is_dropped_and_counted_at_the_last_relay() -> None:
    t = topo()
    src, dst = far_pairs(t)[0]
    last = t.path(src, dst)[-2]
    c = Cluster(24, topology=t)
    c.deliver()
    c.down.add(dst)
    c.do(last, c.cores[last].peer_lost(dst, "its lane closed", c.now))
    c.deliver()
    c.arrived.clear()
    c.do(src, [c.cores[src]._send(dst, ready(1, src))])
    c.deliver()
    assert c.cores[last].relay_dropped == {"dead-hop": 1}
    assert not c.arrived[dst]


def test_a_relayed_message_is_relayed_unchanged_but_for_relays() -> None:
    t = topo()
    src, dst = far_pairs(t)[0]
    first = t.route(src, dst)
    core = Cluster(24, topology=t).cores[first]
    m = through_codec(msg.Dispatch(5, 6, 7, 8, 9, origin=src, payload={"x": 1}), src=src, dst=dst)
    out = core.receive(m, src, core.now)
    assert out == [Relay(t.path(src, dst)[2], m)]
    assert core.relayed == 1 and core.scheduler.stats().queue_len == 0


def test_receive_refuses_a_message_over_the_bound_before_routing() -> None:
    t = topo()
    src, dst = far_pairs(t)[0]
    first = t.route(src, dst)
    core = Cluster(24, topology=t).cores[first]
    m = through_codec(ready(1, src), src=src, dst=dst, relays=MAX_RELAYS)
    assert core.receive(m, src, core.now) == []
    assert core.relay_dropped == {"hop-bound": 1}


def test_without_a_topology_every_node_is_linked_and_nothing_is_relayed() -> None:
    c = Cluster(4)
    c.advance(3 * HEARTBEAT_NS)
    assert all(core.relayed == 0 and not core.relay_dropped for core in c.cores.values())
    assert all(src == m.src for node in c.arrived for src, m in c.arrived[node])


def test_heartbeats_stay_on_links_and_a_far_dispatch_is_relayed_behind_its_notice() -> None:
    """Liveness is hierarchical (docs/SCALE.md section 10): heartbeats cross links only, so
    an idle cluster relays nothing and declares nobody dead. A DISPATCH to a far node is
    relayed, after the notice (a relayed HEARTBEAT) that tells it the origin's incarnation;
    it runs there, and its COMPLETE comes back relayed too."""
    t = topo()
    c = Cluster(24, topology=t)
    c.advance(2 * DEAD_AFTER_NS)
    assert not any(c.of(n, "dead") for n in c.cores)
    assert sum(core.relayed for core in c.cores.values()) == 0
    assert not [u for u in c.unlinked if isinstance(u[2], msg.Heartbeat)]
    s, d = far_pairs(t)[0]
    c.do(s, c.cores[s].dispatch_to(d, task(5, s), c.now))
    c.deliver()
    assert [x[:3] for x in c.of(d, "start")] == [("start", s, 5)]
    kinds = [type(m).__name__ for src, dst, m in c.unlinked if (src, dst) == (s, d)]
    assert kinds[-1] == "Dispatch" and "Heartbeat" in kinds[: kinds.index("Dispatch")]
    assert sum(core.relayed for core in c.cores.values()) >= 2 * (len(t.path(s, d)) - 2)
    c.do(d, c.cores[d].complete(5, s, 1000, c.now))
    c.deliver()
    assert ("completed", 5, d) in c.of(s, "completed")
    c.advance(2 * DEAD_AFTER_NS)
    assert not any(c.of(n, "dead") for n in c.cores)


def test_a_topology_whose_routes_exceed_the_bound_is_refused() -> None:
    t = topo()
    with pytest.raises(ConfigError, match="relays"):
        NodeCore(
            0,
            dict.fromkeys(range(24), ""),
            slots=1,
            inc=1,
            dead_after_ns=DEAD_AFTER_NS,
            heartbeat_ns=HEARTBEAT_NS,
            now=0,
            topology=t,
            max_relays=t.plan.hops - 2,
        )


def test_relay_through_the_lane_codec_keeps_every_field() -> None:
    """What the driver writes for a Relay: the received fields, relays + 1, its own load."""
    m = through_codec(msg.Heartbeat(1, 2, 3, {"inc": 4}), src=11, dst=12, relays=1, load=5)
    raw = _wire.encode(
        m.kind,
        m.id,
        m.job,
        m.priority,
        m.flags,
        m.arg0,
        m.arg1,
        m.arg2,
        m.hops,
        m.src,
        77,
        0,
        m.meta,
        dst=m.dst,
        relays=m.relays + 1,
        nslots=64,
    )
    r = _wire.decode(raw, nslots=64)
    assert (r.src, r.dst, r.relays, r.load) == (11, 12, 2, 77)
    assert msg.decode(r) == msg.decode(m)


# ---- the threaded driver: real lanes, real loops -----------------------------------------
def test_nodes_relay_a_dispatch_and_its_complete_over_shm_lanes() -> None:
    """Four `Node`s on the route s -> a -> b -> d of a 24-node topology, each with shm lanes
    to its route neighbours only: s dispatches a task to d and d completes it; both messages
    cross two relays (the loops write src, dst and relays; the cores relay), and the
    handlers see the origin s and the node d it ran on."""
    import os
    import threading
    import time
    import uuid

    from rdmasched.cluster import local_cluster
    from rdmasched.daemon.links import ShmLinks
    from rdmasched.daemon.node import Node

    t = topo()
    s, a, b, d = t.path(*far_pairs(t)[0])
    route = [s, a, b, d]
    # only these four run: each one's links are its neighbours on the route (the lanes it
    # has), so its heartbeats and gossip stay on them; routes are the topology's
    full_links = t.neighbours
    near = {i: set(route[max(0, k - 1) : k + 2]) - {i} for k, i in enumerate(route)}

    def route_links(node: int) -> list[int]:
        return sorted(near[node]) if node in near else full_links(node)

    t.neighbours = route_links  # type: ignore[method-assign]
    name = f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cluster = local_cluster(24, 1, name=name)
    links: dict[int, ShmLinks] = {}

    def make(i: int) -> None:
        k = route.index(i)
        links[i] = ShmLinks(name, i, route[max(0, k - 1) : k + 2], nslots=64)

    threads = [threading.Thread(target=make, args=(i,)) for i in route]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert sorted(links) == sorted(route)
    nodes: dict[int, Node] = {}
    started: list[tuple[int, int]] = []
    completed: list[tuple[int, int]] = []
    try:
        for i in route:
            n = Node(cluster, i, links=links[i], spin_us=0)
            # the topology's view of the cluster (the Node's own construction from a
            # topology config is docs/SCALE.md's "Links"): lanes to the route only
            n.core = NodeCore(
                i,
                cluster.domains,
                slots=1,
                inc=1000 + i,
                dead_after_ns=cluster.dead_after_ms * 1_000_000,
                heartbeat_ns=cluster.heartbeat_ms * 1_000_000,
                now=n.clock(),
                topology=t,
            )
            nodes[i] = n
        nodes[d].on_dispatch(lambda task, slot: started.append((task.id, task.origin)))
        nodes[s].on_complete(lambda task_id, node: completed.append((task_id, node)))
        for n in nodes.values():
            n.start()
        nodes[s].dispatch(42, to=d, job=7, priority=5, cost_ns=1000)
        deadline = time.monotonic() + 60
        while not started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert started == [(42, s)]
        nodes[d].complete(42, origin=s)
        while not completed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert completed == [(42, d)]
        assert nodes[a].core.relayed >= 2 and nodes[b].core.relayed >= 2  # there and back
    finally:
        for n in nodes.values():
            n.stop()
        for i, lk in links.items():
            if i not in nodes:
                lk.close()


def test_node_stats_count_the_relays() -> None:
    """Issue 20 item 3: PROTOCOL.md section 10 and DAEMON.md say relays are counted; the
    counters the core keeps are in `Node.stats()`."""
    import os
    import uuid

    from rdmasched.cluster import local_cluster
    from rdmasched.daemon.node import Node

    n = Node(local_cluster(2, 1, name=f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"), 0)
    n.core.relayed, n.core.rerouted = 5, 2
    n.core.relay_dropped["hop-bound"] = 1
    s = n.stats()
    assert (s["relayed"], s["rerouted"], s["relay_dropped"]) == (5, 2, {"hop-bound": 1})
    n.core.relay_dropped["no-route"] = 1
    assert s["relay_dropped"] == {"hop-bound": 1}  # a copy, not the core's own dict
