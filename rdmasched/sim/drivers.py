"""Drivers: the real decision code on the simulator's clock.

- `CoreNode`: one node under rdmasched (or "fifo"): the real `NodeCore`, its effects carried
  out as the threaded `Node` carries them out (rdmasched/daemon/node.py, `_do`).
- the central baseline (`Run._build_central`): the demo's central coordinator
  (`rdmasched.demo.central.Coordinator`, the same object, one `NodeCore` per node inside)
  and its `Executor`s, each on a small loop shim (`SimLoop`) over the simulator's network.
  The "k8s" baseline is the same code with a batch scheduler's costs: a scheduling decision
  takes 1/throughput, and messages are taken in at the scheduler's cycle.

The workload is the demo's `Trainer` (rdmasched/demo/job.py), unchanged, behind a
backend that counts what conservation tests check and applies the node's slowdown.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from rdmasched import _wire
from rdmasched.daemon.core import (
    CompleteNotice,
    Effect,
    MarkDead,
    NodeCore,
    PreemptTask,
    Relay,
    Revive,
    RunSync,
    Send,
    SetLoad,
    SetTimer,
    Start,
    Wake,
)
from rdmasched.demo.job import GROUP, Trainer, WorkloadConfig
from rdmasched.demo.taskid import KIND_BACKGROUND, task_kind
from rdmasched.messages import Heartbeat
from rdmasched.scheduler import Task
from rdmasched.sim.engine import Endpoint, Engine, Network
from rdmasched.sim.tally import Completions
from rdmasched.topology import Topology

if TYPE_CHECKING:
    from rdmasched.sim.harvest import NodeHarvest

#: the one priority every task gets under "fifo" (the scheduler forces 255 on sync tasks)
FIFO_PRIORITY = 100


def make_core(
    me: int,
    nodes: Mapping[int, str],
    *,
    slots: int,
    now: int,
    heartbeat_ns: int,
    dead_after_ns: int,
    sync_cost_ns: int,
    topology: Topology | None,
    seed: int,
    starvation_us: int = 1_000_000,
    aging_us: int | None = 100_000,
    events: int = 0,
) -> NodeCore:
    """The one place the simulator builds a node core (its constructor may grow).
    `seed`: the run's; the core's placement draws (`Scheduler.submit`'s choice of a peer)
    come from a generator seeded from it and the node, so a run is a function of its
    config and seed (left to the core, the generator is seeded by the OS and a run's
    forwards differ between processes: tests/tier1/test_sim_determinism.py).
    `events`: the scheduler's decision-event ring (telemetry, docs/TELEMETRY.md); only
    `rdmasched sim --trace` reads it (SimConfig.events), and the default ring of 4,096 costs
    about 0.5 MB per core (5 GB at 10,000 nodes), so it is off unless asked for."""
    return NodeCore(
        me,
        nodes,
        slots=slots,
        inc=1,
        dead_after_ns=dead_after_ns,
        heartbeat_ns=heartbeat_ns,
        now=now,
        starvation_us=starvation_us,
        aging_us=aging_us,
        sync_cost_ns=sync_cost_ns,
        topology=topology,
        events=events,
        rng=random.Random(f"placement/{seed}/{me}"),
    )


class Ledger:
    """What every node's workload did, for the figures and the conservation checks."""

    def __init__(self, nodes: int) -> None:
        self.submitted = 0
        #: (node, task id) -> completions (`add`; about a byte a task: sim/tally.py)
        self.completed = Completions()
        self.run_starts = 0
        self.run_ends = 0  # finished or preempted
        #: (node, group, step) -> releases of the step's sync on that node
        self.releases: dict[tuple[int, int, int], int] = {}
        #: (group, step) -> when its last member reported ready (ns)
        self.ready_last: dict[tuple[int, int], int] = {}
        self.release_lat_ns: list[int] = []
        self.decisions = 0
        #: compute and sync tasks completed (background churn is not progress)
        self.progress = 0
        #: co-located (background) tasks completed
        self.background = 0

    def release(self, node: int, group: int, step: int, now: int) -> None:
        k = (node, group, step)
        self.releases[k] = self.releases.get(k, 0) + 1
        ready = self.ready_last.get((group, step))
        if ready is not None:
            self.release_lat_ns.append(now - ready)


class SimTrainer(Trainer):
    """The demo's trainer, counting run starts and sync releases in the ledger."""

    def __init__(
        self, node: int, slots: int, cfg: WorkloadConfig, backend: Any, ledger: Ledger
    ) -> None:
        super().__init__(node, slots, cfg, backend)
        self.ledger = ledger

    def on_start(self, task: Task, slot: int) -> None:
        self.ledger.run_starts += 1
        if task.group is not None:
            self.ledger.release(self.node, task.group, task.id & 0xFFFFFFFF, self.b.now())
        super().on_start(task, slot)

    def on_preempt(self, task: Task, slot: int, cancel: bool) -> int:
        self.ledger.run_ends += 1
        return super().on_preempt(task, slot, cancel)


class Shaped:
    """A trainer's backend as the node sees it: costs scaled by the node's slowdown,
    priorities flattened under "fifo", submissions and completions counted. The clock and
    the timers are the engine's: a timer of a node that died meanwhile does nothing."""

    def __init__(
        self,
        inner: Any,
        node: int,
        factor: float,
        fifo: bool,
        ledger: Ledger,
        ep: Endpoint,
        group: int = GROUP,
    ) -> None:
        self.group = group  # the sync group of the node's job
        self.inner = inner
        self.node = node
        self.factor = factor
        self.fifo = fifo
        self.ledger = ledger
        self.ep = ep  # the node's endpoint: is the node alive
        self.engine = ep.engine
        #: the node's devices (rdmasched/sim/harvest.py; None: not watched), and the factor
        #: its timers are stretched by while it starts a task beside co-located work
        self.harvest: NodeHarvest | None = None
        self.dilation = 1.0

    def now(self) -> int:
        return self.engine.now

    def call_later(self, delay_ns: int, fn: Callable[[], None]) -> None:
        engine = self.engine
        if self.dilation != 1.0:
            delay_ns = round(delay_ns * self.dilation)
        engine.at(engine.now + delay_ns, _if_alive, self.ep, fn)

    def submit_local(self, task: Task) -> None:
        self.ledger.submitted += 1
        if self.factor != 1.0:
            task.cost_ns = round(task.cost_ns * self.factor)
        if self.fifo:
            task.priority = FIFO_PRIORITY
        if self.harvest is not None and self.harvest.submitted(task):
            return  # co-located work left to the device's time-slicing (timeslice)
        self.inner.submit_local(task)

    def sync_ready(self, step: int, group: int | None = None) -> None:
        if group is None:
            group = self.group
        now = self.now()
        last = self.ledger.ready_last
        if last.get((group, step), -1) < now:
            last[group, step] = now
        self.inner.sync_ready(step, group)

    def complete(self, task: Task, runtime_ns: int) -> None:
        self.ledger.completed.add(self.node, task.id)
        self.ledger.run_ends += 1
        if task_kind(task.id) != KIND_BACKGROUND:
            self.ledger.progress += 1
        else:
            self.ledger.background += 1
        if self.harvest is not None:
            self.harvest.ended(task)
        self.inner.complete(task, runtime_ns)


class Handlers(Protocol):
    """A node's dispatch and preempt handlers, as `CoreNode` calls them (a `SimTrainer`,
    or another workload's: rdmasched/sim/jobs.py)."""

    def on_start(self, task: Task, slot: int) -> None: ...

    def on_preempt(self, task: Task, slot: int, cancel: bool) -> int: ...


def _if_alive(ep: Endpoint, fn: Callable[[], None]) -> None:
    if ep.alive:
        fn()


class CoreNode:
    """One node under rdmasched: a `NodeCore` driven as the threaded `Node` drives it."""

    def __init__(
        self, engine: Engine, net: Network, me: int, core: NodeCore, cpu_ns: int, ledger: Ledger
    ) -> None:
        self.engine = engine
        self.net = net
        self.me = me
        self.core = core
        self.ledger = ledger
        self.trainer: Handlers | None = None
        self.harvest: NodeHarvest | None = None  # its devices, when watched (harvest.py)
        self.ep = Endpoint(engine, me, cpu_ns, self.on_message)
        net.endpoints[me] = self.ep
        self.load = 0
        self.dead: set[int] = set()

    @property
    def alive(self) -> bool:
        return self.ep.alive

    # ---- backend of the trainer (what `Node`'s API calls do) ---------------------------
    def now(self) -> int:
        return self.engine.now

    def call_later(self, delay_ns: int, fn: Callable[[], None]) -> None:
        self.engine.at(self.engine.now + delay_ns, fn)

    def submit_local(self, task: Task) -> None:
        self.do(self.core.dispatch(task, self.engine.now))

    def submit_gang(self, task: Task, gang: int) -> None:
        """Member `task` of gang `task.job` of `gang` members, submitted here: this node
        coordinates the gang (docs/GANGS.md)."""
        self.do(self.core.submit(task, self.engine.now, gang=gang))

    def sync_ready(self, step: int, group: int = GROUP) -> None:
        self.do(self.core.sync_ready(group, step, self.engine.now))

    def complete(self, task: Task, runtime_ns: int) -> None:
        self.do(self.core.complete(task.id, None, runtime_ns, self.engine.now))

    # ---- inputs --------------------------------------------------------------------------
    def on_message(self, m: _wire.Message, writer: int) -> None:
        """`m` came in on the lane from `writer` (its last hop; `m.src` made it)."""
        self.do(self.core.receive(m, writer, self.engine.now))

    def wake(self) -> None:
        if self.ep.alive:
            self.do(self.core.wake(self.engine.now))

    def tick(self) -> None:
        if self.ep.alive:
            now = self.engine.now
            self.do(self.core.tick(now, now))

    # ---- effects -------------------------------------------------------------------------
    def do(self, effects: list[Effect]) -> None:
        core, trainer, ledger = self.core, self.trainer, self.ledger
        assert trainer is not None
        engine = self.engine
        i = 0
        while i < len(effects):
            e: Any = effects[i]
            i += 1
            t = type(e)
            if t is Send:
                now = engine.now
                busy = self.ep.busy_until
                leave = busy if busy > now else now
                # a run of sends (a heartbeat round, a SYNC_READY down the sync tree): one
                # event per arrival time. `peer` is the next hop (a link), `dst` the
                # destination.
                j = i
                fx: list[Any] = effects
                while j < len(fx) and type(fx[j]) is Send:
                    j += 1
                if j == i:
                    if e.peer not in self.dead or type(e.message) is Heartbeat:
                        self.net.send(self.me, e.peer, e.message, self.load, leave, e.dst)
                    continue
                self.net.send_run(self.me, fx[i - 1 : j], self.load, leave, self.dead)
                i = j
            elif t is Relay:
                # a received message for another node, on to the next hop (not to a peer
                # declared dead: the threaded Node's loop drops it, heartbeats too)
                if e.peer not in self.dead:
                    now = engine.now
                    busy = self.ep.busy_until
                    self.net.relay(
                        self.me, e.peer, e.message, self.load, busy if busy > now else now
                    )
            elif t is Start:
                ledger.decisions += 1
                if self.harvest is None:
                    trainer.on_start(e.task, e.slot)
                else:
                    self.harvest.start(e.task, e.slot)
            elif t is PreemptTask:
                ledger.decisions += 1
                if self.harvest is None:
                    progress = trainer.on_preempt(e.victim, e.slot, e.cancel)
                else:
                    progress = self.harvest.preempt(e.victim, e.slot, e.cancel)
                effects[i:i] = core.preempted(e.victim, progress, engine.now)
            elif t is RunSync:
                ledger.decisions += 1
                if self.harvest is None:  # LATER: the trainer completes it
                    trainer.on_start(e.task, e.slot)
                else:
                    self.harvest.start(e.task, e.slot)
            elif t is SetLoad:
                self.load = e.load
            elif t is SetTimer:
                engine.at(e.at_ns, self.tick)
            elif t is Wake:  # (only with a run quantum or a preemption budget set)
                engine.at(e.at_ns, self.wake)
            elif t is MarkDead:
                self.dead.add(e.peer)
            elif t is Revive:
                self.dead.discard(e.peer)
            elif t is CompleteNotice:
                pass
            else:
                raise AssertionError(f"unknown effect {e!r}")


class SimLoop:
    """What `Coordinator` and `Executor` use of a `Loop`: a clock, timers, sending."""

    def __init__(self, engine: Engine, net: Network, me: int, ep_of: Callable[[], Endpoint]):
        self.engine = engine
        self.net = net
        self.me = me
        self._ep = ep_of
        #: CPU time each message sent costs the sender (a batch scheduler's decision)
        self.send_cost_ns = 0
        self.clock: Callable[[], int] = lambda: engine.now

    def call_later(self, delay_ns: int, fn: Callable[[], None]) -> None:
        self.engine.at(self.engine.now + delay_ns, fn)

    def send(self, dst: int, *out: Any) -> None:  # out: an encoded message (Outgoing)
        ep = self._ep()
        now = self.engine.now
        leave = ep.busy_until if ep.busy_until > now else now
        if self.send_cost_ns:
            leave += self.send_cost_ns
            ep.busy_until = leave
        self.net.send(self.me, dst, out, 0, leave)
