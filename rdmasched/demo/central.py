"""The central-scheduler baseline: one coordinator makes every decision for every node.

The coordinator holds one `Scheduler` per node (the same class, the same rules and settings
as rdmasched's nodes use) and the sync groups. Nodes are executors: they hand every new task,
every completion and every SYNC_READY to the coordinator and run what it tells them (DISPATCH
with START, PREEMPT). Lanes, doorbells and the loop are the same as rdmasched's, so the only
difference is where decisions are made, and the round trip that costs.
"""

from __future__ import annotations

from typing import Any

from rdmasched._wire import Message
from rdmasched.daemon.loop import Loop
from rdmasched.daemon.node import Reactions, sync_task_id
from rdmasched.demo.workload import GROUP
from rdmasched.scheduler import Action, Cancel, Forward, Preempt, Scheduler, Start, Task
from rdmasched.wire import Flag, Kind

START = Flag.START  # DISPATCH flag: run this task now on slot arg2 (PROTOCOL.md 4.1)
YIELDED = 1  # COMPLETE status: a preempted task's progress


class Coordinator:
    """Decides for every node. Runs on its own loop with a lane to and from each node."""

    def __init__(
        self,
        loop: Loop,
        nodes: dict[int, int],
        *,
        group: int,
        sync_cost_ns: int,
        starvation_us: int,
        aging_us: int | None,
    ) -> None:
        self.loop = loop
        self.clock = loop.clock
        self.sched: dict[int, Scheduler] = {}
        for node, slots in nodes.items():
            s = Scheduler(
                slots,
                clock=self.clock,
                starvation_us=starvation_us,
                aging_us=aging_us,
                node_id=node,
            )

            def step_task(g: int, step: int, node: int = node) -> Task:
                return Task(
                    sync_task_id(g, step), g, 255, sync_cost_ns, payload={"step": step}, origin=node
                )

            s.define_group(group, set(nodes), step_task)
            self.sched[node] = s
        self.decisions = 0
        self.rejected = 0

    def on_message(self, m: Message, peer: int) -> None:
        s = self.sched[peer]
        try:
            if m.kind == Kind.DISPATCH:
                acts = s.dispatch(Task(m.id, m.job, m.priority, m.arg0, m.arg1, origin=peer))
                self._do(peer, acts, 0)
            elif m.kind == Kind.COMPLETE:
                if m.arg2 == YIELDED:
                    return  # the estimate given to yielded() stands
                self._do(peer, s.complete(m.id), 0)
            elif m.kind == Kind.SYNC_READY:
                for node, sn in self.sched.items():
                    self._do(node, sn.sync_ready(m.id, m.arg0, m.arg2), m.arg1)
        except (KeyError, ValueError):  # SchedulerError subclasses these
            self.rejected += 1

    def _do(self, node: int, actions: list[Action], trigger_ns: int) -> None:
        s = self.sched[node]
        i = 0
        while i < len(actions):
            a = actions[i]
            i += 1
            self.decisions += 1
            if isinstance(a, Start):
                t = a.task
                self.loop.send(
                    node,
                    Kind.DISPATCH,
                    t.id,
                    t.job,
                    t.priority,
                    START,
                    t.cost_ns,
                    t.progress_ns,
                    a.slot,
                )
            elif isinstance(a, Preempt):
                v = a.victim
                flags = Flag.CANCEL if a.cancel else 0
                self.loop.send(
                    node, Kind.PREEMPT, v.id, v.job, 0, int(flags), trigger_ns or self.clock()
                )
                # The node reports the true progress later; the node keeps its own record,
                # so an estimate from the start time is enough to requeue it here.
                est = v.progress_ns + max(0, self.clock() - v.started_ns)
                actions[i:i] = s.yielded(v.id, est)
            elif isinstance(a, (Cancel, Forward)):
                pass


class Executor:
    """A node under the central scheduler: runs what the coordinator says, reports back."""

    def __init__(self, loop: Loop, node: int, coordinator: int) -> None:
        self.loop = loop
        self.node = node
        self.coord = coordinator
        self.clock = loop.clock
        self.running: dict[int, Task] = {}
        self.progress: dict[int, int] = {}
        self.reactions = Reactions()
        self.trainer: Any = None

    # Backend for the workload
    def now(self) -> int:
        return self.clock()

    def call_later(self, delay_ns: int, fn: Any) -> None:
        self.loop.call_later(delay_ns, fn)

    def submit_local(self, task: Task) -> None:
        self.loop.send(
            self.coord,
            Kind.DISPATCH,
            task.id,
            task.job,
            task.priority,
            0,
            task.cost_ns,
            task.progress_ns,
            self.node,
        )

    def sync_ready(self, step: int) -> None:
        self.loop.send(
            self.coord, Kind.SYNC_READY, GROUP, GROUP, 0, 0, step, self.clock(), self.node
        )

    def complete(self, task: Task, runtime_ns: int) -> None:
        self.running.pop(task.id, None)
        self.progress.pop(task.id, None)
        self.loop.send(
            self.coord, Kind.COMPLETE, task.id, task.job, 0, 0, runtime_ns, task.progress_ns, 0
        )

    def on_message(self, m: Message, peer: int) -> None:
        if m.kind == Kind.DISPATCH and m.flags & START:
            group = m.job if m.priority == 255 else None
            t = Task(
                m.id,
                m.job,
                m.priority,
                m.arg0,
                self.progress.get(m.id, m.arg1),
                origin=self.node,
                group=group,
            )
            self.running[m.id] = t
            self.trainer.on_start(t, int(m.arg2))
        elif m.kind == Kind.PREEMPT:
            victim = self.running.pop(m.id, None)
            if victim is None:
                return  # finished meanwhile: nothing to stop
            self.reactions.add(self.clock() - m.arg0)
            progress = self.trainer.on_preempt(victim, 0, bool(m.flags & Flag.CANCEL))
            self.progress[m.id] = progress
            self.loop.send(self.coord, Kind.COMPLETE, m.id, m.job, 0, 0, 0, progress, YIELDED)
