"""A synthetic data-parallel training workload, the same under both schedulers.

Every node has K execution slots. Per training step each node runs K compute tasks
(priority 100, `compute_ms` +- `jitter`); when its K tasks are done it announces SYNC_READY
for the step; when every node has, each node runs the step's gradient-sync task at the top
priority (`sync_ms`), preempting a background task if no slot is free; when its sync task
completes the node starts the next step. Low-priority background tasks (priority 10,
`background_ms`) soak up idle slots: each node keeps `background_backlog` of them queued.

Work is simulated: a started task "runs" for its remaining cost on a timer of the node's loop
(no CPU is burnt), so the figures measure scheduling and messaging, not computation. Slot time
is accounted exactly: a slot is busy from the start handler until its task completes or is
preempted.

`Backend` is what differs between rdmasched (decisions on the node) and the central baseline
(decisions in one coordinator): how a task is handed in, how sync readiness is announced, how
a completion is reported.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

from rdmasched.demo.taskid import KIND_BACKGROUND, KIND_COMPUTE, task_id, task_kind
from rdmasched.scheduler import Task

COMPUTE_PRIORITY = 100
BACKGROUND_PRIORITY = 10
GROUP = 1


@dataclass(frozen=True)
class WorkloadConfig:
    steps: int = 40
    compute_ms: float = 4.0
    jitter: float = 0.25
    sync_ms: float = 1.0
    background_ms: float = 2.0
    background_backlog: int = 4
    seed: int = 1

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Backend(Protocol):
    def now(self) -> int: ...
    def call_later(self, delay_ns: int, fn: Any) -> None: ...
    def submit_local(self, task: Task) -> None: ...
    def sync_ready(self, step: int) -> None: ...
    def complete(self, task: Task, runtime_ns: int) -> None: ...


class Trainer:
    """One node's share of the workload, driven by its backend's handlers."""

    def __init__(self, node: int, slots: int, cfg: WorkloadConfig, backend: Backend) -> None:
        self.node = node
        self.slots = slots
        self.cfg = cfg
        self.b = backend
        self.rng = random.Random(cfg.seed * 1000 + node)
        self.step = 0
        self.done = False
        self.compute_left = 0
        self.seq = 0
        self.step_started_ns = 0
        self.step_times_ns: list[int] = []
        # slot accounting
        self.busy_ns = 0
        self.started_at: dict[int, int] = {}  # task id -> when its current run began
        self.run_token: dict[int, int] = {}  # task id -> token of its live timer
        self.t0 = 0
        self.t_end = 0
        self.preemptions = 0
        self.completions = 0
        self._final_busy: int | None = None
        #: step -> when this node announced SYNC_READY for it, and when its sync task
        #: started (the release reached it); monotonic ns, one clock for every process of
        #: one host, so the runner can compare nodes
        self.ready_ns: list[int] = []
        self.release_ns: list[int] = []

    # ---- driving -----------------------------------------------------------------------
    def begin(self) -> None:
        self.t0 = self.b.now()
        for _ in range(self.cfg.background_backlog):
            self._submit_background()
        self._start_step()

    def _ms(self, ms: float) -> int:
        return int(ms * 1_000_000)

    def _start_step(self) -> None:
        self.step_started_ns = self.b.now()
        self.compute_left = self.slots
        for _ in range(self.slots):
            j = 1 + self.rng.uniform(-self.cfg.jitter, self.cfg.jitter)
            self.seq += 1
            self.b.submit_local(
                Task(
                    task_id(KIND_COMPUTE, self.node, self.seq),
                    1,
                    COMPUTE_PRIORITY,
                    self._ms(self.cfg.compute_ms * j),
                    origin=self.node,
                )
            )

    def _submit_background(self) -> None:
        self.seq += 1
        self.b.submit_local(
            Task(
                task_id(KIND_BACKGROUND, self.node, self.seq),
                2,
                BACKGROUND_PRIORITY,
                self._ms(self.cfg.background_ms),
                origin=self.node,
            )
        )

    # ---- handlers ------------------------------------------------------------------------
    def on_start(self, task: Task, slot: int) -> None:
        now = self.b.now()
        self.started_at[task.id] = now
        if task.group is not None and len(self.release_ns) == self.step:
            self.release_ns.append(now)  # the first start of this step's sync task
        token = self.run_token.get(task.id, 0) + 1
        self.run_token[task.id] = token
        cost = task.cost_ns if task.group is None else self._ms(self.cfg.sync_ms)
        remaining = max(0, cost - task.progress_ns)
        self.b.call_later(remaining, lambda: self._finish(task, token))

    def on_preempt(self, task: Task, slot: int, cancel: bool) -> int:
        now = self.b.now()
        began = self.started_at.pop(task.id, now)
        self.busy_ns += now - began
        self.run_token[task.id] = self.run_token.get(task.id, 0) + 1  # its timer is void
        self.preemptions += 1
        return task.progress_ns + (now - began)

    def _end_run(self, task: Task, token: int) -> tuple[int, int] | None:
        """`task`'s run ended (its timer fired): None if it was preempted meanwhile; else
        its slot time is counted, its completion reported, and (now, began) returned. The
        one place every trainer's run ends (the demo's, the simulator's replays)."""
        if self.run_token.get(task.id) != token:
            return None
        now = self.b.now()
        began = self.started_at.pop(task.id, now)
        self.busy_ns += now - began
        self.run_token.pop(task.id, None)
        self.completions += 1
        self.b.complete(task, now - began)
        return now, began

    def _end_if_last(self, now: int) -> bool:
        """After a step: if it was the last, the trainer is done at `now` (the measured span
        ends here; tasks still running count up to now). Whether it was."""
        if self.step < self.cfg.steps:
            return False
        self.done = True
        self.t_end = now
        self._final_busy = self.busy_ns + sum(now - t for t in self.started_at.values())
        return True

    def _finish(self, task: Task, token: int) -> None:
        ended = self._end_run(task, token)
        if ended is None:
            return  # preempted meanwhile
        now, _ = ended
        if task.group is not None:  # the step's gradient sync is done
            self.step_times_ns.append(now - self.step_started_ns)
            self.step += 1
            if not self._end_if_last(now):
                self._start_step()
        elif task_kind(task.id) == KIND_COMPUTE:
            self.compute_left -= 1
            if self.compute_left == 0:
                self.ready_ns.append(now)
                self.b.sync_ready(self.step)
        elif not self.done:
            self._submit_background()

    # ---- figures -------------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        end = self.t_end or self.b.now()
        busy = self._final_busy
        if busy is None:  # not finished: count the running tasks up to now
            busy = self.busy_ns + sum(end - t for t in self.started_at.values())
        span = max(1, end - self.t0)
        steps = self.step_times_ns
        return {
            "node": self.node,
            "steps": len(steps),
            "duration_s": span / 1e9,
            "slot_idle_pct": 100.0 * (1 - busy / (self.slots * span)),
            "step_time_ms": (sum(steps) / len(steps) / 1e6) if steps else None,
            "preemptions": self.preemptions,
            "completions": self.completions,
            "ready_ns": self.ready_ns,
            "release_ns": self.release_ns,
        }
