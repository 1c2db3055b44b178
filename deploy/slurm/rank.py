"""One rank of the sbatch example (deploy/slurm/rdmasched.sbatch): a client of its host's
daemon, started by `srun` with Slurm's variables (docs/SLURM.md).

    srun --overlap python3 deploy/slurm/rank.py [--tasks N] [--steps S] [--work N]
                                                [--submit-on NODE]

It connects to its host's daemon (`Client.from_env()`: the cluster is job<SLURM_JOB_ID>,
the host SLURMD's node, the client index SLURM_LOCALID), declares sync group 1 over every
host of the job, and announces each of the `--steps` sync steps and waits for the release.
Once step 0 is released (every host's daemon has then heard from every other, so placement
knows their load) it submits its tasks (ids `local_rank << 40 | n`, priority 10: the daemons
run them here or place them on a less loaded host); with `--submit-on NODE` only the ranks
on that node submit, and the others run what is placed on them. It runs whatever task
starts on its slot (its own, or another host's placed here: a little arithmetic, `--work`
rounds of SHA-256) and completes it. When all of its own tasks are complete it announces one
more step, a barrier (no rank leaves while another host's task may still be placed on its
slot), and prints one JSON line: what it saw. Exit 1 if a wait took longer than `--wait-s`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import sys
import threading
from collections.abc import Callable

from rdmasched import Client
from rdmasched.scheduler import Task


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=4, help="tasks this rank submits")
    ap.add_argument("--steps", type=int, default=2, help="sync steps")
    ap.add_argument("--work", type=int, default=20_000, help="SHA-256 rounds per task")
    ap.add_argument("--wait-s", type=float, default=120.0, help="longest wait for a step")
    ap.add_argument(
        "--submit-on",
        type=int,
        default=None,
        metavar="NODE",
        help="only the ranks on this node submit tasks (default: every rank)",
    )
    args = ap.parse_args()

    client = Client.from_env(connect_timeout_s=args.wait_s)
    work: queue.Queue[Task | None] = queue.Queue()
    lock = threading.Lock()
    released: list[int] = []
    done: set[int] = set()  # this rank's own tasks, complete
    ran: list[list[int]] = []  # [task id, its origin node] for each task run on this slot
    running: set[tuple[int, int]] = set()  # (origin, id) started here, not preempted since
    mine: set[int] = set()  # this rank's own tasks: filled once the node id is known

    @client.on_dispatch
    def start(task: Task, slot: int) -> None:
        with lock:
            running.add((task.origin, task.id))
        work.put(task)

    @client.on_preempt
    def stop(task: Task, slot: int, cancel: bool) -> int:  # a sync step needs the slot
        with lock:
            running.discard((task.origin, task.id))
        return task.progress_ns  # the work is short: it starts again when it starts again

    @client.on_sync
    def sync(task: Task, slot: int) -> None:
        with lock:
            released.append(task.payload["step"] if task.payload else -1)

    @client.on_complete
    def completed(task_id: int, node: int) -> None:  # one of ours, run on another host
        with lock:
            done.add(task_id)

    def worker() -> None:
        while (task := work.get()) is not None:
            digest = task.id.to_bytes(8, "little")
            for _ in range(args.work):
                digest = hashlib.sha256(digest).digest()
            with lock:
                if (task.origin, task.id) not in running:
                    continue  # preempted meanwhile: it is started again later
                running.discard((task.origin, task.id))
                client.complete(task.id, origin=task.origin)
                ran.append([task.id, task.origin])
                if task.origin == client.id and task.id in mine:
                    done.add(task.id)

    def wait(what: str, cond: Callable[[], bool]) -> None:
        if not client.wait_for(cond, args.wait_s):
            with lock:
                print(f"rank {client.index} on {client.name}: {what} within {args.wait_s} s; "
                      f"released {released}, done {len(done)} of {len(mine)}",
                      file=sys.stderr, flush=True)  # fmt: skip
            raise SystemExit(1)

    def was_released(step: int) -> Callable[[], bool]:
        return lambda: step in released

    runner = threading.Thread(target=worker, daemon=True)
    runner.start()
    with client:
        nodes = client.nodes
        client.define_group(1, nodes)
        if args.submit_on is None or args.submit_on == client.id:
            with lock:
                mine.update(client.index << 40 | n for n in range(args.tasks))

        def submit_mine() -> None:
            for task_id in sorted(mine):
                client.submit(task_id, job=client.id, priority=10, cost_ns=1_000_000)

        if args.steps == 0:
            submit_mine()
        for step in range(args.steps):
            client.sync_ready(1, step)
            wait(f"step {step} was not released", was_released(step))
            if step == 0:  # every daemon has heard from every other: their load is known
                submit_mine()
        wait("its tasks did not all complete", lambda: mine <= done)
        client.sync_ready(1, args.steps)  # the barrier
        wait("the last step was not released", was_released(args.steps))
        client.flush()
        work.put(None)
        runner.join()
    with lock:
        print(json.dumps({
            "rank": int(os.environ.get("SLURM_PROCID", "0")),
            "host": client.name,
            "node": client.id,
            "index": client.index,
            "nodes": nodes,
            "released": released,
            "done": len(done),
            "tasks": len(mine),
            "ran": ran,
        }), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
