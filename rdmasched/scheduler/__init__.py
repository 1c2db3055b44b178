"""The scheduler policy core: pure decision logic, driven by the daemon, on any clock.

See docs/SCHEDULER.md for the rules. ``core`` and ``task`` are compiled where built; with
RDMASCHED_PUREPYTHON set their Python sources are loaded instead (rdmasched/_purepython.py);
``IMPLEMENTATION`` says which ("compiled" or "python").
"""

from __future__ import annotations

import sys

from rdmasched import _purepython

if _purepython.wanted():  # (before the imports below load the modules it picks)
    # task first: the core imports it (and a plain core reads any Task; a compiled one, not)
    _purepython.load_source(sys.modules[__name__], "task")
    _purepython.load_source(sys.modules[__name__], "core")

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

#: "compiled" when the scheduler's core is the compiled module, else "python"
IMPLEMENTATION = sys.modules["rdmasched.scheduler.core"].IMPLEMENTATION

__all__ = [
    "DEFAULT_MAX_HOPS",
    "IMPLEMENTATION",
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
