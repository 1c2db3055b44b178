"""On shm links the node's loop reads its clients' up lanes itself (docs/CLIENT.md, "How
it works"): one wait, one doorbell, no reader thread of the hub's handing each batch over.

Before, a thread of the hub's waited on the up lanes and posted every batch to the loop:
two threads of one process woken for every message, and the GIL handed between them
(docs/PERFORMANCE-LOG.md, "A preemption through the daemon, hop by hop").
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


def _cluster() -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "cluster": {"name": f"hl{os.getpid()}-{uuid.uuid4().hex[:6]}", "heartbeat_ms": 20},
            "node": [{"name": "h0", "slots": 2}],
        }
    )


def _hub_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("rdmasched-clients")]


def _run_one(hub: ClientHub, task_id: int) -> None:
    started: list[int] = []
    with Client(hub.endpoint, 0, spin_us=0) as rank:

        @rank.on_dispatch
        def start(task: Any, slot: int) -> None:
            started.append(task.id)
            rank.complete(task.id)

        rank.submit(task_id)
        assert rank.wait_for(lambda: started == [task_id], 10), started
        rank.flush()


def test_the_nodes_loop_reads_the_clients_lanes_with_no_thread_of_the_hubs() -> None:
    node = Node(_cluster(), "h0", spin_us=0).start()
    try:
        hub = ClientHub(node, max_clients=2, spin_us=0).open()
        assert _hub_threads() == []
        _run_one(hub, 1)
        assert node.inspect(lambda n: len(n.loop.links.inbound)) == 2  # type: ignore[union-attr]
        assert hub.stats()["msgs_in"] >= 2  # HELLO, SUBMIT, COMPLETE, BYE
    finally:
        node.stop()


def test_a_hub_closed_while_its_node_runs_leaves_the_loop_reading_its_peers_only() -> None:
    node = Node(_cluster(), "h0", spin_us=0).start()
    try:
        hub = ClientHub(node, max_clients=2).open()
        _run_one(hub, 1)
        hub.close()
        hub.close()  # twice: nothing more
        assert node.inspect(lambda n: len(n.loop.links.inbound)) == 0  # type: ignore[union-attr]
        done: list[int] = []
        node.on_dispatch(lambda t, slot: (done.append(t.id), node.complete(t.id)))
        node.submit(2)  # the node goes on, its loop unharmed
        assert _wait(lambda: done == [2]), done
        again = ClientHub(node, max_clients=1).open()  # and serves clients again
        _run_one(again, 3)
        again.close()
    finally:
        node.stop()


def _wait(cond: Any, timeout_s: float = 10.0) -> bool:
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_a_preemption_writes_the_start_it_makes_room_for_before_the_victims_stop(
    monkeypatch: Any,
) -> None:
    """The one loop thread writes both notices; each write may wake a rank's reader, which
    the kernel may run at once in the loop's place (a sleeper woken outranks a thread that
    has been running). Written START first, the critical task is not kept waiting for the
    victim's reader (docs/CLIENT.md, "Preemption")."""
    from rdmasched.clientproto import OP_START, OP_STOP

    written: list[tuple[int, int]] = []
    send = ClientHub._send

    def logged(self: ClientHub, k: int, kind: int, id: int = 0, *a: Any, **kw: Any) -> None:
        op = a[6] if len(a) > 6 else kw.get("hops", 0)
        if op in (OP_START, OP_STOP):
            written.append((op, id))
        send(self, k, kind, id, *a, **kw)

    monkeypatch.setattr(ClientHub, "_send", logged)
    cfg = ClusterConfig.from_dict(
        {
            "cluster": {"name": f"po{os.getpid()}-{uuid.uuid4().hex[:6]}", "heartbeat_ms": 20},
            "node": [{"name": "h0", "slots": 1}],
        }
    )
    node = Node(cfg, "h0", spin_us=0).start()
    try:
        hub = ClientHub(node, max_clients=2).open()
        with Client(hub.endpoint, 0, spin_us=0) as low, Client(hub.endpoint, 1) as high:
            low.on_dispatch(lambda t, slot: None)
            low.on_preempt(lambda t, slot, cancel: 0)
            started: list[int] = []
            high.on_dispatch(lambda t, slot: started.append(t.id))
            low.submit(1, priority=1)
            assert _wait(lambda: written == [(OP_START, 1)]), written
            high.submit(2, priority=200)
            assert high.wait_for(lambda: started == [2], 10)
            assert written[1:] == [(OP_START, 2), (OP_STOP, 1)], written
            high.complete(2)
            high.flush()
    finally:
        node.stop()


def test_on_one_clients_lane_the_stop_still_comes_before_the_start(monkeypatch: Any) -> None:
    """A rank's own low-priority work preempted for its own high-priority task: the STOP is
    handled before the START on that rank (its co-located work is stopped before its step
    runs, docs/TORCH.md)."""
    order: list[str] = []
    cfg = ClusterConfig.from_dict(
        {
            "cluster": {"name": f"pl{os.getpid()}-{uuid.uuid4().hex[:6]}", "heartbeat_ms": 20},
            "node": [{"name": "h0", "slots": 1}],
        }
    )
    node = Node(cfg, "h0", spin_us=0).start()
    try:
        hub = ClientHub(node, max_clients=1).open()
        with Client(hub.endpoint, 0) as rank:
            rank.on_dispatch(lambda t, slot: order.append(f"start {t.id}"))
            rank.on_preempt(lambda t, slot, cancel: order.append(f"stop {t.id}") or 0)
            rank.submit(1, priority=1)
            assert rank.wait_for(lambda: order == ["start 1"], 10), order
            rank.submit(2, priority=200)
            assert rank.wait_for(lambda: len(order) == 3, 10), order
            assert order == ["start 1", "stop 1", "start 2"]
            rank.complete(2)
            rank.flush()
    finally:
        node.stop()


def test_a_task_preempted_by_its_own_sync_hears_the_stop_before_the_sync() -> None:
    """The PyTorch integration's shape: the step's compute task holds the one slot; the
    step's bucket sync (priority 255) preempts it. On the rank's lane the STOP comes before
    the SYNC, as decided, so its answer is in before the sync ends and the slot goes back to
    the compute task, not to lower-priority work queued behind it (the TORCH.md example's
    co-located job ran inside the step when the STOP came after the SYNC)."""
    order: list[str] = []
    cfg = ClusterConfig.from_dict(
        {
            "cluster": {"name": f"ps{os.getpid()}-{uuid.uuid4().hex[:6]}", "heartbeat_ms": 20},
            "node": [{"name": "h0", "slots": 1}],
        }
    )
    node = Node(cfg, "h0", spin_us=0).start()
    try:
        hub = ClientHub(node, max_clients=1).open()
        with Client(hub.endpoint, 0) as rank:
            rank.on_dispatch(lambda t, slot: order.append(f"start {t.id}"))
            rank.on_preempt(lambda t, slot, cancel: order.append(f"stop {t.id}") or 0)
            rank.on_sync(lambda t, slot: order.append("sync") or True)
            rank.define_group(7, rank.nodes, local=1)
            rank.dispatch(1, priority=200)
            assert rank.wait_for(lambda: order == ["start 1"], 10), order
            rank.sync_ready(7, 0)
            assert rank.wait_for(lambda: len(order) >= 3, 10), order
            assert order[:3] == ["start 1", "stop 1", "sync"], order
    finally:
        node.stop()
