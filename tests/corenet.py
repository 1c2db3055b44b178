"""A network of sans-IO node cores (rdmasched/daemon/core.py) on one fake clock, for tests.

Several cores exchange their `Send` effects through a queue, each message encoded and decoded
by the real codec (rdmasched._wire) as a lane would deliver it; the handlers' answers go back
to the core as the threaded `Node` gives them. Tests of every protocol the core runs (sync,
liveness, routing, placement) use this one harness.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from rdmasched import messages as msg
from rdmasched.daemon.core import (
    CompleteNotice,
    Effect,
    MarkDead,
    NodeCore,
    PreemptTask,
    Revive,
    RunSync,
    Send,
    SetLoad,
    SetTimer,
    StartTask,
)
from rdmasched.scheduler import Task
from rdmasched.topology import Topology
from tests.codec import through_codec

MS = 1_000_000
HEARTBEAT_NS = 20 * MS
DEAD_AFTER_NS = 200 * MS


class Cluster:
    """N cores and the messages between them, on one fake clock."""

    def __init__(self, n: int, slots: int = 1, topology: Topology | None = None) -> None:
        self.now = 10_000 * MS
        self.slots = slots
        #: with a topology: each core's links are its lanes; without: a full mesh
        self.topology = topology
        self.domains = {j: ("rack" if topology is None else topology.domain(j)) for j in range(n)}
        self.cores = {i: self.make_core(i, 100 + i) for i in range(n)}
        #: (src, dst, message) of every send to a node that is not one of src's links
        #: (delivered directly here; the daemon relays them)
        self.unlinked: list[tuple[int, int, msg.ControlMessage]] = []
        self.wire: deque[tuple[int, int, msg.ControlMessage]] = deque()
        self.timers: dict[int, int] = {}
        self.load = dict.fromkeys(self.cores, 0)
        #: node -> what its handlers saw: ("start", origin, id, slot), ("preempt", ...), ...
        self.seen: dict[int, list[tuple[Any, ...]]] = {i: [] for i in self.cores}
        self.down: set[int] = set()  #: nodes stopped: they neither run nor get messages
        self.progress_step = 1000
        for i, core in self.cores.items():
            self.do(i, core.open(self.now))

    def make_core(self, i: int, inc: int) -> NodeCore:
        return NodeCore(
            i,
            self.domains,
            slots=self.slots,
            inc=inc,
            dead_after_ns=DEAD_AFTER_NS,
            heartbeat_ns=HEARTBEAT_NS,
            now=self.now,
            topology=self.topology,
        )

    def restart(self, i: int, inc: int) -> None:
        """Node `i` restarts: a new process (a new core) with incarnation `inc`."""
        self.down.discard(i)
        self.seen[i].append(("restarted", inc))
        self.cores[i] = self.make_core(i, inc)
        self.do(i, self.cores[i].open(self.now))

    def do(self, node: int, effects: list[Effect]) -> None:
        """Carry out `node`'s effects as the threaded Node does (handlers answer at once)."""
        core, seen = self.cores[node], self.seen[node]
        i = 0
        while i < len(effects):
            e = effects[i]
            i += 1
            if isinstance(e, Send):
                self.wire.append((node, e.peer, e.message))
                if e.peer not in core.links:
                    self.unlinked.append((node, e.peer, e.message))
            elif type(e) is StartTask:
                seen.append(("start", e.task.origin, e.task.id, e.slot))
            elif isinstance(e, PreemptTask):
                seen.append(("preempt", e.victim.origin, e.victim.id, e.cancel, e.trigger_ns))
                progress = e.victim.progress_ns + self.progress_step
                effects[i:i] = core.preempted(e.victim, progress, self.now)
            elif isinstance(e, RunSync):
                assert e.task.payload is not None
                seen.append(("sync", e.task.group, e.task.payload["step"], e.slot))
                effects[i:i] = core.sync_done(e.task, self.now)
            elif isinstance(e, CompleteNotice):
                seen.append(("completed", e.task_id, e.node))
            elif isinstance(e, SetTimer):
                self.timers[node] = e.at_ns
            elif isinstance(e, MarkDead):
                seen.append(("dead", e.peer))
            elif isinstance(e, Revive):
                seen.append(("revive", e.peer))
            elif isinstance(e, SetLoad):
                self.load[node] = e.load
            else:
                raise AssertionError(f"unknown effect {e!r}")

    def deliver(self) -> int:
        """Deliver every message in flight (and those they cause), in order."""
        n = 0
        while self.wire:
            src, dst, m = self.wire.popleft()
            if src in self.down or dst in self.down:
                continue  # lost with the stopped node
            received = through_codec(m, src=src, load=self.load[src])
            self.do(dst, self.cores[dst].receive(received, src, self.now))
            n += 1
        return n

    def advance(self, ns: int, step: int = HEARTBEAT_NS // 2) -> None:
        """Let time pass: fire due heartbeat timers, deliver what they send."""
        end = self.now + ns
        while self.now < end:
            self.now = min(end, self.now + step)
            for i, at in list(self.timers.items()):
                if i not in self.down and at <= self.now:
                    self.do(i, self.cores[i].tick(self.now, self.now))
            self.deliver()

    def of(self, node: int, what: str) -> list[tuple[Any, ...]]:
        return [s for s in self.seen[node] if s[0] == what]


def task(i: int, origin: int, priority: int = 10) -> Task:
    return Task(i, 1, priority, 5 * MS, origin=origin)
