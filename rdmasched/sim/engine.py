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
from rdmasched.messages import ControlMessage, Outgoing
from rdmasched.sim.links import LinkModel
from rdmasched.topology import Topology
from rdmasched.wire import Kind

SLOT = _wire.SLOT_BYTES
KIND_NAMES = {int(k): k.name for k in Kind}


class Engine:
    """A virtual clock (ns) and the events due on it."""

    def __init__(self) -> None:
        self.now = 0
        self._heap: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.events = 0

    def at(self, t: int, fn: Callable[..., None], *args: Any) -> None:
        if t < self.now:
            t = self.now
        self._seq += 1
        heappush(self._heap, (t, self._seq, fn, args))

    def run(self, done: Callable[[], bool], until_ns: int) -> bool:
        """Run events until `done()` or the clock passes `until_ns`; True if done."""
        heap = self._heap
        n = 0
        try:
            while heap:
                t, _, fn, args = heap[0]
                if t > until_ns:
                    return done()
                heappop(heap)
                self.now = t
                fn(*args)
                n += 1
                if not n & 63 and done():
                    return True
            return done()
        finally:
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

    def arrive(self, m: _wire.Message, src: int) -> None:
        if not self.alive:
            return
        self.inbox.append((m, src))
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
        heap = engine._heap
        inbox = self.inbox
        cost_of = self.cost
        while True:
            m, src = inbox.popleft()
            now = engine.now
            self.busy_until = now + (self.cpu_ns if cost_of is None else cost_of(m))
            self.handled += 1
            self.handler(m, src)
            if not inbox:
                self.waking = False
                return
            t = self.busy_until
            if (heap and heap[0][0] <= t) or not self.alive or self.period_ns:
                engine.at(t, self._wake)
                return
            engine.now = t  # nothing is due before: handle the next one at t
            engine.events += 1


class Network:
    """Carries messages between endpoints: encoded by the real codec, delayed by the link
    model, decoded at the receiver's lane. One encoding per message object and sender (a
    SYNC_READY sent to every member is one object), as a sender's batch would be."""

    def __init__(self, engine: Engine, model: LinkModel, topo: Topology | None) -> None:
        self.engine = engine
        self.model = model
        self.topo = topo
        self.endpoints: dict[int, Endpoint] = {}
        #: nodes outside the topology (the central coordinator) -> the node they sit beside
        self.beside: dict[int, int] = {}
        self.sent = 0
        self.sent_by_kind: dict[str, int] = {}
        self.bytes = 0
        self._cache: tuple[int, int, Any, _wire.Message, int] | None = None
        self._lat = [lv.latency_ns for lv in model.levels]
        self._bw = [lv.bandwidth for lv in model.levels]
        self._kinds = {k: 0 for k in KIND_NAMES}

    def counts(self) -> dict[str, int]:
        return {KIND_NAMES[k]: v for k, v in sorted(self._kinds.items()) if v}

    def _coded(
        self, src: int, load: int, message: ControlMessage | Outgoing
    ) -> tuple[_wire.Message, int]:
        c = self._cache
        if c is not None and c[0] == src and c[1] == load and c[2] is message:
            return c[3], c[4]
        out = message if type(message) is tuple else message.encode()  # type: ignore[union-attr]
        kind, id_, job, prio, flags, a0, a1, a2, hops, meta = out
        raw = _wire.encode(
            kind,
            id=id_,
            job=job,
            priority=prio,
            flags=flags,
            arg0=a0,
            arg1=a1,
            arg2=a2,
            hops=hops,
            meta=meta,
            src=src,
            load=load,
            nslots=64,
        )
        m = _wire.decode(raw, nslots=64)
        self._cache = (src, load, message, m, len(raw))
        return m, len(raw)

    def send_many(
        self, src: int, dsts: list[int], message: ControlMessage, load: int, leave: int
    ) -> None:
        """One message object to several nodes (a SYNC_READY to every member): encoded
        once, one event per arrival time."""
        m, size = self._coded(src, load, message)
        level = self.model.level
        topo = self.topo
        lat, bw = self._lat, self._bw
        eps = self.endpoints
        by_time: dict[int, list[Endpoint]] = {}
        for dst in dsts:
            lv = level(topo, src, dst)
            ep = eps.get(dst)
            if ep is not None:
                t = leave + lat[lv] + int(size * 1e9 / bw[lv])
                got = by_time.get(t)
                if got is None:
                    by_time[t] = [ep]
                else:
                    got.append(ep)
        n = len(dsts)
        self.sent += n
        self.bytes += n * size
        self._kinds[m.kind] += n
        at = self.engine.at
        for t, group in by_time.items():
            at(t, _deliver_all, group, m, src)

    def send(
        self, src: int, dst: int, message: ControlMessage | Outgoing, load: int, leave: int
    ) -> None:
        """`message` (typed, or already `encode()`d) from `src` to `dst`, leaving at
        `leave` (ns)."""
        m, size = self._coded(src, load, message)
        if self.beside:
            lv = self.model.level(self.topo, self.beside.get(src, src), self.beside.get(dst, dst))
        else:
            lv = self.model.level(self.topo, src, dst)
        arrive = leave + self._lat[lv] + int(size * 1e9 / self._bw[lv])
        self.sent += 1
        self.bytes += size
        self._kinds[m.kind] += 1
        ep = self.endpoints.get(dst)
        if ep is not None:
            self.engine.at(arrive, ep.arrive, m, src)


def _deliver_all(eps: list[Endpoint], m: _wire.Message, src: int) -> None:
    for ep in eps:
        ep.arrive(m, src)
