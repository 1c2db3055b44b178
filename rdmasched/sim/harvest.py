"""Co-located work on a training job's devices: what it harvests and what it costs the job.

A node's K slots are its K devices (GPUs). The workload's co-located work (batch inference,
evaluation, preprocessing) is the demo trainer's background stream (`Trainer._submit_background`,
priority 10, `--background-ms` long, `--backlog` of them per node): the one path, so the
`exclusive` baseline and the job-alone reference (backlog 0) turn it off. `NodeHarvest`
watches one node's devices and counts, per device, the time a job task runs on it, the
time anything runs on it, and the co-located work completed ("harvested", device-seconds of
nominal task time, counted only while the node's job runs).

Two costs of sharing a device are modelled here, once for every workload (the synthetic
data-parallel job, a trace replay, the 1F1B pipeline):

- **The device's own preemption cost** (`preempt_ns`, `--device-preempt-us`): when the node
  core preempts a task for another, the device is busy switching contexts for that long
  before the new task runs (the task the core started begins `preempt_ns` later; the device
  runs nothing useful meanwhile). The victim keeps its progress (a context switch saves its
  state; docs/SIM.md, "Harvest"). A victim that began at the same instant costs nothing: it
  took a slot the job's next task freed and took back at once (in a real job that task is
  already launched on the stream, and the device never switches to the co-located one).
- **Time-slicing** (the `timeslice` scheduler): the co-located work is not given to the node
  core at all. It is left to the OS or the driver: every device with a co-located task
  shares itself between that task and the job's task, with no priority and no preemption.
  A job task that runs beside a co-located task takes `interference` times its length; the
  co-located task runs at `1 - 1/interference` of its speed meanwhile (the device stays
  work-conserving) and at full speed when the device has no job task. A device holds one
  co-located task at a time; more wait for a free device. The co-located tasks' progress is
  integrated exactly between the job's starts and ends (nothing else changes the rates).

**A traced job's devices** (`DeviceTraceTrainer`, a trace replay with co-located work): the
replay's compute stream is the device. Its kernels (the plan's compute ops, in the order the
trace's stream serves them: that order is the trace's, no decision) become the job's tasks
on the node core's one slot, launched when the stream's head is ready (priority
COMPUTE_PRIORITY, above the co-located work's 10); the co-located work goes to the same slot
through the background path, so the core decides who has the device: under rdmasched a
kernel preempts the co-located task (paying the switch), under fifo it waits behind it,
under timeslice the device is shared as above. Every collective then runs on its own stream
in the trace's launch order (the core's slot is the device now, not the bucket stream), and
a collective's rendezvous (a sync task of no length) takes no device time: the task it
interrupts resumes at once, no switch charged (`free_syncs`).

Figures (`harvest_figures`): `device_idle_pct` (no job task on the device: HTA's idle
time), `cluster_idle_pct` (nothing at all on it), `job_device_s` (the job's own work done,
device-seconds), `harvested_device_s`, `useful_device_s` (their sum) and its rate,
`switch_device_s` (time lost to context switches).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from rdmasched.demo.job import COMPUTE_PRIORITY
from rdmasched.demo.taskid import KIND_BACKGROUND, KIND_COMPUTE, task_id, task_kind
from rdmasched.scheduler import Task
from rdmasched.sim.table import cell, stopped_note, text_table
from rdmasched.sim.tally import Tally
from rdmasched.sim.trace import TraceTrainer, _Stream
from rdmasched.workload.streams import COMPUTE

if TYPE_CHECKING:
    from rdmasched.sim.drivers import Shaped, SimTrainer

#: the job's step slowed by a co-located job left to Linux: examples/ddp_train.py --compare
#: on this host, quiet (issue 21): alone 49.1 ms, beside the co-located job 88.2 ms
TIMESLICE_INTERFERENCE = 88.2 / 49.1
#: a GPU context-switch preemption: GPreempt (USENIX ATC'25) preempts within 40 us
DEVICE_PREEMPT_US = 40.0


class NodeHarvest:
    """One node's devices: who runs on each, the switch delays, the co-located work done.

    `CoreNode` calls `start` for a `Start`/`RunSync` (instead of the trainer's `on_start`),
    `preempt` for a `PreemptTask` (instead of the trainer's `on_preempt`); `Shaped` calls
    `submitted` for every task the workload submits (under timeslice a co-located one stays
    here) and `ended` for every completion."""

    def __init__(
        self,
        trainer: SimTrainer,
        shaped: Shaped,
        slots: int,
        *,
        preempt_ns: int = 0,
        timeslice: float | None = None,
        free_syncs: bool = False,
    ) -> None:
        self.trainer = trainer
        self.shaped = shaped
        self.engine = shaped.engine
        self.slots = slots
        self.preempt_ns = preempt_ns
        self.timeslice = timeslice
        #: a sync task takes no device time (a trace replay's rendezvous): no switch for it
        self.free_syncs = free_syncs
        #: slot -> the time of the preemption whose device switch is pending on it
        self._switching: dict[int, int] = {}
        #: task id -> (slot, token) of a start delayed by a device switch
        self._delayed: dict[int, tuple[int, int]] = {}
        self._token = 0
        #: task id -> (slot, start ns, dilation) of every task running here
        self._on: dict[int, tuple[int, int, float]] = {}
        #: per device: things on it, and since when it has been occupied
        self._occ = [0] * slots
        self._occ_since = [0] * slots
        self.occupied_ns = 0
        self.job_ns = 0  # a job task on the device
        self.job_work_ns = 0  # the job's work done (its run time / the dilation)
        self.switch_ns = 0
        self.harvested_ns = 0
        self.harvested = 0  # co-located tasks completed within the job's span
        #: co-located task id -> submissions, and -> completions (a byte a task: sim/tally.py)
        self.colocated_submitted = Tally()
        self.colocated_done = Tally()
        self.switches = 0
        # timeslice: the co-located task on each device, its work left, and the rate clock
        self._cur: list[Task | None] = [None] * slots
        self._left = [0.0] * slots
        self._last = [0] * slots
        self._job_on = [False] * slots
        self._waiting: deque[Task] = deque()
        self._advancing = False

    # ---- the span ----------------------------------------------------------------------------
    def _end(self) -> int:
        """The end of the measured span: the job's last step (no end yet while it runs)."""
        t = self.trainer
        return t.t_end if t.done else _NO_END

    def _occupy(self, slot: int, now: int) -> None:
        if self._occ[slot] == 0:
            self._occ_since[slot] = now
        self._occ[slot] += 1

    def _vacate(self, slot: int, now: int) -> None:
        self._occ[slot] -= 1
        if self._occ[slot] == 0:
            self.occupied_ns += _clip(self._occ_since[slot], now, self._end())

    # ---- the node core's effects ---------------------------------------------------------------
    def start(self, task: Task, slot: int) -> None:
        now = self.engine.now
        if self.free_syncs and task.group is not None:
            self._switching.pop(slot, None)  # the task it interrupted resumes, no switch
        elif self.preempt_ns and self._switching.pop(slot, -1) == now:
            # the device switches contexts first: the task begins that much later
            self._token += 1
            self._delayed[task.id] = (slot, self._token)
            self.switches += 1
            self.switch_ns += _clip(now, now + self.preempt_ns, self._end())
            self.engine.at(now + self.preempt_ns, self._begin_delayed, task, slot, self._token)
            return
        self._begin(task, slot)

    def _begin_delayed(self, task: Task, slot: int, token: int) -> None:
        if self._delayed.get(task.id) != (slot, token) or not self.shaped.ep.alive:
            return  # preempted during its switch, or the node died
        del self._delayed[task.id]
        self._begin(task, slot)

    def _begin(self, task: Task, slot: int) -> None:
        now = self.engine.now
        job = task_kind(task.id) != KIND_BACKGROUND
        dilation = 1.0
        if job and self.timeslice is not None:
            self._advance(slot, now)
            self._job_on[slot] = True
            if self._cur[slot] is not None:
                dilation = self.timeslice
        self._on[task.id] = (slot, now, dilation)
        self._occupy(slot, now)
        self.shaped.dilation = dilation
        try:
            self.trainer.on_start(task, slot)
        finally:
            self.shaped.dilation = 1.0

    def preempt(self, task: Task, slot: int, cancel: bool) -> int:
        """The preempt handler: the victim's progress. The next start on this slot (the
        task the core preempts for) waits for the device's switch."""
        now = self.engine.now
        on = self._on.get(task.id)
        if on is None or on[1] < now:
            # (a victim that began at this very instant never had the device: the task that
            # preempts it was the next in the job's stream, launched ahead of it)
            self._switching[slot] = now
        if self._delayed.pop(task.id, None) is not None:
            return task.progress_ns  # it never began: its progress is what it had
        self._stop(task, now)
        progress = self.trainer.on_preempt(task, slot, cancel)
        if on is not None and on[2] != 1.0:  # slowed beside co-located work: less work done
            progress = task.progress_ns + round((progress - task.progress_ns) / on[2])
        return progress

    def _stop(self, task: Task, now: int) -> None:
        on = self._on.pop(task.id, None)
        if on is None:
            return
        slot, began, dilation = on
        if task_kind(task.id) != KIND_BACKGROUND:
            run = _clip(began, now, self._end())
            self.job_ns += run
            self.job_work_ns += round(run / dilation)
            if self.timeslice is not None:
                self._advance(slot, now)
                self._job_on[slot] = False
        self._vacate(slot, now)

    # ---- the backend's calls -------------------------------------------------------------------
    def submitted(self, task: Task) -> bool:
        """A task the workload submits; True if it stays here (a co-located task under
        timeslice: the node core never sees it)."""
        if task_kind(task.id) != KIND_BACKGROUND:
            return False
        self.colocated_submitted.add(task.id)
        if self.timeslice is None:
            return False
        self._waiting.append(task)
        if self._advancing:
            return True  # `_advance` gives it to the device it freed
        now = self.engine.now
        for s in range(self.slots):
            if self._cur[s] is None and self._waiting:
                self._advance(s, now)
                self._take(s, now)
        return True

    def ended(self, task: Task) -> None:
        """`task` completed (its run on the node core's slot is over)."""
        now = self.engine.now
        self._stop(task, now)
        if task_kind(task.id) == KIND_BACKGROUND:
            self._colocated_done(task, now)

    def _colocated_done(self, task: Task, at: int) -> None:
        self.colocated_done.add(task.id)
        t = self.trainer
        if not t.done or at <= t.t_end:
            self.harvested += 1
            self.harvested_ns += task.cost_ns

    # ---- timeslice: the co-located tasks' progress between the job's starts and ends -----------
    def _take(self, s: int, now: int) -> None:
        if self._waiting:
            task = self._waiting.popleft()
            self._cur[s] = task
            self._left[s] = float(task.cost_ns)
            self._occupy(s, now)
        self._last[s] = now

    def _advance(self, s: int, now: int) -> None:
        """Run device `s`'s co-located work from its last change up to `now`."""
        assert self.timeslice is not None
        t = self._last[s]
        while self._cur[s] is not None and t < now:
            rate = (1.0 - 1.0 / self.timeslice) if self._job_on[s] else 1.0
            if rate <= 0:
                break
            need = self._left[s] / rate
            if t + need > now:
                self._left[s] -= (now - t) * rate
                break
            t += max(1, round(need))
            task = self._cur[s]
            assert task is not None
            self._cur[s] = None
            self._vacate(s, t)
            self.shaped.ledger.background += 1  # (it never reached a core: counted here)
            self._colocated_done(task, t)
            tr = self.trainer
            if not tr.done or t <= tr.t_end:
                self._advancing = True
                try:
                    tr._submit_background()  # (lands in _waiting: this device is free)
                finally:
                    self._advancing = False
            self._take(s, t)
        self._last[s] = now

    # ---- figures -------------------------------------------------------------------------------
    def close(self) -> None:
        """Account what still runs up to the span's end (once, when the figures are made)."""
        t = self.trainer
        end = t.t_end if t.done else self.engine.now
        if self.timeslice is not None:
            for s in range(self.slots):
                self._advance(s, end)
        for tid, (_slot, began, dilation) in list(self._on.items()):
            run = _clip(began, end, end)
            if task_kind(tid) != KIND_BACKGROUND:
                self.job_ns += run
                self.job_work_ns += round(run / dilation)
        for s in range(self.slots):
            if self._occ[s]:
                self.occupied_ns += _clip(self._occ_since[s], end, end)
                self._occ_since[s] = end

    def in_flight(self) -> list[int]:
        """Co-located task ids held here under timeslice (on a device or waiting)."""
        out = [t.id for t in self._cur if t is not None]
        return out + [t.id for t in self._waiting]


class DeviceTraceTrainer(TraceTrainer):
    """A trace replay whose compute stream is the device the core gives out: its kernels
    are the job's tasks on the core's slot, beside the co-located work (module doc). The
    other streams are the replay's in-order servers; the bucket stream's collectives meet
    the other ranks as soon as they are ready and run in the order they met (what the core's
    slot does with them under fifo). Without co-located work it replays as `TraceTrainer`
    does under fifo (alone: the same steps)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        #: core task id -> (op key, its kernels' busy time left); and when its run began
        self._kernels: dict[int, tuple[tuple[int, int], int]] = {}
        self._kernel_run: dict[int, int] = {}
        self._met: set[tuple[int, int]] = set()  # bucket-stream collectives released

    def _released(self, key: tuple[int, int]) -> None:
        if not self._on_core(key):
            super()._released(key)
            return
        # a collective of the bucket stream met the other ranks: that stream serves them
        # in the order they did (fifo's order on the core's slot without co-located work)
        s = self._stream(self._op(key).stream)
        s.queue.append(key)
        self._met.add(key)
        self._pump(s)

    def _pump(self, s: _Stream) -> None:
        if s.busy or not s.queue:
            return
        key = s.queue[0]
        if key in self._met:  # the bucket stream's next collective, released
            s.queue.popleft()
            self._met.discard(key)
            s.busy = True
            op = self._op(key)
            assert op.sync is not None
            cost = self.sync_ns[op.sync.id]
            now = self.b.now()
            s.intervals.append((now, now + cost))
            self.b.call_later(cost, lambda: self._stream_done(s, key))
            return
        op = self._op(key)
        if not s.ready_order or key not in self._ready or op.sync is not None:
            super()._pump(s)
            return
        # the stream's next kernel is ready: launched, it is the core's to place
        s.queue.popleft()
        self._ready.discard(key)
        s.busy = True
        self.seq += 1
        sid = task_id(KIND_COMPUTE, self.node, self.seq)
        self._kernels[sid] = (key, round(op.busy_ns * self.factor))
        cost = round(op.duration_ns * self.factor)
        self.shaped.submit_local(Task(sid, 1, COMPUTE_PRIORITY, cost, origin=self.node))

    def on_start(self, task: Task, slot: int) -> None:
        if task.id in self._kernels:
            self._kernel_run[task.id] = self.b.now()
        super().on_start(task, slot)

    def on_preempt(self, task: Task, slot: int, cancel: bool) -> int:
        self._ran(task.id)
        return super().on_preempt(task, slot, cancel)

    def _ran(self, sid: int) -> None:
        """A kernel's run on the device ended (done or preempted): its busy time, counted
        from where the run began (as the replay counts an op's kernels from its start)."""
        began = self._kernel_run.pop(sid, None)
        if began is None:
            return
        key, busy = self._kernels[sid]
        run = min(self.b.now() - began, busy)
        if run > 0:
            self.streams[COMPUTE].intervals.append((began, began + run))
            self._kernels[sid] = (key, busy - run)

    def _finish(self, task: Task, token: int) -> None:
        if task.id not in self._kernels:
            super()._finish(task, token)
            return
        if self.run_token.get(task.id) != token:
            return  # preempted meanwhile
        self._ran(task.id)
        key, _ = self._kernels.pop(task.id)
        self._end_run(task, token)  # (the backend counts it as progress)
        s = self.streams[COMPUTE]
        s.busy = False
        self._op_done(key)
        self._pump(s)


_NO_END = 1 << 62


def _clip(a: int, b: int, end: int) -> int:
    return max(0, min(b, end) - a)


def harvest_figures(harvests: list[NodeHarvest], span_ns: list[int]) -> dict[str, Any]:
    """The cluster's harvest figures: `harvests` of the live nodes, `span_ns` each one's
    measured span (its job's start to its last step)."""
    for h in harvests:
        h.close()
    dev = sum(h.slots * s for h, s in zip(harvests, span_ns, strict=True))
    if not dev:
        return {}
    job = sum(h.job_ns for h in harvests)
    occ = sum(h.occupied_ns for h in harvests)
    work = sum(h.job_work_ns for h in harvests)
    harv = sum(h.harvested_ns for h in harvests)
    return {
        "device_idle_pct": 100.0 * (1 - job / dev),
        "cluster_idle_pct": 100.0 * (1 - occ / dev),
        "job_device_s": work / 1e9,
        "harvested_device_s": harv / 1e9,
        "harvested_tasks": sum(h.harvested for h in harvests),
        "useful_device_s": (work + harv) / 1e9,
        "useful_pct": 100.0 * (work + harv) / dev,
        "switch_device_s": sum(h.switch_ns for h in harvests) / 1e9,
        "device_switches": sum(h.switches for h in harvests),
        "device_s": dev / 1e9,
    }


#: the job-alone reference: the workload under "fifo" with no co-located work (what the
#: `exclusive` baseline runs for one job); its rows carry `"reference": ALONE`
ALONE = "alone"


def compare_to_alone(rows: list[dict[str, Any]]) -> None:
    """Each harvest row against the job-alone reference at its size (and workload), as
    `vs_alone`: the step's change (%), the cluster's device idle against alone's (% less),
    and the useful work per device-second against alone's (% more)."""
    base = {(r["nodes"], r.get("workload")): r for r in rows if r.get("reference") == ALONE}
    for r in rows:
        b = base.get((r["nodes"], r.get("workload")))
        if b is None or r is b or not r.get("step_time_ms") or not b.get("step_time_ms"):
            continue
        if "useful_pct" not in r or "useful_pct" not in b:
            continue
        idle = b["cluster_idle_pct"]
        r["vs_alone"] = {
            "step_pct": 100.0 * (r["step_time_ms"] / b["step_time_ms"] - 1),
            "device_idle_less_pct": 100.0 * (1 - r["cluster_idle_pct"] / idle) if idle else None,
            "useful_more_pct": 100.0 * (r["useful_pct"] / b["useful_pct"] - 1),
        }


HARVEST_COLUMNS: list[tuple[str, str, str]] = [
    ("workload", "workload", "{}"),
    ("label", "run", "{}"),
    ("nodes", "N", "{}"),
    ("steps", "steps", "{}"),
    ("step_time_ms", "step ms", "{:.3f}"),
    ("vs_alone.step_pct", "step vs alone %", "{:+.2f}"),
    ("harvested_device_s", "harvested dev-s", "{:.2f}"),
    ("job_device_s", "job dev-s", "{:.2f}"),
    ("device_idle_pct", "no-job idle %", "{:.2f}"),
    ("cluster_idle_pct", "device idle %", "{:.2f}"),
    ("vs_alone.device_idle_less_pct", "idle less %", "{:.1f}"),
    ("useful_pct", "useful %", "{:.2f}"),
    ("vs_alone.useful_more_pct", "useful more %", "{:+.1f}"),
    ("switch_device_s", "switch dev-s", "{:.3f}"),
]


def label(row: dict[str, Any]) -> str:
    """A row's name in the harvest table: the scheduler, or the job-alone reference."""
    if row.get("reference") == ALONE:
        return f"{ALONE} ({row['scheduler']}, no co-located work)"
    return str(row["scheduler"])


def format_harvest(rows: list[dict[str, Any]]) -> str:
    head = [c[1] for c in HARVEST_COLUMNS]
    body = [[cell(r | {"label": label(r)}, k, f) for k, _, f in HARVEST_COLUMNS] for r in rows]
    return text_table(head, body, [stopped_note(r) for r in rows])
