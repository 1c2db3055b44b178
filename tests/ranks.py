"""A training rank as a client of its host's daemon, for the tier-2 and tier-3 tests.

Run as `python -m tests.ranks` with a launcher's variables (torchrun's or Slurm's) and:
RANKS_TASKS (tasks this rank submits, default 2), RANKS_STEPS (sync steps, default 2),
RANKS_SPAWN=1 (local rank 0 starts the daemon: `Client.from_env(start_daemon=True)`),
RANKS_HOLD=1 (print "ready", then keep the tasks running until killed), RANKS_WAIT_S (how
long each wait may take, default 300), RANKS_OVERLAP=1 (group 1 overlaps: its syncs take
no slot).

It defines group 1 over every host, submits its tasks (ids RANK*1000 + i, priority 10),
announces each step and waits for its release, then completes every task that runs on it
(its own, and other hosts' tasks placed on its slot) until all of its own have completed,
then announces one more step (a barrier) and leaves once it is released.
Prints one JSON line: what it saw. A wait that times out prints what the rank saw and its
daemon's view (stats, and every decision about the rank's tasks) to stderr, then fails.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from rdmasched.client import Client
from rdmasched.scheduler import Task


def main() -> int:
    env = os.environ
    rank = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
    ntasks = int(env.get("RANKS_TASKS", "2"))
    steps = int(env.get("RANKS_STEPS", "2"))
    client = Client.from_env(start_daemon=env.get("RANKS_SPAWN") == "1", connect_timeout_s=120)
    lock = threading.Lock()
    seen: list[list[Any]] = []
    running: dict[tuple[int, int], Task] = {}
    syncs: list[int] = []
    sync_slots: list[int] = []  # the slot each release ran its on_sync with
    done: set[int] = set()
    mine = {rank * 1000 + i for i in range(ntasks)}
    finishing = threading.Event()
    wait_s = float(env.get("RANKS_WAIT_S", "300"))

    def fail(why: str) -> SystemExit:
        """`why`, with this rank's and its daemon's view on stderr (the test's log)."""
        with lock:
            print(f"rank {rank}: {why}; saw {seen}, syncs {syncs}, done {sorted(done)}",
                  file=sys.stderr, flush=True)  # fmt: skip
        try:
            stats = client.stats()
            print(f"rank {rank}: daemon stats {json.dumps(stats, default=str)}", file=sys.stderr)
            for tid in sorted(mine):
                print(f"rank {rank}: task {tid}: {client.explain(tid)}", file=sys.stderr)
        except Exception as exc:  # the daemon may be what failed
            print(f"rank {rank}: no daemon view: {exc!r}", file=sys.stderr)
        sys.stderr.flush()
        return SystemExit(f"rank {rank}: {why}")

    def finish(t: Task) -> None:  # under the lock
        running.pop((t.origin, t.id), None)
        client.complete(t.id, origin=t.origin)
        if t.origin == client.id and t.id in mine:
            done.add(t.id)

    @client.on_dispatch
    def start(t: Task, slot: int) -> None:
        with lock:
            seen.append(["start", t.id, t.origin, slot])
            running[(t.origin, t.id)] = t
            if finishing.is_set():
                finish(t)

    @client.on_preempt
    def stop(t: Task, slot: int, cancel: bool) -> int:
        with lock:
            seen.append(["preempt", t.id, t.origin, slot])
            running.pop((t.origin, t.id), None)
        return t.progress_ns + 1

    @client.on_sync
    def sync(t: Task, slot: int) -> None:
        with lock:
            syncs.append(t.payload["step"] if t.payload else -1)
            sync_slots.append(slot)

    @client.on_complete
    def completed(task_id: int, node: int) -> None:
        with lock:
            seen.append(["completed", task_id, node])
            done.add(task_id)

    with client:
        nodes = client.nodes
        client.define_group(1, nodes, overlap=env.get("RANKS_OVERLAP") == "1")
        for i in range(ntasks):
            client.submit(rank * 1000 + i, job=rank, priority=10, cost_ns=1_000_000)
        client.flush()
        if env.get("RANKS_HOLD") == "1":
            client.wait_for(lambda: bool(running), 60)
            print("ready", flush=True)
            while True:
                time.sleep(1)
        for step in range(steps):
            client.sync_ready(1, step)
            if not client.wait_for(lambda step=step: step in syncs, wait_s):
                raise fail(f"step {step} was not released")
        with lock:
            finishing.set()
            for t in list(running.values()):
                finish(t)
        if not client.wait_for(lambda: mine <= done, wait_s):
            raise fail(f"tasks {sorted(mine - done)} did not complete")
        # a last step as a barrier: no rank leaves while another's task may still be placed
        # on its slot
        client.sync_ready(1, steps)
        if not client.wait_for(lambda: steps in syncs, wait_s):
            raise fail("the last step was not released")
        client.flush()
        stats = client.stats()
    # one write of the whole line: two ranks of a host share torchrun's stdout, and a print's
    # text and newline are two writes when the stream is unbuffered (PYTHONUNBUFFERED)
    line = (
        json.dumps(
            {
                "rank": rank,
                "index": client.index,
                "node": client.id,
                "name": client.name,
                "seen": seen,
                "syncs": syncs,
                "sync_slots": sync_slots,
                "done": sorted(done),
                "rejected": client.rejected,
                "handler_errors": client.handler_errors,
                "nodes": nodes,
                "clients": stats["clients"],
            }
        )
        + "\n"
    )
    sys.stdout.write(line)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
