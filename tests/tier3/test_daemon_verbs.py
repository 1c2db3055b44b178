"""The node daemon over real verbs (Soft-RoCE): two `Node`s on the one rxe device.

The same API as on shm; only `cluster.transport = "verbs"` differs. The bootstrap runs over
TCP on loopback, the lanes over RDMA.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.node import Node
from rdmasched.scheduler import Decision
from tests.waiting import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def nodes(device_args: tuple[str | None, int | None]) -> Iterator[tuple[Node, Node, list[Any]]]:
    name, gid = device_args
    os.environ["RDMASCHED_DEVICE"] = name or ""
    if gid is not None:
        os.environ["RDMASCHED_GID_INDEX"] = str(gid)
    c = ClusterConfig.from_dict(
        {
            "cluster": {
                "name": "verbsdaemon",
                "transport": "verbs",
                "token": "tier3-daemon",
                "slots_per_lane": 64,
            },
            "node": [
                {"name": f"n{i}", "slots": 1, "address": f"127.0.0.1:{free_port()}"}
                for i in range(2)
            ],
        }
    )
    seen: list[Any] = []
    a, b = Node(c, 0, spin_us=50), Node(c, 1, spin_us=50)
    for tag, n in (("a", a), ("b", b)):
        n.on_dispatch(lambda t, s, tag=tag: seen.append((f"{tag}-start", t.id)))
        n.on_preempt(
            lambda t, s, cancel, tag=tag: seen.append((f"{tag}-preempt", t.id)) or t.progress_ns
        )
        n.on_sync(lambda t, s, tag=tag: seen.append((f"{tag}-sync", t.payload)))
    opener = threading.Thread(target=b.open)  # both ends of the bootstrap at once
    opener.start()
    a.open()
    opener.join(60)
    a.start()
    b.start()
    try:
        yield a, b, seen
    finally:
        a.stop()
        b.stop()


def test_dispatch_preempt_and_explain_over_verbs(nodes: Any) -> None:
    a, b, seen = nodes
    a.dispatch(7, to=1, job=1, priority=10, cost_ns=10**9)
    wait_for(lambda: ("b-start", 7) in seen)
    a.preempt(7, node=1)
    wait_for(lambda: ("b-preempt", 7) in seen)
    assert Decision.PREEMPT in [e.decision for e in b.explain(7)]
    assert b.reactions.count == 1


def test_sync_over_verbs(nodes: Any) -> None:
    a, b, seen = nodes
    for n in (a, b):
        n.define_group(3, [0, 1])
        n.flush()
    a.sync_ready(3, 0)
    b.sync_ready(3, 0)
    wait_for(lambda: ("a-sync", {"step": 0}) in seen and ("b-sync", {"step": 0}) in seen)


def test_bad_input_over_verbs_is_counted(nodes: Any) -> None:
    a, b, seen = nodes
    a.preempt(999, node=1)
    wait_for(lambda: sum(b.rejected.values()) >= 1)
    a.dispatch(8, to=1, priority=5)
    wait_for(lambda: ("b-start", 8) in seen)
    assert not any(b.stats()["bad_slots"].values())
