"""The simulator's baselines that stand for what users run (docs/SIM.md, "Schedulers").

- `exclusive` (Slurm, Kueue + kube-scheduler, Volcano): each job's gang placed once, whole
  nodes to one job, nothing co-located, the work of a step in the order the framework
  issues it. The node cores run it (`drivers.make_core`, one priority as under "fifo"); the
  gang's binding is paid once per job (`admission`).
- `two-level` (Ray): a local scheduler per node (the node core, one priority: Ray has no
  priorities) that takes every task in at Ray's measured cost per task, and spills a task
  it has no free slot for to one global scheduler (`GlobalScheduler`, a queue with a cost
  per decision) over TCP-class links.
- `central` (Dask distributed): one coordinator per job (the demo's `Coordinator`, a node
  core per node inside), batched: a turn takes every message waiting and pays a cost per
  turn plus one per message (`BatchEndpoint`); a barrier is a counter and one release.

Every cost comes from rdmasched/sim/costs.py unless the run measured it (`--measure`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rdmasched import _wire
from rdmasched.daemon.core import NodeCore
from rdmasched.demo.central import Coordinator
from rdmasched.demo.job import GROUP
from rdmasched.demo.taskid import KIND_BACKGROUND, task_kind
from rdmasched.scheduler import Task
from rdmasched.sim.drivers import CoreNode, Ledger, SimLoop
from rdmasched.sim.engine import Endpoint, Engine, Network
from rdmasched.sim.linkmodel import PRESETS, LinkModel
from rdmasched.topology import DEFAULT_SLOTS_PER_LANE, LANE_HEADER_BYTES, SLOT_BYTES
from rdmasched.wire import Kind

if TYPE_CHECKING:
    from rdmasched.sim.run import Run

_SYNC = int(Kind.SYNC_READY)


# ---- exclusive: one binding per job ------------------------------------------------------
def admission(jobs: int, job_nodes: int, pods_per_s: float) -> dict[str, Any]:
    """What `exclusive` pays once per job: its gang of `job_nodes` pods (one pod per whole
    node) bound at the batch scheduler's rate, all of them before the job starts (gang
    placement: Kueue admits the workload whole, Volcano's gang plugin waits for every
    member). One scheduler binds the jobs one after another. The step figures start when
    the gang is placed (a node's daemon starts with its pod), so this is reported beside
    them: `admission_s` per job, `admission_all_s` for every job's gang, `bindings`."""
    per_job = job_nodes / pods_per_s
    return {
        "bindings": jobs,
        "pods_bound": jobs * job_nodes,
        "admission_s": per_job,
        "admission_all_s": jobs * per_job,
        "admission_pods_per_s": pods_per_s,
    }


# ---- central: batched turns ----------------------------------------------------------------
class BatchEndpoint(Endpoint):
    """A coordinator's loop that takes every message waiting in one turn: the turn costs
    `batch_ns` once, and each message its own `cost(m)` (its calls into node cores). The
    messages of a turn are handled one after another, each when the ones before it are
    paid for, so what one sends leaves when its own handling is done."""

    __slots__ = ("batch_ns", "busy_ns", "turns")

    def __init__(
        self,
        engine: Engine,
        node: int,
        batch_ns: int,
        cost: Callable[[_wire.Message], int],
        handler: Callable[[_wire.Message, int], None],
    ) -> None:
        super().__init__(engine, node, 0, handler, cost=cost)
        self.batch_ns = batch_ns
        self.turns = 0
        #: CPU time charged, ns: every turn's and every message's
        self.busy_ns = 0

    def arrive(self, m: _wire.Message, writer: int) -> None:
        if not self.alive:
            return
        self.inbox.append((m, writer))
        if not self.waking:
            self.waking = True
            now = self.engine.now
            # messages due at this same time join the turn (it runs after them)
            self.engine.at(self.busy_until if self.busy_until > now else now, self._turn)

    def _turn(self) -> None:
        if not self.alive or not self.inbox:
            self.inbox.clear()
            self.waking = False
            return
        batch = list(self.inbox)
        self.inbox.clear()
        self.turns += 1
        cost = self.cost
        assert cost is not None
        t0 = self.engine.now
        t = t0 + self.batch_ns
        for m, writer in batch:
            t += cost(m)
            self.busy_until = t
            self.handled += 1
            self.handler(m, writer)
        self.busy_ns += t - t0
        self.engine.at(t, self._turn)  # the next turn takes what came in meanwhile


def build_central(run: Run) -> None:
    """The central baseline: one `Coordinator` per job (one for the whole cluster when one
    job runs over every node), each one more host beside its job's first node, on a
    `BatchEndpoint`; the nodes are the demo's `Executor`s."""
    cfg, eng, net = run.cfg, run.engine, run.net
    n = cfg.nodes
    call, batch = cfg.central_call_ns, cfg.central_batch_ns
    eps: dict[int, Endpoint] = {}
    jn = run.job_nodes
    jobs = -(-n // jn)
    run.coordinators = []
    run.coord_eps = []
    coord_of: list[int] = []
    for j in range(jobs):
        me = n + j
        members = range(j * jn, min(n, (j + 1) * jn))
        net.beside[me] = members[0]
        loop = SimLoop(eng, net, me, lambda me=me: eps[me])  # type: ignore[misc]
        group = GROUP if jobs == 1 else run.groups[j]
        coord = Coordinator(
            loop,  # type: ignore[arg-type]
            dict.fromkeys(members, run.slots),
            group=group,
            sync_cost_ns=int(cfg.workload.sync_ms * 1_000_000),
            starvation_us=1_000_000,
            aging_us=100_000,
            events=cfg.events,
            preemption=run.core_preemption,
        )
        if jobs == 1:
            for g in run.groups:  # a trace's gradient buckets
                if g != GROUP:
                    coord.define_group(g, frozenset(members))
        sync_calls = coord.sync_calls

        def cost(m: _wire.Message, sync_calls: Any = sync_calls) -> int:
            # one call per message (a DISPATCH, a COMPLETE; a SYNC_READY is counted); the
            # last SYNC_READY of a step pays one more, its release broadcast
            return call * (sync_calls(m.id, m.arg0, m.arg2) if m.kind == _SYNC else 1)

        eps[me] = BatchEndpoint(eng, me, batch, cost, coord.on_message)
        net.endpoints[me] = eps[me]
        run.coordinators.append(coord)
        run.coord_eps.append(eps[me])
        coord_of.extend([me] * len(members))
    run.coordinator = run.coordinators[0]
    run.cores = [c for coord in run.coordinators for c in coord.cores.values()]
    run._coord_node = n
    run._build_executors(eps, coord_of)


def central_figures(run: Run) -> dict[str, Any]:
    eps = run.coord_eps
    lane_bytes = DEFAULT_SLOTS_PER_LANE * SLOT_BYTES + LANE_HEADER_BYTES
    return {
        # a coordinator holds a lane to each node of its job
        "coordinator_lanes": run.job_nodes,
        "coordinator_ring_bytes": run.job_nodes * lane_bytes,
        "coordinators": len(eps),
        "coordinator_msgs": sum(e.handled for e in eps),
        "coordinator_turns": sum(e.turns for e in eps),
        "coordinator_busy_ns": sum(e.busy_ns for e in eps),
        "central_call_ns": run.cfg.central_call_ns,
        "central_batch_ns": run.cfg.central_batch_ns,
    }


# ---- two-level: Ray-like ---------------------------------------------------------------------
class GlobalScheduler:
    """The global scheduler of a two-level (Ray-like) cluster, as a small model of it: a
    queue of spilled tasks and a view of the nodes' free slots, fed by messages over
    TCP-class links (`link`: its one-way latency, and its CPU cost per message received),
    each placement a decision of `decision_ns` of its one thread. A spilled task goes to a
    node that reported a free slot, or waits in the queue (first in, first out: Ray has no
    priorities) until one does."""

    def __init__(self, engine: Engine, link: LinkModel, decision_ns: int) -> None:
        self.engine = engine
        self.latency_ns = link.levels[1].latency_ns
        self.msg_ns = link.cpu_ns
        self.decision_ns = decision_ns
        self.nodes: list[TwoLevelNode] = []
        self.queue: deque[Task] = deque()
        #: node -> the free slots it reported last
        self.free: dict[int, int] = {}
        self.busy_until = 0
        self.busy_ns = 0
        self.spills = 0
        self.reports = 0
        self.placements = 0
        self.queue_max = 0

    def _work(self, cost_ns: int) -> int:
        """Take `cost_ns` of the scheduler's thread; when that work is done."""
        now = self.engine.now
        t = (self.busy_until if self.busy_until > now else now) + cost_ns
        self.busy_until = t
        self.busy_ns += cost_ns
        return t

    def spill(self, task: Task) -> None:
        """A node's spilled task, on its way here."""
        self.engine.at(self.engine.now + self.latency_ns, self._spilled, task)

    def report(self, node: int, free: int) -> None:
        """A node's free slots, on its way here."""
        self.engine.at(self.engine.now + self.latency_ns, self._reported, node, free)

    def _spilled(self, task: Task) -> None:
        self.spills += 1
        self._work(self.msg_ns)
        self.queue.append(task)
        self.queue_max = max(self.queue_max, len(self.queue))
        self._place()

    def _reported(self, node: int, free: int) -> None:
        self.reports += 1
        self._work(self.msg_ns)
        self.free[node] = free
        self._place()

    def _place(self) -> None:
        free = self.free
        while self.queue and free:
            node = next(iter(free))
            left = free[node] - 1
            if left > 0:
                free[node] = left
            else:
                del free[node]
            task = self.queue.popleft()
            self.placements += 1
            t = self._work(self.decision_ns)
            self.engine.at(t + self.latency_ns, self.nodes[node].run_here, task)


class TwoLevelNode(CoreNode):
    """A node of a two-level (Ray-like) cluster: its local scheduler is the node core.
    Every task the workload submits takes its turn through the local scheduler (`task_ns`
    each, one at a time: Ray's raylet, measured by `bench peers`) and starts `delay_ns`
    later (the rest of Ray's measured submit -> start latency). A task the node has no free
    slot for goes to the global scheduler if it may run anywhere (background work: Ray's
    normal tasks); a training job's compute tasks are its rank's (Ray Train's actors) and
    wait here. The node reports its free slots to the global scheduler periodically, when
    they changed (Ray's raylets report their resources every 100 ms). `spills` off: every
    task waits here (the mixed stream, whose nodes are all kept full by their own drivers)."""

    spills = True

    def __init__(
        self,
        engine: Engine,
        net: Network,
        me: int,
        core: NodeCore,
        cpu_ns: int,
        ledger: Ledger,
        glob: GlobalScheduler,
        task_ns: int,
        delay_ns: int,
    ) -> None:
        super().__init__(engine, net, me, core, cpu_ns, ledger)
        self.glob = glob
        self.task_ns = task_ns
        self.delay_ns = delay_ns
        self.local_free_at = 0
        self.reported = 0
        self.spilled = 0
        self.ran_for_others = 0
        self.report_ns = 0

    def submit_local(self, task: Task) -> None:
        now = self.engine.now
        t = (self.local_free_at if self.local_free_at > now else now) + self.task_ns
        self.local_free_at = t
        self.engine.at(t + self.delay_ns, self._place, task)

    def _place(self, task: Task) -> None:
        if not self.ep.alive:
            return
        if (
            self.spills
            and task_kind(task.id) == KIND_BACKGROUND
            and not self.core.scheduler.free_slots()
        ):
            self.spilled += 1
            self.glob.spill(task)
            return
        self.do(self.core.dispatch(task, self.engine.now))

    def run_here(self, task: Task) -> None:
        """The global scheduler placed `task` (spilled by another node, or by this one)
        here: this node's core runs it as its own."""
        if not self.ep.alive:
            return
        self.ran_for_others += 1
        self.reported = max(0, self.reported - 1)
        t = Task(task.id, task.job, task.priority, task.cost_ns, task.progress_ns, origin=self.me)
        self.do(self.core.dispatch(t, self.engine.now))

    def start_reports(self, first_ns: int, period_ns: int) -> None:
        """Report the free slots to the global scheduler every `period_ns` from
        `first_ns`, when they changed since the last report."""
        self.report_ns = period_ns
        self.engine.at(first_ns, self._report)

    def _report(self) -> None:
        if not self.ep.alive:
            return
        free = self.core.scheduler.free_slots()
        if free != self.reported:
            self.reported = free
            self.glob.report(self.me, free)
        self.engine.at(self.engine.now + self.report_ns, self._report)


def two_level_figures(run: Run) -> dict[str, Any]:
    g = run.glob
    assert g is not None
    return {
        "spilled": g.spills,
        "global_placements": g.placements,
        "global_reports": g.reports,
        "global_queue_max": g.queue_max,
        "global_busy_ns": g.busy_ns,
        "two_level_task_ns": run.cfg.two_level_task_ns,
        "two_level_delay_ns": run.cfg.two_level_delay_ns,
        "two_level_global_ns": run.cfg.two_level_global_ns,
        "two_level_link": PRESETS["tcp"].name,
    }
