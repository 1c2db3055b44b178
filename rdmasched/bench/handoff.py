"""`rdmasched bench handoff`: how fast a call made on another thread reaches the node's
loop, and how many tasks a daemon runs for its client ranks.

Two figures (docs/PERFORMANCE-LOG.md, "Hand-off"):

- **submit -> on_dispatch**: a one-node daemon in this process; the main thread calls
  `Node.submit` and waits for the dispatch handler (on the loop's thread) to run, then makes
  the next call at once (the loop is still spinning, or between its inbox and its doorbell:
  the case a lost wake-up hit) or after `pause_ms` (the loop has gone to sleep). The time
  from the call to the handler's entry, p50/p99 (us).
- **tasks/s through a daemon**: one daemon (this process, `slots` slots, a `ClientHub`) and
  `ranks` client processes (`rdmasched.client.Client`), each keeping `inflight` tasks
  submitted and completing each one in its dispatch handler; the tasks of all the ranks over
  the wall time from the first submit to the last completion.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import uuid
from typing import Any

from rdmasched.cluster import ClusterConfig
from rdmasched.stats import percentile_us

__all__ = ["client_throughput", "report", "run", "submit_latency"]

_ctx = mp.get_context("fork")  # ranks are forked before the daemon starts a thread


def _cluster(name: str, slots: int, heartbeat_ms: int) -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "cluster": {
                "name": name,
                "heartbeat_ms": heartbeat_ms,
                "dead_after_ms": max(500, 10 * heartbeat_ms),
            },
            "node": [{"name": "h0", "slots": slots}],
        }
    )


def submit_latency(
    calls: int = 2000, pause_ms: float = 0.0, heartbeat_ms: int = 50, spin_us: int = 200
) -> dict[str, Any]:
    """Cross-thread `Node.submit` -> dispatch handler entry, p50/p99 in us."""
    from rdmasched.daemon.node import Node
    from rdmasched.scheduler import Task

    node = Node(_cluster(f"ho{uuid.uuid4().hex[:8]}", 1, heartbeat_ms), "h0", spin_us=spin_us)
    entered = [0]
    ran = threading.Event()

    def dispatched(t: Task, slot: int) -> None:
        entered[0] = time.monotonic_ns()
        ran.set()
        node.complete(t.id)  # queued: runs once the handler returns

    node.on_dispatch(dispatched)
    node.start()
    lat: list[int] = []
    try:
        for i in range(calls):
            if pause_ms:
                time.sleep(pause_ms / 1000)
            ran.clear()
            t0 = time.monotonic_ns()
            node.submit(i + 1)
            if not ran.wait(10):
                raise RuntimeError(f"submit {i + 1}: the handler did not run within 10 s")
            lat.append(entered[0] - t0)
    finally:
        node.stop()
    return {
        "calls": calls,
        "pause_ms": pause_ms,
        "heartbeat_ms": heartbeat_ms,
        "spin_us": spin_us,
        "p50_us": percentile_us(lat, 50.0),
        "p99_us": percentile_us(lat, 99.0),
        "max_us": max(lat) / 1000,
    }


def _rank(endpoint: str, k: int, tasks: int, inflight: int, go: Any, out: Any) -> None:
    from rdmasched.client import Client
    from rdmasched.scheduler import Task

    try:
        client = Client(endpoint, k, connect_timeout_s=60).open()
    except BaseException as exc:
        out.put((k, 0, 0, 0, repr(exc), 0.0))
        return
    done = [0]
    submitted = [0]
    t_end = [0]
    base = (k + 1) << 40  # task ids unique across the ranks (one origin: the host)

    def submit_one() -> None:
        submitted[0] += 1
        client.submit(base + submitted[0])

    def dispatched(t: Task, slot: int) -> None:
        client.complete(t.id)
        done[0] += 1
        if submitted[0] < tasks:
            submit_one()
        if done[0] == tasks:
            t_end[0] = time.monotonic_ns()

    client.on_dispatch(dispatched)
    out.put((k, -1, 0, 0, None, 0.0))  # ready
    go.wait(120)
    c0 = os.times()
    t0 = time.monotonic_ns()
    err = None
    try:
        for _ in range(min(inflight, tasks)):
            submit_one()
        if not client.wait_for(lambda: done[0] >= tasks, 300):
            err = f"rank {k}: {done[0]} of {tasks} tasks done in 300 s"
    except BaseException as exc:
        err = repr(exc)
    finally:
        c1 = os.times()
        cpu = c1.user - c0.user + c1.system - c0.system
        out.put((k, done[0], t0, t_end[0], err, cpu))
        client.close()


def client_throughput(
    ranks: int = 4,
    tasks: int = 5000,
    inflight: int = 32,
    slots: int = 4,
    spin_us: int = 200,
    heartbeat_ms: int = 50,
) -> dict[str, Any]:
    """Tasks per second through one daemon, `ranks` client processes each running `tasks`
    tasks with `inflight` submitted at a time (each completed in its dispatch handler)."""
    from rdmasched.clientproto import endpoint_name
    from rdmasched.daemon.clients import ClientHub
    from rdmasched.daemon.node import Node

    name = f"ht{uuid.uuid4().hex[:8]}"
    endpoint = endpoint_name(name, "h0")
    q = _ctx.Queue()
    go = _ctx.Event()
    procs = [
        _ctx.Process(target=_rank, args=(endpoint, k, tasks, inflight, go, q), daemon=True)
        for k in range(ranks)
    ]
    for p in procs:
        p.start()
    node = Node(_cluster(name, slots, heartbeat_ms), "h0", spin_us=spin_us).start()
    hub = ClientHub(node, max_clients=ranks).open()
    try:
        for _ in procs:
            k, _, _, _, err, _ = q.get(timeout=120)
            if err is not None:
                raise RuntimeError(f"rank {k} did not connect: {err}")
        c0 = os.times()
        go.set()
        res = [q.get(timeout=400) for _ in procs]
        c1 = os.times()
        for p in procs:
            p.join(30)
        errors = [r[4] for r in res if r[4]]
        if errors:
            raise RuntimeError("; ".join(errors))
        t0 = min(r[2] for r in res)
        t1 = max(r[3] for r in res)
        total = sum(r[1] for r in res)
        wall = (t1 - t0) / 1e9
        stats = node.stats()
    finally:
        hub.close()
        node.stop()
        for p in procs:
            if p.is_alive():
                p.kill()
    return {
        "ranks": ranks,
        "tasks_per_rank": tasks,
        "inflight": inflight,
        "slots": slots,
        "tasks": total,
        "seconds": wall,
        "tasks_per_s": total / wall,
        # the daemon process's CPU over the run (its loop thread reads the ranks' lanes too)
        "daemon_cpu_pct": 100.0 * (c1.user - c0.user + c1.system - c0.system) / wall,
        # the rank processes' CPU over the run, summed (100 = one core)
        "ranks_cpu_pct": 100.0 * sum(r[5] for r in res) / wall,
        "daemon_msgs_in": stats["clients"]["msgs_in"] if stats["clients"] else None,
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Every figure of this benchmark, as a dict."""
    calls = 300 if quick else 2000
    tasks = 1000 if quick else 5000
    return {
        "load_avg": os.getloadavg(),
        "submit_back_to_back": submit_latency(calls),
        "submit_heartbeat_200ms": submit_latency(calls, heartbeat_ms=200),
        "submit_after_3ms_pause": submit_latency(calls // 4, pause_ms=3.0),
        "clients_1x1": client_throughput(ranks=1, tasks=tasks // 4, inflight=1, slots=1),
        "clients_4x32": client_throughput(ranks=4, tasks=tasks, inflight=32, slots=4),
        # as many slots as tasks in flight: no task waits for a slot to come back
        "clients_4x32_128_slots": client_throughput(ranks=4, tasks=tasks, inflight=32, slots=128),
    }


def report(figures: dict[str, Any]) -> str:
    """The figures of `run`, a line each."""
    lines = [f"load average {figures['load_avg'][0]:.2f}"]
    for key in ("submit_back_to_back", "submit_heartbeat_200ms", "submit_after_3ms_pause"):
        f = figures[key]
        lines.append(
            f"{key:<24} submit -> on_dispatch  p50 {f['p50_us']:8.1f} us  "
            f"p99 {f['p99_us']:8.1f} us  max {f['max_us']:8.1f} us  ({f['calls']} calls)"
        )
    for key in ("clients_1x1", "clients_4x32", "clients_4x32_128_slots"):
        f = figures[key]
        lines.append(
            f"{key:<24} {f['ranks']} rank(s) x {f['inflight']} in flight: "
            f"{f['tasks_per_s']:9.0f} tasks/s  ({f['tasks']} tasks on {f['slots']} slots; CPU: "
            f"daemon {f['daemon_cpu_pct']:.0f}%, ranks {f['ranks_cpu_pct']:.0f}%)"
        )
    return "\n".join(lines)
