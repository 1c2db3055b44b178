"""What a turn on a CPU costs a sleeping loop as more processes share the host's caches
(docs/SIM.md, "Calibration": the host model's `cold_us` and `cache_turns`).

    .venv/bin/python scripts/ring_turns.py [--sizes 2,4,8,16,32,64] [--hops 20000]
                                          [--spin-us 0] [--json]

N processes, each the real `Loop` on shm lanes to its two neighbours, pass one token
around the ring `--hops` times: one process runs at a time, and each turn comes after the
turns of the N-1 others, so its working set has had N-1 others' through the caches since
its own last turn. Printed per size: every process's CPU time (getrusage through the
demo's `Meter`, from the start barrier to its last hop) per hop, and the wall time per
hop. A diagnostic, not a benchmark: a flat line means a turn costs the same whatever ran
before it; a step up at N means the caches hold fewer than N such processes' working sets
(the ring's are small: the demo's nodes, with their scheduler and workload, are larger, so
their step comes sooner).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
import uuid
from typing import Any

from rdmasched.daemon.links import ShmLinks
from rdmasched.daemon.loop import Loop
from rdmasched.demo.runner import Meter, remove_segments
from rdmasched.wire import Kind

ctx = mp.get_context("fork")


def _member(name: str, i: int, n: int, hops: int, spin_us: int, bar: Any, out: Any) -> None:
    peers = sorted({(i - 1) % n, (i + 1) % n})
    links = ShmLinks(name, i, peers)
    loop = Loop(links, spin_us=spin_us)
    done = [False]

    def on_message(m: Any, peer: int) -> None:
        k = m.arg0 + 1
        if k >= hops:  # the last hop: tell both neighbours, who tell theirs
            done[0] = True
            for p in peers:
                loop.send(p, int(Kind.HEARTBEAT), arg0=hops)
            return
        loop.send((i + 1) % n, int(Kind.HEARTBEAT), arg0=k)
        if k + n > hops:  # the token will not come back
            done[0] = True

    try:
        bar.wait(60)
        meter = Meter(loop)
        t0 = time.monotonic()
        if i == 0:
            loop.call_later(1_000_000, lambda: loop.send(1 % n, int(Kind.HEARTBEAT), arg0=0))
        loop.run(on_message, until=lambda: done[0])
        out.send((meter.figures()["cpu_s"], time.monotonic() - t0))
        time.sleep(0.2)  # the neighbours read the last messages before the lanes go
    finally:
        links.close()


def ring(n: int, hops: int, spin_us: int) -> dict[str, float]:
    """One ring of `n` processes (n >= 2): CPU and wall time per hop, us."""
    name = f"ring{os.getpid() % 10000}{uuid.uuid4().hex[:6]}"
    bar = ctx.Barrier(n)
    pipes, procs = [], []
    try:
        for i in range(n):
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_member, args=(name, i, n, hops, spin_us, bar, w), daemon=True)
            p.start()
            procs.append(p)
            pipes.append(r)
        res = []
        for r in pipes:
            if not r.poll(hops * 0.001 + 60):
                raise RuntimeError(f"ring of {n}: a member did not report")
            res.append(r.recv())
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        remove_segments(name, n)
    cpu = sum(c for c, _ in res)
    wall = max(w for _, w in res)
    return {"cpu_us_per_hop": cpu / hops * 1e6, "wall_us_per_hop": wall / hops * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2,4,8,16,32,64")
    ap.add_argument("--hops", type=int, default=20_000)
    ap.add_argument("--spin-us", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(n < 2 for n in sizes) or args.hops < 1 or args.spin_us < 0:
        ap.error("sizes >= 2, --hops >= 1, --spin-us >= 0")
    rows = []
    for n in sizes:
        load = os.getloadavg()[0]
        r = {"processes": n, "load_before": round(load, 2)} | ring(n, args.hops, args.spin_us)
        rows.append(r)
        if not args.json:
            print(
                f"{n:>3} processes: CPU {r['cpu_us_per_hop']:6.1f} us a hop, wall "
                f"{r['wall_us_per_hop']:6.1f} us (load {load:.2f} before)",
                flush=True,
            )
    if args.json:
        print(json.dumps({"hops": args.hops, "spin_us": args.spin_us, "rings": rows}, indent=1))


if __name__ == "__main__":
    main()
