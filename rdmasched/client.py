"""A training rank's handle on its host's daemon (docs/CLIENT.md).

A node is a host, run as one daemon (`rdmasched daemon`, or started by local rank 0 with
`Client.from_env(start_daemon=True)`); every rank of the host is a client of it over two shm
lanes, one each way. A `Client` has the API of a `Node` (docs/DAEMON.md): the same methods
and the same handler contracts, so code written for a node runs on a rank::

    from rdmasched import LATER, Client

    client = Client.from_env()          # LOCAL_RANK's lanes of this host's daemon
    @client.on_dispatch
    def start(task, slot): ...          # a task this rank submitted starts on GPU `slot`
    @client.on_preempt
    def stop(task, slot, cancel): ...   # stop it now; return its progress, ns
    @client.on_sync
    def sync(task, slot): ...           # the group's step was released: all-reduce now
    with client:
        client.define_group(1, client.nodes)      # members are hosts (nodes)
        client.submit(42, job=7, priority=100)
        client.sync_ready(1, step=0)              # this rank reached step 0

Handlers run on the client's reader thread, in the order the daemon sent them; every
method may be called from any thread or from a handler. A rank gets the callbacks of its own
tasks only (and of other nodes' tasks placed on its slot). If the daemon goes away, every
waiting call raises `DaemonGoneError` within `check_ms` (default 100 ms) of the reader thread
running, and every later call raises it too.

The messages a client and its daemon exchange, and their lanes' names, are the client-lane
protocol (`rdmasched.clientproto`); the argument checks and handler types are the ones
`Node` uses (`rdmasched.api`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rdmasched import Kind
from rdmasched._ring import Batch, LaneSet, TxLane
from rdmasched._shm import read_header
from rdmasched.api import (
    LATER,
    CompleteHandler,
    DispatchHandler,
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
    bell_name,
    down_lane,
    error_from,
    preempt_flags,
    up_lane,
)
from rdmasched.daemon.checks import U64_MAX, check_bool, check_callable, check_int
from rdmasched.daemon.core import SYNC_ID_BASE
from rdmasched.daemon.tuning import check_slice_us, set_slice
from rdmasched.errors import (
    ArgumentError,
    ArgumentTypeError,
    EpochError,
    LaneBusyError,
    LaneError,
    LaneFullError,
    PeerDeadError,
    RdmaschedError,
)
from rdmasched.limits import MAX_SPIN_US
from rdmasched.scheduler import Event, Task
from rdmasched.scheduler.events import Decision
from rdmasched.scheduler.task import TaskState
from rdmasched.transport import shm

if TYPE_CHECKING:
    from rdmasched.api import NodeAPI

__all__ = ["Client", "DaemonGoneError"]

_log = logging.getLogger("rdmasched.client")

#: the reader's spin after a message, us, unless `Client(spin_us=)` or RDMASCHED_SPIN_US says
CLIENT_SPIN_US = 50


class DaemonGoneError(PeerDeadError):
    """This host's daemon is not there (at connect) or went away (later)."""


class Client:
    """Client `index` (the rank's LOCAL_RANK) of the daemon at `endpoint` (`<cluster>.<host>`,
    rdmasched.clientproto.endpoint_name)."""

    def __init__(
        self,
        endpoint: str,
        index: int = 0,
        *,
        connect_timeout_s: float = 30.0,
        check_ms: int = 100,
        nslots: int = 256,
        session: str | None = None,
        spin_us: int = CLIENT_SPIN_US,
        slice_us: int | None = None,
    ) -> None:
        self.endpoint = endpoint
        if session is None:
            from rdmasched import launch

            session = launch.session_name()
        #: the launcher's run this rank belongs to (`launch.session_name`): its sync groups
        #: are this session's (docs/CLIENT.md, "Sessions")
        self.session = session
        self.index = check_int("index", index, 0, 254)
        self.connect_timeout_s = connect_timeout_s
        self.check_s = check_ms / 1000
        #: how long the reader spins on the down lane after a message before it sleeps on
        #: its doorbell, us (docs/CLIENT.md, "Spinning")
        self.spin_us = check_int("spin_us", spin_us, 0, MAX_SPIN_US)
        #: the EEVDF slice the reader asks for, us (None: the kernel's default), and the
        #: rank's other threads on the control path (docs/CLIENT.md, "The slice")
        self.slice_us = None if slice_us is None else check_slice_us("slice_us", slice_us)
        self.nslots = nslots
        #: the daemon's node id, name, slots (from its WELCOME)
        self.id = -1
        self.name = ""
        self.slots = 0
        self.handler_errors: dict[str, int] = {}
        #: requests of this client the daemon refused, by error type (each is also logged)
        self.rejected: dict[str, int] = {}
        self.last_rejection: str | None = None
        #: a refusal the daemon said must raise here (a full queue, a refused sync_ready):
        #: raised once, by the next call of this rank's threads (not handlers')
        self._refusal: RdmaschedError | None = None
        self._dispatch: DispatchHandler | None = None
        self._preempt: PreemptHandler | None = None
        self._sync: SyncHandler | None = None
        self._complete: CompleteHandler | None = None
        self._peer: Callable[[int, bool, str], None] | None = None
        #: the hosts (node ids) the daemon has declared dead and not seen alive again: its
        #: liveness news (OP_PEER), as it comes, with no request
        self.dead_peers: set[int] = set()
        self._tx: TxLane | None = None
        self._rx: Any = None
        self._bell: shm.Doorbell | None = None
        #: what the reader waits on (the down lane); `wake` hands it work (timers, stop)
        self._lanes: LaneSet | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._welcome = threading.Event()
        self._rid = itertools.count(1)
        self._waiting: dict[int, list[Any]] = {}
        self._cond = threading.Condition()
        self._running: dict[tuple[int, int], Task] = {}
        #: starts that came before `on_dispatch` was registered (reader thread only)
        self._unstarted: list[Task] = []
        self._groups: dict[int, tuple[frozenset[int], bool]] = {}  # (members, overlap)
        self._nodes: dict[str, int] = {}
        self._daemon: tuple[int, int] | None = None
        self._timers: list[tuple[int, int, Callable[[], None]]] = []
        self._tlock = threading.Lock()
        self._tseq = itertools.count()

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_env(
        cls, env: dict[str, str] | None = None, *, start_daemon: bool = False, **kw: Any
    ) -> Client:
        """The client of this rank (LOCAL_RANK, or SLURM_LOCALID) to this host's daemon, whose
        endpoint the launcher's variables name (rdmasched.launch). With `start_daemon`, local
        rank 0 starts the daemon as a child process (`rdmasched daemon --exit-when-idle`) if
        none runs yet; the other ranks wait for it (up to `connect_timeout_s`).
        RDMASCHED_SPIN_US and RDMASCHED_SLICE_US, when set, are `spin_us` and `slice_us`
        (unless `kw` gives them)."""
        from rdmasched import launch

        endpoint, index = launch.client_endpoint(env)
        spin = launch.client_spin_us(env)
        if spin is not None:
            kw.setdefault("spin_us", spin)
        slice_us = launch.client_slice_us(env)
        if slice_us is not None:
            kw.setdefault("slice_us", slice_us)
        if start_daemon and index == 0 and not launch.daemon_running(endpoint):
            launch.spawn_daemon(env)
        return cls(endpoint, index, **kw)

    # ---- handlers, as Node's ----------------------------------------------------------------
    def on_dispatch(self, fn: DispatchHandler) -> DispatchHandler:
        """`fn(task, slot)`: start `task` (this rank's own, or another node's placed on this
        rank's slot) on execution slot `slot`. Return quickly; `complete(task.id)` later.
        Starts that came before it was registered are handed to it then (on the reader
        thread), unless they were preempted meanwhile."""
        self._dispatch = check_callable("on_dispatch", fn)
        if self.healthy:
            self.call_later(0, self._start_unstarted)
        return fn

    def _start_unstarted(self) -> None:
        """Reader thread: run `on_dispatch` for the starts that came before it."""
        todo, self._unstarted = self._unstarted, []
        for t in todo:
            if self._running.get((t.origin, t.id)) is t and self._dispatch is not None:
                try:
                    self._dispatch(t, t.slot)  # type: ignore[arg-type]
                except Exception as exc:
                    self._failed("on_dispatch", exc, t.id)

    def on_preempt(self, fn: PreemptHandler) -> PreemptHandler:
        """`fn(task, slot, cancel) -> progress_ns`: stop `task` now."""
        self._preempt = check_callable("on_preempt", fn)
        return fn

    def on_sync(self, fn: SyncHandler) -> SyncHandler:
        """`fn(task, slot)`: a step of a group this rank defined was released. The host's
        sync task is complete when every participant's `fn` returned (or, for one that
        returned `LATER`, called `complete(task.id)`)."""
        self._sync = check_callable("on_sync", fn)
        return fn

    def on_complete(self, fn: CompleteHandler) -> CompleteHandler:
        """`fn(task_id, node)`: a task this rank submitted completed on node `node`."""
        self._complete = check_callable("on_complete", fn)
        return fn

    def on_peer(self, fn: Callable[[int, bool, str], None]) -> Callable[[int, bool, str], None]:
        """`fn(node, dead, why)`: the daemon declared host `node` dead (`dead`), or alive
        again, the moment it did (its liveness news; docs/CLIENT.md). On the reader thread;
        `dead_peers` holds the news so far. Not part of Node's API: a node's own liveness
        is its loop's (`stats()["dead_peers"]`)."""
        self._peer = check_callable("on_peer", fn)
        return fn

    # ---- lifecycle --------------------------------------------------------------------------
    def open(self) -> Client:
        """Connect: make this rank's lane from the daemon, attach to its lane to the daemon,
        say hello, wait for the daemon's welcome. `DaemonGoneError` if there is no daemon
        within `connect_timeout_s`."""
        if self._tx is not None:
            return self
        k = self.index
        deadline = time.monotonic() + self.connect_timeout_s
        try:
            try:
                self._bell = shm.Doorbell.create(bell_name(self.endpoint, f"c{k}"))
                self._rx = shm.create_lane(
                    down_lane(self.endpoint, k), self.nslots, doorbell=self._bell
                )
                self._lanes = LaneSet()
                self._lanes.set_doorbell(self._bell, self._bell.address)
                self._lanes.add(self._rx)
            except LaneBusyError as exc:
                raise LaneBusyError(
                    f"client {k} of daemon {self.endpoint} is another running process: "
                    f"each rank of a host needs its own index (LOCAL_RANK). {exc}"
                ) from None
            self._tx = self._attach(deadline)
            hdr = read_header(self._tx.segment)  # type: ignore[attr-defined]
            self._daemon = (int(hdr["receiver_pid"]), int(hdr["receiver_start"]))
            self._thread = threading.Thread(
                target=self._read, name=f"rdmasched-client{k}", daemon=True
            )
            self._thread.start()
            self._send(
                Kind.HEARTBEAT,
                hops=OP_HELLO,
                meta={"pid": os.getpid(), "rank": k, "session": self.session},
            )
            while not self._welcome.wait(self.check_s):
                self._check()
                if time.monotonic() > deadline:
                    raise DaemonGoneError(
                        f"daemon {self.endpoint} did not answer client {k} within "
                        f"{self.connect_timeout_s:g} s"
                    )
        except BaseException:
            self._close_lanes()
            raise
        return self

    def _attach(self, deadline: float) -> TxLane:
        name = up_lane(self.endpoint, self.index)
        while True:
            try:
                return shm.attach_lane(name, src=self.index)
            except LaneBusyError as exc:
                raise LaneBusyError(
                    f"client {self.index} of daemon {self.endpoint} is taken: {exc}"
                ) from None
            except PeerDeadError as exc:
                if time.monotonic() > deadline:
                    hint = ""
                    if self.index > 0:
                        try:
                            shm.attach_lane(up_lane(self.endpoint, 0), src=0).close()
                        except LaneBusyError:
                            hint = (
                                f"; the daemon runs but has no lane for client {self.index}: "
                                "start it with --max-clients above this rank's LOCAL_RANK"
                            )
                        except LaneError:
                            pass
                    raise DaemonGoneError(
                        f"no rdmasched daemon serves {self.endpoint!r} on this host "
                        f"(waited {self.connect_timeout_s:g} s: {exc}){hint}. Start one with "
                        "`rdmasched daemon` (docs/CLIENT.md), or "
                        "Client.from_env(start_daemon=True) on local rank 0"
                    ) from None
                time.sleep(0.01)

    def start(self) -> Client:
        return self.open()

    def close(self) -> None:
        """Say goodbye (the daemon cancels this rank's tasks still held), close the lanes.
        Safe to call twice."""
        if self._tx is None:
            return
        self._refusal = None  # leaving: nothing more to raise
        if self._error is None:
            try:
                self._send(Kind.HEARTBEAT, hops=OP_BYE)
            except RdmaschedError as exc:
                _log.warning("client %d: goodbye not sent: %s", self.index, exc)
        self._close_lanes()

    stop = close

    def _close_lanes(self) -> None:
        self._stop.set()
        if self._lanes is not None:
            self._lanes.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._thread = None
        for lane in (self._tx, self._rx):
            if lane is not None:
                lane.close()
        self._tx = self._rx = None
        if self._lanes is not None:
            self._lanes.set_doorbell(None, 0)  # a `wake` still on its way rings nothing
            self._lanes = None
        if self._bell is not None:
            self._bell.close()
            self._bell = None

    def __enter__(self) -> Client:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def healthy(self) -> bool:
        return self._tx is not None and self._error is None

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def daemon_pid(self) -> int | None:
        """The process id of the daemon this client is connected to (None before `open`)."""
        return None if self._daemon is None else self._daemon[0]

    @property
    def nodes(self) -> list[int]:
        """Every node (host) of the cluster, by id (for `define_group`)."""
        return list(self._ask("nodes", []))

    # ---- the API, as Node's ------------------------------------------------------------------
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
        """Run a task of this rank on this host if a slot is free, else on a lighter node,
        else queue it here. Its callbacks come to this rank. `gang` > 0: a member of gang
        `job` of `gang` members, placed all or nothing by this host's daemon (docs/GANGS.md)."""
        a = check_task(task_id, job, priority, cost_ns, payload)
        n = check_gang(gang)
        self._send(Kind.DISPATCH, a[0], a[1], a[2], 0, a[3], n, hops=OP_SUBMIT, meta=payload)

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
        """DISPATCH a task of this rank to node `to` (default: this host), no placement."""
        a = check_task(task_id, job, priority, cost_ns, payload)
        dst = NONE if to is None else self._node(to)
        self._send(Kind.DISPATCH, a[0], a[1], a[2], 0, a[3], dst, hops=OP_DISPATCH, meta=payload)

    def preempt(
        self,
        task_id: int | None = None,
        *,
        job: int | None = None,
        node: int | str | None = None,
        cancel: bool = False,
    ) -> None:
        """PREEMPT a task (or every task of `job`) on `node` (default: this host)."""
        tid, j = check_preempt(task_id, job, cancel)
        dst = NONE if node is None else self._node(node)
        flags = preempt_flags(cancel, j is not None)
        self._send(Kind.PREEMPT, tid or 0, j or 0, 0, flags, 0, dst, hops=OP_PREEMPT)

    def define_group(
        self,
        group: int,
        members: Iterable[int | str],
        *,
        local: int | None = None,
        overlap: bool = False,
    ) -> None:
        """Declare sync group `group` over `members` (nodes, i.e. hosts, by id or name) and
        join it as one of this host's participants. This host is ready at a step once
        `local` participants (default: every client the daemon serves) said sync_ready.
        `overlap`: the group's syncs run beside the host's running tasks (collectives that
        overlap compute, as DDP's buckets): a release takes no slot and preempts nothing;
        `on_sync` gets slot `NO_SLOT` (every participant must say the same). Waits for the
        daemon's answer: errors raise here."""
        group = check_group(group)
        mem = frozenset(self._node(m) for m in check_members(members))
        if local is not None:
            local = check_int("local", local, 1, 255)
        if check_redeclared(group, self._groups.get(group), (mem, check_bool("overlap", overlap))):
            return
        self._ask("define_group", [group, sorted(mem), local, *([True] if overlap else [])])
        self._groups[group] = (mem, overlap)

    def sync_ready(self, group: int, step: int) -> None:
        """This rank reached `step` of `group`; when all of the host's participants have,
        the host tells the group's members."""
        group = check_group(group)
        step = check_step(step)
        if group not in self._groups:
            raise ArgumentError(f"sync_ready for group {group}, which define_group never declared")
        self._send(Kind.SYNC_READY, group, 0, 0, 0, step, hops=OP_READY)

    def complete(self, task_id: int, *, origin: int | None = None, runtime_ns: int = 0) -> None:
        """The work of `task_id` finished (for another node's task: `origin=task.origin`;
        for a sync task whose `on_sync` returned LATER: its id)."""
        task_id, runtime_ns = check_complete(task_id, runtime_ns)
        o = NONE if origin is None else check_int("origin", origin)
        if task_id < SYNC_ID_BASE:
            self._running.pop((self.id if origin is None else o, task_id), None)
        self._send(Kind.COMPLETE, task_id, 0, 0, 0, runtime_ns, o, hops=OP_COMPLETE)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Return once the daemon has carried out every call made before (and this rank's
        handlers for what they caused before that have run). From a handler: nothing."""
        if threading.current_thread() is self._thread:
            return
        self._ask("flush", [], timeout_s)

    def explain(self, task_id: int) -> list[Event]:
        """Every decision the daemon recorded about `task_id`."""
        task_id = check_int("task_id", task_id)
        return [
            Event(e["t_ns"], Decision(e["decision"]), e["task_id"], e["reason"], tuple(e["beaten"]))
            for e in self._ask("explain", [task_id])
        ]

    def stats(self) -> dict[str, Any]:
        """The daemon's `Node.stats()` (with its clients'), and this client's counts."""
        out: dict[str, Any] = self._ask("stats", [])
        out["client"] = {
            "index": self.index,
            "handler_errors": dict(self.handler_errors),
            "rejected": dict(self.rejected),
            "running": len(self._running),
        }
        return out

    def call_later(self, delay_ns: int, fn: Callable[[], None]) -> None:
        """Run `fn()` on the reader thread (where handlers run) after `delay_ns`, as
        `Node.call_later`. An exception in `fn` is logged and counted in
        `handler_errors["call_later"]`."""
        delay_ns = check_int("delay_ns", delay_ns)
        check_callable("call_later's fn", fn)
        self._check()
        with self._tlock:
            heapq.heappush(self._timers, (time.monotonic_ns() + delay_ns, next(self._tseq), fn))
        lanes = self._lanes
        if threading.current_thread() is not self._thread and lanes is not None:
            lanes.wake()  # the reader recomputes how long it may sleep

    def _run_timers(self) -> int:
        """Run the due timers; ns until the next one (or check_s)."""
        wait_ns = int(self.check_s * 1e9)
        while True:
            with self._tlock:
                if not self._timers:
                    return wait_ns
                due, _, fn = self._timers[0]
                now = time.monotonic_ns()
                if due > now:
                    return min(wait_ns, due - now)
                heapq.heappop(self._timers)
            try:
                fn()
            except Exception as exc:
                self._failed("call_later", exc, 0)

    def wait_for(self, cond: Callable[[], bool], timeout_s: float = 60.0) -> bool:
        """Wait until `cond()` is true (say, a flag a handler sets); False on timeout.
        Raises `DaemonGoneError` as soon as the daemon is found gone."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not cond():
                self._check()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, self.check_s))
        return True

    # ---- internals --------------------------------------------------------------------------
    def _node(self, node: int | str) -> int:
        if isinstance(node, str):
            if node not in self._nodes:
                self._nodes[node] = int(self._ask("resolve", [node]))
            return self._nodes[node]
        return check_int("node", node, 0, U64_MAX)

    def _check(self) -> None:
        """Raise if the daemon is gone (or the client closed), or a refusal that must raise
        came (once; not on the reader thread, whose handlers' calls go on)."""
        if self._error is not None:
            raise self._error
        refusal = self._refusal
        if refusal is not None and threading.current_thread() is not self._thread:
            self._refusal = None
            raise refusal
        if self._tx is None:
            raise RdmaschedError(f"client {self.index} of {self.endpoint} is not connected")

    def _gone(self, why: str) -> None:
        if self._error is None:
            self._error = DaemonGoneError(f"the rdmasched daemon {self.endpoint} is gone: {why}")
            _log.error("client %d: %s", self.index, self._error)
        with self._cond:
            self._cond.notify_all()
        for box in list(self._waiting.values()):
            box.append(None)

    def _daemon_alive(self) -> bool:
        """The daemon holds its up lane's liveness token and has not closed the lane (from
        any PID namespace: docs/PROTOCOL.md section 9)."""
        tx = self._tx
        if tx is None or self._daemon is None:
            return True
        return shm.peer_alive(tx)  # type: ignore[arg-type]

    def _send(
        self,
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
        self._check()
        with self._lock:
            tx = self._tx
            if tx is None:
                raise RdmaschedError(f"client {self.index} of {self.endpoint} is closed")
            while True:
                try:
                    tx.send(kind, id, job, priority, flags, arg0, arg1, arg2, hops, meta, 10_000)
                    return
                except (LaneFullError, EpochError):  # full, or a new sender not yet accepted
                    if not self._daemon_alive():
                        self._gone("its lane is full and its process is gone")
                        self._check()
                except PeerDeadError as exc:
                    self._gone(str(exc))
                    self._check()

    def _ask(self, q: str, args: list[Any], timeout_s: float = 30.0) -> Any:
        if threading.current_thread() is self._thread:
            raise RdmaschedError(f"{q} cannot wait for the daemon from a handler")
        rid = next(self._rid)
        box: list[Any] = []
        self._waiting[rid] = box
        try:
            self._send(Kind.HEARTBEAT, arg0=rid, hops=OP_REQUEST, meta={"q": q, "a": args})
            deadline = time.monotonic() + timeout_s
            with self._cond:
                while not box:
                    self._check()
                    if time.monotonic() > deadline:
                        raise RdmaschedError(f"daemon {self.endpoint} did not answer {q} in time")
                    self._cond.wait(self.check_s)
        finally:
            self._waiting.pop(rid, None)
        self._check()
        reply = box[0]
        if "err" in reply:
            raise error_from(*reply["err"])
        return reply.get("ok")

    # ---- the reader thread: the daemon's messages --------------------------------------------
    def _read(self) -> None:
        lanes = self._lanes
        assert lanes is not None
        if self.slice_us is not None:
            why = set_slice(self.slice_us)
            if why is not None:
                _log.warning(
                    "client %d: no EEVDF slice of %d us: %s", self.index, self.slice_us, why
                )
        batch = Batch(64)
        last_check = time.monotonic()
        while not self._stop.is_set():
            batch.clear()
            wait_ns = self._run_timers()
            try:
                got = lanes.wait(batch, wait_ns / 1000, self.spin_us)
            except LaneError as exc:
                self._gone(str(exc))
                return
            for m in batch:
                try:
                    self._on_message(m)
                except Exception:  # a bug here must not kill the reader silently
                    _log.exception("client %d: handling a daemon message failed", self.index)
            now = time.monotonic()
            if now - last_check >= self.check_s or not got:
                last_check = now
                if not self._daemon_alive():
                    self._gone("its process exited (or closed its lanes)")
                    return

    def _on_message(self, m: Any) -> None:
        op = m.hops
        if op == OP_START:
            t = Task(m.id, m.job, m.priority, m.arg0, m.arg1, m.meta, m.arg2)
            t.state = TaskState.RUNNING
            t.slot = m.flags
            self._running[(t.origin, t.id)] = t
            if self._dispatch is None:  # no handler yet: on_dispatch() hands it over
                self._unstarted.append(t)
            else:
                try:
                    self._dispatch(t, m.flags)
                except Exception as exc:
                    self._failed("on_dispatch", exc, t.id)
        elif op == OP_STOP:
            key = (m.arg2, m.id)
            t = self._running.pop(key, None) or Task(  # type: ignore[arg-type]
                m.id, m.job, 0, 0, m.arg0, None, m.arg2
            )
            t.progress_ns = m.arg0
            t.state = TaskState.PREEMPTING
            progress = self._preempt_progress(t, m.flags, bool(m.arg1))
            self._send(Kind.PREEMPT, m.id, 0, 0, 0, progress, 0, m.arg2, hops=OP_YIELDED)
        elif op == OP_SYNC:
            t = Task(m.id, m.job, m.priority, 0, 0, m.meta, m.arg2, group=m.arg0)
            t.state = TaskState.RUNNING
            t.slot = m.flags
            if self._run_sync(t, m.flags):
                self._send(Kind.SYNC_READY, m.id, hops=OP_SYNC_DONE)
        elif op == OP_DONE:
            if self._complete is not None:
                try:
                    self._complete(m.id, m.arg0)
                except Exception as exc:
                    self._failed("on_complete", exc, m.id)
        elif op == OP_REPLY:
            box = self._waiting.get(m.arg0)
            if box is not None:
                box.append(m.meta or {})
                with self._cond:
                    self._cond.notify_all()
        elif op == OP_WELCOME:
            meta = m.meta or {}
            self.id, self.name, self.slots = meta["node"], meta["name"], meta["slots"]
            self._welcome.set()
        elif op == OP_PEER:
            dead = bool(m.arg1)
            (self.dead_peers.add if dead else self.dead_peers.discard)(m.arg0)
            if self._peer is not None:
                try:
                    self._peer(m.arg0, dead, str((m.meta or {}).get("why", "")))
                except Exception as exc:
                    self._failed("on_peer", exc, m.arg0)
        elif op == OP_ERROR:
            kind, text = (m.meta or {}).get("err", ["RdmaschedError", "?"])
            self.rejected[kind] = self.rejected.get(kind, 0) + 1
            self.last_rejection = f"{kind}: {text}"
            if (m.meta or {}).get("raise"):
                self._refusal = error_from(kind, text)
            _log.error("client %d: the daemon refused a request: %s: %s", self.index, kind, text)
        with self._cond:
            self._cond.notify_all()

    def _failed(self, name: str, exc: BaseException, task_id: int) -> None:
        self.handler_errors[name] = self.handler_errors.get(name, 0) + 1
        _log.error(
            "client %d: %s failed (task %d); going on: %s",
            self.index,
            name,
            task_id,
            exc,
            exc_info=exc if exc.__traceback__ is not None else None,
        )

    def _preempt_progress(self, t: Task, slot: int, cancel: bool) -> int:
        if self._preempt is None:
            return t.progress_ns
        try:
            got = self._preempt(t, slot, cancel)
        except Exception as exc:
            self._failed("on_preempt", exc, t.id)
            return t.progress_ns
        if type(got) is not int or not 0 <= got <= U64_MAX:
            self._failed(
                "on_preempt",
                ArgumentTypeError(
                    f"on_preempt returned {got!r} for task {t.id}; it must return the task's "
                    f"progress in ns, an int >= 0 (kept {t.progress_ns})"
                ),
                t.id,
            )
            return t.progress_ns
        return got

    def _run_sync(self, t: Task, slot: int) -> bool:
        if self._sync is None:
            return True
        try:
            result = self._sync(t, slot)
        except Exception as exc:
            self._failed("on_sync", exc, t.id)
            return True
        if result is LATER:
            return False
        if result is not None:
            self._failed(
                "on_sync",
                ArgumentTypeError(
                    f"on_sync returned {result!r}; return None (done) or LATER; completed it"
                ),
                t.id,
            )
        return True


if TYPE_CHECKING:
    _satisfies: type[NodeAPI] = Client  # mypy: Client offers Node's API (rdmasched.api)
