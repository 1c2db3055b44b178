"""A node's handlers: their errors, calls made from them, sync tasks, stop (issue 7 items 4, 7, 8).

One real node (a one-node cluster on shm, its loop on a thread) per test.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rdmasched.cluster import local_cluster
from rdmasched.daemon.node import LATER, Node
from rdmasched.errors import NodeFailedError
from rdmasched.scheduler import Decision, Task


def wait_for(cond: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def solo(slots: int = 1) -> Node:
    return Node(local_cluster(1, slots, name=f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"), 0)


@pytest.fixture
def node() -> Iterator[Node]:
    n = solo()
    yield n
    with contextlib.suppress(NodeFailedError):
        n.stop()


# ---- item 4: a handler's error is logged and counted; the node goes on ------------------------
@pytest.mark.parametrize("returns", [None, 1.5, -3, "x", True])
def test_preempt_handler_returning_a_non_progress_is_counted_and_the_node_goes_on(
    node: Node, returns: Any, caplog: pytest.LogCaptureFixture
) -> None:
    started: list[int] = []
    node.on_dispatch(lambda t, s: started.append(t.id))
    node.on_preempt(lambda t, s, cancel: returns)
    node.start()
    node.dispatch(1, priority=1)
    node.dispatch(2, priority=9)  # preempts task 1 on the only slot
    node.flush()
    assert started == [1, 2]
    assert node.stats()["handler_errors"] == {"on_preempt": 1}
    assert "on_preempt returned" in caplog.text
    assert node.healthy
    node.complete(2)  # task 1 was requeued with its old progress, and runs again
    node.flush()
    assert started == [1, 2, 1]
    assert node.scheduler.get(1).progress_ns == 0


def test_handler_exception_is_logged_with_its_traceback(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    started: list[int] = []

    def launch(t: Task, slot: int) -> None:
        started.append(t.id)
        if t.id == 1:
            raise RuntimeError("launch failed")

    node.on_dispatch(launch)
    node.on_preempt(lambda t, s, cancel: 1 // 0)
    with caplog.at_level(logging.ERROR, logger="rdmasched.daemon"):
        node.start()
        node.submit(1)
        node.dispatch(2, priority=5)  # preempts 1: the preempt handler raises too
        node.flush()
    assert node.stats()["handler_errors"] == {"on_dispatch": 1, "on_preempt": 1}
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert {type(r.exc_info[1]) for r in tracebacks if r.exc_info} == {
        RuntimeError,
        ZeroDivisionError,
    }
    assert node.healthy and started == [1, 2]


def test_call_later_callback_error_is_counted_and_the_loop_goes_on(node: Node) -> None:
    ran: list[str] = []
    node.start()
    node.call_later(0, lambda: ran.append("a") or 1 // 0)  # type: ignore[func-returns-value]
    node.call_later(1_000_000, lambda: ran.append("b"))
    wait_for(lambda: ran == ["a", "b"])
    assert node.stats()["handler_errors"] == {"call_later": 1}
    assert node.healthy


def test_calls_from_a_handler_are_queued_not_recursive(node: Node) -> None:
    n = 3000  # was a RecursionError after ~165
    order: list[tuple[str, int]] = []

    @node.on_dispatch
    def chain(t: Task, slot: int) -> None:
        order.append(("start", t.id))
        node.complete(t.id)
        if t.id < n:
            node.submit(t.id + 1)
        order.append(("returned", t.id))

    node.start()
    node.submit(1)
    wait_for(lambda: len(order) == 2 * n)
    # each handler returned before the next task started: calls were queued, not nested
    assert order[:4] == [("start", 1), ("returned", 1), ("start", 2), ("returned", 2)]
    assert node.stats()["handler_errors"] == {} and node.healthy


def test_a_failed_loop_makes_every_later_call_raise_with_the_cause(node: Node) -> None:
    node.start()
    assert node.healthy and node.error is None
    node._call(lambda: 1 // 0)  # an error outside any handler ends the loop
    wait_for(lambda: not node.healthy)
    assert isinstance(node.error, ZeroDivisionError)
    for call in (lambda: node.submit(1), lambda: node.flush(), lambda: node.explain(1)):
        with pytest.raises(NodeFailedError) as info:
            call()
        assert info.value.__cause__ is node.error
    with pytest.raises(NodeFailedError):
        node.stop()  # reported once more at stop
    node.stop()  # and stop stays safe to call twice


# ---- item 7: stop runs the pending calls; explain sees the calls before it ----------------------
def test_stop_carries_out_the_calls_made_before_it() -> None:
    started: list[int] = []
    node = solo(2)
    node.on_dispatch(lambda t, s: started.append(t.id))
    with node:
        for i in range(50):
            node.submit(i, priority=5)
    assert sorted(started) == [0, 1]  # both slots taken, the rest queued: nothing dropped
    assert len(node.scheduler.queued()) == 48


def test_explain_sees_the_calls_made_before_it() -> None:
    node = solo()
    with node:
        node.submit(42, job=7, priority=100)
        node.complete(42)
        decisions = [e.decision for e in node.explain(42)]
    assert decisions[:1] == [Decision.START] and Decision.COMPLETE in decisions


def test_calls_before_run_are_carried_out_by_explain_and_stop() -> None:
    """Opened, not running (run() not called yet, or returned): the calls run in the caller."""
    node = solo()
    started: list[int] = []
    node.on_dispatch(lambda t, s: started.append(t.id))
    node.open()
    node.submit(1)
    assert [e.decision for e in node.explain(1)] == [Decision.START]
    node.submit(2)
    node.stop()
    assert started == [1]
    assert [t.id for t in node.scheduler.queued()] == [2]


# ---- item 8: a sync task is complete when its handler returns, unless it says LATER ------------
def test_sync_task_is_complete_when_its_handler_returns() -> None:
    node = solo(1)
    synced: list[int] = []
    started: list[int] = []
    node.on_sync(lambda t, s: synced.append(t.payload["step"]))
    node.on_dispatch(lambda t, s: started.append(t.id))
    node.define_group(1, [0])
    with node:
        for step in range(20):  # one slot: a leaked sync slot would stop every later step
            node.sync_ready(1, step)
        node.submit(7)
        node.flush()
        assert synced == list(range(20)) and started == [7]
        assert node.stats()["handler_errors"] == {}


def test_sync_handler_returning_later_keeps_the_slot_until_complete() -> None:
    node = solo(1)
    held: list[Task] = []
    started: list[int] = []
    node.on_sync(lambda t, s: held.append(t) or LATER)  # type: ignore[func-returns-value]
    node.on_dispatch(lambda t, s: started.append(t.id))
    node.define_group(1, [0])
    with node:
        node.sync_ready(1, 0)
        node.submit(7)
        node.flush()
        assert len(held) == 1 and started == []  # the sync task still holds the slot
        node.complete(held[0].id)
        node.flush()
        assert started == [7]


def test_sync_handler_error_or_bad_return_does_not_leak_the_slot() -> None:
    node = solo(1)
    results: list[Any] = [RuntimeError("allreduce failed"), "done"]

    def sync(t: Task, slot: int) -> Any:
        r = results.pop(0)
        if isinstance(r, BaseException):
            raise r
        return r

    started: list[int] = []
    node.on_sync(sync)
    node.on_dispatch(lambda t, s: started.append(t.id))
    node.define_group(1, [0])
    with node:
        node.sync_ready(1, 0)
        node.sync_ready(1, 1)
        node.submit(7)
        node.flush()
        assert started == [7]
        assert node.stats()["handler_errors"] == {"on_sync": 2}


def test_flush_from_another_thread_while_handlers_call_the_api(node: Node) -> None:
    """The inbox is shared by the loop's own calls and other threads': nothing is lost."""
    done: list[int] = []
    node.on_dispatch(lambda t, s: node.complete(t.id) or done.append(t.id))  # type: ignore[func-returns-value]
    node.start()

    def feed(base: int) -> None:
        for i in range(200):
            node.submit(base + i)

    threads = [threading.Thread(target=feed, args=(k * 1000,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # flush() would not do: the completes are asked for by handlers, after it
    wait_for(lambda: len(done) >= 600)
    assert sorted(done) == sorted(k * 1000 + i for k in range(3) for i in range(200))


def test_stop_from_a_handler_runs_its_calls_then_closes(node: Node) -> None:
    started: list[int] = []

    @node.on_dispatch
    def once(t: Task, slot: int) -> None:
        started.append(t.id)
        if t.id == 1:
            node.complete(1)
            node.submit(2)
            node.stop()

    node.start()
    node.submit(1)
    wait_for(lambda: node.loop is None)
    assert started == [1, 2] and node.error is None
