"""Replaying a torch.profiler trace: one rank's task graph on every simulated node.

`TraceTrainer` is the demo's trainer with its training step replaced by a step of the
trace (rdmasched.workload): the step's compute tasks go to the node's scheduler as compute
tasks (priority 100) with the node's scaled duration; each collective (a DDP gradient bucket,
a buffer broadcast) becomes one sync group's step (group `TRACE_GROUP_BASE + j` for the
step's j-th collective), announced with SYNC_READY when its dependencies are done and run
as the sync task the scheduler releases. A task starts when every task it depends on in its
step is done; the step ends when all are. The background backlog is the demo's.

How long a collective runs is the network's: `allreduce_ns` models a bandwidth-optimal
all-reduce (2 (N-1)/N bytes over the link's bandwidth) plus a tree's latency term (2
log2 N link latencies), at the cluster's widest level.
"""

from __future__ import annotations

import math

from rdmasched.demo.job import COMPUTE_PRIORITY, WorkloadConfig
from rdmasched.demo.taskid import KIND_BACKGROUND, KIND_COMPUTE, task_id, task_kind
from rdmasched.scheduler import Task
from rdmasched.sim.drivers import Ledger, Shaped, SimTrainer
from rdmasched.sim.linkmodel import LinkModel
from rdmasched.workload import ComputeTask, Replicated, SyncTask

TRACE_GROUP_BASE = 16


def allreduce_ns(nbytes: int, nodes: int, model: LinkModel, level: int) -> int:
    lv = model.levels[level]
    if nodes <= 1:
        return 0
    data = 2.0 * (nodes - 1) / nodes * nbytes / lv.bandwidth * 1e9
    return int(data + 2 * math.ceil(math.log2(nodes)) * lv.latency_ns)


def trace_groups(rep: Replicated) -> int:
    """Sync groups the trace needs: the most collectives in one of its steps."""
    return max((len(s.syncs) for s in rep.base.steps), default=0)


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
    ) -> None:
        super().__init__(node, slots, cfg, backend, ledger)
        self.rep = rep
        self.shaped = backend
        #: trace sync task id -> its run time on the cluster's network
        self.sync_ns = sync_ns
        self._pending: dict[int, int] = {}
        self._waiters: dict[int, list[int]] = {}
        self._tasks: dict[int, ComputeTask | SyncTask] = {}
        self._by_sched: dict[int, int] = {}  # scheduler task id -> trace task id
        self._by_group: dict[int, int] = {}  # sync group -> trace sync task id
        self._left = 0

    def _start_step(self) -> None:
        self.step_started_ns = self.b.now()
        st = self.rep.base.steps[self.step % len(self.rep.base.steps)]
        self._tasks = {t.id: t for t in st.tasks}
        self._pending = {}
        self._waiters = {}
        self._by_group = {}
        for j, x in enumerate(st.syncs):
            self._by_group[TRACE_GROUP_BASE + j] = x.id
        self._group_of = {v: k for k, v in self._by_group.items()}
        self._left = len(st.tasks)
        ready = []
        for t in st.tasks:
            deps = [d for d in t.deps if d in self._tasks]
            self._pending[t.id] = len(deps)
            for d in deps:
                self._waiters.setdefault(d, []).append(t.id)
            if not deps:
                ready.append(t.id)
        for tid in ready:
            self._launch(tid)

    def _launch(self, tid: int) -> None:
        t = self._tasks[tid]
        if isinstance(t, ComputeTask):
            self.seq += 1
            sid = task_id(KIND_COMPUTE, self.node, self.seq)
            self._by_sched[sid] = tid
            cost = self.rep.duration_ns(self.node, t)
            self.b.submit_local(Task(sid, 1, COMPUTE_PRIORITY, cost, origin=self.node))
        else:
            self.shaped.sync_ready(self.step, self._group_of[tid])

    def _done(self, tid: int) -> None:
        self._left -= 1
        for w in self._waiters.pop(tid, ()):
            self._pending[w] -= 1
            if self._pending[w] == 0:
                self._launch(w)
        if self._left == 0:
            now = self.b.now()
            self.step_times_ns.append(now - self.step_started_ns)
            self.step += 1
            if self.step >= self.cfg.steps:
                self.done = True
                self.t_end = now
                self._final_busy = self.busy_ns + sum(now - t for t in self.started_at.values())
            else:
                self._start_step()

    def on_start(self, task: Task, slot: int) -> None:
        self.ledger.run_starts += 1
        now = self.b.now()
        if task.group is not None:
            self.ledger.release(self.node, task.group, task.id & 0xFFFFFFFF, now)
            cost = self.sync_ns[self._by_group[task.group]]
        else:
            cost = task.cost_ns
        self.started_at[task.id] = now
        token = self.run_token.get(task.id, 0) + 1
        self.run_token[task.id] = token
        remaining = max(0, cost - task.progress_ns)
        self.b.call_later(remaining, lambda: self._finish(task, token))

    def _finish(self, task: Task, token: int) -> None:
        if self.run_token.get(task.id) != token:
            return
        now = self.b.now()
        began = self.started_at.pop(task.id, now)
        self.busy_ns += now - began
        self.run_token.pop(task.id, None)
        self.completions += 1
        self.b.complete(task, now - began)
        if task.group is not None:
            self._done(self._by_group[task.group])
        elif task_kind(task.id) == KIND_COMPUTE:
            self._done(self._by_sched.pop(task.id))
        elif task_kind(task.id) == KIND_BACKGROUND and not self.done:
            self._submit_background()
