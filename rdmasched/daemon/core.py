"""`NodeCore`: a node's decision logic, sans-IO (like h11 or hyper-h2).

The core takes inputs (a received message, a timer tick, an API call, what a user's handler
returned) and returns **effects**: what the driver must do, in order. It owns the node's
`Scheduler`, its `PeerTable` and its `Membership`, and nothing else: no thread, no lane, no
socket and no clock of its own. Every input carries `now` (ns on the node's monotonic
clock); the scheduler and the peer table read that `now`, so a core driven with a fake
clock decides exactly as it would live. The threaded `Node` (node.py) is one driver; a test
or a simulator drives it by hand, delivering each `Send` to the peer's core.

Effects (docs/DAEMON.md, "The node core", is the contract):

* `Send(peer, message)`: send a typed message (rdmasched.messages) to `peer`. A `Heartbeat`
  goes even to a peer declared dead (it must learn that it was).
* `StartTask(task, slot)` (the scheduler's `Start`): call the dispatch handler.
* `PreemptTask(victim, slot, cancel, trigger_ns)`: call the preempt handler, then give its
  result back with `preempted(...)`; its effects come next, before the rest.
* `RunSync(task, slot)`: call the sync handler; unless it keeps the slot (`LATER`), give
  it back with `sync_done(...)`, whose effects come next.
* `CompleteNotice(task_id, node)`: a task of this node completed on `node`: call the
  complete handler.
* `SetTimer(at_ns)`: call `tick(now)` at `at_ns` (the heartbeat period).
* `MarkDead(peer, why)`: stop sending to `peer` (heartbeats aside), drop its queue.
* `Revive(peer, again)`: send to `peer` again (`again`: an earlier incarnation of it was
  known, so its transport may need re-attaching).
* `SetLoad(load)`: the load hint to carry in every message from now on.

Errors in inputs that depend on the state (an unknown task, a full queue) are counted in
`rejected` and logged; the core goes on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from rdmasched import messages as msg
from rdmasched._wire import Message
from rdmasched.daemon.membership import Change, Membership, PeerGone, PeerJoined, Rejoined, Replace
from rdmasched.messages import ControlMessage
from rdmasched.scheduler import (
    Action,
    Cancel,
    Forward,
    PeerTable,
    Preempt,
    Scheduler,
    SchedulerError,
    Start,
    Task,
)
from rdmasched.topology import Topology
from rdmasched.wire import Flag, Kind

_log = logging.getLogger("rdmasched.daemon")

_DISPATCH, _PREEMPT, _SYNC_READY = int(Kind.DISPATCH), int(Kind.PREEMPT), int(Kind.SYNC_READY)
_COMPLETE, _HEARTBEAT = int(Kind.COMPLETE), int(Kind.HEARTBEAT)
_CANCEL, _JOB, _SUBMITTED = int(Flag.CANCEL), int(Flag.JOB), int(Flag.SUBMITTED)

#: sync tasks get ids from their own space so they never collide with submitted tasks
SYNC_ID_BASE = 1 << 63
#: SYNC_READYs kept for groups not (yet) defined here, at most (over it: rejected)
EARLY_SYNC_MAX = 4096


def sync_task_id(group: int, step: int) -> int:
    return SYNC_ID_BASE | ((group & 0x7FFFFFFF) << 32) | (step & 0xFFFFFFFF)


# ---- effects ---------------------------------------------------------------------------------
#: build a NamedTuple from a tuple without its Python-level __new__ (the hot path makes one
#: per decision; the scheduler does the same with its actions)
_new = tuple.__new__


class Send(NamedTuple):
    """Send `message` to `peer` (a Heartbeat even to a peer declared dead)."""

    peer: int
    message: ControlMessage


#: Call the dispatch handler: run `task` on `slot` (the scheduler's own action, passed on).
StartTask = Start


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
    Send | Start | PreemptTask | RunSync | CompleteNotice | SetTimer | MarkDead | Revive | SetLoad
)


class NodeCore:
    """One node's decisions (see the module doc). Not thread-safe: one driver calls it."""

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
    ) -> None:
        """`nodes`: every node of the cluster (this one too) -> its topology domain.
        `topology`: the cluster's links and routes; None: every node is linked to every
        other (a full mesh: tests, small clusters, the central baseline)."""
        self.me = me
        self.topology = topology
        #: the nodes this one has a lane to (and heartbeats); any other is reached by relays
        self.links: frozenset[int] = (
            frozenset(n for n in nodes if n != me)
            if topology is None
            else frozenset(topology.links(me))
        )
        self.now = now
        self.heartbeat_ns = heartbeat_ns
        self.sync_cost_ns = sync_cost_ns
        # the time of the input being handled; a C-level callable (the scheduler reads it
        # several times per decision, and a Python method costs more)
        clock = functools.partial(getattr, self, "now")
        self.peers = PeerTable(clock=clock, dead_after_us=dead_after_ns // 1000)
        for n, domain in nodes.items():
            if n != me:
                self.peers.add(n, domain)
        self.members = Membership(
            me,
            nodes,
            inc=inc,
            dead_after_ns=dead_after_ns,
            heartbeat_ns=heartbeat_ns,
            now=now,
        )
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
        )
        #: peers whose messages are ignored (their incarnation ended)
        self._shunned: set[int] = set()
        #: peers that have not acknowledged this node's current incarnation
        self._unacked: set[int] = set()
        self.stale_msgs = 0
        #: message kind -> messages received (telemetry: docs/TELEMETRY.md)
        self.received: dict[int, int] = {}
        #: reason -> inputs refused
        self.rejected: dict[str, int] = {}
        self.groups: dict[int, frozenset[int]] = {}
        self.sync_early_kept = 0
        self._early_sync: dict[int, list[tuple[int, int]]] = {}
        self._early_sync_n = 0
        self._trigger_ns = 0
        self._load = -1

    # ---- time and liveness -------------------------------------------------------------------
    def open(self, now: int) -> list[Effect]:
        """The node starts: tell every peer this incarnation, first; arm the heartbeat.
        Peers count as heard from now: their silence while this node was still setting
        up (lanes, a verbs bootstrap) says nothing about them."""
        self.now = now
        self.members.last_tick_ns = now
        self.peers.refresh()
        out = self._heartbeats(None)
        out.append(SetTimer(now + self.heartbeat_ns))
        return out

    def tick(self, now: int, listened_ns: int | None = None) -> list[Effect]:
        """The heartbeat timer: declare silent peers dead (silence counted up to
        `listened_ns`, when the lanes were last read), send heartbeats, re-arm."""
        self.now = now
        out = self._apply(self.members.tick(now, self.peers.expired(listened_ns)))
        out += self._heartbeats(None)
        out.append(SetTimer(now + self.heartbeat_ns))
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
        """A message from `peer` (the node whose lane it came in on).

        The hot path of a node, and the daemon's one decoder of received messages: it
        reads the fields as plain ints, as rdmasched.messages names them, instead of
        building a message object (which costs about a microsecond) per message.
        """
        self.now = now
        kind = m.kind
        self.received[kind] = self.received.get(kind, 0) + 1
        out: list[Effect] = []
        if kind == _HEARTBEAT:  # Heartbeat: meta = incarnations
            changes = self.members.on_heartbeat(peer, m.meta, now)
            if changes:
                out = self._apply(changes)
        if peer in self._shunned:  # a message of an incarnation that ended
            self.stale_msgs += 1
            return out
        self.peers.seen(peer, m.load)
        sched = self.scheduler
        # the message every decision below records as its cause (docs/TELEMETRY.md)
        sent = m.arg0 if kind == _PREEMPT else m.arg1 if kind == _SYNC_READY else 0
        sched.cause(kind, m.src, m.seq, sent)
        try:
            if kind == _PREEMPT:  # Preempt: id=task, job, arg0=trigger_ns, CANCEL, JOB
                self._trigger_ns = m.arg0
                cancel = bool(m.flags & _CANCEL)
                if m.flags & _JOB:
                    return self._act(sched.preempt(job=m.job, cancel=cancel), out)
                t = self.resolve(m.id, None, prefer=peer)
                if t is not None:
                    return self._act(sched.preempt(m.id, cancel=cancel, origin=t.origin), out)
            elif kind == _DISPATCH:
                # Dispatch: id=task, job, priority, arg0=cost, arg1=progress, arg2=origin,
                # hops, meta=payload, SUBMITTED
                origin = int(m.arg2)
                if origin != self.me and peer in self._unacked:
                    # sent to this node's previous incarnation: its origin places it again
                    self.stale_msgs += 1
                    return out
                task = Task(
                    m.id, m.job, m.priority, m.arg0, m.arg1, m.meta, origin=origin, hops=m.hops
                )
                # Placed work may move on (back to its origin); work sent here is for here.
                return self._act(sched.receive(task, peer, bool(m.flags & _SUBMITTED)), out)
            elif kind == _SYNC_READY:  # SyncReady: id=group, arg0=step, arg1=sent, arg2=member
                return self.member_ready(m.id, m.arg0, m.arg2, m.arg1, now)
            elif kind == _COMPLETE:  # Complete: id=task (this node's), job, runtime, ...
                sched.remote_complete(peer, m.id)
                out.append(CompleteNotice(m.id, peer))
            elif kind != _HEARTBEAT:  # a heartbeat is all in `seen` above
                self._reject("unknown-kind", f"kind {kind} from node {peer}")
        except (SchedulerError, ValueError) as exc:
            # Counted by the scheduler too; the message is refused, the node goes on.
            self._trigger_ns = 0
            self._reject(type(exc).__name__, str(exc))
        finally:
            sched.cause(0, 0, 0, 0)
        return out

    # ---- the API (what the user asks) ----------------------------------------------------------
    def submit(self, task: Task, now: int) -> list[Effect]:
        """Run `task` here, on a lighter peer, or queue it here."""
        self.now = now
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
        return [self._send(peer, self._dispatch_msg(task, False))]

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
        return self._act(
            self._guard(
                lambda: self.scheduler.preempt(task_id, job=job, cancel=cancel, origin=origin)
            )
        )

    def define_group(self, group: int, members: frozenset[int], now: int) -> list[Effect]:
        """Declare sync group `group`; SYNC_READYs kept for it count now."""
        self.now = now
        me, cost = self.me, self.sync_cost_ns

        def step_task(g: int, step: int) -> Task:
            return Task(sync_task_id(g, step), g, 255, cost, payload={"step": step}, origin=me)

        self.scheduler.define_group(group, members, step_task)
        self.groups[group] = members
        out: list[Effect] = []
        kept = self._early_sync.pop(group, ())
        self._early_sync_n -= len(kept)
        for step, member in kept:
            self._act(
                self._guard(
                    lambda step=step, member=member: self.scheduler.sync_ready(  # type: ignore[misc]
                        group, step, member
                    )
                ),
                out,
            )
        return out

    def sync_ready(self, group: int, step: int, now: int) -> list[Effect]:
        """This node reached `step` of `group`: tell every member, count itself."""
        self.now = now
        mem = self.groups.get(group)
        if mem is None:
            self._reject("unknown-group", f"sync_ready for undefined group {group}")
            return []
        ready = msg.SyncReady(group, step, self.me, sent_ns=now, job=group)
        out: list[Effect] = [self._send(m, ready) for m in mem if m != self.me]
        self._trigger_ns = now
        me = self.me
        return self._act(self._guard(lambda: self.scheduler.sync_ready(group, step, me)), out)

    def member_ready(
        self, group: int, step: int, member: int, sent_ns: int, now: int
    ) -> list[Effect]:
        """Member `member` reached `step` of `group` (its SYNC_READY, sent at `sent_ns`):
        count it; the last one releases the step here. Kept if `group` is not defined
        here yet. (`receive` does this with a SYNC_READY; the central baseline's
        coordinator calls it for every node it decides for.)"""
        self.now = now
        if group not in self.groups:  # before our define_group: keep it
            self._keep_early_sync(group, step, member)
            return []
        self._trigger_ns = sent_ns
        return self._act(self._guard(lambda: self.scheduler.sync_ready(group, step, member)))

    def complete(self, task_id: int, origin: int | None, runtime_ns: int, now: int) -> list[Effect]:
        """The work of `task_id` (of `origin`) finished here: tell its origin, go on."""
        self.now = now
        task = self.resolve(task_id, origin)
        if task is None:
            return []
        try:
            actions = self.scheduler.complete(task.id, task.origin)
        except (SchedulerError, ValueError) as exc:
            self._reject(type(exc).__name__, str(exc))
            return []
        out: list[Effect] = []
        if task.origin != self.me:
            done = msg.Complete(task_id, task.job, runtime_ns, task.progress_ns)
            out.append(self._send(task.origin, done))
        return self._act(actions, out)

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
        """The sync handler for `task` is done (after a `RunSync`): the slot is free."""
        self.now = now
        return self._act(self._guard(lambda: self.scheduler.complete(task.id)))

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
        _log.warning("node %d: rejected (%s): %s", self.me, reason, detail)

    def _guard(self, fn: Callable[[], list[Action]]) -> list[Action]:
        """Scheduler input errors are counted and logged; the node keeps running."""
        try:
            return fn()
        except (SchedulerError, ValueError) as exc:
            self._reject(type(exc).__name__, str(exc))
            return []

    def _keep_early_sync(self, group: int, step: int, member: int) -> None:
        """A SYNC_READY for a group not defined here yet: keep it (bounded) for define."""
        if self._early_sync_n >= EARLY_SYNC_MAX:
            self._reject("unknown-group", f"SYNC_READY for undefined group {group}; none kept")
            return
        self._early_sync.setdefault(group, []).append((step, member))
        self._early_sync_n += 1
        self.sync_early_kept += 1

    def _send(self, dst: int, message: ControlMessage) -> Send:
        """The one way the core sends: `message` for node `dst`. Every protocol (placement,
        sync, liveness) goes through here, so routing lives in one place."""
        return _new(Send, (dst, message))

    def _dispatch_msg(self, task: Task, submitted: bool) -> msg.Dispatch:
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
        )

    def _act(self, actions: list[Action], out: list[Effect] | None = None) -> list[Effect]:
        """The scheduler's decisions as effects, in order (appended to `out`), and the
        load hint if it changed."""
        if out is None:
            out = []
        trigger = self._trigger_ns
        a: Any
        for a in actions:
            t = type(a)
            if t is Start:
                out.append(a if a.task.group is None else _new(RunSync, (a.task, a.slot)))
            elif t is Preempt:
                out.append(_new(PreemptTask, (a.victim, a.slot, a.cancel, trigger)))
            elif t is Forward:
                out.append(self._send(a.peer, self._dispatch_msg(a.task, True)))
            elif t is Cancel:
                _log.info("node %d: task %d cancelled", self.me, a.task.id)
        self._trigger_ns = 0
        load = self.scheduler.load_hint()
        if load != self._load:
            self._load = load
            out.append(_new(SetLoad, (load,)))
        return out

    def _heartbeats(self, peers: Iterable[int] | None) -> list[Effect]:
        """A HEARTBEAT to every peer (also ones declared dead: its metadata says which
        incarnation of it this node knows as alive, or declared dead)."""
        now = self.now
        queued = self.scheduler.stats().queue_len
        running = len(self.scheduler.running())
        meta = self.members.heartbeat_meta
        return [
            self._send(p, msg.Heartbeat(now, queued, running, meta(p)))
            for p in (self.members.views if peers is None else peers)
        ]

    def _apply(self, changes: list[Change]) -> list[Effect]:
        """Membership changes as effects, in order."""
        out: list[Effect] = []
        sched = self.scheduler
        for c in changes:
            if isinstance(c, PeerGone):
                _log.warning(
                    "node %d: node %d (incarnation %d) is gone: %s", self.me, c.peer, c.inc, c.why
                )
                out.append(MarkDead(c.peer, c.why))
                self._act(sched.peer_gone(c.peer), out)
            elif isinstance(c, PeerJoined):
                self.peers.revive(c.peer)
                out.append(Revive(c.peer, c.again))
                out += self._heartbeats([c.peer])  # answer at once: it waits for our ack
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
                self._act(sched.drop_origin(None), out)
                out += self._heartbeats(None)
            elif isinstance(c, Replace):
                self._act(sched.replace_held(c.peer, f"node {c.peer} dropped it (rejoin)"), out)
        views = self.members.views
        self._shunned = {p for p, v in views.items() if not v.alive}
        self._unacked = {p for p, v in views.items() if not v.acked}
        return out


__all__ = [
    "EARLY_SYNC_MAX",
    "SYNC_ID_BASE",
    "CompleteNotice",
    "Effect",
    "MarkDead",
    "NodeCore",
    "PreemptTask",
    "Revive",
    "RunSync",
    "Send",
    "SetLoad",
    "SetTimer",
    "StartTask",
    "sync_task_id",
]
