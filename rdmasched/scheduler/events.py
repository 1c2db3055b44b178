"""Decision events: why the scheduler did what it did.

The scheduler records each event as ``WORDS`` unsigned 64-bit words in a preallocated
ring (an ``array('Q')``, a C array in the compiled core): recording one creates no Python
object.  They become ``Event`` records only when read (``decode``).  docs/TELEMETRY.md
describes every field; this module is the one place that knows the word layout.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple


class Decision(enum.StrEnum):
    """The kinds of event.  All but ``complete`` are decisions."""

    START = "start"  #: task started on a slot
    QUEUE = "queue"  #: task entered the queue (no slot for it, no preemption)
    PREEMPT = "preempt"  #: running task stopped (by priority, or by a peer's PREEMPT)
    REQUEUE = "requeue"  #: preempted task back in the queue after it yielded
    CANCEL = "cancel"  #: task cancelled (queued, or yielded after PREEMPT(cancel))
    KEEP = "keep"  #: a PREEMPT (requeue) named a task that was not running: left as is
    RELEASE = "release"  #: a sync group's step completed; its sync task was made
    FORWARD = "forward"  #: ``submit()`` sent the task to a peer
    REDISPATCH = "redispatch"  #: a dead peer's task taken back for dispatch
    REJECT = "reject"  #: bad input refused (see the reason); state unchanged
    COMPLETE = "complete"  #: task finished (bookkeeping, not a decision)


#: Decision by its code in the ring (the order of the enum)
DECISIONS: tuple[Decision, ...] = tuple(Decision)
D_START, D_QUEUE, D_PREEMPT, D_REQUEUE, D_CANCEL, D_KEEP = range(6)
D_RELEASE, D_FORWARD, D_REDISPATCH, D_REJECT, D_COMPLETE = range(6, 11)


class Rule(enum.IntEnum):
    """The rule that decided, by name (docs/SCHEDULER.md states each rule).

    Its value is the code in the ring; ``RULE_TEXT`` is the sentence ``Event.reason`` gives.
    """

    OTHER = 0  #: the reason is in the event's text (rejections, drops, redispatches)
    FREE_SLOT = 1  #: start: a slot was free
    HEAD = 2  #: start: a freed slot went to the head of the queue
    STARVED = 3  #: start: jumped the order by the starvation cap
    OUTRANKS = 4  #: start: preempted the lowest-priority running task
    NO_SLOT = 5  #: queue: no slot, does not outrank the lowest-priority running task
    BEHIND = 6  #: queue: no slot, ranks behind the queue head
    VICTIM = 7  #: preempt: the lowest-priority running task (ties: most recently started)
    PEER = 8  #: preempt: a PREEMPT from a peer
    PEER_CANCEL = 9  #: preempt/cancel: a PREEMPT(cancel) from a peer
    YIELDED = 10  #: requeue: the preempted task yielded its progress
    DONE = 11  #: complete: the task completed here
    PREEMPT_QUEUED = 12  #: keep: a PREEMPT of a queued task
    ALREADY_PREEMPTING = 13  #: keep: the task is already being preempted
    DONE_PREEMPTING = 14  #: complete: finished while its preempt handler ran
    GROUP_COMPLETE = 15  #: release: every member of the sync group reported the step
    LIGHTER_PEER = 16  #: forward: power-of-two choices found a lighter peer
    PLACED_ON = 17  #: forward: this node sent its task to the peer it named
    BACK_TO_ORIGIN = 18  #: forward: refused here, sent back to its origin (text: why)
    DONE_ON_PEER = 19  #: complete: a task this node forwarded completed on the peer
    DONE_QUEUED = 20  #: complete: finished after it yielded, before it started again
    QUANTUM = 21  #: queue: outranks only running tasks still within their run quantum
    BUDGET = 22  #: queue: outranks only running tasks whose preemption budget is spent


RULE_TEXT: dict[Rule, str] = {
    Rule.OTHER: "",
    Rule.FREE_SLOT: "free slot",
    Rule.HEAD: "head of queue",
    Rule.STARVED: "starvation cap: waited starvation_us",
    Rule.OUTRANKS: "outranks the lowest-priority running task",
    Rule.NO_SLOT: "no free slot; does not outrank the lowest-priority running task",
    Rule.BEHIND: "no free slot; ranks behind the queue head",
    Rule.VICTIM: "lowest-priority running task (ties: most recently started)",
    Rule.PEER: "PREEMPT from a peer",
    Rule.PEER_CANCEL: "PREEMPT(cancel) from a peer",
    Rule.YIELDED: "preempted task yielded its progress",
    Rule.DONE: "completed",
    Rule.PREEMPT_QUEUED: "PREEMPT of a queued task",
    Rule.ALREADY_PREEMPTING: "already being preempted",
    Rule.DONE_PREEMPTING: "completed while being preempted",
    Rule.GROUP_COMPLETE: "group {group} step {step} complete",
    Rule.LIGHTER_PEER: "to peer {peer}: load {peer_load} < {my_load}",
    Rule.PLACED_ON: "dispatched to peer {peer}",
    Rule.BACK_TO_ORIGIN: "back to origin",
    Rule.DONE_ON_PEER: "completed on peer {peer}",
    Rule.DONE_QUEUED: "completed after it yielded, before it started again",
    Rule.QUANTUM: "no free slot; outranks only tasks within their run quantum",
    Rule.BUDGET: "no free slot; outranks only tasks whose preemption budget is spent",
}

#: ``task_id`` of events that are about no task (e.g. a SYNC_READY for an unknown group)
NO_TASK = -1

# ---- the word layout of one event in the ring (docs/TELEMETRY.md, "The ring") ---------------
WORDS = 15
W_T, W_META, W_ID, W_ORIGIN, W_JOB, W_STEP, W_GROUP = range(7)
W_BEATEN, W_BEATEN2, W_PEER, W_LOADS, W_CAUSE, W_CAUSE_NS, W_WAIT, W_DEPTH = range(7, 15)
# W_META: decision (8 bits) | rule << 8 (8) | flags << 16 (16) | priority << 32 (8)
#         | (slot + 1) << 40 (24; 0: no slot)
# W_BEATEN2: origin of the beaten task (32) | how many it beat << 32
# W_PEER: peer (32) | peer that lost the power-of-two choice << 32 (0xFFFFFFFF: none)
# W_LOADS: peer's load (16) | loser's load << 16 | this node's load << 32
# W_CAUSE: message kind (8) | sender << 8 (24) | sequence number << 32
# W_DEPTH: queued (32) | running << 32, just after the decision
F_TASK = 1  #: the task fields (id, origin, job, priority) are set
F_BEATEN = 2  #: W_BEATEN/W_BEATEN2 name a task it beat
F_TEXT = 4  #: the reason is a text kept beside the ring
F_PEER = 8  #: W_PEER/W_LOADS are set (placement)
F_STEP = 16  #: W_STEP/W_GROUP are set (a sync task)
F_JOB = 32  #: W_JOB is set (the job fits a u64)
F_ID = 64  #: W_ID is set (without F_TASK: an event about a task id, no task)
F_CAUSE = 128  #: W_CAUSE/W_CAUSE_NS name the message that triggered the decision
NO_PEER = 0xFFFFFFFF


class Event(NamedTuple):
    """One decision: at ``t_ns`` the scheduler did ``decision`` to ``task_id``.

    ``beaten`` names the best task it was chosen over (at most one): for a start from the
    queue, the task that was next in line; for a start that preempted, the victim;
    ``n_beaten`` counts all the tasks it went ahead of.  The fields after ``beaten`` are
    None when they do not apply (docs/TELEMETRY.md lists them).
    """

    t_ns: int
    decision: Decision
    task_id: int
    reason: str
    beaten: tuple[int, ...]
    seq: int | None = None  #: the event's number on its node (0 = the first recorded)
    node: int | None = None  #: the node that decided
    rule: str | None = None  #: the Rule's name, e.g. "head"
    slot: int | None = None
    origin: int | None = None  #: the task's origin node (with task_id: its identity)
    job: int | None = None
    priority: int | None = None
    group: int | None = None  #: sync tasks: the group
    step: int | None = None  #: sync tasks: the step
    n_beaten: int = 0
    beaten_origin: int | None = None
    peer: int | None = None  #: forward: the peer chosen (or the peer named)
    lost_peer: int | None = None  #: forward: the peer that lost the power-of-two choice
    peer_load: int | None = None
    lost_load: int | None = None
    my_load: int | None = None
    cause: str | None = None  #: kind of the message that triggered it (None: a local call)
    cause_src: int | None = None  #: the node it came from
    cause_seq: int | None = None  #: its sequence number on the lane
    cause_sent_ns: int | None = None  #: when it was sent (its sender's clock; 0: unknown)
    wait_ns: int | None = None  #: start: how long it waited in the queue
    queued: int | None = None  #: tasks queued just after the decision
    running: int | None = None  #: tasks running just after the decision

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``decision`` as its string, ``beaten`` as a list); fields
        that do not apply (None) are left out."""
        d: dict[str, Any] = {
            "t_ns": self.t_ns,
            "decision": str(self.decision),
            "task_id": self.task_id,
            "reason": self.reason,
            "beaten": list(self.beaten),
        }
        for name in _OPTIONAL:
            v = getattr(self, name)
            if v is not None and not (name == "n_beaten" and v == 0):
                d[name] = v
        return d

    def names(self, task_id: int) -> bool:
        """True if the event is about ``task_id``, as its subject or among ``beaten``."""
        return self.task_id == task_id or task_id in self.beaten


_OPTIONAL = Event._fields[5:]
_CAUSES: dict[int, str] = {
    1: "DISPATCH",
    2: "PREEMPT",
    3: "SYNC_READY",
    4: "COMPLETE",
    5: "HEARTBEAT",
}
CAUSE_KIND = {v: k for k, v in _CAUSES.items()}


def decode(w: Any, base: int, seq: int, node: int | None, text: Mapping[int, str]) -> Event:
    """The event at ``w[base:base + WORDS]`` (``text``: the ring's kept texts by seq)."""
    meta = w[base + W_META]
    flags = (meta >> 16) & 0xFFFF
    rule = Rule((meta >> 8) & 0xFF)
    slot1 = (meta >> 40) & 0xFFFFFF
    has_task = bool(flags & F_TASK)
    tid = w[base + W_ID] if flags & (F_TASK | F_ID) else NO_TASK
    beaten: tuple[int, ...] = ()
    n_beaten = 0
    beaten_origin = None
    if flags & F_BEATEN:
        beaten = (w[base + W_BEATEN],)
        b2 = w[base + W_BEATEN2]
        beaten_origin = b2 & 0xFFFFFFFF
        n_beaten = b2 >> 32
    peer = lost = pl = ll = ml = None
    if flags & F_PEER:
        p = w[base + W_PEER]
        loads = w[base + W_LOADS]
        peer = p & 0xFFFFFFFF
        lost = p >> 32
        if lost == NO_PEER:
            lost = None
        else:
            ll = (loads >> 16) & 0xFFFF
        pl = loads & 0xFFFF
        ml = (loads >> 32) & 0xFFFF
    group = step = None
    if flags & F_STEP:
        group = w[base + W_GROUP]
        step = w[base + W_STEP]
    cause = cause_src = cause_seq = cause_ns = None
    if flags & F_CAUSE:
        c = w[base + W_CAUSE]
        cause = _CAUSES.get(c & 0xFF, str(c & 0xFF))
        cause_src = (c >> 8) & 0xFFFFFF
        cause_seq = c >> 32
        cause_ns = w[base + W_CAUSE_NS]
    if flags & F_TEXT:
        reason = text.get(seq, "")
    else:
        reason = RULE_TEXT[rule].format(peer=peer, peer_load=pl, my_load=ml, group=group, step=step)
    depth = w[base + W_DEPTH]
    decision = DECISIONS[meta & 0xFF]
    return Event(
        w[base + W_T],
        decision,
        tid,
        reason,
        beaten,
        seq=seq,
        node=node,
        rule=rule.name.lower(),
        slot=slot1 - 1 if slot1 else None,
        origin=w[base + W_ORIGIN] if has_task else None,
        job=w[base + W_JOB] if flags & F_JOB else None,
        priority=(meta >> 32) & 0xFF if has_task else None,
        group=group,
        step=step,
        n_beaten=n_beaten,
        beaten_origin=beaten_origin,
        peer=peer,
        lost_peer=lost,
        peer_load=pl,
        lost_load=ll,
        my_load=ml,
        cause=cause,
        cause_src=cause_src,
        cause_seq=cause_seq,
        cause_sent_ns=cause_ns,
        wait_ns=w[base + W_WAIT] if decision is Decision.START else None,
        queued=depth & 0xFFFFFFFF,
        running=depth >> 32,
    )


def to_jsonl(events: Iterable[Event]) -> Iterator[str]:
    """One compact JSON object per event, without the trailing newline."""
    for ev in events:
        yield json.dumps(ev.as_dict(), separators=(",", ":"))


def from_dict(d: Mapping[str, Any]) -> Event:
    """The inverse of ``Event.as_dict`` (for reading an exported log back).  Only
    ``t_ns``, ``decision``, ``task_id``, ``reason`` and ``beaten`` are required."""
    opt: dict[str, Any] = {}
    for name in _OPTIONAL:
        v = d.get(name)
        if v is not None:
            opt[name] = v if isinstance(v, str) else int(v)
    return Event(
        int(d["t_ns"]),
        Decision(d["decision"]),
        int(d["task_id"]),
        str(d["reason"]),
        tuple(int(x) for x in d["beaten"]),
        **opt,
    )
