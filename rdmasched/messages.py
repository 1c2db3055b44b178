"""The control messages as typed values: one small class per kind, with named fields.

docs/PROTOCOL.md section 4 (and 4.2 for what the daemon adds) says what every positional
field of a slot means for each kind; this module says it once, in code. Each class has

* `encode()`: the positional fields `Loop.send` and `TxLane.send` take after the peer,
  `(kind, id, job, priority, flags, arg0, arg1, arg2, hops, meta)` (an `Outgoing`), so a
  sender writes `loop.send(peer, *Preempt(task=7, job=1, trigger_ns=now).encode())`;
* `decode(m)`: the value from a received `rdmasched._wire.Message` (or anything with the
  same attributes), checking its kind.

`decode(m)` picks the class by `m.kind`. The classes are frozen, so a decoded message can
be kept and compared; `decode(encode(x)) == x` for every valid `x`.

Routing is the envelope, not part of these values (wire version 2, docs/PROTOCOL.md
sections 2 and 10): the node a message is for (`dst`), the node that made it (`src`) and
how many times it was relayed (`relays`) are slot header fields that `Loop.send` and
`TxLane.send` take as `dst=`, `src=`, `relays=` (the core's `Send` effect carries `dst`).
On a received `rdmasched._wire.Message`, `m.src` is the sender every kind below speaks of
(the origin of a COMPLETE's task's run, the holder of a handed-back DISPATCH, ...), and
`m.load` the load hint of the lane's own writer. `job` is a u32 since version 2: `encode()`
does not check ranges, the codec does (`MessageError`).

The daemon's receive path (`NodeCore.receive`) does not build these objects: it is the hot
path, and reads the same fields as plain ints in one function, following the mapping below
(tests/tier1/test_messages.py checks that both agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from rdmasched._wire import Message
from rdmasched.errors import MessageError
from rdmasched.wire import Flag, Kind

#: the fields of a message to send, as `Loop.send`/`TxLane.send` take them after the peer
Outgoing = tuple[int, int, int, int, int, int, int, int, int, dict[Any, Any] | None]

_DISPATCH, _PREEMPT, _SYNC_READY = int(Kind.DISPATCH), int(Kind.PREEMPT), int(Kind.SYNC_READY)
_COMPLETE, _HEARTBEAT = int(Kind.COMPLETE), int(Kind.HEARTBEAT)
_CANCEL, _JOB = int(Flag.CANCEL), int(Flag.JOB)
_SUBMITTED, _START, _RESENT = int(Flag.SUBMITTED), int(Flag.START), int(Flag.RESENT)
_GANG, _COMMIT = int(Flag.GANG), int(Flag.COMMIT)
#: SYNC_READY's flags: hierarchical sync's (rdmasched.daemon.sync: COMBINED, POD, RELEASE)
_SYNC_FLAGS = 0x10 | 0x20 | 0x40

#: COMPLETE status: the task ran to its end
DONE = 0
#: COMPLETE status (central baseline only, PROTOCOL.md 4.1): a preempted task's progress
YIELDED = 1
#: COMPLETE status (a gang's answer, PROTOCOL.md 12): not a completion; the member's slot is held
HELD = 2
#: COMPLETE status (a gang's answer, PROTOCOL.md 12): not a completion; no slot for the member
REFUSED = 3


class Relayed(NamedTuple):
    """A received message as its relay writes it on: `Loop.send(next_hop, *fields,
    src=src, dst=dst, relays=relays)`."""

    fields: Outgoing
    src: int
    dst: int
    relays: int


def relayed(m: Message) -> Relayed:
    """The one statement of docs/PROTOCOL.md section 10's relay rule: a message for another
    node goes on with every field unchanged but `relays` + 1 (the relay writes its own load
    hint in the slot, as every writer does). The daemon, the simulator and the tests' codec
    all relay through this."""
    return Relayed(
        (m.kind, m.id, m.job, m.priority, m.flags, m.arg0, m.arg1, m.arg2, m.hops, m.meta),
        m.src,
        m.dst,
        m.relays + 1,
    )


def _expect(m: Message, kind: int, flags: int) -> None:
    if m.kind != kind:
        raise MessageError(f"a {Kind(kind).name} cannot be decoded from a message of kind {m.kind}")
    if m.flags & ~flags:
        raise MessageError(f"a {Kind(kind).name} has no flags {m.flags & ~flags:#x}")


@dataclass(frozen=True, slots=True)
class Dispatch:
    """DISPATCH: run, queue or place task `task` of node `origin`.

    `submitted` (flag SUBMITTED): placed by `submit()`; a busy receiver may hand it back to
    its origin. `slot` (flag START, central baseline only): run it now on that slot; then
    arg2 carries the slot, not the origin (the task is the receiver's own: `origin` is 0).
    `resent` (flag RESENT): its origin sends it again (docs/PROTOCOL.md 10, "Nothing lost").
    `gang` (flag GANG): a gang member's reservation, or with `commit` (flag COMMIT) its start
    (docs/PROTOCOL.md 12).
    """

    task: int  #: id
    job: int  #: job
    priority: int = 0  #: priority
    cost_ns: int = 0  #: arg0: estimated cost
    progress_ns: int = 0  #: arg1: progress so far
    origin: int = 0  #: arg2: the node that owns the task (PROTOCOL.md 4.2)
    hops: int = 0  #: hops: how many times it was placed
    submitted: bool = False  #: flag SUBMITTED
    slot: int | None = None  #: flag START, arg2 (central baseline only)
    payload: dict[Any, Any] | None = None  #: metadata
    resent: bool = False  #: flag RESENT
    gang: bool = False  #: flag GANG
    commit: bool = False  #: flag COMMIT (with GANG)

    def __post_init__(self) -> None:
        if self.slot is not None and self.origin:
            raise MessageError("a DISPATCH with START carries the slot in arg2, not an origin")
        if self.commit and not self.gang:
            raise MessageError("a DISPATCH with COMMIT is a gang's: it needs GANG")

    def encode(self) -> Outgoing:
        flags = (_SUBMITTED if self.submitted else 0) | (_RESENT if self.resent else 0)
        flags |= (_GANG if self.gang else 0) | (_COMMIT if self.commit else 0)
        arg2 = self.origin
        if self.slot is not None:
            flags |= _START
            arg2 = self.slot
        return (
            _DISPATCH,
            self.task,
            self.job,
            self.priority,
            flags,
            self.cost_ns,
            self.progress_ns,
            arg2,
            self.hops,
            self.payload,
        )

    @classmethod
    def decode(cls, m: Message) -> Dispatch:
        _expect(m, _DISPATCH, _SUBMITTED | _START | _RESENT | _GANG | _COMMIT)
        start = bool(m.flags & _START)
        return cls(
            m.id,
            m.job,
            m.priority,
            m.arg0,
            m.arg1,
            0 if start else m.arg2,
            m.hops,
            bool(m.flags & _SUBMITTED),
            m.arg2 if start else None,
            m.meta,
            bool(m.flags & _RESENT),
            bool(m.flags & _GANG),
            bool(m.flags & _COMMIT),
        )


@dataclass(frozen=True, slots=True)
class Preempt:
    """PREEMPT: stop task `task` (or, `whole_job`, every task of `job`); `cancel` drops it
    instead of requeueing it. `trigger_ns`: CLOCK_MONOTONIC of the event that made the
    preemption necessary (the send time for a plain PREEMPT). `gang` (flag GANG, with JOB
    and CANCEL): abort the sender's gang `job` on the receiver (docs/PROTOCOL.md 12)."""

    task: int  #: id (0 with whole_job)
    job: int = 0  #: job
    trigger_ns: int = 0  #: arg0
    cancel: bool = False  #: flag CANCEL
    whole_job: bool = False  #: flag JOB
    gang: bool = False  #: flag GANG (with JOB and CANCEL)

    def encode(self) -> Outgoing:
        return self.stamped(self.trigger_ns)

    def stamped(self, trigger_ns: int) -> Outgoing:
        """`encode()` with `trigger_ns` as the trigger time: for a sender that builds the
        message ahead and stamps it at the moment it sends (building one takes about a
        microsecond, which would otherwise count in the preemption reaction)."""
        flags = (_CANCEL if self.cancel else 0) | (_JOB if self.whole_job else 0)
        if self.gang:
            flags |= _GANG
        return (_PREEMPT, self.task, self.job, 0, flags, trigger_ns, 0, 0, 0, None)

    @classmethod
    def decode(cls, m: Message) -> Preempt:
        _expect(m, _PREEMPT, _CANCEL | _JOB | _GANG)
        flags = m.flags
        gang = bool(flags & _GANG)
        if gang and flags & (_CANCEL | _JOB) != _CANCEL | _JOB:
            raise MessageError("a PREEMPT with GANG is a gang's abort: it needs JOB and CANCEL")
        return cls(m.id, m.job, m.arg0, bool(flags & _CANCEL), bool(flags & _JOB), gang)


@dataclass(frozen=True, slots=True)
class SyncReady:
    """SYNC_READY: node `member` reached step `step` of group `group`, sent at `sent_ns`
    (its CLOCK_MONOTONIC). `flags` 0x10 and up are hierarchical sync's (combined readiness,
    release: rdmasched/daemon/sync.py, docs/SCALE.md); with them `member` is the sender."""

    group: int  #: id
    step: int  #: arg0
    member: int  #: arg2
    sent_ns: int = 0  #: arg1
    job: int = 0  #: job (rdmasched's nodes send the group)
    flags: int = 0  #: flags (hierarchical sync)

    def encode(self) -> Outgoing:
        return (
            _SYNC_READY,
            self.group,
            self.job,
            0,
            self.flags,
            self.step,
            self.sent_ns,
            self.member,
            0,
            None,
        )

    @classmethod
    def decode(cls, m: Message) -> SyncReady:
        _expect(m, _SYNC_READY, _SYNC_FLAGS)
        return cls(m.id, m.arg0, m.arg2, m.arg1, m.job, m.flags)


@dataclass(frozen=True, slots=True)
class Complete:
    """COMPLETE, sent to the task's origin: task `task` (the origin's id) finished after
    `runtime_ns` with progress `progress_ns`; `status` DONE, or YIELDED (central baseline
    only: a preempted task's progress)."""

    task: int  #: id
    job: int = 0  #: job
    runtime_ns: int = 0  #: arg0
    progress_ns: int = 0  #: arg1
    status: int = DONE  #: arg2

    def encode(self) -> Outgoing:
        return (
            _COMPLETE,
            self.task,
            self.job,
            0,
            0,
            self.runtime_ns,
            self.progress_ns,
            self.status,
            0,
            None,
        )

    @classmethod
    def decode(cls, m: Message) -> Complete:
        _expect(m, _COMPLETE, 0)
        return cls(m.id, m.job, m.arg0, m.arg1, m.arg2)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """HEARTBEAT: the sender's clock, its queued and running tasks, and its incarnation
    map (PROTOCOL.md 4.2: `{"inc": ..., "ack": ..., "dead": ...}`; None from a peer that is
    not a daemon). The load hint travels in every message's header, not here."""

    clock_ns: int  #: arg0
    queued: int = 0  #: arg1
    running: int = 0  #: arg2
    incarnations: dict[Any, Any] | None = None  #: metadata

    def encode(self) -> Outgoing:
        return (
            _HEARTBEAT,
            0,
            0,
            0,
            0,
            self.clock_ns,
            self.queued,
            self.running,
            0,
            self.incarnations,
        )

    @classmethod
    def decode(cls, m: Message) -> Heartbeat:
        _expect(m, _HEARTBEAT, 0)
        return cls(m.arg0, m.arg1, m.arg2, m.meta)


ControlMessage = Dispatch | Preempt | SyncReady | Complete | Heartbeat

_BY_KIND: dict[int, Any] = {
    _DISPATCH: Dispatch,
    _PREEMPT: Preempt,
    _SYNC_READY: SyncReady,
    _COMPLETE: Complete,
    _HEARTBEAT: Heartbeat,
}


def decode(m: Message) -> ControlMessage:
    """The typed value of a received message; `MessageError` for a kind or flags that
    PROTOCOL.md section 4 does not define."""
    cls = _BY_KIND.get(m.kind)
    if cls is None:
        raise MessageError(f"no message kind {m.kind}")
    msg: ControlMessage = cls.decode(m)
    return msg
