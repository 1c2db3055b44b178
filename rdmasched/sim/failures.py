"""Failures: a node dies mid-step; what becomes of the training job, and its goodput.

Two parts, and which figures each gives (docs/SIM.md, "Failures"):

- **Measured in the simulator** (`measure`): one node of the job killed in the middle of a
  step (`SimConfig.kill`; a killed node handles nothing, its peers find out by heartbeat
  silence). The step time (of the steps before the kill and after every survivor knew);
  under rdmasched the **detection time**: when each survivor's node core counts the dead
  node lost (`NodeCore.lost`, probed every `probe_ms` of virtual time), the job's being
  the last survivor's (every rank must exit); and the **re-dispatch of in-node work**:
  co-located preemptible tasks (`Spill`) submitted through the cores' placement, so some
  are forwarded to peers; the dead node's forwarded tasks come back to their origins
  (`Scheduler.peer_gone`, counted as `redispatches`) and are placed again. `Spill.check`
  then says, task by task, that nothing was lost and nothing completed twice.
- **Modelled** (`timeline`): the job over a window with failures at a rate (each node's
  MTBF from Llama 3's 54 days), checkpointed every `ckpt_interval_s` (Young's optimum
  unless given) at a cost of `ckpt_cost_s`; a failure loses the work since the last
  checkpoint and the job is down for the detection plus the restart:
  * rdmasched: detection as measured; the ranks exit (`RankScheduler(exit_on_lost=True)`,
    docs/TORCH.md "Fast failure") and torchrun restarts them from the checkpoint, on the
    survivors plus a spare node (`restart="spare"`: the job keeps its size, as with
    ``torchrun --nnodes N:N`` and a spare host's agent waiting) or on the survivors alone
    (`restart="shrink"`, ``--nnodes MIN:MAX``, as the real run does);
  * exclusive (Slurm/Kueue, no rdmasched on the job's nodes): the survivors hang in the
    collective until the process group's timeout (`pg_timeout_s`, PyTorch's NCCL default
    10 min), the job fails, the scheduler requeues it (`requeue_s`) and it restarts from
    its checkpoint.
  The restart costs (respawn, rendezvous, process up, first step) are the real
  ``rdmasched bench failover`` run's (docs/figures/failover.json), each mode its own.

`calibrate` puts the simulator at 2 nodes with the real run's settings beside that run.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rdmasched.demo.job import WorkloadConfig
from rdmasched.demo.taskid import task_id, task_kind
from rdmasched.errors import ArgumentError
from rdmasched.scheduler import Task
from rdmasched.sim.linkmodel import PRESETS
from rdmasched.sim.run import MS, Run, SimConfig

#: the real run these costs come from (`rdmasched bench failover --json`)
FAILOVER_JSON = Path(__file__).resolve().parents[2] / "docs" / "figures" / "failover.json"

#: Llama 3 (Dubey et al., "The Llama 3 Herd of Models", arXiv:2407.21783, section 3.3.4):
#: 419 unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs,
#: 8 per server (Grand Teton): 2,048 nodes. Each node's MTBF, s (264 days).
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_NODES = 16_384 // 8
MTBF_NODE_S = LLAMA3_DAYS * 86_400 * LLAMA3_NODES / LLAMA3_INTERRUPTIONS

#: a checkpoint's blocking cost, s: Llama 3 405B's training state (16 bytes a parameter
#: under mixed-precision Adam: ZeRO, Rajbhandari et al., SC 2020, section 3.1) written at
#: the 2 TB/s of sustained throughput of Llama 3's storage (Tectonic, section 3.3.1)
LLAMA3_PARAMS = 405e9
ADAM_BYTES_PER_PARAM = 16
LLAMA3_STORAGE_BPS = 2e12
CKPT_COST_S = LLAMA3_PARAMS * ADAM_BYTES_PER_PARAM / LLAMA3_STORAGE_BPS

#: PyTorch's default process-group timeout for NCCL, s (10 min: pytorch/pytorch#110947,
#: torch.distributed.init_process_group's docs; 30 min for gloo and the other backends)
NCCL_PG_TIMEOUT_S = 600.0
GLOO_PG_TIMEOUT_S = 1800.0

RESTARTS = ("spare", "shrink")
#: the modes of the real run, by scheduler: with rdmasched, and plain DDP (what exclusive
#: runs: nothing of rdmasched on the job's nodes)
REAL_MODE = {"rdmasched": True, "exclusive": False}
RESTART_PARTS = ("respawn_s", "rendezvous_s", "process_start_s", "first_step_s")
#: what exclusive's training run is built as: the simulator's "exclusive" baseline (the
#: node cores with one priority, nothing co-located; its one-time binding at the job's
#: start moves no step)
EXCLUSIVE_BUILD = "exclusive"

#: the co-located preemptible work of `Spill`: its task kind (demo/taskid.py uses 1 and 2),
#: job and priority (the demo's background priority)
KIND_SPILL = 3
SPILL_JOB = 3
SPILL_PRIORITY = 10

_log = logging.getLogger("rdmasched.sim.failures")


def young_interval_s(ckpt_cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum checkpoint interval, sqrt(2 x cost x MTBF) (J. W. Young,
    "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974)."""
    return math.sqrt(2.0 * ckpt_cost_s * mtbf_s)


@dataclass(frozen=True)
class FailureModel:
    """The modelled part: failure rate, checkpoints, the baseline's timeout, the window."""

    mtbf_node_s: float = MTBF_NODE_S
    ckpt_cost_s: float = CKPT_COST_S
    #: None: Young's optimum for the job's MTBF (`mtbf_node_s` / nodes)
    ckpt_interval_s: float | None = None
    pg_timeout_s: float = NCCL_PG_TIMEOUT_S
    #: exclusive: from the job's failure to its restart on new nodes (0: at once, which
    #: favours the baseline; Slurm's requeue and next scheduling pass are not modelled)
    requeue_s: float = 0.0
    restart: str = "spare"
    window_s: float = 7 * 86_400.0
    seed: int = 1

    def check(self) -> None:
        for name in ("mtbf_node_s", "window_s", "pg_timeout_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ArgumentError(f"{name} must be > 0, not {v}")
        for name in ("ckpt_cost_s", "requeue_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ArgumentError(f"{name} must be >= 0, not {v}")
        iv = self.ckpt_interval_s
        if iv is not None and not (math.isfinite(iv) and iv > 0):
            raise ArgumentError(f"the checkpoint interval must be > 0 s, not {iv}")
        if self.restart not in RESTARTS:
            raise ArgumentError(f"restart is one of {', '.join(RESTARTS)}, not {self.restart!r}")

    def interval_s(self, nodes: int) -> float:
        if self.ckpt_interval_s is not None:
            return self.ckpt_interval_s
        return young_interval_s(self.ckpt_cost_s, self.mtbf_node_s / nodes)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ---- the real run's restart costs ---------------------------------------------------------
def real_failover(path: str | Path = FAILOVER_JSON) -> dict[str, Any]:
    """The real ``rdmasched bench failover`` run (its JSON document)."""
    try:
        doc: dict[str, Any] = json.loads(Path(path).read_text())
        runs = doc["runs"]
        if not isinstance(runs, list) or not runs:
            raise ValueError("no runs")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArgumentError(
            f"{path}: not a `rdmasched bench failover --json` document ({exc})"
        ) from exc
    return doc


def _mode(doc: dict[str, Any], rdmasched: bool) -> dict[str, Any]:
    for r in doc["runs"]:
        if bool(r.get("rdmasched")) == rdmasched:
            return dict(r)
    raise ArgumentError(f"the failover run has no {'rdmasched' if rdmasched else 'plain'} mode")


def _stat(xs: list[float]) -> dict[str, float]:
    return {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)}


def restart_costs(doc: dict[str, Any], scheduler: str) -> dict[str, Any]:
    """The restart's parts (respawn, rendezvous, process up, first step; s), the mean over
    the real run's failures of the mode that `scheduler` stands for, and their total."""
    r = _mode(doc, REAL_MODE[scheduler])
    fails = r["failures"]
    out: dict[str, Any] = {}
    for part in RESTART_PARTS:
        xs = [float(f[part]) for f in fails if f.get(part) is not None]
        if not xs:
            raise ArgumentError(f"the failover run's failures have no {part}")
        out[part] = _stat(xs)
    out["total_s"] = sum(out[p]["mean"] for p in RESTART_PARTS)
    out["exit_s"] = _stat([float(f["exit_s"]) for f in fails])
    return out


# ---- the modelled timeline -----------------------------------------------------------------
def timeline(
    *, nodes: int, step_s: float, detect_s: float, restart_s: float, model: FailureModel
) -> dict[str, Any]:
    """The job over `model.window_s` with failures: a Poisson process of rate
    live nodes / `mtbf_node_s` (seeded: deterministic). Running, the job checkpoints after
    every `interval` of work, blocking for `ckpt_cost_s`; a failure loses the work since
    the last checkpoint (a checkpoint being written is lost too) and the job is down for
    `detect_s` (failures meanwhile are absorbed: one restart replaces them all) and then
    `restart_s` (a failure then starts the recovery over). Under "shrink" each failure
    leaves one node fewer; under "spare" the job keeps its size."""
    model.check()
    if nodes < 1 or not step_s > 0 or detect_s < 0 or restart_s < 0:
        raise ArgumentError("timeline: nodes >= 1, step > 0, detection and restart >= 0")
    rng = random.Random(model.seed)
    w = model.window_s
    tau = model.interval_s(nodes)
    cost = model.ckpt_cost_s
    shrink = model.restart == "shrink"
    live = nodes
    failures = 0

    def next_failure(t: float) -> float:
        return t + rng.expovariate(live / model.mtbf_node_s) if live > 0 else math.inf

    def fail() -> None:
        nonlocal live, failures
        failures += 1
        if shrink:
            live -= 1

    t = 0.0
    useful = lost = ckpt = 0.0
    samples = 0.0  # useful time x live nodes (the batches a step does, per node)
    f = next_failure(0.0)
    while t < w and live > 0:
        end = t + tau + cost
        if f >= end and end <= w:  # a segment of work and its checkpoint
            useful += tau
            samples += tau * live
            ckpt += cost
            t = end
            continue
        if f >= w:  # the window ends first: the work done counts
            run = min(w - t, tau)
            useful += run
            samples += run * live
            ckpt += max(0.0, w - t - tau)
            break
        lost += min(f - t, tau)  # the failure at f: the work since the last checkpoint
        t = f
        fail()
        while t < w and live > 0:  # down: detection, then the restart
            detected = t + detect_s
            f = next_failure(t)
            while f < detected and live > 0:
                fail()
                f = next_failure(f)
            up = detected + restart_s
            if f < up:
                t = f
                fail()
                continue
            t = up
            break
        f = next_failure(t) if f < t else f
    down = max(0.0, w - useful - lost - ckpt)
    return {
        "window_s": w,
        "failures": failures,
        "ckpt_interval_s": tau,
        "ckpt_cost_s": cost,
        "useful_s": useful,
        "lost_s": lost,
        "ckpt_s": ckpt,
        "down_s": down,
        "effective_pct": 100.0 * useful / w,
        "goodput_steps_per_s": useful / step_s / w,
        "goodput_samples_per_s": samples / step_s / w,  # node-steps: one batch per node
        "lost_steps_per_failure": (lost / step_s / failures) if failures else 0.0,
        "nodes_at_end": live,
    }


def expected_effective(
    *, nodes: int, detect_s: float, restart_s: float, model: FailureModel
) -> float:
    """The first-order expectation of `timeline`'s effective share (for a check): a
    checkpoint's cost per interval, and per failure half an interval of work lost plus
    the detection and the restart; failures during recovery ignored."""
    tau = model.interval_s(nodes)
    rate = nodes / model.mtbf_node_s
    cycle = tau + model.ckpt_cost_s
    per_s = rate * (tau / 2 + detect_s + restart_s)
    return max(0.0, (tau / cycle) * (1 - per_s))


# ---- co-located work that the placement forwards, and its re-dispatch -----------------------
class _Host:
    """A node's trainer as its `CoreNode` sees it, with the node's spill tasks beside it:
    a start or preemption of a spill task is the spill work's, every other the trainer's."""

    def __init__(self, spill: Spill, node: Any, trainer: Any) -> None:
        self.spill = spill
        self.node = node
        self.trainer = trainer
        self.started: dict[int, int] = {}  # task key -> when its run began
        self.token: dict[int, int] = {}

    def on_start(self, task: Task, slot: int) -> None:
        if task_kind(task.id) != KIND_SPILL or task.group is not None:
            self.trainer.on_start(task, slot)
            return
        eng = self.node.engine
        key = _key(task)
        self.started[key] = eng.now
        tok = self.token[key] = self.token.get(key, 0) + 1
        eng.at(eng.now + max(0, task.cost_ns - task.progress_ns), self._finish, task, tok)

    def on_preempt(self, task: Task, slot: int, cancel: bool) -> int:
        if task_kind(task.id) != KIND_SPILL or task.group is not None:
            progress: int = self.trainer.on_preempt(task, slot, cancel)
            return progress
        key = _key(task)
        now = self.node.engine.now
        began = self.started.pop(key, now)
        self.token[key] = self.token.get(key, 0) + 1  # its timer is void
        progress = int(task.progress_ns) + (now - began)
        return progress

    def _finish(self, task: Task, tok: int) -> None:
        key = _key(task)
        if not self.node.alive or self.token.get(key) != tok:
            return  # the node died, or the task was preempted meanwhile
        now = self.node.engine.now
        began = self.started.pop(key, now)
        self.token.pop(key, None)
        self.spill.done[key] = self.spill.done.get(key, 0) + 1
        self.node.do(self.node.core.complete(task.id, task.origin, now - began, now))


def _key(task: Task) -> int:
    return (task.origin << 64) | task.id


class Spill:
    """Co-located preemptible work on a cluster of node cores: at `at_ns`, every
    `every`-th node submits `per_node` tasks of `cost_ns` (priority 10) through its core's
    placement (`NodeCore.submit`), so a node with no free slot forwards them to lighter
    peers (docs/SCHEDULER.md). Each node's `CoreNode.trainer` is wrapped (`_Host`) so that
    it runs its spill tasks (its own and forwarded ones) beside the training job."""

    def __init__(self, run: Run, *, at_ns: int, every: int, per_node: int, cost_ns: int) -> None:
        if not hasattr(run, "nodes"):
            raise ArgumentError("spill work needs the node cores (not a central baseline)")
        self.run = run
        self.submitted: list[Task] = []
        self.done: dict[int, int] = {}
        self.every = max(1, every)
        self.per_node = per_node
        self.cost_ns = cost_ns
        for node in run.nodes:
            node.trainer = _Host(self, node, node.trainer)
        run.engine.at(at_ns, self._submit)

    def _submit(self) -> None:
        run = self.run
        now = run.engine.now
        for node in run.nodes[:: self.every]:
            if not node.alive:
                continue
            for k in range(self.per_node):
                t = Task(
                    task_id(KIND_SPILL, node.me, k + 1),
                    SPILL_JOB,
                    SPILL_PRIORITY,
                    self.cost_ns,
                    origin=node.me,
                )
                self.submitted.append(t)
                node.do(node.core.submit(t, now))

    def check(self) -> dict[str, Any]:
        """Task by task at the end: completed once, more than once, or not yet and still
        held by a live node (queued or running there: not lost), or lost; a task whose
        origin died goes with it (its holder drops it: `Scheduler.drop_origin`)."""
        run = self.run
        cores, alive = run.cores, run.alive
        once = twice = held = lost = gone = 0
        for t in self.submitted:
            key = _key(t)
            c = self.done.get(key, 0)
            if c > 1:
                twice += 1
            if c == 1:
                once += 1
            if c:
                continue
            if not alive[t.origin]:
                gone += 1
                continue
            origin = cores[t.origin]
            where = t.origin
            if origin.scheduler.lookup(t.id, t.origin) is None:
                h = origin.peers.holder(key)
                where = -1 if h is None else h
            if where >= 0 and alive[where] and cores[where].scheduler.lookup(t.id, t.origin):
                held += 1
            else:
                lost += 1
        stats = [c.scheduler.stats() for c in cores]
        return {
            "spill_submitted": len(self.submitted),
            "spill_completed_once": once,
            "spill_completed_twice": twice,
            "spill_held_at_end": held,
            "spill_lost": lost,
            "spill_gone_with_origin": gone,
            "forwards": sum(s.forwards for s in stats),
            "redispatches": sum(s.redispatches for s in stats),
            "drops": sum(s.drops for s in stats),
        }


# ---- the measured part -------------------------------------------------------------------------
class _Probe:
    """When each survivor's core counts every killed node lost, probed every `every_ns`
    from the kill on (the first time a probe sees it)."""

    def __init__(self, run: Run, at_ns: int, every_ns: int) -> None:
        self.run = run
        self.at_ns = at_ns
        self.every_ns = every_ns
        self.pending: list[int] = []
        self.seen: dict[int, int] = {}
        self.victims: list[int] = []
        run.engine.at(at_ns + 1, self._start)  # after the kill (scheduled at at_ns)

    def _start(self) -> None:
        run = self.run
        self.victims = list(run.killed)
        self.pending = [i for i in range(run.cfg.nodes) if run.alive[i]]
        self._look()

    def _look(self) -> None:
        run = self.run
        now = run.engine.now
        cores, victims = run.cores, self.victims
        left = []
        for i in self.pending:
            core = cores[i]
            if all(core.lost(v) for v in victims):
                self.seen[i] = now - self.at_ns
            else:
                left.append(i)
        self.pending = left
        if left:
            run.engine.at(now + self.every_ns, self._look)


def _step_time_s(run: Run, lo_ns: int, hi_ns: int) -> float | None:
    """The mean step of the live nodes over the steps that ended before `lo_ns` or began
    after `hi_ns` (not the step a death held up)."""
    got: list[int] = []
    for tr in run.trainers:
        if not run.alive[tr.node]:
            continue
        end = tr.t0
        for d in tr.step_times_ns:
            end += d
            if end <= lo_ns or end - d >= hi_ns:
                got.append(d)
    return sum(got) / len(got) / 1e9 if got else None


def failure_config(cfg: SimConfig, kill_step: float = 1.5) -> SimConfig:
    """`cfg` as a failure run: the training job without the demo's background backlog
    (whose 2 ms tasks churn on every idle slot while the job waits for the detection, and
    cost the simulator most of its time: the co-located work here is `Spill`'s); one node
    killed in the middle of step `kill_step` (unless `cfg.kill` says otherwise), and three
    steps after that step (`compare` fails if a survivor had not learned of the death by
    the end); under exclusive with no
    co-located work (its background backlog 0) and no kill (its detection is the process
    group's timeout: only its step time is measured)."""
    w = replace(cfg.workload, background_backlog=0)
    step_ms = w.compute_ms + w.sync_ms
    if cfg.scheduler == "exclusive":
        return replace(cfg, scheduler=EXCLUSIVE_BUILD, kill=(), workload=w)
    kill = cfg.kill or ((1, kill_step * step_ms),)
    last = max(at for _, at in kill)
    # the step a death falls in waits for its detection (its sync for the dead member):
    # three more steps after it give the step time after, and the far nodes' news its time
    need = math.ceil(last / step_ms) + 3
    return replace(cfg, kill=kill, workload=replace(w, steps=max(w.steps, need)))


def measure(
    cfg: SimConfig,
    *,
    probe_ms: float = 5.0,
    spill: bool = True,
    spill_every: int = 4,
    spill_per_node: int = 8,
    spill_ms: float | None = None,
) -> dict[str, Any]:
    """One simulated failure run (`failure_config(cfg)` is the caller's): the step time,
    the detection per survivor, the re-dispatch of co-located work (`Spill`)."""
    if cfg.scheduler not in ("rdmasched", "fifo", "exclusive"):
        raise ArgumentError(
            f"failures: node cores only (rdmasched, exclusive), not {cfg.scheduler}"
        )
    logging.getLogger("rdmasched.daemon").setLevel(logging.ERROR)
    run = Run(cfg)
    w = cfg.workload
    step_ms = w.compute_ms + w.sync_ms
    kill_ns = int(min((at for _, at in cfg.kill), default=0.0) * MS)
    probe = _Probe(run, kill_ns, max(1, int(probe_ms * MS))) if cfg.kill else None
    sp = None
    if spill and cfg.kill and cfg.scheduler != "exclusive":
        cost = spill_ms if spill_ms is not None else 2 * step_ms
        sp = Spill(
            run,
            at_ns=max(0, kill_ns - int(step_ms * MS / 2)),
            every=spill_every,
            per_node=spill_per_node,
            cost_ns=max(1, int(cost * MS)),
        )
    out = run.run()
    figs: dict[str, Any] = {
        k: out[k]
        for k in ("scheduler", "nodes", "finished", "stopped", "steps", "killed", "virtual_s")
    }
    for k in ("events", "cpu_s", "build_cpu_s", "wall_s"):
        figs[k] = out[k]
    if probe is not None:
        seen = sorted(probe.seen.values())
        last = max(seen, default=0)
        figs.update(
            kill_at_ms=kill_ns / MS,
            survivors=len(seen) + len(probe.pending),
            detected=len(seen),
            probe_ms=probe_ms,
            detect_first_ms=seen[0] / MS if seen else None,
            detect_p50_ms=seen[len(seen) // 2] / MS if seen else None,
            detect_max_ms=last / MS if seen else None,
        )
        figs["step_s"] = _step_time_s(run, kill_ns, kill_ns + last)
    else:
        figs["step_s"] = _step_time_s(run, 1 << 62, 1 << 62)
    if sp is not None:
        figs.update(sp.check())
    return figs


# ---- the whole comparison ------------------------------------------------------------------
def compare(
    cfg: SimConfig,
    model: FailureModel,
    doc: dict[str, Any],
    schedulers: tuple[str, ...] = ("rdmasched", "exclusive"),
    say: Callable[[str], None] | None = None,
    reuse: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """At `cfg.nodes`: each scheduler's failure run (measured) and its timeline
    (modelled), one row each. `reuse` (scheduler -> a row of a smaller size): the
    timeline with that row's measured step and detection instead of a run at this size
    (marked `measured_at_nodes`: a size too costly to simulate, docs/SIM.md "Failures")."""
    model.check()
    rows = []
    for sched in schedulers:
        if sched not in REAL_MODE:
            raise ArgumentError(f"failures compares rdmasched and exclusive, not {sched!r}")
        old = (reuse or {}).get(sched)
        if old is not None:
            m = old["measured"]
        else:
            if say:
                say(f"  failures: {sched} at {cfg.nodes} nodes ...")
            m = measure(failure_config(replace(cfg, scheduler=sched)))
        rc = restart_costs(doc, sched)
        if sched == "exclusive":
            detect = model.pg_timeout_s
            restart = model.requeue_s + rc["total_s"]
            how = "the process group's timeout (modelled)"
        else:
            if m.get("detected") != m.get("survivors") or m.get("detect_max_ms") is None:
                raise ArgumentError(
                    f"at {cfg.nodes} nodes {m.get('detected')} of {m.get('survivors')} "
                    "survivors learned of the death before the run ended: more --steps"
                )
            detect = m["detect_max_ms"] / 1e3
            restart = rc["total_s"]
            how = "the node cores' liveness (measured in the simulator)"
        step = m["step_s"]
        if step is None:
            raise ArgumentError(f"{sched} at {cfg.nodes} nodes: no step to time")
        tl = timeline(nodes=cfg.nodes, step_s=step, detect_s=detect, restart_s=restart, model=model)
        rows.append(
            {
                "scheduler": sched,
                "nodes": cfg.nodes,
                "step_s": step,
                "detect_s": detect,
                "detect_how": how,
                "restart_s": restart,
                "restart_parts": rc,
                "restart_mode": model.restart,
                **tl,
                "measured_at_nodes": m["nodes"],
                "measured": m,
            }
        )
    ref = rows[0]["goodput_steps_per_s"] if rows else 0.0
    for r in rows:
        r["goodput_x_first"] = (r["goodput_steps_per_s"] / ref) if ref else None
    return rows


def calibrate(doc: dict[str, Any], *, probe_ms: float = 1.0) -> list[dict[str, Any]]:
    """The simulator at 2 nodes with the real run's settings (step `step_ms`, a node lost
    after `steps_between` steps, the daemon's liveness defaults 50/500 ms; shm links, one
    host), each episode modelled as the real one runs: 2 x steps_between - 1 steps of
    work, the detection, the restart (the real run's own costs), beside the real figures.
    The restart costs are the real run's, so the goodput's error is that of the step time,
    the detection and the episode model only."""
    conf = doc["config"]
    step_ms = float(conf["step_ms"])
    between = int(conf["steps_between"])
    timeout = float(conf["timeout_s"])
    sync = 1.0
    w = WorkloadConfig(
        steps=between + math.ceil(1000 / step_ms) + 2,
        compute_ms=step_ms - sync,
        jitter=0.0,
        sync_ms=sync,
        background_backlog=0,
    )
    base = SimConfig(nodes=2, workload=w, links=PRESETS["shm"], heartbeat_ms=50, dead_after_ms=500)
    rows = []
    for sched in ("rdmasched", "exclusive"):
        real = _mode(doc, REAL_MODE[sched])
        rc = restart_costs(doc, sched)
        build = EXCLUSIVE_BUILD if sched == "exclusive" else sched
        c = replace(base, scheduler=build, kill=((1, (between + 0.5) * step_ms),))
        m = measure(c, probe_ms=probe_ms, spill=False)
        step = m["step_s"]
        # exclusive: the run's own process-group timeout
        detect = timeout if sched == "exclusive" else m["detect_max_ms"] / 1e3
        steps = 2 * between - 1
        wall = (steps - 1) * step + detect + rc["total_s"]
        good = steps / wall
        real_good = float(real["goodput_steps_per_s"])
        rows.append(
            {
                "scheduler": sched,
                "real_mode": "rdmasched" if REAL_MODE[sched] else "plain",
                "sim_step_ms": step * 1e3,
                "sim_detect_s": detect,
                "detect_how": "measured" if sched != "exclusive" else "the run's timeout_s",
                "real_exit_s": rc["exit_s"],
                "detect_error_pct": 100.0 * (detect - rc["exit_s"]["mean"]) / rc["exit_s"]["mean"],
                "restart_s": rc["total_s"],
                "sim_episode_s": wall,
                "real_episode_s": _stat([float(f["wall_s"]) for f in real["failures"]]),
                "sim_goodput_steps_per_s": good,
                "real_goodput_steps_per_s": real_good,
                "goodput_error_pct": 100.0 * (good - real_good) / real_good,
                "measured": m,
            }
        )
    return rows


#: the figures of a row that `model_check` sets side by side
CHECKED = ("step_s", "detect_s", "effective_pct", "goodput_steps_per_s")


def model_check(
    measured: list[dict[str, Any]], modelled: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each row measured at its size beside the row modelled at that size from a smaller
    size's measurement (`compare`'s `reuse`; same scheduler): each figure of `CHECKED`
    measured, modelled, and the difference (modelled - measured, and in % of the
    measured), so the error of taking a smaller size's step and detection is a figure."""
    by = {r["scheduler"]: r for r in modelled}
    out = []
    for r in measured:
        o = by.get(r["scheduler"])
        if o is None:
            continue
        row: dict[str, Any] = {
            "scheduler": r["scheduler"],
            "nodes": r["nodes"],
            "modelled_from_nodes": o["measured_at_nodes"],
        }
        for key in CHECKED:
            got, want = float(r[key]), float(o[key])
            row[key] = {
                "measured": got,
                "modelled": want,
                "diff": want - got,
                "diff_pct": 100.0 * (want - got) / got if got else None,
            }
        out.append(row)
    return out


# ---- output ---------------------------------------------------------------------------------
def format_rows(rows: list[dict[str, Any]]) -> str:
    head = (
        "| N | scheduler | step, ms | detection, s | restart, s | failures | lost, steps/failure "
        "| effective % | goodput, steps/s | x rdmasched | re-dispatched |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        m = r["measured"]
        x = r.get("goodput_x_first")
        m_at = r.get("measured_at_nodes", r["nodes"])
        at = "" if m_at == r["nodes"] else f" (as {m_at:,})"
        lines.append(
            f"| {r['nodes']:,}{at} | {r['scheduler']} | {r['step_s'] * 1e3:.1f} "
            f"| {r['detect_s']:.3f} "
            f"| {r['restart_s']:.1f} | {r['failures']} | {r['lost_steps_per_failure']:,.0f} "
            f"| {r['effective_pct']:.1f} | {r['goodput_steps_per_s']:.2f} "
            f"| {'-' if x is None else f'{x:.3f}'} | {m.get('redispatches', '-')} |"
        )
    return "\n".join(lines)


def format_model_check(rows: list[dict[str, Any]]) -> str:
    head = (
        "| N | scheduler | modelled from | step, ms meas / model | detection, s meas / model "
        "| effective % meas / model / diff | goodput meas / model / diff % |"
    )
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        st, de, ef, gp = (r[k] for k in CHECKED)
        gp_pct = "-" if gp["diff_pct"] is None else f"{gp['diff_pct']:+.1f}"
        lines.append(
            f"| {r['nodes']:,} | {r['scheduler']} | {r['modelled_from_nodes']:,} "
            f"| {st['measured'] * 1e3:.1f} / {st['modelled'] * 1e3:.1f} "
            f"| {de['measured']:.3f} / {de['modelled']:.3f} "
            f"| {ef['measured']:.1f} / {ef['modelled']:.1f} / {ef['diff']:+.1f} "
            f"| {gp['measured']:.2f} / {gp['modelled']:.2f} / {gp_pct} |"
        )
    return "\n".join(lines)


def format_calibration(rows: list[dict[str, Any]]) -> str:
    head = (
        "| scheduler (real mode) | detection sim, s | survivor out real, s | error % "
        "| goodput sim | goodput real | error % |"
    )
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        e = r["real_exit_s"]
        lines.append(
            f"| {r['scheduler']} ({r['real_mode']}) | {r['sim_detect_s']:.3f} "
            f"| {e['mean']:.3f} ({e['min']:.3f}-{e['max']:.3f}) | {r['detect_error_pct']:+.1f} "
            f"| {r['sim_goodput_steps_per_s']:.2f} | {r['real_goodput_steps_per_s']:.2f} "
            f"| {r['goodput_error_pct']:+.1f} |"
        )
    return "\n".join(lines)


__all__ = [
    "CKPT_COST_S",
    "MTBF_NODE_S",
    "NCCL_PG_TIMEOUT_S",
    "FailureModel",
    "Spill",
    "calibrate",
    "compare",
    "expected_effective",
    "failure_config",
    "format_calibration",
    "format_model_check",
    "format_rows",
    "measure",
    "model_check",
    "real_failover",
    "restart_costs",
    "timeline",
    "young_interval_s",
]
