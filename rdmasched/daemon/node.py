"""`Node`: the node daemon's Python API.

A node owns its inbound lanes, polls them on one loop thread, feeds every message to its own
decision logic (`NodeCore`, daemon/core.py: sans-IO, it owns the scheduler) and carries out
what that decides: sending, and calling the user's handlers. There is no central scheduler:
each node decides what runs on its own execution slots.

    with Node.from_config("cluster.toml", "gpu-a") as node:
        @node.on_dispatch
        def start(task, slot): ...          # launch the task on GPU `slot`; return quickly
        @node.on_preempt
        def stop(task, slot, cancel): ...   # checkpoint or yield; return progress in ns
        node.submit(task_id=1, job=3, priority=100, cost_ns=5_000_000)
        ...
        node.complete(1)                    # the user's work for task 1 finished

Handlers run on the loop thread. Every public method may be called from a handler or any
other thread: it checks its arguments at once (raising in the caller), then is queued for
the loop, which carries the calls out in order; a handler's calls run when it returns.
`flush`, `explain` and `stop` wait for the calls made before them. docs/DAEMON.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from rdmasched import messages as msg
from rdmasched._wire import Message
from rdmasched.api import (
    LATER,
    CompleteHandler,
    DispatchHandler,
    Handlers,
    PreemptHandler,
    SyncHandler,
    check_complete,
    check_gang,
    check_group,
    check_members,
    check_preempt,
    check_redeclared,
    check_step,
    check_task,
)
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.checks import U64_MAX, check_bool, check_callable, check_int, check_node
from rdmasched.daemon.core import (
    EARLY_SYNC_MAX,
    SYNC_ID_BASE,
    CompleteNotice,
    Effect,
    MarkDead,
    NodeCore,
    PreemptTask,
    Relay,
    Revive,
    RunSync,
    Send,
    SetLoad,
    SetTimer,
    Wake,
    sync_task_id,
)
from rdmasched.daemon.links import Links, ShmLinks, VerbsLinks, close_quietly
from rdmasched.daemon.loop import Loop
from rdmasched.daemon.membership import Membership
from rdmasched.daemon.probe import Probe
from rdmasched.daemon.tuning import LoopTuning
from rdmasched.errors import (
    ArgumentError,
    ArgumentTypeError,
    ConfigError,
    NodeFailedError,
    RdmaschedError,
)
from rdmasched.scheduler import Event, PeerTable, Scheduler, Start, Task
from rdmasched.stats import percentile_us
from rdmasched.wire import Kind

if TYPE_CHECKING:
    from rdmasched.api import NodeAPI
    from rdmasched.daemon.clients import ClientHub

_log = logging.getLogger("rdmasched.daemon")
_T = TypeVar("_T")

_COMPLETE = int(Kind.COMPLETE)
_PREEMPT = int(Kind.PREEMPT)
_HEARTBEAT_T = msg.Heartbeat

__all__ = ["EARLY_SYNC_MAX", "LATER", "SYNC_ID_BASE", "Node", "Reactions", "sync_task_id"]


class Reactions:
    """Preemption reaction times (trigger slot written -> preempt handler entered), ns."""

    def __init__(self, keep: int = 100_000) -> None:
        self.samples: list[int] = []
        self.keep = keep
        self.count = 0

    def add(self, ns: int) -> None:
        self.count += 1
        if len(self.samples) < self.keep:
            self.samples.append(ns)
        else:  # keep a uniform sample of all of them
            j = hash((self.count, ns)) % self.count
            if j < self.keep:
                self.samples[j] = ns

    def percentile_us(self, q: float) -> float | None:
        """The `q` (0..1) quantile, us (rdmasched.stats); None without samples."""
        return percentile_us(self.samples, q * 100.0)


class Node:
    def __init__(
        self,
        cluster: ClusterConfig,
        node: int | str,
        *,
        links: Links | None = None,
        spin_us: int = 200,
        starvation_us: int = 1_000_000,
        aging_us: int | None = 100_000,
        events: int = 4096,
        sync_cost_ns: int = 0,
        max_hops: int = 2,
        clock: Callable[[], int] = time.monotonic_ns,
        tuning: LoopTuning | None = None,
        preemption: Mapping[str, Any] | None = None,
    ) -> None:
        self.cluster = cluster
        #: the loop thread's CPU, SCHED_FIFO priority and gc freeze (daemon/tuning.py)
        self.tuning = tuning
        self.spec = cluster.node(node)
        self.id = self.spec.id
        self.clock = clock
        self._links_given = links
        self._spin_us = spin_us
        # The decisions: a sans-IO core this node drives (docs/DAEMON.md, "The node core").
        # A process starts as an incarnation above any earlier one of this node: the wall
        # clock in ms (docs/DAEMON.md, "Dead peers, incarnations and rejoining").
        self.core = NodeCore(
            self.id,
            {n.id: n.domain for n in cluster.nodes},
            slots=self.spec.slots,
            inc=max(1, time.time_ns() // 1_000_000),
            dead_after_ns=cluster.dead_after_ms * 1_000_000,
            heartbeat_ns=cluster.heartbeat_ms * 1_000_000,
            now=clock(),
            starvation_us=starvation_us,
            aging_us=aging_us,
            events=events,
            sync_cost_ns=sync_cost_ns,
            max_hops=max_hops,
            topology=cluster.topology,
            # no thrash: the cluster's [preemption], overridden key by key by `preemption`
            preemption={**cluster.preemption, **(preemption or {})},
            capacity={n.id: n.slots for n in cluster.nodes},
        )
        self.sync_cost_ns = sync_cost_ns
        self.reactions = Reactions()
        #: the server of this node's Prometheus metrics and live events (docs/TELEMETRY.md),
        #: when whoever started the node serves them (`rdmasched.launch.serve_metrics`);
        #: closed with the node. None: off
        self.metrics: Any = None
        self._dispatch: DispatchHandler | None = None
        self._preempt: PreemptHandler | None = None
        self._sync: SyncHandler | None = None
        self._complete: CompleteHandler | None = None
        self.loop: Loop | None = None
        self._probe: Probe | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        #: the ranks of this host, when it serves clients (set by `ClientHub.open`,
        #: daemon/clients.py, docs/CLIENT.md); closed with the node
        self.hub: ClientHub | None = None
        self._init_api_state()

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def from_config(cls, path: str, node: int | str, **kw: Any) -> Node:
        return cls(ClusterConfig.load(path), node, **kw)

    # ---- the core's state, read-only views -------------------------------------------------
    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def peers(self) -> PeerTable:
        return self.core.peers

    @property
    def members(self) -> Membership:
        return self.core.members

    @property
    def rejected(self) -> dict[str, int]:
        return self.core.rejected

    @property
    def stale_msgs(self) -> int:
        return self.core.stale_msgs

    @property
    def sync_early_kept(self) -> int:
        return self.core.sync_early_kept

    # ---- handlers --------------------------------------------------------------------------
    def on_dispatch(self, fn: DispatchHandler) -> DispatchHandler:
        """`fn(task, slot)`: start `task` on execution slot `slot`. Return quickly."""
        self._dispatch = fn
        return fn

    def on_preempt(self, fn: PreemptHandler) -> PreemptHandler:
        """`fn(task, slot, cancel) -> progress_ns`: stop `task` now (checkpoint or yield)."""
        self._preempt = fn
        return fn

    def on_sync(self, fn: SyncHandler) -> SyncHandler:
        """`fn(task, slot)`: run a group's sync task (its `group`; step in `task.payload`).

        The sync task holds slot `slot` until `fn` returns, then it is complete: do not call
        `complete` for it. To keep the slot for work that goes on after `fn` returns, return
        `LATER` and call `node.complete(task.id)` when that work is done. Without a sync
        handler a released step completes at once.
        """
        self._sync = fn
        return fn

    def on_complete(self, fn: CompleteHandler) -> CompleteHandler:
        """`fn(task_id, node)`: a task this node submitted completed on node `node`."""
        self._complete = fn
        return fn

    # ---- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        """Create the lanes and connect to the peers (they must be starting too)."""
        if self.loop is not None:
            return
        links = self._links_given
        # lanes only to the core's links: its topology links, or every node without one
        if links is None and self.cluster.transport == "verbs":
            links = VerbsLinks(self.cluster, self.id, peers=self.core.links)
        elif links is None:
            links = ShmLinks(
                self.cluster.name,
                self.id,
                self.core.links,
                nslots=self.cluster.slots_per_lane,
            )
        self.loop = Loop(links, spin_us=self._spin_us, clock=self.clock)
        self.loop.probe = self._probe
        self.loop.keep_on_death = frozenset({_COMPLETE})
        self.loop.stall_ns = self.members.stall_ns
        self.loop.on_stall = self._stalled
        # first heartbeats, so that peers know this incarnation before anything else
        self.carry_out(self.core.open(self.clock()))

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Run the loop on this thread until `stop()` (or `until()` is true)."""
        self.open()
        assert self.loop is not None
        if self.tuning:
            _log.info("node %d: loop thread %s", self.id, ", ".join(self.tuning.apply()))
        try:
            self.loop.run(self._on_message, until)
        except Exception as exc:  # raised here; later calls raise NodeFailedError
            self._error = exc
            raise
        if self._stop_asked:  # stop() from a handler: close now that the loop is out
            self.stop()

    def start(self) -> Node:
        """Open and run the loop on a background thread."""
        self.open()
        self._thread = threading.Thread(
            target=self._run_thread, name=f"rdmasched-node{self.id}", daemon=True
        )
        self._thread.start()
        return self

    def _run_thread(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # later calls raise it; so does stop()
            self._error = exc
            self._error_unreported = True
            _log.exception("node %d: the loop failed; the node cannot go on", self.id)

    def stop(self) -> None:
        """Carry out the calls made before, stop the loop, close the lanes. Safe to call
        twice. Raises `NodeFailedError` if the loop thread had failed."""
        loop = self.loop
        if loop is None:
            return
        if loop.in_loop():  # from a handler: the loop runs what is queued, then run() closes
            self._stop_asked = True
            loop.stop()
            return
        self._stop_asked = False
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        self._finish_pending(loop)
        loop.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
            self._thread = None
        if self._error is None and not loop.running and not loop.flush_outbox(1.0):
            _log.warning("node %d: stopped with messages still queued for full lanes", self.id)
        self.loop = None
        if self.hub is not None:
            self.hub.close()
        close_quietly(loop.links)
        if self._error_unreported:
            self._error_unreported = False
            raise self._failed()

    @property
    def healthy(self) -> bool:
        """True while the node is open and its loop has not failed (see `error`)."""
        return self.loop is not None and self._error is None

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the loop, if it failed (then every call raises
        `NodeFailedError` caused by it)."""
        return self._error

    close = stop

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the API ---------------------------------------------------------------------------
    def _call(self, fn: Callable[[], object]) -> None:
        if self._error is not None:
            raise self._failed()
        if self.loop is None:
            raise RdmaschedError(f"node {self.id} is not running")
        self.loop.post(fn)

    # ---- for drivers that share the node's loop (the client hub, daemon/clients.py) -----------
    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run `fn()` on the loop thread, after the calls made before this one (the one way
        to run code on the node's loop; the API's methods are queued the same way).

        There `fn` may read the node's state and feed the core, handing what it decides to
        `carry_out`. An exception in `fn` stops the loop (the node fails), as a bug in the
        node would: catch what `fn` expects. Raises `NodeFailedError` once the loop has
        failed, `RdmaschedError` when the node is not open."""
        self._call(fn)

    def new_task(
        self,
        task_id: int,
        *,
        job: int = 0,
        priority: int = 0,
        cost_ns: int = 0,
        payload: dict[str, Any] | None = None,
    ) -> Task:
        """A task of this node (its origin), its arguments checked as `submit` checks them
        (rdmasched.api.check_task)."""
        task_id, job, priority, cost_ns = check_task(task_id, job, priority, cost_ns, payload)
        return Task(task_id, job, priority, cost_ns, payload=payload, origin=self.id)

    @property
    def handlers(self) -> Handlers:
        """The handlers registered now (None: not registered), for a driver that takes them
        over and falls back on them (the client hub)."""
        return Handlers(self._dispatch, self._preempt, self._sync, self._complete)

    def submit(
        self,
        task_id: int,
        *,
        job: int = 0,
        priority: int = 0,
        cost_ns: int = 0,
        payload: dict[str, Any] | None = None,
        gang: int = 0,
    ) -> None:
        """Run a task here if a slot is free, else on a lighter peer (power of two choices,
        same topology domain first), else queue it here. `gang` > 0: the task is a member
        of gang `job` of `gang` members, placed with the others all or nothing, on this node
        and its links (docs/GANGS.md)."""
        task = self.new_task(task_id, job=job, priority=priority, cost_ns=cost_ns, payload=payload)
        n = check_gang(gang)
        self._call(lambda: self.carry_out(self.core.submit(task, self.clock(), n)))

    def dispatch(
        self,
        task_id: int,
        *,
        to: int | str | None = None,
        job: int = 0,
        priority: int = 0,
        cost_ns: int = 0,
        payload: dict[str, Any] | None = None,
    ) -> None:
        """DISPATCH a task to node `to` (id or name; default: this node), bypassing
        placement."""
        task = self.new_task(task_id, job=job, priority=priority, cost_ns=cost_ns, payload=payload)
        to = None if to is None else check_node(self.cluster, "to", to)
        if to is None or to == self.id:
            self._call(lambda: self.carry_out(self.core.dispatch(task, self.clock())))
        else:
            self._call(lambda: self.carry_out(self.core.dispatch_to(to, task, self.clock())))

    def preempt(
        self,
        task_id: int | None = None,
        *,
        job: int | None = None,
        node: int | str | None = None,
        cancel: bool = False,
    ) -> None:
        """PREEMPT a task (or every task of `job`) on `node` (id or name; default: this
        node)."""
        task_id, job = check_preempt(task_id, job, cancel)
        node = None if node is None else check_node(self.cluster, "node", node)
        if node is None or node == self.id:
            self._call(
                lambda: self.carry_out(self.core.preempt(task_id, job, cancel, self.clock()))
            )
            return
        # No decision here (the receiver makes it): sent as is, stamped at the moment it is
        # sent (the trigger of the reaction the receiver measures).
        stop = msg.Preempt(task_id or 0, job or 0, 0, cancel, job is not None)

        def send() -> None:  # over the lane to `node`, or to its route's next hop
            to = self.core._send(node, stop)
            self._loop().send(to.peer, *stop.stamped(self.clock()), dst=to.dst)

        self._call(send)

    def define_group(
        self, group: int, members: Iterable[int | str], *, overlap: bool = False
    ) -> None:
        """Declare sync group `group` (its members: node ids or names); every member
        declares it too. May come before `open()`; declaring it again alike does nothing.
        SYNC_READYs from members that declared it first are kept until it is declared here.
        `overlap`: the group's syncs run beside the running tasks (collectives that overlap
        compute): a release takes no slot and preempts nothing; `on_sync` gets slot
        `NO_SLOT` (docs/SCHEDULER.md, "SYNC_READY")."""
        group = check_group(group)
        mem = self._checked_members(group, members)
        check_bool("overlap", overlap)

        def define() -> None:
            self.carry_out(self.core.define_group(group, mem, self.clock(), overlap))

        with self._defs_lock:
            if check_redeclared(group, self._group_defs.get(group), (mem, overlap)):
                return
            if self.loop is None and self._error is None:  # not open: no loop to race
                define()
            else:
                self._call(define)
            self._group_defs[group] = (mem, overlap)

    def sync_ready(self, group: int, step: int) -> None:
        """This node reached `step` (0..2**32-1) of `group`: tell every member (and count
        itself). `group` must have been declared with `define_group` on this node."""
        group = check_group(group)
        step = check_step(step)
        if group not in self._group_defs:
            raise ArgumentError(f"sync_ready for group {group}, which define_group never declared")

        def announce() -> None:
            self.carry_out(self.core.sync_ready(group, step, self.clock()))

        self._call(announce)

    def complete(self, task_id: int, *, origin: int | None = None, runtime_ns: int = 0) -> None:
        """The work of `task_id` finished: free its slot, start the next, tell its origin.

        Task ids are unique per origin node: `origin` names the node that submitted the
        task (`task.origin` in the dispatch handler). Without it: this node's own task
        `task_id` if it holds one, else the only task with that id held here."""
        task_id, runtime_ns = check_complete(task_id, runtime_ns)
        if origin is not None:
            origin = check_node(self.cluster, "origin", origin)

        def done() -> None:
            self.carry_out(self.core.complete(task_id, origin, runtime_ns, self.clock()))

        self._call(done)

    def call_later(self, delay_ns: int, fn: Callable[[], None]) -> None:
        """Run `fn()` on the loop thread after `delay_ns` (timers for simulated work). An
        exception in `fn` is logged and counted in `stats()["handler_errors"]`."""
        delay_ns = check_int("delay_ns", delay_ns)
        check_callable("call_later's fn", fn)

        def guarded() -> None:
            try:
                fn()
            except Exception as exc:
                self._handler_failed("call_later", exc, 0)

        self._call(lambda: self._loop().call_later(delay_ns, guarded))

    def flush(self, timeout_s: float = 10.0) -> None:
        """Return once the loop has carried out every call made before this one.

        Calls from other threads are handed to the loop and return at once; `flush` is how
        such a caller knows they have taken effect. From a handler it does nothing (the
        handler's calls run when it returns).
        """
        self._ask(lambda: None, timeout_s)

    def explain(self, task_id: int) -> list[Event]:
        """Every recorded decision about `task_id`: when, what, why, and what it beat.

        Sees every call made before it (it waits for the loop, as `flush` does)."""
        task_id = check_int("task_id", task_id)
        return self._ask(lambda: self.scheduler.explain(task_id))

    def events_jsonl(self) -> Iterator[str]:
        return self.scheduler.events_jsonl()

    def events_since(self, seq: int = 0) -> tuple[list[Event], int]:
        """The decision events numbered `seq` and after still in the ring, and how many
        after `seq` it had overwritten (docs/TELEMETRY.md). Waits for the loop, as `explain`."""
        seq = check_int("seq", seq)
        return self._ask(lambda: self.scheduler.events_since(seq))

    def inspect(self, fn: Callable[[Node], _T], timeout_s: float = 10.0) -> _T:
        """`fn(node)` run on the node's loop after the calls made before it; its result.
        For readers of the node's state from another thread (telemetry)."""
        return self._ask(lambda: fn(self), timeout_s)

    def stats(self) -> dict[str, Any]:
        loop = self.loop
        lanes = loop.links.inbound.stats() if loop else []
        bad = (
            {
                k: sum(s[k] for s in lanes)
                for k in (
                    "bad_crc",
                    "malformed",
                    "stale_epoch",
                    "stale_lap",
                    "truncated",
                    "orphans",
                    "gaps",
                    "bad_meta",
                )
            }
            if lanes
            else {}
        )
        return {
            "node": self.id,
            "msgs_in": loop.msgs_in if loop else 0,
            "msgs_out": loop.msgs_out if loop else 0,
            "outbox_waits": loop.outbox_waits if loop else 0,
            "dropped": loop.dropped if loop else 0,
            "dead_peers": sorted(loop.dead_peers) if loop else [],
            "incarnation": self.members.inc,
            "rejoins": self.members.rejoins,
            "stale_msgs": self.stale_msgs,
            "stalls": loop.stalls if loop else 0,
            "held_by_peers": self.peers.held_count(),
            # relaying (docs/PROTOCOL.md section 10): relayed on, gone around a dead hop,
            # dropped (reason -> count)
            "relayed": self.core.relayed,
            "rerouted": self.core.rerouted,
            "relay_dropped": dict(self.core.relay_dropped),
            "dead_detected_s": dict(loop.dead_at) if loop else {},
            "preempt_reactions": self.reactions.count,
            "preempt_reaction_p50_us": self.reactions.percentile_us(0.5),
            "preempt_reaction_p99_us": self.reactions.percentile_us(0.99),
            "rejected": dict(self.rejected),
            "handler_errors": dict(self.handler_errors),
            "sync_early_kept": self.sync_early_kept,
            "clients": self.hub.stats() if self.hub is not None else None,
            "bad_slots": bad,
            "scheduler": self.scheduler.stats().as_dict(),
            # gangs coordinated here and slots held for others' (docs/GANGS.md)
            "gangs": self.core.gangs.stats(),
        }

    # ---- internals: the API's checks and plumbing ---------------------------------------------
    def _init_api_state(self) -> None:
        #: handler (or call_later callback) -> exceptions it raised (or bad results)
        self.handler_errors: dict[str, int] = {}
        #: groups declared through the API (caller side; the loop's copy is `_groups`)
        self._group_defs: dict[int, tuple[frozenset[int], bool]] = {}  # (members, overlap)
        self._defs_lock = threading.Lock()
        self._error_unreported = False
        self._stop_asked = False

    def _failed(self) -> NodeFailedError:
        err = NodeFailedError(f"node {self.id} cannot go on: its loop failed: {self._error!r}")
        err.__cause__ = self._error
        return err

    def _checked_members(self, group: int, members: Iterable[int | str]) -> frozenset[int]:
        mem = frozenset(check_node(self.cluster, "group member", m) for m in check_members(members))
        if self.id not in mem:
            raise ConfigError(f"node {self.id} is not a member of group {group}")
        return mem

    def _ask(self, fn: Callable[[], _T], timeout_s: float = 10.0) -> _T:
        """`fn()` run on the loop after every call made before this one; its result."""
        loop = self.loop
        if self._error is not None:
            raise self._failed()
        if loop is None or loop.in_loop():
            return fn()
        own_thread = self._thread is not None  # start()ed: only that thread runs the calls
        if not own_thread and not loop.running:  # opened, not running: run the calls here
            loop.run_pending()
            return fn()
        done = threading.Event()
        box: list[tuple[bool, Any]] = []

        def ask() -> None:
            try:
                box.append((True, fn()))
            except Exception as exc:  # raised in the caller, not in the loop
                box.append((False, exc))
            finally:
                done.set()

        self._call(ask)
        while not done.wait(min(timeout_s, 0.05)):
            timeout_s -= 0.05
            if self._error is not None:
                raise self._failed()
            if not own_thread and not loop.running and not done.is_set():  # run() returned
                loop.run_pending()
                continue
            if timeout_s <= 0:
                raise RdmaschedError(f"node {self.id}: the loop did not catch up in time")
        ok, value = box[0]
        if not ok:
            raise value
        result: _T = value
        return result

    def _finish_pending(self, loop: Loop) -> None:
        """At stop: carry out the calls made before it (not after a failure)."""
        if self._error is not None or loop.in_loop():
            return  # from a handler: the loop runs them before it stops
        try:
            self._ask(lambda: None)
        except Exception as exc:
            _log.warning("node %d: stopping before the calls made earlier ran: %s", self.id, exc)

    def _handler_failed(self, name: str, exc: BaseException, task_id: int) -> None:
        """A user handler raised (or returned what it must not): log, count, go on."""
        self.handler_errors[name] = self.handler_errors.get(name, 0) + 1
        _log.error(
            "node %d: %s failed (task %d); the node goes on: %s",
            self.id,
            name,
            task_id,
            exc,
            exc_info=exc if exc.__traceback__ is not None else None,
        )

    def _preempt_progress(self, a: PreemptTask) -> Any:
        """Call the preempt handler; its progress, or the task's last one if it failed
        (or LATER from the client hub: the answer comes later)."""
        victim = a.victim
        assert self._preempt is not None
        try:
            got: Any = self._preempt(victim, a.slot, a.cancel)
        except Exception as exc:
            self._handler_failed("on_preempt", exc, victim.id)
            return victim.progress_ns
        if got is LATER and self.hub is not None:
            return got
        if type(got) is not int or not 0 <= got <= U64_MAX:
            self._handler_failed(
                "on_preempt",
                ArgumentTypeError(
                    f"on_preempt returned {got!r} for task {victim.id}; it must return the "
                    f"task's progress in ns, an int >= 0 (kept {victim.progress_ns})"
                ),
                victim.id,
            )
            return victim.progress_ns
        return got

    def _run_sync(self, t: Task, slot: int) -> bool:
        """Run the sync handler; True if the sync task is done (unless it returned LATER)."""
        result: object = None
        if self._sync is not None:
            try:
                result = self._sync(t, slot)
            except Exception as exc:  # a failed sync must not keep its slot
                self._handler_failed("on_sync", exc, t.id)
            if result is LATER:
                return False
            if result is not None:
                self._handler_failed(
                    "on_sync",
                    ArgumentTypeError(
                        f"on_sync returned {result!r}; return None (done) or LATER "
                        "(complete it later); completed it"
                    ),
                    t.id,
                )
        return True

    # ---- internals -------------------------------------------------------------------------
    def _loop(self) -> Loop:
        assert self.loop is not None
        return self.loop

    # ---- the driver: carrying out the core's effects ----------------------------------------
    def _on_message(self, m: Message, peer: int) -> None:
        probe = self._probe
        if probe is None:
            effects = self.core.receive(m, peer, self.clock())
            if effects:
                self.carry_out(effects)
            return
        # the same, with the stage probe's points 2, 3 and 5 (rdmasched/daemon/probe.py)
        probe.mark(2)
        if probe.wants_trigger and m.kind == _PREEMPT:  # (only StageClock: the others would
            probe.preempt_seen(m.arg0)  # count the int and the call in the core stage)
        effects = self.core.receive(m, peer, self.clock())
        probe.mark(3)
        if effects:
            self.carry_out(effects)
        probe.mark(5)

    @property
    def probe(self) -> Probe | None:
        """The stage probe of this node's message path (benchmarks; None: no probe)."""
        return self._probe

    @probe.setter
    def probe(self, probe: Probe | None) -> None:
        self._probe = probe
        if self.loop is not None:
            self.loop.probe = probe

    def carry_out(self, effects: list[Effect]) -> None:
        """Carry out the core's effects, in order. A handler's answer goes back to the core
        at once, and what the core makes of it is carried out next, before the rest.

        On the loop thread only (from a handler, or a function given to `call_soon`): for
        drivers that share the node's loop, such as the client hub, which feed the core
        (`node.core`) themselves and hand what it decides to the node to carry out."""
        # On the hot path: one `type(e) is` test per kind, no isinstance, no asserts.
        core = self.core
        i = 0
        while i < len(effects):
            e: Any = effects[i]
            i += 1
            t = type(e)
            if t is Start:
                if self._dispatch is not None:
                    try:
                        self._dispatch(e.task, e.slot)
                    except Exception as exc:  # the task keeps its slot: complete or preempt it
                        self._handler_failed("on_dispatch", exc, e.task.id)
            elif t is PreemptTask:
                if self._probe is not None:
                    self._probe.mark(4)
                if e.trigger_ns:
                    self.reactions.add(self.clock() - e.trigger_ns)
                progress: Any = e.victim.progress_ns
                if self._preempt is not None:
                    progress = self._preempt_progress(e)
                    if progress is LATER:  # a client answers later (daemon/clients.py)
                        continue
                effects[i:i] = core.preempted(e.victim, progress, self.clock())
            elif t is Send:
                enc = e.message.encode()
                if type(e.message) is _HEARTBEAT_T:  # also to a peer declared dead
                    self._loop().send(e.peer, *enc, force=True, dst=e.dst)
                else:
                    self._loop().send(e.peer, *enc, dst=e.dst)
            elif t is Relay:  # a message for another node, on to the next hop
                r = msg.relayed(e.message)
                self._loop().send(e.peer, *r.fields, dst=r.dst, src=r.src, relays=r.relays)
            elif t is SetLoad:
                self._loop().set_load(e.load)
            elif t is RunSync:
                if self._run_sync(e.task, e.slot):
                    effects[i:i] = core.sync_done(e.task, self.clock())
            elif t is CompleteNotice:
                if self._complete is not None:
                    try:
                        self._complete(e.task_id, e.node)
                    except Exception as exc:
                        self._handler_failed("on_complete", exc, e.task_id)
            elif t is MarkDead:
                loop = self._loop()
                loop.mark_dead(e.peer, e.why)
                release = getattr(loop.links, "release_gone", None)
                if release is not None:
                    release(e.peer)
            elif t is Revive:
                loop = self._loop()
                if e.again or e.peer in loop.dead_peers:
                    loop.revive(e.peer)
            elif t is SetTimer:
                self._loop().call_at(e.at_ns, self._tick)
            elif t is Wake:
                self._loop().call_at(e.at_ns, self._wake)

    def _tick(self) -> None:
        """The heartbeat timer (armed by the core's SetTimer)."""
        loop = self._loop()
        effects: list[Effect] = []
        for p, why in loop.lost:
            effects += self.core.peer_lost(p, why, self.clock())
        loop.lost.clear()
        effects += self.core.tick(self.clock(), loop.listened_ns)
        self.carry_out(effects)

    def _wake(self) -> None:
        """A run quantum or a job's preemption window ended (armed by the core's Wake)."""
        self.carry_out(self.core.wake(self.clock()))

    def _stalled(self, gap_ns: int) -> None:
        """The loop did not run for `gap_ns`: maybe declared dead meanwhile."""
        self.carry_out(self.core.stalled(gap_ns, self.clock()))


if TYPE_CHECKING:
    _satisfies: type[NodeAPI] = Node  # mypy: Node offers the API Client offers (rdmasched.api)
