"""The unit of work the scheduler places on an execution slot (a GPU)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any

# priorities are 0..255, higher is more urgent, 255 reserved for group sync tasks (254: the
# highest a compute task may carry); ids are u64. limits.py's bounds, named here too: the
# scheduler, its core and the telemetry import them from here
from rdmasched.limits import COMPUTE_PRIORITY_MAX as COMPUTE_PRIORITY_MAX
from rdmasched.limits import PRIORITY_MAX as PRIORITY_MAX
from rdmasched.limits import SYNC_PRIORITY as SYNC_PRIORITY
from rdmasched.limits import U64_MAX as U64_MAX

#: "compiled" when this module was built by Cython, else "python"
IMPLEMENTATION = "python" if __file__.endswith(".py") else "compiled"


def task_key(origin: int, task_id: int) -> int:
    """A task's identity on every node: its id is unique only on its origin node, so two
    nodes may both submit task 42; ``(origin, id)`` packed into one int names it."""
    return (origin << 64) | task_id


class TaskState(enum.IntEnum):
    """Where a task is in its life on this node."""

    NEW = 0  #: not (yet) held by a scheduler
    QUEUED = 1  #: waiting in the local queue
    RUNNING = 2  #: on a slot
    PREEMPTING = 3  #: taken off its slot; waiting for ``yielded()`` to be requeued
    CANCELLING = 4  #: taken off its slot; dropped once ``yielded()`` reports
    DONE = 5  #: completed here
    CANCELLED = 6  #: cancelled by a PREEMPT(cancel)
    FORWARDED = 7  #: handed to a peer by ``submit()``


# Compiled by Cython with task.pxd beside it (setup.py), Task is an extension type whose
# fields are C struct members: the compiled scheduler core reads and writes them directly
# instead of through Python attribute lookup.  Cython's dataclass has no ``slots=`` option
# (an extension type has fixed fields anyway); run as plain Python, ``_slotted`` below
# gives the class the slots that ``slots=True`` would.
@dataclass(eq=False)
class Task:
    """A task: identity and scheduling inputs, plus the scheduler's bookkeeping.

    Tasks compare by identity.  The bookkeeping fields (``state`` onwards) belong to the
    scheduler that holds the task; callers read them but do not write them.
    """

    id: int  #: u64, unique among the tasks of its origin (identity: ``task_key(origin, id)``)
    job: int  #: the job it belongs to (PREEMPT can name a whole job)
    priority: int  #: 0..254 for compute, 255 for sync tasks; higher is more urgent
    cost_ns: int  #: estimated run time; carried for the daemon and peers, not ranked on
    progress_ns: int = 0  #: work already done (set from the preempt handler on a yield)
    payload: dict[str, Any] | None = None  #: opaque to the scheduler
    origin: int = 0  #: node id that submitted it; it owns the task (docs/SCHEDULER.md)
    hops: int = 0  #: how many times it was forwarded between peers
    group: int | None = None  #: the sync group, for sync tasks
    step: int | None = None  #: the sync step, for sync tasks (set when released)

    state: TaskState = field(default=TaskState.NEW, init=False)
    slot: int | None = field(default=None, init=False)  #: the slot it runs on, if running
    #: when it entered this scheduler; orders tasks of equal priority (kept on a requeue
    #: after a priority preemption, reset by a PREEMPT from a peer)
    enqueued_ns: int = field(default=0, init=False)
    #: start of its current wait in the queue; the starvation cap counts from here
    waiting_since_ns: int = field(default=0, init=False)
    started_ns: int = field(default=0, init=False)  #: when it last started on a slot
    # the scheduler's live heap entries for this task (identity marks an entry live)
    qentry: tuple[int, int, int, int, Task] | None = field(default=None, init=False, repr=False)
    rentry: tuple[int, int, int, Task] | None = field(default=None, init=False, repr=False)
    # the task's fields as the event ring stores them (scheduler/events.py): id, origin, job
    # word, and priority | flags << 8 (0: not made yet).  Set once when a scheduler takes the
    # task in; compiled, they are C integers (task.pxd), so recording an event converts and
    # allocates nothing
    tel_id: int = field(default=0, init=False, repr=False)
    tel_origin: int = field(default=0, init=False, repr=False)
    tel_job: int = field(default=0, init=False, repr=False)
    tel_meta: int = field(default=0, init=False, repr=False)
    # the key the scheduler holding the task keeps it under (``key`` when it took the task
    # in; -1, never a key, before): its node core's path checks the task by it
    # (``preempt_task``) without making the 128-bit int again
    held_key: int = field(default=-1, init=False, repr=False)

    @property
    def key(self) -> int:
        """``task_key(origin, id)``: the task's identity on every node."""
        return (self.origin << 64) | self.id

    @property
    def is_sync(self) -> bool:
        """A group sync task (priority 255)."""
        return self.priority == SYNC_PRIORITY

    @property
    def remaining_ns(self) -> int:
        """Estimated work left: cost less progress, never below zero."""
        return max(0, self.cost_ns - self.progress_ns)


def _slotted(cls: type) -> type:
    """``cls``, a dataclass, made again as ``@dataclass(slots=True, eq=False)`` would have
    made it (Cython rejects ``slots=``, see above): from its own fields, so that the two
    cannot disagree."""
    fs = {f.name: f for f in fields(cls)}
    made = ("__init__", "__repr__", "__dataclass_fields__", "__dataclass_params__")
    skip = {*fs, *made, "__match_args__", "__dict__", "__weakref__"}
    ns: dict[str, object] = {k: v for k, v in cls.__dict__.items() if k not in skip}
    ns.update(fs)
    ns["__qualname__"] = cls.__qualname__
    return dataclass(slots=True, eq=False)(type(cls.__name__, cls.__bases__, ns))


if __file__.endswith(".py"):  # plain Python; compiled, Task is an extension type already
    globals()["Task"] = _slotted(Task)
