"""A network of sans-IO node cores (rdmasched/daemon/core.py) on one fake clock, for tests.

Several cores exchange their `Send` and `Relay` effects through a queue, each message encoded
and decoded by the real codec (rdmasched._wire) as a lane would deliver it; the handlers'
answers go back to the core as the threaded `Node` gives them. Tests of every protocol the
core runs (sync, liveness, routing, placement) use this one harness.

With a `topology`, a core only has lanes to its links: every delivery is asserted to go over
one, and a message for an unlinked node is relayed by the cores on its route.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from types import ModuleType
from typing import Any

from rdmasched import _wire
from rdmasched import messages as msg
from rdmasched.daemon import core as _core
from rdmasched.daemon.core import (
    MAX_RELAYS,
    Effect,
    NodeCore,
    Start,
)
from rdmasched.scheduler import Task
from rdmasched.topology import Topology
from rdmasched.wire import Kind
from tests.codec import relayed_through_codec, through_codec

MS = 1_000_000
_COMPLETE = int(Kind.COMPLETE)
Wire = tuple[msg.ControlMessage, int] | msg.ControlMessage | _wire.Message
HEARTBEAT_NS = 20 * MS
DEAD_AFTER_NS = 200 * MS


class Cluster:
    """N cores and the messages between them, on one fake clock."""

    def __init__(
        self,
        n: int,
        slots: int = 1,
        topology: Topology | None = None,
        max_relays: int = MAX_RELAYS,
        core: ModuleType = _core,
    ) -> None:
        """`topology`: the cores' (NodeCore(topology=...)); its domains name the nodes'.
        With one, each core's links are its lanes; without, a full mesh. `core`: the node
        core's module (another load of daemon/core.py: its plain-Python run)."""
        self.core = core
        self.now = 10_000 * MS
        self.slots = slots
        self.topology = topology
        self.max_relays = max_relays
        self.domains = {j: ("rack" if topology is None else topology.domain(j)) for j in range(n)}
        self.cores = {i: self.make_core(i, 100 + i) for i in range(n)}
        #: (writer, lane's receiver, what it writes): a typed message with its dst, a typed
        #: message for the lane's receiver, or a received message relayed
        self.wire: deque[tuple[int, int, Wire]] = deque()
        #: node -> (sender, message) of every message delivered to it as its destination
        self.arrived: defaultdict[int, list[tuple[int, _wire.Message]]] = defaultdict(list)
        #: (src, final dst, kind) -> messages of that kind src sent to dst (made, not relayed)
        self.sent: Counter[tuple[int, int, int]] = Counter()
        #: (src, dst, message) of every message made for a node that is not one of src's
        #: links (relayed on its way)
        self.unlinked: list[tuple[int, int, msg.ControlMessage]] = []
        #: lane writes: every Send and every Relay (one per link a message crosses)
        self.traversals = 0
        self.timers: dict[int, int] = {}
        #: node -> the times its core asked to be woken (`Wake`), not yet come
        self.wakes: defaultdict[int, list[int]] = defaultdict(list)
        self.load = dict.fromkeys(self.cores, 0)
        #: node -> what its handlers saw: ("start", origin, id, slot), ("preempt", ...), ...
        self.seen: dict[int, list[tuple[Any, ...]]] = {i: [] for i in self.cores}
        self.down: set[int] = set()  #: nodes killed: they neither run nor get messages
        #: nodes stopped (SIGSTOP): they do not run; what is written to them waits in their
        #: lanes (`held`, in order) until `resume`
        self.stopped: dict[int, int] = {}
        self.held: deque[tuple[int, int, Wire]] = deque()
        self.progress_step = 1000
        #: node -> the peers it marked dead (MarkDead, until Revive): as the threaded Node's
        #: loop does, it sends them nothing but heartbeats, and keeps its COMPLETEs for them
        self.dead_lanes: defaultdict[int, set[int]] = defaultdict(set)
        self.kept: defaultdict[int, list[tuple[int, Effect]]] = defaultdict(list)
        #: node -> messages it dropped, for a peer it marked dead
        self.dropped: Counter[int] = Counter()
        for i, core in self.cores.items():
            self.do(i, core.open(self.now))

    def make_core(self, i: int, inc: int) -> NodeCore:
        return self.core.NodeCore(  # type: ignore[no-any-return]
            i,
            self.domains,
            slots=self.slots,
            inc=inc,
            dead_after_ns=DEAD_AFTER_NS,
            heartbeat_ns=HEARTBEAT_NS,
            now=self.now,
            topology=self.topology,
            max_relays=self.max_relays,
        )

    def restart(self, i: int, inc: int) -> None:
        """Node `i` restarts: a new process (a new core) with incarnation `inc`."""
        self.down.discard(i)
        self.dead_lanes[i].clear()
        self.kept[i].clear()
        self.seen[i].append(("restarted", inc))
        self.cores[i] = self.make_core(i, inc)
        self.do(i, self.cores[i].open(self.now))

    def do(self, node: int, effects: list[Effect]) -> None:
        """Carry out `node`'s effects as the threaded Node does (handlers answer at once)."""
        core, seen = self.cores[node], self.seen[node]
        m = self.core
        i = 0
        while i < len(effects):
            e = effects[i]
            i += 1
            if isinstance(e, m.Send | m.Relay):
                # a lane exists only over a link (every other node without a topology)
                assert e.peer in core.links, f"node {node} has no lane to node {e.peer}: {e!r}"
                if e.peer in self.dead_lanes[node] and not (
                    isinstance(e, m.Send) and isinstance(e.message, msg.Heartbeat)
                ):
                    # the driver's rule (daemon/loop.py, send): nothing but heartbeats goes
                    # to a peer declared dead; a COMPLETE is kept for its return
                    kind = e.message.kind if isinstance(e, m.Relay) else e.message.encode()[0]
                    if kind == _COMPLETE:
                        self.kept[node].append((e.peer, e))
                    else:
                        self.dropped[node] += 1
                    continue
                self.traversals += 1
                if isinstance(e, m.Send):
                    self.sent[node, e.dst, e.message.encode()[0]] += 1
                    self.wire.append((node, e.peer, (e.message, e.dst)))
                    if e.dst not in core.links:
                        self.unlinked.append((node, e.dst, e.message))
                else:
                    self.wire.append((node, e.peer, e.message))
            elif type(e) is Start:
                seen.append(("start", e.task.origin, e.task.id, e.slot))
            elif isinstance(e, m.PreemptTask):
                seen.append(("preempt", e.victim.origin, e.victim.id, e.cancel, e.trigger_ns))
                progress = e.victim.progress_ns + self.progress_step
                effects[i:i] = core.preempted(e.victim, progress, self.now)
            elif isinstance(e, m.RunSync):
                assert e.task.payload is not None
                seen.append(("sync", e.task.group, e.task.payload["step"], e.slot))
                effects[i:i] = core.sync_done(e.task, self.now)
            elif isinstance(e, m.CompleteNotice):
                seen.append(("completed", e.task_id, e.node))
            elif isinstance(e, m.SetTimer):
                self.timers[node] = e.at_ns
            elif isinstance(e, m.Wake):
                self.wakes[node].append(e.at_ns)
            elif isinstance(e, m.MarkDead):
                seen.append(("dead", e.peer))
                self.dead_lanes[node].add(e.peer)
            elif isinstance(e, m.Revive):
                seen.append(("revive", e.peer))
                self.dead_lanes[node].discard(e.peer)
                back = [x for p, x in self.kept[node] if p == e.peer]
                self.kept[node] = [(p, x) for p, x in self.kept[node] if p != e.peer]
                effects[i:i] = back  # first, ahead of what it sends from now on
            elif isinstance(e, m.SetLoad):
                self.load[node] = e.load
            else:
                raise AssertionError(f"unknown effect {e!r}")

    def stop(self, i: int) -> None:
        """Node `i` stops (SIGSTOP): it does not run, and its lanes keep what comes in."""
        self.stopped[i] = self.now

    def resume(self, i: int) -> None:
        """Node `i` runs again (SIGCONT): its loop notices the gap (`stalled`), then reads
        its lanes."""
        since = self.stopped.pop(i)
        mine = [x for x in self.held if x[1] == i]
        self.held = deque(x for x in self.held if x[1] != i)
        self.do(i, self.cores[i].stalled(self.now - since, self.now))
        self.wire.extendleft(reversed(mine))

    def passes(self, writer: int, to: int, m: Wire) -> bool:
        """Whether a lane write is delivered now: not if either end is killed (lost with
        it), nor if its receiver is stopped (held in its lane until it resumes)."""
        if writer in self.down or to in self.down:
            return False
        if to in self.stopped:
            self.held.append((writer, to, m))
            return False
        return True

    def deliver_one(self, writer: int, to: int, m: Wire) -> None:
        """Put one lane write through the codec and hand it to its receiver's core."""
        if isinstance(m, _wire.Message):
            received = relayed_through_codec(m, load=self.load[writer])
        else:
            x, dst = m if isinstance(m, tuple) else (m, to)
            received = through_codec(x, src=writer, load=self.load[writer], dst=dst)
        if received.dst == to:
            self.arrived[to].append((received.src, received))
        self.do(to, self.cores[to].receive(received, writer, self.now))

    def deliver(self) -> int:
        """Deliver every message in flight (and those they cause), in order."""
        n = 0
        while self.wire:
            writer, to, m = self.wire.popleft()
            if not self.passes(writer, to, m):
                continue  # lost with a killed node, or held for a stopped one
            self.deliver_one(writer, to, m)
            n += 1
        return n

    def deliver_rounds(self) -> int:
        """Deliver every message in flight, in rounds: round k+1 holds what round k's
        deliveries sent. The number of rounds until none is left: the longest causal chain
        of messages, in message hops (a message relayed on its way to its destination
        arrives in the round it was sent in; its link hops are `traversals`)."""
        rounds = 0
        while self.wire:
            batch, self.wire = self.wire, deque()
            while batch:
                writer, to, m = batch.popleft()
                if not self.passes(writer, to, m):
                    continue
                self.deliver_one(writer, to, m)
                # relays of this round's messages belong to this round
                later: deque[tuple[int, int, Wire]] = deque()
                for item in self.wire:
                    (batch if isinstance(item[2], _wire.Message) else later).append(item)
                self.wire = later
            rounds += 1
        return rounds

    def advance(self, ns: int, step: int = HEARTBEAT_NS // 2) -> None:
        """Let time pass, `step` at a time: fire due wakes and heartbeat timers, deliver what
        they send."""
        end = self.now + ns
        while self.now < end:
            self.now = min(end, self.now + step)
            for i, ats in list(self.wakes.items()):
                if i in self.down or i in self.stopped or min(ats, default=end + 1) > self.now:
                    continue
                ats[:] = [a for a in ats if a > self.now]
                self.do(i, self.cores[i].wake(self.now))
            for i, at in list(self.timers.items()):
                if i not in self.down and i not in self.stopped and at <= self.now:
                    self.do(i, self.cores[i].tick(self.now, self.now))
            self.deliver()

    def of(self, node: int, what: str) -> list[tuple[Any, ...]]:
        return [s for s in self.seen[node] if s[0] == what]


def task(i: int, origin: int, priority: int = 10) -> Task:
    return Task(i, 1, priority, 5 * MS, origin=origin)
