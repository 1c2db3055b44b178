"""Decision events: why the scheduler did what it did.

The scheduler keeps raw tuples ``(t_ns, decision, task_id, reason, beaten)`` in a bounded
ring (a ``deque(maxlen=N)``) so that recording costs one tuple and one append; they become
``Event`` records only when read.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Iterator
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


#: ``task_id`` of events that are about no task (e.g. a SYNC_READY for an unknown group)
NO_TASK = -1

RawEvent = tuple[int, Decision, int, str, tuple[int, ...]]


class Event(NamedTuple):
    """One decision: at ``t_ns`` the scheduler did ``decision`` to ``task_id``.

    ``beaten`` names the tasks it was chosen over: for a start from the queue, the task
    that was next in line; for a start that preempted, the victim.
    """

    t_ns: int
    decision: Decision
    task_id: int
    reason: str
    beaten: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``decision`` as its string, ``beaten`` as a list)."""
        return {
            "t_ns": self.t_ns,
            "decision": str(self.decision),
            "task_id": self.task_id,
            "reason": self.reason,
            "beaten": list(self.beaten),
        }

    def names(self, task_id: int) -> bool:
        """True if the event is about ``task_id``, as its subject or among ``beaten``."""
        return self.task_id == task_id or task_id in self.beaten


def to_jsonl(events: Iterable[Event]) -> Iterator[str]:
    """One compact JSON object per event, without the trailing newline."""
    for ev in events:
        yield json.dumps(ev.as_dict(), separators=(",", ":"))


def from_dict(d: dict[str, Any]) -> Event:
    """The inverse of ``Event.as_dict`` (for reading an exported log back)."""
    return Event(
        int(d["t_ns"]),
        Decision(d["decision"]),
        int(d["task_id"]),
        str(d["reason"]),
        tuple(int(x) for x in d["beaten"]),
    )
