"""Gangs on real daemons (docs/GANGS.md): three `Node`s over shm lanes on threads of one
process; a gang placed across them all or nothing, then a node stopped under it."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rdmasched.client import Client
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.clients import ClientHub
from rdmasched.daemon.node import Node
from rdmasched.errors import ArgumentError
from rdmasched.scheduler.gang import GANG_INCOMPLETE, GANG_TOO_LARGE
from tests.tier2.test_clients import one_host
from tests.waiting import wait_for

HEARTBEAT_MS = 20
DEAD_AFTER_MS = 200


def cluster(n: int, slots: int) -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "cluster": {
                "name": f"g{os.getpid()}-{uuid.uuid4().hex[:6]}",
                "heartbeat_ms": HEARTBEAT_MS,
                "dead_after_ms": DEAD_AFTER_MS,
            },
            "node": [{"name": f"n{i}", "slots": slots} for i in range(n)],
        }
    )


@pytest.fixture
def trio() -> Iterator[tuple[list[Node], list[tuple[int, str, int, bool]]]]:
    """Three nodes of two slots; what their handlers saw: (node, "start"/"stop", id, cancel)."""
    c = cluster(3, 2)
    seen: list[tuple[int, str, int, bool]] = []
    lock = threading.Lock()
    nodes = [Node(c, i, spin_us=20) for i in range(3)]
    for i, n in enumerate(nodes):

        def start(t: Any, s: int, i: int = i) -> None:
            with lock:
                seen.append((i, "start", t.id, False))

        def stop(t: Any, s: int, cancel: bool, i: int = i) -> int:
            with lock:
                seen.append((i, "stop", t.id, cancel))
            return int(t.progress_ns)

        n.on_dispatch(start)
        n.on_preempt(stop)
    openers = [threading.Thread(target=n.open) for n in nodes[1:]]
    for t in openers:
        t.start()
    nodes[0].open()
    for t in openers:
        t.join()
    for n in nodes:
        n.start()
    yield nodes, seen
    for n in nodes:
        if n.healthy:
            n.stop()


def gang(node: Node) -> dict[str, Any]:
    (g,) = node.stats()["gangs"]["gangs"]
    return g  # type: ignore[no-any-return]


def test_gang_across_daemons_all_or_nothing_then_a_node_dies_under_it(trio: Any) -> None:
    nodes, seen = trio
    a = nodes[0]
    wait_for(lambda: len(a.core.peers.loads()) == 2, "node 0 heard both peers' load")
    for i in (1, 2, 3, 4):  # four of five members: incomplete, nothing held or started
        a.submit(i, job=9, gang=5, cost_ns=10**9)
    a.flush()
    assert gang(a)["reason"] == GANG_INCOMPLETE
    assert not [s for s in seen if s[1] == "start"]
    assert all(n.scheduler.free_slots() == 2 for n in nodes)
    a.submit(5, job=9, gang=5, cost_ns=10**9)
    wait_for(lambda: len([s for s in seen if s[1] == "start"]) == 5, "the gang's five starts")
    starts = {tid: node for node, what, tid, _ in seen if what == "start"}
    assert sorted(starts) == [1, 2, 3, 4, 5]
    on = sorted(set(starts.values()))
    assert len(on) >= 2, starts  # across daemons: 5 members, 2 slots a node
    assert gang(a)["phase"] == "running" and gang(a)["reason"] is None
    victim = max(on)  # a peer that runs a member
    nodes[victim].stop()
    # node 0 learns it (lane closed, or silence past dead_after), stops the survivors'
    # members and places the whole gang again: 5 members on 4 live slots do not fit
    wait_for(lambda: gang(a)["restarts"] == 1, "the gang stopped and placed again")
    wait_for(lambda: gang(a)["reason"] == GANG_TOO_LARGE, "the gang waits: too large")
    survivors = [i for i in range(3) if i != victim]
    for tid, node in starts.items():
        if node in survivors:
            wait_for(
                lambda tid=tid, node=node: (node, "stop", tid, True) in seen,
                f"member {tid} cancelled on node {node}",
            )
    for i in survivors:
        wait_for(lambda i=i: nodes[i].scheduler.free_slots() == 2, f"node {i}'s slots free again")
    texts = [e.reason for e in a.explain(1)]
    assert any(f"node {victim}" in t and "placed again" in t for t in texts), texts


def test_a_client_submits_a_gang_through_its_daemon() -> None:
    """`Client.submit(..., gang=N)`: the count crosses the client lane (OP_SUBMIT arg1); the
    daemon holds the partial gang in no queue and starts it whole on this rank."""
    name = f"gc{os.getpid()}-{uuid.uuid4().hex[:6]}"
    node = Node(one_host(name), "h0", spin_us=50).start()
    hub = ClientHub(node).open()
    started: list[int] = []
    try:
        with Client(hub.endpoint, 0) as c:
            c.on_dispatch(lambda t, slot: started.append(t.id))
            c.on_preempt(lambda t, slot, cancel: 0)
            with pytest.raises(ArgumentError, match="gang"):
                c.submit(1, job=3, gang=-1)
            c.submit(1, job=3, gang=2, cost_ns=1000)
            c.flush()
            (g,) = c.stats()["gangs"]["gangs"]
            assert g["reason"] == GANG_INCOMPLETE and g["declared"] == 1
            assert node.scheduler.free_slots() == 2 and started == []
            c.submit(2, job=3, gang=2, cost_ns=1000)
            wait_for(lambda: sorted(started) == [1, 2], "both members started on this rank")
            c.complete(1)
            c.complete(2)
            wait_for(lambda: not c.stats()["gangs"]["gangs"], "the gang finished")
            assert c.stats()["gangs"]["finished"] == 1
    finally:
        node.stop()
