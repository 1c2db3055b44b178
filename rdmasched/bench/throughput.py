"""`rdmasched bench throughput`: one lane's messages/s, per-message API and batch API.

A sender process writes n DISPATCH messages as fast as the lane's credit lets it; a receiver
process drains them. The rate is taken at the receiver, first message to last, and the
receiver checks that every message number arrived once, in order.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from rdmasched.bench.common import run_pair


def _rx_lane(cfg: dict[str, Any]) -> Any:
    from rdmasched.transport import shm

    return shm.create_lane(cfg["lane"], cfg["nslots"])


def _tx_lane(cfg: dict[str, Any]) -> Any:
    from rdmasched.transport import shm

    deadline = time.monotonic() + 10
    while True:
        try:
            return shm.attach_lane(cfg["lane"], src=1, timeout_us=10_000_000)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)


def sender(cfg: dict[str, Any]) -> float:
    from rdmasched import Batch

    with _tx_lane(cfg) as tx:
        n, batch_size = cfg["n"], cfg["batch"]
        t0 = time.perf_counter()
        if batch_size <= 1:
            send = tx.send
            for i in range(n):
                send(1, i)
        else:
            b = Batch(batch_size)
            for i in range(batch_size):
                b.append(1, i, 7, 3)
            for _ in range(n // batch_size):
                tx.send_batch(b)
        rate: float = n / (time.perf_counter() - t0)
        return rate


def receiver(cfg: dict[str, Any]) -> dict[str, float]:
    from rdmasched import Batch

    with _rx_lane(cfg) as rx:
        n, batch_size = cfg["n"], cfg["batch"]
        got = 0
        t0 = 0.0
        if batch_size <= 1:
            poll = rx.poll
            m = poll(10_000_000)
            t0 = time.perf_counter()
            got = 1
            while got < n:
                m = poll(10_000_000)
                if m is None:
                    raise TimeoutError(f"sender went quiet after {got} messages")
                got += 1
        else:
            b = Batch(max(batch_size, 256))
            deadline = time.monotonic() + 60
            while got < n:
                b.clear()
                k = rx.drain(b)
                if k and not got:
                    t0 = time.perf_counter()
                got += k
                if not k and time.monotonic() > deadline:
                    raise TimeoutError(f"sender went quiet after {got} messages")
        dt = time.perf_counter() - t0
        st = rx.stats()
        if st["delivered"] != n or st["gaps"]:
            raise RuntimeError(f"lane lost messages: {st}")
        return {"msgs_per_s": (n - 1) / dt if dt > 0 else 0.0, "delivered": st["delivered"]}


def run(n: int, batch: int, nslots: int = 1024) -> dict[str, Any]:
    if batch > 1:
        n -= n % batch
    cfg = {"n": n, "batch": batch, "nslots": nslots, "lane": f"tput-{uuid.uuid4().hex[:10]}"}
    rx_res, tx_rate = run_pair(receiver, sender, cfg)
    name = "batch" if batch > 1 else "per-message"
    return {
        "name": name,
        "batch": batch,
        "messages": n,
        "slots": nslots,
        "msgs_per_s": rx_res["msgs_per_s"],
        "sender_msgs_per_s": tx_rate,
    }


def from_args(args: argparse.Namespace) -> dict[str, Any]:
    """`rdmasched bench throughput`'s figures from its parsed options (the command prints them,
    `bench all` stores them)."""
    return {
        "results": [
            run(args.messages, 1, args.lane_slots),
            run(args.messages, args.batch, args.lane_slots),
        ]
    }
