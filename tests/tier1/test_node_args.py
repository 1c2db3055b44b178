"""Every argument error of the `Node` API raises at once, in the caller (issue 7 item 15).

The node is not opened: a call that passes its checks then fails with "not running", so
each case below proves that the check happened in the caller, before anything was queued
for the loop (where a bad value used to kill the loop thread).
"""

from __future__ import annotations

import enum
import math
from typing import Any

import pytest

from rdmasched.cluster import local_cluster
from rdmasched.daemon.node import Node
from rdmasched.errors import ArgumentError, ConfigError, RdmaschedError

BIG = 2**64


class Level(enum.IntEnum):
    ONE = 1


@pytest.fixture
def node() -> Node:
    n = Node(local_cluster(3, 2, name="args"), 0)
    n.define_group(4, [0, 1, 2])  # not running: groups are still declared here
    return n


def not_running(fn: Any) -> None:
    """The arguments are good: the call got as far as the (absent) loop."""
    with pytest.raises(RdmaschedError, match="not running"):
        fn()


BAD: list[tuple[str, Any, type[BaseException], str]] = [
    # ---- preempt ----
    ("preempt task -1", lambda n: n.preempt(-1, node=1), ValueError, "task_id"),
    ("preempt task 2**64", lambda n: n.preempt(BIG, node=1), ValueError, "task_id"),
    ("preempt job -1", lambda n: n.preempt(job=-1, node=1), ValueError, "job"),
    ("preempt job 2**64", lambda n: n.preempt(job=BIG, node=1), ValueError, "job"),
    ("preempt job 2**32", lambda n: n.preempt(job=2**32, node=1), ValueError, "job"),
    ("preempt task 1.5", lambda n: n.preempt(1.5, node=1), TypeError, "task_id"),
    ("preempt node 1.0", lambda n: n.preempt(1, node=1.0), TypeError, "node"),
    ("preempt node True", lambda n: n.preempt(1, node=True), TypeError, "node"),
    ("preempt node unknown", lambda n: n.preempt(1, node="n9"), ConfigError, "no node"),
    ("preempt both", lambda n: n.preempt(1, job=2), ValueError, "exactly one"),
    ("preempt cancel 'yes'", lambda n: n.preempt(1, cancel="yes"), TypeError, "cancel"),
    # ---- sync_ready ----
    ("sync step -1", lambda n: n.sync_ready(4, -1), ValueError, "step"),
    ("sync step 2**64", lambda n: n.sync_ready(4, BIG), ValueError, "step"),
    ("sync step 'x'", lambda n: n.sync_ready(4, "x"), TypeError, "step"),
    ("sync step 2**32", lambda n: n.sync_ready(4, 2**32), ValueError, "step"),
    ("sync group undefined", lambda n: n.sync_ready(5, 0), ValueError, "group 5"),
    ("sync group float", lambda n: n.sync_ready(4.0, 0), TypeError, "group"),
    # ---- complete ----
    ("complete runtime -1", lambda n: n.complete(1, runtime_ns=-1), ValueError, "runtime_ns"),
    ("complete runtime 2**64", lambda n: n.complete(1, runtime_ns=BIG), ValueError, "runtime"),
    ("complete task -1", lambda n: n.complete(-1), ValueError, "task_id"),
    ("complete task 1.5", lambda n: n.complete(1.5), TypeError, "task_id"),
    # ---- submit / dispatch: ids, numbers ----
    ("submit 1.5", lambda n: n.submit(1.5), TypeError, "task_id"),
    ("submit True", lambda n: n.submit(True), TypeError, "task_id"),
    ("submit priority 2.5", lambda n: n.submit(1, priority=2.5), TypeError, "priority"),
    ("submit priority 255", lambda n: n.submit(1, priority=255), ValueError, "priority"),
    ("submit job -1", lambda n: n.submit(1, job=-1), ValueError, "job"),
    ("submit job 2**64", lambda n: n.submit(1, job=BIG), ValueError, "job"),
    ("submit job 2**32", lambda n: n.submit(1, job=2**32), ValueError, "job"),
    ("submit cost 2**64", lambda n: n.submit(1, cost_ns=BIG), ValueError, "cost_ns"),
    ("submit cost nan", lambda n: n.submit(1, cost_ns=math.nan), TypeError, "cost_ns"),
    ("submit cost -1", lambda n: n.submit(1, cost_ns=-1), ValueError, "cost_ns"),
    ("submit id 2**63", lambda n: n.submit(2**63), ValueError, "task_id"),
    ("dispatch cost 2**64", lambda n: n.dispatch(1, to=1, cost_ns=BIG), ValueError, "cost"),
    ("dispatch cost nan", lambda n: n.dispatch(1, to=1, cost_ns=math.nan), TypeError, "cost"),
    ("dispatch to 1.0", lambda n: n.dispatch(1, to=1.0), TypeError, "to"),
    ("dispatch to unknown", lambda n: n.dispatch(1, to="n9"), ConfigError, "no node"),
    ("dispatch to 9", lambda n: n.dispatch(1, to=9), ConfigError, "no node"),
    # ---- payloads ----
    (
        "payload over 4096 bytes",
        lambda n: n.submit(1, payload={"x": "y" * 5000}),
        ValueError,
        "4096",
    ),
    ("payload a list", lambda n: n.submit(1, payload=[1, 2]), TypeError, "payload"),
    (
        "payload not msgpack",
        lambda n: n.dispatch(1, to=1, payload={"f": object()}),
        ValueError,
        "msgpack",
    ),
    # ---- call_later ----
    ("call_later 'x'", lambda n: n.call_later("x", lambda: None), TypeError, "delay_ns"),
    ("call_later -1", lambda n: n.call_later(-1, lambda: None), ValueError, "delay_ns"),
    ("call_later 1.5", lambda n: n.call_later(1.5, lambda: None), TypeError, "delay_ns"),
    ("call_later fn", lambda n: n.call_later(1, "f"), TypeError, "callable"),
    # ---- define_group ----
    ("group -1", lambda n: n.define_group(-1, [0]), ValueError, "group"),
    ("group 2**31", lambda n: n.define_group(2**31, [0]), ValueError, "group"),
    ("group 1.0", lambda n: n.define_group(1.0, [0]), TypeError, "group"),
    ("group member 0.0", lambda n: n.define_group(6, [0.0, 1]), TypeError, "member"),
    ("group member unknown", lambda n: n.define_group(6, [0, 7]), ConfigError, "no node"),
    ("group without me", lambda n: n.define_group(6, [1, 2]), ConfigError, "not a member"),
    ("group redefined", lambda n: n.define_group(4, [0, 1]), ValueError, "already defined"),
]


@pytest.mark.parametrize(("fn", "exc", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_argument_raises_at_once(node: Node, fn: Any, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match) as info:
        fn(node)
    assert isinstance(info.value, RdmaschedError)  # one of rdmasched.errors
    if not isinstance(info.value, ConfigError):
        assert isinstance(info.value, ArgumentError)


class Index:
    """An integer type that is not an int (as numpy's are): taken by its __index__."""

    def __index__(self) -> int:
        return 3


GOOD: list[tuple[str, Any]] = [
    ("an __index__ integer", lambda n: n.submit(Index(), priority=Index())),
    ("an IntEnum", lambda n: n.submit(Level.ONE)),
    ("preempt by node name", lambda n: n.preempt(1, node="n1")),
    ("preempt by node id", lambda n: n.preempt(1, node=1)),
    ("preempt a job", lambda n: n.preempt(job=2**32 - 1, node=2)),
    ("preempt a sync task", lambda n: n.preempt(2**64 - 1, node=1, cancel=True)),
    ("dispatch by node name", lambda n: n.dispatch(1, to="n2", payload={"a": [1, 2]})),
    ("dispatch here by name", lambda n: n.dispatch(1, to="n0")),
    ("submit everything", lambda n: n.submit(2**63 - 1, job=2**32 - 1, priority=254)),
    ("complete", lambda n: n.complete(2**64 - 1, runtime_ns=2**64 - 1)),
    ("sync_ready", lambda n: n.sync_ready(4, 2**32 - 1)),
    ("call_later", lambda n: n.call_later(0, lambda: None)),
]


@pytest.mark.parametrize("fn", [g[1] for g in GOOD], ids=[g[0] for g in GOOD])
def test_good_arguments_pass_the_checks(node: Node, fn: Any) -> None:
    not_running(lambda: fn(node))


def test_groups_take_node_names_and_may_be_declared_twice_alike(node: Node) -> None:
    node.define_group(4, ["n2", "n1", "n0"])  # the same members: no change, no error
    node.define_group(7, ("n0", 2))
    not_running(lambda: node.sync_ready(7, 0))


# ---- a rank's Client makes the same checks (rdmasched.api), before it sends anything --------
CLIENT_BAD = [
    ("submit job 2**32", lambda c: c.submit(1, job=2**32), ValueError, "job"),
    ("dispatch job 2**32", lambda c: c.dispatch(1, job=2**32), ValueError, "job"),
    ("preempt job 2**32", lambda c: c.preempt(job=2**32), ValueError, "job"),
    ("submit priority 255", lambda c: c.submit(1, priority=255), ValueError, "priority"),
    ("submit id 2**63", lambda c: c.submit(2**63), ValueError, "task_id"),
    ("submit payload a list", lambda c: c.submit(1, payload=[1]), TypeError, "payload"),
    ("sync step 2**32", lambda c: c.sync_ready(4, 2**32), ValueError, "step"),
    ("group 2**31", lambda c: c.define_group(2**31, [0]), ValueError, "group"),
    ("group members a string", lambda c: c.define_group(1, "n0"), TypeError, "members"),
]


@pytest.mark.parametrize(
    ("fn", "exc", "match"), [b[1:] for b in CLIENT_BAD], ids=[b[0] for b in CLIENT_BAD]
)
def test_client_bad_argument_raises_at_once(fn: Any, exc: type, match: str) -> None:
    from rdmasched.client import Client

    with pytest.raises(exc, match=match) as info:
        fn(Client("args.h0", 0))  # never opened: a good call fails with "not connected"
    assert isinstance(info.value, ArgumentError)


def test_client_good_task_arguments_pass_the_checks() -> None:
    from rdmasched.client import Client

    c = Client("args.h0", 0)
    for fn in (
        lambda: c.submit(2**63 - 1, job=2**32 - 1, priority=254),
        lambda: c.preempt(job=2**32 - 1),
    ):
        with pytest.raises(RdmaschedError, match="not connected"):
            fn()
