"""A rank's last messages are carried out before its exit is (docs/CLIENT.md, "A client
that dies"): a rank that completes its task and exits at once, without a goodbye (its
process ends: torchrun's ranks leave this way when a run ends, or die), must have that
COMPLETE taken, not its task cancelled as a dead client's.

Found in CI (test_managed_run_under_repeated_preemption_completes_every_step, a loaded
machine): the daemon's reader drained the lanes, the rank wrote its COMPLETE and exited, and
the reader's liveness check, posted after that drain, found the process gone and cancelled
the task before the next drain read the COMPLETE. Here the reader is held, for real, at
that point: right after a drain, until the rank has written and exited. The same on both
readers of the up lanes: a thread of the hub's (verbs links), and the node's loop (shm
links), whose check of its clients is held at its start the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdmasched._ring import LaneSet
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon import clients as clients_mod
from rdmasched.daemon.clients import ClientHub
from rdmasched.daemon.loop import Loop
from rdmasched.daemon.node import Node
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

RANK = """
import os, sys
from rdmasched.client import Client
c = Client(sys.argv[1], 0).open()
started = []
c.on_dispatch(lambda t, slot: started.append(t.id))
c.dispatch(10, priority=100)
c.wait_for(lambda: started == [10])
print("running", flush=True)
sys.stdin.readline()
c.complete(10)
os._exit(0)  # no goodbye: the process ends
"""


class HeldLanes:
    """The hub's lane set, passing every call through; once `armed`, the reader thread's
    next return from `wait` runs `hold` first (the reader between a drain and its check)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.armed = threading.Event()
        self.hold: Any = None
        self.held = threading.Event()

    def wait(self, *a: Any, **kw: Any) -> int:
        got = self._real.wait(*a, **kw)
        if self.armed.is_set() and not self.held.is_set():
            self.hold()
            self.held.set()
        return int(got)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture(params=["thread", "loop"])
def held(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Node, ClientHub, HeldLanes]]:
    sets: list[HeldLanes] = []
    if request.param == "thread":  # the reader of verbs links: the hub's own thread
        monkeypatch.setattr(Loop, "adoptable", lambda self: None)

        def lane_set() -> HeldLanes:
            sets.append(HeldLanes(LaneSet()))
            return sets[-1]

        monkeypatch.setattr(clients_mod, "LaneSet", lane_set)
    else:  # the node's loop: its check of the clients held before it looks
        sets.append(HeldLanes(None))
        tick = ClientHub._check_tick

        def held_tick(hub: ClientHub) -> None:
            lanes = sets[0]
            if lanes.armed.is_set() and not lanes.held.is_set():
                lanes.hold()
                lanes.held.set()
            tick(hub)

        monkeypatch.setattr(ClientHub, "_check_tick", held_tick)
    cfg = ClusterConfig.from_dict(
        {
            "cluster": {"name": f"ce{os.getpid()}-{uuid.uuid4().hex[:6]}"},
            "node": [{"name": "h0", "slots": 1}],
        }
    )
    node = Node(cfg, "h0", spin_us=50).start()
    hub = ClientHub(node, max_clients=1, check_ms=1).open()
    try:
        yield node, hub, sets[0]
    finally:
        node.stop()


def test_a_complete_written_just_before_the_rank_exits_is_taken(
    held: tuple[Node, ClientHub, HeldLanes],
) -> None:
    node, hub, lanes = held
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK, hub.endpoint],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert rank.stdin is not None and rank.stdout is not None
    try:
        assert rank.stdout.readline().strip() == "running"

        def complete_and_exit() -> None:  # on the reader, right after a drain
            assert rank.stdin is not None
            rank.stdin.write("go\n")
            rank.stdin.flush()
            rank.wait(30)

        lanes.hold = complete_and_exit
        lanes.armed.set()
        wait_for(lambda: hub.stats()["clients_dead"] == 1, what="the daemon to see the exit")
    finally:
        rank.kill()
        rank.wait()
    assert lanes.held.is_set()
    node.flush()
    s = node.stats()
    assert s["clients"]["cancelled"] == 0, s["clients"]
    sched = s["scheduler"]
    assert sched["completions"] == 1 and sched["cancels"] == 0 and sched["running"] == 0, sched
