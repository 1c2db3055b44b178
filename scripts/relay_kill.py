"""Kill -9 a relay mid-stream and count the tasks lost (issue 20 item 4).

16 node processes over shm, a generated topology of leaves of 4 (the rail mesh of
`rdmasched demo --nodes 16 --leaf 4`). Every node but the victim streams its share of the
tasks (1,000 in all by default) to nodes it has no lane to (each one relayed), one every
`--every-ms`; a task runs `--run-ms` at its target. `--kill-after-ms` into the stream the
victim, a relay of many of those routes, is killed with SIGKILL. The run ends when every
task completed at its origin or after `--wait-s`. Prints, per run: tasks placed, completed
at their origin (once), completed twice, still held by a peer at the end (lost), and the
origins' counters of tasks sent again.

    PYTHONPATH=. python scripts/relay_kill.py [--tasks 1000] [--victim 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import time
import uuid
from typing import Any

ctx = mp.get_context("fork")
N, LEAF = 16, 4


def _node(args: Any, name: str, i: int, plan: list[tuple[int, int]], shared: Any) -> None:
    from rdmasched.cluster import local_cluster
    from rdmasched.daemon.node import Node
    from rdmasched.scheduler import Task

    cluster = local_cluster(
        N, 2, name=name, leaf=LEAF, heartbeat_ms=args.heartbeat_ms, dead_after_ms=args.dead_after_ms
    )
    node = Node(cluster, i, spin_us=20)
    got: dict[int, int] = {}

    def complete(task_id: int, where: int) -> None:
        got[task_id] = got.get(task_id, 0) + 1
        shared.done[i] = len(got)

    @node.on_dispatch
    def run(task: Task, slot: int) -> None:
        tid, origin = task.id, task.origin

        def done() -> None:
            node.complete(tid, origin=origin)
            if origin == i:  # placed again here (its target was declared dead): done here
                complete(tid, i)

        node.call_later(args.run_ms * 1_000_000, done)

    node.on_complete(complete)
    node.open()
    shared.ready[i] = 1
    while not shared.go.value:
        time.sleep(0.01)
    left = list(plan)

    def place() -> None:
        if left:
            tid, to = left.pop(0)
            node.dispatch(tid, to=to, cost_ns=args.run_ms * 1_000_000)
            node.call_later(args.every_ms * 1_000_000, place)

    node.call_later(0, place)
    node.run(until=lambda: bool(shared.stop.value))
    core = node.core
    shared.out.put(
        {
            "node": i,
            "placed": len(plan),
            "completed": len(got),
            "twice": sum(1 for n in got.values() if n > 1),
            "held_by_peers": node.stats()["held_by_peers"],
            "dead_peers": node.stats()["dead_peers"],
            "resent": getattr(core, "resent_tasks", None),
            "dup_dispatches": getattr(core, "dup_dispatches", None),
            "dup_completes": getattr(core, "dup_completes", None),
            "ran_twice": getattr(core, "ran_twice", None),
        }
    )
    node.stop()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--victim", type=int, default=5)
    ap.add_argument("--every-ms", type=int, default=4)
    ap.add_argument("--run-ms", type=int, default=20)
    ap.add_argument("--kill-after-ms", type=int, default=120)
    ap.add_argument("--heartbeat-ms", type=int, default=50)
    ap.add_argument("--dead-after-ms", type=int, default=1000)
    ap.add_argument("--wait-s", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    return ap


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One run: the totals over the origins (and `took_s`, `dead`, `through_victim`)."""
    from rdmasched.cluster import local_cluster
    from rdmasched.demo.runner import remove_segments

    t = local_cluster(N, 2, leaf=LEAF).topology
    assert t is not None
    # (Topology.links, named Topology.neighbours since issue 20's rename: either will do)
    links = getattr(t, "neighbours", None) or t.links
    rng = random.Random(args.seed)
    origins = [i for i in range(N) if i != args.victim]
    plans: dict[int, list[tuple[int, int]]] = {i: [] for i in origins}
    for k in range(args.tasks):
        o = origins[k % len(origins)]
        far = [n for n in range(N) if n not in links(o) and n not in (o, args.victim)]
        plans[o].append((k, rng.choice(far)))
    relayed_by_victim = sum(
        1
        for o, p in plans.items()
        for _, to in p
        if args.victim in t.path(o, to)[1:-1] or args.victim in t.path(to, o)[1:-1]
    )
    name = f"rk{os.getpid()}-{uuid.uuid4().hex[:4]}"
    shared = argparse.Namespace(
        ready=ctx.Array("i", N),
        done=ctx.Array("i", N),
        go=ctx.Value("i", 0),
        stop=ctx.Value("i", 0),
        out=ctx.Queue(),
    )
    procs = {
        i: ctx.Process(target=_node, args=(args, name, i, plans.get(i, []), shared))
        for i in range(N)
    }
    try:
        for p in procs.values():
            p.start()
        deadline = time.monotonic() + 60
        while sum(shared.ready) < N and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        shared.go.value = 1
        time.sleep(args.kill_after_ms / 1000)
        os.kill(procs[args.victim].pid, signal.SIGKILL)  # type: ignore[arg-type]
        killed_at = time.monotonic()
        end = killed_at + args.wait_s
        while time.monotonic() < end and sum(shared.done) < args.tasks:
            time.sleep(0.1)
        took = time.monotonic() - killed_at
        shared.stop.value = 1
        rows = [shared.out.get(timeout=60) for _ in origins]
    finally:
        shared.stop.value = 1
        for p in procs.values():
            p.join(10)
            if p.is_alive():
                p.kill()
        remove_segments(name, N)
    tot: dict[str, Any] = {
        k: sum((r[k] or 0) for r in rows) for k in rows[0] if k not in ("node", "dead_peers")
    }
    tot["dead"] = sorted({p for r in rows for p in r["dead_peers"]})
    tot["took_s"] = took
    tot["through_victim"] = relayed_by_victim
    return tot


def main() -> None:
    args = parser().parse_args()
    tot = run(args)
    print(
        f"{args.tasks} tasks, 16 nodes in leaves of 4, node {args.victim} killed "
        f"{args.kill_after_ms} ms into the stream ({tot['through_victim']} tasks routed "
        f"through it); {tot['took_s']:.1f} s after the kill (declared dead: {tot['dead']}):"
    )
    print(
        f"  completed at their origin: {tot['completed']} (twice: {tot['twice']}); "
        f"held by peers at the end (lost): {tot['held_by_peers']}; "
        f"not completed: {args.tasks - tot['completed']}"
    )
    print(
        f"  sent again: {tot['resent']}, duplicate DISPATCHes at targets: "
        f"{tot['dup_dispatches']}, duplicate COMPLETEs: {tot['dup_completes']}, "
        f"ran on two nodes: {tot['ran_twice']}"
    )


if __name__ == "__main__":
    main()
