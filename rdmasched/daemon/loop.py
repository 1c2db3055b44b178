"""The messaging loop every node runs: inbound lanes, outbound lanes, timers, an inbox.

One thread runs `Loop.run`; everything the loop owns (the scheduler, the handlers' calls)
happens on that thread. Other threads hand work over with `post`, which appends to the inbox
and then wakes the loop (`Links.wake`, on shm `LaneSet.wake`: it ends the loop's wait whether
the loop spins, is about to sleep or sleeps, or else its next wait, so a call is seen within
microseconds); a `post` from the loop's own thread (a handler calling the API) is queued too
and runs as soon as the current message or timer is done, so handlers never recurse.

Polling is adaptive: after a message the loop spins for `spin_us` (busy, GIL released in
`LaneSet.wait`), then sleeps on the node's doorbell futex until a sender rings it, `wake` is
called, a timer is due, or `idle_wake_ms` passes. A sender rings only when it sees the
receiver asleep (one fenced load per send on a lane with a doorbell); the receiver announces
its sleep and then looks at its lanes and at `wake`'s flag once more (docs/PROTOCOL.md
section 9). Verbs links sleep the same way on their completion channels, with an eventfd for
`wake` (cython/rdmasched/_verbs_blocking.pxi).

A send never blocks the loop: a message that finds its lane full waits in that peer's
outbox, and every later message to that peer queues behind it, so order is kept. Outboxes
are retried every pass; a peer declared dead has its outbox dropped (its tasks are recovered
by the scheduler, not by resending), and only heartbeats go to it (`send(force=True)`), so it
can learn that it was declared dead and rejoin.

The loop also watches its own running: a pass that starts, or a wait that returns, much
later than it should (the process was stopped, or not scheduled) is reported to `on_stall`
before any message or timer of that pass is handled, and `listened_ns` says up to when the
lanes were read, so that silence is only counted while this node was listening.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from rdmasched._ring import Batch, RxLane, TxLane
from rdmasched._wire import Message
from rdmasched.daemon.links import Links
from rdmasched.daemon.probe import Probe
from rdmasched.errors import EpochError, LaneError, LaneFullError, PeerDeadError
from rdmasched.transport import shm

_log = logging.getLogger("rdmasched.daemon")

#: a queued message: the arguments of `TxLane.send` before timeout_us, then its dst, src
#: (-1: this node) and relays (docs/PROTOCOL.md section 2)
Outgoing = tuple[int, int, int, int, int, int, int, int, int, dict[str, Any] | None, int, int, int]
#: on_message(message, peer): `peer` is the node whose lane it came in on (authoritative)
Handler = Callable[[Message, int], None]


def _put(tx: TxLane, a: Outgoing) -> None:
    """Write queued message `a` into `tx` now, or raise (LaneFullError, ...)."""
    tx.send(
        a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
        timeout_us=0, dst=a[10], src=a[11], relays=a[12],
    )  # fmt: skip


class Loop:
    def __init__(
        self,
        links: Links,
        *,
        spin_us: int = 200,
        idle_wake_ms: int = 100,
        batch: int = 256,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.links = links
        self.me = links.me
        self.spin_us = spin_us
        self.idle_wake_ns = idle_wake_ms * 1_000_000
        self.clock = clock
        self._batch = Batch(batch)
        self._batch_cap = batch
        self._timers: list[tuple[int, int, Callable[[], None]]] = []
        self._tseq = itertools.count()
        self._outbox: dict[int, deque[Outgoing]] = {}
        self._inbox: deque[Callable[[], object]] = deque()
        self._stop = threading.Event()
        self._thread: int | None = None
        self.dead_peers: set[int] = set()
        #: peer -> time.monotonic() when it was declared dead
        self.dead_at: dict[int, float] = {}
        #: kinds of queued message kept for a peer declared dead, and sent first if the same
        #: process comes back (the daemon keeps COMPLETEs: its origin must not run it again)
        self.keep_on_death: frozenset[int] = frozenset()
        self._kept: dict[int, list[Outgoing]] = {}
        #: peers whose transport failed (closed lane), for the daemon to take in
        self.lost: list[tuple[int, str]] = []
        #: a gap in this loop's own running longer than this is reported to `on_stall`
        self.stall_ns: int | None = None
        #: stage probe (rdmasched/daemon/probe.py; benchmarks only): marks around `wait`
        self.probe: Probe | None = None
        self.on_stall: Callable[[int], None] | None = None
        #: called (peer, dead, why) on the loop thread when a peer is declared dead (dead
        #: True) or alive again (False): the client hub's news to its ranks
        self.on_peer: Callable[[int, bool, str], None] | None = None
        self.stalls = 0
        #: the last time every inbound lane had been read (clock of this loop)
        self.listened_ns = clock()
        self.msgs_in = 0
        self.msgs_out = 0
        #: waits that returned messages: msgs_in / batches is the messages one pass takes
        self.batches = 0
        #: message kind -> messages sent of it (own and relayed: every message written)
        self.sent_kinds: dict[int, int] = {}
        #: the peers this loop has lanes to (a send to any other is a LaneError)
        self.peers: frozenset[int] = links.peers
        self.outbox_waits = 0
        self.dropped = 0
        #: lanes of another owner read in this loop's wait (`adopt`): the index of the first
        #: in `links.inbound`, and who takes their messages
        self._adopted_at: int | None = None
        self._adopted: Callable[[Message, int], None] | None = None
        self._on_message: Handler | None = None

    # ---- time ------------------------------------------------------------------------------
    def call_at(self, t_ns: int, fn: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (t_ns, next(self._tseq), fn))

    def call_later(self, delay_ns: int, fn: Callable[[], None]) -> None:
        self.call_at(self.clock() + delay_ns, fn)

    # ---- lanes of another owner, read in this loop's one wait ------------------------------
    def adoptable(self) -> shm.Doorbell | None:
        """The doorbell this loop sleeps on if it can read other shm lanes in its wait
        (`adopt`): shm links' (`ShmLinks.doorbell`); None on verbs, whose wait sleeps on
        completion channels."""
        return getattr(self.links, "doorbell", None)

    def adopt(self, lanes: Sequence[RxLane], on_message: Callable[[Message, int], None]) -> None:
        """Read `lanes` in this loop's wait, beside the peers' lanes: a message of
        `lanes[i]` goes to `on_message(m, i)`, in the order the wait drained it (the client
        hub's up lanes, docs/CLIENT.md). They are shm lanes created on `adoptable()`'s
        doorbell. On the loop thread, or while no thread runs the loop; one owner at a time,
        who takes them back with `disown` before it closes them."""
        if self._adopted is not None:
            raise RuntimeError("this loop already reads the lanes of another owner")
        inbound, peer_of = self.links.inbound, self.links.inbound_peer
        self._adopted_at = len(inbound)
        for i, rx in enumerate(lanes):
            inbound.add(rx)
            peer_of.append(-1 - i)  # not a peer: `run` hands it to the owner
        self._adopted = on_message

    def disown(self) -> None:
        """Stop reading the adopted lanes (where `adopt` may be called). Safe twice."""
        at = self._adopted_at
        if at is None:
            return
        self.links.inbound.truncate(at)
        del self.links.inbound_peer[at:]
        self._adopted = self._adopted_at = None

    def drain_now(self) -> None:
        """Read every inbound lane until none has a message, and handle what came as after
        a wait. From a timer on the loop thread: the hub's check of its clients, which must
        carry out all that a client wrote before it is dropped."""
        on_message = self._on_message
        if on_message is None:
            return
        batch = Batch(self._batch_cap)
        while self.links.inbound.drain(batch):
            for m in batch:
                self._route(m, on_message)
                while self._inbox:
                    self._inbox.popleft()()
            self.msgs_in += len(batch)
            batch.clear()

    def _route(self, m: Message, on_message: Handler) -> None:
        """Hand `m` to `on_message` with its peer, or to the owner of its adopted lane (a
        lane disowned by a handler of the same batch: dropped, its owner let go of it)."""
        try:
            peer = self.links.inbound_peer[m.lane]
        except IndexError:
            return
        if peer >= 0:
            on_message(m, peer)
        elif self._adopted is not None:
            self._adopted(m, -1 - peer)

    # ---- other threads -------------------------------------------------------------------
    def in_loop(self) -> bool:
        return self._thread == threading.get_ident()

    @property
    def running(self) -> bool:
        """A thread is in `run` (or `run_pending`)."""
        return self._thread is not None

    def post(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the loop's thread, in the order posted.

        Never at once, even from the loop's own thread: a call made by a handler runs right
        after the handler's message (or timer) is done, so handlers that call the API queue
        work instead of recursing. From another thread it wakes the loop.
        """
        self._inbox.append(fn)
        if self._thread != threading.get_ident():
            self.links.wake()

    def run_pending(self) -> None:
        """Run the queued calls on this thread, when no thread runs the loop."""
        if self._thread is not None:
            raise RuntimeError("the loop is running on another thread")
        self._thread = threading.get_ident()
        try:
            inbox = self._inbox
            while inbox:
                inbox.popleft()()
        finally:
            self._thread = None

    def flush_outbox(self, timeout_s: float) -> bool:
        """Retry the queued messages until they are sent or `timeout_s` passes (at stop,
        with the loop not running); True if none is left."""
        deadline = time.monotonic() + timeout_s
        while self._outbox and self._flush():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0002)
        return True

    def stop(self) -> None:
        self._stop.set()
        self.links.wake()

    # ---- sending ---------------------------------------------------------------------------
    def send(
        self,
        peer: int,
        kind: int,
        id: int = 0,
        job: int = 0,
        priority: int = 0,
        flags: int = 0,
        arg0: int = 0,
        arg1: int = 0,
        arg2: int = 0,
        hops: int = 0,
        meta: dict[str, Any] | None = None,
        *,
        force: bool = False,
        dst: int | None = None,
        src: int = -1,
        relays: int = 0,
    ) -> bool:
        """Send without blocking over the lane to `peer`; False if the peer is dead (nothing
        sent).

        `dst`: the message's final destination (default `peer`); `src`: the node that made
        it (default this one) and `relays` the times it was relayed (a relay passes the
        received ones, relays + 1; docs/PROTOCOL.md section 10).
        `force`: send even to a peer declared dead, but never queue (a heartbeat). A peer
        this node holds no lane to (not one of its links) is a LaneError: a message for it
        must be relayed, never dropped silently."""
        if dst is None:
            dst = peer
        tx = self.links.outbound.get(peer)
        if tx is None and peer not in self.peers:
            raise LaneError(
                f"node {self.me} has no lane to node {peer}: it is not one of this node's "
                f"{len(self.peers)} links (a message for it must be relayed)"
            )
        args: Outgoing = (
            kind, id, job, priority, flags, arg0, arg1, arg2, hops, meta, dst, src, relays
        )  # fmt: skip
        if peer in self.dead_peers:
            if kind in self.keep_on_death:
                self._kept.setdefault(peer, []).append(args)
                return False
            if not force or tx is None:
                self.dropped += 1
                return False
            try:
                _put(tx, args)
            except (LaneFullError, EpochError, PeerDeadError):
                self.dropped += 1
                return False
            self.msgs_out += 1
            self.sent_kinds[kind] = self.sent_kinds.get(kind, 0) + 1
            return True
        if tx is None:  # a peer whose lane is gone (its process exited)
            self.dropped += 1
            return False
        box = self._outbox.get(peer)
        if box:
            box.append(args)
            return True
        try:
            _put(tx, args)
            self.msgs_out += 1
            self.sent_kinds[kind] = self.sent_kinds.get(kind, 0) + 1
        except (LaneFullError, EpochError):  # full, or a restarted sender not yet accepted
            self.outbox_waits += 1
            self._outbox.setdefault(peer, deque()).append(args)
        except PeerDeadError as exc:  # it closed its lane, or its transport failed
            self.dropped += 1
            self.mark_dead(peer, str(exc))
            self.lost.append((peer, str(exc)))
            return False
        return True

    def _flush(self) -> bool:
        """Retry queued messages; True if any are still waiting."""
        waiting = False
        for peer, box in list(self._outbox.items()):
            tx = self.links.outbound.get(peer)
            if tx is None:
                self.dropped += len(box)
                del self._outbox[peer]
                continue
            while box:
                try:
                    _put(tx, box[0])
                except (LaneFullError, EpochError):
                    waiting = True
                    break
                except PeerDeadError as exc:
                    self.mark_dead(peer, str(exc))
                    self.lost.append((peer, str(exc)))
                    break
                kind = box.popleft()[0]
                self.msgs_out += 1
                self.sent_kinds[kind] = self.sent_kinds.get(kind, 0) + 1
        return waiting

    def set_load(self, load: int) -> None:
        """The load hint piggybacked on every message from now on."""
        load = max(0, min(0xFFFF, load))
        for tx in self.links.outbound.values():
            tx.load = load

    def mark_dead(self, peer: int, why: str = "silent for too long") -> None:
        """Stop sending to `peer`: drop its outbox (its tasks are recovered elsewhere)."""
        if peer in self.dead_peers:
            return
        self.dead_peers.add(peer)
        self.dead_at[peer] = time.monotonic()
        box = self._outbox.pop(peer, ())
        kept = [a for a in box if a[0] in self.keep_on_death]
        if kept:
            self._kept.setdefault(peer, []).extend(kept)
        lost = len(box) - len(kept)
        self.dropped += lost
        _log.warning(
            "node %d: peer %d is dead (%s); %d queued messages dropped, %d kept",
            self.me,
            peer,
            why,
            lost,
            len(kept),
        )
        if self.on_peer is not None:
            self.on_peer(peer, True, why)

    def revive(self, peer: int) -> None:
        """Send to `peer` again (a new incarnation of it); re-attach its lane if it is a
        new process (links that can)."""
        reconnect = getattr(self.links, "reconnect", None)
        new_process = bool(reconnect(peer)) if reconnect is not None else False
        kept = self._kept.pop(peer, [])
        if kept and not new_process:  # first, ahead of anything sent from now on
            self._outbox[peer] = deque([*kept, *self._outbox.get(peer, ())])
        else:
            self.dropped += len(kept)
        if peer in self.dead_peers:
            self.dead_peers.discard(peer)
            self.dead_at.pop(peer, None)
            _log.warning("node %d: peer %d is alive again", self.me, peer)
            if self.on_peer is not None:
                self.on_peer(peer, False, "alive again")

    def _stalled(self, gap_ns: int) -> None:
        self.stalls += 1
        _log.warning("node %d: this loop did not run for %.0f ms", self.me, gap_ns / 1e6)
        if self.on_stall is not None:
            self.on_stall(gap_ns)

    # ---- the loop --------------------------------------------------------------------------
    def run(self, on_message: Handler, until: Callable[[], bool] | None = None) -> None:
        """Poll, dispatch messages to `on_message`, fire timers, until `stop()` or `until()`."""
        self._thread = threading.get_ident()
        self._on_message = on_message
        batch = self._batch
        inbound = self.links.inbound
        route = self._route
        timers = self._timers
        inbox = self._inbox
        clock = self.clock
        cap = self._batch_cap
        # `last`: the last instant this loop is known to have been running. Before every
        # timer, inbox call and message the clock is read: a jump past `stall_ns` (outside
        # the wait) means this process did not run, and is reported before going on.
        last = clock()
        try:
            while not self._stop.is_set() and not (until is not None and until()):
                stall = self.stall_ns
                now = clock()
                if stall is not None and now - last > stall:
                    self._stalled(now - last)
                last = now
                waiting = self._flush() if self._outbox else False
                now = clock()
                while timers and timers[0][0] <= now:
                    heapq.heappop(timers)[2]()
                    while inbox:  # what the timer asked for, before the next timer
                        inbox.popleft()()
                    now = clock()
                    if stall is not None and now - last > stall:
                        self._stalled(now - last)
                    last = now
                while inbox:
                    inbox.popleft()()
                    if stall is not None:
                        now = clock()
                        if now - last > stall:
                            self._stalled(now - last)
                        last = now
                if self._stop.is_set() or (until is not None and until()):
                    break
                if waiting:
                    timeout_ns = 20_000  # lanes full: come back soon
                elif inbox:
                    timeout_ns = 0
                else:
                    timeout_ns = self.idle_wake_ns
                    if timers:
                        timeout_ns = max(0, min(timeout_ns, timers[0][0] - now))
                batch.clear()
                before = clock()
                probe = self.probe
                if probe is None:
                    got = inbound.wait(batch, timeout_ns / 1000, self.spin_us)
                else:  # stage probes (rdmasched/daemon/probe.py): points 0 and 1
                    probe.mark(0)
                    got = inbound.wait(batch, timeout_ns / 1000, self.spin_us)
                    probe.mark(1)
                last = now = clock()
                if stall is not None and now - before - timeout_ns > stall:
                    self._stalled(now - before - timeout_ns)
                self.listened_ns = before if got >= cap else now
                if got:
                    for m in batch:
                        # the clock was read just now, after the wait: it is read again
                        # after each message, off the path from the lane to the handler
                        route(m, on_message)
                        while inbox:  # what its handlers asked for, before the next one
                            inbox.popleft()()
                        if probe is not None:  # point 6: the next message's turn
                            probe.mark(6)
                        if stall is not None:
                            now = clock()
                            if now - last > stall:
                                self._stalled(now - last)
                            last = now
                    self.msgs_in += got  # counted after the batch: off the path to a handler
                    self.batches += 1
        finally:
            self._thread = None
            self._on_message = None

    def pending_timers(self) -> int:
        return len(self._timers)
