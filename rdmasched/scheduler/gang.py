"""Gangs: a job's tasks placed all or nothing across nodes (docs/GANGS.md is the contract).

A gang is a job id with a member count, declared on the node its members are submitted to
(`submit(task_id, job=J, gang=N)`): that node, the gang's **coordinator**, owns it. Its
identity is (coordinator, job). Pure and clock-driven like the scheduler: `GangTable` takes
inputs (a member declared, an answer, a peer lost, a tick) and returns `GangOut`s, which the
node core (rdmasched/daemon/core.py) turns into messages (docs/PROTOCOL.md section 12) and
effects. Both roles live here:

* the coordinator's: members collected (`GangIncomplete` while fewer than N), a placement
  planned on this node and its live links, each slot **reserved** (held free, nothing
  started), then **committed** when every reservation is held, or **aborted** when one is
  refused, with a randomised exponential back-off before the next attempt (its base the
  failed attempt's own answer time: a round trip, not a heartbeat). A waiting gang is tried
  again the moment capacity may have appeared: the node core calls `poll` when a slot frees
  here, when a peer's load hint falls, and at the back-off's end (`wake_at`);
* a target's: a reservation held on a free slot (never a queued one) for at most `hold_ns`,
  started on its commit, given back on an abort, its timeout, or its coordinator's death.

No deadlock: a reservation never waits (a node without a free slot refuses at once) and a
coordinator never waits while it holds (one refusal aborts every hold of the attempt), so no
gang holds slots while it waits for another's; holds also expire. Two gangs that each fit
alone but not together can refuse each other (a livelock, not a deadlock): the back-off,
random and doubling per attempt, makes a repeat of the collision ever less likely.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from rdmasched.limits import GANG_MAX
from rdmasched.scheduler.actions import Action
from rdmasched.scheduler.core import Scheduler
from rdmasched.scheduler.errors import SchedulerError
from rdmasched.scheduler.placement import PeerTable
from rdmasched.scheduler.reasons import Code, Reason, gang_incomplete, gang_too_large, gang_waiting
from rdmasched.scheduler.task import COMPUTE_PRIORITY_MAX, U64_MAX, Task, TaskState

#: a member waits: its gang has fewer members declared than its count
GANG_INCOMPLETE = str(Code.GANG_INCOMPLETE)
#: a member waits: its gang has more members than the live nodes it may use have slots
GANG_TOO_LARGE = str(Code.GANG_TOO_LARGE)
#: a member waits: its gang fits the live nodes but not their free slots now (or its
#: reservation is under way)
GANG_WAITING = str(Code.GANG_WAITING)
#: reason codes wait_reason() returns
REASONS = (GANG_INCOMPLETE, GANG_TOO_LARGE, GANG_WAITING)

#: times a placed gang is placed again after it lost a member (a node died under it), by
#: default; one more loss and it fails
MAX_RESTARTS = 3
#: failed gangs remembered (`failed`), at most
FAILED_MAX = 1024
#: the shortest back-off base after a refused attempt (ns): an attempt answered faster than
#: this (every member on this node, or answers on one host's shared memory) still waits a
#: little, so that two coordinators that collided do not retry in lockstep
BACKOFF_MIN_NS = 10_000


class GangError(SchedulerError, ValueError):
    """A member that does not fit its gang (another count, a gang already placed, a
    repeated id) or a count out of range."""

    reason = "gang"


class Phase(enum.IntEnum):
    """Where a gang is, on its coordinator."""

    INCOMPLETE = 0  #: fewer members declared than its count
    WAITING = 1  #: complete, not placed: it does not fit now, or backs off
    RESERVING = 2  #: an attempt's reservations are out, answers awaited
    RUNNING = 3  #: committed: every member started (or on its way to its node)


# ---- outputs (the node core sends or carries them out, in order) ----------------------------
class Reserve(NamedTuple):
    """Ask `peer` to hold a free slot for member `task` (DISPATCH with GANG)."""

    peer: int
    task: Task


class Commit(NamedTuple):
    """Tell `peer` to start member `task` on the slot it holds (DISPATCH with GANG, COMMIT)."""

    peer: int
    task: Task


class Abort(NamedTuple):
    """Tell `peer` to drop gang `job` of this node: holds given back, members cancelled
    (PREEMPT with GANG, JOB, CANCEL)."""

    peer: int
    job: int


class Answer(NamedTuple):
    """Tell coordinator `origin` whether member `task`'s slot is held here (COMPLETE with
    status HELD or REFUSED)."""

    origin: int
    task: Task
    held: bool


GangOut = Reserve | Commit | Abort | Answer | Action


class Gang:
    """One gang on its coordinator."""

    __slots__ = (
        "attempt_until",
        "attempts",
        "done",
        "held",
        "job",
        "local",
        "members",
        "pending",
        "phase",
        "placed",
        "reason",
        "refused",
        "restarts",
        "retry_at",
        "seq",
        "size",
    )

    def __init__(self, job: int, size: int, seq: int) -> None:
        self.job = job
        self.size = size
        self.seq = seq  #: declaration order: the coordinator tries gangs in this order
        self.members: list[Task] = []
        self.phase = Phase.INCOMPLETE
        self.reason: str | None = GANG_INCOMPLETE
        #: member key -> the node it is placed (or being reserved) on
        self.placed: dict[int, int] = {}
        #: keys whose reservation answer is awaited
        self.pending: set[int] = set()
        #: peers that answered HELD in this attempt
        self.held: set[int] = set()
        #: member key -> the slot held for it on this node
        self.local: dict[int, int] = {}
        self.refused = False
        self.done: set[int] = set()
        self.attempts = 0  #: failed reservation attempts in a row
        self.restarts = 0  #: times it was placed again after it lost a member
        self.retry_at = 0
        self.attempt_until = 0

    def describe(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "size": self.size,
            "declared": len(self.members),
            "phase": self.phase.name.lower(),
            "reason": self.reason,
            "placed": sorted(set(self.placed.values())),
            "done": len(self.done),
            "attempts": self.attempts,
            "restarts": self.restarts,
        }


class _Hold:
    __slots__ = ("slot", "task", "until")

    def __init__(self, task: Task, slot: int, until: int) -> None:
        self.task = task
        self.slot = slot
        self.until = until


class GangTable:
    """The gangs this node coordinates and the reservations it holds for others' gangs.

    `nodes`: the nodes this node may place members on besides itself (its links);
    `capacity`: node -> its slots (this node's too). `hold_ns`: a reservation not committed
    by then is given back; `answer_ns`: an attempt whose answers are not all in by then
    counts the missing as refused; `backoff_ns`: the longest first back-off after a failed
    attempt. The first back-off is the attempt's answer time (from its reservations out to
    its last answer in) bounded to [BACKOFF_MIN_NS, backoff_ns], doubled per failed attempt
    in a row up to 2 x backoff_ns, times a random factor in [0.5, 1.5).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        peers: PeerTable,
        me: int,
        nodes: Iterable[int],
        capacity: Mapping[int, int],
        *,
        hold_ns: int,
        answer_ns: int,
        backoff_ns: int,
        rng: random.Random | None = None,
        max_restarts: int = MAX_RESTARTS,
    ) -> None:
        if not 0 < answer_ns <= hold_ns:
            raise ValueError(f"need 0 < answer_ns <= hold_ns, not {answer_ns}, {hold_ns}")
        self.sched = scheduler
        self.peers = peers
        self.me = me
        self.nodes = sorted(set(nodes) - {me})
        self.capacity = dict(capacity)
        self.hold_ns = hold_ns
        self.answer_ns = answer_ns
        self.backoff_ns = backoff_ns
        self.rng = rng if rng is not None else random.Random(me)
        self.max_restarts = max_restarts
        #: job -> gang coordinated here
        self.gangs: dict[int, Gang] = {}
        #: jobs of the gangs in Phase.WAITING (empty: the node core's hot paths skip `poll`)
        self.waiting: set[int] = set()
        #: member key -> its gang's job (empty: no gang here, the node core's hot paths skip)
        self.member_of: dict[int, int] = {}
        #: member key -> reservation held here for another node's gang
        self.holds: dict[int, _Hold] = {}
        #: job -> why it failed (bounded, oldest first out)
        self.failed: dict[int, str] = {}
        self._seq = 0
        #: counters (stats())
        self.n = dict.fromkeys(
            (
                "placed",
                "attempts_failed",
                "restarts",
                "failed",
                "holds",
                "holds_refused",
                "holds_expired",
                "stale_answers",
                "finished",
                "cancelled",
            ),
            0,
        )

    # ---- the coordinator -------------------------------------------------------------------
    def declare(self, task: Task, size: int, now: int) -> list[GangOut]:
        """Member `task` (of this node) of gang `task.job` of `size` members; once all are
        declared, the gang is placed (or waits with a reason)."""
        if type(size) is not int or not 1 <= size <= GANG_MAX:
            raise GangError(f"gang size must be 1..{GANG_MAX}, not {size!r}")
        if task.origin != self.me:
            raise GangError(f"task {task.id}: a gang's members are its coordinator's tasks")
        if (
            not 0 <= task.id <= U64_MAX
            or not 0 <= task.priority <= COMPUTE_PRIORITY_MAX
            or task.cost_ns < 0
            or task.progress_ns < 0
        ):  # (what the scheduler would refuse when the gang starts)
            raise GangError(f"task {task.id}: an id, priority, cost or progress out of range")
        key = task.key
        if key in self.member_of or self.sched.lookup(task.id) is not None or self.peers.holds(key):
            raise GangError(f"task {task.id} is already held here or by a peer")
        job = task.job
        g = self.gangs.get(job)
        if g is None:
            self._seq += 1
            g = self.gangs[job] = Gang(job, size, self._seq)
            self.failed.pop(job, None)
        elif g.size != size:
            raise GangError(f"gang {job} has {g.size} members, not {size}")
        elif g.phase is not Phase.INCOMPLETE:
            raise GangError(f"gang {job} has all its {g.size} members already")
        g.members.append(task)
        self.member_of[key] = job
        if len(g.members) < size:
            return []
        self._enter(g, Phase.WAITING)
        g.reason = GANG_WAITING
        return self.poll(now)

    def _enter(self, g: Gang, phase: Phase) -> None:
        g.phase = phase
        if phase is Phase.WAITING:
            self.waiting.add(g.job)
        else:
            self.waiting.discard(g.job)

    def wake_at(self, now: int) -> int | None:
        """When the next waiting gang's back-off ends (after `now`), or None: the node core
        asks its driver for a `Wake` then, and `poll`s."""
        gangs = self.gangs
        ats = [gangs[j].retry_at for j in self.waiting if gangs[j].retry_at > now]
        return min(ats) if ats else None

    def poll(self, now: int) -> list[GangOut]:
        """Try the waiting gangs, in declaration order, one attempt at a time."""
        if not self.waiting or any(g.phase is Phase.RESERVING for g in self.gangs.values()):
            return []
        for g in sorted((self.gangs[j] for j in self.waiting), key=_seq):
            plan = self._plan(g)
            if plan is None or now < g.retry_at:
                continue
            return self._attempt(g, plan, now)
        return []

    def _plan(self, g: Gang) -> list[int] | None:
        """The node of each member (this node's free slots first, then the lightest live
        links'), or None, with `g.reason` saying why it does not fit."""
        if any(self.sched.lookup(t.id) is not None for t in g.members):
            g.reason = GANG_WAITING  # an earlier placement's member is still being stopped
            return None
        live = [p for p in self.nodes if not self.peers.is_dead(p)]
        total = self.capacity.get(self.me, self.sched.nslots) + sum(
            self.capacity.get(p, 0) for p in live
        )
        if g.size > total:
            g.reason = GANG_TOO_LARGE
            return None
        loads = self.peers.loads()
        plan = [self.me] * min(g.size, self.sched.free_slots())
        for p in sorted((p for p in live if p in loads), key=lambda p: (loads[p], p)):
            if len(plan) >= g.size:
                break
            cap = self.capacity.get(p, 0)
            free = cap - (loads[p] * cap + 999) // 1000  # the busy slots its hint implies
            plan += [p] * max(0, min(free, g.size - len(plan)))
        if len(plan) < g.size:
            g.reason = GANG_WAITING
            return None
        return plan

    def _attempt(self, g: Gang, plan: list[int], now: int) -> list[GangOut]:
        self._enter(g, Phase.RESERVING)
        g.reason = GANG_WAITING
        g.placed.clear()
        g.pending.clear()
        g.held.clear()
        g.local.clear()
        g.refused = False
        g.attempt_until = now + self.answer_ns
        out: list[GangOut] = []
        for t, node in zip(g.members, plan, strict=True):
            key = t.key
            g.placed[key] = node
            if node == self.me:
                slot = self.sched.hold_slot()
                if slot < 0:  # (the plan counted this node's free slots: not expected)
                    g.refused = True
                else:
                    g.local[key] = slot
            else:
                g.pending.add(key)
                out.append(Reserve(node, t))
        if not g.pending:
            out += self._conclude(g, now)
        return out

    def answer(self, peer: int, task_id: int, held: bool, now: int) -> list[GangOut]:
        """Node `peer` answered the reservation (or the commit: REFUSED) of member `task_id`."""
        key = (self.me << 64) | task_id
        job = self.member_of.get(key)
        g = None if job is None else self.gangs.get(job)
        if g is None or g.placed.get(key) != peer:
            self.n["stale_answers"] += 1
            return []
        if g.phase is Phase.RESERVING and key in g.pending:
            g.pending.discard(key)
            if held:
                g.held.add(peer)
            else:
                g.refused = True
            return self._conclude(g, now) if not g.pending else []
        if g.phase is Phase.RUNNING and not held:  # its hold was gone when the commit came
            return self._restart(g, f"node {peer} had no slot held for task {task_id}", now)
        self.n["stale_answers"] += 1
        return []

    def _conclude(self, g: Gang, now: int) -> list[GangOut]:
        """Every answer of the attempt is in (or timed out): commit, or abort and back off."""
        out: list[GangOut] = []
        if not g.refused:
            self._enter(g, Phase.RUNNING)
            g.reason = None
            g.attempts = 0
            self.n["placed"] += 1
            for t in g.members:
                key = t.key
                node = g.placed[key]
                if node == self.me:
                    out += self.sched.start_held(t, g.local.pop(key))
                else:
                    t.hops += 1
                    t.state = TaskState.FORWARDED
                    self.peers.hold(node, t)
                    out.append(Commit(node, t))
            return out + self.poll(now)
        for slot in g.local.values():
            out += self.sched.release_slot(slot)
        g.local.clear()
        out += [Abort(p, g.job) for p in sorted(g.held)]
        g.held.clear()
        g.pending.clear()
        g.placed.clear()
        self._enter(g, Phase.WAITING)
        g.reason = GANG_WAITING
        g.attempts += 1
        self.n["attempts_failed"] += 1
        # doubled until it spans heartbeats: after an abort the targets' hints stay high
        # until their next heartbeat, which reaches every coordinator at once, so gangs that
        # collided and back off for less than a heartbeat try again together, every time.
        # Past two heartbeats it grows no more: a gang refused for want of room (stale
        # hints) would otherwise sit out tens of heartbeats while nodes free
        answered = now - (g.attempt_until - self.answer_ns)  # since its RESERVEs went out
        base = min(max(answered, BACKOFF_MIN_NS), self.backoff_ns)
        step = min(base << min(g.attempts - 1, 32), self.backoff_ns << 1)
        g.retry_at = now + int(step * (0.5 + self.rng.random()))
        return out + self.poll(now)

    def member_done(self, key: int) -> None:
        """A member of a gang of this node completed (here, or on the node it was placed on)."""
        job = self.member_of.get(key)
        g = None if job is None else self.gangs.get(job)
        if g is None or g.phase is not Phase.RUNNING:
            return
        g.done.add(key)
        if len(g.done) == g.size:
            self._forget(g)
            self.n["finished"] += 1

    def cancel(self, job: int, now: int) -> list[GangOut]:
        """Gang `job` of this node is cancelled (`preempt(job=J, cancel=True)` here): its
        slots held here given back, an ABORT to every live node it has members or holds on,
        and the gang forgotten. Its members running here the caller cancels (they are
        ordinary tasks of the scheduler by then)."""
        g = self.gangs.get(job)
        if g is None:
            return []
        out: list[GangOut] = []
        for slot in g.local.values():
            out += self.sched.release_slot(slot)
        g.local.clear()
        for node in sorted(set(g.placed.values()) - {self.me}):
            if g.phase is Phase.RUNNING:
                for key, n in g.placed.items():
                    if n == node:
                        self.peers.release(node, key)
            if not self.peers.is_dead(node):
                out.append(Abort(node, job))
        self._forget(g)
        self.n["cancelled"] += 1
        return out + self.poll(now)

    def _forget(self, g: Gang) -> None:
        del self.gangs[g.job]
        self.waiting.discard(g.job)
        for t in g.members:
            self.member_of.pop(t.key, None)

    def lost(self, peer: int, now: int) -> list[GangOut]:
        """Node `peer` is gone: an attempt counts its reservations as refused; a placed
        gang with a member there not done is stopped and placed again as a whole (or fails
        past `max_restarts`). Call it before the scheduler places again what `peer` held."""
        out: list[GangOut] = []
        for g in list(self.gangs.values()):
            if g.phase is Phase.RESERVING:
                if peer in g.placed.values():  # (held or not yet answered: it is gone)
                    g.pending.difference_update([k for k in g.pending if g.placed[k] == peer])
                    g.held.discard(peer)
                    g.refused = True
                    if not g.pending:
                        out += self._conclude(g, now)
            elif g.phase is Phase.RUNNING and any(
                n == peer and k not in g.done for k, n in g.placed.items()
            ):
                out += self._restart(g, f"node {peer} died under gang {g.job}", now)
        return out

    def _restart(self, g: Gang, why: str, now: int) -> list[GangOut]:
        """Stop every member of placed gang `g` (cancelled where it runs) and place the
        whole gang again, or fail it past `max_restarts`."""
        out: list[GangOut] = []
        aborted: set[int] = set()
        for t in g.members:
            key = t.key
            node = g.placed.get(key)
            if node == self.me:
                held = self.sched.lookup(t.id)
                if held is not None:
                    out += self.sched.preempt_task(held, True)
            elif node is not None:
                self.peers.release(node, key)
                if node not in aborted and not self.peers.is_dead(node):
                    aborted.add(node)
                    out.append(Abort(node, g.job))
        g.restarts += 1
        self.n["restarts"] += 1
        fresh = [
            Task(t.id, t.job, t.priority, t.cost_ns, payload=t.payload, origin=t.origin)
            for t in g.members
        ]
        g.members = fresh
        g.placed.clear()
        g.done.clear()
        if g.restarts > self.max_restarts:
            text = f"gang {g.job} failed: {why}; it was placed again {self.max_restarts} times"
            for t in fresh:
                self.sched.note(t, text)
            self._forget(g)
            self.failed[g.job] = text
            if len(self.failed) > FAILED_MAX:
                del self.failed[next(iter(self.failed))]
            self.n["failed"] += 1
            return out
        text = f"{why}: the whole gang is placed again (restart {g.restarts})"
        for t in fresh:
            self.sched.note(t, text)
        self._enter(g, Phase.WAITING)
        g.reason = GANG_WAITING
        g.retry_at = now + self.backoff_ns  # its cancelled members first leave their slots
        return out + self.poll(now)

    # ---- a target ----------------------------------------------------------------------------
    def reserve(self, origin: int, task: Task, now: int) -> list[GangOut]:
        """Coordinator `origin` asks for a slot for member `task`: held if one is free
        (idempotent: asked again, the same hold), else refused. Never queued."""
        key = task.key
        if key in self.holds:
            return [Answer(origin, task, True)]
        slot = -1 if self.sched.lookup(task.id, origin) is not None else self.sched.hold_slot()
        if slot < 0:
            self.n["holds_refused"] += 1
            return [Answer(origin, task, False)]
        self.holds[key] = _Hold(task, slot, now + self.hold_ns)
        self.n["holds"] += 1
        return [Answer(origin, task, True)]

    def commit(self, origin: int, task: Task, now: int) -> list[GangOut]:
        """Coordinator `origin` starts member `task` on the slot held for it; REFUSED if
        no hold is left (it expired)."""
        h = self.holds.pop(task.key, None)
        if h is None:
            return [Answer(origin, task, False)]
        try:
            return list(self.sched.start_held(task, h.slot))
        except SchedulerError:  # counted as a rejection
            return [*self.sched.release_slot(h.slot), Answer(origin, task, False)]

    def abort(self, origin: int, job: int, now: int) -> list[GangOut]:
        """Coordinator `origin` drops its gang `job` here: holds given back, its members
        held here cancelled."""
        out: list[GangOut] = self._release(lambda h: h.task.origin == origin and h.task.job == job)
        sched = self.sched
        for t in [*sched.running(), *sched.queued()]:
            if t.origin == origin and t.job == job:
                out += sched.preempt_task(t, True)
        return out

    def drop_origin(self, origin: int | None) -> list[GangOut]:
        """Node `origin` is gone (None: this node rejoined, every other node's): the holds
        for its gangs are given back."""
        return self._release(lambda h: origin is None or h.task.origin == origin)

    def _release(self, which: Any) -> list[GangOut]:
        out: list[GangOut] = []
        for key in [k for k, h in self.holds.items() if which(h)]:
            out += self.sched.release_slot(self.holds.pop(key).slot)
        return out

    # ---- time ----------------------------------------------------------------------------
    def tick(self, now: int) -> list[GangOut]:
        """Expired holds given back; an attempt past `answer_ns` concluded (the missing
        answers refused); the waiting gangs tried."""
        out: list[GangOut] = []
        expired = [k for k, h in self.holds.items() if h.until <= now]
        for key in expired:
            out += self.sched.release_slot(self.holds.pop(key).slot)
        self.n["holds_expired"] += len(expired)
        for g in list(self.gangs.values()):
            if g.phase is Phase.RESERVING and now >= g.attempt_until:
                g.pending.clear()
                g.refused = True
                out += self._conclude(g, now)
        return out + self.poll(now)

    # ---- views ---------------------------------------------------------------------------
    def gang_of(self, task_id: int) -> Gang | None:
        """The gang of this node's task `task_id`, if it is a member of one."""
        job = self.member_of.get((self.me << 64) | task_id)
        return None if job is None else self.gangs.get(job)

    def stats(self) -> dict[str, Any]:
        """Counters, the gangs coordinated here and the holds kept for others."""
        return {
            **self.n,
            # (a copy first: another thread may read this while the loop runs)
            "gangs": [g.describe() for g in sorted(list(self.gangs.values()), key=_seq)],
            "held_for_others": len(self.holds),
            "failed_gangs": dict(self.failed),
        }


def _seq(g: Gang) -> int:
    return g.seq


def wait_reason(table: GangTable, task_id: int, origin: int | None = None) -> str | None:
    """Why task `task_id` (of node `origin`, default the table's node) waits because of its
    gang: GANG_INCOMPLETE, GANG_TOO_LARGE, GANG_WAITING; None if it is no waiting gang
    member (not in a gang, or its gang is placed). For the `why` machinery."""
    if origin is not None and origin != table.me:
        return None  # a gang is known on its coordinator only
    g = table.gang_of(task_id)
    if g is None or g.phase is Phase.RUNNING:
        return None
    return g.reason


def _capacity(table: GangTable) -> tuple[int, int]:
    """(slots of this node and its live links, of them free now by the load hints)."""
    live = [p for p in table.nodes if not table.peers.is_dead(p)]
    loads = table.peers.loads()
    total = table.capacity.get(table.me, table.sched.nslots)
    free = table.sched.free_slots()
    for p in live:
        cap = table.capacity.get(p, 0)
        total += cap
        if p in loads:
            free += max(0, cap - (loads[p] * cap + 999) // 1000)
    return total, free


def _reason(table: GangTable, g: Gang) -> Reason | None:
    if g.phase is Phase.RUNNING or g.reason is None:
        return None
    if g.reason == GANG_INCOMPLETE:
        return gang_incomplete(g.job, len(g.members), g.size)
    total, free = _capacity(table)
    if g.reason == GANG_TOO_LARGE:
        return gang_too_large(g.job, g.size, total)
    return gang_waiting(g.job, g.size, free)


def why(table: GangTable, task_id: int, origin: int | None = None) -> list[Reason]:
    """The reasons task `task_id` (of `origin`) waits for its gang, as `Scheduler.why`
    gives a queued task's (one, or none: no waiting gang member here). `/why` asks this for
    a task the scheduler does not hold."""
    if wait_reason(table, task_id, origin) is None:
        return []
    g = table.gang_of(task_id)
    r = None if g is None else _reason(table, g)
    return [] if r is None else [r]


def waiting_counts(table: GangTable) -> dict[str, int]:
    """Reason code -> gang members waiting for it here (every gang code a key): added to
    `Scheduler.waiting_counts()` for the `rdmasched_tasks_waiting` gauge."""
    counts = dict.fromkeys(REASONS, 0)
    for g in list(table.gangs.values()):
        if g.phase is not Phase.RUNNING and g.reason in counts:
            counts[g.reason] += len(g.members)
    return counts
