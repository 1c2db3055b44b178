"""The discrete-event engine: one virtual clock, a heap of events, lanes with latency,
bandwidth and a per-message CPU cost at the receiver.

Nothing here decides anything about scheduling: the drivers (rdmasched/sim/drivers.py) hand
every decision to the real node core (`NodeCore`, with the compiled `Scheduler`) or to the
real central coordinator (rdmasched/demo/central.py), and carry out their effects on this
clock. Deterministic: events at the same time run in the order they were scheduled (a
sequence number breaks ties), there is no wall clock, and all randomness comes from seeded
`random.Random` objects.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

from rdmasched import _wire
from rdmasched.errors import LaneError
from rdmasched.messages import ControlMessage, Heartbeat, Outgoing, relayed
from rdmasched.sim.linkmodel import LinkModel
from rdmasched.topology import Topology
from rdmasched.wire import Kind

SLOT = _wire.SLOT_BYTES
KIND_NAMES = {int(k): k.name for k in Kind}


class Engine:
    """A virtual clock (ns) and the events due on it.

    Events due at one time are one batch, in the order they were scheduled (`_due`); the
    heap holds the distinct times as plain ints. That is the order of a heap of (time,
    sequence number) pairs, at a fraction of the cost when the heap is large: a pop and a
    push of a (time, seq, fn, args) tuple took 5.3 us at 60,000 pending events and 15 us at
    600,000 (tuple comparisons, each a cache miss), of ints 1.5 and 3.2 us (docs/SIM.md,
    "Speed"). A cluster of N nodes keeps about 6 N events pending."""

    def __init__(self) -> None:
        self.now = 0
        #: the times that have events due, a heap
        self._heap: list[int] = []
        #: time -> its events, (fn, args) in the order they were scheduled
        self._due: dict[int, list[tuple[Callable[..., None], tuple[Any, ...]]]] = {}
        #: the batch running (it stays in `_due`, so events scheduled for now join it) and
        #: the index of its next event
        self._cur: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._i = 0
        self.events = 0

    def at(self, t: int, fn: Callable[..., None], *args: Any) -> None:
        if t < self.now:
            t = self.now
        batch = self._due.get(t)
        if batch is None:
            self._due[t] = [(fn, args)]
            heappush(self._heap, t)
        else:
            batch.append((fn, args))

    def next_at(self) -> int | None:
        """When the next event is due (None: none is)."""
        if self._i < len(self._cur):
            return self.now
        return self._heap[0] if self._heap else None

    def due_by(self, t: int) -> bool:
        """Whether an event other than the running one is due at or before `t`."""
        return self._i < len(self._cur) or (bool(self._heap) and self._heap[0] <= t)

    def run(self, done: Callable[[], bool], until_ns: int) -> bool:
        """Run events until `done()` or the clock passes `until_ns`; True if done."""
        heap, due = self._heap, self._due
        n = 0
        try:
            while heap:
                t = heap[0]
                if t > until_ns:
                    return done()
                heappop(heap)
                self.now = t
                # the batch stays in `due` while it runs: events scheduled for `t` now are
                # appended to it, after every event scheduled before them
                batch = self._cur = due[t]
                i = 0
                while i < len(batch):
                    fn, args = batch[i]
                    i += 1
                    self._i = i
                    fn(*args)
                    n += 1
                    if not n & 63 and done():
                        if i < len(batch):  # the rest is left for a later run()
                            del batch[:i]
                            heappush(heap, t)
                        else:
                            del due[t]
                        return True
                del due[t]
            return done()
        finally:
            self._cur = []
            self._i = 0
            self.events += n


class Endpoint:
    """A node's message-handling thread: handles one message at a time, `cpu_ns` each.
    With `period_ns`, it takes messages in only at multiples of the period (a batch
    scheduler's cycle), and then handles every message waiting."""

    __slots__ = (
        "alive",
        "busy_until",
        "cost",
        "cpu_ns",
        "engine",
        "handled",
        "handler",
        "inbox",
        "node",
        "period_ns",
        "waking",
    )

    def __init__(
        self,
        engine: Engine,
        node: int,
        cpu_ns: int,
        handler: Callable[[_wire.Message, int], None],
        period_ns: int = 0,
        cost: Callable[[_wire.Message], int] | None = None,
    ) -> None:
        self.engine = engine
        self.node = node
        self.handler = handler
        self.alive = True
        self.busy_until = 0
        self.inbox: deque[tuple[_wire.Message, int]] = deque()
        self.waking = False
        self.cpu_ns = cpu_ns
        self.period_ns = period_ns
        self.handled = 0
        #: CPU time of one message, if it depends on the message (the central coordinator)
        self.cost = cost

    def arrive(self, m: _wire.Message, writer: int) -> None:
        """`m` came in on the lane from `writer` (its last hop; its maker is `m.src`)."""
        if not self.alive:
            return
        if not self.waking and not self.period_ns:
            now = self.engine.now
            if self.busy_until <= now:  # idle, nothing queued: handle it now
                self.busy_until = now + (self.cpu_ns if self.cost is None else self.cost(m))
                self.handled += 1
                self.handler(m, writer)
                return
        self.inbox.append((m, writer))
        if not self.waking:
            self.waking = True
            now = self.engine.now
            t = self.busy_until if self.busy_until > now else now
            if self.period_ns:
                p = self.period_ns
                t = -(-t // p) * p
            if t == now:
                self._wake()  # idle: handle it now
            else:
                self.engine.at(t, self._wake)

    def _wake(self) -> None:
        """Handle the next message; then the ones after it while nothing else is due
        before this node is free again (no other event can come between them)."""
        if not self.alive:
            self.inbox.clear()
            self.waking = False
            return
        engine = self.engine
        inbox = self.inbox
        cost_of = self.cost
        while True:
            m, writer = inbox.popleft()
            now = engine.now
            self.busy_until = now + (self.cpu_ns if cost_of is None else cost_of(m))
            self.handled += 1
            self.handler(m, writer)
            if not inbox:
                self.waking = False
                return
            t = self.busy_until
            if engine.due_by(t) or not self.alive or self.period_ns:
                engine.at(t, self._wake)
                return
            engine.now = t  # nothing is due before: handle the next one at t
            engine.events += 1


class Network:
    """Carries lane writes between endpoints: encoded by the real codec, delayed by the link
    model of the lane (the level of writer and next hop), decoded at the receiver's lane.

    A message a node makes (`send`, `send_run`) carries its maker as `src` and its final
    destination as `dst` (docs/PROTOCOL.md sections 2 and 10); it is written to the next
    hop, which is `dst` itself when the two hold a lane. A node on the route writes it on
    (`relay`) unchanged but for `relays` + 1 and its own load hint, and so on until it
    reaches `dst`: every hop costs its lane's latency and bandwidth and the receiving
    node's CPU time. One encoding per message object, maker, destination and load (a
    sender's batch is encoded once per destination)."""

    def __init__(self, engine: Engine, model: LinkModel, topo: Topology | None) -> None:
        self.engine = engine
        self.model = model
        self.topo = topo
        self.endpoints: dict[int, Endpoint] = {}
        #: nodes outside the topology (the central coordinator) -> the node they sit beside
        self.beside: dict[int, int] = {}
        #: node -> the nodes it holds lanes to (its topology links); a write from it to any
        #: other is a LaneError, as in the real loop. None: every pair has a lane (the
        #: central baseline: the coordinator and each node)
        self.lanes: dict[int, frozenset[int]] | None = None
        #: messages made (a Send: one per message and destination, however many hops)
        self.sent = 0
        #: lane writes: every message made, plus once more per relay on its way
        self.writes = 0
        #: lane writes that were relays (a received message written on to the next hop)
        self.relayed = 0
        #: bytes written on lanes (every write, relays too)
        self.bytes = 0
        self._cache: tuple[int, int, int, Any, _wire.Message, int] | None = None
        self._lat = [lv.latency_ns for lv in model.levels]
        self._bw = [lv.bandwidth for lv in model.levels]
        self._kinds = {k: 0 for k in KIND_NAMES}
        self._relay_kinds = {k: 0 for k in KIND_NAMES}

    def counts(self) -> dict[str, int]:
        """Messages made, by kind (relays are not counted again)."""
        return {KIND_NAMES[k]: v for k, v in sorted(self._kinds.items()) if v}

    def relay_counts(self) -> dict[str, int]:
        """Relays (lane writes of a message by a node on its route), by kind."""
        return {KIND_NAMES[k]: v for k, v in sorted(self._relay_kinds.items()) if v}

    def _coded(
        self, src: int, load: int, message: ControlMessage | Outgoing, dst: int
    ) -> tuple[_wire.Message, int]:
        c = self._cache
        if c is not None and c[3] is message and c[0] == src and c[2] == dst and c[1] == load:
            return c[4], c[5]
        out = message if type(message) is tuple else message.encode()  # type: ignore[union-attr]
        raw = _slot_bytes(out, src, load, dst, 0)
        m = _wire.decode(raw, nslots=64)
        self._cache = (src, load, dst, message, m, len(raw))
        return m, len(raw)

    def _no_lane(self, writer: int, peer: int) -> LaneError:
        return LaneError(
            f"node {writer} has no lane to node {peer} (not one of its links): a message "
            "for it must be relayed"
        )

    def _arrival(self, writer: int, peer: int, size: int, leave: int) -> int:
        lanes = self.lanes
        if lanes is not None and peer not in lanes[writer]:
            raise self._no_lane(writer, peer)
        if self.beside:
            lv = self.model.level(
                self.topo, self.beside.get(writer, writer), self.beside.get(peer, peer)
            )
        else:
            lv = self.model.level(self.topo, writer, peer)
        return leave + self._lat[lv] + int(size * 1e9 / self._bw[lv])

    def send_run(
        self,
        src: int,
        sends: list[Any],
        load: int,
        leave: int,
        dead: set[int],
    ) -> None:
        """Consecutive `Send` effects of one node (`peer`, `message`, `dst` each: a
        heartbeat round to every link, a SYNC_READY down a sync tree), all leaving at
        `leave`: encoded one by one (once per message object and destination), and
        delivered as one event per arrival time instead of one per message.

        The order is the one single events would have: nothing else is scheduled while a
        run is sent, so the run's messages due at one time would be consecutive events of
        that time's batch, in this order, and the one event that delivers them takes the
        place of the first. A receiver that is idle handles its message at once and
        schedules nothing for the same time before the next delivery (docs/SIM.md,
        "Speed"). Sends to a next hop in `dead` are skipped, except heartbeats."""
        level = self.model.level
        topo = self.topo
        lat, bw = self._lat, self._bw
        eps = self.endpoints
        coded = self._coded
        kinds = self._kinds
        links = None if self.lanes is None else self.lanes[src]
        by_time: dict[int, list[tuple[Endpoint, _wire.Message]]] = {}
        n = 0
        for e in sends:
            peer = e.peer
            if dead and peer in dead and type(e.message) is not Heartbeat:
                continue
            if links is not None and peer not in links:
                raise self._no_lane(src, peer)
            m, size = coded(src, load, e.message, e.dst)
            n += 1
            self.bytes += size
            kinds[m.kind] += 1
            ep = eps.get(peer)
            if ep is not None:
                lv = level(topo, src, peer)
                t = leave + lat[lv] + int(size * 1e9 / bw[lv])
                got = by_time.get(t)
                if got is None:
                    by_time[t] = [(ep, m)]
                else:
                    got.append((ep, m))
        self.sent += n
        self.writes += n
        at = self.engine.at
        for t, group in by_time.items():
            if len(group) == 1:
                ep, m = group[0]
                at(t, ep.arrive, m, src)
            else:
                at(t, _deliver_all, group, src)

    def send(
        self,
        src: int,
        peer: int,
        message: ControlMessage | Outgoing,
        load: int,
        leave: int,
        dst: int | None = None,
    ) -> None:
        """`message` (typed, or already `encode()`d) made by `src` for `dst` (default:
        `peer`), written on the lane to `peer` at `leave` (ns)."""
        if dst is None:
            dst = peer
        m, size = self._coded(src, load, message, dst)
        arrive = self._arrival(src, peer, size, leave)
        self.sent += 1
        self.writes += 1
        self.bytes += size
        self._kinds[m.kind] += 1
        ep = self.endpoints.get(peer)
        if ep is not None:
            self.engine.at(arrive, ep.arrive, m, src)

    def relay(self, writer: int, peer: int, m: _wire.Message, load: int, leave: int) -> None:
        """`writer` writes the received `m` (for another node) on to `peer`, the next hop of
        its route: every field unchanged but `relays` + 1 and the writer's load hint
        (docs/PROTOCOL.md section 10), as the threaded `Node` does."""
        r = relayed(m)
        raw = _slot_bytes(r.fields, r.src, load, r.dst, r.relays)
        out = _wire.decode(raw, nslots=64)
        size = len(raw)
        arrive = self._arrival(writer, peer, size, leave)
        self.writes += 1
        self.relayed += 1
        self.bytes += size
        self._relay_kinds[out.kind] += 1
        ep = self.endpoints.get(peer)
        if ep is not None:
            self.engine.at(arrive, ep.arrive, out, writer)


def _slot_bytes(out: Outgoing, src: int, load: int, dst: int, relays: int) -> bytes:
    """A message as a writer puts it in a lane: its slot (and continuations), encoded by
    the project's codec so that the receiving core decodes what a real lane delivers."""
    kind, id_, job, prio, flags, a0, a1, a2, hops, meta = out
    return _wire.encode(
        kind, id=id_, job=job, priority=prio, flags=flags, arg0=a0, arg1=a1, arg2=a2,
        hops=hops, meta=meta, src=src, load=load, dst=dst, relays=relays, nslots=64,
    )  # fmt: skip


def _deliver_all(group: list[tuple[Endpoint, _wire.Message]], writer: int) -> None:
    for ep, m in group:
        ep.arrive(m, writer)
