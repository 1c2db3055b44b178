"""A rank completes a task it yielded, before the task starts again (issue 20 item 2;
docs/CLIENT.md, "Preemption and COMPLETE").

A daemon in this process with one slot, one client rank: the rank's task is preempted by a
sync task that keeps the slot (`on_sync` returns LATER), the rank's preempt handler yields
(its work goes on: a forward pass cannot stop midway), the daemon requeues the task, and the
rank then completes it. That COMPLETE ends the task: the daemon drops it from its queue and
records why, and never starts it again. What the daemon refuses of a rank's calls is counted
in the rank's `rejected`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rdmasched.client import Client
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.clients import ClientHub
from rdmasched.daemon.node import LATER, Node
from rdmasched.scheduler import Decision


@pytest.fixture
def daemon() -> Iterator[tuple[Node, ClientHub]]:
    """A one-host daemon with one slot in this process, serving one client."""
    cfg = ClusterConfig.from_dict(
        {
            "cluster": {
                "name": f"cc{os.getpid()}-{uuid.uuid4().hex[:6]}",
                "heartbeat_ms": 20,
                "dead_after_ms": 200,
            },
            "node": [{"name": "h0", "slots": 1}],
        }
    )
    node = Node(cfg, "h0", spin_us=50).start()
    hub = ClientHub(node, max_clients=1).open()
    try:
        yield node, hub
    finally:
        node.stop()


def test_a_task_completed_after_it_yielded_is_done_and_never_starts_again(
    daemon: tuple[Node, ClientHub],
) -> None:
    node, hub = daemon
    starts: list[int] = []
    preempts: list[int] = []
    syncs: list[Any] = []
    with Client(hub.endpoint, 0) as rank:

        @rank.on_dispatch
        def start(task: Any, slot: int) -> None:
            starts.append(task.id)

        @rank.on_preempt
        def stop(task: Any, slot: int, cancel: bool) -> int:
            preempts.append(task.id)
            return task.progress_ns + 1_000  # yields; the work goes on

        @rank.on_sync
        def sync(task: Any, slot: int) -> object:
            syncs.append(task)
            return LATER  # the sync task keeps the slot until its complete()

        rank.define_group(1, ["h0"], local=1)
        rank.dispatch(10, priority=200)
        rank.wait_for(lambda: starts == [10])
        rank.sync_ready(1, 0)  # the sync task (255) preempts task 10, which yields
        rank.wait_for(lambda: preempts == [10] and len(syncs) == 1)
        rank.flush()  # the yield is in: task 10 is queued behind the sync task
        assert node.stats()["scheduler"]["queue_len"] == 1
        rank.complete(10)  # its work finished: the task is done
        rank.flush()
        assert node.stats()["scheduler"]["queue_len"] == 0
        rank.complete(syncs[0].id)  # the sync is done: the slot is free again
        rank.flush()
        assert starts == [10]  # never started again
        assert rank.rejected == {}, rank.last_rejection
        story = [(e.decision, e.reason) for e in node.scheduler.explain(10) if e.task_id == 10]
        assert story[-2:] == [
            (Decision.REQUEUE, "preempted task yielded its progress"),
            (Decision.COMPLETE, "completed after it yielded, before it started again"),
        ], story
        s = node.stats()
        assert s["rejected"] == {} and s["scheduler"]["rejected"] == {}, s
        assert s["scheduler"]["running"] == 0 and s["scheduler"]["free_slots"] == 1


def test_a_complete_the_daemon_refuses_is_counted_in_the_ranks_rejected(
    daemon: tuple[Node, ClientHub],
) -> None:
    node, hub = daemon
    with Client(hub.endpoint, 0) as rank:
        rank.dispatch(10, priority=100)
        rank.dispatch(11, priority=100)  # queued behind 10: it never ran
        rank.flush()
        rank.complete(99)  # no such task
        rank.complete(11)  # queued, never started: nothing of it can have finished
        rank.flush()
        assert rank.rejected == {"unknown-task": 1, "TaskStateError": 1}, rank.last_rejection
        assert "queued" in (rank.last_rejection or "")
        assert node.stats()["rejected"] == {"unknown-task": 1, "TaskStateError": 1}
        rank.complete(10)
        rank.complete(11)
        rank.flush()
        assert rank.rejected == {"unknown-task": 1, "TaskStateError": 1}
