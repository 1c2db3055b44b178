"""A real small multi-job run beside the simulator's (docs/SIM.md, "Multi-job cluster").

Four `Node`s (the class `rdmasched daemon` runs) of one slot each, over shm lanes on
threads of this process, heartbeat 50 ms; jobs arrive at their times as gangs
(`Node.submit(..., gang=k)` on a coordinator: the first idle node, as the simulator's
launcher picks in a leaf); each member is a sleep of the job's run time on the node it was
placed on (`Node.call_later`, then `complete`). One priority (the real run has no
launcher that preempts). The same mix then runs in the simulator (`--links shm`, the same
heartbeat) and the JSON gives both sides' job completion time and queueing delay, and the
error. Run: PYTHONPATH=. python scripts/jobs_real.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

from rdmasched.bench.output import run_info
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.node import Node
from rdmasched.sim import PRESETS, SimConfig
from rdmasched.sim.jobs import LOW, Job, JobCluster, JobsConfig

NODES = 4
HEARTBEAT_MS, DEAD_AFTER_MS = 50, 500
STEP_MS = 100
#: (arrival s, nodes, run time s): a small mix that queues (more than 4 nodes asked at times)
MIX = (
    (0.0, 2, 1.5),
    (0.2, 1, 1.0),
    (0.4, 4, 1.0),
    (0.6, 1, 0.5),
    (1.0, 3, 1.2),
    (1.5, 2, 0.8),
    (2.0, 1, 2.0),
    (2.5, 4, 0.6),
    (3.0, 2, 1.0),
    (3.2, 1, 0.4),
    (4.0, 3, 0.8),
    (4.5, 2, 1.1),
)


def jobs() -> tuple[Job, ...]:
    step = STEP_MS * 1_000_000
    return tuple(
        Job(i + 1, int(at * 1e9), n, round(secs * 1e3 / STEP_MS), step, LOW)
        for i, (at, n, secs) in enumerate(MIX)
    )


def real() -> dict[int, tuple[float, float]]:
    """job -> (queueing delay, completion time), s, on real nodes."""
    cfg = ClusterConfig.from_dict(
        {
            "cluster": {
                "name": f"jr{os.getpid()}-{uuid.uuid4().hex[:6]}",
                "heartbeat_ms": HEARTBEAT_MS,
                "dead_after_ms": DEAD_AFTER_MS,
            },
            "node": [{"name": f"n{i}", "slots": 1} for i in range(NODES)],
        }
    )
    lock = threading.Lock()
    busy: list[int] = [0] * NODES  # the job running on each node (0: none)
    started: dict[int, list[float]] = {}
    ended: dict[int, float] = {}
    left: dict[int, int] = {}
    nodes = [Node(cfg, i, spin_us=20) for i in range(NODES)]
    t0 = [0.0]
    run_ns = {j.id: j.work_ns for j in jobs()}

    for i, node in enumerate(nodes):

        def start(task: Any, slot: int, i: int = i, node: Node = node) -> None:
            job = task.job
            with lock:
                busy[i] = job
                started.setdefault(job, []).append(time.monotonic() - t0[0])

            def done() -> None:
                with lock:
                    busy[i] = 0
                    left[job] -= 1
                    if not left[job]:
                        ended[job] = time.monotonic() - t0[0]
                node.complete(task.id, origin=task.origin)

            # the job's run time counts from its last member's start: each member sleeps
            # from its own start (they start together within a message's latency)
            node.call_later(run_ns[job], done)

        node.on_dispatch(start)
        node.on_preempt(lambda t, s, cancel: 0)
    openers = [threading.Thread(target=n.open) for n in nodes[1:]]
    for t in openers:
        t.start()
    nodes[0].open()
    for t in openers:
        t.join()
    for n in nodes:
        n.start()
    try:
        time.sleep(3 * HEARTBEAT_MS / 1e3)  # every node has heard every other's load
        t0[0] = time.monotonic()
        tid = 0
        for j in jobs():
            delay = j.arrival_ns / 1e9 - (time.monotonic() - t0[0])
            if delay > 0:
                time.sleep(delay)
            with lock:
                coord = next((i for i in range(NODES) if not busy[i]), 0)
                left[j.id] = j.nodes
            for _ in range(j.nodes):
                tid += 1
                nodes[coord].submit(tid, job=j.id, gang=j.nodes, cost_ns=j.work_ns)
        deadline = time.monotonic() + 60
        while len(ended) < len(MIX) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for n in nodes:
            n.stop()
    if len(ended) < len(MIX):
        raise SystemExit(f"the real run finished {len(ended)} of {len(MIX)} jobs in 60 s")
    out = {}
    for j in jobs():
        arrival = j.arrival_ns / 1e9
        out[j.id] = (max(started[j.id]) - arrival, ended[j.id] - arrival)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE", help="write the figures here too")
    args = ap.parse_args()
    got = real()
    cfg = SimConfig(
        nodes=NODES,
        scheduler="rdmasched",
        leaf=NODES,
        pod=NODES,
        links=PRESETS["shm"],
        heartbeat_ms=HEARTBEAT_MS,
        dead_after_ms=DEAD_AFTER_MS,
        jobs=JobsConfig(jobs=jobs(), source="scripts/jobs_real.py", checkpoint_steps=50),
    )
    c = JobCluster(cfg)
    sim = c.run()
    rows = []
    for j in jobs():
        st = c.state[j.id]
        sq = (st.first_start - j.arrival_ns) / 1e9
        sj = (st.end - j.arrival_ns) / 1e9
        rq, rj = got[j.id]
        rows.append({"job": j.id, "nodes": j.nodes, "real_queue_s": rq, "sim_queue_s": sq,
                     "real_jct_s": rj, "sim_jct_s": sj})  # fmt: skip
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0] if k.endswith("_s")}
    doc = {
        "command": "PYTHONPATH=. python scripts/jobs_real.py",
        "nodes": NODES,
        "heartbeat_ms": HEARTBEAT_MS,
        "jobs": rows,
        "mean": mean,
        "jct_error_pct": 100 * (mean["sim_jct_s"] - mean["real_jct_s"]) / mean["real_jct_s"],
        "queue_error_s": mean["sim_queue_s"] - mean["real_queue_s"],
        "sim_finished": sim["finished"],
        "load_1min": os.getloadavg()[0],
    } | run_info(vars(args))
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
