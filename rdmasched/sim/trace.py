"""Replaying a trace: one rank's stream plan (rdmasched.workload.streams) on every node.

A node is the traced device, modelled as its streams (docs/SIM.md, "Trace replay"):

- the compute stream runs the step's compute ops one at a time, in the order they became
  ready; side streams and the communication streams without gradient buckets run their
  ops in order; these are the trainer's own in-order servers on the engine's clock;
- the communication stream that carries DDP's gradient buckets is the node core's slot
  (the run gives the core one slot): each collective on it is submitted as a task when it
  is ready, and the core picks which runs: under "fifo" one priority (the launch order,
  as NCCL runs a stream), under rdmasched the bucket of the first layers first (P3,
  ByteScheduler): bucket k of B gets priority BUCKET_PRIORITY + k (DDP launches the last
  layers' bucket first), any other collective on that stream TOP_PRIORITY; a higher one
  preempts a running lower one and it resumes where it stopped (P3's slicing);
- every collective first meets the other ranks: SYNC_READY of its sync group (group
  `TRACE_GROUP_BASE + j` for the step's j-th collective), released when every member is
  ready; the released sync task is the rendezvous (it ends at once), then the collective
  runs for `sync_ns[id]` (its measured time, or the link model's: `collective_ns`).

A replay step ends when all its ops have; the next steps overlap it as the plan says. The
background backlog is the demo's, on the core's slot. Device idle is counted per stream
and over the device as HTA counts it: time of the run with no kernel on that stream / on
any stream (`device_figures`).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from rdmasched.demo.job import WorkloadConfig
from rdmasched.demo.taskid import KIND_BACKGROUND, KIND_COMPUTE, task_id, task_kind
from rdmasched.scheduler import Task
from rdmasched.sim.drivers import Ledger, Shaped, SimTrainer
from rdmasched.sim.linkmodel import LinkModel
from rdmasched.workload import Replicated, Workload
from rdmasched.workload.model import union
from rdmasched.workload.streams import (
    COMPUTE,
    Mode,
    Op,
    bucket_stream,
    host_start,
    plan,
    prev_deps,
)

TRACE_GROUP_BASE = 16
#: the core's slots in a trace replay: the one communication stream it orders
TRACE_CORE_SLOTS = 1
#: priority of bucket 0 (the first launched: the last layers) under rdmasched
BUCKET_PRIORITY = 101
#: priority of a collective other than a bucket on the bucket stream (a compute waits on it)
TOP_PRIORITY = 254


def bus_factor(collective: str, n: int) -> float:
    """The bus-bandwidth factor of a collective over n ranks (nccl-tests' doc/PERFORMANCE.md,
    https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md, "Summary":
    busBw = algBw x factor, so its time is bytes x factor / bus bandwidth): all_reduce
    2(n-1)/n; all_gather, reduce_scatter and all_to_all (n-1)/n; broadcast, reduce,
    send/recv and the rest 1."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def collective_ns(collective: str, nbytes: int, nodes: int, model: LinkModel, level: int) -> int:
    """The link model's time for one collective of `nbytes` (per rank, the larger of in and
    out) over `nodes` ranks at the link level `level`: bytes x nccl-tests' bus factor over
    the level's bandwidth, plus a tree's latency term (2 log2 N link latencies; N-1 for an
    all_to_all, which talks to every peer)."""
    lv = model.levels[level]
    if nodes <= 1:
        return 0
    factor = bus_factor(collective, nodes)
    hops = nodes - 1 if collective == "all_to_all" else 2 * math.ceil(math.log2(nodes))
    return int(factor * nbytes / lv.bandwidth * 1e9 + hops * lv.latency_ns)


def allreduce_ns(nbytes: int, nodes: int, model: LinkModel, level: int) -> int:
    """`collective_ns` of an all-reduce."""
    return collective_ns("all_reduce", nbytes, nodes, model, level)


def sync_times(
    wl: Workload, nodes: int, model: LinkModel, level: int, force_model: bool = False
) -> dict[int, int]:
    """Per sync task id, how long it runs in the replay: its measured time (the NCCL kernel,
    the gloo run) while the cluster is no larger than the traced world; the link model's
    (`collective_ns`) past it, with `force_model`, or where the trace has no time."""
    world = wl.world_size or 0
    out: dict[int, int] = {}
    for st in wl.steps:
        for x in st.syncs:
            measured = x.duration_ns > 0 and nodes <= world and not force_model
            out[x.id] = (
                x.duration_ns
                if measured
                else collective_ns(x.collective, x.nbytes, nodes, model, level)
            )
    return out


def trace_groups(rep: Replicated) -> int:
    """Sync groups the trace needs: the most collectives in one of its steps."""
    return max((len(s.syncs) for s in rep.base.steps), default=0)


class ReplayPlan:
    """What every node's trainer replays, made once per run: each trace step's plan in
    `mode` (rdmasched.workload.streams), the stream the core orders, the host's step."""

    def __init__(self, wl: Workload, mode: Mode = "host") -> None:
        gpu = wl.device == "gpu"
        self.plans = [plan(s, gpu, mode) for s in wl.steps]
        self.walls = [s.duration_ns for s in wl.steps]
        self.core_stream = [bucket_stream(s) for s in wl.steps]
        #: sync task id -> j: its sync group is TRACE_GROUP_BASE + j (the step's j-th)
        self.sync_j = {x.id: j for st in wl.steps for j, x in enumerate(st.syncs)}


class _Stream:
    """An in-order server: one op at a time; `ready_order`: in the order the ops became
    ready (the compute stream), else in the order they were made (issue order)."""

    def __init__(self, ready_order: bool) -> None:
        self.ready_order = ready_order
        self.queue: deque[tuple[int, int]] = deque()  # op keys
        self.busy = False
        self.intervals: list[tuple[int, int]] = []


class TraceTrainer(SimTrainer):
    def __init__(
        self,
        node: int,
        slots: int,
        cfg: WorkloadConfig,
        backend: Shaped,
        ledger: Ledger,
        rep: Replicated,
        sync_ns: dict[int, int],
        replay: ReplayPlan,
    ) -> None:
        super().__init__(node, slots, cfg, backend, ledger)
        self.rep = rep
        self.shaped = backend
        #: trace sync task id -> its run time on the cluster's network
        self.sync_ns = sync_ns
        self.plans = replay.plans
        self.walls = replay.walls
        self.core_stream = replay.core_stream
        self._sync_j = replay.sync_j
        self._host: list[int] = []  # per replay step, when the host began it
        self.factor = rep.slowdown[node]
        self.streams: dict[str, _Stream] = {}
        #: (step, op index) -> deps left; and who waits for it
        self._pending: dict[tuple[int, int], int] = {}
        self._waiters: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._done_ops: set[tuple[int, int]] = set()
        self._left: dict[int, int] = {}
        self._ready: set[tuple[int, int]] = set()  # deps met (an in-order stream may hold it)
        self._by_sched: dict[int, tuple[int, int]] = {}  # scheduler task id -> op key
        self._by_group: dict[tuple[int, int], tuple[int, int]] = {}  # (group, step) -> op key
        self._made = 0
        self._last_end = 0
        self._core_run: dict[int, int] = {}  # transfer task id -> when its run began

    # ---- the plan, unrolled ------------------------------------------------------------
    def _plan(self, r: int) -> list[Op]:
        return self.plans[r % len(self.plans)]

    def begin(self) -> None:
        self.t0 = self.b.now()
        self._last_end = self.t0
        for _ in range(self.cfg.background_backlog):
            self._submit_background()
        self._make(0)
        if self.cfg.steps > 1:
            self._make(1)

    def _make(self, r: int) -> None:
        """Make replay step r's ops (step r-1's exist): count their deps, queue the ready."""
        self._made = r + 1
        ops = self._plan(r)
        prev = self._plan(r - 1) if r > 0 else []
        self._left[r] = len(ops)
        now = self.b.now()
        began = self._host[-1] if self._host else self.t0
        wall = self.walls[(r - 1) % len(self.walls)]
        self._host.append(host_start(r, began, wall, now))
        for op in ops:
            deps = [(r, d) for d in op.deps] + [(r - 1, i) for i in prev_deps(op, prev)]
            key = (r, op.index)
            live = [d for d in deps if d not in self._done_ops]
            self._pending[key] = len(live)
            if op.issue_ns is not None:  # the host issues it then
                self._pending[key] += 1
                at = self._host[r] + round(op.issue_ns * self.factor)
                self.b.call_later(max(0, at - now), lambda key=key: self._dep_done(key))
            for d in live:
                self._waiters.setdefault(d, []).append(key)
            stream = self._stream(op.stream)
            if not stream.ready_order and not self._on_core(key):
                stream.queue.append(key)
        for op in ops:
            key = (r, op.index)
            if self._pending[key] == 0:
                self._on_ready(key)

    def _stream(self, name: str) -> _Stream:
        s = self.streams.get(name)
        if s is None:
            s = self.streams[name] = _Stream(name == COMPUTE)
        return s

    def _op(self, key: tuple[int, int]) -> Op:
        return self._plan(key[0])[key[1]]

    def _on_core(self, key: tuple[int, int]) -> bool:
        op = self._op(key)
        return op.sync is not None and op.stream == self.core_stream[key[0] % len(self.plans)]

    def _on_ready(self, key: tuple[int, int]) -> None:
        if self._on_core(key):
            self._rendezvous(key)  # the core orders it once every rank is there
            return
        s = self._stream(self._op(key).stream)
        if s.ready_order:
            s.queue.append(key)
        self._ready.add(key)
        self._pump(s)

    def _rendezvous(self, key: tuple[int, int]) -> None:
        r = key[0]
        op = self._op(key)
        assert op.sync is not None
        group = TRACE_GROUP_BASE + self._sync_j[op.sync.id]
        self._by_group[(group, r)] = key
        self.shaped.sync_ready(r, group)

    def _pump(self, s: _Stream) -> None:
        """Start the stream's next op if it is free and the op's deps are done (an in-order
        stream waits for its head; a collective on it meets the other ranks first and holds
        the stream from then)."""
        if s.busy or not s.queue or s.queue[0] not in self._ready:
            return
        key = s.queue[0]
        self._ready.discard(key)
        s.busy = True
        op = self._op(key)
        if op.sync is not None:
            self._rendezvous(key)  # stays the head until released (`_released`)
            return
        s.queue.popleft()
        cost = round(op.duration_ns * self.factor)
        busy = round(op.busy_ns * self.factor)
        now = self.b.now()
        s.intervals.append((now, now + min(busy, cost)))
        self.b.call_later(cost, lambda: self._stream_done(s, key))

    def _stream_done(self, s: _Stream, key: tuple[int, int]) -> None:
        s.busy = False
        self.ledger.progress += 1  # (the core's tasks count in the backend)
        self._op_done(key)
        self._pump(s)

    def _op_done(self, key: tuple[int, int]) -> None:
        self._done_ops.add(key)
        for w in self._waiters.pop(key, ()):
            self._dep_done(w)
        r = key[0]
        self._left[r] -= 1
        if self._left[r] == 0:
            self._step_done(r)

    def _dep_done(self, key: tuple[int, int]) -> None:
        self._pending[key] -= 1
        if self._pending[key] == 0:
            del self._pending[key]
            self._on_ready(key)

    def _step_done(self, r: int) -> None:
        now = self.b.now()
        # steps end in order (step r+1 waits for step r where the plan links them); a step
        # that ends before an earlier one counts from the earlier's end
        self.step_times_ns.append(max(0, now - self._last_end))
        self._last_end = max(self._last_end, now)
        self.step += 1
        del self._left[r]
        # a step made from now on depends on the step before it, made after step r-1 ended
        self._done_ops = {k for k in self._done_ops if k[0] >= r}
        if not self._end_if_last(now) and self._made < self.cfg.steps:
            self._make(self._made)

    # ---- the core's slot: rendezvous and the bucket stream ----------------------------
    def on_start(self, task: Task, slot: int) -> None:
        self.ledger.run_starts += 1
        now = self.b.now()
        self.started_at[task.id] = now
        token = self.run_token.get(task.id, 0) + 1
        self.run_token[task.id] = token
        if task.group is not None:
            self.ledger.release(self.node, task.group, task.id & 0xFFFFFFFF, now)
            cost = 0  # the rendezvous: every rank is there
        elif task.id in self._by_sched:
            key = self._by_sched[task.id]
            op = self._op(key)
            assert op.sync is not None
            cost = self.sync_ns[op.sync.id]
            self._core_run[task.id] = now
        else:
            cost = task.cost_ns
        remaining = max(0, cost - task.progress_ns)
        self.b.call_later(remaining, lambda: self._finish(task, token))

    def on_preempt(self, task: Task, slot: int, cancel: bool) -> int:
        began = self._core_run.pop(task.id, None)
        if began is not None:
            self._stream(self._op(self._by_sched[task.id]).stream).intervals.append(
                (began, self.b.now())
            )
        return super().on_preempt(task, slot, cancel)

    def _finish(self, task: Task, token: int) -> None:
        ended = self._end_run(task, token)
        if ended is None:
            return
        now, began = ended
        if task.group is not None:
            key = self._by_group.pop((task.group, task.id & 0xFFFFFFFF))
            self._released(key)
        elif task.id in self._by_sched:
            key = self._by_sched.pop(task.id)
            run0 = self._core_run.pop(task.id, began)
            self._stream(self._op(key).stream).intervals.append((run0, now))
            self._op_done(key)
        elif task_kind(task.id) == KIND_BACKGROUND and not self.done:
            self._submit_background()

    def _released(self, key: tuple[int, int]) -> None:
        """Every rank met at this collective: run it (on the core's slot, or its stream)."""
        op = self._op(key)
        assert op.sync is not None
        if self._on_core(key):
            self.seq += 1
            sid = task_id(KIND_COMPUTE, self.node, self.seq)
            self._by_sched[sid] = key
            prio = TOP_PRIORITY if op.bucket is None else min(253, BUCKET_PRIORITY + op.bucket)
            cost = self.sync_ns[op.sync.id]
            # Shaped scales a task's cost by the node's slowdown: a collective is the
            # network's, so hand it the unscaled time (on_start runs sync_ns anyway)
            self.shaped.submit_local(Task(sid, 1, prio, cost, origin=self.node))
            return
        s = self._stream(op.stream)
        s.queue.popleft()
        now = self.b.now()
        cost = self.sync_ns[op.sync.id]
        s.intervals.append((now, now + cost))
        self.b.call_later(cost, lambda: self._stream_done(s, key))

    # ---- figures ---------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        out = super().figures()
        end = self.t_end or self.b.now()
        span = max(1, end - self.t0)
        every: list[tuple[int, int]] = []
        per: dict[str, float] = {}
        for name, s in sorted(self.streams.items()):
            iv = union([(max(a, self.t0), min(b, end)) for a, b in s.intervals if b > a])
            every += iv
            per[name] = 100.0 * (1 - sum(b - a for a, b in iv) / span)
        busy = sum(b - a for a, b in union(every))
        out["device_idle_pct"] = 100.0 * (1 - busy / span)
        out["stream_idle_pct"] = per
        return out


def device_figures(figs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's device idle: the mean over nodes of each node's (trace replays only)."""
    rows = [f for f in figs if "device_idle_pct" in f]
    if not rows:
        return {}
    streams = sorted({k for f in rows for k in f["stream_idle_pct"]})
    return {
        "device_idle_pct": sum(f["device_idle_pct"] for f in rows) / len(rows),
        "stream_idle_pct": {
            k: sum(f["stream_idle_pct"].get(k, 100.0) for f in rows) / len(rows) for k in streams
        },
    }
