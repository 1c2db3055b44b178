"""`Node`: the node daemon's Python API.

A node owns its inbound lanes, polls them on one loop thread, feeds every message to its own
scheduler and calls the user's handlers with the scheduler's decisions. There is no central
scheduler: each node decides what runs on its own execution slots.

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
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from rdmasched import messages as msg
from rdmasched._wire import Message
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.checks import (
    U64_MAX,
    check_bool,
    check_callable,
    check_int,
    check_node,
    check_payload,
)
from rdmasched.daemon.links import Links, ShmLinks, VerbsLinks, close_quietly
from rdmasched.daemon.loop import Loop
from rdmasched.daemon.membership import Change, Membership, PeerGone, PeerJoined, Rejoined, Replace
from rdmasched.errors import (
    ArgumentError,
    ArgumentTypeError,
    ConfigError,
    NodeFailedError,
    RdmaschedError,
)
from rdmasched.scheduler import (
    Action,
    Cancel,
    Event,
    Forward,
    PeerTable,
    Preempt,
    Scheduler,
    SchedulerError,
    Start,
    Task,
)
from rdmasched.wire import Flag, Kind

_log = logging.getLogger("rdmasched.daemon")
_T = TypeVar("_T")

DispatchHandler = Callable[[Task, int], None]
PreemptHandler = Callable[[Task, int, bool], int]
SyncHandler = Callable[[Task, int], object]
CompleteHandler = Callable[[int, int], None]

_DISPATCH, _PREEMPT, _SYNC_READY = int(Kind.DISPATCH), int(Kind.PREEMPT), int(Kind.SYNC_READY)
_COMPLETE, _HEARTBEAT = int(Kind.COMPLETE), int(Kind.HEARTBEAT)
_CANCEL, _JOB, _SUBMITTED = int(Flag.CANCEL), int(Flag.JOB), int(Flag.SUBMITTED)

#: sync tasks get ids from their own space so they never collide with submitted tasks
SYNC_ID_BASE = 1 << 63


def sync_task_id(group: int, step: int) -> int:
    return SYNC_ID_BASE | ((group & 0x7FFFFFFF) << 32) | (step & 0xFFFFFFFF)


GROUP_MAX = (1 << 31) - 1
#: steps are 0..2**32-1 (a sync task's id holds the step in 32 bits)
STEP_MAX = (1 << 32) - 1
#: SYNC_READYs kept for groups not (yet) defined here, at most (over it: rejected)
EARLY_SYNC_MAX = 4096


class _Later:
    """The type of `LATER`."""

    def __repr__(self) -> str:
        return "LATER"


#: what a sync handler returns to keep its slot until `node.complete(task.id)`; any other
#: return (None) completes the sync task when the handler returns
LATER = _Later()


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
        if not self.samples:
            return None
        s = sorted(self.samples)
        return s[min(len(s) - 1, int(q * len(s)))] / 1000.0


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
    ) -> None:
        self.cluster = cluster
        self.spec = cluster.node(node)
        self.id = self.spec.id
        self.clock = clock
        self._links_given = links
        self._spin_us = spin_us
        self.peers = PeerTable(clock=clock, dead_after_us=cluster.dead_after_ms * 1000)
        for n in cluster.nodes:
            if n.id != self.id:
                self.peers.add(n.id, n.domain)
        # A process starts as an incarnation above any earlier one of this node: the wall
        # clock in ms (docs/DAEMON.md, "Dead peers, incarnations and rejoining").
        self.members = Membership(
            self.id,
            (n.id for n in cluster.nodes),
            inc=max(1, time.time_ns() // 1_000_000),
            dead_after_ns=cluster.dead_after_ms * 1_000_000,
            heartbeat_ns=cluster.heartbeat_ms * 1_000_000,
            now=clock(),
        )
        #: peers whose messages are ignored (their incarnation ended)
        self._shunned: set[int] = set()
        #: peers that have not acknowledged this node's current incarnation
        self._unacked: set[int] = set()
        self.stale_msgs = 0
        self.scheduler = Scheduler(
            self.spec.slots,
            clock=clock,
            starvation_us=starvation_us,
            aging_us=aging_us,
            events=events,
            node_id=self.id,
            peers=self.peers,
            domain=self.spec.domain,
            max_hops=max_hops,
        )
        self.sync_cost_ns = sync_cost_ns
        self.reactions = Reactions()
        self.rejected: dict[str, int] = {}
        self._dispatch: DispatchHandler | None = None
        self._preempt: PreemptHandler | None = None
        self._sync: SyncHandler | None = None
        self._complete: CompleteHandler | None = None
        self._groups: dict[int, frozenset[int]] = {}
        self._trigger_ns = 0
        self._load = -1
        self.loop: Loop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._init_api_state()

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def from_config(cls, path: str, node: int | str, **kw: Any) -> Node:
        return cls(ClusterConfig.load(path), node, **kw)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **kw: Any) -> Node:
        cluster, rank = ClusterConfig.from_env(env)
        return cls(cluster, rank, **kw)

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
        if links is None and self.cluster.transport == "verbs":
            links = VerbsLinks(self.cluster, self.id)
        elif links is None:
            links = ShmLinks(
                self.cluster.name,
                self.id,
                (n.id for n in self.cluster.nodes),
                nslots=self.cluster.slots_per_lane,
            )
        self.loop = Loop(links, spin_us=self._spin_us, clock=self.clock)
        self.loop.keep_on_death = frozenset({_COMPLETE})
        self.loop.stall_ns = self.members.stall_ns
        self.loop.on_stall = self._stalled
        self.members.last_tick_ns = self.clock()
        self._heartbeats()  # first, so that peers know this incarnation before anything else
        self._schedule_heartbeat()

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Run the loop on this thread until `stop()` (or `until()` is true)."""
        self.open()
        assert self.loop is not None
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
        self._finish_pending(loop)
        loop.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
            self._thread = None
        if self._error is None and not loop.running and not loop.flush_outbox(1.0):
            _log.warning("node %d: stopped with messages still queued for full lanes", self.id)
        self.loop = None
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

    def submit(
        self,
        task_id: int,
        *,
        job: int = 0,
        priority: int = 0,
        cost_ns: int = 0,
        payload: dict[str, Any] | None = None,
    ) -> None:
        """Run a task here if a slot is free, else on a lighter peer (power of two choices,
        same topology domain first), else queue it here."""
        task = self._checked_task(task_id, job, priority, cost_ns, payload)
        self._call(lambda: self._act(self._guard(lambda: self.scheduler.submit(task))))

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
        task = self._checked_task(task_id, job, priority, cost_ns, payload)
        to = None if to is None else check_node(self.cluster, "to", to)
        if to is None or to == self.id:
            self._call(lambda: self._act(self._guard(lambda: self.scheduler.dispatch(task))))
        else:
            self._check_peer(to)
            self._call(lambda: self._dispatch_to(to, task))

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
        task_id, job, node = self._checked_preempt(task_id, job, node, cancel)
        if node is None or node == self.id:

            def local() -> None:
                self._trigger_ns = self.clock()
                origin = None
                if task_id is not None:
                    t = self._resolve(task_id, None)
                    if t is None:
                        return
                    origin = t.origin
                self._act(
                    self._guard(
                        lambda: self.scheduler.preempt(
                            task_id, job=job, cancel=cancel, origin=origin
                        ),
                        task_id or 0,
                    )
                )

            self._call(local)
            return
        self._check_peer(node)
        stop = msg.Preempt(task_id or 0, job or 0, 0, cancel, job is not None)
        self._call(lambda: self._loop().send(node, *stop.stamped(self.clock())))

    def define_group(self, group: int, members: Iterable[int | str]) -> None:
        """Declare sync group `group` (its members: node ids or names); every member
        declares it too. May come before `open()`; declaring it again alike does nothing.
        SYNC_READYs from members that declared it first are kept until it is declared here.
        """
        group = check_int("group", group, 0, GROUP_MAX)
        mem = self._checked_members(group, members)

        def step_task(g: int, step: int) -> Task:
            return Task(
                sync_task_id(g, step),
                g,
                255,
                self.sync_cost_ns,
                payload={"step": step},
                origin=self.id,
            )

        def define() -> None:
            self.scheduler.define_group(group, mem, step_task)
            self._groups[group] = mem
            self._replay_early_sync(group)

        with self._defs_lock:
            old = self._group_defs.get(group)
            if old == mem:
                return
            if old is not None:
                raise ArgumentError(f"group {group} is already defined, with members {sorted(old)}")
            if self.loop is None and self._error is None:  # not open: no loop to race
                define()
            else:
                self._call(define)
            self._group_defs[group] = mem

    def sync_ready(self, group: int, step: int) -> None:
        """This node reached `step` (0..2**32-1) of `group`: tell every member (and count
        itself). `group` must have been declared with `define_group` on this node."""
        group = check_int("group", group, 0, GROUP_MAX)
        step = check_int("step", step, 0, STEP_MAX)
        if group not in self._group_defs:
            raise ArgumentError(f"sync_ready for group {group}, which define_group never declared")

        def announce() -> None:
            mem = self._groups.get(group)
            if mem is None:
                self._reject("unknown-group", f"sync_ready for undefined group {group}")
                return
            now = self.clock()
            ready = msg.SyncReady(group, step, self.id, sent_ns=now, job=group).encode()
            for m in mem:
                if m != self.id:
                    self._loop().send(m, *ready)
            self._trigger_ns = now
            self._act(self._guard(lambda: self.scheduler.sync_ready(group, step, self.id)))

        self._call(announce)

    def complete(self, task_id: int, *, origin: int | None = None, runtime_ns: int = 0) -> None:
        """The work of `task_id` finished: free its slot, start the next, tell its origin.

        Task ids are unique per origin node: `origin` names the node that submitted the
        task (`task.origin` in the dispatch handler). Without it: this node's own task
        `task_id` if it holds one, else the only task with that id held here."""
        task_id = check_int("task_id", task_id)
        runtime_ns = check_int("runtime_ns", runtime_ns)
        if origin is not None:
            origin = check_node(self.cluster, "origin", origin)

        def done() -> None:
            task = self._resolve(task_id, origin)
            if task is None:
                return
            try:
                actions = self.scheduler.complete(task.id, task.origin)
            except (SchedulerError, ValueError) as exc:
                self._reject(type(exc).__name__, str(exc))
                return
            if task.origin != self.id:
                done_msg = msg.Complete(task_id, task.job, runtime_ns, task.progress_ns)
                self._loop().send(task.origin, *done_msg.encode())
            self._act(actions)

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
            "dead_detected_s": dict(loop.dead_at) if loop else {},
            "preempt_reactions": self.reactions.count,
            "preempt_reaction_p50_us": self.reactions.percentile_us(0.5),
            "preempt_reaction_p99_us": self.reactions.percentile_us(0.99),
            "rejected": dict(self.rejected),
            "handler_errors": dict(self.handler_errors),
            "sync_early_kept": self.sync_early_kept,
            "bad_slots": bad,
            "scheduler": self.scheduler.stats().as_dict(),
        }

    # ---- internals: the API's checks and plumbing ---------------------------------------------
    def _init_api_state(self) -> None:
        #: handler (or call_later callback) -> exceptions it raised (or bad results)
        self.handler_errors: dict[str, int] = {}
        #: SYNC_READYs that came before their group was defined here, kept and replayed
        self.sync_early_kept = 0
        self._early_sync: dict[int, list[tuple[int, int]]] = {}
        self._early_sync_n = 0
        #: groups declared through the API (caller side; the loop's copy is `_groups`)
        self._group_defs: dict[int, frozenset[int]] = {}
        self._defs_lock = threading.Lock()
        self._error_unreported = False
        self._stop_asked = False

    def _failed(self) -> NodeFailedError:
        err = NodeFailedError(f"node {self.id} cannot go on: its loop failed: {self._error!r}")
        err.__cause__ = self._error
        return err

    def _checked_task(
        self, task_id: int, job: int, priority: int, cost_ns: int, payload: dict[str, Any] | None
    ) -> Task:
        """`_new_task` with every argument checked (types, the wire's ranges, the payload)."""
        task_id = check_int("task_id", task_id, 0, SYNC_ID_BASE - 1)
        job = check_int("job", job)
        priority = check_int("priority", priority, 0, 254)
        cost_ns = check_int("cost_ns", cost_ns)
        check_payload(payload)
        return self._new_task(task_id, job, priority, cost_ns, payload)

    def _checked_preempt(
        self, task_id: object, job: object, node: object, cancel: object
    ) -> tuple[int | None, int | None, int | None]:
        if (task_id is None) == (job is None):
            raise ArgumentError("preempt needs exactly one of task_id and job")
        check_bool("cancel", cancel)
        return (
            None if task_id is None else check_int("task_id", task_id),
            None if job is None else check_int("job", job),
            None if node is None else check_node(self.cluster, "node", node),
        )

    def _checked_members(self, group: int, members: Iterable[int | str]) -> frozenset[int]:
        if isinstance(members, str | bytes) or not isinstance(members, Iterable):
            raise ArgumentTypeError(f"members must be node ids or names, not {members!r}")
        mem = frozenset(check_node(self.cluster, "group member", m) for m in members)
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

    def _preempt_progress(self, a: Preempt) -> int:
        """Call the preempt handler; its progress, or the task's last one if it failed."""
        victim = a.victim
        assert self._preempt is not None
        try:
            got = self._preempt(victim, a.slot, a.cancel)
        except Exception as exc:
            self._handler_failed("on_preempt", exc, victim.id)
            return victim.progress_ns
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

    def _start_sync(self, t: Task, slot: int) -> list[Action]:
        """Run the sync handler; complete the sync task when it returns, unless LATER."""
        result: object = None
        if self._sync is not None:
            try:
                result = self._sync(t, slot)
            except Exception as exc:  # a failed sync must not keep its slot
                self._handler_failed("on_sync", exc, t.id)
            if result is LATER:
                return []
            if result is not None:
                self._handler_failed(
                    "on_sync",
                    ArgumentTypeError(
                        f"on_sync returned {result!r}; return None (done) or LATER "
                        "(complete it later); completed it"
                    ),
                    t.id,
                )
        return self._guard(lambda: self.scheduler.complete(t.id), t.id)

    def _keep_early_sync(self, group: int, step: int, member: int) -> None:
        """A SYNC_READY for a group not defined here yet: keep it (bounded) for define."""
        if self._early_sync_n >= EARLY_SYNC_MAX:
            self._reject("unknown-group", f"SYNC_READY for undefined group {group}; none kept")
            return
        self._early_sync.setdefault(group, []).append((step, member))
        self._early_sync_n += 1
        self.sync_early_kept += 1

    def _replay_early_sync(self, group: int) -> None:
        kept = self._early_sync.pop(group, ())
        self._early_sync_n -= len(kept)
        for step, member in kept:
            self._act(
                self._guard(
                    lambda step=step, member=member: self.scheduler.sync_ready(  # type: ignore[misc]
                        group, step, member
                    )
                )
            )

    # ---- internals -------------------------------------------------------------------------
    def _loop(self) -> Loop:
        assert self.loop is not None
        return self.loop

    def _new_task(
        self, task_id: int, job: int, priority: int, cost_ns: int, payload: dict[str, Any] | None
    ) -> Task:
        if not 0 <= task_id < SYNC_ID_BASE:
            raise ValueError(
                f"task ids are 0..2**63-1 (2**63 and up are sync tasks), not {task_id}"
            )
        if not 0 <= priority <= 254:
            raise ValueError(f"priority must be 0..254 (255 is for sync tasks), not {priority}")
        if not 0 <= job < (1 << 64) or cost_ns < 0:
            raise ValueError("job must be a u64 and cost_ns >= 0")
        return Task(task_id, job, priority, cost_ns, payload=payload, origin=self.id)

    def _resolve(self, task_id: int, origin: int | None, prefer: int | None = None) -> Task | None:
        """The task held here that `task_id` (of `origin`) names; None (and a rejection)
        if there is none or the name is ambiguous. Without `origin`: `prefer`'s task (a
        peer's PREEMPT names its own tasks first), this node's own, else the only one."""
        sched = self.scheduler
        if origin is not None:
            t = sched.lookup(task_id, origin)
            if t is None:
                self._reject("unknown-task", f"unknown task {task_id} of node {origin}")
            return t
        if prefer is not None:
            t = sched.lookup(task_id, prefer)
            if t is not None:
                return t
        t = sched.lookup(task_id, self.id)
        if t is not None:
            return t
        found = sched.find(task_id)
        if len(found) == 1:
            return found[0]
        if not found:
            self._reject("unknown-task", f"unknown task {task_id}")
        else:
            origins = [t.origin for t in found]
            self._reject("ambiguous-task", f"tasks {task_id} of nodes {origins}: pass origin=")
        return None

    def _check_peer(self, node: int) -> None:
        self.cluster.node(node)

    def _reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        _log.warning("node %d: rejected (%s): %s", self.id, reason, detail)

    def _guard(self, fn: Callable[[], list[Action]], task_id: int = 0) -> list[Action]:
        """Scheduler input errors are counted and logged; the node keeps running."""
        try:
            return fn()
        except (SchedulerError, ValueError) as exc:
            self._reject(type(exc).__name__, str(exc))
            return []

    def _dispatch_to(self, peer: int, task: Task) -> None:
        """`dispatch(to=peer)`: recorded as held by `peer` (see Scheduler.place_on)."""
        try:
            self.scheduler.place_on(task, peer)
        except (SchedulerError, ValueError) as exc:
            self._reject(type(exc).__name__, str(exc))
            return
        self._send_task(peer, task, submitted=False)

    def _send_task(self, peer: int, task: Task, submitted: bool) -> None:
        m = msg.Dispatch(
            task.id,
            task.job,
            task.priority,
            task.cost_ns,
            task.progress_ns,
            task.origin,
            task.hops,
            submitted,
            payload=task.payload,
        )
        self._loop().send(peer, *m.encode())

    def _act(self, actions: list[Action]) -> None:
        """Carry out the scheduler's decisions, in order."""
        i = 0
        while i < len(actions):
            a = actions[i]
            i += 1
            if isinstance(a, Start):
                t = a.task
                if t.group is not None:
                    actions[i:i] = self._start_sync(t, a.slot)
                elif self._dispatch is not None:
                    try:
                        self._dispatch(t, a.slot)
                    except Exception as exc:  # the task keeps its slot: complete or preempt it
                        self._handler_failed("on_dispatch", exc, t.id)
            elif isinstance(a, Preempt):
                if self._trigger_ns:
                    self.reactions.add(self.clock() - self._trigger_ns)
                progress = a.victim.progress_ns
                if self._preempt is not None:
                    progress = self._preempt_progress(a)
                victim_id, victim_origin = a.victim.id, a.victim.origin

                def requeue(
                    victim_id: int = victim_id, progress: int = progress, o: int = victim_origin
                ) -> list[Action]:
                    return self.scheduler.yielded(victim_id, progress, o)

                actions[i:i] = self._guard(requeue)
            elif isinstance(a, Forward):
                self._send_task(a.peer, a.task, submitted=True)
            elif isinstance(a, Cancel):
                _log.info("node %d: task %d cancelled", self.id, a.task.id)
        self._trigger_ns = 0
        load = self.scheduler.load_hint()
        if load != self._load:
            self._load = load
            self._loop().set_load(load)

    def _on_message(self, m: Message, peer: int) -> None:
        # The hot path of a node: plain ints, not the enums (an IntFlag `&` costs ~0.5 us).
        kind = m.kind
        if kind == _HEARTBEAT:
            changes = self.members.on_heartbeat(peer, m.meta, self.clock())
            if changes:
                self._apply(changes)
        if peer in self._shunned:  # a message of an incarnation that ended
            self.stale_msgs += 1
            return
        self.peers.seen(peer, m.load)
        sched = self.scheduler
        try:
            if kind == _PREEMPT:
                self._trigger_ns = m.arg0
                cancel = bool(m.flags & _CANCEL)
                if m.flags & _JOB:
                    self._act(sched.preempt(job=m.job, cancel=cancel))
                else:
                    t = self._resolve(m.id, None, prefer=peer)
                    if t is not None:
                        self._act(sched.preempt(m.id, cancel=cancel, origin=t.origin))
            elif kind == _DISPATCH:
                origin = int(m.arg2)
                if origin != self.id and peer in self._unacked:
                    # sent to this node's previous incarnation: its origin places it again
                    self.stale_msgs += 1
                    return
                task = Task(
                    m.id, m.job, m.priority, m.arg0, m.arg1, m.meta, origin=origin, hops=m.hops
                )
                # Placed work may move on (back to its origin); work sent here is for here.
                self._act(sched.receive(task, peer, bool(m.flags & _SUBMITTED)))
            elif kind == _SYNC_READY:
                if m.id not in self._groups:  # before our define_group: keep it
                    self._keep_early_sync(m.id, m.arg0, m.arg2)
                    return
                self._trigger_ns = m.arg1
                self._act(sched.sync_ready(m.id, m.arg0, m.arg2))
            elif kind == _COMPLETE:
                sched.remote_complete(peer, m.id)
                if self._complete is not None:
                    try:
                        self._complete(m.id, peer)
                    except Exception as exc:
                        self._handler_failed("on_complete", exc, m.id)
            elif kind != _HEARTBEAT:  # a heartbeat is all in `seen` above
                self._reject("unknown-kind", f"kind {kind} from node {peer}")
        except (SchedulerError, ValueError) as exc:
            # Counted by the scheduler too; the message is refused, the node goes on.
            self._trigger_ns = 0
            self._reject(type(exc).__name__, str(exc))

    # ---- membership (rules in membership.py and docs/DAEMON.md) --------------------------
    def _heartbeat(self, peer: int, now: int, queued: int, running: int) -> None:
        """A HEARTBEAT to `peer`, also one declared dead: its metadata says which
        incarnation of it this node knows as alive, or declared dead."""
        beat = msg.Heartbeat(now, queued, running, self.members.heartbeat_meta(peer))
        self._loop().send(peer, *beat.encode(), force=True)

    def _heartbeats(self, peers: Iterable[int] | None = None) -> None:
        now = self.clock()
        queued = self.scheduler.stats().queue_len
        running = len(self.scheduler.running())
        for p in self.members.views if peers is None else peers:
            self._heartbeat(p, now, queued, running)

    def _stalled(self, gap_ns: int) -> None:
        """The loop did not run for `gap_ns`: maybe declared dead meanwhile."""
        self._apply(self.members.stalled(gap_ns, self.clock()))

    def _apply(self, changes: list[Change]) -> None:
        """Carry out membership changes, in order."""
        loop = self._loop()
        sched = self.scheduler
        for c in changes:
            if isinstance(c, PeerGone):
                _log.warning(
                    "node %d: node %d (incarnation %d) is gone: %s", self.id, c.peer, c.inc, c.why
                )
                loop.mark_dead(c.peer, c.why)
                release = getattr(loop.links, "release_gone", None)
                if release is not None:
                    release(c.peer)
                self._act(sched.peer_gone(c.peer))
            elif isinstance(c, PeerJoined):
                self.peers.revive(c.peer)
                if c.again or c.peer in loop.dead_peers:
                    loop.revive(c.peer)
                self._heartbeats([c.peer])  # answer at once: it waits for our ack
            elif isinstance(c, Rejoined):
                _log.warning(
                    "node %d: rejoining as incarnation %d (was %d): %s",
                    self.id,
                    c.new,
                    c.old,
                    c.why,
                )
                self.peers.refresh()  # their silence was ours
                self.peers.mark_stale()  # what they hold now, they drop (Replace below)
                self._act(sched.drop_origin(None))
                self._heartbeats()
            elif isinstance(c, Replace):
                self._act(sched.replace_held(c.peer, f"node {c.peer} dropped it (rejoin)"))
        views = self.members.views
        self._shunned = {p for p, v in views.items() if not v.alive}
        self._unacked = {p for p, v in views.items() if not v.acked}

    def _schedule_heartbeat(self) -> None:
        period = self.cluster.heartbeat_ms * 1_000_000

        def beat() -> None:
            loop = self._loop()
            changes: list[Change] = []
            for p, why in loop.lost:
                changes += self.members.gone(p, why)
            loop.lost.clear()
            now = self.clock()
            changes += self.members.tick(now, self.peers.expired(loop.listened_ns))
            self._apply(changes)
            self._heartbeats()
            loop.call_later(period, beat)

        self._loop().call_later(period, beat)
