# cython: language_level=3, annotation_typing=False, boundscheck=False, wraparound=False
# cython: initializedcheck=False
"""The per-node scheduler: pure decision logic on a clock, no I/O.

Rules (docs/SCHEDULER.md states them with their reasons):

* Queue order: sync tasks first (FIFO among them); then any compute task that has waited
  ``starvation_us`` or more, oldest wait first; then the rest by rank: priority (higher
  first) then enqueue time (older first) then id (lower first).  With ``aging_us`` a
  queued task's rank also rises one priority level per ``aging_us`` waited.
* A task dispatched onto a node with a free slot starts at once.  With no free slot, it
  preempts the lowest-priority running task (ties: the most recently started) when its
  priority is strictly higher and it would be the head of the queue; otherwise it queues.
* A freed slot goes to the head of the queue.
* A victim is off its slot as soon as the daemon has run the preempt handler; ``yielded()``
  then requeues it with its progress (keeping its place), or drops it if cancelled.  A
  ``complete()`` of a task queued again after its yield ends it (its work went on).

This file is also compiled by Cython (pure-Python mode: ``core.pxd`` beside it declares
the attribute and internal-method types; the directives are on the first line).  The
compiled module has the same behaviour and takes precedence on import when it is built;
``IMPLEMENTATION`` says which one is loaded.

Hot-path notes: the queue is a heap of tuples ``(rank, -priority, enqueued_ns, key, task)``
with lazy deletion (an entry is live iff ``task.qentry is entry``); the starvation check
reads the head of a FIFO of the same entries; running tasks sit in a second heap keyed
``(priority, -start_seq, slot, task)`` for the victim choice.  Events are ``WORDS`` u64
words each in a preallocated ring (events.py has the layout).  Stale entries are compacted
away when they outnumber the live.  Compiled, ``Task`` is an extension type too (task.pxd):
the core reads and writes its fields as C struct members.
"""

from __future__ import annotations

import random
import sys
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from heapq import heapify, heappop, heappush
from typing import Any, NoReturn

from rdmasched.limits import (
    CRITICAL_PRIORITY_DEFAULT,
    JOB_WINDOW_US_DEFAULT,
    NO_SLOT,
    QUANTUM_US_DEFAULT,
    check_preemption,
)
from rdmasched.scheduler import reasons
from rdmasched.scheduler.actions import Action, Cancel, Forward, Preempt, Start
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
from rdmasched.scheduler.events import (
    D_CANCEL,
    D_COMPLETE,
    D_FORWARD,
    D_KEEP,
    D_PREEMPT,
    D_QUEUE,
    D_REDISPATCH,
    D_REJECT,
    D_RELEASE,
    D_REQUEUE,
    D_START,
    DECISIONS,
    F_BEATEN,
    F_CAUSE,
    F_ID,
    F_JOB,
    F_PEER,
    F_STEP,
    F_TASK,
    F_TEXT,
    NO_PEER,
    NO_TASK,
    W_BEATEN,
    W_BEATEN2,
    W_CAUSE,
    W_CAUSE_NS,
    W_DEPTH,
    W_GROUP,
    W_ID,
    W_JOB,
    W_LOADS,
    W_META,
    W_ORIGIN,
    W_PEER,
    W_STEP,
    W_T,
    W_WAIT,
    WORDS,
    Event,
    Rule,
    decode,
    to_jsonl,
)
from rdmasched.scheduler.placement import (
    DEFAULT_MAX_HOPS,
    PeerTable,
    can_spill,
    choose_peer,
)
from rdmasched.scheduler.task import (
    COMPUTE_PRIORITY_MAX,
    SYNC_PRIORITY,
    U64_MAX,
    Task,
    TaskState,
)

#: "compiled" when this module was built by Cython, else "python"
IMPLEMENTATION = "python" if __file__.endswith(".py") else "compiled"
if IMPLEMENTATION == "compiled" and str(sys.modules[Task.__module__].__file__).endswith(".py"):
    # the compiled core reads Task fields at the extension type's offsets: a plain Task
    # would be read wrong
    raise ImportError(
        "rdmasched/scheduler/core is compiled but task.py is not: build both "
        "(python setup.py build_ext --inplace) or delete the core's compiled module"
    )

QEntry = tuple[int, int, int, int, Task]
REntry = tuple[int, int, int, Task]
StepTask = Callable[[int, int], Task]

#: load_hint() saturates here (it travels as a u16)
LOAD_HINT_MAX = 0xFFFF

# rank offsets: key = offset[priority] + enqueued_ns.  Sync tasks sit below every compute
# key; in strict mode (no aging) priority levels are 2**64 apart, so the enqueue time
# (a u64) never crosses a level.
_SYNC_OFFSET = -(1 << 80)
_STRICT_LEVEL = 1 << 64

# builds the NamedTuple actions without a Python-level __new__ call
_new = tuple.__new__
# -priority for the queue entries, made once (a negative int above -5 is a new object each
# time it is computed)
_NEG = tuple(-p for p in range(SYNC_PRIORITY + 1))

_QUEUED = TaskState.QUEUED
_DONE = TaskState.DONE
_RUNNING = TaskState.RUNNING
_PREEMPTING = TaskState.PREEMPTING
_CANCELLING = TaskState.CANCELLING


#: counters kept as plain int attributes ``_n_<name>`` (cheaper than a dict on the hot path)
_COUNTERS = (
    "starts",
    "queued",
    "preemptions",
    "peer_preemptions",
    "requeues",
    "cancels",
    "keeps",
    "completions",
    "sync_releases",
    "sync_reports",
    "forwards",
    "redispatches",
    "drops",
    "starved_starts",
)
_NOT_DECISIONS = frozenset({"completions", "sync_reports", "starved_starts"})
_NEVER = 1 << 127

# the rules that decide, as plain ints for the ring (events.Rule names them, RULE_TEXT says them;
# reading a Rule member makes an object each time: read once here)
R_FREE = int(Rule.FREE_SLOT)
R_HEAD = int(Rule.HEAD)
R_STARVED = int(Rule.STARVED)
R_OUTRANKS = int(Rule.OUTRANKS)
R_NO_SLOT = int(Rule.NO_SLOT)
R_BEHIND = int(Rule.BEHIND)
R_VICTIM = int(Rule.VICTIM)
R_PEER = int(Rule.PEER)
R_PEER_CANCEL = int(Rule.PEER_CANCEL)
R_YIELDED = int(Rule.YIELDED)
R_DONE = int(Rule.DONE)
R_OTHER = int(Rule.OTHER)
R_DONE_PREEMPTING = int(Rule.DONE_PREEMPTING)
R_PREEMPT_QUEUED = int(Rule.PREEMPT_QUEUED)
R_ALREADY_PREEMPTING = int(Rule.ALREADY_PREEMPTING)
R_GROUP_COMPLETE = int(Rule.GROUP_COMPLETE)
R_LIGHTER_PEER = int(Rule.LIGHTER_PEER)
R_PLACED_ON = int(Rule.PLACED_ON)
R_BACK_TO_ORIGIN = int(Rule.BACK_TO_ORIGIN)
R_DONE_ON_PEER = int(Rule.DONE_ON_PEER)
R_DONE_QUEUED = int(Rule.DONE_QUEUED)
R_QUANTUM = int(Rule.QUANTUM)
R_BUDGET = int(Rule.BUDGET)
#: the ring's words are u64; a value that does not fit is recorded as absent
_U64 = U64_MAX
# the event layout (events.py, its one definition) as C constants when compiled (core.pxd
# types them, set once at import): the hot path must not look a module global up per event
_WORDS = WORDS
# a record's words (``self._ev[b + _W_ID]``: a C add, no Python lookup)
_W_T = W_T
_W_META = W_META
_W_ID = W_ID
_W_ORIGIN = W_ORIGIN
_W_JOB = W_JOB
_W_STEP = W_STEP
_W_GROUP = W_GROUP
_W_BEATEN = W_BEATEN
_W_BEATEN2 = W_BEATEN2
_W_PEER = W_PEER
_W_LOADS = W_LOADS
_W_CAUSE = W_CAUSE
_W_CAUSE_NS = W_CAUSE_NS
_W_WAIT = W_WAIT
_W_DEPTH = W_DEPTH
_F_TASK = F_TASK
_F_TASK_JOB = F_TASK | F_JOB
_F_BEATEN = F_BEATEN
_F_STEP = F_STEP
_F_CAUSE = F_CAUSE
_F_PEER = F_PEER
_SYNC_P = SYNC_PRIORITY
# and the masks of the cause and placement words: compiled, C constants, so that ``cause()``
# and ``_peer_note()`` compute their words in C and make no int per message (a literal
# above 2**31 would be a Python int, and so would every expression it is in)
_LOW32 = 0xFFFFFFFF
_WORD_MAX = U64_MAX
_NO_PEER = NO_PEER
if LOAD_HINT_MAX != 0xFFFF:
    raise ImportError("scheduler/core.py: `_load` writes LOAD_HINT_MAX as the literal 0xFFFF")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A snapshot of the scheduler's counters; ``describe()`` explains every field."""

    decisions: int = field(
        metadata=_help(
            "decisions taken: starts, queues, preemptions, requeues, cancels, keeps, "
            "releases, forwards, redispatches, drops and rejections (completions are not "
            "decisions)"
        )
    )
    starts: int = field(metadata=_help("tasks started on a slot"))
    queued: int = field(
        metadata=_help("tasks that entered the queue on arrival (no slot, no preemption)")
    )
    preemptions: int = field(metadata=_help("running tasks preempted by a higher-priority task"))
    peer_preemptions: int = field(
        metadata=_help(
            "PREEMPTs from a peer that stopped a running task, or turned a pending "
            "requeue into a cancel"
        )
    )
    requeues: int = field(
        metadata=_help("preempted tasks put back in the queue after they yielded")
    )
    cancels: int = field(metadata=_help("tasks cancelled by a PREEMPT(cancel)"))
    keeps: int = field(
        metadata=_help("PREEMPT (requeue) of a task that was not running: left as it was")
    )
    completions: int = field(
        metadata=_help("tasks completed here (or reported complete by a peer)")
    )
    sync_releases: int = field(metadata=_help("sync steps released (every member reported)"))
    sync_reports: int = field(metadata=_help("SYNC_READY reports accepted"))
    forwards: int = field(metadata=_help("tasks submit() forwarded to a peer"))
    redispatches: int = field(metadata=_help("tasks taken back from a dead peer for dispatch"))
    drops: int = field(
        metadata=_help(
            "tasks of another node dropped here because that node's incarnation ended "
            "(declared dead, restarted, or this node rejoined)"
        )
    )
    starved_starts: int = field(
        metadata=_help("starts that jumped the priority order by the starvation cap")
    )
    rejections: int = field(metadata=_help("calls refused as bad input (sum of `rejected`)"))
    rejected: dict[str, int] = field(metadata=_help("rejections by reason (see errors.py)"))
    events_recorded: int = field(
        metadata=_help("events recorded since start (decisions + completions)")
    )
    events_dropped: int = field(metadata=_help("events overwritten in the bounded ring"))
    events_capacity: int = field(
        metadata=_help("events the ring holds (the `events` argument; 0: telemetry off)")
    )
    running: int = field(metadata=_help("tasks running now"))
    queue_len: int = field(metadata=_help("tasks queued now"))
    free_slots: int = field(metadata=_help("slots idle now"))
    load_hint: int = field(metadata=_help("the load hint sent to peers now (see load_hint())"))

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Field name -> what it counts."""
        return {f.name: str(f.metadata["help"]) for f in fields(cls)}

    def as_dict(self) -> dict[str, Any]:
        """Field name -> value."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _Group:
    __slots__ = ("members", "overlap", "pending", "released", "step_task")

    def __init__(self, members: frozenset[int], step_task: StepTask, overlap: bool) -> None:
        self.members = members
        self.step_task = step_task
        self.overlap = overlap  # its sync tasks take no slot (`define_group`)
        self.pending: dict[int, set[int]] = {}
        self.released = -1  # steps are >= 0; a report for a step <= released is stale


class Scheduler:
    """Decides what runs on ``nslots`` execution slots; every call returns the actions.

    ``clock`` returns nanoseconds.  ``starvation_us`` caps how long a compute task can be
    passed over.  ``aging_us`` (optional) makes a queued task's rank rise one priority
    level per ``aging_us`` waited.  ``events`` bounds the decision ring.  ``peers``,
    ``domain``, ``max_hops`` and ``rng`` are for ``submit()``.
    """

    __slots__ = (
        "_blocked",
        "_by_rule",
        "_cause_kind",
        "_cause_ns",
        "_cause_w",
        "_clock",
        "_critical",
        "_domain",
        "_ev",
        "_ev_b",
        "_ev_cap",
        "_ev_end",
        "_ev_n",
        "_ev_text",
        "_fifo",
        "_free",
        "_groups",
        "_guarded",
        "_heap",
        "_job_budget",
        "_job_preempts",
        "_job_window_ns",
        "_max_hops",
        "_n_cancels",
        "_n_completions",
        "_n_drops",
        "_n_forwards",
        "_n_keeps",
        "_n_peer_preemptions",
        "_n_preemptions",
        "_n_queued",
        "_n_redispatches",
        "_n_requeues",
        "_n_starts",
        "_n_starved_starts",
        "_n_sync_releases",
        "_n_sync_reports",
        "_npreempt",
        "_nqueued",
        "_offset",
        "_outranked",
        "_peers",
        "_quantum_ns",
        "_rejected",
        "_requeued",
        "_returned",
        "_rng",
        "_run",
        "_run_cap",
        "_seq",
        "_slots",
        "_starve_at",
        "_task_budget",
        "_tasks",
        "_wake_ns",
        "aging_ns",
        "node_id",
        "nslots",
        "starvation_ns",
    )

    def __init__(
        self,
        nslots: int,
        *,
        clock: Callable[[], int],
        starvation_us: int,
        aging_us: int | None = None,
        events: int = 4096,
        node_id: int = 0,
        peers: PeerTable | None = None,
        domain: str = "",
        max_hops: int = DEFAULT_MAX_HOPS,
        rng: random.Random | None = None,
        quantum_us: int = QUANTUM_US_DEFAULT,
        task_budget: int | None = None,
        job_budget: int | None = None,
        job_window_us: int = JOB_WINDOW_US_DEFAULT,
        critical_priority: int = CRITICAL_PRIORITY_DEFAULT,
    ) -> None:
        check_preemption(quantum_us, task_budget, job_budget, job_window_us, critical_priority)
        if nslots < 1:
            raise ValueError(f"nslots must be >= 1, not {nslots}")
        if starvation_us <= 0:
            raise ValueError(f"starvation_us must be > 0, not {starvation_us}")
        if aging_us is not None and aging_us <= 0:
            raise ValueError(f"aging_us must be > 0 (or None for no aging), not {aging_us}")
        if events < 0:
            raise ValueError(f"events must be >= 0 (0: no event ring), not {events}")
        if max_hops < 0:
            raise ValueError(f"max_hops must be >= 0, not {max_hops}")
        self.nslots = nslots
        self.node_id = node_id
        self.starvation_ns = starvation_us * 1000
        self.aging_ns = None if aging_us is None else aging_us * 1000
        self._clock = clock
        level = _STRICT_LEVEL if self.aging_ns is None else self.aging_ns
        offs = [(COMPUTE_PRIORITY_MAX - p) * level for p in range(COMPUTE_PRIORITY_MAX + 1)]
        offs.append(_SYNC_OFFSET)
        self._offset: tuple[int, ...] = tuple(offs)
        self._slots: list[Task | None] = [None] * nslots
        # free slots as a stack: slot 0 first at start-up, then the most recently freed
        self._free: list[int] = list(range(nslots - 1, -1, -1))
        self._heap: list[QEntry] = []
        self._fifo: deque[QEntry] = deque()
        self._run: list[REntry] = []
        self._tasks: dict[int, Task] = {}
        # keys of victims of a priority preemption that have not yielded yet: one that
        # outranks the task that took a slot meanwhile takes it back when it yields
        self._outranked: set[int] = set()
        # keys of tasks queued again after they yielded (they have run): a COMPLETE of one
        # that is still queued ends it (its work went on after the yield and finished)
        self._requeued: set[int] = set()
        self._nqueued = 0
        self._seq = 0
        # the event ring: ``events`` records of WORDS u64 each (events.py has the layout)
        self._ev_cap = events
        self._ev = array("Q", bytes(8 * WORDS * events))
        self._ev_n = 0  # events recorded (the next one's seq)
        self._ev_b = 0  # the next record's first word: (seq % events) * WORDS
        self._ev_end = WORDS * events
        self._ev_text: dict[int, str] = {}  # event seq -> its reason, for Rule.OTHER
        # events recorded by (decision, rule): decision * 32 + rule (while events are on)
        self._by_rule = array("Q", bytes(8 * 32 * len(DECISIONS)))
        self._cause_kind = 0
        self._cause_w = 0
        self._cause_ns = 0
        self._groups: dict[int, _Group] = {}
        self._peers = peers
        self._domain = domain
        self._max_hops = max_hops
        self._rng = rng if rng is not None else random.Random()
        self._n_starts = 0
        self._n_queued = 0
        self._n_preemptions = 0
        self._n_peer_preemptions = 0
        self._n_requeues = 0
        self._n_cancels = 0
        self._n_keeps = 0
        self._n_completions = 0
        self._n_sync_releases = 0
        self._n_sync_reports = 0
        self._n_forwards = 0
        self._n_redispatches = 0
        self._n_drops = 0
        self._n_starved_starts = 0
        #: no queued task can be starved before this instant (a lower bound, see _enqueue)
        self._starve_at = _NEVER
        self._run_cap = 2 * nslots + 16
        self._rejected: dict[str, int] = {}
        # no thrash (docs/PREEMPTION.md): the run quantum and the preemption budgets govern
        # the preemptions by ordinary tasks (below ``critical_priority``); off, none is
        # governed and the hot path tests one flag
        self._quantum_ns = quantum_us * 1000
        self._task_budget = task_budget
        self._job_budget = job_budget
        self._job_window_ns = job_window_us * 1000
        self._critical = critical_priority
        self._guarded = quantum_us > 0 or task_budget is not None or job_budget is not None
        #: task key -> its governed preemptions here; job -> times of its tasks' ones
        self._npreempt: dict[int, int] = {}
        self._job_preempts: dict[int, deque[int]] = {}
        #: the rule that kept the last governed preemption from happening (queue event)
        self._blocked = R_QUANTUM
        #: when ``tick()`` has something to do (a quantum or a job's window ends); 0: never
        self._wake_ns = 0
        #: this node's tasks a peer handed back: key -> that peer (``why``: PeerRefused)
        self._returned: dict[int, int] = {}
        #: the gangs' hook (reasons.py): ``(task) -> Reason | None``, asked first by ``why``

    # --- inputs ---------------------------------------------------------------------------

    def dispatch(self, task: Task) -> list[Action]:
        """DISPATCH: take ``task`` here; start it, preempt for it, or queue it."""
        now = self._clock()
        if task is None:  # (compiled, the core reads a Task's fields as C struct members)
            self._reject(InvalidTaskError("dispatch of None, not a Task"), NO_TASK, now)
        key = self._admit(task, now, False)
        free = self._free
        if free:  # the common case, inlined: start at once
            slot = free.pop()
            self._run_on(task, slot, now)
            self._rec(now, D_START, R_FREE, task, slot, None, 0, 0)
            return [_new(Start, (task, slot))]
        return self._place_busy(task, now, key)

    def complete(self, task_id: int, origin: int | None = None) -> list[Action]:
        """COMPLETE: ``task_id`` (of node ``origin``, default this node) finished; its slot
        goes to the head of the queue."""
        now = self._clock()
        key = ((self.node_id if origin is None else origin) << 64) | task_id
        task = self._tasks.get(key)
        if task is None or task.state is not _RUNNING:
            return self._complete_other(task_id, key, task, now)
        del self._tasks[key]
        if self._requeued:
            self._requeued.discard(key)
        slot: int = task.slot  # type: ignore[assignment]  # a running task has a slot
        task.state = _DONE
        task.slot = None
        task.rentry = None
        self._slots[slot] = None
        self._n_completions += 1
        self._rec(now, D_COMPLETE, R_DONE, task, slot, None, 0, 0)
        out: list[Action] = []
        self._fill(slot, now, out)
        return out

    def _complete_other(self, task_id: int, key: int, task: Task | None, now: int) -> list[Action]:
        """``complete`` of a task that is not running: a race, or bad input."""
        if task is None:
            self._reject(UnknownTaskError(f"unknown task {task_id}"), task_id, now)
        state = task.state
        if state is _PREEMPTING or state is _CANCELLING:
            # it finished while the preempt handler ran; its slot is already reused
            del self._tasks[key]
            self._outranked.discard(key)
            self._requeued.discard(key)
            task.state = _DONE
            self._n_completions += 1
            self._rec(now, D_COMPLETE, R_DONE_PREEMPTING, task, -1, None, 0, 0)
            return []
        if state is _QUEUED and key in self._requeued:
            # it yielded (its handler returned its progress) but its work went on and has
            # finished before it started again: done, out of the queue (no slot to free)
            self._requeued.discard(key)
            self._unqueue(task)
            del self._tasks[key]
            task.state = _DONE
            self._n_completions += 1
            self._rec(now, D_COMPLETE, R_DONE_QUEUED, task, -1, None, 0, 0)
            return []
        self._reject(
            TaskStateError(f"complete of task {task_id} that is {state.name.lower()}"),
            task_id,
            now,
        )

    def yielded(self, task_id: int, progress_ns: int, origin: int | None = None) -> list[Action]:
        """The preempt handler of ``task_id`` returned: record its progress, requeue it.

        A victim of PREEMPT(cancel) is dropped instead.  If a slot is free (work finished
        while the handler ran), the requeued task starts at once.
        """
        now = self._clock()
        key = ((self.node_id if origin is None else origin) << 64) | task_id
        task = self._tasks.get(key)
        if task is None:
            self._reject(UnknownTaskError(f"unknown task {task_id}"), task_id, now)
        if progress_ns < 0:
            self._reject(InvalidTaskError(f"negative progress {progress_ns}"), task_id, now)
        outranked = key in self._outranked
        if outranked:
            self._outranked.discard(key)
        state = task.state
        if state is _CANCELLING:
            task.progress_ns = progress_ns
            del self._tasks[key]
            self._requeued.discard(key)
            task.state = TaskState.CANCELLED
            self._n_cancels += 1
            self._rec(now, D_CANCEL, R_PEER_CANCEL, task, -1, None, 0, 0)
            return []
        if state is not _PREEMPTING:
            self._reject(
                TaskStateError(f"yielded for task {task_id} that is {state.name.lower()}"),
                task_id,
                now,
            )
        task.progress_ns = progress_ns
        out: list[Action] = []
        if self._free:  # the queue is empty whenever a slot is free
            self._n_requeues += 1
            self._rec(now, D_REQUEUE, R_YIELDED, task, -1, None, 0, 0)
            slot = self._free.pop()
            self._run_on(task, slot, now)
            self._rec(now, D_START, R_FREE, task, slot, None, 0, 0)
            out.append(_new(Start, (task, slot)))
            return out
        if outranked:
            # Its preemptor may have finished before this handler returned, and its slot gone
            # to the queue head, a task this one outranks: as on arrival, it preempts that.
            victim = self._lowest_running()
            if task.priority > victim[0] and self._heads_queue(task, now, key):
                chosen = self._may_preempt(task, victim, now)
                if chosen is not None:
                    self._n_requeues += 1
                    self._rec(now, D_REQUEUE, R_YIELDED, task, -1, None, 0, 0)
                    return self._preempt_for(task, chosen, now)
        self._enqueue(task, now, key)
        requeued = self._requeued
        requeued.add(key)
        if len(requeued) > 2 * len(self._tasks) + 64:  # keys of tasks gone since
            self._requeued = {k for k in requeued if k in self._tasks}
        self._n_requeues += 1
        self._rec(now, D_REQUEUE, R_YIELDED, task, -1, None, 0, 0)
        return out

    def preempt(
        self,
        task_id: int | None = None,
        *,
        job: int | None = None,
        cancel: bool = False,
        origin: int | None = None,
    ) -> list[Action]:
        """PREEMPT from a peer: stop ``task_id`` of node ``origin`` (default this node), or
        every task of ``job``, now.

        A running task gets a ``Preempt`` (its slot goes to the queue head at once); it is
        requeued behind the tasks of its priority when it yields, or dropped if ``cancel``.
        A queued task is cancelled if ``cancel`` (``Cancel`` action), else left queued.
        """
        if (task_id is None) == (job is None):
            raise ValueError("preempt needs exactly one of task_id and job")
        now = self._clock()
        if task_id is not None:
            task = self._tasks.get(((self.node_id if origin is None else origin) << 64) | task_id)
            if task is None:
                self._reject(UnknownTaskError(f"unknown task {task_id}"), task_id, now)
            targets: tuple[Task, ...] = (task,)
        else:
            targets = tuple(t for t in self._tasks.values() if t.job == job)
            if not targets:
                self._reject(UnknownJobError(f"unknown job {job}"), NO_TASK, now)
        return self._stop(targets, cancel, R_PEER_CANCEL if cancel else R_PEER, None, now)

    def preempt_task(self, task: Task, cancel: bool = False) -> list[Action]:
        """``preempt`` of one task held here that the caller already looked up
        (``lookup``): the node core's path for a peer's PREEMPT (one lookup, no keyword
        arguments).  Decides as ``preempt(task.id, cancel=cancel, origin=task.origin)``."""
        now = self._clock()
        if self._tasks.get(task.held_key) is not task:  # (its key, kept: no int made)
            self._reject(UnknownTaskError(f"unknown task {task.id}"), task.id, now)
        return self._stop((task,), cancel, R_PEER_CANCEL if cancel else R_PEER, None, now)

    def _stop(
        self,
        targets: tuple[Task, ...],
        cancel: bool,
        rule: int,
        why: str | None,
        now: int,
        drop: bool = False,
    ) -> list[Action]:
        """Preempt (or cancel) ``targets``, tasks held here; free slots go to the queue.

        ``rule`` decided it (``why``: its text, for ``Rule.OTHER``).  ``drop``: they are
        dropped because their origin is gone (counted as ``drops``)."""
        out: list[Action] = []
        # the slots freed, given to the queue once every target is off its slot: the first
        # apart, so that stopping one task (a peer's PREEMPT) makes no list
        first = -1
        freed: list[int] | None = None
        # queued tasks first, so that a cancelled one cannot take a freed slot
        for t in targets:
            if t.state is _QUEUED:
                if cancel:
                    self._unqueue(t)
                    del self._tasks[t.held_key]
                    self._requeued.discard(t.held_key)
                    t.state = TaskState.CANCELLED
                    if drop:
                        self._n_drops += 1
                    else:
                        self._n_cancels += 1
                    self._note(now, D_CANCEL, rule, t, NO_TASK, why)
                    out.append(_new(Cancel, (t,)))
                else:
                    self._n_keeps += 1
                    self._rec(now, D_KEEP, R_PREEMPT_QUEUED, t, -1, None, 0, 0)
            elif t.state is _PREEMPTING and cancel:
                t.state = _CANCELLING  # dropped instead of requeued when it yields
                if drop:
                    self._n_drops += 1
                else:
                    self._n_peer_preemptions += 1
                self._note(now, D_PREEMPT, rule, t, NO_TASK, why)
            elif (t.state is _PREEMPTING or t.state is _CANCELLING) and not drop:
                self._n_keeps += 1
                self._rec(now, D_KEEP, R_ALREADY_PREEMPTING, t, -1, None, 0, 0)
        for t in targets:
            if t.state is _RUNNING:
                slot: int = t.slot  # type: ignore[assignment]
                self._off_slot(t, slot)
                t.state = _CANCELLING if cancel else _PREEMPTING
                t.enqueued_ns = now  # a requeue goes behind the tasks of its priority
                if drop:
                    self._n_drops += 1
                else:
                    self._n_peer_preemptions += 1
                self._note(now, D_PREEMPT, rule, t, NO_TASK, why, slot)
                out.append(_new(Preempt, (t, slot, None, cancel)))
                if first < 0:
                    first = slot
                elif freed is None:
                    freed = [slot]
                else:
                    freed.append(slot)
        if first >= 0:
            self._fill(first, now, out)
            if freed is not None:
                for slot in freed:
                    self._fill(slot, now, out)
        return out

    def define_group(
        self, group: int, members: Iterable[int], step_task: StepTask, *, overlap: bool = False
    ) -> None:
        """Declare sync group ``group``: ``step_task(group, step)`` makes its sync task.

        The task it returns is given priority 255 and ``group``; its id must be unique.
        ``overlap``: the group's syncs overlap the running tasks (a collective beside the
        compute it serves, as a DDP bucket's all-reduce): a released step's sync task takes
        no slot, preempts nothing and is not held here (its ``Start`` has slot ``NO_SLOT``;
        the driver ends it when its handlers are done, with no ``complete``).
        """
        mem = frozenset(members)
        if not mem:
            raise ValueError(f"group {group} has no members")
        if group in self._groups:
            raise ValueError(f"group {group} is already defined")
        self._groups[group] = _Group(mem, step_task, bool(overlap))

    def drop_group(self, group: int) -> None:
        """Forget ``group`` and its pending reports."""
        if self._groups.pop(group, None) is None:
            raise UnknownGroupError(f"unknown group {group}")

    def sync_ready(self, group: int, step: int, member: int) -> list[Action]:
        """SYNC_READY: ``member`` reached ``step``; release the sync task when all have.

        Reports for a future step are kept.  Releasing a step drops the partial reports of
        earlier steps; a later report for a released (or dropped) step is stale.
        """
        now = self._clock()
        g = self._groups.get(group)
        if g is None:
            self._reject(UnknownGroupError(f"unknown group {group}"), NO_TASK, now)
        if member not in g.members:
            self._reject(
                UnknownMemberError(f"member {member} is not in group {group}"),
                NO_TASK,
                now,
            )
        if step <= g.released:
            self._reject(
                StaleStepError(f"group {group} step {step}: step {g.released} released"),
                NO_TASK,
                now,
            )
        reported = g.pending.get(step)
        if reported is None:
            reported = g.pending[step] = set()
        reported.add(member)
        self._n_sync_reports += 1
        if len(reported) < len(g.members):
            return []
        return self.release(group, step)

    def release(self, group: int, step: int) -> list[Action]:
        """Release step ``step`` of ``group`` now: make its sync task and place it.

        ``sync_ready`` calls this once every member reported; a driver that counts the
        readiness itself (the daemon's hierarchical sync, rdmasched/daemon/sync.py) calls it
        directly.  A step is released once: a step ``<=`` the last released is stale.
        Releasing a step drops the partial reports of earlier steps.
        """
        now = self._clock()
        g = self._groups.get(group)
        if g is None:
            self._reject(UnknownGroupError(f"unknown group {group}"), NO_TASK, now)
        if step <= g.released:
            self._reject(
                StaleStepError(f"group {group} step {step}: step {g.released} released"),
                NO_TASK,
                now,
            )
        task = g.step_task(group, step)
        task.priority = SYNC_PRIORITY
        task.group = group
        task.step = step
        # may raise (a duplicate id): then nothing is released
        if g.overlap:  # beside the running tasks: checked, not admitted (define_group)
            self._check_task(task, now, sync=True)
        else:
            key = self._admit(task, now, True)
        g.pending = {s: m for s, m in g.pending.items() if s > step}
        g.released = step
        self._n_sync_releases += 1
        self._rec(now, D_RELEASE, R_GROUP_COMPLETE, task, -1, None, 0, 0)
        if g.overlap:  # it takes no slot
            task.state = _RUNNING
            task.slot = NO_SLOT
            task.started_ns = now
            return [_new(Start, (task, NO_SLOT))]
        return self._place(task, now, key)

    def pending_sync(self, group: int) -> dict[int, frozenset[int]]:
        """Step -> members that have reported it, for steps not yet released."""
        g = self._groups.get(group)
        if g is None:
            raise UnknownGroupError(f"unknown group {group}")
        return {s: frozenset(m) for s, m in sorted(g.pending.items())}

    def submit(self, task: Task) -> list[Action]:
        """Run ``task`` here if a slot is free, else maybe forward it to a lighter peer.

        The peer is picked by power-of-two choices among live peers whose last load hint
        is below the load this node would have with the task queued, same topology domain
        first (``placement.choose_peer``).  Only a task's origin forwards it to a third
        node: another node may only hand it back to its origin (spill-back).  A task that
        has already made ``max_hops`` hops, or finds no such peer, is dispatched here.
        """
        peers = self._peers
        if self._free or peers is None or not can_spill(task.hops, self._max_hops):
            return self.dispatch(task)
        now = self._clock()
        self._check_task(task, now, sync=False)
        mine = self._load(1)
        loads = peers.loads()
        origin = task.origin
        if origin != self.node_id:  # not ours: back to its origin, or here
            loads = {origin: loads[origin]} if origin in loads else {}
        lost: list[int] = []
        peer = choose_peer(
            loads,
            peers.domains,
            self._domain,
            self._rng,
            self_id=self.node_id,
            max_load=mine,
            lost=lost,
        )
        if peer is None:
            return self.dispatch(task)
        task.hops += 1
        task.state = TaskState.FORWARDED
        if origin == self.node_id:
            peers.hold(peer, task)  # the origin alone keeps track of where its task is
        self._n_forwards += 1
        self._rec(now, D_FORWARD, R_LIGHTER_PEER, task, -1, None, 0, 0)
        loser = lost[0] if lost else -1
        self._peer_note(peer, loser, loads[peer], loads[loser] if lost else 0, mine)
        return [_new(Forward, (task, peer))]

    def place_on(self, task: Task, peer: int) -> None:
        """This node sends its ``task`` to ``peer`` itself (a DISPATCH for that node):
        checked here, recorded as held by ``peer``, like a forward."""
        now = self._clock()
        self._check_task(task, now, sync=False)
        task.hops += 1
        task.state = TaskState.FORWARDED
        if self._peers is not None:
            self._peers.hold(peer, task)
        self._n_forwards += 1
        self._rec(now, D_FORWARD, R_PLACED_ON, task, -1, None, 0, 0)
        self._peer_note(peer, -1, 0, 0, 0)

    def receive(self, task: Task, peer: int, submitted: bool = True) -> list[Action]:
        """A DISPATCH of ``task`` from ``peer``: placed by ``submit()`` (it may move on,
        see ``submit``) or, if not ``submitted``, for this node.

        A task of this node that comes back is no longer held by the peer.  A task of
        another node that this node refuses goes back to its origin, which places it
        again (a ``Forward`` to the origin), unless it is a duplicate of one held here."""
        origin = task.origin
        if origin == self.node_id:
            peers = self._peers
            if peers is not None:
                key = (origin << 64) | task.id
                if peers.release(peer, key) is not None:
                    self._note_returned(key, peer)
            return self.submit(task) if submitted else self.dispatch(task)
        try:
            return self.submit(task) if submitted else self.dispatch(task)
        except DuplicateTaskError:
            raise
        except SchedulerError as exc:
            # refused (counted as a rejection): the origin learns it by the task coming back
            task.hops += 1
            task.state = TaskState.FORWARDED
            self._n_forwards += 1
            self._note(
                self._clock(),
                D_FORWARD,
                R_BACK_TO_ORIGIN,
                task,
                NO_TASK,
                f"back to origin: {exc}",
            )
            self._peer_note(origin, -1, 0, 0, 0)
            return [_new(Forward, (task, origin))]

    def check_peers(self) -> list[Action]:
        """Take back the tasks held by peers that went silent, and place them again; drop
        the tasks of those peers held here (``peer_gone`` for each)."""
        if self._peers is None:
            return []
        out: list[Action] = []
        for peer in self._peers.expired():
            out.extend(self.peer_gone(peer))
        return out

    def peer_gone(self, peer: int) -> list[Action]:
        """``peer``'s incarnation ended (declared dead, or it restarted or rejoined as a new
        one): place again the tasks of this node it held, and drop the tasks of ``peer``
        held here (its new incarnation places them again, or it is gone)."""
        out = self.drop_origin(peer)  # first: the slots it frees serve the others
        peers = self._peers
        if peers is not None:
            peers.mark_dead(peer)
            out.extend(self._replace(peer, peers.take(peer), f"peer {peer} is dead"))
        return out

    def replace_held(self, peer: int, why: str) -> list[Action]:
        """Place again the tasks of this node that ``peer`` held when this node rejoined
        (``PeerTable.mark_stale``): it dropped them when it learned of the rejoin."""
        peers = self._peers
        if peers is None:
            return []
        return self._replace(peer, peers.take_stale(peer), why)

    def _replace(self, peer: int, tasks: list[Task], why: str) -> list[Action]:
        out: list[Action] = []
        for t in tasks:
            now = self._clock()
            t.state = TaskState.NEW
            self._n_redispatches += 1
            self._note(now, D_REDISPATCH, R_OTHER, t, NO_TASK, why)
            try:
                out.extend(self.submit(t))
            except SchedulerError:
                continue  # counted and recorded as a rejection; place the others
        return out

    def drop_origin(self, origin: int | None = None) -> list[Action]:
        """Drop every task held here whose origin is ``origin`` (None: every task of
        another node): queued ones are cancelled, running ones preempted with cancel."""
        me = self.node_id
        targets = tuple(
            t
            for t in self._tasks.values()
            if (t.origin == origin if origin is not None else t.origin != me)
        )
        if not targets:
            return []
        why = "this node rejoined" if origin is None else f"origin {origin} is gone"
        return self._stop(targets, True, R_OTHER, why, self._clock(), True)

    def remote_complete(self, peer: int, task_id: int) -> None:
        """A task this node forwarded completed on ``peer``."""
        now = self._clock()
        peers = self._peers
        key = (self.node_id << 64) | task_id
        if peers is None or (peers.release(peer, key) is None and peers.release_any(key) is None):
            self._reject(
                UnknownTaskError(f"task {task_id} is not held by peer {peer}"),
                task_id,
                now,
            )
        self._n_completions += 1
        self._note(now, D_COMPLETE, R_DONE_ON_PEER, None, task_id, None)
        self._peer_note(peer, -1, 0, 0, 0)

    def tick(self) -> list[Action]:
        """Time passed: a running task's quantum (or a job's budget window) that kept a
        preemption back may have ended; the head of the queue now preempts what it may.

        Call it at ``wake_at()`` (the node core arms a timer for it: a ``Wake`` effect); a
        call at any other time does nothing wrong, and nothing at all before ``wake_at()``.
        No input ever waits for this: the blocked task simply queues meanwhile."""
        now = self._clock()
        out: list[Action] = []
        wake = self._wake_ns
        if wake == 0 or now < wake:
            return out
        self._wake_ns = 0
        while not self._free:
            head = self._head()
            if head is None:
                break
            if self._oldest_starved(now) is not None:
                break  # a starved task waits: no compute preemption (it starts first)
            task = head[4]
            victim = self._lowest_running()
            if task.priority <= victim[0]:
                break
            chosen = self._may_preempt(task, victim, now)
            if chosen is None:
                break  # (``_may_preempt`` armed the next wake, if any)
            self._unqueue(task)
            out.extend(self._preempt_for(task, chosen, now))
        return out

    def governs(self) -> bool:
        """A run quantum or a preemption budget is set (some preemptions are governed)."""
        return bool(self._guarded)

    def wake_at(self) -> int | None:
        """When ``tick()`` next has something to do (clock ns), or None."""
        return self._wake_ns or None

    def _may_preempt(self, task: Task, victim: REntry, now: int) -> REntry | None:
        """The running task ``task`` (it outranks ``victim``, the lowest running, and heads
        the queue) may preempt now: ``victim`` when nothing governs it (no guard, a sync or
        critical task), else the lowest-ranked running task below it whose quantum is over
        and whose budgets are not spent (charged to them), else None (``_blocked`` says
        why, ``_wake_ns`` when to look again)."""
        if not self._guarded or task.priority >= self._critical:
            return victim
        best, blocked = self._candidates(task.priority, now)
        if best is None:
            rule = R_BUDGET
            wake = 0
            for _t, at, r, _f in blocked:
                if r == R_QUANTUM:
                    rule = R_QUANTUM
                if at and (wake == 0 or at < wake):
                    wake = at
            self._blocked = rule
            if wake and (self._wake_ns == 0 or wake < self._wake_ns):
                self._wake_ns = wake
            return None
        t = best[3]
        if self._task_budget is not None:
            npre = self._npreempt
            npre[t.held_key] = npre.get(t.held_key, 0) + 1
            if len(npre) > 2 * len(self._tasks) + 64:
                self._npreempt = {k: n for k, n in npre.items() if k in self._tasks}
        if self._job_budget is not None:
            jobs = self._job_preempts
            times = jobs.get(t.job)
            if times is None:
                if len(jobs) > 4096:  # drop the jobs whose window has emptied
                    edge = now - self._job_window_ns
                    for j in [j for j, q in jobs.items() if not q or q[len(q) - 1] <= edge]:
                        del jobs[j]
                times = jobs[t.job] = deque()
            times.append(now)
        return best

    def _candidates(
        self, priority: int, now: int
    ) -> tuple[REntry | None, list[tuple[Task, int, int, dict[str, Any]]]]:
        """The running tasks below ``priority``: the one a governed preemption takes
        (lowest priority, then most recently started, among those free to go), and the
        others, each with when it is free to go (0: never), the rule that holds it and
        the figures."""
        best: REntry | None = None
        blocked: list[tuple[Task, int, int, dict[str, Any]]] = []
        q = self._quantum_ns
        kb = self._task_budget
        jb = self._job_budget
        win = self._job_window_ns
        for t in self._slots:
            if t is None or t.priority >= priority:
                continue
            ran = now - t.started_ns
            at = 0
            rule = 0
            fig: dict[str, Any] = {"ran_ns": ran}
            if ran < q:
                at = t.started_ns + q
                rule = R_QUANTUM
            used = self._npreempt.get(t.held_key, 0) if kb is not None else 0
            if kb is not None and used >= kb:
                at, rule = -1, R_BUDGET
                fig["task_used"] = used
            if jb is not None:
                times = self._job_preempts.get(t.job)
                if times is not None:
                    while times and times[0] <= now - win:
                        times.popleft()
                    if len(times) >= jb:
                        fig["job_used"] = len(times)
                        if at >= 0:
                            at, rule = max(at, times[0] + win), R_BUDGET
            if rule == 0:
                e: REntry = t.rentry  # type: ignore[assignment]  # a running task has one
                if best is None or e < best:
                    best = e
            else:
                blocked.append((t, max(at, 0), rule, fig))
        return best, blocked

    def _note_returned(self, key: int, peer: int) -> None:
        """A peer handed this node's task ``key`` back (``why``: PeerRefused)."""
        returned = self._returned
        returned[key] = peer
        if len(returned) > 2 * len(self._tasks) + 64:
            self._returned = {k: p for k, p in returned.items() if k in self._tasks}

    def why(self, task_id: int, origin: int | None = None) -> list[reasons.Reason]:
        """The ranked reasons the queued task ``task_id`` (of ``origin``) has not started
        (reasons.py; empty for a task that runs or is being preempted)."""
        task = self.get(task_id, origin)
        if task.state is not _QUEUED:
            return []
        order = self.queued()
        return self._why(task, order.index(task), order, self._clock())

    def waiting_counts(self) -> dict[str, int]:
        """Reason code -> queued tasks that wait for it (a task counts under each of its
        reasons; every code is a key): the ``rdmasched_tasks_waiting`` gauge."""
        counts = dict.fromkeys((str(c) for c in reasons.Code), 0)
        order = self.queued()
        now = self._clock()
        for i, t in enumerate(order):
            for r in self._why(t, i, order, now):
                counts[str(r.code)] += 1
        return counts

    def _why(self, task: Task, ahead: int, order: list[Task], now: int) -> list[reasons.Reason]:
        out: list[reasons.Reason] = []
        running = self.nslots - len(self._free)
        if not self._free:
            out.append(reasons.no_free_slot(running, self.nslots, self._nqueued))
            low = self._lowest_running()
            lt = low[3]
            if task.priority <= low[0]:
                out.append(
                    reasons.does_not_outrank(task.priority, low[0], lt.id, running, self.nslots)
                )
            elif ahead:
                head = order[0]
                starved = head.priority != SYNC_PRIORITY and (
                    now - head.waiting_since_ns >= self.starvation_ns
                )
                out.append(reasons.queued_behind(ahead, head.id, head.priority, starved))
            elif self._guarded and task.priority < self._critical:
                _best, blocked = self._candidates(task.priority, now)
                blocked.sort(key=lambda b: (b[0].priority, -b[0].started_ns))
                for t, _at, rule, fig in blocked[:1]:
                    if rule == R_QUANTUM:
                        out.append(
                            reasons.run_quantum(t.id, t.priority, fig["ran_ns"], self._quantum_ns)
                        )
                    else:
                        out.append(
                            reasons.budget_exhausted(
                                t.id,
                                t.priority,
                                fig.get("task_used"),
                                self._task_budget,
                                t.job,
                                fig.get("job_used"),
                                self._job_budget,
                                self._job_window_ns,
                            )
                        )
        peer = self._returned.get(task.held_key)
        if peer is not None:
            out.append(reasons.peer_refused(peer, task.hops))
        out.extend(self._topology(task))
        return out

    def _topology(self, task: Task) -> list[reasons.Reason]:
        """Why placement leaves ``task`` here (a queued task: submit() found no peer)."""
        peers = self._peers
        if peers is None or not peers.domains:  # no peer at all: nowhere else to go
            return []
        if not can_spill(task.hops, self._max_hops):
            return [
                reasons.topology(
                    f"made {task.hops}/{self._max_hops} hops: it stays here",
                    hops=task.hops,
                    max_hops=self._max_hops,
                )
            ]
        mine = self._load(0)
        loads = peers.loads()
        if task.origin != self.node_id:
            loads = {task.origin: loads[task.origin]} if task.origin in loads else {}
        peer = choose_peer(
            loads,
            peers.domains,
            self._domain,
            random.Random(0),
            self_id=self.node_id,
            max_load=mine,
        )
        if peer is not None:
            return []
        where = f" in domain {self._domain!r}" if self._domain else ""
        return [
            reasons.topology(
                f"no live peer{where} has a load below this node's {mine}",
                load=mine,
                peers=len(loads),
            )
        ]

    # --- gangs: the slots rdmasched/scheduler/gang.py holds (docs/GANGS.md) ---------------

    def hold_slot(self) -> int:
        """Take a free slot without starting anything on it (a gang member's reservation);
        -1 if none is free. It counts as busy until ``start_held`` or ``release_slot``."""
        free = self._free
        return free.pop() if free else -1

    def start_held(self, task: Task, slot: int) -> list[Action]:
        """Start ``task`` on ``slot``, a slot ``hold_slot`` returned: checked and taken in
        as ``dispatch`` takes a task in. Rejected (raises), the slot stays held."""
        now = self._clock()
        self._admit(task, now, False)
        self._run_on(task, slot, now)
        self._rec(now, D_START, R_FREE, task, slot, None, 0, 0)
        return [_new(Start, (task, slot))]

    def release_slot(self, slot: int) -> list[Action]:
        """Give back a slot ``hold_slot`` returned: to the head of the queue, or free."""
        out: list[Action] = []
        self._fill(slot, self._clock(), out)
        return out

    def note(self, task: Task, why: str) -> None:
        """Record a ``redispatch`` event about ``task`` with ``why`` as its reason (a gang
        placed again as a whole)."""
        self._n_redispatches += 1
        self._note(self._clock(), D_REDISPATCH, R_OTHER, task, NO_TASK, why)

    # --- views ----------------------------------------------------------------------------

    def get(self, task_id: int, origin: int | None = None) -> Task:
        """The task ``task_id`` of node ``origin`` (default: this node) held here (queued,
        running or being preempted)."""
        try:
            return self._tasks[((self.node_id if origin is None else origin) << 64) | task_id]
        except KeyError:
            raise UnknownTaskError(f"unknown task {task_id}") from None

    def lookup(self, task_id: int, origin: int | None = None) -> Task | None:
        """Like ``get``, but None when the task is not held here (no exception)."""
        return self._tasks.get(((self.node_id if origin is None else origin) << 64) | task_id)

    def find(self, task_id: int) -> list[Task]:
        """Every task held here with id ``task_id``, whatever its origin (by origin)."""
        own = self._tasks.get((self.node_id << 64) | task_id)
        found = [t for t in self._tasks.values() if t.id == task_id and t is not own]
        if own is not None:
            found.append(own)
        return sorted(found, key=lambda t: t.origin)

    def running(self) -> list[Task]:
        """Running tasks, by slot."""
        return [t for t in self._slots if t is not None]

    def queued(self) -> list[Task]:
        """Queued tasks in the order they would start (as of now)."""
        now = self._clock()
        live = [e for e in self._heap if e[4].qentry is e]
        syncs = sorted(e for e in live if e[0] < 0)
        starved = [
            e
            for e in self._fifo
            if e[4].qentry is e and e[0] >= 0 and now - e[4].waiting_since_ns >= self.starvation_ns
        ]
        seen = {id(e) for e in starved}
        rest = sorted(e for e in live if e[0] >= 0 and id(e) not in seen)
        return [e[4] for e in (*syncs, *starved, *rest)]

    def free_slots(self) -> int:
        """Idle slots."""
        return len(self._free)

    def load_hint(self) -> int:
        """Load figure for peers: (running + queued) per slot, in permille, as a u16.

        0 is idle, 1000 is every slot busy with nothing waiting, 2000 is busy with one
        task waiting per slot; it saturates at 65535.
        """
        return self._load(0)

    def events(self) -> list[Event]:
        """The decision ring, oldest first."""
        return list(self._read())

    def events_jsonl(self) -> Iterator[str]:
        """The ring as JSON lines (one dict per event; see ``Event.as_dict``)."""
        return to_jsonl(self.events())

    def explain(self, task_id: int) -> list[Event]:
        """Events that name ``task_id``, as subject or among the tasks it beat, oldest first."""
        return [e for e in self._read() if e.task_id == task_id or task_id in e.beaten]

    def stats(self) -> SchedulerStats:
        """A snapshot of the counters (see ``SchedulerStats.describe()``)."""
        n = {name: getattr(self, f"_n_{name}") for name in _COUNTERS}
        rejections = sum(self._rejected.values())
        decisions = rejections + sum(v for k, v in n.items() if k not in _NOT_DECISIONS)
        recorded = self._ev_n  # every decision and completion, while events are on
        return SchedulerStats(
            decisions=decisions,
            rejections=rejections,
            rejected=dict(self._rejected),
            events_recorded=recorded,
            events_dropped=max(0, recorded - self._ev_cap),
            events_capacity=self._ev_cap,
            running=self.nslots - len(self._free),
            queue_len=self._nqueued,
            free_slots=len(self._free),
            load_hint=self._load(0),
            **n,
        )

    # --- internals ------------------------------------------------------------------------

    def _load(self, extra: int) -> int:
        busy = self.nslots - len(self._free) + self._nqueued + extra
        # 0xFFFF is LOAD_HINT_MAX, a literal so that compiled, no int object is made here
        return min(0xFFFF, busy * 1000 // self.nslots)

    def cause(self, kind: int, src: int, seq: int, sent_ns: int) -> None:
        """The message being handled: the decisions taken until the next ``cause()`` record
        it (its ``Kind``, sender, lane sequence number and send time).  ``kind`` 0: none
        (a local call, a timer)."""
        self._cause_kind = kind
        self._cause_w = (kind & 0xFF) | ((src & 0xFFFFFF) << 8) | ((seq & _LOW32) << 32)
        # (a u64, else 0; compiled, sent_ns is a C u64 already and this is no test)
        self._cause_ns = sent_ns if (sent_ns & _WORD_MAX) == sent_ns else 0

    def _rec(
        self,
        now: int,
        decision: int,
        rule: int,
        task: Task,
        slot: int,
        beaten: Task | None,
        nbeaten: int,
        queued: int,
    ) -> int:
        """Record one event about ``task`` in the ring: a few stores, no object made.

        ``beaten``: the best task it went ahead of, and ``nbeaten`` how many; ``queued``:
        1 for a start from the queue (its wait is recorded).  Compiled, every value read
        here is a C integer (the task's ``tel_*`` fields, made by ``_tel`` when it was
        taken in) but ``waiting_since_ns`` and a sync task's step and group.  Returns 0
        (compiled: a C int, no object)."""
        if self._ev_cap == 0:
            return 0
        b = self._ev_b
        nb = b + _WORDS
        self._ev_b = 0 if nb == self._ev_end else nb  # the ring's next record (no division)
        self._ev_n += 1
        meta = task.tel_meta
        if meta == 0:
            self._tel(task)
            meta = task.tel_meta
        self._ev[b + _W_T] = now
        self._ev[b + _W_ID] = task.tel_id
        self._ev[b + _W_ORIGIN] = task.tel_origin
        self._ev[b + _W_JOB] = task.tel_job
        p = meta & 0xFF
        flags = meta >> 8
        if p == _SYNC_P:
            flags |= self._rec_step(task, b)
        if beaten is not None:
            if beaten.tel_meta == 0:
                self._tel(beaten)
            self._ev[b + _W_BEATEN] = beaten.tel_id
            self._ev[b + _W_BEATEN2] = beaten.tel_origin | (nbeaten << 32)
            flags |= _F_BEATEN
        if self._cause_kind:
            self._ev[b + _W_CAUSE] = self._cause_w
            self._ev[b + _W_CAUSE_NS] = self._cause_ns
            flags |= _F_CAUSE
        if queued:
            since = task.waiting_since_ns
            self._ev[b + _W_WAIT] = now - since
        else:
            self._ev[b + _W_WAIT] = 0
        depth = self.nslots - len(self._free)
        self._ev[b + _W_DEPTH] = self._nqueued | (depth << 32)
        self._by_rule[decision * 32 + rule] += 1
        m = slot + 1
        m = (m << 8) | p
        m = (m << 16) | flags
        m = (m << 8) | rule
        self._ev[b + _W_META] = (m << 8) | decision
        return 0

    def _rec_step(self, task: Task, b: int) -> int:
        """A sync task's step and group into the record at ``b``; ``_F_STEP`` if stored."""
        step = task.step
        group = task.group
        if step is None or group is None:
            return 0
        try:
            self._ev[b + _W_STEP] = step
            self._ev[b + _W_GROUP] = group
        except OverflowError:
            return 0
        return _F_STEP

    def _tel(self, task: Task) -> None:
        """Set ``task.tel_*``: its fields as the ring stores them, once, when it is taken
        in (a job that is not a u64 is recorded as absent; an origin that is not one, as
        its low 64 bits)."""
        job = task.job
        flags = _F_TASK_JOB
        # (against a small literal first: compiled, a C comparison for the common case)
        if type(job) is not int or job < 0 or (job > 0xFFFFFFFF and job > _U64):
            job = 0
            flags = _F_TASK
        origin = task.origin
        if origin < 0 or (origin > 0xFFFFFFFF and origin > _U64):
            origin = origin & _U64
        task.tel_id = task.id  # (checked to be a u64 before)
        task.tel_origin = origin
        task.tel_job = job
        p = task.priority  # (checked to be 0..255 before)
        task.tel_meta = p | (flags << 8)

    def _next_rec(self) -> int:
        """Take the ring's next record (off the hot path): its first word's index."""
        b = self._ev_b
        nb = b + _WORDS
        self._ev_b = 0 if nb == self._ev_end else nb
        self._ev_n += 1
        return b

    def _last_rec(self) -> int:
        """The first word's index of the record written last."""
        b = self._ev_b
        return (b if b else self._ev_end) - _WORDS

    def _note(
        self,
        now: int,
        decision: int,
        rule: int,
        task: Task | None,
        task_id: int,
        text: str | None,
        slot: int = -1,
    ) -> None:
        """Record an event off the hot path: about ``task``, or about a bare ``task_id``
        (NO_TASK: none) with no task; ``text``, if any, is kept as its reason."""
        cap = self._ev_cap
        if cap == 0:
            return
        if task is not None:
            self._rec(now, decision, rule, task, slot, None, 0, 0)
        else:
            b = self._next_rec()
            flags = 0
            if 0 <= task_id <= _U64:
                self._ev[b + _W_ID] = task_id
                flags = F_ID
            if self._cause_kind:
                self._ev[b + _W_CAUSE] = self._cause_w
                self._ev[b + _W_CAUSE_NS] = self._cause_ns
                flags |= F_CAUSE
            self._ev[b + _W_T] = now
            self._ev[b + _W_DEPTH] = self._nqueued | ((self.nslots - len(self._free)) << 32)
            self._ev[b + _W_META] = decision | (rule << 8) | (flags << 16)
            self._by_rule[decision * 32 + rule] += 1
        if text is not None:
            n = self._ev_n - 1
            self._ev[self._last_rec() + _W_META] |= F_TEXT << 16
            texts = self._ev_text
            texts[n] = text
            if len(texts) > cap:  # keep the texts of events still in the ring
                for k in [k for k in texts if k <= n - cap]:
                    del texts[k]

    def _peer_note(self, peer: int, lost: int, peer_load: int, lost_load: int, mine: int) -> None:
        """Add the placement fields to the last event: the peer chosen (or named), the
        peer that lost the power-of-two choice (-1: none), their loads and this node's."""
        if self._ev_cap == 0:
            return
        b = self._last_rec()
        self._ev[b + _W_PEER] = (peer & _NO_PEER) | ((lost & _NO_PEER) << 32)
        self._ev[b + _W_LOADS] = (
            (peer_load & 0xFFFF) | ((lost_load & 0xFFFF) << 16) | ((mine & 0xFFFF) << 32)
        )
        self._ev[b + _W_META] |= _F_PEER << 16

    def _read(self) -> Iterator[Event]:
        """The events in the ring, oldest first, decoded."""
        cap = self._ev_cap
        n = self._ev_n
        w = self._ev
        texts = self._ev_text
        node = self.node_id
        for seq in range(max(0, n - cap), n):
            yield decode(w, (seq % cap) * WORDS, seq, node, texts)

    def events_since(self, seq: int) -> tuple[list[Event], int]:
        """The events numbered ``seq`` and after that are still in the ring, and how many of
        those after ``seq`` the ring had already overwritten (a reader that polls with the
        last ``Event.seq`` + 1 sees every event, or counts what it missed)."""
        cap = self._ev_cap
        n = self._ev_n
        first = max(seq, n - cap, 0)
        w = self._ev
        texts = self._ev_text
        node = self.node_id
        got = [decode(w, (i % cap) * WORDS, i, node, texts) for i in range(first, n)]
        return got, max(0, first - max(seq, 0))

    def decisions_by_rule(self) -> dict[tuple[str, str], int]:
        """(decision, rule name) -> events recorded with it since start (complete counts too;
        while the event ring is off, nothing is counted)."""
        out: dict[tuple[str, str], int] = {}
        for i, n in enumerate(self._by_rule):
            if n:
                out[(str(DECISIONS[i // 32]), Rule(i % 32).name.lower())] = n
        return out

    @property
    def events_recorded(self) -> int:
        """Events recorded since start (the next event's ``seq``)."""
        return self._ev_n

    def _reject(self, exc: SchedulerError, task_id: int, now: int) -> NoReturn:
        """Count and record a rejection, then raise it (never returns)."""
        reason = exc.reason
        self._rejected[reason] = self._rejected.get(reason, 0) + 1
        self._note(now, D_REJECT, R_OTHER, None, task_id, f"{reason}: {exc}")
        raise exc

    def _check_task(self, task: Task, now: int, *, sync: bool) -> None:
        tid = task.id
        if not 0 <= tid <= U64_MAX:
            self._reject(InvalidTaskError(f"task id {tid} is not a u64"), NO_TASK, now)
        p = task.priority
        if not 0 <= p <= COMPUTE_PRIORITY_MAX and not (sync and p == SYNC_PRIORITY):
            if p == SYNC_PRIORITY:
                msg = f"task {tid}: priority 255 is reserved for sync tasks"
            else:
                msg = f"task {tid}: priority {p} is not in 0..{COMPUTE_PRIORITY_MAX}"
            self._reject(InvalidTaskError(msg), tid, now)
        if task.cost_ns < 0 or task.progress_ns < 0:
            self._reject(InvalidTaskError(f"task {tid}: negative cost or progress"), tid, now)
        key = (task.origin << 64) | tid
        if key in self._tasks:
            self._reject(
                DuplicateTaskError(f"task {tid} of node {task.origin} is already here"), tid, now
            )
        peers = self._peers
        if peers is not None and task.origin == self.node_id:
            holder = peers.holder(key)
            if holder is not None:  # caught at the origin: ids are unique per origin
                self._reject(
                    DuplicateTaskError(f"task {tid} is already placed on peer {holder}"), tid, now
                )
        if self._ev_cap:
            self._tel(task)

    def _admit(self, task: Task, now: int, sync: bool) -> int:
        """Check ``task`` and take it in (it is neither queued nor running yet); its key."""
        tid = task.id
        p = task.priority
        key = (task.origin << 64) | tid
        peers = self._peers
        if (
            key in self._tasks
            or (peers is not None and peers.holds(key))
            or not 0 <= tid <= U64_MAX
            or not (0 <= p <= COMPUTE_PRIORITY_MAX or (sync and p == SYNC_PRIORITY))
            or task.cost_ns < 0
            or task.progress_ns < 0
        ):
            self._check_task(task, now, sync=sync)  # raises the precise error
        task.enqueued_ns = now
        self._tasks[key] = task
        task.held_key = key
        if self._guarded and self._npreempt:  # a new task: no preemption counted yet
            self._npreempt.pop(key, None)
        if self._ev_cap:
            self._tel(task)
        return key

    def _place(self, task: Task, now: int, key: int) -> list[Action]:
        """Start ``task`` (just admitted; ``key`` is its identity), preempt for it, or
        queue it."""
        free = self._free
        if free:
            slot = free.pop()
            self._run_on(task, slot, now)
            self._rec(now, D_START, R_FREE, task, slot, None, 0, 0)
            return [_new(Start, (task, slot))]
        return self._place_busy(task, now, key)

    def _place_busy(self, task: Task, now: int, key: int) -> list[Action]:
        """No free slot: preempt for ``task`` if it outranks the victim and heads the
        queue, else queue it."""
        run = self._run  # the victim candidate: lowest priority, most recently started
        victim = run[0]
        vt = victim[3]
        while vt.rentry is not victim:  # (some task runs: no slot is free)
            heappop(run)
            victim = run[0]
            vt = victim[3]
        if task.priority > victim[0]:
            if self._heads_queue(task, now, key):
                if not self._guarded:
                    return self._preempt_for(task, victim, now)
                chosen = self._may_preempt(task, victim, now)  # the no-thrash hook
                if chosen is not None:
                    return self._preempt_for(task, chosen, now)
                reason = self._blocked
            else:
                reason = R_BEHIND
        else:
            reason = R_NO_SLOT
        self._enqueue(task, now, key)
        self._n_queued += 1
        self._rec(now, D_QUEUE, reason, task, -1, None, 0, 0)
        return []

    def _preempt_for(self, task: Task, victim_entry: REntry, now: int) -> list[Action]:
        victim = victim_entry[3]
        slot = victim_entry[2]
        self._off_slot(victim, slot)
        victim.state = _PREEMPTING
        self._outranked.add(victim.held_key)
        self._n_preemptions += 1
        self._rec(now, D_PREEMPT, R_VICTIM, victim, slot, None, 0, 0)
        self._run_on(task, slot, now)
        self._rec(now, D_START, R_OUTRANKS, task, slot, victim, 1, 0)
        return [_new(Preempt, (victim, slot, task, False)), _new(Start, (task, slot))]

    def _run_on(self, task: Task, slot: int, now: int) -> None:
        task.state = _RUNNING
        task.slot = slot
        task.started_ns = now
        seq = self._seq = self._seq + 1
        e = (task.priority, -seq, slot, task)
        task.rentry = e
        self._slots[slot] = task
        run = self._run
        heappush(run, e)
        if len(run) > self._run_cap:  # drop entries of tasks no longer running
            self._run = [t.rentry for t in self._slots if t is not None and t.rentry]
            heapify(self._run)
        self._n_starts += 1

    def _off_slot(self, task: Task, slot: int) -> None:
        """Take a running task off its slot (the slot is left empty, not freed)."""
        task.rentry = None
        task.slot = None
        self._slots[slot] = None

    def _lowest_running(self) -> REntry:
        """The victim candidate: lowest priority, then most recently started.

        Only called when no slot is free, so some task runs."""
        run = self._run
        e = run[0]
        while e[3].rentry is not e:
            heappop(run)
            e = run[0]
        return e

    def _enqueue(self, task: Task, now: int, key: int) -> QEntry:
        """Put ``task`` (identity ``key``) in the queue (keeps ``task.enqueued_ns``; the
        wait starts now).

        Returns its queue entry ``(rank, -priority, enqueued_ns, key, task)``."""
        p = task.priority
        enq = task.enqueued_ns
        e = (self._offset[p] + enq, _NEG[p], enq, key, task)
        task.qentry = e
        task.state = _QUEUED
        task.waiting_since_ns = now
        heap = self._heap
        heappush(heap, e)
        nq = self._nqueued = self._nqueued + 1
        if p != SYNC_PRIORITY:
            fifo = self._fifo
            if not fifo:
                self._starve_at = now + self.starvation_ns
            fifo.append(e)  # appended at ``now``: the FIFO is in order of waiting_since
            if len(fifo) > 2 * nq + 64:
                self._compact_fifo()
        if len(heap) > 2 * nq + 64:
            self._heap = [x for x in heap if x[4].qentry is x]
            heapify(self._heap)
        return e

    def _unqueue(self, task: Task) -> None:
        task.qentry = None  # lazily deleted from the heap and the FIFO
        nq = self._nqueued = self._nqueued - 1
        if len(self._heap) > 2 * nq + 64:  # e.g. after a job's queued tasks were cancelled
            self._heap = [e for e in self._heap if e[4].qentry is e]
            heapify(self._heap)
        if len(self._fifo) > 2 * nq + 64:
            self._compact_fifo()

    def _compact_fifo(self) -> None:
        fifo = self._fifo
        while fifo and fifo[0][4].qentry is not fifo[0]:
            fifo.popleft()
        if len(fifo) > 2 * self._nqueued + 64:
            self._fifo = deque(e for e in fifo if e[4].qentry is e)

    def _head(self) -> QEntry | None:
        """The live entry at the top of the heap, or None (drops stale ones)."""
        heap = self._heap
        while heap:
            e = heap[0]
            if e[4].qentry is e:
                return e
            heappop(heap)
        return None

    def _oldest_starved(self, now: int) -> QEntry | None:
        """The compute task that has waited longest, if it has waited starvation_ns.

        Also moves ``_starve_at`` up to the wait start of the FIFO's head plus the cap:
        the FIFO is in order of wait start, so no task can be starved before then."""
        if now < self._starve_at:
            return None
        fifo = self._fifo
        while fifo:
            e = fifo[0]
            t = e[4]
            if t.qentry is not e:
                fifo.popleft()
                continue
            self._starve_at = t.waiting_since_ns + self.starvation_ns
            return e if now >= self._starve_at else None
        self._starve_at = _NEVER
        return None

    def _heads_queue(self, task: Task, now: int, key: int) -> bool:
        """Would ``task`` (not queued; identity ``key``) be the head of the queue?"""
        head = self._head()
        if head is None:
            return True
        p = task.priority
        if p != SYNC_PRIORITY and self._oldest_starved(now) is not None:
            return False
        enq = task.enqueued_ns
        return (self._offset[p] + enq, _NEG[p], enq, key) < head[:4]

    def _fill(self, slot: int, now: int, out: list[Action]) -> None:
        """Give the free ``slot`` to the head of the queue, or mark it free."""
        heap = self._heap
        while heap:  # the head, dropping stale entries (inlined _head)
            head = heap[0]
            ht = head[4]
            if ht.qentry is head:
                break
            heappop(heap)
        else:
            self._free.append(slot)
            return
        pick = head
        reason = R_HEAD
        if now >= self._starve_at and head[0] >= 0:  # a compute head; anyone starved?
            starved = self._oldest_starved(now)
            if starved is not None and starved is not head:
                self._fifo.popleft()
                pick = starved
                reason = R_STARVED
                self._n_starved_starts += 1
        beaten = None
        if pick is head:
            heappop(heap)
            while heap:  # the runner-up
                nxt = heap[0]
                task = nxt[4]
                if task.qentry is nxt:
                    beaten = task
                    break
                heappop(heap)
        else:
            beaten = ht
        task = pick[4]
        task.qentry = None
        nq = self._nqueued = self._nqueued - 1
        self._run_on(task, slot, now)
        self._rec(now, D_START, reason, task, slot, beaten, nq, 1)
        out.append(_new(Start, (task, slot)))
