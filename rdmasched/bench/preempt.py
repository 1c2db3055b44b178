"""`rdmasched bench preempt`: preemption reaction through the node daemon, on shm.

Two node daemons (the real `Node`), pinned to the two cores. Node 1 runs long tasks on its
execution slots; node 0 sends PREEMPT for one of them every `interval_us`. Reaction is the
time from the PREEMPT slot's trigger stamp (node 0's clock just before it writes the slot)
to node 1's preempt handler being entered: lane, poll loop, scheduler decision, handler
call. Node 1's scheduler requeues the task and restarts it at once, so there is always a
task to preempt. Node 1 spins for `spin_us` after every message, longer than the interval,
so it is polling when the PREEMPT lands, as a node under load is; a node that has gone to
sleep on its doorbell pays a kernel wake-up on top (see the demo's figures).

Shutdown: the side that is done stops its loop and says so; the other stops its loop too;
only when both loops have stopped do they close their lanes, so neither sees the other as a
dead peer.

Baseline in the same run: the C floor's one-way time (half its round trip).
"""

from __future__ import annotations

import multiprocessing as mp
import time
import uuid
from typing import Any

from rdmasched.bench.common import run_pair
from rdmasched.stats import Histogram


def _victim(cfg: dict[str, Any]) -> dict[str, Any]:
    from rdmasched.cluster import local_cluster
    from rdmasched.daemon.node import Node

    cluster = local_cluster(2, cfg["slots"], name=cfg["cluster"])
    node = Node(cluster, 1, spin_us=cfg["spin_us"])
    node.on_dispatch(lambda task, slot: None)  # "runs" until preempted
    node.on_preempt(lambda task, slot, cancel: task.progress_ns + 1000)
    node.open()
    done, total = cfg["done"], cfg["n"] + cfg["warmup"]
    try:
        for k in range(cfg["slots"]):
            node.dispatch(k + 1, job=1, priority=10, cost_ns=10**12)
        node.run(until=lambda: node.reactions.count >= total or bool(done[0]))
        return {"samples": node.reactions.samples[cfg["warmup"] :], "stats": _end(node, 1, cfg)}
    finally:
        node.stop()


def _end(node: Any, side: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """A side's loop has stopped: say so, and close only once the other's has stopped too
    (a node closing its lanes while its peer still sends is, to the peer, a dead node)."""
    cfg["done"][side] = 1
    cfg["stopped"].wait(60)
    stats: dict[str, Any] = node.stats()
    return stats


def _preemptor(cfg: dict[str, Any]) -> dict[str, Any]:
    from rdmasched.cluster import local_cluster
    from rdmasched.daemon.node import Node

    cluster = local_cluster(2, cfg["slots"], name=cfg["cluster"])
    node = Node(cluster, 0, spin_us=0)
    node.open()
    sent = 0
    total = cfg["n"] + cfg["warmup"]
    done = cfg["done"]
    interval = cfg["interval_us"] * 1000

    last_sent = [0.0]

    def fire() -> None:
        nonlocal sent
        if sent < total + 50 and not done[1]:  # a few spare, in case some find the slot changing
            node.preempt(1 + sent % cfg["slots"], node=1)
            sent += 1
            last_sent[0] = time.monotonic()
            assert node.loop is not None
            node.loop.call_later(interval, fire)

    def finished() -> bool:
        # the victim has its samples; or all are sent and it had 5 s to read them
        now = time.monotonic()
        return bool(done[1]) or now > deadline or (sent >= total + 50 and now > last_sent[0] + 5)

    try:
        assert node.loop is not None
        node.loop.call_later(50_000_000, fire)  # let node 1 start its tasks first
        deadline = time.monotonic() + 60 + total * interval / 1e9
        node.run(until=finished)
        return {"sent": sent, "stats": _end(node, 0, cfg)}
    finally:
        node.stop()


def run_daemons(n: int, interval_us: int, spin_us: int, slots: int) -> dict[str, Any]:
    """The two node daemons only: the reaction samples, and how each side ended."""
    cfg = {
        "n": n,
        "warmup": 200,
        "interval_us": interval_us,
        "spin_us": spin_us,
        "slots": slots,
        "cluster": f"pb{uuid.uuid4().hex[:8]}",
        # fork: both sides share these; [0] preemptor done, [1] victim done
        "done": mp.get_context("fork").RawArray("i", 2),
        "stopped": mp.get_context("fork").Barrier(2),
    }
    victim, preemptor = run_pair(_victim, _preemptor, cfg, timeout_s=120 + n * interval_us / 1e6)
    sides = {"victim": victim["stats"], "preemptor": preemptor["stats"]}
    return {
        "samples": victim["samples"],
        "dead_peers": {k: st["dead_peers"] for k, st in sides.items()},
        "dropped": {k: st["dropped"] for k, st in sides.items()},
    }


def run(
    n: int = 20_000, interval_us: int = 200, spin_us: int = 5_000, slots: int = 4
) -> dict[str, Any]:
    from rdmasched.bench import latency

    res = run_daemons(n, interval_us, spin_us, slots)
    h = Histogram(res["samples"])
    s = h.summary()
    floor, _ = latency.run_row("c-shm-floor", 100_000, 2_000)
    one_way = floor.p50_us / 2
    return {
        "preempts": s["n"],
        "interval_us": interval_us,
        "spin_us": spin_us,
        "reaction_p50_us": s["p50"],
        "reaction_p99_us": s["p99"],
        "reaction_p999_us": s["p999"],
        "reaction_max_us": s["max"],
        "reaction_mean_us": s["mean"],
        "reaction_stddev_us": s["stddev"],
        "floor_one_way_us": one_way,
        "p50_over_floor": s["p50"] / one_way if one_way else None,
    }
