"""The node daemon on shm: clusters of real processes, a killed node, bad input, explain."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rdmasched.cluster import ClusterConfig, local_cluster
from rdmasched.daemon.node import Node
from rdmasched.errors import ConfigError
from rdmasched.scheduler import Decision, Task
from rdmasched.transport import shm
from rdmasched.wire import Kind
from tests.waiting import wait_for

ctx = mp.get_context("fork")

HEARTBEAT_MS = 20
DEAD_AFTER_MS = 200
#: the bound this design gives for noticing a dead peer: silence for dead_after_ms, then the
#: next heartbeat tick (which also re-dispatches its tasks)
DETECT_BOUND_MS = DEAD_AFTER_MS + HEARTBEAT_MS


def cluster(n: int, slots: int) -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "cluster": {
                "name": f"t{os.getpid()}-{uuid.uuid4().hex[:6]}",
                "heartbeat_ms": HEARTBEAT_MS,
                "dead_after_ms": DEAD_AFTER_MS,
            },
            "node": [{"name": f"n{i}", "slots": slots, "domain": f"r{i % 2}"} for i in range(n)],
        }
    )


def worker(c: ClusterConfig, i: int, out: Any, stop: Any, cost_ms: float) -> None:
    """A node whose tasks take `cost_ms`; reports what it started and completed."""
    node = Node(c, i, spin_us=50)
    started: list[int] = []

    @node.on_dispatch
    def run(task: Task, slot: int) -> None:
        started.append(task.id)
        node.call_later(int(cost_ms * 1e6), lambda: node.complete(task.id))

    node.open()
    try:
        node.run(until=lambda: bool(stop.value))
        out.put((i, started, node.stats()))
    finally:
        node.stop()


def submitter(
    c: ClusterConfig,
    n_tasks: int,
    out: Any,
    stop: Any,
    cost_ms: float,
    kill_at: int | None,
    victim_pid: Any,
) -> None:
    """Node 0: submits tasks over time, records every completion (and detection time)."""
    node = Node(c, 0, spin_us=50)
    completions: list[tuple[int, int]] = []
    started: list[int] = []
    submitted = 0
    killed_at: list[float] = []

    @node.on_dispatch
    def run(task: Task, slot: int) -> None:
        started.append(task.id)
        node.call_later(int(cost_ms * 1e6), lambda: node.complete(task.id))

    @node.on_complete
    def done(task_id: int, peer: int) -> None:
        completions.append((task_id, peer))

    def feed() -> None:
        nonlocal submitted
        for _ in range(4):
            if submitted < n_tasks:
                node.submit(submitted, job=1, priority=50, cost_ns=int(cost_ms * 1e6))
                submitted += 1
        if kill_at is not None and submitted >= kill_at and not killed_at:
            os.kill(victim_pid.value, signal.SIGKILL)
            killed_at.append(time.monotonic())
        if submitted < n_tasks:
            node.call_later(2_000_000, feed)

    node.open()
    try:
        node.call_later(100_000_000, feed)  # after the first heartbeats carried loads

        def finished() -> bool:
            if submitted < n_tasks or not _all_local_done(node):
                return False
            return len(set(started) | {t for t, _ in completions}) >= n_tasks

        deadline = time.monotonic() + 60
        node.run(until=lambda: finished() or time.monotonic() > deadline)
        dead_seen = node.loop.dead_peers if node.loop else set()
        st = node.stats()
        out.put((0, started, st, completions, killed_at, sorted(dead_seen), st["scheduler"]))
    finally:
        stop.value = 1
        node.stop()


def _all_local_done(node: Node) -> bool:
    return not node.scheduler.running() and not node.scheduler.queued()


def run_cluster(n_nodes: int, n_tasks: int, kill: int | None) -> dict[int, Any]:
    c = cluster(n_nodes, 2)
    q = ctx.Queue()
    stop = ctx.RawValue("i", 0)
    victim_pid = ctx.RawValue("i", 0)
    procs = {}
    for i in range(1, n_nodes):
        procs[i] = ctx.Process(target=worker, args=(c, i, q, stop, 3.0), daemon=True)
        procs[i].start()
    if kill is not None:
        victim_pid.value = procs[kill].pid
    procs[0] = ctx.Process(
        target=submitter,
        args=(c, n_tasks, q, stop, 3.0, n_tasks // 2 if kill else None, victim_pid),
        daemon=True,
    )
    procs[0].start()
    results: dict[int, Any] = {}
    expected = n_nodes - (1 if kill is not None else 0)
    try:
        while len(results) < expected:
            r = q.get(timeout=90)
            results[r[0]] = r
    finally:
        stop.value = 1
        for p in procs.values():
            p.join(10)
            if p.is_alive():
                p.kill()
        if kill is not None:
            # A node killed with -9 leaves its segments; the next start (or this) clears them.
            removed = shm.remove_stale()
            assert any(f".{kill}.from." in r for r in removed)
    return results


@pytest.mark.slow
def test_four_nodes_under_load_lose_nothing_and_run_nothing_twice() -> None:
    n_tasks = 400
    res = run_cluster(4, n_tasks, kill=None)
    _, started0, _, completions, _, dead, sched0 = res[0]
    started = list(started0)
    for i in (1, 2, 3):
        started += res[i][1]
    assert sorted(started) == list(range(n_tasks))  # each started exactly once
    remote = [t for t, _ in completions]
    assert len(remote) == len(set(remote))  # each completion reported once
    assert sorted(remote + started0) == list(range(n_tasks))
    assert sched0["forwards"] > 0  # placement really spread work
    assert dead == []
    assert res[0][2]["held_by_peers"] == 0  # no record of a forwarded task outlives it
    for i in range(4):
        assert not any(res[i][2]["bad_slots"].values())


@pytest.mark.slow
def test_killed_node_is_detected_and_its_tasks_dispatched_again() -> None:
    n_tasks = 300
    res = run_cluster(4, n_tasks, kill=2)
    _, started0, st0, completions, killed_at, dead, sched0 = res[0]
    assert dead == [2]
    done = {t for t, _ in completions} | set(started0)
    assert done == set(range(n_tasks))  # nothing lost
    remote = [t for t, _ in completions]
    assert len(remote) == len(set(remote))  # nothing completed twice
    assert sched0["redispatches"] > 0
    assert st0["dead_peers"] == [2]
    assert st0["held_by_peers"] == 0  # no stale record left to re-dispatch later (item 16)
    # Detection within the stated bound, measured from the kill to the node being declared
    # dead; 1 s of margin for this shared 2-core machine's scheduling noise.
    assert st0["dead_detected_s"][2] - killed_at[0] < DETECT_BOUND_MS / 1000 + 1.0


# ---- in one process: two nodes on threads ------------------------------------------------------
@pytest.fixture
def pair() -> Iterator[tuple[Node, Node, list[tuple[str, Any]]]]:
    c = cluster(2, 1)
    seen: list[tuple[str, Any]] = []
    a, b = Node(c, 0, spin_us=20), Node(c, 1, spin_us=20)
    for name, n in (("a", a), ("b", b)):
        n.on_dispatch(lambda t, s, name=name: seen.append((f"{name}-start", t.id)))
        n.on_preempt(
            lambda t, s, cancel, name=name: (
                seen.append((f"{name}-preempt", t.id)) or t.progress_ns + 5
            )
        )
        n.on_sync(lambda t, s, name=name: seen.append((f"{name}-sync", t.payload)))
    t = threading.Thread(target=b.open)
    t.start()
    a.open()
    t.join()
    a.start()
    b.start()
    yield a, b, seen
    a.stop()
    b.stop()


def test_preempt_from_a_peer_and_explain(pair: Any) -> None:
    a, b, seen = pair
    b.dispatch(10, job=1, priority=10, cost_ns=10**9)
    wait_for(lambda: ("b-start", 10) in seen)
    a.preempt(10, node=1)
    wait_for(lambda: ("b-preempt", 10) in seen)
    wait_for(lambda: seen.count(("b-start", 10)) == 2)  # requeued, restarted (free slot)
    ev = b.explain(10)
    decisions = [e.decision for e in ev]
    assert Decision.PREEMPT in decisions and decisions.count(Decision.START) >= 2
    assert b.reactions.count == 1


def test_priority_dispatch_preempts_the_lowest(pair: Any) -> None:
    a, b, seen = pair
    b.dispatch(1, job=1, priority=10, cost_ns=10**9)
    wait_for(lambda: ("b-start", 1) in seen)
    a.dispatch(2, to=1, job=1, priority=200, cost_ns=10**9)
    wait_for(lambda: ("b-start", 2) in seen)
    assert ("b-preempt", 1) in seen
    why = b.explain(2)
    assert any(1 in e.beaten for e in why)  # it ran because it beat task 1


def test_sync_released_only_when_every_member_reported(pair: Any) -> None:
    a, b, seen = pair
    a.define_group(5, [0, 1])
    b.define_group(5, [0, 1])
    a.flush()
    b.flush()  # both groups exist before any SYNC_READY is on the wire
    a.sync_ready(5, 0)
    time.sleep(0.1)
    assert not any(k.endswith("-sync") for k, _ in seen)
    b.sync_ready(5, 0)
    wait_for(lambda: ("a-sync", {"step": 0}) in seen and ("b-sync", {"step": 0}) in seen)


def test_bad_input_is_counted_and_the_node_keeps_running(pair: Any) -> None:
    a, b, seen = pair
    a.preempt(999, node=1)  # unknown task on b
    a._call(lambda: a._loop().send(1, Kind.SYNC_READY, 77, 77, 0, 0, 1, 0, 0))  # unknown group
    b.complete(12345)  # never dispatched
    wait_for(lambda: sum(b.rejected.values()) >= 2 and b.stats()["sync_early_kept"] == 1)
    assert b.rejected.get("unknown-task", 0) >= 2  # the PREEMPT and the COMPLETE
    b.dispatch(1, job=1, priority=5, cost_ns=10)  # still serving
    wait_for(lambda: ("b-start", 1) in seen)


def test_api_argument_errors_are_immediate(pair: Any) -> None:
    a, _, _ = pair
    with pytest.raises(ValueError, match="priority"):
        a.submit(1, priority=255)
    with pytest.raises(ValueError, match="task_id"):
        a.dispatch(-1)
    with pytest.raises(ValueError, match="exactly one"):
        a.preempt()
    with pytest.raises(ConfigError, match="no node 9"):
        a.dispatch(1, to=9)
    with pytest.raises(ConfigError, match="not a member"):
        a.define_group(3, [1])


def test_single_node_cluster_runs_without_peers() -> None:
    c = local_cluster(1, 2, name=f"t{os.getpid()}solo")
    started: list[int] = []
    with Node(c, 0) as node:
        node.on_dispatch(lambda t, s: started.append(t.id))
        node.submit(1, priority=3)
        wait_for(lambda: started == [1])


# ---- item 3: sync groups defined and used at once by several processes ---------------------------
def sync_member(
    c: ClusterConfig, i: int, stagger_s: float, steps: int, out: Any, bars: Any
) -> None:
    """Define group 9 and report every step as soon as the last one is released."""
    node = Node(c, i, spin_us=50)
    released: list[int] = []
    node.on_sync(lambda t, s: released.append(t.payload["step"]))
    node.open()
    try:
        node.start()
        bars[0].wait(60)  # every node is up; now all define and report at once
        time.sleep(i * stagger_s)
        node.define_group(9, range(len(c.nodes)))
        for step in range(steps):
            node.sync_ready(9, step)
            deadline = time.monotonic() + 15
            while step not in released and time.monotonic() < deadline:
                time.sleep(0.001)
        out.put((i, list(released), node.stats()["sync_early_kept"]))
        bars[1].wait(60)  # nobody closes its lanes while a peer may still send to it
    finally:
        node.stop()


@pytest.mark.parametrize("stagger_ms", [0, 0, 30, 100])
def test_group_defined_and_used_at_once_releases_on_every_node(stagger_ms: int) -> None:
    n, steps = 3, 4
    c = cluster(n, 1)
    q = ctx.Queue()
    bars = (ctx.Barrier(n), ctx.Barrier(n))
    procs = [
        ctx.Process(target=sync_member, args=(c, i, stagger_ms / 1000, steps, q, bars))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    try:
        got = sorted(q.get(timeout=120) for _ in range(n))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [r[1] for r in got] == [list(range(steps))] * n, got
    if stagger_ms >= 100:  # the first node's reports reached the last before its define
        assert got[-1][2] > 0
