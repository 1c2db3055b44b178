"""A call handed to a node's loop from another thread is seen at once, whether the loop
spins or sleeps (issue 20 item 1: the lost wake-up).

The loops here are given an idle wake-up of a minute and no timers, so nothing but the
hand-off itself can make them run a posted call: a call that waits for a timer fails the
test by its timeout (seconds), without measuring anything.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmasched._ring import Batch, LaneSet
from rdmasched.daemon.links import ShmLinks
from rdmasched.daemon.loop import Loop
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
