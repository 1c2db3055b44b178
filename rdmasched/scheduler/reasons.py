"""Why a queued task has not started: ranked reason codes, in the style of Kueue's.

``Scheduler.why(task_id)`` gathers the facts on its own state and this module says them:
each ``Reason`` is a code (``Code``, a stable CamelCase name for machines, metrics and
alerts), a one-line message with the figures in it, and the figures themselves. The list is
ranked: the reason that would have to go away first comes first (docs/SCHEDULER.md, "Why is
it waiting"). ``Scheduler.waiting_counts()`` counts the queued tasks under each of their
reasons (the ``rdmasched_tasks_waiting{reason=...}`` gauge).

A gang member waiting for its gang is in no queue of the scheduler (rdmasched/scheduler/
gang.py holds it until the whole gang is placed): its codes are defined here too, and
``gang.why()`` and ``gang.waiting_counts()`` give its reasons and counts with the builders
``gang_incomplete``, ``gang_too_large`` and ``gang_waiting`` below.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple


class Code(enum.StrEnum):
    """The reason codes, ranked in this order when several hold."""

    #: the task's gang has not all its members submitted (gang.py)
    GANG_INCOMPLETE = "GangIncomplete"
    #: the task's gang needs more slots than the cluster could give it (gang.py)
    GANG_TOO_LARGE = "GangTooLarge"
    #: the task's gang fits the cluster but not its free slots now, or is being reserved
    GANG_WAITING = "GangWaitingForCapacity"
    #: every slot of the node is busy
    NO_FREE_SLOT = "NoFreeSlot"
    #: its priority is not above the lowest-priority running task's: it may not preempt
    DOES_NOT_OUTRANK = "DoesNotOutrankLowestRunning"
    #: other queued tasks start before it (higher rank, an older wait, or a starved task)
    QUEUED_BEHIND = "QueuedBehind"
    #: it outranks a running task, but that task has not run its quantum yet
    RUN_QUANTUM = "RunQuantum"
    #: it outranks running tasks, but their (or their job's) preemption budget is spent
    BUDGET_EXHAUSTED = "PreemptionBudgetExhausted"
    #: a peer it was placed on handed it back to this node
    PEER_REFUSED = "PeerRefused"
    #: placement cannot move it to another node (no lighter peer, or no hop left)
    TOPOLOGY = "Topology"


class Reason(NamedTuple):
    """One reason a task waits: its code, a one-line message, the figures in it."""

    code: Code
    message: str
    figures: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"code": str(self.code), "message": self.message, "figures": dict(self.figures)}


def _ms(ns: int) -> str:
    """A duration as people read it: 750 us, 7.5 ms, 60 s."""
    if ns >= 1_000_000_000:
        return f"{ns / 1e9:.3g} s"
    if ns >= 1_000_000 or ns == 0:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e3:.3g} us"


def gang_incomplete(gang: int, have: int, need: int) -> Reason:
    """The reason of a gang member whose gang has ``have`` of its ``need`` members."""
    return Reason(
        Code.GANG_INCOMPLETE,
        f"gang {gang} has {have}/{need} members submitted",
        {"gang": gang, "members": have, "size": need},
    )


def gang_too_large(gang: int, need: int, capacity: int) -> Reason:
    """The reason of a gang member whose gang needs ``need`` slots of ``capacity``."""
    return Reason(
        Code.GANG_TOO_LARGE,
        f"gang {gang} needs {need} slots; the cluster has {capacity}",
        {"gang": gang, "size": need, "capacity": capacity},
    )


def gang_waiting(gang: int, need: int, free: int) -> Reason:
    """The reason of a gang member whose gang fits the cluster but not its free slots."""
    return Reason(
        Code.GANG_WAITING,
        f"gang {gang} needs {need} slots at once; {free} free here and on its links now",
        {"gang": gang, "size": need, "free": free},
    )


def no_free_slot(running: int, nslots: int, queued: int) -> Reason:
    return Reason(
        Code.NO_FREE_SLOT,
        f"{running}/{nslots} slots busy, {queued} queued",
        {"running": running, "slots": nslots, "queued": queued},
    )


def does_not_outrank(
    priority: int, lowest: int, lowest_task: int, running: int, nslots: int
) -> Reason:
    return Reason(
        Code.DOES_NOT_OUTRANK,
        f"priority {priority} <= lowest running {lowest} (task {lowest_task}) "
        f"on {running}/{nslots} slots",
        {"priority": priority, "lowest_running": lowest, "lowest_task": lowest_task},
    )


def queued_behind(ahead: int, head: int, head_priority: int, starved: bool) -> Reason:
    why = "a starved task goes first" if starved else f"head: task {head} priority {head_priority}"
    return Reason(
        Code.QUEUED_BEHIND,
        f"{ahead} queued task{'s' if ahead != 1 else ''} start before it ({why})",
        {"ahead": ahead, "head": head, "head_priority": head_priority, "starved": starved},
    )


def run_quantum(victim: int, priority: int, ran_ns: int, quantum_ns: int) -> Reason:
    left = max(0, quantum_ns - ran_ns)
    return Reason(
        Code.RUN_QUANTUM,
        f"outranks task {victim} (priority {priority}), which has run {_ms(ran_ns)} of its "
        f"{_ms(quantum_ns)} quantum: preemptable in {_ms(left)}",
        {
            "victim": victim,
            "victim_priority": priority,
            "ran_ns": ran_ns,
            "quantum_ns": quantum_ns,
            "in_ns": left,
        },
    )


def budget_exhausted(
    victim: int, priority: int, task_used: int | None, task_budget: int | None,
    job: int, job_used: int | None, job_budget: int | None, window_ns: int,
) -> Reason:  # fmt: skip
    parts = []
    if task_used is not None:
        parts.append(f"task {victim} preempted {task_used}/{task_budget} times")
    if job_used is not None:
        parts.append(f"job {job} preempted {job_used}/{job_budget} times in {_ms(window_ns)}")
    return Reason(
        Code.BUDGET_EXHAUSTED,
        f"outranks task {victim} (priority {priority}), but " + "; ".join(parts),
        {
            "victim": victim,
            "victim_priority": priority,
            "task_preemptions": task_used,
            "task_budget": task_budget,
            "job": job,
            "job_preemptions": job_used,
            "job_budget": job_budget,
            "window_ns": window_ns,
        },
    )


def peer_refused(peer: int, hops: int) -> Reason:
    return Reason(
        Code.PEER_REFUSED,
        f"peer {peer} handed it back after {hops} hop{'s' if hops != 1 else ''}",
        {"peer": peer, "hops": hops},
    )


def topology(why: str, **figures: Any) -> Reason:
    return Reason(Code.TOPOLOGY, why, figures)


#: the code a ``queue`` event's rule stands for (events.Rule by name): what a reader of the
#: events alone (the mirror) can say of a queued task, as of when it queued
RULE_CODES: dict[str, Code] = {
    "no_slot": Code.DOES_NOT_OUTRANK,
    "behind": Code.QUEUED_BEHIND,
    "quantum": Code.RUN_QUANTUM,
    "budget": Code.BUDGET_EXHAUSTED,
}

#: every code by its name, for readers of an exported answer
CODES: dict[str, Code] = {str(c): c for c in Code}
