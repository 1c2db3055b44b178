"""A live node's telemetry: its Prometheus endpoint scraped, its events read and exported
(issue 11 items 3 and 4). Two node daemons on shm, in this process."""

from __future__ import annotations

import os
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rdmasched import launch
from rdmasched.cli import main
from rdmasched.cluster import local_cluster
from rdmasched.daemon.node import Node
from rdmasched.views import live
from tests.telemetry_deps import need
from tests.waiting import wait_for

parser = need("prometheus_client.parser")


@pytest.fixture
def pair() -> Iterator[tuple[Node, Node]]:
    c = local_cluster(2, 1, name=f"t{os.getpid()}-{uuid.uuid4().hex[:6]}")
    n0 = Node(c, 0, spin_us=50)
    n1 = Node(c, 1, spin_us=50)
    launch.serve_metrics(n1, 0)
    n1.on_dispatch(lambda task, slot: None)
    n1.on_preempt(lambda task, slot, cancel: task.progress_ns + 10)
    t = threading.Thread(target=n1.open)
    t.start()
    n0.open()
    t.join()
    n0.start()
    n1.start()
    try:
        yield n0, n1
    finally:
        n1.stop()
        n0.stop()


def scrape(port: int) -> dict[str, Any]:
    """name -> {labels tuple: value} of every sample."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, Any] = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(m: dict[str, Any], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for k, v in m.get(name, {}).items() if want <= set(k))


def test_metrics_are_off_unless_a_port_is_given() -> None:
    n = Node(local_cluster(1, 1, name=f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"), 0)
    n.open()
    try:
        assert n.metrics is None
    finally:
        n.stop()


def test_a_live_node_serves_its_metrics(pair: tuple[Node, Node]) -> None:
    n0, n1 = pair
    port = n1.metrics.port
    for t in (1, 2, 3):  # one slot: 1 starts, 2 and 3 queue
        n1.dispatch(t, job=4, priority=10, cost_ns=10**9)
    n1.flush()
    n0.preempt(1, node=1)  # a PREEMPT over the lane: 1 yields, 2 starts, 1 requeues
    wait_for(lambda: n1.reactions.count >= 1)
    wait_for(lambda: n1.members.views[0].alive)
    m = scrape(port)
    assert value(m, "rdmasched_messages_total", node="1", direction="received", kind="PREEMPT") == 1
    assert (
        value(m, "rdmasched_messages_total", node="1", direction="received", kind="HEARTBEAT") >= 1
    )
    assert value(m, "rdmasched_messages_total", node="1", direction="sent", kind="HEARTBEAT") >= 1
    assert value(m, "rdmasched_decisions_total", decision="queue", rule="no_slot") == 2
    assert value(m, "rdmasched_decisions_total", decision="start", rule="free_slot") == 1
    assert value(m, "rdmasched_decisions_total", decision="preempt", rule="peer") == 1
    assert value(m, "rdmasched_decisions_total", decision="start", rule="head") == 1
    assert value(m, "rdmasched_queue_depth", priority_class="0-31") == 2
    assert value(m, "rdmasched_queue_depth", priority_class="sync") == 0
    # every start: 1 on a free slot (no wait), then 2 from the queue (a wait)
    assert value(m, "rdmasched_wait_seconds_count", priority_class="0-31") == 2
    assert value(m, "rdmasched_wait_seconds_sum", priority_class="0-31") > 0
    assert value(m, "rdmasched_preempt_reaction_seconds_count") == 1
    assert value(m, "rdmasched_peers_alive", node="1") == 1
    assert value(m, "rdmasched_running", node="1") == 1
    assert any(("peer", "0") in k for k in m["rdmasched_lane_occupancy"])
    assert value(m, "rdmasched_bad_slots_total", reason="bad_crc") == 0
    # a second scrape does not count the same events twice
    m2 = scrape(port)
    assert value(m2, "rdmasched_wait_seconds_count", priority_class="0-31") == 2
    assert value(m2, "rdmasched_events_lost_total") == 0


def test_a_live_nodes_events_are_read_and_exported(pair: tuple[Node, Node], tmp_path: Any) -> None:
    pb2 = need("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    n0, n1 = pair
    port = n1.metrics.port
    n1.dispatch(1, job=4, priority=10, cost_ns=10**9)
    n1.dispatch(2, job=4, priority=10, cost_ns=10**9)
    n1.flush()  # both held on node 1 before the PREEMPT can arrive
    n0.preempt(1, node=1)
    wait_for(lambda: n1.reactions.count >= 1)
    tr = live.fetch(f"127.0.0.1:{port}")
    assert tr.node == 1 and "anchor" in tr.head and tr.head["missed"] == 0
    pre = [e for e in tr.events if e.decision == "preempt"]
    assert len(pre) == 1 and pre[0].cause == "PREEMPT" and pre[0].cause_src == 0
    after = live.fetch(f"127.0.0.1:{port}", since=pre[0].seq or 0)
    assert after.events[0] == pre[0]
    out = str(tmp_path / "live.pftrace")
    assert main(["trace", "export", "--live", f"127.0.0.1:{port}", "-o", out]) == 0
    trace = pb2.Trace()
    with open(out, "rb") as f:
        trace.ParseFromString(f.read())
    names = {p.track_event.name for p in trace.packet if p.HasField("track_event")}
    assert "task 1" in names and "preempt task 1" in names
