"""One simulated run: a cluster of N nodes, one scheduler, one workload; its figures.

`simulate(SimConfig(...))` builds the topology, the nodes (real cores, or the real central
coordinator and its executors), starts the workload on every node at virtual time 0 and
runs the engine until every live node has run every step (or nothing moves for
`stall_ms`). `measure_central_call_ns()` times the real coordinator code on this machine.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from rdmasched import _wire
from rdmasched.daemon.core import NodeCore
from rdmasched.demo.central import Coordinator, Executor
from rdmasched.demo.job import GROUP, WorkloadConfig
from rdmasched.errors import ArgumentError
from rdmasched.messages import Complete, Dispatch, SyncReady
from rdmasched.scheduler.events import WORDS
from rdmasched.sim import baselines, costs
from rdmasched.sim.drivers import (
    CoreNode,
    Ledger,
    Shaped,
    SimLoop,
    SimTrainer,
    make_core,
)
from rdmasched.sim.engine import Endpoint, Engine, Network
from rdmasched.sim.harvest import (
    TIMESLICE_INTERFERENCE,
    DeviceTraceTrainer,
    NodeHarvest,
    harvest_figures,
)
from rdmasched.sim.hostmodel import Host, HostModel, HostShaped, HostSimLoop
from rdmasched.sim.jobs import JOB_SCHEDULERS, JobsConfig, simulate_jobs
from rdmasched.sim.linkmodel import PRESETS, LinkModel
from rdmasched.sim.mixed import (
    CENTRAL_PREEMPTION,
    MIXED_SCHEDULERS,
    MixedConfig,
    MixedTrainer,
    mixed_figures,
)
from rdmasched.sim.pipeline import PipelineConfig, PipelineTrainer, pipeline_figures
from rdmasched.sim.trace import (
    TRACE_CORE_SLOTS,
    TRACE_GROUP_BASE,
    ReplayPlan,
    TraceTrainer,
    device_figures,
    sync_times,
    trace_groups,
)
from rdmasched.topology import DEFAULT_SLOTS_PER_LANE, LANE_HEADER_BYTES, SLOT_BYTES, Topology
from rdmasched.wire import Kind
from rdmasched.workload import Replicated, Workload, replicate
from rdmasched.workload.streams import MODES, Mode

SCHEDULERS = ("rdmasched", "fifo", "central", "k8s", "exclusive", "two-level", "timeslice")
#: what `rdmasched sim` runs unless --schedulers says otherwise: the baselines that stand
#: for what users run (docs/SIM.md, "Schedulers"); the per-task k8s only when named
DEFAULT_SCHEDULERS = ("rdmasched", "fifo", "exclusive", "two-level", "central")
#: the schedulers whose decisions a coordinator makes (the others: every node's own core)
CENTRAL = ("central", "k8s")
#: the schedulers whose tasks all get one priority (in the order they come)
ONE_PRIORITY = ("fifo", "exclusive", "two-level", "timeslice")
#: the stall window unless the k8s baseline needs more (SimConfig.stall_window_ms)
STALL_MS = 5_000.0
#: with several jobs, job j's sync group
JOB_GROUP_BASE = 64
MS = 1_000_000

#: kube-scheduler: ~100 pods/s (costs.K8S_PODS_PER_S; docs/SIM.md has the sources)
K8S_PODS_PER_S = costs.K8S_PODS_PER_S.value
#: `--trace`: a core's event ring holds WORDS u64 per event (scheduler/events.py); the rings
#: of a run may take this much at most
TRACE_BYTES_PER_EVENT = 8 * WORDS
TRACE_RING_MAX_BYTES = 2 << 30

#: allocations between two collections of CPython's youngest GC generation while a cluster
#: is built and run (CPython's default: 700); see `_few_collections`
GC_GEN0 = 100_000


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """CPython's cyclic GC, tuned for a simulator holding N node cores: millions of
    long-lived objects that do not become garbage while it runs. What exists when a run
    starts is frozen (`gc.freeze`: no collection looks at it again), and the youngest
    generation is collected every GC_GEN0 allocations instead of 700. Collections still
    happen (nothing leaks that a collection would find); they are 140 times rarer. At
    2,000 nodes this took 20-40% off the CPU time (docs/SIM.md, "Speed"). The previous
    thresholds are restored after, and what was frozen is unfrozen."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(old[0], GC_GEN0), old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


@dataclass(frozen=True)
class SimConfig:
    nodes: int
    scheduler: str = "rdmasched"
    slots: int = 4
    workload: WorkloadConfig = field(default_factory=lambda: WorkloadConfig(steps=10))
    links: LinkModel = PRESETS["ib"]
    leaf: int = 32
    pod: int = 1024
    seed: int = 1
    #: per-node slowdown: lognormal shape (0: none), straggler fraction and factor
    sigma: float = 0.0
    stragglers: float = 0.0
    straggler_slowdown: float = 2.0
    #: node deaths: (how many nodes, at virtual ms)
    kill: tuple[tuple[int, float], ...] = ()
    heartbeat_ms: int = 50
    dead_after_ms: int = 500
    #: the central coordinator's CPU time per call into one of its node cores, ns, and
    #: per turn of its loop (a batch of messages); recorded figures (sim/costs.py)
    central_call_ns: int = int(costs.CENTRAL_CALL.value)
    central_batch_ns: int = int(costs.CENTRAL_BATCH.value)
    #: two-level (Ray-like): a task's turn through the local scheduler, the rest of its
    #: submit -> start latency, a global decision, the nodes' report period (sim/costs.py)
    two_level_task_ns: int = int(costs.RAY_TASK.value)
    two_level_delay_ns: int = int(costs.RAY_START_P50.value - costs.RAY_TASK.value)
    two_level_global_ns: int = int(costs.RAY_GLOBAL_DECISION.value)
    two_level_report_ns: int = int(costs.RAY_REPORT_PERIOD.value)
    k8s_pods_per_s: float = K8S_PODS_PER_S
    k8s_period_ms: float = 0.0
    #: stop when no compute or sync task is done anywhere for this long (virtual ms);
    #: None: `stall_window_ms()` chooses
    stall_ms: float | None = None
    #: nodes per data-parallel job (0: one job over every node); the cluster runs
    #: N / job_nodes jobs side by side, each its own sync group
    job_nodes: int = 0
    #: stop a run that takes longer than this on the wall clock (0: never); a run stopped
    #: so is marked and its figures are not deterministic
    wall_limit_s: float = 0.0
    #: replay this trace's steps (rdmasched.workload) instead of the synthetic job
    trace: Workload | None = None
    #: a trace's collectives take the link model's time even within its traced world size
    link_model: bool = False
    #: how a GPU trace is replayed (rdmasched.workload.streams.MODES): "host" (its ops wait
    #: for the host that issued them), "device" (the device alone), "kernels" (no gaps)
    trace_mode: Mode = "host"
    #: the cores get no topology: a lane between every two nodes, flat sync (every member
    #: tells every member) and flat liveness, as `rdmasched demo` without --leaf runs
    full_mesh: bool = False
    #: write every node's decision events here at the end (`rdmasched sim --trace`; None:
    #: none); `events` is each core's event ring then (0: the ring is off)
    trace_dir: str | None = None
    events: int = 0
    #: watch every node's devices: the co-located work harvested, device idle, the device's
    #: preemption cost (rdmasched/sim/harvest.py; docs/SIM.md, "Harvest"); on under
    #: "timeslice", where `interference` slows a job task beside co-located work
    harvest: bool = False
    device_preempt_us: float = 0.0
    interference: float = TIMESLICE_INTERFERENCE
    #: a 1F1B pipeline-parallel job instead of the synthetic data-parallel one
    pipeline: PipelineConfig | None = None
    #: the multi-job workload (rdmasched/sim/jobs.py) instead of the synthetic job: jobs
    #: arriving as gangs of whole nodes, under rdmasched or exclusive (None: not it)
    jobs: JobsConfig | None = None
    #: the nodes as processes sharing one host's CPUs, each a sleeping loop
    #: (rdmasched/sim/hostmodel.py; None: every node has its own CPU, the headline's model)
    host_model: HostModel | None = None
    #: the mixed stream (rdmasched/sim/mixed.py) instead of the synthetic job: short
    #: low-priority tasks and periodic critical ones on every node (None: not it)
    mixed: MixedConfig | None = None

    def stall_window_ms(self) -> float:
        """The stall window: `stall_ms` if given; else 5 s, and under k8s at least twice
        the time its binding rate takes for one round of every node's pods (its
        background backlog, a compute task per slot and its sync), which its first step
        waits behind (a slow scheduler is not a stalled cluster)."""
        if self.stall_ms is not None:
            return self.stall_ms
        if self.scheduler != "k8s":
            return STALL_MS
        pods = self.nodes * (self.workload.background_backlog + self.slots + 1)
        return max(STALL_MS, 2 * pods * 1000 / self.k8s_pods_per_s)

    def check(self) -> None:
        if self.jobs is not None:
            if self.scheduler not in JOB_SCHEDULERS:
                raise ArgumentError(
                    f"the multi-job workload (--jobs) runs under {' or '.join(JOB_SCHEDULERS)}, "
                    f"not {self.scheduler}"
                )
            self.jobs.check()
        elif self.scheduler not in SCHEDULERS:
            raise ArgumentError(
                f"unknown scheduler {self.scheduler!r}; one of: {', '.join(SCHEDULERS)}"
            )
        if self.nodes < 1 or self.slots < 1:
            raise ArgumentError("nodes and slots must be >= 1")
        if self.mixed is not None:
            if self.scheduler not in MIXED_SCHEDULERS:
                raise ArgumentError(
                    f"the mixed stream (--mixed) runs under {', '.join(MIXED_SCHEDULERS)}, "
                    f"not {self.scheduler}"
                )
            if self.trace is not None or self.pipeline is not None or self.jobs is not None:
                raise ArgumentError(
                    "the mixed stream is its own workload (no trace, pipeline, jobs)"
                )
            if self.harvest or self.host_model is not None:
                raise ArgumentError("the mixed stream runs without --harvest and --host-model")
            self.mixed.check()
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ArgumentError(f"sigma must be >= 0, not {self.sigma}")
        if not 0 <= self.stragglers <= 1:
            raise ArgumentError(f"stragglers must be a fraction in [0, 1], not {self.stragglers}")
        if self.straggler_slowdown < 1:
            raise ArgumentError("straggler slowdown must be >= 1")
        for count, at in self.kill:
            if not 0 <= count <= self.nodes or at < 0:
                raise ArgumentError(f"--kill {count}@{at}: 0..{self.nodes} nodes at >= 0 ms")
        if not 0 <= self.job_nodes <= self.nodes:
            raise ArgumentError(
                f"--job-nodes {self.job_nodes}: nodes per job must be in 0..{self.nodes} "
                f"(the cluster's nodes; 0: one job over every node)"
            )
        if self.trace_mode not in MODES:
            raise ArgumentError(f"trace mode {self.trace_mode!r}: one of {', '.join(MODES)}")
        if self.trace is not None and self.job_nodes not in (0, self.nodes):
            raise ArgumentError("a trace replay runs one job over every node (no --job-nodes)")
        if self.pipeline is not None:
            if self.trace is not None or self.job_nodes not in (0, self.nodes):
                raise ArgumentError("a pipeline job is its own workload (no trace, no --job-nodes)")
            self.pipeline.check(self.nodes)
        if not (math.isfinite(self.device_preempt_us) and self.device_preempt_us >= 0):
            raise ArgumentError(
                f"device preemption cost must be >= 0 us, not {self.device_preempt_us}"
            )
        if not (math.isfinite(self.interference) and self.interference >= 1):
            raise ArgumentError(f"interference must be a factor >= 1, not {self.interference}")
        if self.harvest and self.scheduler in CENTRAL:
            raise ArgumentError(f"harvest figures are the node cores' (not {self.scheduler}'s)")
        if not 0 < self.heartbeat_ms < self.dead_after_ms:
            raise ArgumentError(
                f"need 0 < heartbeat ({self.heartbeat_ms} ms) < dead-after "
                f"({self.dead_after_ms} ms)"
            )
        if self.k8s_pods_per_s <= 0:
            raise ArgumentError("k8s pods/s must be > 0")
        for name in (
            "central_call_ns",
            "central_batch_ns",
            "two_level_task_ns",
            "two_level_delay_ns",
            "two_level_global_ns",
        ):
            if getattr(self, name) < 0:
                raise ArgumentError(f"{name} must be >= 0 ns, not {getattr(self, name)}")
        if self.two_level_report_ns <= 0:
            raise ArgumentError(f"two_level_report_ns must be > 0, not {self.two_level_report_ns}")
        if self.stall_ms is not None and not (math.isfinite(self.stall_ms) and self.stall_ms > 0):
            raise ArgumentError(f"stall must be > 0 virtual ms, not {self.stall_ms}")
        if self.events < 0:
            raise ArgumentError(f"events must be >= 0, not {self.events}")
        if self.host_model is not None:
            self.host_model.check()
        ring = self.nodes * self.events * TRACE_BYTES_PER_EVENT
        if ring > TRACE_RING_MAX_BYTES:
            raise ArgumentError(
                f"the event rings of {self.nodes} nodes x {self.events} events would take "
                f"{ring / 2**30:.1f} GiB (over {TRACE_RING_MAX_BYTES // 2**30} GiB): give "
                f"fewer events per node (--trace-events "
                f"{max(1, TRACE_RING_MAX_BYTES // (self.nodes * TRACE_BYTES_PER_EVENT))} or less)"
            )


def slowdowns(cfg: SimConfig, rng: random.Random) -> list[float]:
    """Per node: a lognormal factor (median 1, shape sigma), stragglers slowed further
    (the same distribution as rdmasched.workload.replicate)."""
    n = cfg.nodes
    f = [rng.lognormvariate(0.0, cfg.sigma) if cfg.sigma > 0 else 1.0 for _ in range(n)]
    for i in rng.sample(range(n), round(cfg.stragglers * n)):
        f[i] *= cfg.straggler_slowdown
    return f


def lanes_per_node(
    topo: Topology, scheduler: str, sample: list[int], full_mesh: bool = False
) -> dict[str, Any]:
    """Lanes and ring memory per node: from the topology's link plan (rdmasched, fifo; a
    lane to every other node in a full mesh), or a lane to and from the coordinator
    (central, k8s)."""
    lane_bytes = DEFAULT_SLOTS_PER_LANE * SLOT_BYTES + LANE_HEADER_BYTES
    if scheduler in ("central", "k8s"):
        n = len(topo)
        return {
            "lanes_per_node": 1,
            "ring_bytes_per_node": lane_bytes,
            "coordinator_lanes": n,
            "coordinator_ring_bytes": n * lane_bytes,
        }
    counts = [len(topo) - 1 if full_mesh else len(topo.neighbours(u)) for u in sample]
    return {
        "lanes_per_node": max(counts),
        "lanes_per_node_mean": sum(counts) / len(counts),
        "ring_bytes_per_node": max(counts) * lane_bytes,
        "link_plan": "full mesh" if full_mesh else topo.plan.scheme,
    }


def _pct(samples: list[int], q: float) -> float | None:
    if not samples:
        return None
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] / 1e3


class Run:
    """A cluster under one scheduler on one engine (built, not yet run)."""

    def __init__(self, cfg: SimConfig) -> None:
        cfg.check()
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.engine = Engine()
        n = cfg.nodes
        self.topo = Topology.generate(n, leaf=min(cfg.leaf, n), pod=_pod(cfg, n))
        self.net = Network(self.engine, cfg.links, self.topo)
        self.ledger = Ledger(n)
        self.factors = slowdowns(cfg, self.rng)
        self.rep: Replicated | None = None
        self.sync_ns: dict[int, int] = {}
        self.replay: ReplayPlan | None = None
        self.groups = [GROUP]
        jn = cfg.job_nodes if 0 < cfg.job_nodes < n else n
        self.job_nodes = jn
        if jn < n:  # several jobs: group JOB_GROUP_BASE + j holds job j's nodes
            self.groups = [JOB_GROUP_BASE + j for j in range(-(-n // jn))]
        if cfg.trace is not None:
            # the trace's compute is scaled by replicate's slowdowns (the same distribution)
            self.rep = replicate(
                cfg.trace,
                n,
                sigma=cfg.sigma,
                stragglers=cfg.stragglers,
                straggler_slowdown=cfg.straggler_slowdown,
                seed=cfg.seed,
            )
            self.factors = [1.0] * n
            widest = cfg.links.level(self.topo, 0, n - 1)
            self.sync_ns = sync_times(cfg.trace, n, cfg.links, widest, cfg.link_model)
            self.replay = ReplayPlan(cfg.trace, cfg.trace_mode)
            self.groups = [TRACE_GROUP_BASE + j for j in range(trace_groups(self.rep))]
        self.trainers: list[SimTrainer] = []
        self.harvests: list[NodeHarvest] = []
        self.alive = [True] * n
        self.killed: list[int] = []
        #: each node's slots: a trace replay's core orders its one bucket stream
        self.slots = TRACE_CORE_SLOTS if cfg.trace is not None else cfg.slots
        self.coordinator: Coordinator | None = None
        self.coordinators: list[Coordinator] = []
        self.coord_eps: list[Any] = []
        self.glob: baselines.GlobalScheduler | None = None
        self.cores: list[NodeCore] = []
        #: the workload the trainers run: under `exclusive` nothing is co-located
        self.workload = cfg.workload
        if cfg.scheduler == "exclusive":
            self.workload = replace(cfg.workload, background_backlog=0)
        hm = cfg.host_model
        self.host = None if hm is None else Host(self.engine, hm, cfg.seed)
        #: the central coordinator's cores' no-thrash settings (the mixed stream: Dask's
        #: queue in priority order, no preemption)
        self.core_preemption = CENTRAL_PREEMPTION if cfg.mixed is not None else None
        t0, c0 = time.perf_counter(), time.process_time()
        with _few_collections():
            if cfg.scheduler == "central" and self.host is None:
                baselines.build_central(self)
            elif cfg.scheduler in CENTRAL:
                # k8s; and central under the host model, which the calibration fitted on
                # the demo's coordinator one message at a time (docs/SIM.md, "Calibration")
                self._build_central()
            else:
                self._build_cores()
            if cfg.mixed is not None:
                self._mixed_lanes()
        self.build_s = time.perf_counter() - t0
        self.build_cpu_s = time.process_time() - c0

    # ---- construction ----------------------------------------------------------------------
    def group_of(self, node: int) -> int:
        """The sync group of `node`'s job (the synthetic workload)."""
        return (
            GROUP if self.job_nodes >= self.cfg.nodes else JOB_GROUP_BASE + node // self.job_nodes
        )

    def members_of(self, group: int) -> frozenset[int]:
        if group < JOB_GROUP_BASE:
            return frozenset(range(self.cfg.nodes))
        j = group - JOB_GROUP_BASE
        return frozenset(range(j * self.job_nodes, min(self.cfg.nodes, (j + 1) * self.job_nodes)))

    def node_groups(self, node: int) -> list[int]:
        """The groups `node` is a member of."""
        return self.groups if self.rep is not None else [self.group_of(node)]

    def _build_cores(self) -> None:
        cfg, topo, eng = self.cfg, self.topo, self.engine
        n = cfg.nodes
        self.nodes: list[CoreNode] = []
        mesh = {j: topo.domain(j) for j in range(n)} if cfg.full_mesh else {}
        two_level = cfg.scheduler == "two-level"
        if two_level:
            self.glob = baselines.GlobalScheduler(eng, PRESETS["tcp"], cfg.two_level_global_ns)
        host = self.host
        node_of = CoreNode if host is None else host.node
        shaped = Shaped if host is None else HostShaped
        for i in range(n):
            # the core knows the nodes it holds lanes to (the whole cluster in one leaf)
            known = mesh if cfg.full_mesh else {j: topo.domain(j) for j in (i, *topo.neighbours(i))}
            core = make_core(
                i,
                known,
                slots=self.slots,
                now=0,
                heartbeat_ns=cfg.heartbeat_ms * MS,
                dead_after_ns=cfg.dead_after_ms * MS,
                sync_cost_ns=int(cfg.workload.sync_ms * MS),
                topology=None if cfg.full_mesh else topo,
                seed=cfg.seed,
                events=cfg.events,
            )
            node: CoreNode
            if self.glob is not None:
                node = baselines.TwoLevelNode(
                    eng,
                    self.net,
                    i,
                    core,
                    cfg.links.cpu_ns,
                    self.ledger,
                    self.glob,
                    cfg.two_level_task_ns,
                    cfg.two_level_delay_ns,
                )
                self.glob.nodes.append(node)
                node.start_reports(i * cfg.two_level_report_ns // n, cfg.two_level_report_ns)
            else:
                node = node_of(eng, self.net, i, core, cfg.links.cpu_ns, self.ledger)
            backend = shaped(
                node,
                i,
                self.factors[i],
                cfg.scheduler in ONE_PRIORITY,
                self.ledger,
                node.ep,
                self.group_of(i),
            )
            node.trainer = self._trainer(i, backend)
            if cfg.harvest or cfg.scheduler == "timeslice":
                h = NodeHarvest(
                    node.trainer,
                    backend,
                    self.slots,
                    preempt_ns=round(cfg.device_preempt_us * 1000),
                    timeslice=cfg.interference if cfg.scheduler == "timeslice" else None,
                    free_syncs=self.rep is not None,
                )
                node.harvest = backend.harvest = h
                self.harvests.append(h)
            self.trainers.append(node.trainer)
            self.nodes.append(node)
            self.cores.append(core)
        self.net.lanes = {node.me: node.core.links for node in self.nodes}
        members = {g: self.members_of(g) for g in self.groups}
        for node in self.nodes:
            node.do(node.core.open(0))
            for g in self.node_groups(node.me):
                node.do(node.core.define_group(g, members[g], 0))

    def _build_central(self) -> None:
        cfg, eng, net = self.cfg, self.engine, self.net
        n = cfg.nodes
        me = n  # the coordinator: one more host, in the first leaf
        eps: dict[int, Endpoint] = {}
        net.beside[me] = 0
        host = self.host
        endpoint = Endpoint if host is None else host.endpoint
        sim_loop = SimLoop if host is None else HostSimLoop
        coord_loop = sim_loop(eng, net, me, lambda: eps[me])
        k8s = cfg.scheduler == "k8s"
        if k8s:
            coord_loop.send_cost_ns = int(1e9 / cfg.k8s_pods_per_s)
        coord = Coordinator(
            coord_loop,  # type: ignore[arg-type]
            dict.fromkeys(range(n), self.slots),
            group=GROUP,
            sync_cost_ns=int(cfg.workload.sync_ms * MS),
            starvation_us=1_000_000,
            aging_us=100_000,
            events=cfg.events,
        )
        for g in self.groups:  # several jobs, or a trace's gradient buckets
            if g != GROUP:
                coord.define_group(g, self.members_of(g))
        self.coordinator = coord
        self.cores = list(coord.cores.values())
        call = cfg.central_call_ns
        sync_calls = coord.sync_calls

        def cost(m: _wire.Message) -> int:
            # one call into one node core per message; a SYNC_READY is counted (one call),
            # and the last of a step releases it on every member's core (one call each)
            return call * (sync_calls(m.id, m.arg0, m.arg2) if m.kind == _SYNC else 1)

        period = int(cfg.k8s_period_ms * MS) if k8s else 0
        eps[me] = endpoint(eng, me, call, coord.on_message, period_ns=period, cost=cost)
        net.endpoints[me] = eps[me]
        self._coord_node = me
        self._build_executors(eps, [me] * n)

    def _build_executors(self, eps: dict[int, Endpoint], coordinator_of: list[int]) -> None:
        """Every node as the demo's `Executor` of its coordinator (`coordinator_of[i]`):
        its loop, endpoint and trainer (the central and k8s baselines; the host model's
        classes when it is on)."""
        cfg, eng, net, host = self.cfg, self.engine, self.net, self.host
        endpoint = Endpoint if host is None else host.endpoint
        sim_loop = SimLoop if host is None else HostSimLoop
        shaped = Shaped if host is None else HostShaped
        self.executors: list[Executor] = []
        for i in range(cfg.nodes):
            loop = sim_loop(eng, net, i, lambda i=i: eps[i])  # type: ignore[misc]
            ex = Executor(loop, i, coordinator_of[i])  # type: ignore[arg-type]
            eps[i] = endpoint(eng, i, cfg.links.cpu_ns, ex.on_message)
            net.endpoints[i] = eps[i]
            backend = shaped(ex, i, self.factors[i], False, self.ledger, eps[i], self.group_of(i))
            tr = self._trainer(i, backend)
            ex.trainer = tr
            self.trainers.append(tr)
            self.executors.append(ex)
        self._eps = eps

    def _mixed_lanes(self) -> None:
        """The mixed stream's drivers and workers: on the node cores (rdmasched, fifo)
        clients of their node's daemon over shm lanes; under two-level no task spills (every
        node is kept full by its own driver), and with `reserve` the critical tasks get a
        worker of their own (rdmasched/sim/mixed.py)."""
        cfg = self.cfg
        assert cfg.mixed is not None
        if cfg.scheduler in ("rdmasched", "fifo"):
            lat = PRESETS["shm"].levels[0].latency_ns
            for node in self.nodes:
                tr = node.trainer
                assert isinstance(tr, MixedTrainer)
                tr.client, tr.ep = (lat, cfg.links.cpu_ns), node.ep
        elif self.glob is not None:
            for node in self.nodes:
                assert isinstance(node, baselines.TwoLevelNode)
                node.spills = False
                if cfg.mixed.reserve:
                    assert isinstance(node.trainer, MixedTrainer)
                    node.trainer.reserved = node

    def _trainer(self, i: int, backend: Shaped) -> SimTrainer:
        cfg, w = self.cfg, self.workload
        if cfg.mixed is not None:
            return MixedTrainer(i, cfg.slots, w, backend, self.ledger, cfg.mixed, cfg.seed)
        if cfg.pipeline is not None:
            return PipelineTrainer(
                i, cfg.slots, w, backend, self.ledger, cfg.pipeline, self.trainers, self._hop_ns
            )
        if self.rep is None:
            return SimTrainer(i, cfg.slots, w, backend, self.ledger)
        assert self.replay is not None
        # with co-located work the core's slot is the device: its kernels and the work
        trainer = (
            DeviceTraceTrainer
            if self.cfg.harvest or self.cfg.scheduler == "timeslice"
            else TraceTrainer
        )
        return trainer(i, self.slots, w, backend, self.ledger, self.rep, self.sync_ns, self.replay)

    def _endpoint(self, i: int) -> Endpoint:
        return self.net.endpoints[i]

    def _hop_ns(self, a: int, b: int) -> int:
        """A pipeline's activations from node `a` to node `b`: the link model's level."""
        links = self.cfg.links
        lv = links.levels[links.level(self.topo, a, b)]
        mb = self.cfg.pipeline.activation_mb if self.cfg.pipeline is not None else 0.0
        return int(lv.latency_ns + mb * 1e6 / lv.bandwidth * 1e9)

    # ---- running ---------------------------------------------------------------------------
    def _kill(self, count: int) -> None:
        live = [i for i in range(self.cfg.nodes) if self.alive[i]]
        for i in sorted(self.rng.sample(live, min(count, len(live)))):
            self.alive[i] = False
            self._endpoint(i).alive = False
            self.killed.append(i)

    def run(self) -> dict[str, Any]:
        cfg, eng = self.cfg, self.engine
        for count, at in cfg.kill:
            eng.at(int(at * MS), self._kill, count)
        for tr in self.trainers:
            eng.at(0, tr.begin)
        stall_ms = cfg.stall_window_ms()
        stall = int(stall_ms * MS)
        trainers = self.trainers
        alive = self.alive

        ledger = self.ledger

        def progress() -> int:  # compute and sync tasks done: a slow step is not a stall
            return ledger.progress

        limit = cfg.wall_limit_s
        wall0, cpu0 = time.perf_counter(), time.process_time()
        self.stopped: str | None = None

        # trainers[:first[0]] are done or dead (both for good): each is looked at once
        # while it is not, so asking costs O(1) per call and O(N) per run, not O(N) per call
        first = [0]

        def done() -> bool:
            if limit and time.perf_counter() - wall0 > limit:
                self.stopped = f"stopped at the wall-clock limit of {limit:g} s"
                return True
            k, n = first[0], len(trainers)
            while k < n and (trainers[k].done or not alive[trainers[k].node]):
                k += 1
            first[0] = k
            return k == n

        finished = False
        last, last_t = -1, 0
        horizon = stall
        # run in slices of virtual time; stop when done or nothing moved for `stall`
        with _few_collections():
            while True:
                finished = eng.run(done, horizon)
                if finished or eng.next_at() is None:
                    break
                p = progress()
                if p != last:
                    last, last_t = p, eng.now
                elif eng.now - last_t >= stall:
                    self.stopped = (
                        f"stalled: no compute or sync task done for {stall_ms:g} "
                        "virtual ms (--stall-ms)"
                    )
                    break
                horizon = eng.now + stall // 4 + 1
        wall = time.perf_counter() - wall0
        self.cpu_s = time.process_time() - cpu0
        if self.stopped is None and not finished:
            self.stopped = "no events left"
        out = self.figures(finished and self.stopped is None, wall)
        if cfg.trace_dir is not None:
            out["trace"] = self.write_trace(cfg.trace_dir)
        return out

    def write_trace(self, directory: str) -> str:
        """Every core's decision events, one trace file per node (docs/TELEMETRY.md), in
        `directory`: `rdmasched trace`, `trace export` and `mirror` read it."""
        from rdmasched.telemetry import records

        os.makedirs(directory, exist_ok=True)
        for i, core in enumerate(self.cores):
            path = os.path.join(directory, f"sim-node{i}.jsonl")
            records.write_scheduler(path, i, core.scheduler, clock="sim", source="sim")
        return directory

    # ---- figures ---------------------------------------------------------------------------
    def figures(self, finished: bool, wall_s: float) -> dict[str, Any]:
        cfg, led = self.cfg, self.ledger
        n = cfg.nodes
        live = [t for t in self.trainers if self.alive[t.node]]
        figs = [t.figures() for t in live]
        steps_done = min((f["steps"] for f in figs), default=0)
        span_ns = max((t.t_end or self.engine.now) for t in live) if live else self.engine.now
        step_times = [f["step_time_ms"] for f in figs if f["step_time_ms"] is not None]
        decisions = sum(c.scheduler.stats().decisions for c in self.cores)
        rejected = sum(sum(c.rejected.values()) for c in self.cores)
        sample = sorted(self.rng.sample(range(n), min(n, 64)))
        steps_for_msgs = max(1, steps_done)
        out: dict[str, Any] = {
            "scheduler": cfg.scheduler,
            "nodes": n,
            "finished": finished,
            "stopped": None if finished else self.stopped,
            "steps": steps_done,
            "killed": self.killed,
            "job_nodes": self.job_nodes,
            "virtual_s": span_ns / 1e9,
            "slot_idle_pct": sum(f["slot_idle_pct"] for f in figs) / len(figs) if figs else None,
            "step_time_ms": sum(step_times) / len(step_times) if step_times else None,
            "steps_per_s": steps_done / (span_ns / 1e9) if span_ns and steps_done else 0.0,
            "sync_release_p50_us": _pct(led.release_lat_ns, 0.5),
            "sync_release_p99_us": _pct(led.release_lat_ns, 0.99),
            "msgs": self.net.sent,
            "msgs_by_kind": self.net.counts(),
            "msgs_per_node_per_step": self.net.sent / n / steps_for_msgs,
            "lane_writes": self.net.writes,
            "relays_by_kind": self.net.relay_counts(),
            "lane_writes_per_node_per_step": self.net.writes / n / steps_for_msgs,
            "decisions_per_node_per_s": decisions / n / (span_ns / 1e9) if span_ns else 0.0,
            "preemptions": sum(f["preemptions"] for f in figs),
            **device_figures(figs),
            "rejected": rejected,
            **lanes_per_node(self.topo, cfg.scheduler, sample, cfg.full_mesh),
            "events": self.engine.events,
            "build_s": round(self.build_s, 3),
            "wall_s": round(wall_s, 3),
            "events_per_s": round(self.engine.events / wall_s) if wall_s > 0 else None,
            # CPU time of this process: on a shared machine, the simulator's own speed
            "build_cpu_s": round(self.build_cpu_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "events_per_cpu_s": round(self.engine.events / self.cpu_s) if self.cpu_s > 0 else None,
        }
        out["background_tasks_done"] = led.background
        out["background_tasks_per_node_per_s"] = (
            led.background / n / (span_ns / 1e9) if span_ns else 0.0
        )
        if cfg.scheduler == "central":
            out |= baselines.central_figures(self)
        elif self.coordinator is not None:
            out["coordinator_msgs"] = self._eps[self._coord_node].handled
        if cfg.pipeline is not None:
            out |= pipeline_figures(live, cfg.pipeline)
        if cfg.mixed is not None:
            out |= mixed_figures([t for t in live if isinstance(t, MixedTrainer)], self.slots)
        if self.harvests:
            hs = [h for h in self.harvests if self.alive[h.trainer.node]]
            spans = [(h.trainer.t_end or self.engine.now) - h.trainer.t0 for h in hs]
            out["device_preempt_us"] = cfg.device_preempt_us
            if cfg.scheduler == "timeslice":
                out["interference"] = cfg.interference
            if "device_idle_pct" in out:  # a trace's, every stream (HTA's): kept beside
                out["trace_device_idle_pct"] = out["device_idle_pct"]
            out |= harvest_figures(hs, spans)
        if cfg.scheduler == "exclusive":
            jobs = -(-n // self.job_nodes)
            out |= baselines.admission(jobs, self.job_nodes, cfg.k8s_pods_per_s)
        if self.glob is not None:
            out |= baselines.two_level_figures(self)
        if self.host is not None:
            out["host_model"] = self.host.figures(span_ns)
        return out


_SYNC = int(Kind.SYNC_READY)


def _pod(cfg: SimConfig, n: int) -> int:
    leaf = min(cfg.leaf, n)
    pod = max(leaf, cfg.pod - cfg.pod % leaf)
    return pod


def simulate(cfg: SimConfig) -> dict[str, Any]:
    if cfg.jobs is not None:
        cfg.check()
        with _few_collections():
            return simulate_jobs(cfg)
    return Run(cfg).run()


def measure_central_call_ns(nodes: int = 16, steps: int = 20, slots: int = 4) -> int:
    """The real coordinator's CPU time per call into one of its node cores on this machine
    (its node cores compiled as the build has them), ns: it is fed real messages (tasks
    submitted, completed, SYNC_READYs) for `steps` steps of `nodes` nodes, its process CPU
    time taken, and divided by the calls it made (one per DISPATCH or COMPLETE, one per
    SYNC_READY, and one per node for the last SYNC_READY of a step: the members' cores
    each start the sync, which the simulated coordinator is charged as one broadcast). The
    median of three rounds. `rdmasched sim --measure` runs it; the default is the recorded
    figure, costs.CENTRAL_CALL."""
    return sorted(_time_coordinator(nodes, steps, slots) for _ in range(3))[1]


def _time_coordinator(nodes: int, steps: int, slots: int) -> int:
    eng = Engine()
    net = Network(eng, PRESETS["shm"], None)
    me = nodes
    eps: dict[int, Endpoint] = {}
    loop = SimLoop(eng, net, me, lambda: eps[me])
    coord = Coordinator(
        loop,  # type: ignore[arg-type]
        dict.fromkeys(range(nodes), slots),
        group=GROUP,
        sync_cost_ns=MS,
        starvation_us=1_000_000,
        aging_us=100_000,
        events=0,
    )
    eps[me] = Endpoint(eng, me, 0, coord.on_message)
    coded = net._coded
    msgs: list[tuple[_wire.Message, int]] = []
    calls = 0
    seq = 0
    for step in range(steps):
        for node in range(nodes):
            ids = []
            for _ in range(slots):
                seq += 1
                ids.append(seq)
                d = Dispatch(seq, 1, 100, 4 * MS, 0, node)
                msgs.append((coded(node, 0, d, me)[0], node))
            for tid in ids:
                msgs.append((coded(node, 0, Complete(tid, 1, 4 * MS, 0), me)[0], node))
            calls += 2 * slots
        for node in range(nodes):
            ready = SyncReady(GROUP, step, node, sent_ns=0, job=GROUP)
            msgs.append((coded(node, 0, ready, me)[0], node))
            calls += 1  # counted
        calls += nodes  # the last one released the step on every member's core
        for node in range(nodes):
            sid = (1 << 63) | (GROUP << 32) | step
            msgs.append((coded(node, 0, Complete(sid, GROUP, MS, 0), me)[0], node))
            calls += 1
    net.endpoints.clear()  # the orders it sends go nowhere
    on = coord.on_message
    t0 = time.process_time_ns()  # CPU time: another process's load is not counted
    for m, peer in msgs:
        eng.now += 1000
        on(m, peer)
    dt = time.process_time_ns() - t0
    if coord.rejected:
        raise AssertionError(f"the coordinator refused {coord.rejected} inputs while timed")
    return max(1, dt // calls)
