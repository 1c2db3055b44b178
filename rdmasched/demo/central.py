"""The central-scheduler baseline: one coordinator makes every decision for every node.

The coordinator holds one `NodeCore` per node (rdmasched's own decision logic: the same
object, rules and settings as rdmasched's nodes use, scheduler included) and the sync
groups. Nodes are executors: they hand every new task,
every completion and every SYNC_READY to the coordinator and run what it tells them (DISPATCH
with START, PREEMPT). Lanes, doorbells and the loop are the same as rdmasched's, so the only
difference is where decisions are made, and the round trip that costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rdmasched import messages as msg
from rdmasched._wire import Message
from rdmasched.daemon.core import Effect, NodeCore, PreemptTask, RunSync
from rdmasched.daemon.loop import Loop
from rdmasched.daemon.node import Reactions
from rdmasched.demo.job import GROUP
from rdmasched.errors import MessageError
from rdmasched.scheduler import Scheduler, Start, Task, TaskState

YIELDED = msg.YIELDED  # COMPLETE status: a preempted task's progress (PROTOCOL.md 4.1)


class Coordinator:
    """Decides for every node. Runs on its own loop with a lane to and from each node.

    Its decisions are made by the daemon's own decision logic: one `NodeCore` per node it
    schedules for (rdmasched/daemon/core.py), fed what that node reports; the core's
    effects become orders to the node (a start: DISPATCH with START; a preemption:
    PREEMPT). So the policy is the same object as in rdmasched's nodes, only placed here.
    """

    def __init__(
        self,
        loop: Loop,
        nodes: dict[int, int],
        *,
        group: int,
        sync_cost_ns: int,
        starvation_us: int,
        aging_us: int | None,
        events: int = 4096,
        preemption: Mapping[str, Any] | None = None,
    ) -> None:
        """`events`: each core's decision-event ring (docs/TELEMETRY.md; 0: off, as the
        simulator's cores have it unless it writes a trace). `preemption`: the cores'
        no-thrash settings (`NodeCore`'s; the simulator's mixed stream turns preemption off
        for its Dask-like baseline)."""
        self.loop = loop
        self.clock = loop.clock
        now = self.clock()
        self.cores: dict[int, NodeCore] = {}
        for node, slots in nodes.items():
            # a core that knows no peer: it places nothing elsewhere, and has no liveness
            # to keep (the coordinator's nodes are executors)
            core = NodeCore(
                node,
                {node: ""},
                slots=slots,
                inc=1,
                dead_after_ns=10**10,
                heartbeat_ns=10**9,
                now=now,
                starvation_us=starvation_us,
                aging_us=aging_us,
                sync_cost_ns=sync_cost_ns,
                events=events,
                preemption=preemption,
            )
            self.cores[node] = core
        #: sync group -> its members. The coordinator tracks each group once: a SYNC_READY
        #: is counted here (one counter per group step), and the last one of a step
        #: releases it, one broadcast, on every member's core (whose group is itself alone)
        self.groups: dict[int, frozenset[int]] = {}
        #: (group, step) -> the members that reported it ready
        self._ready: dict[tuple[int, int], set[int]] = {}
        #: node -> its scheduler (the cores'), for traces and stats
        self.sched: dict[int, Scheduler] = {n: c.scheduler for n, c in self.cores.items()}
        self.decisions = 0
        self._bad_msgs = 0
        #: (node, task): a PREEMPT sent to the node, its answer (YIELDED, or the COMPLETE of
        #: a task that finished before the PREEMPT reached it) not yet in
        self._stopping: set[tuple[int, int]] = set()
        #: tasks that finished while their PREEMPT was in flight (taken out of the queue)
        self.raced = 0
        self.define_group(group, frozenset(nodes))

    def define_group(self, group: int, members: frozenset[int]) -> None:
        """Sync group `group` over `members` (nodes this coordinator decides for)."""
        if not members <= self.cores.keys():
            raise ValueError(
                f"group {group}: members {sorted(members - self.cores.keys())} unknown"
            )
        now = self.clock()
        self.groups[group] = members
        for node in members:
            self._do(node, self.cores[node].define_group(group, frozenset((node,)), now))

    def sync_calls(self, group: int, step: int, member: int) -> int:
        """What a SYNC_READY of `member` for `step` of `group` costs, in calls: 1 (a
        counter of the group step), and 1 more if it is the last one of the step (the
        release: one broadcast to the members). The members' cores each start the step's
        sync task on it (`member_ready`); that is the nodes' part of the release, what a
        node does on a broadcast, so it is not a call of the coordinator's: a barrier
        costs it O(1) per SYNC_READY, not O(members)."""
        members = self.groups.get(group)
        if members is None or member not in members:
            return 1
        ready = self._ready.get((group, step), ())
        last = member not in ready and len(ready) + 1 == len(members)
        return 2 if last else 1

    @property
    def rejected(self) -> int:
        """Inputs refused: by the cores (unknown tasks, ...) and messages that are not ours."""
        return self._bad_msgs + sum(sum(c.rejected.values()) for c in self.cores.values())

    def on_message(self, m: Message, peer: int) -> None:
        core = self.cores.get(peer)
        try:
            x = msg.decode(m)
        except MessageError:
            x = None
        now = self.clock()
        if core is None or x is None:
            self._bad_msgs += 1
        elif isinstance(x, msg.Dispatch):
            t = Task(x.task, x.job, x.priority, x.cost_ns, x.progress_ns, origin=peer)
            self._do(peer, core.dispatch(t, now))
        elif isinstance(x, msg.Complete):
            stopping = (peer, x.task) in self._stopping
            self._stopping.discard((peer, x.task))
            if x.status == YIELDED:
                return  # the estimate given to preempted() stands
            held = core.resolve(x.task, peer) if stopping else None
            if held is not None and held.state == TaskState.QUEUED:
                # It finished before the PREEMPT reached the node: preempted() requeued it
                # here, so it leaves the queue instead of running a second time.
                self.raced += 1
                self._do(peer, core.preempt(x.task, None, True, now))
            else:
                self._do(peer, core.complete(x.task, peer, x.runtime_ns, now))
        elif isinstance(x, msg.SyncReady):
            self._sync_ready(x.group, x.step, x.member, x.sent_ns, now)
        else:
            self._bad_msgs += 1

    def _sync_ready(self, group: int, step: int, member: int, sent_ns: int, now: int) -> None:
        members = self.groups.get(group)
        if members is None or member not in members:
            self._bad_msgs += 1
            return
        key = (group, step)
        ready = self._ready.setdefault(key, set())
        ready.add(member)
        if len(ready) < len(members):
            return
        del self._ready[key]
        cores = self.cores
        for node in sorted(members):
            self._do(node, cores[node].member_ready(group, step, node, sent_ns, now))

    def _do(self, node: int, effects: list[Effect]) -> None:
        """The core's decisions for `node`, as orders to it."""
        core = self.cores[node]
        i = 0
        while i < len(effects):
            e = effects[i]
            i += 1
            if isinstance(e, (Start, RunSync)):  # a sync task too: the node runs it
                self.decisions += 1
                t = e.task
                start = msg.Dispatch(t.id, t.job, t.priority, t.cost_ns, t.progress_ns, slot=e.slot)
                self.loop.send(node, *start.encode())
            elif isinstance(e, PreemptTask):
                self.decisions += 1
                v = e.victim
                now = self.clock()
                stop = msg.Preempt(v.id, v.job, e.trigger_ns or now, e.cancel)
                self.loop.send(node, *stop.encode())
                self._stopping.add((node, v.id))
                # The node reports the true progress later; the node keeps its own record,
                # so an estimate from the start time is enough to requeue it here.
                est = v.progress_ns + max(0, now - v.started_ns)
                effects[i:i] = core.preempted(v, est, now)
            # SetLoad, and Send (a core that knows no peer sends nothing): nothing to do


class Executor:
    """A node under the central scheduler: runs what the coordinator says, reports back."""

    def __init__(self, loop: Loop, node: int, coordinator: int) -> None:
        self.loop = loop
        self.node = node
        self.coord = coordinator
        self.clock = loop.clock
        self.running: dict[int, Task] = {}
        self.progress: dict[int, int] = {}
        #: tasks this node finished: a start order for one of them crossed its COMPLETE
        #: (the coordinator requeued it on a PREEMPT that came too late) and is ignored
        self.finished: set[int] = set()
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

    def sync_ready(self, step: int, group: int = GROUP) -> None:
        """This node reached `step` of sync group `group` (the simulator's workloads have
        one per job or per gradient bucket)."""
        m = msg.SyncReady(group, step, self.node, sent_ns=self.clock(), job=group)
        self.loop.send(self.coord, *m.encode())

    def complete(self, task: Task, runtime_ns: int) -> None:
        self.finished.add(task.id)
        self.running.pop(task.id, None)
        self.progress.pop(task.id, None)
        m = msg.Complete(task.id, task.job, runtime_ns, task.progress_ns)
        self.loop.send(self.coord, *m.encode())

    def on_message(self, m: Message, peer: int) -> None:
        x = msg.decode(m)
        if isinstance(x, msg.Dispatch) and x.slot is not None:
            if x.task in self.finished:
                return  # done already; the coordinator has its COMPLETE (see Coordinator)
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
