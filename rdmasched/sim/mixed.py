"""A mixed stream of fine-grained tasks: many short low-priority ones, and now and then a
latency-critical one that must start at once (RL post-training, agent serving).

The shape is `rdmasched bench peers`' workload d (docs/BENCH.md, "Peers"), per node: the
node's driver keeps `inflight` low-priority tasks of about `low_ms` each in flight (rollouts,
scoring, tool calls; a new one as each completes), and every `critical_every_ms` it submits
one latency-critical task of `critical_cost_ms` (a policy update's sync, a user-facing
request), one at a time: the next is due a period after the last was due, or when the last
completed if that is later (bench peers' pacing). A node's K slots are its K workers (GPUs).
One driver per node, not one per cluster: a task runs on the node whose driver submitted it
(rdmasched runs a task on its submitter's host, docs/CLIENT.md), so each node is the one
host of bench peers' real run, and the cluster is N of them side by side.

`MixedTrainer` is the node's workload, a `SimTrainer` as the other workloads' (the demo's
`Trainer` with its run and slot accounting): the low-priority tasks go through the
trainer's background path (`_submit_background`, priority 10), the critical ones are
compute tasks at priority 200 (bench peers' `HIGH`). Under each scheduler the same tasks:

- **rdmasched**: the node cores (`drivers.make_core`) with priorities; a critical task that
  finds every slot busy preempts a low-priority one. The driver is a client of the node's
  daemon over the `shm` link model: each submission reaches the core after one lane
  latency and the daemon's `cpu_ns` per message; each start reaches the worker one latency
  and one `cpu_ns` after the decision, and a start that preempted waits first for the
  victim's yield (PREEMPT to the victim's worker, its answer back, the daemon's handling:
  two more latencies and one more `cpu_ns`). The preempted task's progress is **lost** by
  default (`preempted="restart"`: a rollout restarts; the work it had done is counted in
  `work_lost_slot_s`), or kept (`"keep"`: bench peers' real client returns its progress,
  and the calibration runs so).
- **fifo**: the same cores, one priority (`Shaped`): the critical task waits in line.
- **two-level** (Ray): `baselines.TwoLevelNode`: every submission takes Ray's measured turn
  through the local scheduler and its start latency, one priority, no preemption. Here no
  task spills to the global scheduler (`TwoLevelNode.spills` off): every node is kept full
  by its own driver, and Ray's default (hybrid) policy queues a task at its own raylet when
  no node has the resources free. With `reserve` the critical tasks run on a worker kept for
  them (Ray's custom resource, as bench peers sets Ray up): their turn through the local
  scheduler and Ray's start latency, then at once on that worker, beside the K slots.
- **central** (Dask): the per-task coordinator (`baselines.build_central`); its cores order
  the queue by priority and never preempt (`CENTRAL_PREEMPTION`: Dask's `priority=` orders
  its queue; Dask has no preemption).

Figures (`mixed_figures`, over the window from `warmup_ms` to the end): the critical tasks'
submit -> start latency (p50, p99, p99.9, max; a critical task not started by the end
counts with its wait so far, and `critical_censored` says how many did), the low-priority
tasks completed per node per second, the slot idle %, preemptions and the work they lost.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rdmasched.demo.job import BACKGROUND_PRIORITY, WorkloadConfig
from rdmasched.demo.taskid import KIND_BACKGROUND, KIND_COMPUTE, task_id, task_kind
from rdmasched.errors import ArgumentError
from rdmasched.scheduler import Task
from rdmasched.sim.drivers import Ledger, SimTrainer
from rdmasched.sim.linkmodel import PRESETS
from rdmasched.sim.table import cell, stopped_note, text_table

if TYPE_CHECKING:
    from rdmasched.sim.run import SimConfig

#: the schedulers the mixed stream runs under (docs/SIM.md, "Mixed priorities")
MIXED_SCHEDULERS = ("rdmasched", "fifo", "two-level", "central")
#: the critical tasks' priority, and the low-priority tasks' (bench peers: 200 against 0)
CRITICAL_PRIORITY = 200
LOW_PRIORITY = BACKGROUND_PRIORITY
#: what a preempted low-priority task keeps: its progress ("keep") or nothing ("restart")
PREEMPTED = ("restart", "keep")
#: the central coordinator's cores under the mixed stream (Dask): the queue in priority
#: order, no preemption (no task's budget lets it be preempted below priority 255)
CENTRAL_PREEMPTION = {"task_budget": 0, "critical_priority": 255}
MS = 1_000_000


@dataclass(frozen=True)
class MixedConfig:
    #: virtual time the stream runs, and the start of the measured window, ms
    duration_ms: float = 1000.0
    warmup_ms: float = 50.0
    #: low-priority tasks: lognormal length, median `low_ms`, shape `low_sigma` (0: all
    #: `low_ms`, bench peers' d); `inflight` of them kept in flight per node
    low_ms: float = 5.0
    low_sigma: float = 0.0
    inflight: int = 32
    #: a critical task every `critical_every_ms`, each `critical_cost_ms` long
    critical_every_ms: float = 20.0
    critical_cost_ms: float = 1.0
    preempted: str = "restart"
    #: two-level: the critical tasks on a worker kept for them (Ray's custom resource)
    reserve: bool = False

    def check(self) -> None:
        def pos(name: str, v: float) -> None:
            if not (math.isfinite(v) and v > 0):
                raise ArgumentError(f"--mixed: {name} must be > 0 ms, not {v}")

        pos("the duration (--mixed-ms)", self.duration_ms)
        pos("the low-priority task (--mixed-low-ms)", self.low_ms)
        pos("the critical period (--mixed-critical-ms)", self.critical_every_ms)
        pos("the critical task (--mixed-critical-cost-ms)", self.critical_cost_ms)
        if not (math.isfinite(self.warmup_ms) and 0 <= self.warmup_ms < self.duration_ms):
            raise ArgumentError(
                f"--mixed-warmup-ms {self.warmup_ms}: must be >= 0 and below the duration "
                f"(--mixed-ms {self.duration_ms:g})"
            )
        if not (math.isfinite(self.low_sigma) and self.low_sigma >= 0):
            raise ArgumentError(f"--mixed-low-sigma must be >= 0, not {self.low_sigma}")
        if self.inflight < 1:
            raise ArgumentError(f"--mixed-inflight must be >= 1, not {self.inflight}")
        if self.preempted not in PREEMPTED:
            raise ArgumentError(
                f"--mixed-preempted {self.preempted!r}: one of {', '.join(PREEMPTED)}"
            )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class MixedTrainer(SimTrainer):
    """One node's driver and workers: the low-priority stream and the critical tasks."""

    def __init__(
        self,
        node: int,
        slots: int,
        w: WorkloadConfig,
        backend: Any,
        ledger: Ledger,
        m: MixedConfig,
        seed: int,
    ) -> None:
        super().__init__(node, slots, w, backend, ledger)
        self.m = m
        #: the node's own draws (lengths, the critical tasks' phase), from the run's seed
        self.rng = random.Random(seed * 1000 + node)
        self.end_ns = round(m.duration_ms * MS)
        self.warm_ns = round(m.warmup_ms * MS)
        self.period_ns = round(m.critical_every_ms * MS)
        self.crit_ns = round(m.critical_cost_ms * MS)
        #: (lane latency, the daemon's CPU per message) of the driver's and workers' client
        #: lanes to the node core (rdmasched, fifo); None: the scheduler's own costs apply
        self.client: tuple[int, int] | None = None
        #: the node's daemon thread (its endpoint): the client's messages take its time
        self.ep: Any = None
        #: two-level with `reserve`: the node whose local scheduler gives the kept worker
        self.reserved: Any = None
        self.reserved_busy_ns = 0
        #: task id -> when the driver submitted it (critical tasks), and their latencies
        self.crit_submit: dict[int, int] = {}
        self.crit_lat: list[int] = []
        self.crit_started: set[int] = set()
        self.crit_due = 0
        self.crit_submitted = 0
        self.crit_done = 0
        self.low_submitted = 0
        self.low_done = 0
        self.low_done_window = 0
        self.crit_done_window = 0
        self.submitted_ids: list[int] = []
        self.done_ids: list[int] = []
        self.lost_ns = 0
        self.preempt_window = 0
        self._preempt_at = -1
        self._busy_warm: int | None = None
        #: submissions on their way to the core (the client lane)
        self.in_transit: set[int] = set()

    # ---- driving -------------------------------------------------------------------------
    def begin(self) -> None:
        self.t0 = self.b.now()
        for _ in range(self.m.inflight):
            self._submit_background()
        # the first critical task within a period after the warm-up, at a phase of the
        # node's own (the nodes' drivers are not in step)
        self.crit_due = self.t0 + self.warm_ns + int(self.rng.random() * self.period_ns)
        self.b.call_later(self.crit_due - self.t0, self._critical)
        self.b.call_later(self.warm_ns, self._warm)
        self.b.call_later(self.end_ns, self._stop)

    def _submit_background(self) -> None:
        """The low-priority stream: the trainer's background path (one task, priority 10),
        its length drawn from the stream's distribution."""
        m = self.m
        cost = m.low_ms if m.low_sigma == 0 else m.low_ms * self.rng.lognormvariate(0, m.low_sigma)
        self.seq += 1
        self.low_submitted += 1
        tid = task_id(KIND_BACKGROUND, self.node, self.seq)
        self._submit(Task(tid, 2, LOW_PRIORITY, max(1, round(cost * MS)), origin=self.node))

    def _critical(self) -> None:
        if self.done:
            return
        self.seq += 1
        tid = task_id(KIND_COMPUTE, self.node, self.seq)
        now = self.b.now()
        self.crit_submit[tid] = now
        self.crit_submitted += 1
        task = Task(tid, 1, CRITICAL_PRIORITY, self.crit_ns, origin=self.node)
        if self.reserved is not None:
            self._submit_reserved(task)
        else:
            self._submit(task)

    def _submit(self, task: Task) -> None:
        self.submitted_ids.append(task.id)
        if self.client is None:
            self.b.submit_local(task)
            return
        lat, cpu = self.client
        now = self.b.now()
        ep = self.ep
        handled = max(now + lat, ep.busy_until)
        ep.busy_until = handled + cpu
        self.in_transit.add(task.id)
        self.b.call_later(handled - now, lambda: self._arrived(task))

    def _arrived(self, task: Task) -> None:
        self.in_transit.discard(task.id)
        self.b.submit_local(task)

    def _warm(self) -> None:
        now = self.b.now()
        self._busy_warm = self.busy_ns + sum(now - t for t in self.started_at.values())

    def _stop(self) -> None:
        now = self.b.now()
        self.done = True
        self.t_end = now
        self._final_busy = self.busy_ns + sum(now - t for t in self.started_at.values())

    # ---- handlers ------------------------------------------------------------------------
    def on_start(self, task: Task, slot: int) -> None:
        now = self.b.now()
        handoff = 0
        if self.client is not None:
            lat, cpu = self.client
            handoff = lat + cpu
            if self._preempt_at == now:  # the victim's yield first: to it, back, handled
                handoff += 2 * lat + cpu
        if not handoff:
            self._started(task, slot)
            return
        token = self.run_token.get(task.id, 0) + 1
        self.run_token[task.id] = token
        self.b.call_later(handoff, lambda: self._handed(task, slot, token))

    def _handed(self, task: Task, slot: int, token: int) -> None:
        if self.run_token.get(task.id) == token:  # not preempted on its way
            self._started(task, slot)

    def _started(self, task: Task, slot: int) -> None:
        sub = self.crit_submit.get(task.id)
        if sub is not None and task.id not in self.crit_started:
            self.crit_started.add(task.id)
            if sub >= self.t0 + self.warm_ns:
                self.crit_lat.append(self.b.now() - sub)
        super().on_start(task, slot)

    def on_preempt(self, task: Task, slot: int, cancel: bool) -> int:
        now = self.b.now()
        self._preempt_at = now
        progress = super().on_preempt(task, slot, cancel)
        if now >= self.t0 + self.warm_ns and not self.done:
            self.preempt_window += 1
        if self.m.preempted == "keep":
            return progress
        if not self.done:
            self.lost_ns += progress
        return 0  # a rollout restarts: its work so far is lost

    def _finish(self, task: Task, token: int) -> None:
        ended = self._end_run(task, token)
        if ended is None:
            return  # preempted meanwhile
        now, _ = ended
        self._done(task, now)

    def _done(self, task: Task, now: int) -> None:
        self.done_ids.append(task.id)
        in_window = self.t0 + self.warm_ns <= now and not self.done
        if task_kind(task.id) == KIND_BACKGROUND:
            self.low_done += 1
            if in_window:
                self.low_done_window += 1
            if not self.done:
                self._submit_background()
            return
        self.crit_done += 1
        if in_window:
            self.crit_done_window += 1
        self.crit_submit.pop(task.id, None)
        self.crit_due += self.period_ns
        if not self.done:
            self.b.call_later(max(0, self.crit_due - now), self._critical)

    # ---- two-level, `reserve`: the worker kept for critical tasks --------------------------
    def _submit_reserved(self, task: Task) -> None:
        """Ray's custom resource: the critical task takes its turn through the node's local
        scheduler (Ray's cost per task) and its start latency, and then runs at once on the
        worker kept for it, which the core's slots never hold."""
        node = self.reserved
        self.submitted_ids.append(task.id)
        self.ledger.submitted += 1
        now = self.b.now()
        t = max(node.local_free_at, now) + node.task_ns
        node.local_free_at = t
        self.b.call_later(t + node.delay_ns - now, lambda: self._reserved_start(task))

    def _reserved_start(self, task: Task) -> None:
        now = self.b.now()
        sub = self.crit_submit[task.id]
        self.crit_started.add(task.id)
        if sub >= self.t0 + self.warm_ns:
            self.crit_lat.append(now - sub)
        self.ledger.run_starts += 1
        self.b.call_later(task.cost_ns, lambda: self._reserved_end(task, now))

    def _reserved_end(self, task: Task, began: int) -> None:
        now = self.b.now()
        end = self.t_end if self.done else now
        self.reserved_busy_ns += max(0, end - max(began, self.t0 + self.warm_ns))
        self.ledger.completed.add(self.node, task.id)
        self.ledger.run_ends += 1
        self.ledger.progress += 1
        self._done(task, now)

    # ---- figures -------------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        out = super().figures()
        end = self.t_end or self.b.now()
        busy = self._final_busy
        if busy is None:
            busy = self.busy_ns + sum(end - t for t in self.started_at.values())
        warm = self._busy_warm or 0
        span = max(1, end - (self.t0 + self.warm_ns))
        out["slot_idle_pct"] = 100.0 * (1 - (busy - warm) / (self.slots * span))
        out["window_s"] = span / 1e9
        return out

    def unstarted_critical(self, end: int) -> list[int]:
        """The waits so far of critical tasks submitted in the window, not started by
        `end`."""
        warm = self.t0 + self.warm_ns
        return [
            end - s
            for tid, s in self.crit_submit.items()
            if tid not in self.crit_started and s >= warm
        ]


def _pct(s: list[int], q: float) -> float | None:
    if not s:
        return None
    return s[min(len(s) - 1, int(q * len(s)))] / 1e3


def mixed_figures(trainers: list[MixedTrainer], slots: int) -> dict[str, Any]:
    """The cluster's mixed-stream figures, over the live nodes' trainers."""
    if not trainers:
        return {}
    lat: list[int] = []
    censored = 0
    for t in trainers:
        lat += t.crit_lat
        waits = t.unstarted_critical(t.t_end or t.b.now())
        censored += len(waits)
        lat += waits
    lat.sort()
    n = len(trainers)
    window = sum(t.figures()["window_s"] for t in trainers) / n
    low = sum(t.low_done_window for t in trainers)
    crit = sum(t.crit_done_window for t in trainers)
    lost = sum(t.lost_ns for t in trainers)
    slot_s = n * slots * window
    out: dict[str, Any] = {
        "workload": "mixed",
        "mixed": trainers[0].m.as_dict(),
        "window_s": window,
        "critical_samples": len(lat),
        "critical_censored": censored,
        "critical_start_p50_us": _pct(lat, 0.5),
        "critical_start_p99_us": _pct(lat, 0.99),
        "critical_start_p999_us": _pct(lat, 0.999),
        "critical_start_max_us": lat[-1] / 1e3 if lat else None,
        "critical_start_mean_us": sum(lat) / len(lat) / 1e3 if lat else None,
        "critical_submitted": sum(t.crit_submitted for t in trainers),
        "critical_done": sum(t.crit_done for t in trainers),
        "critical_per_node_per_s": crit / n / window if window else 0.0,
        "low_submitted": sum(t.low_submitted for t in trainers),
        "low_done": sum(t.low_done for t in trainers),
        "low_per_node_per_s": low / n / window if window else 0.0,
        "tasks_per_node_per_s": (low + crit) / n / window if window else 0.0,
        "preemptions_window": sum(t.preempt_window for t in trainers),
        "work_lost_slot_s": lost / 1e9,
        "work_lost_pct": 100.0 * lost / 1e9 / slot_s if slot_s else 0.0,
        "in_flight_at_end": sum(len(t.submitted_ids) - len(t.done_ids) for t in trainers),
    }
    if trainers[0].reserved is not None:
        busy = sum(t.reserved_busy_ns for t in trainers) / 1e9
        out["reserved_workers"] = n
        out["reserved_idle_pct"] = 100.0 * (1 - busy / (n * window)) if window else None
    return out


MIXED_COLUMNS: list[tuple[str, str, str]] = [
    ("nodes", "N", "{:,}"),
    ("label", "scheduler", "{}"),
    ("critical_start_p50_us", "crit p50 us", "{:,.1f}"),
    ("critical_start_p99_us", "crit p99 us", "{:,.1f}"),
    ("critical_start_p999_us", "crit p99.9 us", "{:,.1f}"),
    ("critical_censored", "unstarted", "{:,}"),
    ("low_per_node_per_s", "low/node/s", "{:,.1f}"),
    ("tasks_per_node_per_s", "tasks/node/s", "{:,.1f}"),
    ("slot_idle_pct", "idle %", "{:.2f}"),
    ("preemptions_window", "preempted", "{:,}"),
    ("work_lost_pct", "lost %", "{:.2f}"),
    ("cpu_s", "CPU s", "{:.1f}"),
]


def label(row: dict[str, Any]) -> str:
    """A row's name: the scheduler, with its cost where it has a choice of them."""
    s = str(row["scheduler"])
    if s == "central":
        return f"central ({row.get('central_call_ns', 0):,} ns/call)"
    if s == "two-level" and row.get("mixed", {}).get("reserve"):
        return "two-level (reserved worker)"
    return s


def format_mixed(rows: list[dict[str, Any]]) -> str:
    head = [c[1] for c in MIXED_COLUMNS]
    body = [[cell(r | {"label": label(r)}, k, f) for k, _, f in MIXED_COLUMNS] for r in rows]
    return text_table(head, body, [stopped_note(r) for r in rows])


# ---- calibration: the simulator at the size of bench peers' real run ----------------------
#: the real run (`rdmasched bench peers --rounds 3 --json`, its workload d)
PEERS_JSON = Path(__file__).resolve().parents[2] / "docs" / "figures" / "bench-peers.json"

#: real system (its row in bench peers) -> what stands for it in the simulator: the
#: scheduler, with the real run's setup (Ray's worker kept for critical tasks, Dask's cost)
CALIBRATION_ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "rdmasched": ("rdmasched", {}),
    "rdmasched-spin0": ("rdmasched", {}),
    "ray": ("two-level", {"reserve": True}),
    "dask": ("central", {}),
}


def real_peers(path: str | Path = PEERS_JSON) -> dict[str, Any]:
    """bench peers' JSON: its parameters and each system's workload-d figures."""
    try:
        doc: dict[str, Any] = json.loads(Path(path).read_text())
        params = doc["params"]
        rows = {k: v["mixed"] for k, v in doc["systems"].items() if "mixed" in v}
        if not rows:
            raise ValueError("no system ran the mixed workload (d)")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArgumentError(
            f"--peers-json {path}: not a bench peers JSON document ({exc})"
        ) from None
    return {"doc": doc, "params": params, "rows": rows}


def calibrate(
    base: SimConfig,
    run: Callable[[SimConfig], dict[str, Any]],
    dask_call_ns: int,
    path: str | Path = PEERS_JSON,
) -> list[dict[str, Any]]:
    """Workload d at the real run's size (one host: one node of `slots` slots, its
    parameters, the shm link model, progress kept on a preemption as its client keeps it)
    under the scheduler that stands for each real system, beside that system's figures:
    the critical tasks' start p50/p99 and the tasks per second (both kinds), with the error
    in % of the real figure. `run` is `rdmasched.sim.simulate`."""
    real = real_peers(path)
    p = real["params"]
    m = MixedConfig(
        duration_ms=float(p["mixed_s"]) * 1000,
        warmup_ms=300.0,  # bench peers' settle: 0.3 s before the first critical task
        low_ms=float(p["short_ms"]),
        inflight=int(p["mixed_inflight"]),
        critical_every_ms=float(p["every_ms"]),
        critical_cost_ms=float(p["crit_ms"]),
        preempted="keep",
    )
    cfg = replace(base, nodes=1, slots=int(p["slots"]), links=PRESETS["shm"], mixed=m)
    out = []
    for system, r in real["rows"].items():
        if system not in CALIBRATION_ROWS:
            continue
        sched, extra = CALIBRATION_ROWS[system]
        c = replace(cfg, scheduler=sched, mixed=replace(m, **extra))
        if sched == "central":
            c = replace(c, central_call_ns=dask_call_ns)
        sim = run(c)
        row: dict[str, Any] = {"system": system, "scheduler": label(sim), "sim": sim}
        pairs = (
            ("critical_p50_us", sim["critical_start_p50_us"], r["start"]["p50_us"]),
            ("critical_p99_us", sim["critical_start_p99_us"], r["start"]["p99_us"]),
            ("tasks_per_s", sim["tasks_per_node_per_s"], r["tasks_per_s"]),
        )
        for key, s_v, r_v in pairs:
            row[key] = {
                "sim": s_v,
                "real": r_v,
                "error_pct": None if not r_v or s_v is None else 100.0 * (s_v / r_v - 1),
            }
        out.append(row)
    return out


def format_calibration(rows: list[dict[str, Any]]) -> str:
    head = (
        "system | simulated as | critical p50 us sim / real (error) | "
        "critical p99 us sim / real (error) | tasks/s sim / real (error)"
    )
    lines = [head]

    def cell(x: dict[str, Any]) -> str:
        e = x["error_pct"]
        return f"{x['sim']:,.1f} / {x['real']:,.1f} ({'-' if e is None else f'{e:+.0f}%'})"

    for r in rows:
        lines.append(
            f"{r['system']} | {r['scheduler']} | {cell(r['critical_p50_us'])} | "
            f"{cell(r['critical_p99_us'])} | {cell(r['tasks_per_s'])}"
        )
    return "\n".join(lines)
