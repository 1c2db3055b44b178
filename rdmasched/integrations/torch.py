"""PyTorch DistributedDataParallel under rdmasched (issue 10): docs/TORCH.md.

Optional: needs torch >= 2.3 (`pip install 'rdmasched[torch]'`). One daemon per host runs
the host's scheduler (docs/CLIENT.md); every training rank is a `Client` of it
(`host_client()`: under torchrun, local rank 0 starts the daemon if none runs, with strict
priorities). Three pieces, all driven through the rank's client (`SchedulerClient` says what
is used):

- `RankScheduler.hook` (``ddp.register_comm_hook(None, sched.hook)``): each gradient bucket
  is a sync task. The hook announces the bucket (`sync_ready(group_of_bucket, step)`); once
  every rank of every host has, each host's daemon releases the sync task and calls every
  local rank's sync handler, which hands the bucket to the comm queue. The queue starts
  the released buckets' all-reduces (``async_op=True``, on a group of the job's own
  backend: gloo on the CPU, NCCL on GPUs) in priority order, the
  bucket holding the first layers first (P3, ByteScheduler: priority = bucket index, since
  DDP's bucket 0 holds the last layers), at most `max_inflight` at a time, in one order on
  every rank (rank 0 chooses among the buckets released, as ByteScheduler's coordinator
  does, and broadcasts its choice; on one host, the daemon's release order, which every
  rank sees the same); the hook's future is completed with the averaged gradients when the
  collective is done.
- `RankScheduler.compute()`: a context manager around the training step; a compute task of
  the training job at `compute_priority` holds one of the host's slots while the step runs,
  so low-priority work is preempted before the step starts and dispatched again after it.
- `Colocated`: co-located low-priority work (data preparation, evaluation, a second job) as
  a task whose preempt handler freezes its processes (`rdmasched.integrations.freeze`:
  cgroup v2 ``cgroup.freeze``, else SIGSTOP/SIGCONT) and whose dispatch thaws them; the
  work is killed when the `Colocated` closes or its rank dies, however it dies.

Every wait is bounded: a bucket not released within `sync_timeout_s`, a rank of this host
whose process is gone, another host declared dead, the host's daemon gone, a collective
that fails: the hook's future fails with a `TorchSyncError` saying which, so
``loss.backward()`` raises instead of hanging, and every later call raises the same error
at once.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from rdmasched.api import NodeAPI
from rdmasched.daemon.checks import check_bool
from rdmasched.daemon.tuning import set_slice
from rdmasched.errors import ArgumentError, RdmaschedError
from rdmasched.integrations.freeze import Freezer
from rdmasched.limits import COMPUTE_PRIORITY_MAX
from rdmasched.scheduler import Task
from rdmasched.transport import shm

if TYPE_CHECKING:
    from rdmasched.client import Client

_log = logging.getLogger("rdmasched.torch")

#: priority of the training step's compute task (sync tasks are 255, above every compute)
COMPUTE_PRIORITY = 200
#: priority of co-located work by default
COLOCATED_PRIORITY = 10
#: the sync groups of a job's buckets: GROUP_BASE + bucket index
GROUP_BASE = 1 << 20
#: task ids of the integration's own tasks start here; ids are unique per host, so each
#: local rank has its own range: TASK_BASE + (local index << 40) + n
TASK_BASE = 1 << 48
#: what a co-located task's preemption does (`Colocated(preempt=)`): stop its processes
#: (the freezer), or move them into the kernel's idle scheduling class
PREEMPT_MODES = ("freeze", "idle")
#: the nice of a preempted co-located job's own autogroup (`Colocated(preempt="idle")`)
IDLE_GROUP_NICE = 19
#: the watchdog's period while a step runs, s
WATCH_S = 0.05
#: how long a rank may stay out of `compute()` before its compute task is given back, s
#: (`RankScheduler(linger_s=)`): the gap between two steps is far shorter
LINGER_S = 0.05
#: the most buckets rank 0 chooses in one control message (the comm queue's broadcast)
CHOICES_PER_MESSAGE = 16
#: the exit status of a rank that left because another rank or host of the job was lost
#: (`RankScheduler(exit_on_lost=True)`): sysexits' EX_TEMPFAIL, "try again"; torchrun's
#: elastic agent restarts the job on the hosts left (docs/TORCH.md, "Fast failure")
EXIT_LOST = 75
#: how long a rank leaving so waits for its process groups' abort before it exits anyway
ABORT_TIMEOUT_S = 0.5


class TorchSyncError(RdmaschedError, RuntimeError):
    """A bucket's sync could not complete: the scheduler is gone, a rank is lost, it timed
    out, or the collective failed. The hook's future fails with it; later calls raise it."""


class SchedulerGoneError(TorchSyncError):
    """The rank's scheduler (its host's daemon) is gone, or refused a call."""


class RankLostError(TorchSyncError, ConnectionError):
    """Another rank of the job is gone: its process (on this host) or its host (declared
    dead by the daemons)."""


class SyncTimeoutError(TorchSyncError, TimeoutError):
    """A bucket was not released (not every rank reported it) within the timeout."""


class SchedulerClient(NodeAPI, Protocol):
    """What the integration uses of a rank's scheduler: Node's API (`rdmasched.api.NodeAPI`,
    docs/CLIENT.md) with a client's `define_group`, which says how many of the host's ranks
    take part (`rdmasched.client.Client`)."""

    def define_group(
        self,
        group: int,
        members: Iterable[int | str],
        *,
        local: int | None = None,
        overlap: bool = False,
    ) -> None: ...

    #: the hosts the daemon declared dead (its liveness news so far)
    dead_peers: set[int]

    def on_peer(self, fn: Callable[[int, bool, str], None]) -> Callable[[int, bool, str], None]:
        """`fn(node, dead, why)`, the moment the daemon declares a host dead or alive."""
        ...


class _Bucket:
    """One bucket's sync of one step, from the hook to the future."""

    __slots__ = ("done", "fut", "index", "priority", "released_ns", "reported_ns", "step", "tensor")

    def __init__(self, index: int, step: int, priority: int, tensor: torch.Tensor) -> None:
        self.index, self.step, self.priority, self.tensor = index, step, priority, tensor
        self.fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self.reported_ns = time.monotonic_ns()
        self.released_ns = 0
        self.done = False


class RankScheduler:
    """The training job of one rank, through `client`: this rank's open `Client` of its
    host's daemon (`host_client()`).

    Takes over the client's dispatch, preempt and sync handlers. Construct it on every rank
    after ``init_process_group``, in the same order as other process groups: it is a
    collective call (it makes two groups: one for the buckets' all-reduces on the default
    group's own backend, `dist.get_backend()`, and one on gloo for its small CPU control
    messages; and the ranks tell each other their host and process). The buckets' sync
    groups are over the job's hosts (the daemons' node ids the ranks report), each host
    waiting for its own ranks (`local`: how many ranks share this rank's daemon).
    `priority(index)`: a bucket's priority (default its index: the bucket holding the first
    layers first). `max_inflight`: collectives started at once. `sync_timeout_s`: how long a
    bucket may wait for every rank. `job`: the training job's id in the scheduler.

    A host of the job declared dead by the daemons fails the job's syncs the moment the news
    reaches this rank (the daemon tells its clients: `Client.on_peer`), as a rank of this
    machine whose process is gone does (checked every 50 ms while a step runs).
    `linger_s`: how long the rank may stay out of `compute()` before its compute task is
    given back (a step within that time takes the same task: no call to the daemon).
    `overlap` (default): the buckets' sync groups overlap the step (`Client.define_group`):
    a bucket's release takes no slot of the host and preempts nothing, since its all-reduce
    runs beside the step's compute, which holds the slot (False: each sync task takes a
    slot, preempting a rank's compute task in the daemon's books, which costs a STOP, its
    answer and a new START a bucket; docs/TORCH.md, "A bucket's sync takes no slot").
    `exit_on_lost`: then also abort the process groups and end the process with `EXIT_LOST`
    (75), at once, whatever the training thread is waiting in: a collective whose peer hangs
    (a frozen host, a partition) ends only at its timeout, and on gloo even a process
    group's abort does not end it (docs/TORCH.md, "Fast failure"). Under torchrun's elastic
    agent (``--max-restarts``, ``--nnodes MIN:MAX``) that restarts the job on the hosts left.
    """

    def __init__(
        self,
        node: SchedulerClient,
        *,
        priority: Callable[[int], int] | None = None,
        max_inflight: int = 1,
        sync_timeout_s: float = 60.0,
        collective_timeout_s: float = 60.0,
        job: int = 1,
        compute_priority: int = COMPUTE_PRIORITY,
        exit_on_lost: bool = False,
        linger_s: float = LINGER_S,
        overlap: bool = True,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise ArgumentError("RankScheduler needs torch.distributed initialised first")
        if isinstance(max_inflight, bool) or not isinstance(max_inflight, int) or max_inflight < 1:
            raise ArgumentError(f"max_inflight must be an int >= 1, not {max_inflight!r}")
        for name, value in (
            ("sync_timeout_s", sync_timeout_s),
            ("collective_timeout_s", collective_timeout_s),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
                raise ArgumentError(f"{name} must be a number of seconds > 0, not {value!r}")
        if (
            isinstance(linger_s, bool)
            or not isinstance(linger_s, int | float)
            or not 0 <= linger_s < 1e6
        ):
            raise ArgumentError(f"linger_s must be a number of seconds >= 0, not {linger_s!r}")
        check_bool("overlap", overlap)
        if not 0 <= compute_priority <= COMPUTE_PRIORITY_MAX:
            raise ArgumentError(
                f"compute_priority must be 0..{COMPUTE_PRIORITY_MAX}, not {compute_priority!r}"
            )
        if not node.healthy or node.id < 0:
            raise ArgumentError(
                "RankScheduler needs an open client of the host's daemon (`with host_client() "
                "as client:`, or client.open())"
            )
        self.node = node
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        self.priority_of = priority or (lambda index: index)
        self.max_inflight = max_inflight
        self.sync_timeout_s = float(sync_timeout_s)
        self.collective_timeout_s = float(collective_timeout_s)
        self.job = job
        self.compute_priority = compute_priority
        self.exit_on_lost = bool(exit_on_lost)
        self.linger_s = float(linger_s)
        self.overlap = overlap
        self._lock = threading.Condition()
        self._defined: set[int] = set()  # bucket indexes whose sync group is declared
        # the buckets' all-reduces, and the leader's choices of their order (not the default
        # group: DDP's own collectives run there, from the training thread). The all-reduces
        # run on the job's own backend (the gradients are where its backend wants them:
        # NCCL's on the GPU); the choices and the ranks' exchange below are a few CPU
        # integers, on gloo whatever the job's backend
        timeout = _timedelta(self.collective_timeout_s)
        #: the backend of the buckets' all-reduces: the job's (its default group's)
        self.backend = str(dist.get_backend())
        self._comm_pg: Any = dist.new_group(backend=self.backend, timeout=timeout)
        self._ctrl: Any = dist.new_group(backend="gloo", timeout=timeout)
        # every rank's host (its daemon's node id) and process, so each host's daemon waits
        # for its own ranks and a rank watches the processes of the others on its machine
        me = torch.tensor([node.id, os.getpid(), _process_start(), _boot_id()], dtype=torch.int64)
        every = [torch.zeros(4, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(every, me, group=self._ctrl)
        ranks = [tuple(int(x) for x in t.tolist()) for t in every]
        #: the job's hosts (node ids), and how many ranks this rank's host has
        self.members = sorted({r[0] for r in ranks})
        same_host = [r for r, x in enumerate(ranks) if x[0] == node.id]
        self.local = len(same_host)
        self.local_index = same_host.index(self.rank)
        #: the other ranks on this machine: rank -> (pid, start), watched while a step runs
        self._peers = {
            r: (x[1], x[2]) for r, x in enumerate(ranks) if x[3] == me[3] and r != self.rank
        }
        #: every rank of the job is a client of one daemon, which releases each bucket's
        #: sync to all of them in one order: each rank starts its buckets in that order, by
        #: itself (no leader, no control broadcast; `_comm_loop`)
        self.one_host = len(self.members) == 1
        self._ids = itertools.count(TASK_BASE + (self.local_index << 40))
        self._steps: dict[int, int] = {}  # bucket index -> next step
        self._pending: dict[tuple[int, int], _Bucket] = {}  # (index, step), not yet released
        # released: (-priority, seq, bucket); on one host (0, seq, bucket): release order
        self._ready: list[tuple[int, int, _Bucket]] = []
        self._inflight: dict[tuple[int, int], _Bucket] = {}
        self._seq = itertools.count()
        #: (one host) held from a released bucket's pop to its all-reduce's start
        self._issue = threading.Lock()
        #: buckets whose all-reduce the comm thread started: across hosts, every bucket; on
        #: one host only those released while `max_inflight` collectives ran (the others
        #: start in the sync handler, on the client's reader thread)
        self.handoffs = 0
        self._error: TorchSyncError | None = None
        self._closed = False
        self._stop = threading.Event()  # the watchdog's wait, set by close()
        #: the step's compute task kept between steps: (task id, when the step left it)
        self._held: tuple[int, int] | None = None
        #: what happened, in order: (event, step, bucket index, monotonic ns), event one of
        #: "report" (the hook), "release" (the sync handler), "choose" (rank 0 picked it, in
        #: the same critical section as the releases; a job of several hosts only), "start"
        #: (its all-reduce started), "done" (bounded)
        self.log: deque[tuple[str, int, int, int]] = deque(maxlen=100_000)
        self._compute: dict[int, threading.Event] = {}
        self._colocated: dict[int, Colocated] = {}
        node.on_sync(self._on_sync)
        node.on_dispatch(self._on_dispatch)
        node.on_preempt(self._on_preempt)
        node.on_peer(self._on_peer)
        for peer in sorted(node.dead_peers):  # declared dead before the handler was in place
            self._on_peer(peer, True, "declared dead before the job started")
        self._comm = threading.Thread(target=self._comm_loop, name="rdmasched-comm", daemon=True)
        self._comm.start()
        self._watch = threading.Thread(target=self._watchdog, name="rdmasched-watch", daemon=True)
        self._watch.start()
        #: the EEVDF slice of this rank's threads on the control path, us (the client's
        #: `slice_us`; None: the kernel's default)
        self.slice_us: int | None = getattr(node, "slice_us", None)
        if self.slice_us is not None:
            self._ask_slice(self.slice_us)

    def _ask_slice(self, slice_us: int) -> None:
        """Ask for `slice_us` on every thread of this process but the caller's (the one that
        runs the model): the comm thread, the watchdog, the client's reader, and the threads
        of the process groups (gloo runs its collectives and their callbacks on threads of
        its own), all on the path from a bucket's release to its future. One line if the
        kernel says no."""
        me = threading.get_native_id()
        why = None
        for name in sorted(os.listdir("/proc/self/task"), key=int):
            if int(name) != me:
                no = set_slice(slice_us, int(name))
                if no is not None and os.path.exists(f"/proc/self/task/{name}"):  # not gone
                    why = no
        if why is not None:
            _log.warning("rank %d: no EEVDF slice of %d us: %s", self.rank, slice_us, why)

    # ---- the DDP communication hook ------------------------------------------------------
    def hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The DDP comm hook: ``ddp.register_comm_hook(None, sched.hook)``."""
        index = bucket.index()
        tensor = bucket.buffer()
        with self._lock:
            step = self._steps.get(index, 0)
            self._steps[index] = step + 1
        b = _Bucket(index, step, int(self.priority_of(index)), tensor)
        try:
            self._check()
            self._group(index)
            tensor.div_(self.world)
            with self._lock:
                self._check()
                self._pending[(index, step)] = b
                self.log.append(("report", step, index, b.reported_ns))
            self.node.sync_ready(GROUP_BASE + index, step)
        except Exception as exc:
            self._fail(self._as_sync_error(exc, f"bucket {index} step {step}"))
            with self._lock:
                self._pending.pop((index, step), None)
            self._finish(b, error=self._error)
        return b.fut

    def _group(self, index: int) -> None:
        """Declare bucket `index`'s sync group the first time the bucket is seen."""
        if index not in self._defined:
            self.node.define_group(
                GROUP_BASE + index, self.members, local=self.local, overlap=self.overlap
            )
            self._defined.add(index)

    # ---- the scheduler's handlers (on the client's reader thread) --------------------------
    def _on_sync(self, task: Task, slot: int) -> None:
        group = task.group if task.group is not None else task.job
        index = group - GROUP_BASE
        step = int((task.payload or {}).get("step", -1))
        now = time.monotonic_ns()
        with self._lock:
            b = self._pending.pop((index, step), None)
            if b is None:
                _log.warning("sync task for bucket %d step %d, which no hook reported", index, step)
                return
            b.released_ns = now
            self.log.append(("release", step, index, now))
            key = 0 if self.one_host else -b.priority
            heapq.heappush(self._ready, (key, next(self._seq), b))
            if not self.one_host:
                self._lock.notify_all()  # the comm thread chooses (or waits for this one)
                return
        # one host: the release order is the start order, so the bucket starts here, on the
        # reader thread, with no hand-off to the comm thread (unless max_inflight is reached)
        self._start_released()

    def _on_dispatch(self, task: Task, slot: int) -> None:
        ev = self._compute.get(task.id)
        if ev is not None:
            ev.set()
            return
        colo = self._colocated.get(task.id)
        if colo is not None:
            colo._dispatched()

    def _on_peer(self, peer: int, dead: bool, why: str) -> None:
        """The daemon's liveness news (the client's reader thread): a host of the job
        declared dead ends the job's syncs now."""
        if not dead or peer == self.node.id or peer not in self.members:
            return
        self._fail(
            RankLostError(
                f"rank {self.rank}: host(s) [{peer}] of the job were declared dead ({why}); "
                "the job's syncs cannot complete"
            )
        )

    def _on_preempt(self, task: Task, slot: int, cancel: bool) -> int:
        colo = self._colocated.get(task.id)
        if colo is not None:
            return colo._preempted(task)
        # (overlap=False) the step's compute task yields its slot to the step's own bucket
        # syncs in the scheduler's books: nothing is stopped (the step's compute and its all-reduces
        # overlap); it takes the slot back when they are done, and if the step ends first,
        # compute()'s COMPLETE ends the requeued task (docs/CLIENT.md, "Preemption and
        # COMPLETE")
        return task.progress_ns

    # ---- the comm queue ------------------------------------------------------------------
    def _comm_loop(self) -> None:
        """Start the released buckets' all-reduces, in one order on every rank.

        Collectives of one process group must start in the same order on every rank, and a
        rank may see a release before another does (the last SYNC_READY reaches each rank at
        its own time). So rank 0 (the leader) chooses: the released buckets of highest
        priority, as many as `max_inflight` leaves room for, and broadcasts its choices on
        a control group, in one message; every rank then starts those buckets' all-reduces,
        in that order, once its own scheduler has released each (`_choose_and_start`). (With
        each rank choosing by itself, two ranks each waiting for the other's choice
        deadlock.)

        On one host (`one_host`) the one daemon has already put the releases in one order,
        the same on every rank's lane: each rank starts its buckets in release order, up to
        `max_inflight`, with no choice and no broadcast (docs/TORCH.md, "Order"). The sync
        handler starts a bucket itself (`_start_released`); this thread starts only those
        released while `max_inflight` collectives ran, once one ends (`_hand_off`)."""
        try:
            if self.one_host:
                self._hand_off()
            else:
                self._choose_and_start()
        except Exception as exc:  # the control broadcast failed: a rank is gone
            if not self._closed:
                err = self._lost() or TorchSyncError(
                    f"rank {self.rank}: the buckets' order could not be agreed: {exc}"
                )
                err.__cause__ = exc
                self._fail(err)

    def _hand_off(self) -> None:
        """(One host) start the buckets released while `max_inflight` collectives ran, as
        room comes back (`handoffs` counts them), until closed."""
        while True:
            with self._lock:
                while not self._closed and (
                    len(self._inflight) >= self.max_inflight or not self._ready
                ):
                    self._lock.wait()
                if self._closed:
                    return
            self.handoffs += self._start_released()

    def _choose_and_start(self) -> None:
        """(Several hosts, so several ranks) the leader's choices, broadcast; every rank starts
        them in order."""
        # [count, index, step, index, step, ...]: up to CHOICES_PER_MESSAGE choices
        choice = torch.zeros(1 + 2 * CHOICES_PER_MESSAGE, dtype=torch.int64)
        leader = self.rank == 0
        while True:
            mine: list[_Bucket] = []
            with self._lock:
                while not self._closed and (
                    len(self._inflight) >= self.max_inflight
                    or not (self._ready if leader else (self._ready or self._pending))
                ):
                    self._lock.wait()
                if self._closed:
                    return
                if leader:
                    room = min(self.max_inflight - len(self._inflight), CHOICES_PER_MESSAGE)
                    now = time.monotonic_ns()
                    while self._ready and len(mine) < room:
                        _, _, b = heapq.heappop(self._ready)
                        n = len(mine)
                        choice[1 + 2 * n], choice[2 + 2 * n] = b.index, b.step
                        self._inflight[(b.index, b.step)] = b  # failed with them by _fail
                        self.log.append(("choose", b.step, b.index, now))
                        mine.append(b)
                    choice[0] = len(mine)
            dist.broadcast(choice, src=0, group=self._ctrl)
            for k in range(int(choice[0])):
                if leader:
                    b = mine[k]
                else:
                    got = self._take_released(int(choice[1 + 2 * k]), int(choice[2 + 2 * k]))
                    if got is None:
                        return  # closed, or the job failed
                    b = got
                self.handoffs += 1
                self._start(b)

    def _start_released(self) -> int:
        """(One host) start the released buckets, in release order, while `max_inflight`
        leaves room; how many. The sync handler and the comm thread both call it: each
        bucket's pop and its start are under `_issue`, so the starts keep release order."""
        started = 0
        with self._issue:
            while True:
                with self._lock:
                    if self._closed or not self._ready or len(self._inflight) >= self.max_inflight:
                        return started
                    _, _, b = heapq.heappop(self._ready)
                    self._inflight[(b.index, b.step)] = b  # failed with them by _fail
                self._start(b)
                started += 1

    def _start(self, b: _Bucket) -> None:
        """Start bucket `b`'s all-reduce (it is in the in-flight set)."""
        with self._lock:
            if b.done:
                return
            self.log.append(("start", b.step, b.index, time.monotonic_ns()))
        try:
            work = dist.all_reduce(b.tensor, group=self._comm_pg, async_op=True)
            assert work is not None
            work.get_future().then(lambda f, b=b: self._collective_done(b, f))
        except Exception as exc:
            self._collective_failed(b, exc)

    def _take_released(self, index: int, step: int) -> _Bucket | None:
        """(A follower) bucket (index, step), which the leader chose, once this rank's
        scheduler released it, moved to the in-flight set; None if the job stopped first."""
        with self._lock:
            while True:
                if self._closed or self._error is not None:
                    return None
                for k, x in enumerate(self._ready):
                    if x[2].index == index and x[2].step == step:
                        self._ready[k] = self._ready[-1]
                        self._ready.pop()
                        heapq.heapify(self._ready)
                        self._inflight[(index, step)] = x[2]
                        return x[2]
                self._lock.wait()

    def _collective_done(self, b: _Bucket, f: torch.futures.Future[Any]) -> None:
        try:
            f.value()
        except Exception as exc:
            self._collective_failed(b, exc)
            return
        with self._lock:
            full = len(self._inflight) >= self.max_inflight
            self._inflight.pop((b.index, b.step), None)
            self.log.append(("done", b.step, b.index, time.monotonic_ns()))
            if full:  # the comm thread may be waiting for room (and for nothing else)
                self._lock.notify_all()
        self._finish(b)

    def _collective_failed(self, b: _Bucket, exc: BaseException) -> None:
        err = self._lost() or TorchSyncError(
            f"rank {self.rank}: the all-reduce of bucket {b.index} step {b.step} failed: {exc}"
        )
        err.__cause__ = exc
        self._fail(err)
        with self._lock:
            self._inflight.pop((b.index, b.step), None)
            self._lock.notify_all()
        self._finish(b, error=self._error)

    def _finish(self, b: _Bucket, error: BaseException | None = None) -> None:
        with self._lock:
            if b.done:
                return
            b.done = True
        if error is None:
            b.fut.set_result(b.tensor)
        else:
            b.fut.set_exception(error)

    # ---- bounded waits -------------------------------------------------------------------
    def _watchdog(self) -> None:
        """The bounded waits of this rank: its daemon, the processes of the other ranks on
        this machine (local reads, every 50 ms while busy), and a bucket not released in
        time. Another host's death is the daemons' to find; its news comes to `_on_peer`."""
        # its own wait, not the lock's condition: every release and every all-reduce's end
        # notifies that one, and woke this thread for nothing dozens of times a step
        period = min(WATCH_S, self.linger_s) if self.linger_s > 0 else WATCH_S
        while not self._stop.wait(period):
            self._give_back(int(self.linger_s * 1e9))
            with self._lock:
                if self._closed:
                    return
                waiting = list(self._pending.values())
                busy = bool(waiting or self._inflight or self._ready or self._compute)
            if not busy:
                continue
            err: TorchSyncError | None = self._lost()
            now = time.monotonic_ns()
            late = [b for b in waiting if now - b.reported_ns > self.sync_timeout_s * 1e9]
            if err is None and late:
                b = late[0]
                err = SyncTimeoutError(
                    f"rank {self.rank}: bucket {b.index} step {b.step} was not released within "
                    f"{self.sync_timeout_s:g} s: not every rank reported it"
                )
            if err is not None:
                self._fail(err)

    def _lost(self) -> TorchSyncError | None:
        """The daemon gone, or a rank of this machine gone (local reads, no round trip)."""
        if not self.node.healthy:
            return SchedulerGoneError(
                f"rank {self.rank}: the host's rdmasched daemon (node {self.node.id}) is gone: "
                f"{self.node.error}"
            )
        dead = [r for r, (pid, start) in self._peers.items() if not shm.alive(pid, start)]
        if dead:
            return RankLostError(
                f"rank {self.rank}: rank(s) {dead} of the job (on this host) are gone; the "
                "job's syncs cannot complete"
            )
        return None

    def _fail(self, err: TorchSyncError) -> None:
        """The job cannot go on: fail every outstanding bucket and compute wait with `err`.
        A rank or host lost (`RankLostError`) with `exit_on_lost`: exit instead, at once
        (`_exit_lost`), before any waiting thread wakes up to handle the error its own way."""
        with self._lock:
            if self._error is None:
                self._error = err
                _log.error("%s", err)
                if self.exit_on_lost and isinstance(err, RankLostError) and not self._closed:
                    _exit_lost(self.rank, err)  # does not return
            err = self._error
            buckets = [
                *self._pending.values(),
                *self._inflight.values(),
                *(b for _, _, b in self._ready),
            ]
            self._pending.clear()
            self._inflight.clear()
            self._ready.clear()
            waits = list(self._compute.values())
            self._lock.notify_all()
        for b in buckets:
            self._finish(b, error=err)
        for ev in waits:
            ev.set()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise SchedulerGoneError("this RankScheduler is closed")

    def _as_sync_error(self, exc: BaseException, what: str) -> TorchSyncError:
        if isinstance(exc, TorchSyncError):
            return exc
        err = SchedulerGoneError(f"rank {self.rank}: {what}: the host's daemon refused it: {exc}")
        err.__cause__ = exc
        return err

    @property
    def error(self) -> TorchSyncError | None:
        """The error that stopped the job's syncs, if any."""
        return self._error

    # ---- the training step's compute task --------------------------------------------------
    @contextlib.contextmanager
    def compute(self, *, cost_ns: int = 0, timeout_s: float | None = None) -> Iterator[int]:
        """Run the body as a compute task of the training job: dispatched (preempting
        lower-priority work on one of the host's slots: co-located work is frozen, or put in
        the idle class, before the body starts) and completed when the rank has been out of
        `compute()` for `linger_s` (at once with ``linger_s=0``): a step that follows within
        that time takes the same task, with no call to the daemon, so a loop of steps holds
        its slot from the first to the last. Yields the task id. If the job's syncs failed,
        the body's error (``loss.backward()`` raising) becomes the `TorchSyncError` that
        says why."""
        self._check()
        with self._lock:
            held, self._held = self._held, None
        tid = held[0] if held is not None else self._acquire(cost_ns, timeout_s)
        ok = False
        try:
            self._check()
            try:
                yield tid
                ok = True
            except Exception as exc:
                # DDP reports a failed hook future as a RuntimeError that names the error's
                # text only ("Unable to cast ... to Tensor"): raise the typed error instead
                if self._error is not None and exc is not self._error:
                    raise self._error from exc
                raise
        finally:
            with self._lock:
                self._compute.pop(tid, None)
                if ok and self.linger_s > 0 and not self._closed and self._error is None:
                    self._held = (tid, time.monotonic_ns())  # given back by the watchdog
                    tid = -1
            if tid >= 0 and self._error is None:
                self.node.complete(tid)

    def _acquire(self, cost_ns: int, timeout_s: float | None) -> int:
        """Dispatch a compute task of the training job and wait until it runs; its id."""
        tid = self._new_id()
        ev = threading.Event()
        with self._lock:
            self._compute[tid] = ev
        try:
            self.node.dispatch(tid, job=self.job, priority=self.compute_priority, cost_ns=cost_ns)
        except Exception as exc:
            with self._lock:
                self._compute.pop(tid, None)
            err = self._as_sync_error(exc, "the step's compute task")
            self._fail(err)
            raise err from exc
        limit = self.sync_timeout_s if timeout_s is None else timeout_s
        if not ev.wait(limit):
            err = SyncTimeoutError(
                f"rank {self.rank}: the step's compute task was not dispatched within {limit:g} s"
            )
            self._fail(err)
        return tid

    def _give_back(self, idle_ns: int) -> None:
        """Complete the held compute task if the rank has been out of `compute()` for
        `idle_ns` (0: whatever the time)."""
        with self._lock:
            held = self._held
            if held is None or time.monotonic_ns() - held[1] < idle_ns:
                return
            self._held = None
        if self._error is None:
            with contextlib.suppress(RdmaschedError):
                self.node.complete(held[0])

    def _new_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def close(self) -> None:
        """Stop the comm and watchdog threads (outstanding buckets fail). Safe twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        self._stop.set()
        self._give_back(0)
        if self._pending or self._inflight or self._ready:
            self._fail(SchedulerGoneError("the RankScheduler was closed with syncs outstanding"))
        self._comm.join(5)
        self._watch.join(5)

    def __enter__(self) -> RankScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# DDP checks the hook's annotations against the classes themselves (this module's are strings)
RankScheduler.hook.__annotations__.update(
    state=object, bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]}
)


class Colocated:
    """Co-located low-priority work under `sched`: its processes run while its task holds
    one of the host's slots and are frozen (for real: `Freezer`) while it is preempted.

    ``Colocated(sched).add(pid).start()``: `start` freezes the processes added, then
    dispatches the task; the scheduler's dispatch thaws them (at once if the slot is free).
    `freezer`: a `Freezer` to use (default: a new one, `mechanism`, with ``kill=True``).
    Freeze and thaw latencies are kept in `freeze_ns` and `thaw_ns`; `mechanism` says which
    was used.

    The work lives as long as the run: `close()` kills its processes (their children too)
    and removes its cgroup, and if this rank dies first (killed, a crash, the launcher's
    SIGTERM) the freezer's reaper does (`Freezer(kill=True)`), so a failed run leaves none
    of its co-located processes behind. (A `freezer` of your own without ``kill`` releases
    them running instead, and only when it is closed.)
    """

    def __init__(
        self,
        sched: RankScheduler,
        *,
        priority: int = COLOCATED_PRIORITY,
        job: int = 2,
        freezer: Freezer | None = None,
        mechanism: str = "auto",
        preempt: str = "freeze",
    ) -> None:
        if not 0 <= priority <= COMPUTE_PRIORITY_MAX:
            raise ArgumentError(f"priority must be 0..{COMPUTE_PRIORITY_MAX}, not {priority!r}")
        if preempt not in PREEMPT_MODES:
            raise ArgumentError(f"preempt must be one of {PREEMPT_MODES}, not {preempt!r}")
        #: what a preemption does: "freeze" (stopped) or "idle" (the kernel's idle class)
        self.preempt = preempt
        #: each demoted thread's own policy and priority, restored on dispatch ("idle")
        self._policies: dict[int, tuple[int, int]] = {}
        #: the nice of each of the work's own autogroups, restored on dispatch ("idle")
        self._group_nice: dict[str, int] = {}
        self.sched = sched
        self.priority = priority
        self.job = job
        self.freezer = freezer if freezer is not None else Freezer(mechanism, kill=True)
        self.task_id = sched._new_id()
        self.freeze_ns: list[int] = []
        self.thaw_ns: list[int] = []
        self.errors: list[str] = []
        self.running = False
        self._ran_ns = 0
        self._since = 0
        self._started = False
        self._ran = False  # dispatched at least once

    @property
    def mechanism(self) -> str:
        """``"cgroup"`` or ``"signal"``: how the processes are frozen."""
        return self.freezer.mechanism

    def add(self, pid: int) -> Colocated:
        """Hold process `pid` and its children."""
        self.freezer.add(pid)
        return self

    def start(self) -> Colocated:
        """Freeze the work, and dispatch its task: it runs when the scheduler says so."""
        if self._started:
            return self
        if self.preempt == "idle":
            self._set_idle(True)
        else:
            self.freezer.freeze()
        self.sched._colocated[self.task_id] = self
        self._started = True
        self.sched.node.dispatch(self.task_id, job=self.job, priority=self.priority)
        return self

    def _dispatched(self) -> None:
        self._ran = True
        t0 = time.perf_counter_ns()
        try:
            if self.preempt == "idle":
                self._set_idle(False)
            else:
                self.freezer.thaw()
        except Exception as exc:  # counted, reported; the scheduler goes on
            self.errors.append(f"thaw: {exc}")
            raise
        self.thaw_ns.append(time.perf_counter_ns() - t0)
        self.running = True
        self._since = time.monotonic_ns()

    def _preempted(self, task: Task) -> int:
        t0 = time.perf_counter_ns()
        try:
            if self.preempt == "idle":
                self._set_idle(True)
            else:
                self.freezer.freeze()
        except Exception as exc:
            self.errors.append(f"freeze: {exc}")
            raise
        self.freeze_ns.append(time.perf_counter_ns() - t0)
        if self.running:
            self._ran_ns += time.monotonic_ns() - self._since
        self.running = False
        return self._ran_ns

    def _set_idle(self, idle: bool) -> None:
        """Every thread of the work into the kernel's idle class (SCHED_IDLE: it runs only
        on a CPU that nothing else wants, and a waking thread of any other class takes the
        CPU from it at once), or back to its own policy. Children forked meanwhile inherit
        the idle class and go back to SCHED_OTHER.

        The idle class ranks a thread within its task group only: with the kernel's
        autogroups (a task group per session, ``kernel.sched_autogroup_enabled``), work
        started in a session of its own competes with the rank's session as an equal
        whatever its threads' class (seen: the idle-class job took as much CPU as the
        ranks). So the work's own autogroups (not the rank's) get nice 19 too, and their
        own nice back on dispatch."""
        mine = _autogroup(os.getpid())
        groups: dict[str, int] = {}  # the work's autogroups: name -> a member
        for pid in self.freezer.pids():
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue  # gone
            group = _autogroup(pid)
            if group is not None and group[0] != (mine[0] if mine else None):
                groups.setdefault(group[0], pid)
            for tid in tids:
                try:
                    if idle:
                        if tid not in self._policies:
                            own = os.sched_getscheduler(tid)
                            prio = os.sched_getparam(tid).sched_priority
                            if own == os.SCHED_IDLE:  # born idle: a child forked while idle
                                own, prio = os.SCHED_OTHER, 0
                            self._policies[tid] = (own, prio)
                        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                    else:
                        own, prio = self._policies.get(tid, (os.SCHED_OTHER, 0))
                        os.sched_setscheduler(tid, own, os.sched_param(prio))
                except ProcessLookupError:
                    self._policies.pop(tid, None)  # the thread ended
        for name, pid in groups.items():
            if idle:
                now = _autogroup(pid)
                if now is not None and name not in self._group_nice:
                    self._group_nice[name] = now[1]
            nice = IDLE_GROUP_NICE if idle else self._group_nice.get(name, 0)
            try:
                with open(f"/proc/{pid}/autogroup", "w") as f:
                    f.write(str(nice))
            except OSError:
                pass  # gone, or no autogroups: the threads' class is all there is

    def close(self) -> None:
        """Complete the task (cancel it if it never ran) and end the work: its freezer's
        close (the default one kills the processes and removes the cgroup)."""
        if self._started and self.sched.error is None:
            with contextlib.suppress(RdmaschedError):
                if self._ran:
                    self.sched.node.complete(self.task_id)
                else:  # queued, never started: the daemon refuses a COMPLETE of it
                    self.sched.node.preempt(self.task_id, cancel=True)
        self.sched._colocated.pop(self.task_id, None)
        self.freezer.close()

    def __enter__(self) -> Colocated:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def host_client(
    *,
    start_daemon: bool = True,
    strict: bool = True,
    env: dict[str, str] | None = None,
    **kw: Any,
) -> Client:
    """This rank's `Client` of its host's daemon, from the launcher's variables
    (`Client.from_env`, docs/CLIENT.md): client LOCAL_RANK of `<cluster>.<host>`. Open it
    (``with host_client() as client:``) before making the `RankScheduler`.

    `start_daemon` (default): on local rank 0, if no daemon serves this host yet, start one
    (`rdmasched daemon --exit-when-idle`, a child process that exits once the ranks have
    left); the other ranks wait for it (`connect_timeout_s`, default 30 s). Without it, run
    `rdmasched daemon` on each host yourself, before the ranks.

    `strict` (default): a daemon started here runs strict priorities: no aging, no
    starvation cap (``RDMASCHED_STARVATION_US=off``, ``RDMASCHED_AGING_US=off`` unless
    set). The co-located work then gets a slot only when the training job leaves it free.
    With the scheduler's defaults (a 1 s cap, aging) a co-located task that waited would take
    the slot the moment a bucket sync freed it, from the step's own compute task, and keep
    it: the step would wait for the co-located work, the inversion this integration is there
    to prevent. A daemon you start yourself: ``rdmasched daemon --starvation-us off
    --aging-us off``.

    On a host whose every CPU runs a rank (LOCAL_WORLD_SIZE at least the CPUs this process
    may use), the ranks' readers and a daemon started here sleep at once after a message
    (``RDMASCHED_SPIN_US=0`` unless set): their spinning took its CPU from the ranks.
    ``RDMASCHED_SLICE_US`` (unset by default) makes the control path's threads ask for a
    shorter EEVDF slice (docs/TORCH.md, "The slice": no step gain measured here)."""
    from rdmasched.client import Client

    env = dict(os.environ if env is None else env)
    if _no_spare_cpu(env):
        # every CPU of the host runs a rank: a reader spinning after each message (the
        # daemon's, each rank's) takes its time from the ranks; sleep at once instead
        env.setdefault("RDMASCHED_SPIN_US", "0")
    if strict:
        env.setdefault("RDMASCHED_STARVATION_US", "off")
        env.setdefault("RDMASCHED_AGING_US", "off")
    return Client.from_env(env, start_daemon=start_daemon, **kw)


def _autogroup(pid: int) -> tuple[str, int] | None:
    """The autogroup of process `pid` and its nice (``/proc/PID/autogroup``: "/autogroup-N
    nice K"), or None (gone, or a kernel without autogroups)."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            name, _, nice = f.read().split()
        return name, int(nice)
    except (OSError, ValueError):
        return None


def _no_spare_cpu(env: dict[str, str]) -> bool:
    """Whether the host's ranks (LOCAL_WORLD_SIZE) are as many as the CPUs this process may
    run on."""
    try:
        ranks = int(env.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        return False  # Client.from_env says what is wrong with it
    return ranks >= len(os.sched_getaffinity(0))


def _exit_lost(rank: int, err: TorchSyncError) -> None:
    """End this rank's process with `EXIT_LOST`: one line on stderr, the process groups
    aborted (every group of the job, in one NCCL group call on NCCL:
    ``ProcessGroupNCCL.abort``; gloo's abort returns at once and leaves a collective waiting
    for a hung peer waiting), waiting at most `ABORT_TIMEOUT_S` for that, then ``os._exit``:
    no atexit handler, no destructor waits on a collective that cannot end."""
    import sys

    with contextlib.suppress(Exception):
        sys.stderr.write(f"rdmasched: {err}; rank {rank} exits with {EXIT_LOST}\n")
        sys.stderr.flush()
    with contextlib.suppress(Exception):
        for h in logging.getLogger().handlers:
            h.flush()
    aborter = threading.Thread(target=_abort_groups, name="rdmasched-abort", daemon=True)
    aborter.start()
    aborter.join(ABORT_TIMEOUT_S)
    os._exit(EXIT_LOST)


def _abort_groups() -> None:
    """Abort every process group of this process (best effort: a failure changes nothing,
    the process exits next)."""
    with contextlib.suppress(Exception):
        if dist.is_available() and dist.is_initialized():
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            if abort is not None:  # torch 2.13 has it: every group, NCCL's in one group call
                abort()
            else:
                dist.group.WORLD.abort()


def _process_start() -> int:
    start = shm.process_start(os.getpid())
    assert start is not None
    return start


def _boot_id() -> int:
    """This machine's boot (63 bits of /proc/sys/kernel/random/boot_id): ranks that share
    it can watch each other's processes."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            text = f.read().strip().replace("-", "")
        return int(text[:15], 16)
    except (OSError, ValueError):
        return -1


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)


__all__ = [
    "COLOCATED_PRIORITY",
    "COMPUTE_PRIORITY",
    "EXIT_LOST",
    "GROUP_BASE",
    "PREEMPT_MODES",
    "Colocated",
    "RankLostError",
    "RankScheduler",
    "SchedulerClient",
    "SchedulerGoneError",
    "SyncTimeoutError",
    "TorchSyncError",
    "host_client",
]
