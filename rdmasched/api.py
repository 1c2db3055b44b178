"""The scheduling API's types and argument checks, written once (docs/DAEMON.md, CLIENT.md).

`Node` (rdmasched.daemon.node: a host's daemon) and `Client` (rdmasched.client: a rank of
that host) offer one API, `NodeAPI`: the same methods, the same handler types and contracts,
the same argument checks, so code written for one runs on the other (the torch integration
takes either). This module holds what they share:

- the handler types (`DispatchHandler`, ...) and `LATER`, what a sync handler returns to
  keep its slot;
- the checks `submit`, `dispatch`, `preempt`, `define_group`, `sync_ready` and `complete`
  make in the caller's thread, before anything is queued or sent (the integers' ranges
  are rdmasched.limits'; each check raises `ArgumentTypeError` or `ArgumentError`,
  rdmasched.daemon.checks);
- `NodeAPI`, the Protocol both classes satisfy (checked by mypy where each is defined).

Nodes are named differently by the two (a node checks a name against its cluster, a client
asks its daemon), so node arguments are checked by each class itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

from rdmasched.daemon.checks import check_bool, check_int, check_payload
from rdmasched.daemon.core import SYNC_ID_BASE
from rdmasched.errors import ArgumentError, ArgumentTypeError
from rdmasched.limits import COMPUTE_PRIORITY_MAX, GANG_MAX, GROUP_MAX, JOB_MAX, STEP_MAX
from rdmasched.scheduler import Event, Task

__all__ = [
    "LATER",
    "CompleteHandler",
    "DispatchHandler",
    "Handlers",
    "NodeAPI",
    "PreemptHandler",
    "SyncHandler",
    "check_complete",
    "check_gang",
    "check_group",
    "check_members",
    "check_preempt",
    "check_redeclared",
    "check_step",
    "check_task",
]

# ---- handlers ----------------------------------------------------------------------------------
#: `fn(task, slot)`: start `task` on execution slot `slot`; return quickly
DispatchHandler = Callable[[Task, int], None]
#: `fn(task, slot, cancel) -> progress_ns`: stop `task` now (checkpoint or yield)
PreemptHandler = Callable[[Task, int, bool], int]
#: `fn(task, slot)`: run a group's sync task; None (done) or `LATER`
SyncHandler = Callable[[Task, int], object]
#: `fn(task_id, node)`: a task submitted here completed on node `node`
CompleteHandler = Callable[[int, int], None]


class Handlers(NamedTuple):
    """The four handlers registered on a node (None: not registered)."""

    dispatch: DispatchHandler | None
    preempt: PreemptHandler | None
    sync: SyncHandler | None
    complete: CompleteHandler | None


class _Later:
    """The type of `LATER`."""

    def __repr__(self) -> str:
        return "LATER"


#: what a sync handler returns to keep its slot until `complete(task.id)`; any other
#: return (None) completes the sync task when the handler returns
LATER = _Later()


# ---- the argument checks -----------------------------------------------------------------------
def check_task(
    task_id: object, job: object, priority: object, cost_ns: object, payload: object
) -> tuple[int, int, int, int]:
    """`submit`'s and `dispatch`'s task: (task_id, job, priority, cost_ns), checked against
    the wire's ranges (ids below the sync tasks', a u32 job, a compute priority), and the
    payload (a dict msgpack encodes within the metadata bound, or None)."""
    checked = (
        check_int("task_id", task_id, 0, SYNC_ID_BASE - 1),
        check_int("job", job, 0, JOB_MAX),
        check_int("priority", priority, 0, COMPUTE_PRIORITY_MAX),
        check_int("cost_ns", cost_ns),
    )
    check_payload(payload)
    return checked


def check_gang(gang: object) -> int:
    """`submit`'s gang count: 0 (no gang) or the members of gang `job`, 1..GANG_MAX
    (docs/GANGS.md)."""
    return check_int("gang", gang, 0, GANG_MAX)


def check_preempt(task_id: object, job: object, cancel: object) -> tuple[int | None, int | None]:
    """`preempt`'s target: exactly one of `task_id` and `job` (the other None); `cancel` a
    bool."""
    if (task_id is None) == (job is None):
        raise ArgumentError("preempt needs exactly one of task_id and job")
    check_bool("cancel", cancel)
    return (
        None if task_id is None else check_int("task_id", task_id),
        None if job is None else check_int("job", job, 0, JOB_MAX),
    )


def check_group(group: object) -> int:
    """A sync group id: 0..2**31-1 (a sync task's id holds it above the step)."""
    return check_int("group", group, 0, GROUP_MAX)


def check_step(step: object) -> int:
    """A sync step: 0..2**32-1."""
    return check_int("step", step, 0, STEP_MAX)


def check_members(members: object) -> Iterable[int | str]:
    """`define_group`'s members: an iterable of nodes (ids or names), not one string."""
    if isinstance(members, str | bytes) or not isinstance(members, Iterable):
        raise ArgumentTypeError(f"members must be node ids or names, not {members!r}")
    return members


def check_redeclared(
    group: int, old: tuple[frozenset[int], bool] | None, new: tuple[frozenset[int], bool]
) -> bool:
    """`define_group` of `group` as `new` (members, overlap) where it was declared as `old`
    (None: never): True when it is the same declaration again (nothing to do), False when
    it is the first; ArgumentError when it differs."""
    if old is None:
        return False
    if old == new:
        return True
    raise ArgumentError(
        f"group {group} is already defined, with members {sorted(old[0])}"
        + (f" and overlap={old[1]}" if old[0] == new[0] else "")
    )


def check_complete(task_id: object, runtime_ns: object) -> tuple[int, int]:
    """`complete`'s task id and runtime."""
    return check_int("task_id", task_id), check_int("runtime_ns", runtime_ns)


# ---- the API both classes offer ------------------------------------------------------------------
class NodeAPI(Protocol):
    """What `Node` and `Client` both offer (docs/DAEMON.md, "The API"; docs/CLIENT.md)."""

    #: the node's id (a client's: its daemon's, from its welcome)
    id: int

    @property
    def healthy(self) -> bool: ...

    @property
    def error(self) -> BaseException | None: ...

    def on_dispatch(self, fn: DispatchHandler) -> DispatchHandler: ...

    def on_preempt(self, fn: PreemptHandler) -> PreemptHandler: ...

    def on_sync(self, fn: SyncHandler) -> SyncHandler: ...

    def on_complete(self, fn: CompleteHandler) -> CompleteHandler: ...

    def submit(
        self,
        task_id: int,
        *,
        job: int = 0,
        priority: int = 0,
        cost_ns: int = 0,
        payload: dict[str, Any] | None = None,
        gang: int = 0,
    ) -> None: ...

    def dispatch(
        self,
        task_id: int,
        *,
        to: int | str | None = None,
        job: int = 0,
        priority: int = 0,
        cost_ns: int = 0,
        payload: dict[str, Any] | None = None,
    ) -> None: ...

    def preempt(
        self,
        task_id: int | None = None,
        *,
        job: int | None = None,
        node: int | str | None = None,
        cancel: bool = False,
    ) -> None: ...

    def define_group(
        self, group: int, members: Iterable[int | str], *, overlap: bool = False
    ) -> None: ...

    def sync_ready(self, group: int, step: int) -> None: ...

    def complete(self, task_id: int, *, origin: int | None = None, runtime_ns: int = 0) -> None: ...

    def call_later(self, delay_ns: int, fn: Callable[[], None]) -> None: ...

    def flush(self, timeout_s: float = 10.0) -> None: ...

    def explain(self, task_id: int) -> list[Event]: ...

    def stats(self) -> dict[str, Any]: ...
