# cython: language_level=3, annotation_typing=False, boundscheck=False, wraparound=False
"""`NodeCore`: a node's decision logic, sans-IO (like h11 or hyper-h2).

The core takes inputs (a received message, a timer tick, an API call, what a user's handler
returned) and returns **effects**: what the driver must do, in order. It owns the node's
`Scheduler`, its `PeerTable` and its `Membership`, and nothing else: no thread, no lane, no
socket and no clock of its own. Every input carries `now` (ns on the node's monotonic
clock); the scheduler and the peer table read that `now`, so a core driven with a fake
clock decides exactly as it would live. The threaded `Node` (node.py) is one driver; a test
or a simulator drives it by hand, delivering each `Send` to the peer's core.

Effects (docs/DAEMON.md, "The node core", is the contract):

* `Send(peer, message, dst)`: send a typed message (rdmasched.messages) for node `dst` over
  the lane to `peer`: `dst` itself when this node has a lane to it, else the next hop of its
  route (docs/PROTOCOL.md section 10). A `Heartbeat` goes even to a peer declared dead (it
  must learn that it was).
* `Relay(peer, message)`: a received message for another node: write it to `peer` (the next
  hop) unchanged but for `relays` + 1 and this node's load hint.
* `Start(task, slot)` (the scheduler's own action, passed on as is): call the dispatch
  handler.
* `PreemptTask(victim, slot, cancel, trigger_ns)`: call the preempt handler, then give its
  result back with `preempted(...)`; its effects come next, before the rest.
* `RunSync(task, slot)`: call the sync handler; unless it keeps the slot (`LATER`), give
  it back with `sync_done(...)`, whose effects come next.
* `CompleteNotice(task_id, node)`: a task of this node completed on `node`: call the
  complete handler.
* `SetTimer(at_ns)`: call `tick(now)` at `at_ns` (the heartbeat period).
* `Wake(at_ns)`: call `wake(now)` at `at_ns`: a running task's run quantum (or a job's
  preemption window) ends then, and a queued task may preempt (docs/PREEMPTION.md, "No
  thrash"); or a waiting gang's back-off ends, and it is tried again (docs/GANGS.md). Only
  with a quantum or a budget set, or a gang waiting; a wake at any time is harmless.
* `MarkDead(peer, why)`: stop sending to `peer` (heartbeats aside), drop its queue.
* `Revive(peer, again)`: send to `peer` again (`again`: an earlier incarnation of it was
  known, so its transport may need re-attaching).
* `SetLoad(load)`: the load hint to carry in every message from now on.

Errors in inputs that depend on the state (an unknown task, a full queue) are counted in
`rejected` and logged; the core goes on.

This file is also compiled by Cython, like the scheduler (pure-Python mode: `core.pxd` beside
it declares NodeCore's attributes and internal methods as C; the directives are on the first
line). The compiled module has the same behaviour and takes precedence on import when it is
built; `IMPLEMENTATION` says which one is loaded. Compiled, `receive` reads the `Message` as C
struct members and calls the compiled scheduler's typed methods as C calls
(docs/PERFORMANCE.md).
"""

from __future__ import annotations

import functools
import heapq
import logging
import random
from array import array
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from rdmasched import messages as msg
from rdmasched._wire import Message
from rdmasched.daemon.membership import (
    NEWS_MAX,
    SUMMARIES_PER_BEAT,
    Change,
    Membership,
    PeerGone,
    PeerJoined,
    Rejoined,
    Replace,
)
from rdmasched.daemon.sync import FLAGS as _SYNC_FLAGS
from rdmasched.daemon.sync import Release, SendSync, SyncGroups, SyncOut, on_route
from rdmasched.errors import ConfigError
from rdmasched.limits import NO_SLOT
from rdmasched.messages import ControlMessage
from rdmasched.scheduler import (
    Action,
    Cancel,
    Forward,
    PeerTable,
    Preempt,
    SchedulerError,
    Start,
    Task,
)
from rdmasched.scheduler.core import Scheduler
from rdmasched.scheduler.gang import Abort, Answer, Commit, GangOut, GangTable, Reserve
from rdmasched.topology import Topology
from rdmasched.wire import Flag, Kind

_log = logging.getLogger("rdmasched.daemon")

#: "compiled" when this module was built by Cython, else "python". Compiled, it refuses to load
#: next to a plain-Python scheduler (rdmasched/scheduler/core.py not built, or another build):
#: Cython's import of the `Scheduler` type it calls at C offsets checks the type's size.
IMPLEMENTATION = "python" if __file__.endswith(".py") else "compiled"

_DISPATCH, _PREEMPT, _SYNC_READY = int(Kind.DISPATCH), int(Kind.PREEMPT), int(Kind.SYNC_READY)
_COMPLETE, _HEARTBEAT = int(Kind.COMPLETE), int(Kind.HEARTBEAT)
_CANCEL, _JOB, _SUBMITTED = int(Flag.CANCEL), int(Flag.JOB), int(Flag.SUBMITTED)
_RESENT = int(Flag.RESENT)
_GANG, _COMMIT, _HELD = int(Flag.GANG), int(Flag.COMMIT), msg.HELD
_NOT_SYNC_FLAGS = ~_SYNC_FLAGS  # (a negative int: computed per message, it was a new object)

#: _next_hop: this node is not on the route of the pair (a message sent around a dead node)
_OFF_ROUTE = -2
#: sync tasks get ids from their own space so they never collide with submitted tasks
SYNC_ID_BASE = 1 << 63
#: SYNC_READYs kept for groups not (yet) defined here, at most (over it: rejected)
EARLY_SYNC_MAX = 4096
#: times a message may be relayed, by default (docs/PROTOCOL.md section 10): the topology's
#: longest route, 4 hops (3 relays), plus one for a route around a dead relay's leaf
MAX_RELAYS = 4
#: next hops kept per core, at most (a cache of the topology's routes; cleared when full)
ROUTE_CACHE_MAX = 1 << 16
#: tasks of other nodes completed here that a core remembers, at most (the oldest go first):
#: a DISPATCH sent again (RESENT) for one of them is answered with its COMPLETE again
DONE_MAX = 1 << 14
#: an origin sends again (RESENT) a task held by a far node that it has had no COMPLETE
#: of for between one and two of these periods, in dead_afters (docs/PROTOCOL.md 10, "Nothing lost")
RESEND_DEAD_AFTERS = 4


#: SYNC_ID_BASE again, a C constant when compiled (core.pxd): sync_task_id makes one int
_SYNC_BASE = SYNC_ID_BASE


def _split_leaf(topo: Topology, leaf: int) -> tuple[list[int], list[int]]:
    """(members of `leaf` with links only in it, the members with a link out of it)."""
    inner: list[int] = []
    gateways: list[int] = []
    for q in range(topo.leaf_start[leaf], topo.leaf_start[leaf] + topo.leaf_size[leaf]):
        out_of_leaf = any(topo.leaf(x) != leaf for x in topo.neighbours(q))
        (gateways if out_of_leaf else inner).append(q)
    return inner, gateways


def sync_task_id(group: int, step: int) -> int:
    g = group & 0x7FFFFFFF  # (compiled, g and s are C integers: the id is the only int made)
    s = step & 0xFFFFFFFF
    return _SYNC_BASE | (g << 32) | s


# ---- effects ---------------------------------------------------------------------------------
#: build a NamedTuple from a tuple without its Python-level __new__ (the hot path makes one
#: per decision; the scheduler does the same with its actions)
_new = tuple.__new__


class Send(NamedTuple):
    """Send `message` for node `dst` over the lane to `peer` (`dst` itself, or the next hop
    of its route); a Heartbeat even to a peer declared dead."""

    peer: int
    message: ControlMessage
    #: the final destination, written in the slot (`peer` unless relayed)
    dst: int


class Relay(NamedTuple):
    """Write the received `message` (for another node) to `peer`, the next hop of its
    route, unchanged but for `relays` + 1 and this node's load hint."""

    peer: int
    message: Message


class PreemptTask(NamedTuple):
    """Call the preempt handler for `victim` on `slot`, then `preempted(...)`."""

    victim: Task
    slot: int
    cancel: bool
    #: when the event that made this preemption necessary happened (0: not known)
    trigger_ns: int


class RunSync(NamedTuple):
    """Call the sync handler for sync task `task` on `slot`, then `sync_done(...)` unless
    it keeps the slot."""

    task: Task
    slot: int


class CompleteNotice(NamedTuple):
    """Task `task_id` of this node completed on node `node`: call the complete handler."""

    task_id: int
    node: int


class SetTimer(NamedTuple):
    """Call `tick(now)` at `at_ns`."""

    at_ns: int


class Wake(NamedTuple):
    """Call `wake(now)` at `at_ns` (a run quantum, a job's preemption window or a gang's
    back-off ends)."""

    at_ns: int


class MarkDead(NamedTuple):
    """Stop sending to `peer` (heartbeats aside); drop what is queued for it."""

    peer: int
    why: str


class Revive(NamedTuple):
    """Send to `peer` again; `again`: it is a later incarnation of a peer known before."""

    peer: int
    again: bool


class SetLoad(NamedTuple):
    """The load hint every message carries from now on."""

    load: int


Effect = (
    Send
    | Relay
    | Start
    | PreemptTask
    | RunSync
    | CompleteNotice
    | SetTimer
    | Wake
    | MarkDead
    | Revive
    | SetLoad
)


class NodeCore:
    """One node's decisions (see the module doc). Not thread-safe: one driver calls it."""

    #: domain summaries kept, at most (this node's leaf's and others')
    SUMMARY_MAX = 64

    def __init__(
        self,
        me: int,
        nodes: Mapping[int, str],
        *,
        slots: int,
        inc: int,
        dead_after_ns: int,
        heartbeat_ns: int,
        now: int,
        starvation_us: int = 1_000_000,
        aging_us: int | None = 100_000,
        events: int = 4096,
        sync_cost_ns: int = 0,
        max_hops: int = 2,
        topology: Topology | None = None,
        max_relays: int = MAX_RELAYS,
        preemption: Mapping[str, Any] | None = None,
        capacity: Mapping[int, int] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """`nodes`: every node of the cluster (this one too) -> its topology domain.
        `capacity`: node -> its slots, for gangs (docs/GANGS.md); None: every node has
        `slots`.
        `topology`: the cluster's links and routes; None: every node is linked to every
        other (a full mesh: tests, small clusters, the central baseline). `max_relays`:
        a message relayed that many times is not relayed again (docs/PROTOCOL.md 10).
        `preemption`: the scheduler's no-thrash settings (`Scheduler`'s `quantum_us`,
        `task_budget`, `job_budget`, `job_window_us`, `critical_priority`).
        `rng`: the placement's random draws (`Scheduler.submit`'s power-of-two choices of
        a peer); None: a generator seeded by the OS, so a daemon's draws differ run to run
        (the simulator passes one seeded from its seed and the node)."""
        self.me = me
        self.topology = topology
        if topology is not None and topology.plan.hops - 1 > max_relays:
            raise ConfigError(
                f"the topology's routes take up to {topology.plan.hops} hops "
                f"({topology.plan.hops - 1} relays); max_relays is {max_relays}"
            )
        if not 0 <= max_relays <= 255:
            raise ConfigError(f"max_relays must be 0..255 (a u8 in the slot), not {max_relays}")
        self.max_relays = max_relays
        #: messages for other nodes relayed on; reason -> messages not relayed (dropped)
        self.relayed = 0
        #: messages sent or relayed around a dead next hop (docs/PROTOCOL.md section 10)
        self.rerouted = 0
        self.relay_dropped: dict[str, int] = {}
        self._routes: dict[tuple[int, int], int] = {}
        #: (src, dst, lane it came on) -> next hop around the nodes known dead (`_around`;
        #: cleared when that set changes)
        self._arounds: dict[tuple[int, int, int], int] = {}
        # nothing lost in a dying relay (docs/PROTOCOL.md 10, "Nothing lost"): what this
        # node sent again as an origin, what it got twice as a target or an origin
        #: DISPATCHes of this node's tasks sent again (RESENT): a relay on the route died,
        #: or no COMPLETE came for a period
        self.resent_tasks = 0
        #: RESENT DISPATCHes of a task held here (ignored) or completed here (answered)
        self.dup_dispatches = 0
        #: COMPLETEs of a task of this node that no peer holds any more (a repeat: ignored)
        self.dup_completes = 0
        #: COMPLETEs of a task from a node that no longer held it (it had been placed again
        #: elsewhere): the task ran on both (at least once, docs/PROTOCOL.md 10, "Nothing lost")
        self.ran_twice = 0
        #: task key -> (job, runtime, progress) of another node's task completed here
        self._done: dict[int, tuple[int, int, int]] = {}
        self._my_key = me << 64  # this node's tasks' keys: | id (a Python int: 128 bits)
        #: keys of this node's tasks held by far nodes at the last sweep (`_sweep`)
        self._unanswered: set[int] = set()
        self.resend_after_ns = RESEND_DEAD_AFTERS * dead_after_ns
        #: heartbeat periods a sync report waits for its release before it is sent again
        self._sync_every = -(-dead_after_ns // heartbeat_ns)
        self._sweep_at = now + self.resend_after_ns
        #: the nodes this one has a lane to (and heartbeats); any other is reached by relays
        self.links: frozenset[int] = (
            frozenset(n for n in nodes if n != me)
            if topology is None
            else frozenset(topology.neighbours(me))
        )
        self.now = now
        self.heartbeat_ns = heartbeat_ns
        self.sync_cost_ns = sync_cost_ns
        # the time of the input being handled; a C-level callable (the scheduler reads it
        # several times per decision, and a Python method costs more)
        clock = functools.partial(getattr, self, "now")
        self.peers = PeerTable(clock=clock, dead_after_us=dead_after_ns // 1000)
        for n, domain in nodes.items():
            if n in self.links:
                self.peers.add(n, domain)
        #: with a topology: liveness is hierarchical (docs/SCALE.md, "Liveness")
        self._far = topology is not None
        self.members = Membership(
            me,
            self.links,
            inc=inc,
            dead_after_ns=dead_after_ns,
            heartbeat_ns=heartbeat_ns,
            now=now,
            gossip=self._far,
        )
        self.dead_after_ns = dead_after_ns
        #: domain summaries: leaf -> [version, load, lightest node, its incarnation,
        #: when heard here]; this node's leaf's too (docs/SCALE.md, "Placement")
        self.summaries: dict[int, list[int]] = {}
        self._sum_next = 0
        #: the other leaves of `summaries`, sorted: gossip_meta's turn order (None: to be
        #: made again, after a leaf came in or went out)
        self._sum_order: list[int] | None = None
        #: the other leaves of `summaries` by (when heard, when first kept, leaf), a heap
        #: with entries gone stale (a leaf heard again or dropped) left in it: a full table
        #: finds the one to drop in O(log n) instead of a scan per summary heard (with
        #: 3,125 leaves and 64 kept, nearly every summary is a new leaf's:
        #: scripts/summary_bench.py)
        self._sum_heap: list[tuple[int, int, int]] = []
        #: leaf -> when it was first kept (a count): the table's order, for ties in "heard"
        self._sum_kept: dict[int, int] = {}
        self._sum_count = 0
        self._leaf = -1 if topology is None else topology.leaf(me)
        self._leaf_peers = (
            []
            if topology is None
            else sorted(n for n in self.links if topology.leaf(n) == self._leaf)
        )
        #: far nodes unreachable because every gateway of their leaf is dead (_cut_off)
        self._cut: set[int] = set()
        #: DISPATCHes for a far node whose incarnation is not known yet (asked)
        self._pending_far: dict[int, list[msg.Dispatch]] = {}
        self.scheduler = Scheduler(
            slots,
            clock=clock,
            starvation_us=starvation_us,
            aging_us=aging_us,
            events=events,
            node_id=me,
            peers=self.peers,
            domain=nodes.get(me, ""),
            max_hops=max_hops,
            rng=rng,
            **(preemption or {}),
        )
        #: a quantum or a budget governs preemption: the scheduler may ask for a `Wake`
        self._no_thrash = self.scheduler.governs()
        self._wake_armed = 0  # the earliest Wake asked for and not yet come (0: none)
        #: gangs: those this node coordinates, the slots it holds for others' (docs/GANGS.md)
        self.gangs = GangTable(
            self.scheduler,
            self.peers,
            me,
            self.links,
            capacity if capacity is not None else dict.fromkeys(nodes, slots),
            hold_ns=2 * dead_after_ns,
            answer_ns=dead_after_ns,
            backoff_ns=heartbeat_ns,
            rng=random.Random(me),
        )
        #: peers whose messages are ignored (their incarnation ended)
        self._shunned: set[int] = set()
        #: peers that have not acknowledged this node's current incarnation
        self._unacked: set[int] = set()
        self.stale_msgs = 0
        # messages received per kind (`received`); compiled, a C array: no int made per
        # message once a count passes the small ints
        self._recv = array("Q", bytes(8 * 256))
        #: reason -> inputs refused
        self.rejected: dict[str, int] = {}
        #: inputs refused in all (the sum of `rejected`), and the last one's "reason: detail":
        #: a driver that wants to tell the caller compares the count before and after a call
        self.rejections = 0
        self.last_rejection = ""
        self.groups: dict[int, frozenset[int]] = {}
        #: the overlapping groups' sync tasks running here (ids; slot NO_SLOT): each ends with
        #: its handlers (`sync_done`, or `complete` after LATER), with nothing held to free
        self.beside: set[int] = set()
        #: the sync protocol (hierarchical with a topology): who is ready, when to release
        self.sync = SyncGroups(me, topology)
        self.sync_early_kept = 0
        #: group -> SYNC_READYs kept before its define_group: (flags, step, arg1, arg2)
        self._early_sync: dict[int, list[tuple[int, int, int, int]]] = {}
        self._early_sync_n = 0
        self._trigger_ns = 0
        self._load = -1
        # the last two SetLoad effects, reused: the hint mostly moves between two values
        # (a PREEMPT takes it down and back up), so an effect is not made per change
        self._fx_load0 = self._fx_load1 = -1
        self._fx0 = self._fx1 = _new(SetLoad, (-1,))
        #: `open()` has sent every link a heartbeat naming this incarnation
        self._opened = False
        # a bound method the hot path calls, made once (not one per message)
        self._seen = self.peers.seen

    @property
    def received(self) -> dict[int, int]:
        """Message kind -> messages received (telemetry: docs/TELEMETRY.md)."""
        return {k: int(n) for k, n in enumerate(self._recv) if n}

    # ---- time and liveness -------------------------------------------------------------------
    def open(self, now: int) -> list[Effect]:
        """The node starts: tell every peer this incarnation, first; arm the heartbeat.
        Peers count as heard from now: their silence while this node was still setting
        up (lanes, a verbs bootstrap) says nothing about them."""
        self.now = now
        self.members.last_tick_ns = now
        self.peers.refresh()
        out = self._heartbeats(None)
        self._opened = True
        out.append(SetTimer(now + self.heartbeat_ns))
        return out

    def tick(self, now: int, listened_ns: int | None = None) -> list[Effect]:
        """The heartbeat timer: declare silent peers dead (silence counted up to
        `listened_ns`, when the lanes were last read), send heartbeats, re-arm."""
        self.now = now
        out = self._apply(self.members.tick(now, self.peers.expired(listened_ns)))
        if self._far:
            out += self._summarize(now)
            self.members.prune(self._keep_far)
            if now >= self._sweep_at:
                self._sweep_at = now + self.resend_after_ns
                self._sweep(out)
            # a sync report not answered by a release for a dead_after: sent again
            out += self._sync(self.sync.tick(self._sync_every))
        if self._no_thrash:  # (a backstop for a driver that does not carry out Wake)
            out += self._act(self.scheduler.tick())
        self._gang(self.gangs.tick(now), out)
        out += self._heartbeats(None)
        out.append(SetTimer(now + self.heartbeat_ns))
        return out

    def wake(self, now: int) -> list[Effect]:
        """A `Wake` came due: the scheduler lets the queue preempt what it now may, and a
        gang whose back-off ended is tried."""
        self.now = now
        if now >= self._wake_armed:
            self._wake_armed = 0
        out = self._act(self.scheduler.tick())
        if self.gangs.waiting:
            self._gang(self.gangs.poll(now), out)
        return out

    def peer_lost(self, peer: int, why: str, now: int) -> list[Effect]:
        """The transport says `peer` is gone (it closed its lane)."""
        self.now = now
        return self._apply(self.members.gone(peer, why))

    def stalled(self, gap_ns: int, now: int) -> list[Effect]:
        """This node did not run for `gap_ns`: maybe it was declared dead meanwhile."""
        self.now = now
        return self._apply(self.members.stalled(gap_ns, now))

    # ---- messages ------------------------------------------------------------------------------
    def receive(self, m: Message, peer: int, now: int) -> list[Effect]:
        """A message that came in on the lane from `peer` (its last hop).

        A message for another node (`m.dst`) is relayed on (`Relay`, docs/PROTOCOL.md
        section 10). One for this node was made by `m.src`, its **sender** for every
        protocol: whose incarnation, task, completion or heartbeat it is. `peer` wrote the
        slot: its load hint is `peer`'s (the same node unless relayed); both count as heard
        from.

        The hot path of a node, and the daemon's one decoder of received messages: it
        reads the fields as plain ints, as rdmasched.messages names them, instead of
        building a message object (which costs about a microsecond) per message.
        """
        self.now = now
        if m.dst != self.me:
            return self._relay(m, peer)
        src = m.src
        kind = m.kind
        self._recv[kind & 0xFF] += 1
        out: list[Effect] = []
        far = self._far and src not in self.links
        if kind == _HEARTBEAT:  # Heartbeat: meta = incarnations (and news, summaries)
            meta = m.meta
            if far:  # a far node's notice, relayed (docs/SCALE.md, "Liveness")
                return self._notice_in(src, meta, now)
            changes = self.members.on_heartbeat(src, meta, now)
            if changes:
                out = self._apply(changes)
            if self._far and meta and src not in self._shunned:
                out += self._gossip_in(meta, now)
        shunned = self._shunned
        if src in shunned:  # a message of an incarnation that ended
            self.stale_msgs += 1
            return out
        # the last hop wrote the load hint (src's unless relayed); if it fell, a waiting
        # gang may fit now (tried below, once the message is handled)
        fell = peer not in shunned and self._seen(peer, m.load)
        if peer != src and not far:  # relayed from a link (around a dead lane): alive
            self.peers.revive(src)
        sched = self.scheduler
        # the message every decision below records as its cause (docs/TELEMETRY.md)
        sent = m.arg0 if kind == _PREEMPT else m.arg1 if kind == _SYNC_READY else 0
        sched.cause(kind, src, m.seq, sent)
        try:
            if kind == _PREEMPT:  # Preempt: id=task, job, arg0=trigger_ns, CANCEL, JOB
                self._trigger_ns = sent
                flags = m.flags
                cancel = (flags & _CANCEL) != 0
                if flags & _GANG:  # a gang's abort (docs/PROTOCOL.md 12)
                    return self._gang(self.gangs.abort(src, m.job, now), out)
                if flags & _JOB:
                    return self._act(sched.preempt(job=m.job, cancel=cancel))
                t = self.resolve(m.id, None, src)
                if t is not None:
                    return self._act(sched.preempt_task(t, cancel))
            elif kind == _DISPATCH:
                # Dispatch: id=task, job, priority, arg0=cost, arg1=progress, arg2=origin,
                # hops, meta=payload, SUBMITTED
                origin = int(m.arg2)
                if origin != self.me and (
                    src in self._unacked or (far and self.members.far_refuses(src))
                ):
                    # sent to this node's previous incarnation: its origin places it again
                    self.stale_msgs += 1
                    if far:  # it learns this incarnation from the answer
                        out.append(self._notice(src))
                    return out
                if m.flags & _RESENT and origin != self.me and self._dedup(origin, m.id, out):
                    return out
                task = Task(
                    m.id, m.job, m.priority, m.arg0, m.arg1, m.meta, origin=origin, hops=m.hops
                )
                if m.flags & _GANG:  # a gang's reservation or commit (docs/PROTOCOL.md 12)
                    return self._gang_dispatch(task, src, m.flags, now, out)
                # Placed work may move on (back to its origin); work sent here is for here.
                return self._act(sched.receive(task, src, bool(m.flags & _SUBMITTED)))
            elif kind == _SYNC_READY:  # SyncReady: id=group, arg0=step, arg1=sent, arg2=member
                return self._sync_msg(m.id, m.flags, m.arg0, m.arg1, m.arg2)
            elif kind == _COMPLETE:  # Complete: id=task (this node's), job, runtime, ...
                tid = m.id
                if m.arg2 >= _HELD:  # not a completion: a gang's answer (PROTOCOL.md 12)
                    return self._gang(self.gangs.answer(src, tid, m.arg2 == _HELD, now), out)
                holder = self.peers.holder(self._my_key | tid)
                if holder is None:  # a repeat (the answer to a RESENT DISPATCH): done once
                    self.dup_completes += 1
                    return out
                if holder != src:
                    self.ran_twice += 1
                    _log.warning(
                        "node %d: task %d completed on node %d, and was placed again on node "
                        "%d: it ran (or runs) twice",
                        self.me,
                        tid,
                        src,
                        holder,
                    )
                sched.remote_complete(src, tid)
                out.append(_new(CompleteNotice, (tid, src)))
                if self.gangs.member_of:
                    self.gangs.member_done(self._my_key | tid)
            elif kind != _HEARTBEAT:  # a heartbeat is all in `seen` above
                self._reject("unknown-kind", f"kind {kind} from node {src}")
        except (SchedulerError, ValueError) as exc:
            # Counted by the scheduler too; the message is refused, the node goes on.
            self._trigger_ns = 0
            self._reject(type(exc).__name__, str(exc))
        finally:
            sched.cause(0, 0, 0, 0)
        if fell and self.gangs.waiting:  # (a HEARTBEAT or a COMPLETE: they come here)
            self._gang(self.gangs.poll(now), out)
        return out

    def _relay(self, m: Message, peer: int) -> list[Effect]:
        """`m` is for another node: on to the next hop of its route, within the hop bound
        (docs/PROTOCOL.md section 10). Nothing here acts on it; it is not a sign of life of
        its origin (only of `peer`, whose load hint it carries)."""
        if peer not in self._shunned:
            self.peers.seen(peer, m.load)
        if m.relays >= self.max_relays:
            return self._drop_relay(m, peer, "hop-bound")
        nxt = self._next_hop(m.src, m.dst)
        if self._shunned:  # some node is dead: the route around it, the same on every node
            alt = self._around(m.src, m.dst, peer, nxt)
            if alt != nxt:
                self.rerouted += 1
                nxt = alt
        if nxt == _OFF_ROUTE:  # sent around a dead node: on from here, not back
            nxt = self._detour(m.dst, peer)
            if nxt < 0:
                return self._drop_relay(m, peer, "no-route")
        if nxt < 0:
            return self._drop_relay(m, peer, "no-route")
        if nxt in self._shunned:
            nxt = self._detour(m.dst, peer)
            if nxt < 0:
                return self._drop_relay(m, peer, "dead-hop")
        self.relayed += 1
        return [_new(Relay, (nxt, m))]

    def _drop_relay(self, m: Message, peer: int, why: str) -> list[Effect]:
        self.relay_dropped[why] = self.relay_dropped.get(why, 0) + 1
        _log.info(
            "node %d: dropped a message from node %d for node %d (relays %d, from lane %d): %s",
            self.me,
            m.src,
            m.dst,
            m.relays,
            peer,
            why,
        )
        return []

    def _detour(self, dst: int, back: int = -1) -> int:
        """The next hop from here to `dst` on the topology's first candidate path that
        avoids every link this node knows is dead and `back` (the lane the message came
        on), or -1 (docs/PROTOCOL.md section 10)."""
        topo = self.topology
        if topo is None:
            return -1
        avoid = self._shunned if back < 0 else self._shunned | {back}
        try:
            nxt = topo.path(self.me, dst, dead=avoid)[1]
        except (ConfigError, IndexError, ValueError):
            return -1
        if nxt not in self.links or nxt in avoid:
            return -1
        self.rerouted += 1
        return nxt

    def _around(self, src: int, dst: int, back: int, nxt: int) -> int:
        """The next hop from here of a message from `src` for `dst` (come in on lane
        `back`; -1: made here) while some nodes are known dead: on the topology's first
        route from `src` that avoids every one of them, if this node is on it, so that
        every node on the way takes the same route (a detour chosen hop by hop, around
        only the next hop, can loop: A's route crosses a dead node two hops on, so B sends
        it back). Else around them from here (`_detour`); else `nxt`, the static next hop
        (the caller drops what cannot go on)."""
        key = (src, dst, back)
        cached = self._arounds.get(key)
        if cached is not None:
            return int(cached)
        topo = self.topology
        dead = self._shunned
        got = nxt
        if topo is not None:
            try:
                p = topo.path(src, dst, dead=dead.difference((src, dst)))
            except (ConfigError, IndexError, ValueError):
                p = []
            me = self.me
            if me != dst and me in p:  # (no negative index: compiled without wraparound)
                got = p[p.index(me) + 1]
            if got < 0 or got in dead or got not in self.links:
                alt = self._detour(dst, back)
                if alt >= 0:
                    got = alt
        if len(self._arounds) >= ROUTE_CACHE_MAX:
            self._arounds.clear()
        self._arounds[key] = got
        return got

    def _next_hop(self, src: int, dst: int) -> int:
        """Where this node sends a message from `src` for `dst`: the node after it on the
        route (docs/PROTOCOL.md 10; a function of (this node, src, dst) only, so the
        messages of one pair all take one path), or -1 if none of its links is."""
        key = (src, dst)
        nxt = self._routes.get(key)
        if nxt is not None:
            return nxt
        topo = self.topology
        if topo is None:
            nxt = dst if dst in self.links else -1
        else:
            try:
                try:
                    nxt = topo.next_hop(self.me, src, dst)
                except ValueError:  # not on the route from src: it went around a dead node
                    nxt = _OFF_ROUTE
            except (ConfigError, IndexError, ValueError):
                nxt = -1
            if nxt not in self.links and nxt != _OFF_ROUTE:
                nxt = -1
        if len(self._routes) >= ROUTE_CACHE_MAX:
            self._routes.clear()
        self._routes[key] = nxt
        return nxt

    # ---- the API (what the user asks) ----------------------------------------------------------
    def submit(self, task: Task, now: int, gang: int = 0) -> list[Effect]:
        """Run `task` here, on a lighter peer, or queue it here. `gang` > 0: `task` is a
        member of gang `task.job` of `gang` members, placed with the others all or nothing
        (docs/GANGS.md)."""
        self.now = now
        if gang:
            try:
                outs = self.gangs.declare(task, gang, now)
            except (SchedulerError, ValueError) as exc:
                self._reject(type(exc).__name__, str(exc))
                return []
            return self._gang(outs)
        return self._act(self._guard(lambda: self.scheduler.submit(task)))

    def dispatch(self, task: Task, now: int) -> list[Effect]:
        """Run `task` here (start it, preempt for it or queue it), bypassing placement."""
        self.now = now
        return self._act(self._guard(lambda: self.scheduler.dispatch(task)))

    def dispatch_to(self, peer: int, task: Task, now: int) -> list[Effect]:
        """Send `task` to `peer`, recorded as held there."""
        self.now = now
        try:
            self.scheduler.place_on(task, peer)
        except (SchedulerError, ValueError) as exc:
            self._reject(type(exc).__name__, str(exc))
            return []
        out: list[Effect] = []
        self._place(peer, self._dispatch_msg(task, False), out)
        return out

    def preempt(self, task_id: int | None, job: int | None, cancel: bool, now: int) -> list[Effect]:
        """Stop task `task_id` (or every task of `job`) held here."""
        self.now = now
        self._trigger_ns = now
        origin = None
        if task_id is not None:
            t = self.resolve(task_id, None)
            if t is None:
                self._trigger_ns = 0
                return []
            origin = t.origin
        elif cancel and job in self.gangs.gangs:  # a gang of this node: cancelled everywhere
            out = self._gang(self.gangs.cancel(job, now))
            sched = self.scheduler
            if any(t.job == job for t in (*sched.running(), *sched.queued())):
                self._act(self._guard(lambda: sched.preempt(job=job, cancel=True)), out)
            return out
        return self._act(
            self._guard(
                lambda: self.scheduler.preempt(task_id, job=job, cancel=cancel, origin=origin)
            )
        )

    def define_group(
        self, group: int, members: frozenset[int], now: int, overlap: bool = False
    ) -> list[Effect]:
        """Declare sync group `group` (`overlap`: its sync tasks take no slot, the
        scheduler's `define_group`); SYNC_READYs kept for it count now."""
        self.now = now
        me, cost = self.me, self.sync_cost_ns

        def step_task(g: int, step: int) -> Task:
            return Task(sync_task_id(g, step), g, 255, cost, payload={"step": step}, origin=me)

        try:
            self.scheduler.define_group(group, members, step_task, overlap=overlap)
            self.sync.define(group, members)
        except ValueError as exc:
            self._reject(type(exc).__name__, str(exc))
            return []
        self.groups[group] = members
        out: list[Effect] = []
        kept = self._early_sync.pop(group, ())
        self._early_sync_n -= len(kept)
        for flags, step, sent, node in kept:
            out += self._sync(self.sync.receive(group, flags, step, sent, node))
        return out

    def sync_ready(self, group: int, step: int, now: int) -> list[Effect]:
        """This node reached `step` of `group`: tell the group (every member without a
        topology; its leaf's combiner with one: rdmasched/daemon/sync.py)."""
        self.now = now
        if group not in self.groups:
            self._reject("unknown-group", f"sync_ready for undefined group {group}")
            return []
        return self._sync(self.sync.ready(group, step, now))

    def member_ready(
        self, group: int, step: int, member: int, sent_ns: int, now: int
    ) -> list[Effect]:
        """Member `member` reached `step` of `group` (its plain SYNC_READY, sent at
        `sent_ns`): to the sync protocol (rdmasched/daemon/sync.py; without a topology
        the last one releases the step here, with one this node combines it if it is its
        leaf's combiner). Kept if `group` is not defined here yet. (`receive` does this
        with a SYNC_READY; the central baseline's coordinator calls it for every node it
        decides for.)"""
        self.now = now
        return self._sync_msg(group, 0, step, sent_ns, member)

    def complete(self, task_id: int, origin: int | None, runtime_ns: int, now: int) -> list[Effect]:
        """The work of `task_id` (of `origin`) finished here: tell its origin, go on."""
        self.now = now
        if task_id in self.beside and (origin is None or origin == self.me):
            self.beside.discard(task_id)  # an overlapping sync's LATER work: nothing held
            return []
        task = self.resolve(task_id, origin)
        if task is None:
            return []
        try:
            actions = self.scheduler.complete(task.id, task.origin)
        except (SchedulerError, ValueError) as exc:
            self._reject(type(exc).__name__, str(exc))
            return []
        out: list[Effect] = []
        if task.origin == self.me and self.gangs.member_of:
            self.gangs.member_done(task.key)
        if task.origin != self.me:
            done = msg.Complete(task_id, task.job, runtime_ns, task.progress_ns)
            out.append(self._send(task.origin, done))
            kept = self._done
            kept[(task.origin << 64) | task_id] = (task.job, runtime_ns, task.progress_ns)
            if len(kept) > DONE_MAX:
                del kept[next(iter(kept))]
        self._act(actions, out)
        if self.gangs.waiting:  # a slot freed here (unless the queue took it): try them
            self._gang(self.gangs.poll(now), out)
        return out

    # ---- what the handlers returned ----------------------------------------------------------
    def preempted(self, victim: Task, progress_ns: int, now: int) -> list[Effect]:
        """The preempt handler for `victim` returned `progress_ns` (after a `PreemptTask`)."""
        self.now = now
        try:  # no _guard: this is on the hot path of every preemption
            actions = self.scheduler.yielded(victim.id, progress_ns, victim.origin)
        except (SchedulerError, ValueError) as exc:
            self._reject(type(exc).__name__, str(exc))
            actions = []
        return self._act(actions)

    def sync_done(self, task: Task, now: int) -> list[Effect]:
        """The sync handler for `task` is done (after a `RunSync`): the slot is free (an
        overlapping group's task held none: nothing to do)."""
        self.now = now
        if task.slot == NO_SLOT:
            self.beside.discard(task.id)
            return []
        try:  # no _guard (a closure per call): a sync step's path
            actions = self.scheduler.complete(task.id)
        except (SchedulerError, ValueError) as exc:
            self._reject(type(exc).__name__, str(exc))
            actions = []
        return self._act(actions)

    # ---- lookups --------------------------------------------------------------------------
    def resolve(self, task_id: int, origin: int | None, prefer: int | None = None) -> Task | None:
        """The task held here that `task_id` (of `origin`) names; None (and a rejection)
        if there is none or the name is ambiguous. Without `origin`: `prefer`'s task (a
        peer's PREEMPT names its own tasks first), this node's own, else the only one."""
        sched = self.scheduler
        if origin is not None:
            t = sched.lookup(task_id, origin)
            if t is None:
                self._reject("unknown-task", f"unknown task {task_id} of node {origin}")
            return t
        if prefer is not None:
            t = sched.lookup(task_id, prefer)
            if t is not None:
                return t
        t = sched.lookup(task_id, self.me)
        if t is not None:
            return t
        found = sched.find(task_id)
        if len(found) == 1:
            return found[0]
        if not found:
            self._reject("unknown-task", f"unknown task {task_id}")
        else:
            origins = [t.origin for t in found]
            self._reject("ambiguous-task", f"tasks {task_id} of nodes {origins}: pass origin=")
        return None

    # ---- internals ------------------------------------------------------------------------
    def _reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self.rejections += 1
        self.last_rejection = f"{reason}: {detail}"
        _log.warning("node %d: rejected (%s): %s", self.me, reason, detail)

    def _guard(self, fn: Callable[[], list[Action]]) -> list[Action]:
        """Scheduler input errors are counted and logged; the node keeps running."""
        try:
            return fn()
        except (SchedulerError, ValueError) as exc:
            self._reject(type(exc).__name__, str(exc))
            return []

    def _gang_dispatch(
        self, task: Task, src: int, flags: int, now: int, out: list[Effect]
    ) -> list[Effect]:
        """A DISPATCH with GANG from `src`: a reservation, or with COMMIT the start of the
        member held (docs/PROTOCOL.md 12). Only the member's coordinator sends either."""
        if task.origin != src:
            self._reject(
                "bad-gang", f"gang DISPATCH of task {task.id} of node {task.origin} from node {src}"
            )
            return out
        if flags & _COMMIT:
            return self._gang(self.gangs.commit(src, task, now), out)
        return self._gang(self.gangs.reserve(src, task, now), out)

    def _gang(self, outs: list[GangOut], out: list[Effect] | None = None) -> list[Effect]:
        """The gang table's outputs as effects (appended to `out`), in order: messages
        to send (docs/PROTOCOL.md 12), and the scheduler's actions."""
        if out is None:
            out = []
        o: Any
        for o in outs:
            t = type(o)
            if t is Reserve or t is Commit:
                m = self._dispatch_msg(o.task, False)
                g = msg.Dispatch(
                    m.task,
                    m.job,
                    m.priority,
                    m.cost_ns,
                    m.progress_ns,
                    m.origin,
                    m.hops,
                    payload=m.payload,
                    gang=True,
                    commit=t is Commit,
                )
                out.append(self._send(o.peer, g))
            elif t is Abort:
                ab = msg.Preempt(0, o.job, self.now, cancel=True, whole_job=True, gang=True)
                out.append(self._send(o.peer, ab))
            elif t is Answer:
                st = msg.HELD if o.held else msg.REFUSED
                out.append(self._send(o.origin, msg.Complete(o.task.id, o.task.job, 0, 0, st)))
            else:
                self._act([o], out)
        self._trigger_ns = 0
        if self.gangs.waiting:  # a gang that backs off is woken at the back-off's end
            self._arm(out, self.gangs.wake_at(self.now))
        return self._load_changed(out)  # a slot held or given back moves the hint too

    def _sync_msg(self, group: int, flags: int, step: int, sent: int, node: int) -> list[Effect]:
        """A SYNC_READY (id=group, flags, arg0=step, arg1=sent, arg2=member or sender):
        to the sync protocol, or kept (bounded) if `group` is not defined here yet."""
        if flags & _NOT_SYNC_FLAGS:
            self._reject("bad-flags", f"SYNC_READY of group {group} with flags {flags:#x}")
            return []
        if group in self.groups:
            return self._sync(self.sync.receive(group, flags, step, sent, node))
        if self._early_sync_n >= EARLY_SYNC_MAX:
            self._reject("unknown-group", f"SYNC_READY for undefined group {group}; none kept")
            return []
        self._early_sync.setdefault(group, []).append((flags, step, sent, node))
        self._early_sync_n += 1
        self.sync_early_kept += 1
        return []

    def _sync(self, outs: list[SyncOut]) -> list[Effect]:
        """The sync protocol's outputs as effects, in order."""
        out: list[Effect] = []
        for o in outs:
            if isinstance(o, SendSync):
                out.append(self._send(o.dst, o.message))
            elif isinstance(o, Release):
                self._trigger_ns = o.trigger_ns
                try:
                    actions = self.scheduler.release(o.group, o.step)
                except (SchedulerError, ValueError) as exc:
                    self._reject(type(exc).__name__, str(exc))
                    actions = []
                self._act(actions, out)
            else:
                self._reject(o.reason, o.detail)
        return out

    def _send(self, dst: int, message: ControlMessage) -> Send:
        """The one way the core sends: `message` for node `dst`. Every protocol (placement,
        sync, liveness) goes through here, so routing lives in one place: over the lane to
        `dst` if there is one, else to the next hop of its route (docs/PROTOCOL.md 10)."""
        if dst in self.links or self.topology is None:
            return _new(Send, (dst, message, dst))
        nxt = self._next_hop(self.me, dst)
        if self._shunned:  # some node is dead: the route around it (any relay of it)
            alt = self._around(self.me, dst, -1, nxt)
            if alt != nxt:
                self.rerouted += 1
                nxt = alt
        if nxt in self._shunned:  # the route's first relay is dead: around it, if a
            alt = self._detour(dst)  # route avoids the dead; else the driver drops it
            if alt >= 0:  # (a send to a dead peer, counted in `dropped`)
                nxt = alt
        if nxt < 0:  # not a node of the topology: the driver has no lane to it either
            self.relay_dropped["no-route"] = self.relay_dropped.get("no-route", 0) + 1
            _log.warning("node %d: no route to node %d", self.me, dst)
            return _new(Send, (dst, message, dst))
        return _new(Send, (nxt, message, dst))

    def _dispatch_msg(self, task: Task, submitted: bool, resent: bool = False) -> msg.Dispatch:
        return msg.Dispatch(
            task.id,
            task.job,
            task.priority,
            task.cost_ns,
            task.progress_ns,
            task.origin,
            task.hops,
            submitted,
            payload=task.payload,
            resent=resent,
        )

    def _act(self, actions: list[Action], out: list[Effect] | None = None) -> list[Effect]:
        """The scheduler's decisions as effects, in order (appended to `out`), and the
        load hint if it changed.

        Without `out`, when every action is one effect (starts and preemptions: the common
        case), the effects are written over `actions` in place and that list is returned:
        the scheduler hands over every list it returns (it keeps none), so the call makes
        no second list."""
        a: Any
        if out is None:
            for a in actions:
                t = type(a)
                if t is not Start and t is not Preempt:
                    out = []
                    break
            else:
                fx: list[Any] = actions  # the same list: each action replaced by its effect
                for i in range(len(fx)):
                    fx[i] = self._effect(fx[i])
                self._trigger_ns = 0
                return self._load_changed(fx)
        for a in actions:
            t = type(a)
            if t is Start or t is Preempt:
                out.append(self._effect(a))
            elif t is Forward:
                self._place(a.peer, self._dispatch_msg(a.task, True), out)
            elif t is Cancel:
                _log.info("node %d: task %d cancelled", self.me, a.task.id)
        self._trigger_ns = 0
        return self._load_changed(out)

    def _effect(self, a: Any) -> Effect:
        """The effect of a scheduler's `Start` (itself, or `RunSync` for a sync task) or
        `Preempt` (`PreemptTask`, with the trigger of the input being handled)."""
        if type(a) is Start:
            if a.task.group is None:
                return a
            if a.slot == NO_SLOT:  # an overlapping group's: not held by the scheduler
                self.beside.add(a.task.id)
            return _new(RunSync, (a.task, a.slot))
        # (the trigger made an int only here: a start carries none)
        return _new(PreemptTask, (a.victim, a.slot, a.cancel, self._trigger_ns))

    def _load_changed(self, out: list[Effect]) -> list[Effect]:
        """`out`, with a `SetLoad` appended if the load hint changed (and a `Wake`, if
        the scheduler wants one earlier than the one asked for)."""
        if self._no_thrash:
            self._arm(out, self.scheduler.wake_at())
        load = self.scheduler.load_hint()
        if load != self._load:
            self._load = load
            if load == self._fx_load0:
                out.append(self._fx0)
            elif load == self._fx_load1:
                out.append(self._fx1)
            else:
                self._fx_load1, self._fx1 = self._fx_load0, self._fx0
                self._fx_load0 = load
                self._fx0 = _new(SetLoad, (load,))
                out.append(self._fx0)
        return out

    def _arm(self, out: list[Effect], at: int | None) -> None:
        """A `Wake` at `at` appended to `out`, unless one no later is asked for already."""
        if at is not None and (self._wake_armed == 0 or at < self._wake_armed):
            self._wake_armed = at
            out.append(Wake(at))

    def _heartbeats(self, peers: Iterable[int] | None) -> list[Effect]:
        """A HEARTBEAT to every peer (also ones declared dead: its metadata says which
        incarnation of it this node knows as alive, or declared dead)."""
        now = self.now
        queued = self.scheduler.stats().queue_len
        running = len(self.scheduler.running())
        meta = self.members.heartbeat_meta
        if not self._far:
            return [
                self._send(p, msg.Heartbeat(now, queued, running, meta(p)))
                for p in (self.members.views if peers is None else peers)
            ]
        gossip = self.gossip_meta(consume=peers is None)
        return [
            self._send(p, msg.Heartbeat(now, queued, running, {**meta(p), **gossip}))
            for p in (self.members.views if peers is None else peers)
        ]

    def _apply(self, changes: list[Change]) -> list[Effect]:
        """Membership changes as effects, in order."""
        out: list[Effect] = []
        sched = self.scheduler
        for c in changes:
            # first: what a death or a return sets off (a readiness it completes, a task
            # placed again) is routed around the dead node (_send), not over it
            if isinstance(c, PeerGone):
                self._shunned.add(c.peer)
                self._arounds.clear()
                # what it relayed for this node's tasks may be lost with it: sent again
                self._resend_around(c.peer, out)
            elif isinstance(c, PeerJoined):
                self._shunned.discard(c.peer)
                self._arounds.clear()
            if self._far and not isinstance(c, Rejoined) and c.peer not in self.links:
                self._apply_far(c, out)
            elif isinstance(c, PeerGone):
                _log.warning(
                    "node %d: node %d (incarnation %d) is gone: %s", self.me, c.peer, c.inc, c.why
                )
                out.append(MarkDead(c.peer, c.why))
                # its gangs' members first, as a whole (docs/GANGS.md), then the rest
                self._gang(self.gangs.lost(c.peer, self.now), out)
                self._gang(self.gangs.drop_origin(c.peer), out)
                self._act(sched.peer_gone(c.peer), out)
                out += self._sync(self.sync.node_gone(c.peer))
            elif isinstance(c, PeerJoined):
                self.peers.revive(c.peer)
                out.append(Revive(c.peer, c.again))
                out += self._sync(self.sync.node_back(c.peer))
                if c.again or not self._opened or c.peer not in self.links:
                    # answer at once: a node that restarted or rejoined waits for our ack,
                    # and a peer not told at open() learns this incarnation. A first
                    # incarnation waits for no ack, and this node's heartbeat of open()
                    # names this incarnation to it (docs/PROTOCOL.md 4.2)
                    out += self._heartbeats([c.peer])
            elif isinstance(c, Rejoined):
                _log.warning(
                    "node %d: rejoining as incarnation %d (was %d): %s",
                    self.me,
                    c.new,
                    c.old,
                    c.why,
                )
                self.peers.refresh()  # their silence was ours
                self.peers.mark_stale()  # what they hold now, they drop (Replace below)
                self._gang(self.gangs.drop_origin(None), out)
                self._act(sched.drop_origin(None), out)
                out += self._heartbeats(None)
                if self._far:  # far holders of its tasks: see _notice_in
                    for p in self.peers.holders():
                        if p not in self.links:
                            self.members.replace_pending.add(p)
                            out.append(self._notice(p))
            elif isinstance(c, Replace):
                self._gang(self.gangs.lost(c.peer, self.now), out)
                self._act(sched.replace_held(c.peer, f"node {c.peer} dropped it (rejoin)"), out)
        views = self.members.views
        shunned = {p for p, v in views.items() if not v.alive}
        if self._far:
            shunned.update(p for p, f in self.members.far.items() if not f.alive)
        if shunned != self._shunned:
            self._arounds.clear()
        self._shunned = shunned
        self._unacked = {p for p, v in views.items() if not v.acked}
        return out

    # ---- hierarchical liveness and placement (docs/SCALE.md, "Liveness", "Placement") -----
    def _apply_far(self, c: PeerGone | PeerJoined | Replace, out: list[Effect]) -> None:
        """A change of a far node (no link, so no transport to mark dead or revive)."""
        sched, peer = self.scheduler, c.peer
        if isinstance(c, PeerGone):
            _log.info(
                "node %d: far node %d (incarnation %d) is gone: %s", self.me, peer, c.inc, c.why
            )
            self._pending_far.pop(peer, None)
            self._gang(self.gangs.drop_origin(peer), out)
            self.peers.drop_far(peer)
            if self.peers.known(peer):  # its records: placed again
                self._act(sched.peer_gone(peer), out)
                self.peers.forget(peer)
            else:
                self._act(sched.drop_origin(peer), out)
            out += self._sync(self.sync.node_gone(peer))  # a far member: its tree moves on
            self._cut_off(peer, out)
        elif isinstance(c, PeerJoined):
            if self.peers.known(peer):
                self.peers.revive(peer)
            out += self._sync(self.sync.node_back(peer))
            self._cut_off(peer, out)
            for m in self._pending_far.pop(peer, ()):
                self._place(peer, m, out)
        elif isinstance(c, Replace):
            self._act(sched.replace_held(peer, f"node {peer} dropped it (rejoin)"), out)
            self.peers.forget(peer)

    def _cut_off(self, node: int, out: list[Effect]) -> None:
        """A far node of another leaf died or came back: the members of its leaf with no
        link out of it (only its gateways, the members that have one, lead there) are
        unreachable while every gateway is dead, and nobody out of the leaf can hear of
        their death (a whole leaf that stops: its switch). The sync tree stops waiting for
        them, and waits again once a gateway is back (docs/SCALE.md section 10)."""
        topo = self.topology
        if topo is None or topo.leaf(node) == self._leaf:
            return
        leaf = topo.leaf(node)
        inner, gateways = self._gateways(leaf)
        cut = all(self.members.is_dead(g) for g in gateways)
        for q in inner:
            if cut and q not in self._cut:
                self._cut.add(q)
                out += self._sync(self.sync.node_gone(q))
            elif not cut and q in self._cut:
                self._cut.discard(q)
                if not self.members.is_dead(q):
                    out += self._sync(self.sync.node_back(q))

    def lost(self, node: int) -> bool:
        """`node` is dead in this node's view, or cut off (its leaf's gateways are)."""
        return self.members.is_dead(node) or node in self._cut

    def _gateways(self, leaf: int) -> tuple[list[int], list[int]]:
        """(members of `leaf` with links only in it, the members with a link out of it):
        the topology's, made once for every core that holds it (`Topology.shared`: a
        simulator's N cores would each split every leaf that loses a node, N² in all)."""
        topo = self.topology
        assert topo is not None
        return topo.shared(("gateways", leaf), lambda: _split_leaf(topo, leaf))

    def _notice(self, peer: int) -> Send:
        """A notice to far `peer`: this node's incarnation, and the one of `peer` it knows
        (0: none; the answer tells it). Sent through relays, ahead of what it concerns."""
        f = self.members.far_view(peer)
        f.told = f.inc
        s = self.scheduler
        meta = {"inc": self.members.inc, "ack": f.inc, "far": 1}
        return self._send(peer, msg.Heartbeat(self.now, s.stats().queue_len, 0, meta))

    def _notice_in(self, peer: int, meta: Any, now: int) -> list[Effect]:
        if not meta:
            return []
        changes, answer = self.members.on_notice(peer, meta, now)
        out = self._apply(changes) if changes else []
        if answer and not self.members.is_dead(peer):
            out.append(self._notice(peer))
        return out

    def _place(self, peer: int, m: msg.Dispatch, out: list[Effect]) -> None:
        """Send DISPATCH `m` to `peer`; to a far node, after a notice if it has not had
        one naming its current incarnation (so a DISPATCH meant for an incarnation that
        ended is never taken by the next), or once it answered if that is not known."""
        if not self._far or peer in self.links or m.origin != self.me:
            out.append(self._send(peer, m))
            return
        if peer not in self.members.far:
            self._summary_names(peer, out)
        f = self.members.far_view(peer)
        if f.inc == 0:  # ask; sent when it answers (or placed again if it is gone)
            q = self._pending_far.setdefault(peer, [])
            if not q:
                out.append(self._notice(peer))
            q.append(m)
            return
        if f.told != f.inc:
            out.append(self._notice(peer))
        out.append(self._send(peer, m))

    def _summaries_since(self, now: int) -> int:
        """Summaries heard before this are not used (docs/SCALE.md section 11)."""
        return now - 4 * self.dead_after_ns

    def _summary_names(self, peer: int, out: list[Effect]) -> None:
        """Far `peer`, of which this node keeps no view, is the node its leaf's summary
        names: learn the incarnation the summary gives (no notice asking for it)."""
        topo = self.topology
        assert topo is not None
        s = self.summaries.get(topo.leaf(peer))
        if s is not None and s[2] == peer and s[4] >= self._summaries_since(self.now):
            out += self._apply(self.members.learn(peer, s[3], False, self.now, "a domain summary"))

    # ---- nothing lost in a dying relay (docs/PROTOCOL.md 10, "Nothing lost") -------------
    def resend(self, peer: int, tasks: Iterable[Task], why: str) -> list[Effect]:
        """Send again (RESENT) the DISPATCHes of this node's `tasks`, held by `peer`: over
        the route as it is now (around the dead), behind one notice to a far node (the
        first may have been lost too). The target runs one only if it neither holds nor
        completed it, and answers a completed one with its COMPLETE again."""
        tasks = list(tasks)
        if not tasks:
            return []
        self.resent_tasks += len(tasks)
        _log.info(
            "node %d: %d tasks sent again to node %d (first: %d): %s",
            self.me,
            len(tasks),
            peer,
            tasks[0].id,
            why,
        )
        out: list[Effect] = []
        if self._far and peer not in self.links:
            out.append(self._notice(peer))
            if peer in self._pending_far:  # not sent yet: they go once the notice is answered
                return out
        out += [self._send(peer, self._dispatch_msg(t, False, True)) for t in tasks]
        return out

    def _resend_around(self, dead: int, out: list[Effect]) -> None:
        """`dead` died: the tasks of this node held by far nodes whose routes (either way)
        it relayed are sent again (their DISPATCH, or their COMPLETE, may be lost with it)."""
        topo = self.topology
        if topo is None:
            return
        for p in self.peers.holders():
            if p == dead or p in self.links or self.lost(p):
                continue
            if on_route(topo, self.me, p, dead, self._shunned - {dead}):
                out += self.resend(p, self.peers.held(p), f"node {dead} relayed for it and died")

    def _sweep(self, out: list[Effect]) -> None:
        """The second line: a task held by a far node at the last sweep and still held (no
        COMPLETE since, one to two periods) is sent again; the target answers if done."""
        seen = self._unanswered
        now: set[int] = set()
        for p in self.peers.holders():
            if p in self.links or self.lost(p):
                continue
            again = []
            for t in self.peers.held(p):
                key = (t.origin << 64) | t.id
                if key in seen:
                    again.append(t)
                now.add(key)
            out += self.resend(p, again, "no COMPLETE for a resend period")
        self._unanswered = now

    def _dedup(self, origin: int, tid: int, out: list[Effect]) -> bool:
        """A RESENT DISPATCH of task `tid` of `origin`: True (and the answer in `out`) if
        it is held here (nothing to do: its COMPLETE comes when it ends) or was completed
        here (its COMPLETE again); False: run it (the first DISPATCH was lost)."""
        key = (origin << 64) | tid
        done = self._done.get(key)
        if done is not None:
            self.dup_dispatches += 1
            out.append(self._send(origin, msg.Complete(tid, done[0], done[1], done[2])))
            return True
        if self.scheduler.lookup(tid, origin) is not None:
            self.dup_dispatches += 1
            return True
        return False

    def _keep_far(self, node: int) -> bool:
        """A far view this node still needs: it holds a task of ours, or may send one."""
        f = self.members.far.get(node)
        return (
            self.peers.known(node)
            or node in self._pending_far
            or (f is not None and f.acked == self.members.inc)
        )

    def gossip_meta(self, consume: bool) -> dict[str, Any]:
        """The news and domain summaries of the next heartbeats (docs/SCALE.md):
        `"news"`, at most NEWS_MAX entries; `"sum"`, this node's leaf's summary and at
        most SUMMARIES_PER_BEAT others, in turn. `consume`: a round to every link."""
        out: dict[str, Any] = {}
        news = self.members.news_out(consume)
        if news:
            out["news"] = news
        sums = []
        mine = self.summaries.get(self._leaf)
        if mine is not None:
            sums.append([self._leaf, *mine[:4]])
        others = self._sum_order
        if others is None:
            others = self._sum_order = sorted(k for k in self.summaries if k != self._leaf)
        n = len(others)
        if n:
            k = self._sum_next % n
            for i in range(min(n, SUMMARIES_PER_BEAT)):  # the next in turn, from k round
                leaf = others[(k + i) % n]
                sums.append([leaf, *self.summaries[leaf][:4]])
            if consume:
                self._sum_next = k + SUMMARIES_PER_BEAT
        if sums:
            out["sum"] = sums
        return out

    def _gossip_in(self, meta: Any, now: int) -> list[Effect]:
        """A link's heartbeat's news and summaries."""
        out: list[Effect] = []
        topo = self.topology
        assert topo is not None
        n = len(topo)
        news = meta.get("news")
        if type(news) is list:
            for e in news[:NEWS_MAX]:
                if type(e) is list and len(e) == 3 and all(type(x) is int for x in e):
                    node, inc, dead = e
                    if 0 <= node < n:
                        changes = self.members.learn(node, inc, bool(dead), now)
                        if changes:
                            out += self._apply(changes)
        sums = meta.get("sum")
        if type(sums) is list:
            for e in sums[: 1 + SUMMARIES_PER_BEAT]:
                if type(e) is list and len(e) == 5 and all(type(x) is int for x in e):
                    leaf, version, load, node, inc = e
                    if 0 <= node < n and topo.leaf(node) == leaf and inc > 0:
                        self._summary_in(leaf, version, load, node, inc, now)
        return out

    def _summary_in(
        self, leaf: int, version: int, load: int, node: int, inc: int, now: int
    ) -> None:
        summaries = self.summaries
        cur = summaries.get(leaf)
        if cur is not None and version <= cur[0]:
            return
        if cur is None:
            if len(summaries) >= self.SUMMARY_MAX:  # drop the other leaf heard longest ago
                del summaries[self._oldest_summary()]
            self._sum_order = None
        summaries[leaf] = [version, load, node, inc, now]
        if leaf == self._leaf:  # never dropped: not in the heap
            return
        kept = self._sum_kept
        if cur is None:
            self._sum_count += 1
            kept[leaf] = self._sum_count
        heap = self._sum_heap
        if len(heap) > 4 * self.SUMMARY_MAX:  # mostly stale: made again from the table
            heap[:] = [(v[4], kept[k], k) for k, v in summaries.items() if k in kept]
            heapq.heapify(heap)
        else:
            heapq.heappush(heap, (now, kept[leaf], leaf))

    def _oldest_summary(self) -> int:
        """The other leaf of `summaries` heard longest ago, the first kept of those heard
        then (the order of the table: what a scan of it would choose), out of the heap."""
        heap, kept, summaries = self._sum_heap, self._sum_kept, self.summaries
        while True:
            heard, n, leaf = heapq.heappop(heap)
            s = summaries.get(leaf)
            if s is not None and s[4] == heard and kept.get(leaf) == n:
                del kept[leaf]
                return leaf

    def _summarize(self, now: int) -> list[Effect]:
        """Every tick: this leaf's summary if this node speaks for it (the lowest id alive
        in its view of the leaf), and the placement candidates out of the links."""
        topo = self.topology
        assert topo is not None
        views = self.members.views
        alive = [p for p in self._leaf_peers if views[p].alive]
        if not alive or self.me < alive[0]:
            loads = self.peers.loads()
            load, light = self.scheduler.load_hint(), self.me
            for p in alive:
                q = loads.get(p)
                if q is not None and (q, p) < (load, light):
                    load, light = q, p
            inc = self.members.inc if light == self.me else views[light].inc
            cur = self.summaries.get(self._leaf)
            self.summaries[self._leaf] = [1 if cur is None else cur[0] + 1, load, light, inc, now]
        fresh = self._summaries_since(now)
        far: dict[int, tuple[int, str]] = {}
        out: list[Effect] = []
        for leaf, (_, load, node, inc, heard) in self.summaries.items():
            if leaf == self._leaf or heard < fresh or node in self.links:
                continue
            if node in self.members.far and self.members.far_inc(node) < inc:
                # a later incarnation of a node kept in view; a node first named gets its
                # view when this node has business with it (_place): at 100,000 nodes the
                # nodes the summaries went through would be FAR_MAX views at every node
                out += self._apply(self.members.learn(node, inc, False, now, "a domain summary"))
            if not self.members.is_dead(node):
                far[node] = (load, topo.domain(node))
        self.peers.set_far(far)
        return out


__all__ = [
    "DONE_MAX",
    "EARLY_SYNC_MAX",
    "MAX_RELAYS",
    "RESEND_DEAD_AFTERS",
    "SYNC_ID_BASE",
    "CompleteNotice",
    "Effect",
    "MarkDead",
    "NodeCore",
    "PreemptTask",
    "Relay",
    "Revive",
    "RunSync",
    "Send",
    "SetLoad",
    "SetTimer",
    "Start",
    "Wake",
    "sync_task_id",
]
