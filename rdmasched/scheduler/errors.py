"""Errors raised by the scheduler.

Every error is also a builtin the caller would expect (an unknown id is a ``KeyError``, a
malformed task a ``ValueError``), so a daemon can catch either.  ``SchedulerError`` is the
common base, itself an ``rdmasched.errors.RdmaschedError``.

Every rejection is counted in ``Scheduler.stats().rejected`` under its ``reason`` and
recorded as a ``reject`` event before it is raised; the scheduler's state is unchanged by a
rejected call, so the daemon can log the error and carry on.
"""

from __future__ import annotations

from rdmasched.errors import RdmaschedError


class SchedulerError(RdmaschedError):
    """Base class of every scheduler error."""

    #: short, stable key under which the rejection is counted in ``stats().rejected``
    reason: str = "error"


class UnknownTaskError(SchedulerError, KeyError):
    """A task id that this scheduler does not hold (never seen, or already finished)."""

    reason = "unknown task"

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else self.reason


class UnknownJobError(SchedulerError, KeyError):
    """A PREEMPT for a job of which this scheduler holds no task."""

    reason = "unknown job"

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.reason


class UnknownGroupError(SchedulerError, KeyError):
    """A SYNC_READY (or group call) for a group that was never defined here."""

    reason = "unknown group"

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.reason


class UnknownMemberError(SchedulerError, KeyError):
    """A SYNC_READY from a member that is not in the group."""

    reason = "unknown member"

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.reason


class StaleStepError(SchedulerError, ValueError):
    """A SYNC_READY for a step that the group has already released."""

    reason = "stale step"


class DuplicateTaskError(SchedulerError, ValueError):
    """A task whose id is already held by this scheduler."""

    reason = "duplicate task"


class InvalidTaskError(SchedulerError, ValueError):
    """A task with a field out of range (id, priority, cost, progress)."""

    reason = "invalid task"


class TaskStateError(SchedulerError, ValueError):
    """A call that does not fit the task's state (e.g. ``complete`` of a queued task)."""

    reason = "bad state"
