"""Issue 20 items 5, 8 and 16 (part): the client lane's main path (docs/CLIENT.md).

In-process daemon and ranks on shm lanes:

- sync groups belong to a session (the launcher's run): a second session on the same daemon
  starts again at step 0, two sessions at once keep their steps apart, and a refused
  `sync_ready` raises in the rank (naming the group and the step) instead of letting it
  wait for ever;
- a rank's held tasks are bounded (`max_queued`): past it the rank raises, below it nothing
  is lost; a rank with many queued tasks leaving does not stall the daemon's loop (the
  cancelling is done in slices);
- a rank cannot complete or cancel another rank's task.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmasched import launch
from rdmasched.client import Client
from rdmasched.clientproto import QueueFullError
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.clients import ClientHub
from rdmasched.daemon.node import Node
from rdmasched.errors import ArgumentError
from rdmasched.limits import CLIENT_CANCEL_SLICE
from rdmasched.scheduler import Task
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def one_host(dead_after_ms: int = 200) -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "cluster": {
                "name": f"s{os.getpid()}-{uuid.uuid4().hex[:6]}",
                "heartbeat_ms": 20,
                "dead_after_ms": dead_after_ms,
            },
            "node": [{"name": "h0", "slots": 2}],
        }
    )


@pytest.fixture
def daemon() -> Iterator[tuple[Node, ClientHub]]:
    node = Node(one_host(), "h0", spin_us=50).start()
    hub = launch.serve(node, max_queued=50)
    try:
        yield node, hub
    finally:
        node.stop()


class Rank:
    """A rank in this process: its client and what its handlers saw."""

    def __init__(self, hub: ClientHub, k: int, session: str | None) -> None:
        self.client = Client(hub.endpoint, k, session=session, connect_timeout_s=10)
        self.steps: list[int] = []
        self.running: set[int] = set()
        self.client.on_sync(lambda t, s: self.steps.append(t.payload["step"]))
        self.client.on_dispatch(lambda t, s: self.running.add(t.id))
        self.client.on_preempt(self._stop)

    def _stop(self, t: Task, slot: int, cancel: bool) -> int:
        self.running.discard(t.id)
        return t.progress_ns

    def run_steps(self, group: int, steps: range) -> None:
        c = self.client
        c.define_group(group, ["h0"], local=1)
        for s in steps:
            c.sync_ready(group, s)
            assert c.wait_for(lambda s=s: s in self.steps, 20), (s, self.steps)


# ---- item 5: sync groups belong to a session ---------------------------------------------------
def test_a_second_session_on_the_same_daemon_starts_again_at_step_0(
    daemon: tuple[Node, ClientHub],
) -> None:
    _, hub = daemon
    for session in ("torchelastic:run1:0", "torchelastic:run1:1", "slurm:77.0"):
        r = Rank(hub, 0, session)
        with r.client:
            r.run_steps(1, range(3))
            assert r.steps == [0, 1, 2]
            assert r.client.rejected == {}
    # the last member left (its goodbye is read on the daemon's own time): the hub holds
    # nothing of the groups any more
    wait_for(lambda: daemon[0].inspect(lambda n: hub.connects == 3 and not hub.clients), "left")
    assert daemon[0].inspect(lambda n: (hub.participants, hub.ready, hub.announced)) == (
        {},
        {},
        set(),
    )


def test_without_a_launcher_a_group_of_this_host_alone_starts_again(
    daemon: tuple[Node, ClientHub],
) -> None:
    _, hub = daemon
    for _ in range(2):
        r = Rank(hub, 0, "")
        with r.client:
            r.run_steps(1, range(2))
            assert r.steps == [0, 1] and r.client.rejected == {}


def test_the_session_comes_from_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    monkeypatch.delenv("RDMASCHED_SESSION", raising=False)
    assert launch.session_name() == ""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    assert launch.session_name() == "slurm:77.3"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert launch.session_name() == "torchelastic:abc:2"
    assert Client("x.y", 0).session == "torchelastic:abc:2"
    monkeypatch.setenv("RDMASCHED_SESSION", "mine")
    assert launch.session_name() == "mine"


def test_two_sessions_at_once_keep_their_steps_apart(daemon: tuple[Node, ClientHub]) -> None:
    _, hub = daemon
    a, b = Rank(hub, 0, "slurm:1.0"), Rank(hub, 1, "slurm:2.0")
    with a.client, b.client:
        a.run_steps(1, range(2))
        b.run_steps(1, range(1))
        a.run_steps(1, range(2, 3))
        assert a.steps == [0, 1, 2] and b.steps == [0]


def test_a_refused_sync_ready_raises_in_the_rank_naming_group_and_step(
    daemon: tuple[Node, ClientHub],
) -> None:
    _, hub = daemon
    r = Rank(hub, 0, "slurm:5.0")
    with r.client:
        r.run_steps(1, range(1))
        r.client.sync_ready(1, 0)  # again: refused by the daemon
        with pytest.raises(ArgumentError, match=r"group 1 step 0"):
            r.client.wait_for(lambda: False, 20)
        assert r.client.rejected == {"ArgumentError": 1}
        r.run_steps(1, range(1, 2))  # raised once: the rank goes on
    # the same session name again (no launcher would give it): the node remembers its steps
    r = Rank(hub, 0, "slurm:5.0")
    with r.client:
        r.client.define_group(1, ["h0"], local=1)
        r.client.sync_ready(1, 0)
        with pytest.raises(ArgumentError, match=r"group 1 step 0"):
            r.client.wait_for(lambda: False, 20)


# ---- item 8: a rank's queue is bounded, and its leaving does not stall the loop ---------------
def test_submits_past_the_bound_raise_in_the_rank_and_none_below_it_is_lost(
    daemon: tuple[Node, ClientHub],
) -> None:
    node, hub = daemon
    assert hub.max_queued == 50
    r = Rank(hub, 0, None)
    with r.client as c:
        for i in range(50):
            c.submit(i, job=1, priority=10)
        c.flush()
        assert c.rejected == {}
        assert node.inspect(lambda n: len(n.scheduler.queued())) == 48  # and 2 running
        assert len(r.running) == 2
        c.submit(50, job=1, priority=10)
        with pytest.raises(QueueFullError, match=r"50 tasks"):
            c.flush()
        assert c.rejected == {"QueueFullError": 1}
        assert node.explain(50) == []  # never made
        done = min(r.running)
        r.running.discard(done)
        c.complete(done)
        c.submit(50, job=1, priority=10)  # room again
        c.flush()
        assert c.rejected == {"QueueFullError": 1}
        # a rank's own queued tasks it cancelled make room too
        c.preempt(49, cancel=True)
        c.submit(51, job=1, priority=10)
        c.flush()
        assert c.rejected == {"QueueFullError": 1}


def test_a_rank_leaving_with_many_queued_tasks_does_not_stall_the_loop() -> None:
    # Cancelled at once, 200,000 tasks stopped the loop for 300 ms here. What the test holds
    # is the shape, not a wall time (a loaded host stretches any pass): the cancelling runs
    # in slices of at most CLIENT_CANCEL_SLICE, and a call posted to the loop after the first
    # slice runs before the last one (the loop goes on between slices).
    n = 200_000
    node = Node(one_host(dead_after_ms=1000), "h0", spin_us=50).start()
    try:
        hub = launch.serve(node, max_queued=n)
        log: list[tuple[str, int]] = []
        cancel_slice = hub._cancel_slice

        def slice_and_log() -> None:
            before = hub.cancelled
            cancel_slice()
            log.append(("slice", hub.cancelled - before))
            if len(log) == 1:  # from the loop thread: runs on a later pass
                node.call_soon(lambda: log.append(("posted", hub.cancelled)))

        node.inspect(lambda nd: setattr(hub, "_cancel_slice", slice_and_log))
        r = Rank(hub, 0, None)
        with r.client as c:
            for i in range(n):
                c.submit(i, job=1, priority=10)
            c.flush(120)
            assert c.rejected == {}
        wait_for(lambda: node.stats()["clients"]["cancelled"] == n, "all cancelled", 120)
        slices = [k for what, k in log if what == "slice"]
        assert sum(slices) == n
        # a slice looks at CLIENT_CANCEL_SLICE tasks and leaves those running to the last,
        # which cancels them (through PREEMPT) after its own
        assert max(slices[:-1], default=0) <= CLIENT_CANCEL_SLICE
        left_running = sum(CLIENT_CANCEL_SLICE - k for k in slices[:-1])
        assert slices[-1] <= CLIENT_CANCEL_SLICE + left_running
        assert len(slices) >= n // CLIENT_CANCEL_SLICE
        posted = [i for i, (what, _) in enumerate(log) if what == "posted"]
        assert len(posted) == 1 and posted[0] < len(log) - 1, log[:3]
        assert node.inspect(lambda nd: len(nd.scheduler.queued())) == 0
    finally:
        node.stop()


# ---- item 16: a rank cannot complete or cancel another rank's task ------------------------------
def test_a_rank_cannot_complete_or_cancel_another_ranks_task(
    daemon: tuple[Node, ClientHub],
) -> None:
    node, hub = daemon
    a, b = Rank(hub, 0, None), Rank(hub, 1, None)
    with a.client, b.client:
        a.client.submit(5, job=1, priority=10)
        a.client.submit(6, job=1, priority=10)
        a.client.submit(7, job=1, priority=10)  # queued
        a.client.flush()
        assert a.running == {5, 6}
        b.client.complete(5)
        b.client.preempt(7, cancel=True)
        b.client.preempt(6, cancel=True)
        b.client.flush()
        assert b.client.rejected == {"ArgumentError": 3}
        assert "client 0" in (b.client.last_rejection or "")
        assert a.running == {5, 6}
        assert node.inspect(lambda nd: [t.id for t in nd.scheduler.queued()]) == [7]
        # its owner may
        a.client.complete(5)
        a.client.preempt(7, cancel=True)
        a.client.flush()
        assert a.client.rejected == {}
        assert node.inspect(lambda nd: len(nd.scheduler.queued())) == 0


def test_the_daemon_command_bounds_each_client(tmp_path: Path) -> None:
    name = f"q{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[cluster]\nname = "{name}"\n\n[[node]]\nname = "h0"\nslots = 1\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = ["daemon", "--config", str(cfg), "--node", "h0", "--max-queued-per-client", "3"]
    daemon = subprocess.Popen(
        [sys.executable, "-m", "rdmasched.cli", *cmd],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.stdout is not None
        assert f"at {name}.h0" in daemon.stdout.readline()
        with Client(f"{name}.h0", 0, session="", connect_timeout_s=30) as c:
            for i in range(3):
                c.submit(i)
            c.flush()
            c.submit(3)
            with pytest.raises(QueueFullError, match="3 tasks"):
                c.flush()
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0
