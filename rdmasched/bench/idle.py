"""`rdmasched bench idle`: what an idle node daemon costs, in % of one core.

N real node daemons (shm) on this host with nothing to do but heartbeats: after the spin
window each sleeps on its doorbell futex until a peer's heartbeat rings it or its own
heartbeat timer fires. CPU time (user + system) of each node process over `seconds`,
read from the kernel, divided by the wall time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
import uuid
from typing import Any

ctx = mp.get_context("fork")


def _node(name: str, n: int, i: int, seconds: float, spin_us: int, out: Any) -> None:
    from rdmasched.cluster import ClusterConfig
    from rdmasched.daemon.node import Node

    c = ClusterConfig.from_dict(
        {"cluster": {"name": name}, "node": [{"name": f"n{k}", "slots": 4} for k in range(n)]}
    )
    node = Node(c, i, spin_us=spin_us)
    node.open()
    try:
        node.run(until=lambda: True)  # one pass: connect, first timers
        t0, c0 = time.monotonic(), os.times()
        end = t0 + seconds
        node.run(until=lambda: time.monotonic() > end)
        c1, t1 = os.times(), time.monotonic()
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        out.put((i, 100.0 * cpu / (t1 - t0), node.stats()["msgs_in"]))
    finally:
        node.stop()


def run(nodes: int = 4, seconds: float = 5.0, spin_us: int = 200) -> dict[str, Any]:
    name = f"idle{uuid.uuid4().hex[:8]}"
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_node, args=(name, nodes, i, seconds, spin_us, q), daemon=True)
        for i in range(nodes)
    ]
    for p in procs:
        p.start()
    res = sorted(q.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join(10)
    pct = [r[1] for r in res]
    return {
        "nodes": nodes,
        "seconds": seconds,
        "spin_us": spin_us,
        "cpu_pct_per_node": pct,
        "max_cpu_pct": max(pct),
        "msgs_per_node": [r[2] for r in res],
    }


def from_args(args: argparse.Namespace) -> dict[str, Any]:
    """`rdmasched bench idle`'s figures from its parsed options (the command prints them,
    `bench all` stores them)."""
    return run(args.nodes, args.seconds, args.spin_us)
