"""The host daemon's side of its clients: the training ranks of this host (docs/CLIENT.md).

A node is a host with K execution slots (GPUs), run as one daemon (`Node`). The ranks on the
host (one process per GPU under torchrun or srun) are its clients: `rdmasched.client.Client`
connects to the daemon over two shm lanes per client, one each way, and nothing else (no
socket on the message path):

    up   <cluster>.<host>.c<k>.up     client k -> daemon, created by the daemon at start
    down <cluster>.<host>.c<k>.down   daemon -> client k, created by the client

`<cluster>.<host>` is the daemon's **endpoint**: the cluster's name and the host's node name.
The lanes' names, the messages' ops and the error frames are the client-lane protocol,
`rdmasched.clientproto`, which the client imports too. The daemon creates the up lanes of
clients 0..max_clients-1 when it opens (one per slot by default; `k` is the rank's
LOCAL_RANK). On shm links they ring the node's doorbell and the node's loop reads them in
its own wait (`Loop.adopt`; every `check_ms` a loop timer looks for clients gone); on verbs
links they have a doorbell of their own and one thread (`rdmasched-clients<id>`) waits on
them and hands every batch to the node's loop (`Node.call_soon`). The loop owns all the
state below, so nothing here is shared between threads.

The hub drives the node through its public surface: it takes over the node's handlers
(`Node.handlers` are its fallback) on the loop thread, the node's loop running or not (a
task that started before with no handler is started then, as below), feeds the node's
core (`node.core`) what the clients ask and hands what the core decides to
`Node.carry_out`, on the loop thread.

A lane has one live sender (the shm transport refuses a second), so two processes cannot be
client k at once. A client says HELLO on its up lane; the daemon attaches to the client's
down lane and answers WELCOME. From then on:

- a task a client submits (or dispatches) is **owned** by that client: the daemon routes its
  Start, PreemptTask and CompleteNotice effects to it alone. Tasks of other nodes placed
  here go to the client whose index is the slot they start on, else to the lowest connected
  client, else to the daemon's own handlers. A task that starts while none of these exists
  (the host's ranks have not connected yet, or all of them left) **waits** in its slot and is
  handed to the first client that connects; preempting or cancelling it meanwhile is answered
  at once with its progress unchanged (it never ran).
  Only a task's owner may complete it or cancel it by id (another client is refused).
- a client holds at most `max_queued` tasks here (queued, running, or placed elsewhere):
  past it its submit is refused with `QueueFullError`, which the client raises.
- a sync group's **local participants** are the clients that defined it; the host is ready
  at a step once `local` of them (default: max_clients) said `sync_ready`; its release runs
  `on_sync` on every participant, and the sync task completes when all of them are done.
  A group belongs to the client's **session** (its HELLO's, the launcher's run): the
  node's group is `session_group(session, group)`, and the hub forgets a group when its
  last participant leaves. A refused `sync_ready` is raised by the client.
- a preempt answer (the progress) comes back asynchronously; the preempted task stays
  PREEMPTING until it does (the preempting task starts at once).

A client whose process is gone (found by its up lane's liveness token, which the kernel
drops when the process dies and any PID namespace sees, checked every `check_ms`) is
dropped: its tasks held here are cancelled (queued ones first, CLIENT_CANCEL_SLICE a loop
pass so that no pass takes long, then running ones through PREEMPT(cancel)), those placed on
other hosts are cancelled there (PREEMPT(cancel), record dropped), other nodes' tasks it ran
are requeued here, it leaves its groups, its down lane is closed, and
`stats()["clients_dead"]` counts it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from rdmasched import Kind
from rdmasched._ring import Batch, LaneSet, RxLane, TxLane
from rdmasched._shm import read_header
from rdmasched._wire import Message
from rdmasched.api import LATER, Handlers, check_gang
from rdmasched.clientproto import (
    NONE,
    OP_BYE,
    OP_COMPLETE,
    OP_DISPATCH,
    OP_DONE,
    OP_ERROR,
    OP_HELLO,
    OP_PEER,
    OP_PREEMPT,
    OP_READY,
    OP_REPLY,
    OP_REQUEST,
    OP_START,
    OP_STOP,
    OP_SUBMIT,
    OP_SYNC,
    OP_SYNC_DONE,
    OP_WELCOME,
    OP_YIELDED,
    QueueFullError,
    bell_name,
    down_lane,
    endpoint_name,
    error_meta,
    preempt_from_flags,
    session_group,
    up_lane,
)
from rdmasched.daemon.core import SYNC_ID_BASE as _SYNC_ID_BASE
from rdmasched.errors import (
    ArgumentError,
    ConfigError,
    EpochError,
    LaneError,
    LaneFullError,
    PeerDeadError,
    RdmaschedError,
)
from rdmasched.limits import CLIENT_CANCEL_SLICE, CLIENT_QUEUED_DEFAULT, CLIENT_QUEUED_MAX
from rdmasched.messages import Outgoing
from rdmasched.scheduler import Task
from rdmasched.scheduler.task import TaskState, task_key
from rdmasched.transport import shm

if TYPE_CHECKING:
    from rdmasched.daemon.loop import Loop
    from rdmasched.daemon.node import Node

_log = logging.getLogger("rdmasched.clients")

__all__ = ["HUB_SPIN_US", "ClientHub"]

#: the hub reader's spin after a message, us, unless `rdmasched daemon --spin-us` says
HUB_SPIN_US = 50

_STOPPING = (TaskState.PREEMPTING, TaskState.CANCELLING)
_ENDED = (TaskState.DONE, TaskState.CANCELLED)
_NEW_SESSION = (
    "; a new training session starts its groups again under a session of its own (the "
    "launcher's run, or Client(session=...)), docs/CLIENT.md"
)


def _fields(m: Message, k: int) -> tuple[Any, ...]:
    """What `ClientHub._handle` takes of client `k`'s message `m` (a copy: a batch is
    reused once read)."""
    return (k, m.hops, m.kind, m.id, m.job, m.priority, m.flags, m.arg0, m.arg1, m.arg2, m.meta)


class _Client:
    """One connected client, as the daemon sees it (loop thread only)."""

    def __init__(self, k: int, pid: int, start: int, tx: TxLane, session: str) -> None:
        self.k = k
        self.pid = pid
        self.start = start
        self.tx = tx
        #: the launcher's run this rank belongs to (its HELLO; "" without a launcher)
        self.session = session
        #: ids of this node's tasks the client submitted and the node still holds (the
        #: reverse of `ClientHub.owner`), at most `max_queued`
        self.owned: set[int] = set()
        #: when `owned` was last pruned of tasks that ended unseen (cancelled while queued),
        #: and the hub's count of cancels then
        self.pruned_ns = 0
        self.pruned_cancels = -1
        #: messages queued while the lane is full (a client lane is local: no dst, src or
        #: relays, so the messages' own `Outgoing` shape)
        self.outbox: deque[Outgoing] = deque()
        #: the groups it defined: group (as the client names it) -> wire group
        self.groups: dict[int, int] = {}


class ClientHub:
    """Serves a `Node`'s clients (the ranks of its host). `open()` after `node.open()`."""

    def __init__(
        self,
        node: Node,
        *,
        host: str | None = None,
        max_clients: int | None = None,
        nslots: int = 256,
        check_ms: int = 100,
        max_queued: int | None = None,
        spin_us: int = HUB_SPIN_US,
    ) -> None:
        self.node = node
        self.host = host or node.spec.name
        self.endpoint = endpoint_name(node.cluster.name, self.host)
        self.max_clients = node.spec.slots if max_clients is None else max_clients
        if not 1 <= self.max_clients <= 255:
            raise ConfigError(f"max_clients must be 1..255, not {self.max_clients}")
        self.max_queued = CLIENT_QUEUED_DEFAULT if max_queued is None else max_queued
        if not 1 <= self.max_queued <= CLIENT_QUEUED_MAX:
            raise ConfigError(f"max_queued must be 1..{CLIENT_QUEUED_MAX}, not {self.max_queued}")
        self.nslots = nslots
        self.check_ns = check_ms * 1_000_000
        #: how long the reader spins on the up lanes after a message before it sleeps on
        #: their doorbell, us (docs/DAEMON.md, "Spinning")
        self.spin_us = spin_us
        self._rx: list[RxLane] = []
        #: who reads the up lanes: the node's loop, in its own wait (`_loop`, shm links),
        #: else a thread of the hub's (`_thread`) on a set and doorbell of its own
        self._loop: Loop | None = None
        self._adopted = False
        self._set: LaneSet | None = None
        self._bell: shm.Doorbell | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # ---- loop-thread state ----
        self.clients: dict[int, _Client] = {}
        #: this node's task id -> the client that submitted it
        self.owner: dict[int, int] = {}
        #: (origin, id) of a task running here -> the client it was started on
        self.running_on: dict[tuple[int, int], int] = {}
        #: wire group (`session_group`) -> (session, group): every group defined here
        self.group_names: dict[int, tuple[str, int]] = {}
        #: groups of this host alone without a session: the wire group of the one in use,
        #: and how many times each was used (`_wire_group`)
        self._local_gid: dict[int, int] = {}
        self._local_uses: dict[int, int] = {}
        #: wire group -> participants (client indexes); -> local count the host waits for
        self.participants: dict[int, set[int]] = {}
        self.local: dict[int, int] = {}
        self.ready: dict[tuple[int, int], set[int]] = {}
        self.announced: set[tuple[int, int]] = set()
        #: sync task id -> participants still running its on_sync
        self.syncing: dict[int, set[int]] = {}
        self.connects = 0
        self.clients_left = 0
        self.clients_dead = 0
        #: client index -> tasks it submitted (accepted) / completed, over every process that
        #: was that index (the metrics per rank, docs/TELEMETRY.md)
        self.submitted: dict[int, int] = {}
        self.completed: dict[int, int] = {}
        #: (origin, task) -> (task, slot): started while no client (and no handler of the
        #: daemon's own) could run it; handed to the first client that connects
        self.waiting: dict[tuple[int, int], tuple[Task, int]] = {}
        #: preempt answers for tasks a rank completed while the PREEMPT was on its way
        self.late_answers = 0
        #: tasks of clients that left or died, cancelled here
        self.cancelled = 0
        #: tasks of departed clients still to cancel (a slice a loop pass), and their ids
        #: (a start of one of them is kept back, `waiting`, until it is cancelled)
        self._to_cancel: deque[int] = deque()
        self._doomed: set[int] = set()
        self._doomed_running: list[int] = []
        self._slicing = False
        #: STOP notices of this pass's preemptions not written yet (`_write_stops`)
        self._stops: list[tuple[Any, ...]] = []
        #: PREEMPT(cancel)s clients asked for (a queued task ends unseen: `_prune`)
        self._cancels = 0
        self.rejected: dict[str, int] = {}
        self.msgs_in = 0
        self.msgs_out = 0

    # ---- lifecycle ----------------------------------------------------------------------------
    def open(self) -> ClientHub:
        """Create the up lanes, take over the node's handlers, and start reading the lanes:
        in the node's loop's own wait when its links are shm (the lanes ring the node's
        doorbell), else on a thread of the hub's with a doorbell of its own."""
        node = self.node
        loop = node.loop
        shared = loop.adoptable() if loop is not None else None
        self._loop = loop if shared is not None else None  # before `_take_over` can run
        try:
            if shared is None:
                self._bell = shm.Doorbell.create(bell_name(self.endpoint, "d"))
                self._set = LaneSet()
                self._set.set_doorbell(self._bell, self._bell.address)
            bell = shared or self._bell
            for k in range(self.max_clients):
                rx = shm.create_lane(up_lane(self.endpoint, k), self.nslots, doorbell=bell)
                self._rx.append(rx)
                if self._set is not None:
                    self._set.add(rx)
            # on the loop thread, before anything the lanes bring: the loop may run
            node.call_soon(self._take_over)
        except BaseException:
            self.close()
            raise
        node.hub = self
        if self._loop is None:
            self._thread = threading.Thread(
                target=self._read, name=f"rdmasched-clients{node.id}", daemon=True
            )
            self._thread.start()
        _log.info(
            "node %d: serving clients at %s (%d); after a message the loop spins %s us, "
            "the clients' reader %s",
            node.id,
            self.endpoint,
            self.max_clients,
            "?" if loop is None else loop.spin_us,
            "is the loop" if self._loop is not None else f"{self.spin_us} us",
        )
        return self

    def _take_over(self) -> None:
        """Take over the node's handlers (loop thread). A node may run before its hub opens
        (`rdmasched daemon` serves a started node, on which peers place tasks at once): a
        task that started meanwhile with no dispatch handler was run by no one, so it is
        started now, on a client or, with none yet, waiting for the first (`_hand_over`).
        On shm links the loop reads the up lanes from here on, and checks their clients
        every `check_ms`."""
        if self._stop.is_set():  # closed before the loop came to this
            return
        node = self.node
        self._own: Handlers = node.handlers
        node.on_dispatch(self._on_start)
        node.on_preempt(self._on_preempt)
        node.on_sync(self._on_sync)
        node.on_complete(self._on_complete)
        if node.loop is not None:
            node.loop.on_peer = self._on_peer
        if self._own.dispatch is None:
            for t in node.scheduler.running():
                if t.group is None and t.slot is not None:  # not a sync task
                    self._on_start(t, t.slot)
        if self._loop is not None:
            self._loop.adopt(self._rx, self._on_lane)
            self._adopted = True
            node.call_later(self.check_ns, self._check_tick)

    def close(self) -> None:
        """Stop reading, close every lane (clients waiting on this daemon find it gone).
        Safe twice; from any thread."""
        self._stop.set()
        if self._set is not None:
            self._set.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._thread = None
        if not self._let_go():
            return
        for c in list(self.clients.values()):
            c.tx.close()
        self.clients.clear()
        for rx in self._rx:
            rx.close()
        self._rx.clear()
        if self._set is not None:
            self._set.set_doorbell(None, 0)  # a later `wake` (close again) rings nothing
        if self._bell is not None:
            self._bell.close()
            self._bell = None

    def _let_go(self) -> bool:
        """The node's loop stops reading the up lanes (shm): at once when no thread runs it
        or this is its thread, else on its thread after what was posted before (the
        adoption among it), waited for. False if it did not answer in 5 s (a handler that
        never returns): the lanes are left open then, not closed under a reader."""
        loop = self._loop
        if loop is None:
            return True
        if loop.running and not loop.in_loop():
            done = threading.Event()

            def release() -> None:
                self._release_lanes()
                done.set()

            loop.post(release)
            if not done.wait(5) and loop.running:
                _log.warning(
                    "node %d: the loop did not let go of the client lanes in 5 s; left open",
                    self.node.id,
                )
                return False
        self._release_lanes()
        self._loop = None
        return True

    def _release_lanes(self) -> None:
        if self._adopted and self._loop is not None:
            self._loop.disown()
        self._adopted = False

    def stats(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "clients": sorted(self.clients),
            "connects": self.connects,
            "clients_left": self.clients_left,
            "clients_dead": self.clients_dead,
            "cancelled": self.cancelled,
            "late_answers": self.late_answers,
            "waiting_starts": len(self.waiting),
            "owned_tasks": len(self.owner),
            "to_cancel": len(self._doomed),
            "rejected": dict(self.rejected),
            "msgs_in": self.msgs_in,
            "msgs_out": self.msgs_out,
        }

    # ---- reading the up lanes: the node's loop (shm) ---------------------------------------------
    def _on_lane(self, m: Message, k: int) -> None:
        """A message of client `k`'s up lane, read by the node's loop (`Loop.adopt`)."""
        self._handle_all([_fields(m, k)])

    def _check_tick(self) -> None:
        """Every `check_ms` on the loop thread: drop the clients whose process is gone,
        after carrying out all that they wrote (a COMPLETE written just before the exit is
        taken, not lost to the cancel of the dead client's tasks)."""
        if self._stop.is_set() or self._loop is None:
            return
        gone = frozenset(
            k
            for k in self.clients
            if not shm.sender_alive(self._rx[k])  # type: ignore[arg-type]
        )
        if gone:
            self._loop.drain_now()
            self._check_clients(gone)
        self.node.call_later(self.check_ns, self._check_tick)

    # ---- reading the up lanes: a thread of the hub's (verbs links) -------------------------------
    def _read(self) -> None:
        lanes = self._set
        assert lanes is not None
        batch = Batch(256)
        next_check = time.monotonic_ns() + self.check_ns
        while not self._stop.is_set():
            batch.clear()
            try:
                got = lanes.wait(batch, self.check_ns / 1000, self.spin_us)
            except PeerDeadError:
                got = 0
            if got and not self._post_batch(batch):
                return
            now = time.monotonic_ns()
            if now >= next_check:
                next_check = now + self.check_ns
                # a client's exit comes after every message it wrote: the lanes whose sender
                # is gone are noted first, then drained, and only then are their clients
                # dropped (a COMPLETE written just before the exit is carried out, not lost
                # to the cancel of a dead client's tasks)
                gone = frozenset(
                    k
                    for k, rx in enumerate(self._rx)
                    if not shm.sender_alive(rx)  # type: ignore[arg-type]
                )
                while True:
                    batch.clear()
                    if not lanes.drain(batch):
                        break
                    if not self._post_batch(batch):
                        return
                if not self._post(lambda gone=gone: self._check_clients(gone)):
                    return

    def _post_batch(self, batch: Batch) -> bool:
        """Hand the messages of `batch` to the node's loop, in order; False once the node is
        gone."""
        msgs = [_fields(m, m.lane) for m in batch]
        return self._post(lambda: self._handle_all(msgs))

    def _post(self, fn: Any) -> bool:
        """Hand `fn` to the node's loop; False once the node is gone."""
        try:
            self.node.call_soon(fn)
        except RdmaschedError:  # stopped, or its loop failed
            return False
        return True

    # ---- on the loop thread: messages from clients ------------------------------------------
    def _handle_all(self, msgs: list[tuple[Any, ...]]) -> None:
        core = self.node.core
        for m in msgs:
            self.msgs_in += 1
            seen = core.rejections
            try:
                self._handle(*m)
            except QueueFullError as exc:
                self._refuse(m[0], exc, raises=True)
            except RdmaschedError as exc:
                self._refuse(m[0], exc, raises=m[1] == OP_READY)
            else:
                if core.rejections != seen and m[0] in self.clients:
                    # the node refused what the request asked (counted in its `rejected`):
                    # the client counts it too (docs/CLIENT.md)
                    reason, _, detail = core.last_rejection.partition(": ")
                    if m[1] == OP_READY:  # the rank would wait for ever: it raises
                        c = self.clients[m[0]]
                        self._refuse(
                            m[0],
                            ArgumentError(
                                f"sync_ready for group {m[3]} step {m[7]} (session "
                                f"{c.session!r}) refused by the node: {reason}: {detail}"
                                + _NEW_SESSION
                                * (reason == "stale-step")
                            ),
                            raises=True,
                        )
                        continue
                    self._send(m[0], Kind.HEARTBEAT, hops=OP_ERROR, meta={"err": [reason, detail]})

    def _refuse(self, k: int, exc: BaseException, raises: bool = False) -> None:
        """Tell client `k` its request was refused (counted on both sides); `raises`: its
        next call raises it (a full queue, a refused sync_ready: it must not wait on)."""
        name = type(exc).__name__
        self.rejected[name] = self.rejected.get(name, 0) + 1
        _log.warning("node %d: client %d: refused: %s", self.node.id, k, exc)
        if k in self.clients:
            self._send(k, Kind.HEARTBEAT, hops=OP_ERROR, meta=error_meta(exc, raises=raises))

    def _handle(
        self,
        k: int,
        op: int,
        kind: int,
        id: int,
        job: int,
        priority: int,
        flags: int,
        arg0: int,
        arg1: int,
        arg2: int,
        meta: dict[str, Any] | None,
    ) -> None:
        if op == OP_HELLO:
            self._hello(k, meta or {})
            return
        if k not in self.clients:  # a client dropped, or an ended sender's leftovers
            self.rejected["no-session"] = self.rejected.get("no-session", 0) + 1
            return
        node = self.node
        c = self.clients[k]
        if op in (OP_SUBMIT, OP_DISPATCH):
            task = node.new_task(id, job=job, priority=priority, cost_ns=arg0, payload=meta)
            gang = check_gang(arg1) if op == OP_SUBMIT else 0  # (docs/GANGS.md)
            if id in self.owner:
                raise ArgumentError(
                    f"task {id} of this node is still held (submitted by client "
                    f"{self.owner[id]}); task ids are unique per host while they live"
                )
            if id in self._doomed:
                raise ArgumentError(f"task {id} of a client that left is still being cancelled")
            if len(c.owned) >= self.max_queued and self._prune(c) >= self.max_queued:
                raise QueueFullError(
                    f"client {k} holds {len(c.owned)} tasks on this daemon, its bound "
                    f"(max_queued, `rdmasched daemon --max-queued-per-client`): task {id} "
                    "refused; complete or cancel some first"
                )
            self.owner[id] = k
            c.owned.add(id)
            self.submitted[k] = self.submitted.get(k, 0) + 1
            if op == OP_SUBMIT:
                node.carry_out(node.core.submit(task, node.clock(), gang))
            elif arg1 == NONE or arg1 == node.id:
                node.carry_out(node.core.dispatch(task, node.clock()))
            else:
                node.cluster.node(arg1)  # ConfigError for a node the cluster does not have
                node.carry_out(node.core.dispatch_to(arg1, task, node.clock()))
        elif op == OP_PREEMPT:
            cancel, by_job = preempt_from_flags(flags)
            if cancel and not by_job:
                self._check_owner(k, id, "cancel")
            self._cancels += cancel
            tid, j = (None, job) if by_job else (id, None)
            if arg1 == NONE or arg1 == node.id:  # here, now: before the client's next call
                node.carry_out(node.core.preempt(tid, j, cancel, node.clock()))
            else:
                node.preempt(tid, job=j, node=arg1, cancel=cancel)
        elif op == OP_READY:
            self._ready(k, id, arg0)
        elif op == OP_COMPLETE:
            origin = None if arg1 == NONE else arg1
            if id >= _SYNC_ID_BASE:  # a participant's sync work that went on after on_sync
                self._sync_done(k, id)
                return
            here = origin is None or origin == node.id
            key = (node.id if origin is None else origin, id)
            if here:
                self._check_owner(k, id, "complete")
            elif self.running_on.get(key, k) != k:
                raise ArgumentError(
                    f"task {id} of node {origin} runs on client {self.running_on[key]}, not "
                    f"this one: a rank completes only the tasks it runs"
                )
            if here and self.owner.get(id) == k:
                self._disown(id)
            self.running_on.pop(key, None)
            node.carry_out(node.core.complete(id, origin, arg0, node.clock()))
            self.completed[k] = self.completed.get(k, 0) + 1
        elif op == OP_YIELDED:
            self.running_on.pop((arg2, id), None)
            t = node.scheduler.lookup(id, arg2)
            if t is None or t.state not in _STOPPING:
                # the rank completed it while the PREEMPT was on its way: the answer is moot
                self.late_answers += 1
                return
            self._yielded(t, arg0)
        elif op == OP_SYNC_DONE:
            self._sync_done(k, id)
        elif op == OP_REQUEST:
            self._request(k, arg0, meta or {})
        elif op == OP_BYE:
            self.clients_left += 1
            self._drop(k, "left")
        else:
            raise ArgumentError(f"unknown client request {op} (kind {kind})")

    def _check_owner(self, k: int, task_id: int, what: str) -> None:
        """Refuse client `k` to `what` (complete, cancel) a task of this node another client
        submitted: only its owner knows when its work is done or no longer wanted."""
        owner = self.owner.get(task_id)
        if owner is not None and owner != k:
            raise ArgumentError(
                f"task {task_id} belongs to client {owner}, not this one (client {k}): a rank "
                f"may {what} only its own tasks"
            )

    def _disown(self, task_id: int) -> int | None:
        """Task `task_id` of this node is no longer held for its client: forget whose it was."""
        k = self.owner.pop(task_id, None)
        c = self.clients.get(k) if k is not None else None
        if c is not None:
            c.owned.discard(task_id)
        return k

    def _prune(self, c: _Client) -> int:
        """Forget `c`'s tasks that ended without the hub seeing it (a queued task cancelled
        by PREEMPT): after a client's cancel, else at most every 100 ms (a rank submitting
        past its bound costs one look at its tasks, not one per submit). Returns how many
        it still holds."""
        now = time.monotonic_ns()
        if c.pruned_cancels == self._cancels and now - c.pruned_ns < 100_000_000:
            return len(c.owned)
        c.pruned_ns, c.pruned_cancels = now, self._cancels
        node = self.node
        lookup, holder = node.scheduler.lookup, node.peers.holder
        gang_of = node.core.gangs.gang_of  # a gang's member waits there, in no queue
        for tid in list(c.owned):
            t = lookup(tid, node.id)
            if (
                (t is None or t.state in _ENDED)
                and holder(task_key(node.id, tid)) is None
                and gang_of(tid) is None
            ):
                self._disown(tid)
        return len(c.owned)

    def _hello(self, k: int, meta: dict[str, Any]) -> None:
        if k in self.clients:  # the same index again: the old process is gone
            self.clients_dead += 1
            self._drop(k, "replaced by a new process")
        rx = self._rx[k]
        hdr = read_header(rx.segment)  # type: ignore[attr-defined]
        pid, start = int(hdr["sender_pid"]), int(hdr["sender_start"])
        try:
            tx = shm.attach_lane(down_lane(self.endpoint, k), src=self.node.id, timeout_us=0)
        except LaneError as exc:
            _log.warning("node %d: client %d said hello but: %s", self.node.id, k, exc)
            return
        self.clients[k] = _Client(k, pid, start, tx, str(meta.get("session") or ""))
        self.connects += 1
        node = self.node
        self._send(
            k,
            Kind.HEARTBEAT,
            hops=OP_WELCOME,
            meta={
                "node": node.id,
                "name": node.spec.name,
                "slots": node.spec.slots,
                "cluster": node.cluster.name,
                "client": k,
                "clients": self.max_clients,
            },
        )
        _log.info("node %d: client %d connected (pid %s)", node.id, k, meta.get("pid"))
        if node.loop is not None:  # the news so far: the hosts declared dead before it came
            for peer in sorted(node.loop.dead_peers):
                self._send(k, Kind.HEARTBEAT, arg0=peer, arg1=1, hops=OP_PEER)
        self._hand_over()

    def _on_peer(self, peer: int, dead: bool, why: str) -> None:
        """A peer declared dead or alive again (the loop's liveness news, loop thread): told
        to every rank at once (OP_PEER), so a rank need not ask for it."""
        for k in list(self.clients):
            self._send(
                k, Kind.HEARTBEAT, arg0=peer, arg1=int(dead), hops=OP_PEER, meta={"why": why}
            )

    def _hand_over(self) -> None:
        """Start the tasks that waited for a client, now that one is connected."""
        waiting, self.waiting = self.waiting, {}
        sched = self.node.scheduler
        for task, slot in waiting.values():
            # still running in that slot (not preempted, cancelled or completed since)
            if sched.lookup(task.id, task.origin) is task and task.state is TaskState.RUNNING:
                self._on_start(task, slot)

    def _request(self, k: int, rid: int, meta: dict[str, Any]) -> None:
        q = meta.get("q")
        a = meta.get("a") or []
        node = self.node
        try:
            value: Any = None
            if q == "flush":  # after the calls queued on the loop before it
                node.call_soon(
                    lambda: self._send(k, Kind.HEARTBEAT, arg0=rid, hops=OP_REPLY, meta={"ok": 0})
                )
                return
            elif q == "nodes":
                value = [n.id for n in node.cluster.nodes]
            elif q == "resolve":
                value = node.cluster.node(a[0]).id
            elif q == "define_group":
                self._define_group(k, int(a[0]), list(a[1]), a[2], a[3] if len(a) > 3 else False)
            elif q == "explain":
                value = [e.as_dict() for e in node.scheduler.explain(int(a[0]))]
            elif q == "stats":
                value = node.stats()
                value["clients"] = self.stats()
            else:
                raise ArgumentError(f"unknown request {q!r}")
            out = {"ok": value}
        except (RdmaschedError, ValueError, TypeError, IndexError, KeyError) as exc:
            out = error_meta(exc)
        try:
            self._send(k, Kind.HEARTBEAT, arg0=rid, hops=OP_REPLY, meta=out)
        except RdmaschedError as exc:  # the answer did not fit: say so instead
            self._send(k, Kind.HEARTBEAT, arg0=rid, hops=OP_REPLY, meta=error_meta(exc))

    # ---- sync groups ----------------------------------------------------------------------------
    def _wire_group(self, session: str, group: int, members: list[Any]) -> int:
        """The node's group for `group` of `session` (`session_group`); a clear error in the
        unlikely case that two (session, group) pairs hash to one. Without a session (no
        launcher), a group of this host alone is new again once its last participant left
        (no other host has to agree): its n-th use is the session `#n`."""
        gid = session_group(session, group)
        if not session and all(self.node.cluster.node(m).id == self.node.id for m in members):
            gid = self._local_gid.get(group, -1)
            if gid < 0:
                n = self._local_uses.get(group, 0)
                self._local_uses[group] = n + 1
                gid = self._local_gid[group] = session_group(f"#{n}" if n else "", group)
        name = self.group_names.setdefault(gid, (session, group))
        if name != (session, group):
            raise ArgumentError(
                f"group {group} of session {session!r} shares its wire group {gid} with group "
                f"{name[1]} of session {name[0]!r}: use another group id"
            )
        return gid

    def _define_group(
        self, k: int, group: int, members: list[Any], local: int | None, overlap: Any
    ) -> None:
        want = self.max_clients if local is None else int(local)
        if not 1 <= want <= self.max_clients:
            raise ArgumentError(f"local must be 1..{self.max_clients} (clients), not {want}")
        c = self.clients[k]
        gid = self._wire_group(c.session, group, members)
        if self.local.get(gid, want) != want:
            raise ArgumentError(
                f"group {group} waits for {self.local[gid]} local participants here, not {want}"
            )
        # the node's own define_group: its checks, and nothing again for the same members
        # (queued on the loop: it runs before anything the client sends after the answer)
        self.node.define_group(gid, members, overlap=overlap)
        self.local[gid] = want
        self.participants.setdefault(gid, set()).add(k)
        c.groups[group] = gid

    def _ready(self, k: int, group: int, step: int) -> None:
        c = self.clients[k]
        gid = c.groups.get(group)
        if gid is None:
            raise ArgumentError(
                f"sync_ready for group {group} step {step}, which this client never defined "
                "(define_group)"
            )
        key = (gid, step)
        if key in self.announced:
            raise ArgumentError(
                f"group {group} step {step} (session {c.session!r}) was already announced by "
                "this host: sync_ready once a step"
            )
        self.ready.setdefault(key, set()).add(k)
        self._maybe_announce(key)

    def _maybe_announce(self, key: tuple[int, int]) -> None:
        gid, step = key
        if len(self.ready.get(key, ())) >= self.local.get(gid, 1):
            del self.ready[key]
            self.announced.add(key)
            if len(self.announced) > 65536:  # steps long done
                self.announced = {a for a in self.announced if a[1] + 1024 > step}
            node = self.node
            node.carry_out(node.core.sync_ready(gid, step, node.clock()))

    def _leave_group(self, k: int, gid: int) -> None:
        """Client `k` stops being a participant of wire group `gid`; the last one to leave
        frees the hub's state of it (its session is over here)."""
        parts = self.participants.get(gid, set())
        parts.discard(k)
        if not parts:
            session, group = self.group_names[gid]
            if not session and self._local_gid.get(group) == gid:
                del self._local_gid[group]  # its next use is a new group
            self.participants.pop(gid, None)
            self.local.pop(gid, None)
            for key in [key for key in self.ready if key[0] == gid]:
                del self.ready[key]
            self.announced = {a for a in self.announced if a[0] != gid}
            return
        self.local[gid] = max(1, self.local.get(gid, 1) - 1)
        for key in [key for key in self.ready if key[0] == gid]:
            self.ready[key].discard(k)
            self._maybe_announce(key)

    def _sync_done(self, k: int, task_id: int) -> None:
        left = self.syncing.get(task_id)
        if left is None or k not in left:
            raise ArgumentError(f"sync task {task_id} is not running on this client")
        left.discard(k)
        if not left:
            del self.syncing[task_id]
            node = self.node
            node.carry_out(node.core.complete(task_id, node.id, 0, node.clock()))

    # ---- the node's effects, routed to clients (loop thread) ------------------------------------
    def _client_for(self, task: Task, slot: int) -> int | None:
        if task.origin == self.node.id:
            k = self.owner.get(task.id)
            if k is not None:
                return k if k in self.clients else None
        if slot in self.clients:
            return slot
        return min(self.clients) if self.clients else None

    def _on_start(self, task: Task, slot: int) -> None:
        if task.origin == self.node.id and task.id in self._doomed:  # its client left
            self.waiting[(task.origin, task.id)] = (task, slot)  # never run; cancelled soon
            return
        k = self._client_for(task, slot)
        if k is None:
            own = self._own.dispatch
            if own is not None:
                own(task, slot)
            else:  # no one to run it yet: it waits for the first client (_hand_over)
                self.waiting[(task.origin, task.id)] = (task, slot)
            return
        self.running_on[(task.origin, task.id)] = k
        self._send(
            k,
            Kind.DISPATCH,
            task.id,
            task.job,
            task.priority,
            slot,
            task.cost_ns,
            task.progress_ns,
            task.origin,
            OP_START,
            task.payload,
        )
        if self._stops:
            self._write_stops()

    def _on_preempt(self, task: Task, slot: int, cancel: bool) -> Any:
        key = (task.origin, task.id)
        if self.waiting.pop(key, None) is not None:  # it never ran: nothing to stop
            return task.progress_ns
        if task.origin == self.node.id and task.id in self._doomed:  # its client is gone
            self.running_on.pop(key, None)  # (a new process as that index never knew it)
            return task.progress_ns
        k = self.running_on.get(key)
        if k is None or k not in self.clients:
            self.running_on.pop((task.origin, task.id), None)
            own = self._own.preempt
            return own(task, slot, cancel) if own is not None and k is None else task.progress_ns
        # written after the START this preemption makes room for, if one comes in this pass
        # (`_write_stops`): a rank's reader woken by the STOP may run in the loop's place
        stop = (k, Kind.PREEMPT, task.id, task.job, 0, slot, task.progress_ns, int(cancel))
        if not self._stops:
            try:
                self.node.call_soon(self._write_stops)  # no START came: after the pass
            except RdmaschedError:  # the node is stopping: now
                self._send(*stop, task.origin, OP_STOP)
                return LATER
        self._stops.append((*stop, task.origin, OP_STOP))
        return LATER  # its answer comes as OP_YIELDED

    def _write_stops(self, k: int | None = None) -> None:
        """Write the STOP notices of this pass's preemptions not written yet (`k`: only
        those to client k), in the order decided. A START goes before the STOPs it made room
        for on other clients' lanes; anything written to a client's lane goes after the
        STOPs to that client (`_send`): one lane keeps the order decided (a rank whose
        co-located work is preempted for its own step has it stopped before the step starts,
        docs/TORCH.md; a compute task preempted by its step's sync hears the STOP before the
        SYNC). A STOP is never written after its own task's later START: a preempted task
        starts again only after this STOP's answer."""
        if k is None:
            stops, self._stops = self._stops, []
        else:
            stops = [a for a in self._stops if a[0] == k]
            self._stops = [a for a in self._stops if a[0] != k]
        for a in stops:
            self._send(*a)

    def _on_sync(self, task: Task, slot: int) -> Any:
        gid = task.group if task.group is not None else 0
        parts = [k for k in sorted(self.participants.get(gid, ())) if k in self.clients]
        group = self.group_names.get(gid, ("", gid))[1]  # the group as its clients name it
        if not parts:
            own = self._own.sync
            return own(task, slot) if own is not None else None
        self.syncing[task.id] = set(parts)
        for k in parts:
            self._send(
                k,
                Kind.SYNC_READY,
                task.id,
                task.job,
                task.priority,
                slot,
                group,
                0,
                task.origin,
                OP_SYNC,
                task.payload,
            )
        return LATER

    def _on_complete(self, task_id: int, where: int) -> None:
        k = self._disown(task_id)
        if k is None or k not in self.clients:
            own = self._own.complete
            if own is not None and k is None:
                own(task_id, where)
            return
        self._send(k, Kind.COMPLETE, task_id, arg0=where, hops=OP_DONE)

    def _yielded(self, task: Task, progress: int) -> None:
        node = self.node
        node.carry_out(node.core.preempted(task, progress, node.clock()))
        if task.state is TaskState.CANCELLED and task.origin == node.id:
            self._disown(task.id)

    # ---- sending to a client ------------------------------------------------------------------
    def _send(
        self,
        k: int,
        kind: int,
        id: int = 0,
        job: int = 0,
        priority: int = 0,
        flags: int = 0,
        arg0: int = 0,
        arg1: int = 0,
        arg2: int = 0,
        hops: int = 0,
        meta: dict[str, Any] | None = None,
    ) -> None:
        if self._stops:  # this pass's STOPs to k go first: one lane keeps the order decided
            self._write_stops(k)
        c = self.clients.get(k)
        if c is None:
            return
        args: Outgoing = (kind, id, job, priority, flags, arg0, arg1, arg2, hops, meta)
        if c.outbox:
            c.outbox.append(args)
            return
        try:
            c.tx.send(*args, timeout_us=0)
            self.msgs_out += 1
        except (LaneFullError, EpochError):
            c.outbox.append(args)
            self.node.call_later(200_000, lambda: self._flush(k))
        except PeerDeadError as exc:
            self.clients_dead += 1
            self._drop(k, str(exc))

    def _flush(self, k: int) -> None:
        c = self.clients.get(k)
        if c is None:
            return
        while c.outbox:
            try:
                c.tx.send(*c.outbox[0], timeout_us=0)
            except (LaneFullError, EpochError):
                self.node.call_later(200_000, lambda: self._flush(k))
                return
            except PeerDeadError as exc:
                self.clients_dead += 1
                self._drop(k, str(exc))
                return
            c.outbox.popleft()
            self.msgs_out += 1

    # ---- clients that leave or die --------------------------------------------------------------
    def _check_clients(self, gone: frozenset[int]) -> None:
        """Drop the clients whose process is gone: no longer holding their up lane's
        liveness token (seen from any PID namespace: docs/PROTOCOL.md section 9). `gone`:
        the lanes the reader found so before its last drain (everything such a client
        wrote is carried out before this); a lane taken by a new process since is not."""
        for k, c in list(self.clients.items()):
            if k in gone and not shm.sender_alive(self._rx[k]):  # type: ignore[arg-type]
                self.clients_dead += 1
                self._drop(k, f"its process (pid {c.pid}) is gone")

    def _drop(self, k: int, why: str) -> None:
        """Client `k` is gone: cancel its tasks here, requeue others' it ran, leave its
        groups, close its lane."""
        c = self.clients.pop(k, None)
        if c is None:
            return
        node = self.node
        now = node.clock()
        level = logging.INFO if why == "left" else logging.WARNING
        _log.log(level, "node %d: client %d dropped: %s", node.id, k, why)
        # 1. preempt answers it owed: given now, with the last progress known
        for key, owner in list(self.running_on.items()):
            origin, tid = key
            t = node.scheduler.lookup(tid, origin)
            if owner == k and t is not None and t.state in _STOPPING:
                del self.running_on[key]
                node.carry_out(node.core.preempted(t, t.progress_ns, now))
        # 2. its own tasks: cancelled, in slices of a loop pass each (`_cancel_slice`)
        for tid in c.owned:
            self.owner.pop(tid, None)
        self._doomed.update(c.owned)
        self._to_cancel.extend(c.owned)
        c.owned = set()
        if not self._slicing:
            self._cancel_slice()
        # 3. other nodes' tasks it ran: requeued here, for another client
        for key, owner in list(self.running_on.items()):
            origin, tid = key
            t = node.scheduler.lookup(tid, origin)
            if owner == k and t is not None and t.state is TaskState.RUNNING:
                node.carry_out(node.core.preempt(tid, None, False, now))
        # 4. its share of sync steps
        for tid, left in list(self.syncing.items()):
            if k in left:
                left.discard(k)
                if not left:
                    del self.syncing[tid]
                    node.carry_out(node.core.complete(tid, node.id, 0, now))
        for g in c.groups.values():
            self._leave_group(k, g)
        with contextlib.suppress(LaneError):
            c.tx.close()

    def _cancel_slice(self) -> None:
        """Cancel the next CLIENT_CANCEL_SLICE tasks of departed clients, and post the rest
        to the loop's next pass, so that no pass takes long (docs/DAEMON.md): queued ones
        at once, those placed on another host there (PREEMPT(cancel)), and, once no queued
        one is left (none of them may take a freed slot), the running ones through
        PREEMPT(cancel). A start of one of them meanwhile is kept back (`_on_start`)."""
        node = self.node
        now = node.clock()
        lookup, holder_of = node.scheduler.lookup, node.peers.holder
        todo, doomed = self._to_cancel, self._doomed
        for _ in range(min(len(todo), CLIENT_CANCEL_SLICE)):
            tid = todo.popleft()
            t = lookup(tid, node.id)
            if t is not None and t.state is TaskState.QUEUED:
                node.carry_out(node.core.preempt(tid, None, True, now))
                self.cancelled += 1
            elif t is not None and t.state is TaskState.RUNNING:
                self._doomed_running.append(tid)
                continue
            else:  # placed on another host: cancelled there
                holder = holder_of(task_key(node.id, tid))
                if holder is not None and (t is None or t.state is TaskState.FORWARDED):
                    node.preempt(tid, node=holder, cancel=True)
                    # no record kept: it must not be placed again should that host die later
                    node.peers.release(holder, task_key(node.id, tid))
                    self.cancelled += 1
            doomed.discard(tid)
        self._slicing = bool(todo)
        if todo:
            with contextlib.suppress(RdmaschedError):  # the node is stopping: nothing to do
                node.call_later(50_000, self._cancel_slice)  # a timer: the next pass
            return
        running, self._doomed_running = self._doomed_running, []
        for tid in running:  # (or queued again, preempted since it was looked at)
            t = lookup(tid, node.id)
            if t is not None and t.state in (TaskState.QUEUED, TaskState.RUNNING):
                node.carry_out(node.core.preempt(tid, None, True, now))
                self.cancelled += 1
            doomed.discard(tid)
