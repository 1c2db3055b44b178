"""A multi-job cluster: training jobs arriving as gangs of whole nodes (docs/SIM.md,
"Multi-job cluster").

Jobs arrive (a Poisson mix, `poisson_mix`, or a CSV file, `load_jobs`), each a gang of
whole nodes running training steps, under one of two schedulers:

- **rdmasched**: a job's members are one gang, submitted on one node (its coordinator) and
  placed whole by the node cores' gang mechanism (rdmasched/scheduler/gang.py: reserve a
  free slot on each node, commit when every reservation is held; docs/GANGS.md). A
  high-priority job that does not fit preempts lower-priority ones: the launcher picks the
  victims among the running jobs in its coordinator's reach and cancels their gangs
  (`preempt(job=J, cancel=True)` on their coordinators); each node's core then stops its
  member (the gang's ABORT, the preempt handler with `cancel`). A preempted job loses the
  steps since its last checkpoint and is submitted again as a new gang once its preemptor
  runs. A waiting gang whose leaf has no room while another leaf has is cancelled and
  submitted there (`_rehome`).
- **exclusive**: what Slurm does with whole-node jobs (`EasyBackfill`, a small model of
  slurmctld's queue): a priority-ordered FIFO queue with EASY backfill; a job starts only
  when its whole gang fits, runs on its nodes to the end, and is never preempted. Its
  members are dispatched onto the chosen nodes' cores (the in-node decision stays the
  core's), in one priority.

A node is one execution slot standing for the whole node (its GPUs): a job takes whole
nodes, and nothing is co-located. The job-level model keeps one event per job run (its
end); a run's progress at any time is its elapsed time over its step time.
"""

from __future__ import annotations

import bisect
import csv
import heapq
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from rdmasched.errors import ArgumentError
from rdmasched.scheduler import Task
from rdmasched.sim.drivers import FIFO_PRIORITY, CoreNode, Ledger, make_core
from rdmasched.sim.engine import Engine, Network
from rdmasched.topology import Topology

if TYPE_CHECKING:
    from rdmasched.sim.run import SimConfig

#: the schedulers that run the multi-job workload
JOB_SCHEDULERS = ("rdmasched", "exclusive")
#: priority classes of a job, and the task priority of its members under rdmasched
LOW, HIGH = 0, 1
TASK_PRIORITY = {LOW: 100, HIGH: 200}
CLASS_NAMES = {LOW: "low", HIGH: "high"}
#: size classes of the figures: (name, fewest nodes, most nodes)
SIZE_CLASSES = (("1-2", 1, 2), ("3-8", 3, 8), ("9+", 9, 1 << 30))
#: the Poisson mix's job sizes (nodes) and their shares: an assumption of this model, not a
#: trace's figures (docs/SIM.md, "Multi-job cluster")
SIZE_MIX = ((1, 0.45), (2, 0.20), (4, 0.15), (8, 0.12), (16, 0.06), (32, 0.02))
#: task ids: job << 20 | incarnation << 12 | member
_INC_BITS, _MEMBER_BITS = 8, 12
MEMBERS_MAX = 1 << _MEMBER_BITS
INCARNATIONS_MAX = 1 << _INC_BITS
JOBS_MAX = 1 << 24
S = 1_000_000_000


@dataclass(frozen=True)
class Job:
    """One training job: `nodes` whole nodes for `steps` steps of `step_ns` each."""

    id: int
    arrival_ns: int
    nodes: int
    steps: int
    step_ns: int
    priority: int = LOW

    @property
    def work_ns(self) -> int:
        return self.steps * self.step_ns


class JobSource(Protocol):
    """Jobs made for the cluster's size at run time from a trace (rdmasched/sim/philly.py's
    `PhillyReplay`)."""

    def check(self) -> None: ...
    def jobs(self, nodes: int, max_nodes: int) -> list[Job]: ...
    def describe(self, nodes: int) -> dict[str, Any]: ...
    def as_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class JobsConfig:
    """The multi-job workload: a file's jobs (`jobs`), a trace's replayed for the cluster's
    size at run time (`replay`), or a Poisson mix made for it (`count` jobs at offered
    `load`)."""

    jobs: tuple[Job, ...] = ()
    replay: JobSource | None = None
    source: str = "poisson"
    count: int = 200
    load: float = 0.9
    high: float = 0.2
    step_ms: float = 100.0
    median_steps: int = 300
    sigma: float = 1.0
    #: a preempted job keeps its steps up to its last checkpoint, every this many steps
    checkpoint_steps: int = 50

    def check(self) -> None:
        if self.replay is not None:
            self.replay.check()
        if not self.jobs and self.count < 1:
            raise ArgumentError(f"--jobs-count must be >= 1, not {self.count}")
        if not (math.isfinite(self.load) and self.load > 0):
            raise ArgumentError(f"--jobs-load must be > 0, not {self.load}")
        if not 0 <= self.high <= 1:
            raise ArgumentError(f"--jobs-high must be a fraction in [0, 1], not {self.high}")
        if not (math.isfinite(self.step_ms) and self.step_ms > 0):
            raise ArgumentError(f"--jobs-step-ms must be > 0, not {self.step_ms}")
        if self.median_steps < 1 or self.checkpoint_steps < 1:
            raise ArgumentError("--jobs-steps and --jobs-checkpoint-steps must be >= 1")

    def mix(self, nodes: int, max_nodes: int, seed: int) -> list[Job]:
        """The jobs of a run on `nodes` nodes (a job larger than `max_nodes` is refused)."""
        if self.jobs:
            big = [j for j in self.jobs if j.nodes > min(nodes, max_nodes)]
            if big:
                raise ArgumentError(
                    f"job {big[0].id} takes {big[0].nodes} nodes; at most {min(nodes, max_nodes)}"
                    f" here (the cluster's nodes, and one leaf: a gang reaches its "
                    f"coordinator's links only)"
                )
            return list(self.jobs)
        if self.replay is not None:
            return self.replay.jobs(nodes, min(nodes, max_nodes))
        return poisson_mix(self, nodes, min(nodes, max_nodes), seed)

    def as_dict(self) -> dict[str, Any]:
        if self.replay is not None:
            return self.replay.as_dict() | {"checkpoint_steps": self.checkpoint_steps}
        if self.jobs:
            return {
                "source": self.source,
                "jobs": len(self.jobs),
                "checkpoint_steps": self.checkpoint_steps,
            }
        return {
            "source": "poisson",
            "count": self.count,
            "load": self.load,
            "high": self.high,
            "step_ms": self.step_ms,
            "median_steps": self.median_steps,
            "sigma": self.sigma,
            "checkpoint_steps": self.checkpoint_steps,
            "size_mix": [list(x) for x in SIZE_MIX],
        }


def poisson_mix(cfg: JobsConfig, nodes: int, max_nodes: int, seed: int) -> list[Job]:
    """`cfg.count` jobs arriving as a Poisson process whose rate offers `cfg.load` of the
    cluster's node-time: sizes from SIZE_MIX (at most `max_nodes`), steps lognormal
    (median `median_steps`, shape `sigma`, within [median/10, 5 x median]), a fraction
    `high` of high priority."""
    rng = random.Random(seed)
    sizes = [s for s, _ in SIZE_MIX if s <= max_nodes] or [1]
    weights = [w for s, w in SIZE_MIX if s <= max_nodes] or [1.0]
    lo, hi = max(1, cfg.median_steps // 10), 5 * cfg.median_steps
    step_ns = int(cfg.step_ms * 1e6)
    drawn = []
    for _ in range(cfg.count):
        size = rng.choices(sizes, weights)[0]
        steps = int(min(hi, max(lo, cfg.median_steps * rng.lognormvariate(0, cfg.sigma))))
        drawn.append((size, steps, HIGH if rng.random() < cfg.high else LOW))
    node_ns = sum(s * st * step_ns for s, st, _ in drawn) / len(drawn)
    rate = cfg.load * nodes / node_ns  # jobs per ns
    t = 0.0
    out = []
    for i, (size, steps, prio) in enumerate(drawn):
        out.append(Job(i + 1, int(t), size, steps, step_ns, prio))
        t += rng.expovariate(rate)
    return out


def load_jobs(path: str, checkpoint_steps: int = 50) -> JobsConfig:
    """Jobs from a CSV file with the columns `arrival_s,nodes,duration_s,step_ms,priority`
    (priority `high` or `low`; one job a line, a header first), e.g. a public trace
    converted to it. Bad input: an ArgumentError naming the line."""
    jobs: list[Job] = []
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ArgumentError(f"--jobs {path}: {exc}") from None
    need = ("arrival_s", "nodes", "duration_s", "step_ms", "priority")
    for n, row in enumerate(rows, 2):
        try:
            arrival, size = float(row["arrival_s"]), int(row["nodes"])
            duration, step_ms = float(row["duration_s"]), float(row["step_ms"])
            prio = {"low": LOW, "high": HIGH}[row["priority"].strip().lower()]
        except (KeyError, ValueError, TypeError, AttributeError):
            raise ArgumentError(
                f"--jobs {path} line {n}: need the columns {','.join(need)} "
                "(numbers; priority high or low)"
            ) from None
        if not (0 <= arrival < 1e9 and 1 <= size <= MEMBERS_MAX and 0 < step_ms <= duration * 1e3):
            raise ArgumentError(
                f"--jobs {path} line {n}: arrival >= 0 s, 1..{MEMBERS_MAX} nodes, "
                "0 < step <= duration"
            )
        step_ns = round(step_ms * 1e6)
        jobs.append(
            Job(
                n - 1,
                round(arrival * S),
                size,
                max(1, round(duration * S / step_ns)),
                step_ns,
                prio,
            )
        )
    if not jobs:
        raise ArgumentError(f"--jobs {path}: no jobs")
    if len(jobs) >= JOBS_MAX:
        raise ArgumentError(f"--jobs {path}: at most {JOBS_MAX - 1} jobs")
    jobs.sort(key=lambda j: (j.arrival_ns, j.id))
    return JobsConfig(jobs=tuple(jobs), source=path, checkpoint_steps=checkpoint_steps)


def write_jobs(jobs: Iterable[Job], out: TextIO) -> None:
    """`jobs` as the CSV `load_jobs` reads (a header line first): the converters' output."""
    w = csv.writer(out, lineterminator="\n")
    w.writerow(("arrival_s", "nodes", "duration_s", "step_ms", "priority"))
    for j in jobs:
        w.writerow(
            (
                repr(j.arrival_ns / S),
                j.nodes,
                repr(j.work_ns / S),
                repr(j.step_ns / 1e6),
                CLASS_NAMES[j.priority],
            )
        )


# ---- exclusive: a model of slurmctld's queue --------------------------------------------------
class EasyBackfill:
    """Whole-node jobs under FIFO with EASY backfill, as Slurm's sched/backfill does it for
    whole-node (`--exclusive`) jobs: the queue in priority order (priority class, then
    arrival); the jobs at its head start while they fit; the first that does not gets a
    reservation at the earliest time enough running jobs have ended (their time limits:
    here their true remaining run time); a later job starts now only if it fits the free
    nodes and either ends before that reservation or uses only nodes the reservation does
    not need. No preemption. Pure: `submit`, `finish`, `schedule(now)` return the starts."""

    def __init__(self, nodes: int) -> None:
        self.free = list(range(nodes))  # a heap: the lowest-numbered free nodes first
        self.nfree = nodes
        self.queue: list[Job] = []
        #: job id -> (its expected end, its nodes)
        self.running: dict[int, tuple[int, list[int]]] = {}
        self.backfilled = 0

    def submit(self, job: Job) -> None:
        bisect.insort(self.queue, job, key=_queue_order)

    def finish(self, job_id: int) -> None:
        _, nodes = self.running.pop(job_id)
        for n in nodes:
            heapq.heappush(self.free, n)
        self.nfree += len(nodes)

    def _start(self, job: Job, end_ns: int) -> tuple[Job, list[int]]:
        nodes = [heapq.heappop(self.free) for _ in range(job.nodes)]
        self.nfree -= job.nodes
        self.running[job.id] = (end_ns, nodes)
        return job, nodes

    def schedule(self, now: int, remaining: Callable[[Job], int]) -> list[tuple[Job, list[int]]]:
        """Start what may start now; `remaining(job)`: its run time from a start now."""
        out = []
        q = self.queue
        while q and q[0].nodes <= self.nfree:
            job = q.pop(0)
            out.append(self._start(job, now + remaining(job)))
        if not q or not self.nfree:  # (nothing fits no free node: no backfill to look for)
            return out
        head = q[0]
        # the head's reservation: the shadow time, and the nodes spare then
        avail = self.nfree
        shadow = now
        for end, nodes in sorted(self.running.values(), key=lambda r: r[0]):
            if avail >= head.nodes:
                break
            avail += len(nodes)
            shadow = end
        extra = avail - head.nodes
        i = 1
        while i < len(q):
            job = q[i]
            if job.nodes <= self.nfree:
                end = now + remaining(job)
                if end <= shadow or job.nodes <= extra:
                    if end > shadow:
                        extra -= job.nodes
                    q.pop(i)
                    out.append(self._start(job, end))
                    self.backfilled += 1
                    continue
            i += 1
        return out


def _queue_order(j: Job) -> tuple[int, int, int]:
    return (-j.priority, j.arrival_ns, j.id)


# ---- the cluster -------------------------------------------------------------------------------
class _Run:
    """One incarnation of a job: its gang (rdmasched) or its nodes (exclusive)."""

    __slots__ = (
        "coord",
        "core_job",
        "ended",
        "inc",
        "job",
        "preempted",
        "started",
        "t_first",
        "t_start",
        "tasks",
        "victims",
        "waiting",
        "where",
    )

    def __init__(self, job: Job, inc: int, coord: int) -> None:
        self.job = job
        self.inc = inc
        self.coord = coord
        self.core_job = (job.id << _INC_BITS) | inc
        self.tasks: list[Task] = []
        self.where: dict[int, int] = {}  # task id -> the node it runs on
        self.started = 0
        self.t_first = -1
        self.t_start = -1  # every member running
        self.ended = False
        self.preempted = False
        self.victims: list[_Run] = []
        self.waiting = False  # counted in JobCluster.waiting_on[coord]


@dataclass
class _JobState:
    job: Job
    left: int  # steps not yet done (and checkpointed)
    first_start: int = -1
    end: int = -1
    preemptions: int = 0
    lost_steps: int = 0
    runs: int = 0
    current: _Run | None = None
    spreads: list[int] = field(default_factory=list)


class _Agent:
    """A node's dispatch and preempt handlers (what CoreNode calls a trainer's)."""

    __slots__ = ("cluster", "node")

    def __init__(self, cluster: JobCluster, node: int) -> None:
        self.cluster = cluster
        self.node = node

    def on_start(self, task: Task, slot: int) -> None:
        self.cluster.member_started(self.node, task)

    def on_preempt(self, task: Task, slot: int, cancel: bool) -> int:
        self.cluster.member_stopped(self.node, task)
        return 0


class JobCluster:
    """N node cores (one slot each: a whole node) and the jobs of one run."""

    def __init__(self, cfg: SimConfig) -> None:
        jobs_cfg = cfg.jobs
        assert jobs_cfg is not None
        if cfg.scheduler not in JOB_SCHEDULERS:
            raise ArgumentError(
                f"the multi-job workload runs under {' or '.join(JOB_SCHEDULERS)}, "
                f"not {cfg.scheduler}"
            )
        self.cfg = cfg
        self.exclusive = cfg.scheduler == "exclusive"
        n = cfg.nodes
        leaf = min(cfg.leaf, n)
        pod = max(leaf, cfg.pod - cfg.pod % leaf)
        self.topo = Topology.generate(n, leaf=leaf, pod=pod)
        self.leaf_size = leaf
        self.jobs = jobs_cfg.mix(n, leaf, cfg.seed)
        self.replay = jobs_cfg.replay
        self.ckpt = jobs_cfg.checkpoint_steps
        self.engine = Engine()
        self.net = Network(self.engine, cfg.links, self.topo)
        self.ledger = Ledger(n)
        self.hb_ns = cfg.heartbeat_ms * 1_000_000
        t0 = time.process_time()
        self.nodes: list[CoreNode] = []
        for i in range(n):
            known = {j: self.topo.domain(j) for j in (i, *self.topo.neighbours(i))}
            core = make_core(
                i,
                known,
                slots=1,
                now=0,
                heartbeat_ns=self.hb_ns,
                dead_after_ns=cfg.dead_after_ms * 1_000_000,
                sync_cost_ns=0,
                topology=self.topo,
                seed=cfg.seed,
            )
            node = CoreNode(self.engine, self.net, i, core, cfg.links.cpu_ns, self.ledger)
            node.trainer = _Agent(self, i)
            self.nodes.append(node)
        self.net.lanes = {node.me: node.core.links for node in self.nodes}
        for node in self.nodes:
            node.do(node.core.open(0))
        self.build_cpu_s = time.process_time() - t0
        self.state = {j.id: _JobState(j, j.steps) for j in self.jobs}
        self.by_task: dict[int, _Run] = {}
        #: node -> the run whose member runs there (None: idle)
        self.busy: list[_Run | None] = [None] * n
        self.since = [0] * n
        self.busy_ns = 0
        #: busy node-time before the last arrival (`window_ns`): the offered-load window
        self.busy_window_ns = 0
        self.window_ns = max(j.arrival_ns for j in self.jobs)
        self.leaf_of = [self.topo.leaf(i) for i in range(n)]
        nleaves = max(self.leaf_of) + 1
        self.idle_in_leaf = [0] * nleaves
        self.low_in_leaf = [0] * nleaves  # nodes running a low-priority member
        for i in range(n):
            self.idle_in_leaf[self.leaf_of[i]] += 1
        self.queue = EasyBackfill(n) if self.exclusive else None
        self.done = 0
        self.last_event = 0
        self.preemptions = 0
        self.overlaps = 0  # a member started on a busy node (must stay 0)
        self.partial = 0  # a run whose members did not all start before it stopped
        self.rehomed = 0  # waiting gangs cancelled and submitted on a leaf with room
        #: rdmasched: the gangs waiting on each node (submitted there, no member started),
        #: and the nodes they need, per leaf
        self.waiting_on = [0] * n
        self.claimed_in_leaf = [0] * nleaves
        self._begun = False

    # ---- bookkeeping of the nodes -----------------------------------------------------------
    def _occupy(self, node: int, run: _Run) -> None:
        if self.busy[node] is not None:
            self.overlaps += 1
        self.busy[node] = run
        self.since[node] = self.engine.now
        leaf = self.leaf_of[node]
        self.idle_in_leaf[leaf] -= 1
        if run.job.priority == LOW:
            self.low_in_leaf[leaf] += 1

    def _vacate(self, node: int) -> None:
        run = self.busy[node]
        if run is None:
            return
        self.busy[node] = None
        now = self.engine.now
        self.busy_ns += now - self.since[node]
        self.busy_window_ns += max(0, min(now, self.window_ns) - self.since[node])
        leaf = self.leaf_of[node]
        self.idle_in_leaf[leaf] += 1
        if run.job.priority == LOW:
            self.low_in_leaf[leaf] -= 1

    # ---- handlers --------------------------------------------------------------------------
    def member_started(self, node: int, task: Task) -> None:
        run = self.by_task[task.id]
        now = self.engine.now
        self._occupy(node, run)
        run.where[task.id] = node
        run.started += 1
        if run.t_first < 0:
            run.t_first = now
            self._unwait(run)
        if run.started < run.job.nodes:
            return
        run.t_start = now
        self.last_event = now
        st = self.state[run.job.id]
        st.spreads.append(now - run.t_first)
        if st.first_start < 0:
            st.first_start = now
        self.engine.at(now + st.left * run.job.step_ns, self._end, run)
        for v in run.victims:  # preempted for this one: back in the queue
            if self.state[v.job.id].end < 0:
                self._submit(v.job.id)
        run.victims.clear()

    def member_stopped(self, node: int, task: Task) -> None:
        run = self.by_task.pop(task.id, None)
        if run is None:
            return
        self._vacate(node)
        if not run.preempted:  # (not one this module cancelled: not expected)
            self._stop(run)

    def _stop(self, run: _Run) -> None:
        """`run` is preempted now: its steps since its last checkpoint are lost."""
        run.preempted = True
        st = self.state[run.job.id]
        now = self.engine.now
        if run.t_start < 0:
            self.partial += 1
            return
        done = min(st.left, (now - run.t_start) // run.job.step_ns)
        kept = done // self.ckpt * self.ckpt
        st.left -= kept
        st.lost_steps += done - kept
        st.preemptions += 1
        self.preemptions += 1
        self.last_event = now

    def _end(self, run: _Run) -> None:
        if run.preempted or run.ended:
            return
        run.ended = True
        now = self.engine.now
        st = self.state[run.job.id]
        st.left = 0
        st.end = now
        st.current = None
        self.done += 1
        self.last_event = now
        runtime = now - run.t_start
        for t in run.tasks:
            node = run.where[t.id]
            self.by_task.pop(t.id, None)
            self._vacate(node)
            cn = self.nodes[node]
            cn.do(cn.core.complete(t.id, t.origin, runtime, now))
        q = self.queue
        if q is not None:
            q.finish(run.job.id)
            self._schedule()

    # ---- arrivals ---------------------------------------------------------------------------
    def _arrive(self, job_id: int) -> None:
        if self.queue is not None:
            self.queue.submit(self.state[job_id].job)
            self._schedule()
        else:
            self._submit(job_id)

    def _schedule(self) -> None:
        """exclusive: what slurmctld starts now; each member dispatched onto its node."""
        q = self.queue
        assert q is not None
        now = self.engine.now
        for job, nodes in q.schedule(now, self._remaining):
            st = self.state[job.id]
            run = self._new_run(st, nodes[0])
            for m, node in enumerate(nodes):
                t = self._member(run, m, FIFO_PRIORITY, node)
                cn = self.nodes[node]
                cn.do(cn.core.dispatch(t, now))

    def _remaining(self, job: Job) -> int:
        return self.state[job.id].left * job.step_ns

    def _new_run(self, st: _JobState, coord: int) -> _Run:
        if st.runs >= INCARNATIONS_MAX:
            raise ArgumentError(f"job {st.job.id} was preempted {st.runs} times")
        run = _Run(st.job, st.runs, coord)
        st.runs += 1
        st.current = run
        return run

    def _member(self, run: _Run, m: int, priority: int, origin: int) -> Task:
        tid = (run.job.id << (_INC_BITS + _MEMBER_BITS)) | (run.inc << _MEMBER_BITS) | m
        cost = self.state[run.job.id].left * run.job.step_ns
        t = Task(tid, run.core_job, priority, cost, origin=origin)
        run.tasks.append(t)
        self.by_task[tid] = run
        return t

    def _submit(self, job_id: int) -> None:
        """rdmasched: the job's gang submitted on its coordinator (the node the launcher
        picks: an idle node of the leaf with the most idle nodes; for a high-priority job,
        of the most idle or low-priority nodes)."""
        st = self.state[job_id]
        job = st.job
        coord = self._coordinator(job.priority == HIGH)
        run = self._new_run(st, coord)
        run.waiting = True
        self.waiting_on[coord] += 1
        self.claimed_in_leaf[self.leaf_of[coord]] += job.nodes
        cn = self.nodes[coord]
        prio = TASK_PRIORITY[job.priority]
        for m in range(job.nodes):
            cn.submit_gang(self._member(run, m, prio, coord), job.nodes)
        if job.priority == HIGH:
            self._press(run)
        else:
            self.engine.at(self.engine.now + 2 * self.hb_ns, self._rehome, run)

    def _rehome(self, run: _Run) -> None:
        """A waiting gang whose coordinator's leaf has too few idle nodes while another
        leaf has enough is cancelled (nothing of it is held or runs) and submitted there;
        looked at every two heartbeats while it waits."""
        st = self.state[run.job.id]
        if run.t_first >= 0 or run.preempted or st.current is not run:
            return
        idle = self.idle_in_leaf
        here = self.leaf_of[run.coord]
        best = max(range(len(idle)), key=lambda x: (idle[x], -x))
        if idle[here] < run.job.nodes <= idle[best] and st.runs < INCARNATIONS_MAX - 1:
            run.preempted = True
            self._unwait(run)
            self.rehomed += 1
            cn = self.nodes[run.coord]
            cn.do(cn.core.preempt(None, run.core_job, True, self.engine.now))
            for t in run.tasks:
                self.by_task.pop(t.id, None)
            self._submit(run.job.id)
            return
        self.engine.at(self.engine.now + 2 * self.hb_ns, self._rehome, run)

    def _unwait(self, run: _Run) -> None:
        if run.waiting:
            run.waiting = False
            self.waiting_on[run.coord] -= 1
            self.claimed_in_leaf[self.leaf_of[run.coord]] -= run.job.nodes

    def _coordinator(self, high: bool) -> int:
        """The leaf with the most idle nodes not yet claimed by gangs waiting there (for a
        high-priority job, idle or low-priority ones), and in it its first idle node (gangs
        submitted there are tried in their order), or, with none idle, the node fewest gangs
        wait on: waiting gangs are spread over the nodes, each placed by its coordinator when
        a node in its reach frees, rather than all waiting on the leaf's first node, which
        tries them one at a time and reaches its links only."""
        idle, low, claimed = self.idle_in_leaf, self.low_in_leaf, self.claimed_in_leaf
        if high:
            leaf = max(range(len(idle)), key=lambda x: (idle[x] + low[x], idle[x], -x))
        else:
            leaf = max(range(len(idle)), key=lambda x: (idle[x] - claimed[x], -x))
        first = leaf * self.leaf_size
        members = range(first, min(first + self.leaf_size, self.cfg.nodes))
        for i in members:
            if self.busy[i] is None:
                return i
        waiting = self.waiting_on
        return min(members, key=lambda i: (waiting[i], i))

    def _press(self, run: _Run) -> None:
        """A high-priority job waits: cancel lower-priority runs in its coordinator's reach
        until the idle nodes there cover it; look again every two heartbeats."""
        if run.t_start >= 0 or run.preempted or self.state[run.job.id].current is not run:
            return
        now = self.engine.now
        reach = [run.coord, *self.nodes[run.coord].core.links]
        busy = self.busy
        idle = sum(1 for x in reach if busy[x] is None)
        going = {id(v) for v in run.victims}
        freeing = sum(1 for x in reach if busy[x] is not None and id(busy[x]) in going)
        need = run.job.nodes - idle - freeing
        if need > 0:
            cands: dict[int, tuple[_Run, int]] = {}
            for x in reach:
                v = busy[x]
                if v is None or v.preempted or v.ended or v.t_start < 0:
                    continue
                if v.job.priority >= run.job.priority:
                    continue
                c = cands.get(id(v))
                cands[id(v)] = (v, 1 if c is None else c[1] + 1)
            # fewest steps lost first, then the most nodes freed here
            order = sorted(cands.values(), key=lambda c: (self._loss(c[0], now), -c[1]))
            for v, here in order:
                if need <= 0:
                    break
                need -= here
                run.victims.append(v)
                going.add(id(v))
                self._stop(v)
                vc = self.nodes[v.coord]
                vc.do(vc.core.preempt(None, v.core_job, True, now))
        self.engine.at(now + 2 * self.hb_ns, self._press, run)

    def _loss(self, v: _Run, now: int) -> int:
        done = (now - v.t_start) // v.job.step_ns
        return (done % self.ckpt) * v.job.nodes

    # ---- running ----------------------------------------------------------------------------
    def begin(self) -> None:
        """Every job's arrival on the clock (once; `run` does it if not done)."""
        if not self._begun:
            self._begun = True
            for j in self.jobs:
                self.engine.at(j.arrival_ns, self._arrive, j.id)

    def run(self) -> dict[str, Any]:
        cfg, eng = self.cfg, self.engine
        self.begin()
        longest = max(j.work_ns for j in self.jobs)
        stall = max(int((cfg.stall_ms or 60_000) * 1e6), 3 * longest, 20 * self.hb_ns)
        limit = cfg.wall_limit_s
        wall0, cpu0 = time.perf_counter(), time.process_time()
        stopped: str | None = None
        total = len(self.jobs)

        def finished() -> bool:
            return self.done == total

        horizon = stall
        while True:
            if eng.run(finished, horizon):
                break
            if limit and time.perf_counter() - wall0 > limit:
                stopped = f"stopped at the wall-clock limit of {limit:g} s"
                break
            if eng.now - max(self.last_event, max(j.arrival_ns for j in self.jobs)) >= stall:
                stopped = f"stalled: no job started or ended for {stall / 1e9:g} virtual s"
                break
            horizon = eng.now + max(self.hb_ns, stall // 8)
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        return self.figures(stopped, wall, cpu)

    # ---- figures ----------------------------------------------------------------------------
    def figures(self, stopped: str | None, wall_s: float, cpu_s: float) -> dict[str, Any]:
        cfg = self.cfg
        n = cfg.nodes
        now = self.engine.now
        busy_ns = self.busy_ns + sum(now - self.since[i] for i in range(n) if self.busy[i])
        win = self.window_ns
        busy_win = self.busy_window_ns + sum(
            max(0, min(now, win) - self.since[i]) for i in range(n) if self.busy[i]
        )
        ended = [st for st in self.state.values() if st.end >= 0]
        span = max((st.end for st in ended), default=now) if stopped is None else now
        useful = sum(st.job.work_ns * st.job.nodes for st in ended)
        lost = sum(st.lost_steps * st.job.step_ns * st.job.nodes for st in self.state.values())
        gangs = [c.core.gangs.n for c in self.nodes]

        def stats(sts: Iterable[_JobState]) -> dict[str, Any]:
            xs = list(sts)
            jct = [(st.end - st.job.arrival_ns) / S for st in xs if st.end >= 0]
            wait = [(st.first_start - st.job.arrival_ns) / S for st in xs if st.first_start >= 0]
            return {
                "jobs": len(xs),
                "ended": len(jct),
                "jct_mean_s": _mean(jct),
                "jct_p50_s": _q(jct, 0.5),
                "jct_p99_s": _q(jct, 0.99),
                "queue_mean_s": _mean(wait),
                "queue_p50_s": _q(wait, 0.5),
                "queue_p99_s": _q(wait, 0.99),
                "preemptions": sum(st.preemptions for st in xs),
            }

        allst = list(self.state.values())
        spreads = [s for st in allst for s in st.spreads]
        out: dict[str, Any] = {
            "scheduler": cfg.scheduler,
            "nodes": n,
            "workload": "jobs",
            "finished": stopped is None,
            "stopped": stopped,
            "virtual_s": span / 1e9,
            "jobs_replay": None if self.replay is None else self.replay.describe(n),
            **stats(allst),
            "by_size": {
                name: stats(st for st in allst if lo <= st.job.nodes <= hi)
                for name, lo, hi in SIZE_CLASSES
            },
            "by_priority": {
                CLASS_NAMES[p]: stats(st for st in allst if st.job.priority == p)
                for p in (HIGH, LOW)
            },
            "device_idle_pct": 100.0 * (1 - busy_ns / (n * span)) if span else None,
            "device_idle_arrivals_pct": 100.0 * (1 - busy_win / (n * win)) if win else None,
            "utilisation_pct": 100.0 * useful / (n * span) if span else None,
            "lost_node_s": lost / S,
            "useful_node_s": useful / S,
            "gang_start_spread_max_us": max(spreads) / 1e3 if spreads else None,
            "gangs_placed": sum(g["placed"] for g in gangs),
            "gang_attempts_failed": sum(g["attempts_failed"] for g in gangs),
            "backfilled": self.queue.backfilled if self.queue is not None else None,
            "rehomed": self.rehomed,
            "overlaps": self.overlaps,
            "partial_runs": self.partial,
            "rejected": sum(sum(c.core.rejected.values()) for c in self.nodes),
            "msgs": self.net.sent,
            "msgs_by_kind": self.net.counts(),
            "events": self.engine.events,
            "build_cpu_s": round(self.build_cpu_s, 3),
            "cpu_s": round(cpu_s, 3),
            "wall_s": round(wall_s, 3),
        }
        return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _q(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def simulate_jobs(cfg: SimConfig) -> dict[str, Any]:
    """One multi-job run (`cfg.jobs` set): its figures."""
    return JobCluster(cfg).run()


def format_jobs_table(rows: list[dict[str, Any]]) -> str:
    """The multi-job runs side by side: JCT and queueing delay (mean, p50, p99, s), device
    idle and utilisation (% of the cluster's node-time), preemptions."""
    head = (
        f"{'scheduler':<10} {'nodes':>6} {'jobs':>5} {'JCT mean':>9} {'p50':>7} {'p99':>8} "
        f"{'queue mean':>10} {'p99':>7} {'idle %':>7} {'idle~':>6} {'util %':>7} {'preempt':>7}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['scheduler']:<10} {r['nodes']:>6} {r['ended']:>5} {_f(r['jct_mean_s'])} "
            f"{_f(r['jct_p50_s'], 7)} {_f(r['jct_p99_s'], 8)} {_f(r['queue_mean_s'], 10)} "
            f"{_f(r['queue_p99_s'], 7)} {_f(r['device_idle_pct'], 7)} "
            f"{_f(r['device_idle_arrivals_pct'], 6)} "
            f"{_f(r['utilisation_pct'], 7)} {r['preemptions']:>7}"
        )
        for name, s in r["by_size"].items():
            if s["jobs"]:
                lines.append(
                    f"  size {name:<5} {s['ended']:>11} {_f(s['jct_mean_s'])} "
                    f"{_f(s['jct_p50_s'], 7)} {_f(s['jct_p99_s'], 8)} "
                    f"{_f(s['queue_mean_s'], 10)} {_f(s['queue_p99_s'], 7)}"
                )
        for name, s in r["by_priority"].items():
            if s["jobs"]:
                lines.append(
                    f"  prio {name:<5} {s['ended']:>11} {_f(s['jct_mean_s'])} "
                    f"{_f(s['jct_p50_s'], 7)} {_f(s['jct_p99_s'], 8)} "
                    f"{_f(s['queue_mean_s'], 10)} {_f(s['queue_p99_s'], 7)}"
                )
        if r["stopped"]:
            lines.append(f"  not finished: {r['stopped']}")
    return "\n".join(lines)


def _f(v: float | None, w: int = 9) -> str:
    return f"{'-':>{w}}" if v is None else f"{v:>{w}.1f}"
