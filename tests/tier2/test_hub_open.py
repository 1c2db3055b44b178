"""A hub opened on a node that already runs (`rdmasched daemon`: `node.start()`, then
`launch.serve`): a task that started on a slot before the hub took over the node's handlers
reaches a client all the same (docs/CLIENT.md).

Before the fix the node carried out that Start with no dispatch handler: nothing ran the
task, yet it kept its slot, and no client was ever told of it. In the two-host torchrun test
(tests/tier2/test_clients.py) a task another host placed on a daemon in that window never
completed and every rank's last sync step hung.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

from rdmasched.client import Client
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.clients import ClientHub
from rdmasched.daemon.node import Node


def _cluster(nodes: int) -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "cluster": {
                "name": f"ho{os.getpid()}-{uuid.uuid4().hex[:6]}",
                "heartbeat_ms": 20,
                "dead_after_ms": 2000,
            },
            "node": [{"name": f"h{i}", "slots": 1} for i in range(nodes)],
        }
    )


def _on_loop(node: Node) -> None:
    """Wait until the node's loop has run what was queued before."""
    done = threading.Event()
    node.call_soon(done.set)
    assert done.wait(10)


def _serve_and_run(node: Node, origin: int, task_id: int) -> None:
    hub = ClientHub(node, max_clients=1).open()  # on a node whose loop runs
    starts: list[tuple[int, int]] = []
    with Client(hub.endpoint, 0) as rank:

        @rank.on_dispatch
        def start(task: Any, slot: int) -> None:
            starts.append((task.origin, task.id))

        assert rank.wait_for(lambda: starts == [(origin, task_id)], 10), starts
        rank.complete(task_id, origin=origin)
        rank.flush()
    assert node.scheduler.running() == []


def test_a_task_started_before_the_hub_opened_goes_to_the_first_client() -> None:
    node = Node(_cluster(1), "h0", spin_us=50).start()
    try:
        node.dispatch(7)  # starts on slot 0 at once: no handler, no hub yet
        _on_loop(node)
        assert [t.id for t in node.scheduler.running()] == [7]
        _serve_and_run(node, node.id, 7)
    finally:
        node.stop()


def test_a_peers_task_placed_before_the_hub_opened_goes_to_a_client() -> None:
    """The torchrun test's case: host h0 places a task on h1, whose daemon runs but does
    not serve its ranks yet."""
    cfg = _cluster(2)
    h0, h1 = Node(cfg, "h0", spin_us=50), Node(cfg, "h1", spin_us=50)
    opening = threading.Thread(target=h1.start)  # each waits for the other's lanes
    opening.start()
    h0.start()
    opening.join(30)
    try:
        h0.dispatch(5, to="h1")
        for _ in range(1000):
            _on_loop(h1)
            if h1.scheduler.running():
                break
        assert [(t.origin, t.id) for t in h1.scheduler.running()] == [(h0.id, 5)]
        _serve_and_run(h1, h0.id, 5)
    finally:
        h0.stop()
        h1.stop()
