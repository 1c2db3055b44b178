"""A sync group across a relay that dies (issue 20 item 3; docs/SCALE.md section 9): 8 node
processes over shm in 2 leaves of 4, each its own pod (node 5's route to the root, node 1,
is [5, 4, 0, 1]), every node in one group, each reporting the next step once it ran the
sync of the one before. Node 4 is killed with SIGKILL, or stopped past dead_after with
SIGSTOP and let go on: the survivors go on releasing steps (and the stopped node, back,
with them)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import uuid
from typing import Any

import pytest

pytestmark = [pytest.mark.tier2, pytest.mark.slow]
ctx = mp.get_context("fork")
N, GROUP, VICTIM = 8, 1, 4
HEARTBEAT_MS, DEAD_AFTER_MS = 50, 600


def _node(name: str, i: int, steps: Any, stop: Any) -> None:
    from rdmasched.cluster import local_cluster
    from rdmasched.daemon.node import Node
    from rdmasched.scheduler import Task

    cluster = local_cluster(
        N, 1, name=name, leaf=4, pod=4, heartbeat_ms=HEARTBEAT_MS, dead_after_ms=DEAD_AFTER_MS
    )
    node = Node(cluster, i, spin_us=20)

    @node.on_sync
    def sync(task: Task, slot: int) -> None:
        assert task.payload is not None
        step = int(task.payload["step"])
        steps[i] = step + 1
        # the victim is slow to report step 5: killed (or stopped) before it did, its death
        # is what completes its leaf, whose combiner's readiness crosses it on its way up
        later = 400_000_000 if i == VICTIM and step + 1 == 5 else 2_000_000
        node.call_later(later, lambda: node.sync_ready(GROUP, step + 1))

    node.open()
    node.define_group(GROUP, range(N))
    node.call_later(200_000_000, lambda: node.sync_ready(GROUP, 0))
    try:
        node.run(until=lambda: bool(stop.value))
    finally:
        node.stop()


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_relay_between_combiners_that_dies_or_stops_does_not_hang_the_group(how: str) -> None:
    from rdmasched.cluster import local_cluster
    from rdmasched.demo.runner import remove_segments

    t = local_cluster(N, 1, leaf=4, pod=4).topology
    assert t is not None and t.path(5, 1) == [5, 4, 0, 1]  # (group 1: 5 combines, 1 is root)
    name = f"sk{os.getpid()}-{uuid.uuid4().hex[:4]}"
    steps = ctx.Array("i", N)
    stop = ctx.Value("i", 0)
    procs = [ctx.Process(target=_node, args=(name, i, steps, stop)) for i in range(N)]
    live = [i for i in range(N) if i != VICTIM]

    def wait_steps(nodes: list[int], at_least: int, within_s: float) -> bool:
        end = time.monotonic() + within_s
        while time.monotonic() < end:
            if all(steps[i] >= at_least for i in nodes):
                return True
            time.sleep(0.02)
        return False

    try:
        for p in procs:
            p.start()
        assert wait_steps(list(range(N)), 5, 60), list(steps)
        time.sleep(0.05)  # into the victim's 400 ms before it reports
        pid = procs[VICTIM].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        at = max(steps[i] for i in live)
        if how == "stop":
            time.sleep(4 * DEAD_AFTER_MS / 1000)  # declared dead by every node
            os.kill(pid, signal.SIGCONT)
        # the group (shrunk, or with the stopped node back) goes on
        assert wait_steps(live, at + 20, 30), (at, list(steps))
        if how == "stop":
            assert wait_steps([VICTIM], at + 20, 30), (at, list(steps))
    finally:
        stop.value = 1
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        remove_segments(name, N)
