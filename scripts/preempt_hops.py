"""Where the time of `bench peers` workload c goes: a high-priority no-op, submitted while
every slot runs 50 ms low-priority tasks, hop by hop (docs/PERFORMANCE-LOG.md, "A
preemption through the daemon, hop by hop").

    .venv/bin/python scripts/preempt_hops.py [--spin-us N] [--samples 100]

The daemon (a `Node` and its `ClientHub`) runs in this process and 4 client processes run
bench peers' own client (`rdmasched.bench.peers._client_main`, 2 background tasks each, a
critical one every 65 ms from client 0), as `bench peers` does; a diagnostic, not a
benchmark: it wraps methods of the hub and the client with a clock read (CLOCK_MONOTONIC,
one clock for every process of the host) at each hop of a critical task:

    submit   client 0 calls Client.submit             (and `returned`: the call is back)
    loop     the node's loop has read it              (ClientHub._handle_all)
    handle   ... and handles the SUBMIT               (ClientHub._handle)
    preempt  the victim's preempt handler is entered  (ClientHub._on_preempt)
    start    the START notice is written (and rung)   (ClientHub._send)
    stop     then the victim's STOP (and rung)        (ClientHub._send)
    rx       client 0's reader thread has it          (Client._on_message)
    work     the task's first line: in the reader's dispatch handler for a no-op
             (bench peers' _Worker._dispatch), else on a work thread (_Worker._run)

Then two figures of this host, measured in the same run, to compare the hops with: a
Python thread woken through a lock by another after 65 ms asleep (the floor of one
wake-up: what every hop between threads costs at least), and the cost of the node core's
decision itself, `NodeCore.submit`, back to back and after 65 ms of other work (the clock
moved on, the caches went to others).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from typing import Any

CRIT = 1 << 39  # bench peers' critical task ids
HOPS = [
    ("submit", "returned"),
    ("submit", "loop"),
    ("loop", "handle"),
    ("handle", "preempt"),
    ("preempt", "start"),
    ("start", "stop"),
    ("start", "rx"),
    ("rx", "work"),
    ("submit", "work"),
]
_ctx = mp.get_context("spawn")


def _client(endpoint: str, k: int, conn: Any, stop_bg: Any, spin: int | None, out: str) -> None:
    from rdmasched import client as cm
    from rdmasched.bench import peers

    rec: list[tuple[str, int, int]] = []
    on_message, submit = cm.Client._on_message, cm.Client.submit
    dispatch, run = peers._Worker._dispatch, peers._Worker._run

    def on_message_(self: Any, m: Any) -> None:
        if m.hops == cm.OP_START and m.id & CRIT:
            rec.append(("rx", m.id, time.monotonic_ns()))
        on_message(self, m)

    def submit_(self: Any, tid: int, *a: Any, **kw: Any) -> Any:
        rec.append(("submit", tid, time.monotonic_ns()))
        r = submit(self, tid, *a, **kw)
        rec.append(("returned", tid, time.monotonic_ns()))
        return r

    def dispatch_(self: Any, task: Any, slot: int) -> None:
        if peers.runs_inline(task):
            rec.append(("work", task.id, time.monotonic_ns()))
        dispatch(self, task, slot)

    def run_(self: Any, tid: int, *a: Any) -> None:
        rec.append(("work", tid, time.monotonic_ns()))
        run(self, tid, *a)

    cm.Client._on_message = on_message_  # type: ignore[method-assign]
    cm.Client.submit = submit_  # type: ignore[method-assign]
    peers._Worker._dispatch = dispatch_  # type: ignore[method-assign]
    peers._Worker._run = run_  # type: ignore[method-assign]
    try:
        peers._client_main(endpoint, k, 6, conn, stop_bg, spin)
    finally:
        with open(out, "w") as f:
            json.dump([r for r in rec if r[1] & CRIT], f)


def hops(spin: int | None, samples: int) -> dict[str, list[int]]:
    """The hops of `samples` critical tasks (ns each)."""
    from rdmasched.bench.handoff import _cluster
    from rdmasched.clientproto import OP_START, OP_STOP, OP_SUBMIT, endpoint_name
    from rdmasched.daemon.clients import ClientHub
    from rdmasched.daemon.node import Node

    slots, name = 4, f"hops{uuid.uuid4().hex[:8]}"
    rec: list[tuple[str, int, int]] = []
    last_stop = [0, 0]  # (entered the preempt handler, STOP written): the latest
    cls = ClientHub
    handle_all, handle = cls._handle_all, cls._handle
    on_preempt, send = cls._on_preempt, cls._send

    def handle_all_(self: Any, msgs: list[Any]) -> None:
        now = time.monotonic_ns()
        crit = [m[3] for m in msgs if m[1] == OP_SUBMIT and m[3] & CRIT]
        rec.extend(("loop", tid, now) for tid in crit)
        handle_all(self, msgs)
        for tid in crit:  # the victim's STOP belongs to the critical task of this batch
            if last_stop[1] >= now:
                rec.extend((("preempt", tid, last_stop[0]), ("stop", tid, last_stop[1])))

    def handle_(self: Any, k: int, op: int, kind: int, id: int, *a: Any) -> None:
        if op == OP_SUBMIT and id & CRIT:
            rec.append(("handle", id, time.monotonic_ns()))
        handle(self, k, op, kind, id, *a)

    def on_preempt_(self: Any, task: Any, slot: int, cancel: bool) -> Any:
        last_stop[0] = time.monotonic_ns()
        return on_preempt(self, task, slot, cancel)

    def send_(self: Any, k: int, kind: int, id: int = 0, *a: Any, **kw: Any) -> None:
        send(self, k, kind, id, *a, **kw)
        op = a[6] if len(a) > 6 else kw.get("hops", 0)
        if op == OP_STOP:
            last_stop[1] = time.monotonic_ns()
        elif op == OP_START and id & CRIT:
            rec.append(("start", id, time.monotonic_ns()))

    cls._handle_all = handle_all_  # type: ignore[method-assign]
    cls._handle = handle_  # type: ignore[method-assign]
    cls._on_preempt = on_preempt_  # type: ignore[method-assign]
    cls._send = send_  # type: ignore[method-assign]
    kw = {} if spin is None else {"spin_us": spin}
    node = Node(_cluster(name, slots, 50), "h0", **kw).start()
    hub = ClientHub(node, max_clients=slots, **kw).open()
    stop_bg = _ctx.Event()
    conns, procs, outs = [], [], []
    tmp = tempfile.mkdtemp(prefix="preempt-hops")
    try:
        for k in range(slots):
            a, b = _ctx.Pipe()
            outs.append(os.path.join(tmp, f"client{k}.json"))
            args = (endpoint_name(name, "h0"), k, b, stop_bg, spin, outs[-1])
            procs.append(_ctx.Process(target=_client, args=args))
            procs[-1].start()
            conns.append(a)
        for c in conns:
            if not c.poll(120):
                raise RuntimeError("a client did not connect in 120 s")
            c.recv()
        for c in conns:
            c.send(("warmup", {"tasks": 50, "inflight": 4}))
        for c in conns:
            c.recv()
        for k, c in enumerate(conns):
            p = {"bg_ms": 50.0, "inflight": 2, "samples": samples if k == 0 else 0}
            c.send(("mixed", p | {"crit_ms": 0.0, "period_ms": 65.0, "settle_s": 0.3}))
        conns[0].recv()
        stop_bg.set()
        for c in conns[1:]:
            c.recv()
        for c in conns:
            c.send(("quit", {}))
        for proc in procs:
            proc.join(30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        hub.close()
        node.stop()
    for out in outs:
        with open(out) as f:
            rec.extend(tuple(r) for r in json.load(f))  # type: ignore[misc]
    at: dict[int, dict[str, int]] = {}
    for point, tid, t in rec:
        at.setdefault(tid, {}).setdefault(point, t)
    return {f"{a} -> {b}": [e[b] - e[a] for e in at.values() if a in e and b in e] for a, b in HOPS}


def cold_wake(rounds: int = 30) -> list[int]:
    """ns from a lock's release to the return of the thread asleep on it (after 65 ms)."""
    import threading

    lock, woke, ts = threading.Lock(), [0], []
    lock.acquire()
    done = threading.Event()

    def waiter() -> None:
        for _ in range(rounds):
            lock.acquire()
            woke[0] = time.monotonic_ns()
            done.set()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    for _ in range(rounds):
        time.sleep(0.065)
        done.clear()
        t0 = time.monotonic_ns()
        lock.release()
        done.wait(5)
        ts.append(woke[0] - t0)
    t.join(5)
    return ts


def cold_submit(rounds: int = 30) -> dict[str, list[int]]:
    """`NodeCore.submit` of a task that queues (4 slots busy), ns, back to back and
    after 65 ms of a spin that keeps this thread on its vCPU (warm in the CPU, cold in the
    caches the node core uses)."""
    from rdmasched.bench.handoff import _cluster
    from rdmasched.daemon.node import Node

    node = Node(_cluster(f"cold{uuid.uuid4().hex[:8]}", 4, 50), "h0")
    node.on_dispatch(lambda t, s: None)
    node.open()
    core, tid, out = node.core, 0, {}  # type: ignore[var-annotated]
    try:
        for i in range(4):
            node.carry_out(core.submit(node.new_task(i + 1, cost_ns=10**12), node.clock(), 0))
        for mode in ("back to back", "after 65 ms"):
            ts = []
            for _ in range(rounds):
                if mode != "back to back":
                    t_end = time.monotonic() + 0.065
                    while time.monotonic() < t_end:
                        pass
                tid += 1
                task = node.new_task(1000 + tid, cost_ns=0)
                now = node.clock()
                t0 = time.perf_counter_ns()
                effects = core.submit(task, now, 0)
                ts.append(time.perf_counter_ns() - t0)
                node.carry_out(effects)
                node.carry_out(core.preempt(1000 + tid, None, True, node.clock()))
            out[mode] = ts
    finally:
        node.stop()
    return out


def main() -> int:
    from rdmasched.stats import percentile_us

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spin-us", type=int, default=None, help="daemon and clients")
    ap.add_argument("--samples", type=int, default=100)
    args = ap.parse_args()
    print(f"load {os.getloadavg()[0]:.2f}; spin {args.spin_us}; {args.samples} critical tasks")
    for hop, d in hops(args.spin_us, args.samples).items():
        if d:
            p50, p90, p99 = (percentile_us(d, q) or 0.0 for q in (50, 90, 99))
            print(f"  {hop:<20} n={len(d):<4} p50 {p50:7.1f}  p90 {p90:7.1f}  p99 {p99:7.1f} us")
    print(f"  a thread woken after 65 ms asleep: p50 {percentile_us(cold_wake(), 50):.1f} us")
    for mode, ts in cold_submit().items():
        print(f"  NodeCore.submit, {mode}: p50 {percentile_us(ts, 50):.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
