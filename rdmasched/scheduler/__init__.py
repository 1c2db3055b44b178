"""The scheduler policy core: pure decision logic, driven by the daemon, on any clock.

See docs/SCHEDULER.md for the rules.
"""

from __future__ import annotations

from rdmasched.scheduler.actions import Action, Cancel, Forward, Preempt, Start
from rdmasched.scheduler.clock import Clock, FakeClock
from rdmasched.scheduler.core import Scheduler, SchedulerStats
from rdmasched.scheduler.errors import (
    DuplicateTaskError,
    InvalidTaskError,
    SchedulerError,
    StaleStepError,
    TaskStateError,
    UnknownGroupError,
    UnknownJobError,
    UnknownMemberError,
    UnknownTaskError,
)
from rdmasched.scheduler.events import Decision, Event
from rdmasched.scheduler.placement import (
    DEFAULT_MAX_HOPS,
    PeerTable,
    can_spill,
    choose_peer,
)
from rdmasched.scheduler.task import SYNC_PRIORITY, Task, TaskState, task_key

__all__ = [
    "DEFAULT_MAX_HOPS",
    "SYNC_PRIORITY",
    "Action",
    "Cancel",
    "Clock",
    "Decision",
    "DuplicateTaskError",
    "Event",
    "FakeClock",
    "Forward",
    "InvalidTaskError",
    "PeerTable",
    "Preempt",
    "Scheduler",
    "SchedulerError",
    "SchedulerStats",
    "StaleStepError",
    "Start",
    "Task",
    "TaskState",
    "TaskStateError",
    "UnknownGroupError",
    "UnknownJobError",
    "UnknownMemberError",
    "UnknownTaskError",
    "can_spill",
    "choose_peer",
    "task_key",
]
