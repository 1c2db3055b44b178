"""A call handed to a node's loop from another thread is seen at once, whether the loop
spins or sleeps (issue 20 item 1: the lost wake-up).

The loops here are given an idle wake-up of a minute and no timers, so nothing but the
hand-off itself can make them run a posted call: a call that waits for a timer fails the
test by its timeout (seconds), without measuring anything.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmasched._ring import Batch, LaneSet
from rdmasched.cluster import local_cluster
from rdmasched.daemon import node as node_module
from rdmasched.daemon.links import ShmLinks
from rdmasched.daemon.loop import Loop
from rdmasched.daemon.node import Node
from rdmasched.scheduler import Task
from rdmasched.transport import shm

#: far longer than any hand-off may take, far shorter than the loop's idle wake-up
SEEN_S = 10.0
IDLE_MS = 60_000


class Running:
    """A one-node loop on its own thread, with no timers and a minute's idle wake-up."""

    def __init__(self, spin_us: int) -> None:
        self.links = ShmLinks(f"t{os.getpid()}-{uuid.uuid4().hex[:6]}", 0, [], nslots=16)
        self.loop = Loop(self.links, spin_us=spin_us, idle_wake_ms=IDLE_MS)
        self.thread = threading.Thread(target=self.loop.run, args=(lambda m, p: None,))
        self.thread.start()
        while not self.loop.running:
            time.sleep(0.001)

    def call(self) -> bool:
        """Post a call from this thread; True if the loop ran it within SEEN_S."""
        ran = threading.Event()
        self.loop.post(ran.set)
        return ran.wait(SEEN_S)

    def close(self) -> None:
        self.loop.stop()
        self.thread.join(SEEN_S)
        stopped = not self.thread.is_alive()
        self.links.close()
        assert stopped, "stop() was not seen by the sleeping loop"


@pytest.fixture(params=[0, 200], ids=["sleeps-at-once", "spins-200us"])
def running(request: pytest.FixtureRequest) -> Iterator[Running]:
    r = Running(request.param)
    yield r
    r.close()


def test_calls_back_to_back_are_each_seen_without_a_timer(running: Running) -> None:
    # Each call is made right after the loop ran the one before: the loop is between its
    # inbox and its doorbell, or spinning, exactly when the next one is posted.
    for i in range(300):
        assert running.call(), f"call {i} waited for the loop's idle wake-up"


def test_a_call_to_a_loop_asleep_is_seen(running: Running) -> None:
    for _ in range(5):
        time.sleep(0.003)  # the loop has gone to sleep on its doorbell
        assert running.call()


def test_stop_right_after_a_call_is_seen(running: Running) -> None:
    assert running.call()
    # close() stops it at once, while the loop may still be spinning: it must not sleep
    # through the stop


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spin_us=st.sampled_from([0, 20, 200]),
    pauses_us=st.lists(st.integers(0, 400), min_size=1, max_size=40),
)
def test_every_post_is_seen_whatever_the_timing(spin_us: int, pauses_us: list[int]) -> None:
    """The rule: a post is seen whatever the loop is doing when it comes (running a call,
    spinning, announcing its sleep, asleep)."""
    r = Running(spin_us)
    try:
        for p in pauses_us:
            if p:
                time.sleep(p / 1e6)
            assert r.call()
    finally:
        r.close()


# ---- the mechanism: LaneSet.wake ----------------------------------------------------------------
@pytest.fixture
def belled() -> Iterator[LaneSet]:
    bell = shm.Doorbell.create(f"w{os.getpid() % 100000}.{uuid.uuid4().hex[:6]}")
    lanes = LaneSet()
    lanes.set_doorbell(bell, bell.address)
    yield lanes
    bell.close()


def test_a_wake_before_the_wait_ends_the_next_wait_once(belled: LaneSet) -> None:
    belled.wake()
    done = threading.Event()
    # a minute's wait, spinning or not: returns at once, with nothing drained
    t = threading.Thread(target=lambda: (belled.wait(Batch(4), 60e6, 0), done.set()))
    t.start()
    assert done.wait(SEEN_S)
    t.join()


@pytest.mark.parametrize("spin_us", [0, 60e6], ids=["asleep", "spinning"])
def test_a_wake_ends_a_wait_in_progress(belled: LaneSet, spin_us: float) -> None:
    for _ in range(50):
        done = threading.Event()
        t = threading.Thread(target=lambda d=done: (belled.wait(Batch(4), 60e6, spin_us), d.set()))
        t.start()
        belled.wake()  # whenever it comes: before, while spinning, announcing, or asleep
        assert done.wait(SEEN_S)
        t.join()


def test_without_a_doorbell_a_wake_ends_the_wait_too() -> None:
    lanes = LaneSet()
    done = threading.Event()
    t = threading.Thread(target=lambda: (lanes.wait(Batch(4), 60e6, 0), done.set()))
    t.start()
    time.sleep(0.002)
    lanes.wake()
    assert done.wait(SEEN_S)
    t.join()


# ---- the daemon: Node.submit -> on_dispatch from another thread -------------------------------
def test_node_submits_from_another_thread_run_before_any_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A minute's heartbeat and idle wake-up: the node has no timer that could run a call."""
    monkeypatch.setattr(node_module, "Loop", functools.partial(Loop, idle_wake_ms=IDLE_MS))
    name = f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"
    n = Node(local_cluster(1, 1, name=name, heartbeat_ms=60_000, dead_after_ms=600_000), 0)
    started = threading.Event()

    def run(t: Task, slot: int) -> None:
        started.set()
        n.complete(t.id)  # from the handler: queued, run once it returns

    n.on_dispatch(run)
    n.start()
    try:
        for i in range(200):
            started.clear()
            n.submit(i + 1)
            assert started.wait(SEEN_S), f"submit {i} waited for a timer"
    finally:
        n.stop()


def test_a_wake_after_the_links_are_closed_touches_no_memory() -> None:
    links = ShmLinks(f"t{os.getpid()}-{uuid.uuid4().hex[:6]}", 0, [], nslots=16)
    links.close()
    links.wake()  # the doorbell is unmapped: the LaneSet let go of it first


def test_a_hub_closed_twice_wakes_nothing_unmapped() -> None:
    from rdmasched.daemon.clients import ClientHub

    n = Node(local_cluster(1, 1, name=f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"), 0).start()
    hub = ClientHub(n).open()
    hub.close()
    n.stop()  # closes the hub again
