"""The central-scheduler baseline: one coordinator makes every decision for every node.

The coordinator holds one `Scheduler` per node (the same class, the same rules and settings
as rdmasched's nodes use) and the sync groups. Nodes are executors: they hand every new task,
every completion and every SYNC_READY to the coordinator and run what it tells them (DISPATCH
with START, PREEMPT). Lanes, doorbells and the loop are the same as rdmasched's, so the only
difference is where decisions are made, and the round trip that costs.
"""

from __future__ import annotations

from typing import Any

from rdmasched import messages as msg
from rdmasched._wire import Message
from rdmasched.daemon.loop import Loop
from rdmasched.daemon.node import Reactions, sync_task_id
from rdmasched.demo.workload import GROUP
from rdmasched.scheduler import Action, Cancel, Forward, Preempt, Scheduler, Start, Task

YIELDED = msg.YIELDED  # COMPLETE status: a preempted task's progress (PROTOCOL.md 4.1)


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
            x = msg.decode(m)
            if isinstance(x, msg.Dispatch):
                t = Task(x.task, x.job, x.priority, x.cost_ns, x.progress_ns, origin=peer)
                self._do(peer, s.dispatch(t), 0)
            elif isinstance(x, msg.Complete):
                if x.status == YIELDED:
                    return  # the estimate given to yielded() stands
                self._do(peer, s.complete(x.task), 0)
            elif isinstance(x, msg.SyncReady):
                for node, sn in self.sched.items():
                    self._do(node, sn.sync_ready(x.group, x.step, x.member), x.sent_ns)
        except (KeyError, ValueError):  # SchedulerError and MessageError subclass these
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
                start = msg.Dispatch(t.id, t.job, t.priority, t.cost_ns, t.progress_ns, slot=a.slot)
                self.loop.send(node, *start.encode())
            elif isinstance(a, Preempt):
                v = a.victim
                stop = msg.Preempt(v.id, v.job, trigger_ns or self.clock(), a.cancel)
                self.loop.send(node, *stop.encode())
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
        m = msg.Dispatch(
            task.id, task.job, task.priority, task.cost_ns, task.progress_ns, origin=self.node
        )
        self.loop.send(self.coord, *m.encode())

    def sync_ready(self, step: int) -> None:
        m = msg.SyncReady(GROUP, step, self.node, sent_ns=self.clock(), job=GROUP)
        self.loop.send(self.coord, *m.encode())

    def complete(self, task: Task, runtime_ns: int) -> None:
        self.running.pop(task.id, None)
        self.progress.pop(task.id, None)
        m = msg.Complete(task.id, task.job, runtime_ns, task.progress_ns)
        self.loop.send(self.coord, *m.encode())

    def on_message(self, m: Message, peer: int) -> None:
        x = msg.decode(m)
        if isinstance(x, msg.Dispatch) and x.slot is not None:
            group = x.job if x.priority == 255 else None
            t = Task(
                x.task,
                x.job,
                x.priority,
                x.cost_ns,
                self.progress.get(x.task, x.progress_ns),
                origin=self.node,
                group=group,
            )
            self.running[x.task] = t
            self.trainer.on_start(t, x.slot)
        elif isinstance(x, msg.Preempt):
            victim = self.running.pop(x.task, None)
            if victim is None:
                return  # finished meanwhile: nothing to stop
            self.reactions.add(self.clock() - x.trigger_ns)
            progress = self.trainer.on_preempt(victim, 0, x.cancel)
            self.progress[x.task] = progress
            back = msg.Complete(x.task, x.job, 0, progress, YIELDED)
            self.loop.send(self.coord, *back.encode())
