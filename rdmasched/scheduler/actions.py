"""Actions: what a scheduler call asks the daemon to do, in order.

Each action is a small immutable record (a ``NamedTuple``: frozen, no ``__dict__``,
usable in ``match``).  Being tuples, two actions of different kinds with equal fields
compare equal; compare kinds with ``isinstance`` or ``match``.
"""

from __future__ import annotations

from typing import NamedTuple

from rdmasched.scheduler.task import Task


class Start(NamedTuple):
    """Run ``task`` on ``slot`` now (resume from ``task.progress_ns``)."""

    task: Task
    slot: int


class Preempt(NamedTuple):
    """Stop ``victim`` on ``slot`` now: call the user's preempt handler.

    The handler checkpoints or yields and returns the victim's progress; the daemon then
    calls ``Scheduler.yielded(victim.id, progress_ns)``, which requeues the victim (or
    drops it when ``cancel``).  The slot is free once the handler returns: a ``Start`` on
    the same slot may follow in the same action list.
    """

    victim: Task
    slot: int
    by: Task | None  #: the task that takes the slot, None for a PREEMPT from a peer
    cancel: bool  #: True: the victim is cancelled, not requeued


class Cancel(NamedTuple):
    """``task`` was queued and is cancelled; it never runs (or never runs again) here."""

    task: Task


class Forward(NamedTuple):
    """Send ``task`` to ``peer`` as a DISPATCH (``task.hops`` already counts this hop)."""

    task: Task
    peer: int


Action = Start | Preempt | Cancel | Forward
