"""`rdmasched bench peers`: rdmasched, Ray and Dask distributed on the same workloads, one
host, interleaved rounds, one run (docs/BENCH.md, "Peers").

Every system runs the same Python function, `work(ms)`, in worker processes, with the same
number of slots (4 by default):

- **rdmasched**: one `rdmasched daemon` (its own process, `python -m rdmasched.cli daemon`)
  and `slots` client processes (`rdmasched.Client`), each submitting its own tasks; the
  daemon starts a task on the client that submitted it (today's shape: a task runs on its
  owner), which runs `work` and completes it: a no-op (at most `INLINE_NS`) at once in its
  dispatch handler, a longer task on a thread of its own. A high-priority task
  takes a slot from a low-priority one by preemption: the client's `on_preempt` stops its
  `work` (the function waits on an event) and the daemon requeues it with its progress.
- **Ray** (`ray.init(num_cpus=slots, include_dashboard=False, resources={"critical": 1})`):
  a driver submits `ray.remote(work)` tasks of one CPU each; the latency-critical tasks ask
  for the custom resource `critical` and no CPU, the slot Ray's users keep for them (Ray has
  no priorities and no preemption), so they run on a worker process of their own.
- **Dask** (`LocalCluster(n_workers=slots, threads_per_worker=1, processes=True)`): a
  driver `Client.submit`s `work`, the latency-critical tasks with `priority=10` (Dask orders
  its queues by priority; it has no preemption).

Each round runs one system in a fresh process (the round's process tree: the daemon and the
clients, or Ray's driver, GCS, raylet and workers, or Dask's scheduler, nannies and
workers); the CPU of every process of the tree over each workload comes from /proc
(utime + stime, and cutime + cstime of children that ended), so tasks per CPU-second counts
the whole system. After a round the processes its tree had are checked gone (`strays`).

The workloads (`Params`):

a. `throughput`: `tasks` no-op tasks, submitted as each system's users do (rdmasched: each
   client keeps `inflight` in flight; Ray: `ray.get([f.remote() ...])`; Dask:
   `client.gather(client.map(...))`): tasks/s and tasks per CPU-second;
b. `latency`: one no-op task at a time with every slot free: submit -> the function's first
   line, p50/p99 (CLOCK_MONOTONIC, one host);
c. `preempt`: the same for a high-priority no-op task while every slot runs `busy_ms`
   low-priority tasks (twice as many kept submitted as there are slots);
d. `mixed`: for `mixed_s` seconds, `short_ms` low-priority tasks kept `mixed_inflight` in
   flight, and every `every_ms` a latency-critical `crit_ms` task: the critical tasks'
   start p50/p99 and the tasks completed per second (both kinds).
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from rdmasched.stats import Histogram

__all__ = [
    "SYSTEMS",
    "WORKLOADS",
    "Params",
    "TreeCPU",
    "report",
    "run",
    "work",
]

SYSTEMS = ("rdmasched", "ray", "dask")
WORKLOADS = ("throughput", "latency", "preempt", "mixed")
#: priorities of the two kinds of task (rdmasched's 0..254; Dask's any int)
LOW, HIGH = 0, 200
DASK_HIGH = 10

_ctx = mp.get_context("spawn")  # a round's process starts clean (Ray and Dask start threads)


def work(ms: float, stop: threading.Event | None = None) -> int:
    """The task every system runs: wait `ms` milliseconds (the work of a GPU kernel, a tool
    call, a rollout's I/O: the worker's CPU stays free) and return when it started
    (time.monotonic_ns, one clock for every process of the host). With `stop` (rdmasched's
    preemption), the wait ends early once `stop` is set."""
    t = time.monotonic_ns()
    if ms > 0:
        if stop is None:
            time.sleep(ms / 1000)
        else:
            stop.wait(ms / 1000)
    return t


@dataclass
class Params:
    slots: int = 4
    tasks: int = 10_000
    inflight: int = 32
    latency_samples: int = 300
    busy_ms: float = 50.0
    preempt_samples: int = 100
    mixed_s: float = 10.0
    short_ms: float = 5.0
    mixed_inflight: int = 32
    every_ms: float = 20.0
    crit_ms: float = 1.0
    rounds: int = 3
    systems: tuple[str, ...] = SYSTEMS
    #: rdmasched's rows: one per spin (None: the defaults; N: `rdmasched daemon --spin-us N`
    #: and `Client(spin_us=N)`), each a system of its own in the rounds (`rows`)
    rdmasched_spin_us: tuple[int | None, ...] = (None, 0)

    @classmethod
    def quick(cls) -> Params:
        return cls(
            tasks=400,
            latency_samples=20,
            preempt_samples=8,
            mixed_s=1.0,
            rounds=1,
        )


def row_name(spin_us: int | None) -> str:
    """rdmasched's row at `spin_us`: `rdmasched` (the defaults), else `rdmasched-spin<N>`."""
    return "rdmasched" if spin_us is None else f"rdmasched-spin{spin_us}"


def rows(p: Params) -> list[tuple[str, str, int | None]]:
    """The run's rows in order: (row, system, rdmasched's spin)."""
    out: list[tuple[str, str, int | None]] = []
    for s in p.systems:
        if s == "rdmasched":
            out += [(row_name(x), s, x) for x in dict.fromkeys(p.rdmasched_spin_us)]
        else:
            out.append((s, s, None))
    return out


# ---- CPU of a process tree, from /proc ------------------------------------------------------
def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, start time, utime + stime + cutime + cstime in ticks) of `pid`."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2 :].split()
    # fields after the name: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17)
    # ... starttime(22); rest[0] is field 3
    return int(rest[1]), int(rest[19]), sum(int(x) for x in rest[11:15])


def tree(root: int) -> dict[tuple[int, int], int]:
    """Every live process under `root` (itself included): (pid, start) -> CPU ticks."""
    procs: dict[int, tuple[int, int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                procs[int(name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[tuple[int, int], int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        st = procs.get(pid)
        if st is None:
            continue
        out[(pid, st[1])] = st[2]
        todo.extend(children.get(pid, ()))
    return out


class TreeCPU:
    """CPU-seconds of a process tree between `mark()` and `seconds()`: each process's
    utime + stime, and the cutime + cstime of its ended children, counted from the mark (a
    process started since counts from 0)."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self._base: dict[tuple[int, int], int] = {}

    def mark(self) -> None:
        self._base = tree(self.root)

    def seconds(self) -> float:
        now = tree(self.root)
        ticks = sum(v - self._base.get(k, 0) for k, v in now.items())
        return ticks / self.TICK

    def pids(self) -> list[tuple[int, int]]:
        return list(tree(self.root))


def _start_of(pid: int) -> int | None:
    st = _stat(pid)
    return None if st is None else st[1]


def strays(pids: list[tuple[int, int]], kill: bool = True) -> list[int]:
    """The processes of `pids` (pid, start) still alive; killed (SIGKILL) with `kill`."""
    left = [pid for pid, start in pids if _start_of(pid) == start]
    if kill:
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return left


# ---- measuring a workload ---------------------------------------------------------------------
@contextlib.contextmanager
def _measured(cpu: TreeCPU, out: dict[str, Any]) -> Iterator[None]:
    cpu.mark()
    t0 = time.monotonic_ns()
    yield
    out["wall_s"] = (time.monotonic_ns() - t0) / 1e9
    out["cpu_s"] = cpu.seconds()


def _pace(period_s: float, i: int, t0: float) -> None:
    """Sleep until the i-th tick of a period after t0."""
    delay = t0 + i * period_s - time.monotonic()
    if delay > 0:
        time.sleep(delay)


# ---- rdmasched: a daemon and its clients ---------------------------------------------------------
#: a task expected to take at most this long runs on the client's reader thread, in its
#: `on_dispatch` handler, instead of being handed to a work thread (a hand-off costs a
#: thread's wake-up, 100-140 us here: docs/PERFORMANCE-LOG.md); a longer one would hold the
#: reader, and with it the rank's other notices, for its whole run (docs/CLIENT.md, "Handlers")
INLINE_NS = 100_000


def runs_inline(task: Any) -> bool:
    """Whether the worker runs `task` in its dispatch handler: what is left of it (cost -
    progress) is at most `INLINE_NS`."""
    return bool(task.cost_ns - task.progress_ns <= INLINE_NS)


class _Worker:
    """A client process's worker (rdmasched): `on_dispatch` runs a task whose remaining time
    (cost - progress) is at most `INLINE_NS` at once, on the reader thread, and hands a
    longer one to a thread of its own; either runs `work` and completes it. An `on_preempt`
    stops a handed-over task there and gives its progress."""

    def __init__(self, client: Any, threads: int) -> None:
        self.client = client
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="work")
        self.runs: dict[int, tuple[threading.Event, list[int]]] = {}
        self.first: dict[int, int] = {}
        self.preempted = 0
        self.done: Callable[[int, int], None] = lambda tid, start: None
        self.lock = threading.Lock()
        client.on_dispatch(self._dispatch)
        client.on_preempt(self._preempt)

    def _dispatch(self, task: Any, slot: int) -> None:
        left = max(0, task.cost_ns - task.progress_ns)
        if runs_inline(task):  # nothing can preempt it: the reader is running it
            self._finish(task.id, work(left / 1e6))
            return
        run: tuple[threading.Event, list[int]] = (threading.Event(), [0])
        self.runs[task.id] = run
        self.pool.submit(self._run, task.id, left, run)

    def _run(self, tid: int, left_ns: int, run: tuple[threading.Event, list[int]]) -> None:
        stop, began = run
        began[0] = time.monotonic_ns()
        t = work(left_ns / 1e6, stop)
        first = self.first.setdefault(tid, t)
        if stop.is_set():  # preempted: the daemon starts it again, for what is left
            return
        self.runs.pop(tid, None)
        self._finish(tid, first)

    def _finish(self, tid: int, started: int) -> None:
        """Complete task `tid`, which started (its first run, if it was preempted) at
        `started` unless an earlier run was recorded."""
        first = self.first.pop(tid, started)
        self.client.complete(tid)
        self.done(tid, first)

    def _preempt(self, task: Any, slot: int, cancel: bool) -> int:
        run = self.runs.pop(task.id, None)
        self.preempted += 1
        if run is None:
            return int(task.progress_ns)
        stop, began = run
        stop.set()
        ran = time.monotonic_ns() - began[0] if began[0] else 0
        return int(task.progress_ns) + ran


class _Stream:
    """Tasks of one client kept `inflight` submitted until `until()` says stop (or `total`
    are submitted): a new one as each completes."""

    def __init__(
        self, w: _Worker, k: int, inflight: int, cost_ns: int, prio: int, total: int
    ) -> None:
        self.w, self.inflight, self.cost_ns, self.prio = w, inflight, cost_ns, prio
        self.total = total
        self.base = (k + 1) << 40
        self.seq = 0
        self.completed = 0
        self.stopped = False
        self.lock = threading.Lock()
        self.idle = threading.Event()

    def submit_one(self) -> None:
        with self.lock:
            if self.stopped or (self.total and self.seq >= self.total):
                return
            self.seq += 1
            tid = self.base + self.seq
        self.w.client.submit(tid, priority=self.prio, cost_ns=self.cost_ns)

    def start(self) -> None:
        for _ in range(self.inflight):
            self.submit_one()

    def done(self, tid: int, start: int) -> None:
        self.on_done()

    def on_done(self) -> None:
        with self.lock:
            self.completed += 1
            finished = self.completed >= self.seq and (
                self.stopped or (self.total and self.completed >= self.total)
            )
        if finished:
            self.idle.set()
        else:
            self.submit_one()

    def stop(self, timeout_s: float = 60) -> None:
        with self.lock:
            self.stopped = True
            if self.completed >= self.seq:
                self.idle.set()
        self.idle.wait(timeout_s)


def _client_main(
    endpoint: str, k: int, threads: int, conn: Any, stop_bg: Any, spin_us: int | None
) -> None:
    """A client process: connect, then run the workloads the round's process sends."""
    from rdmasched.client import Client

    kw: dict[str, Any] = {} if spin_us is None else {"spin_us": spin_us}
    client = Client(endpoint, k, connect_timeout_s=60, **kw)
    w = _Worker(client, threads)
    crit_base = (k + 1) << 40 | 1 << 39  # the critical tasks' ids, apart from the stream's
    crit_seq = [0]
    with client:
        conn.send("ready")
        while True:
            cmd, p = conn.recv()
            if cmd == "quit":
                break
            res: dict[str, Any] = {"preempted_before": w.preempted}
            if cmd in ("throughput", "warmup"):
                s = _Stream(w, k, p["inflight"], 0, LOW, p["tasks"])
                w.done = s.done
                res["t0"] = time.monotonic_ns()
                s.start()
                if not s.idle.wait(300):
                    raise RuntimeError(f"client {k}: {s.completed} of {s.total} done in 300 s")
                res["t1"] = time.monotonic_ns()
                res["tasks"] = s.completed
            elif cmd == "latency":
                res["lat"] = _one_at_a_time(w, crit_base, crit_seq, p["samples"], 0, HIGH, None)
            elif cmd in ("preempt", "mixed"):
                cost = int(p["bg_ms"] * 1e6)
                s = _Stream(w, k, p["inflight"], cost, LOW, 0)
                w.done = s.done  # (the critical tasks' wrapped by _one_at_a_time)
                res["t0"] = time.monotonic_ns()
                s.start()
                lat: list[int] = []
                if p["samples"]:
                    time.sleep(p["settle_s"])
                    lat = _one_at_a_time(
                        w, crit_base, crit_seq, p["samples"], int(p["crit_ms"] * 1e6), HIGH, p
                    )
                else:
                    stop_bg.wait(600)
                s.stop()
                res["t1"] = time.monotonic_ns()
                res["lat"] = lat
                res["tasks"] = s.completed + len(lat)
            res["preempted"] = w.preempted - res.pop("preempted_before")
            conn.send(res)
    w.pool.shutdown()


def _one_at_a_time(
    w: _Worker,
    base: int,
    seq: list[int],
    samples: int,
    cost_ns: int,
    prio: int,
    pace: dict[str, Any] | None,
) -> list[int]:
    """Submit a task, wait for it to complete, `samples` times: submit -> start, ns. With
    `pace`, one every `pace["period_ms"]` (else back to back)."""
    got: dict[int, int] = {}
    cv = threading.Condition()
    old = w.done

    def done(tid: int, start: int) -> None:
        if tid & (1 << 39):
            with cv:
                got[tid] = start
                cv.notify_all()
        else:
            old(tid, start)

    w.done = done
    lat = []
    t_begin = time.monotonic()
    for i in range(samples):
        if pace is not None:
            _pace(pace["period_ms"] / 1000, i, t_begin)
        seq[0] += 1
        tid = base + seq[0]
        t0 = time.monotonic_ns()
        w.client.submit(tid, priority=prio, cost_ns=cost_ns)
        with cv:
            if not cv.wait_for(functools.partial(got.__contains__, tid), 30):
                raise RuntimeError(f"task {tid} did not complete within 30 s")
        lat.append(got.pop(tid) - t0)
    w.done = old
    return lat


class _Rdmasched:
    def __init__(self, p: Params, spin_us: int | None = None) -> None:
        self.p = p
        name = f"peers{uuid.uuid4().hex[:8]}"
        env = dict(
            os.environ,
            RDMASCHED_CLUSTER=name,
            RDMASCHED_HOST="h0",
            RDMASCHED_SLOTS=str(p.slots),
        )
        for var in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "MASTER_ADDR", "GROUP_RANK"):
            env.pop(var, None)
        spin = [] if spin_us is None else ["--spin-us", str(spin_us)]
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "rdmasched.cli", "daemon", "--max-clients", str(p.slots), *spin],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        from rdmasched.clientproto import endpoint_name

        endpoint = endpoint_name(name, "h0")
        self.stop_bg = _ctx.Event()
        self.conns = []
        self.procs = []
        for k in range(p.slots):
            a, b = _ctx.Pipe()
            proc = _ctx.Process(
                target=_client_main, args=(endpoint, k, p.slots + 2, b, self.stop_bg, spin_us)
            )
            proc.start()
            self.conns.append(a)
            self.procs.append(proc)
        for k, c in enumerate(self.conns):
            if not c.poll(120):
                raise RuntimeError(f"rdmasched client {k} did not connect in 120 s")
            c.recv()

    def _all(self, cmds: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        for c, cmd in zip(self.conns, cmds, strict=True):
            c.send(cmd)
        out = []
        for k, c in enumerate(self.conns):
            if not c.poll(600):
                raise RuntimeError(f"rdmasched client {k} did not answer in 600 s")
            out.append(c.recv())
        return out

    def warmup(self) -> None:
        self._all([("warmup", {"tasks": 50, "inflight": 4})] * self.p.slots)

    def throughput(self) -> dict[str, Any]:
        p = self.p
        share = p.tasks // p.slots
        res = self._all([("throughput", {"tasks": share, "inflight": p.inflight})] * p.slots)
        return {
            "tasks": sum(r["tasks"] for r in res),
            "run_s": (max(r["t1"] for r in res) - min(r["t0"] for r in res)) / 1e9,
        }

    def latency(self) -> dict[str, Any]:
        p = self.p
        cmds = [
            ("latency", {"samples": p.latency_samples if k == 0 else 0}) for k in range(p.slots)
        ]
        res = self._all(cmds)
        return {"lat_ns": res[0]["lat"], "tasks": len(res[0]["lat"])}

    def _background(
        self, bg_ms: float, inflight: int, samples: int, crit_ms: float, period_ms: float
    ) -> list[dict[str, Any]]:
        p = self.p
        self.stop_bg.clear()
        per = max(1, inflight // p.slots)
        for k, c in enumerate(self.conns):
            c.send(
                (
                    "mixed",
                    {
                        "bg_ms": bg_ms,
                        "inflight": per,
                        "samples": samples if k == 0 else 0,
                        "crit_ms": crit_ms,
                        "period_ms": period_ms,
                        "settle_s": 0.3,
                    },
                )
            )
        if not self.conns[0].poll(600):
            raise RuntimeError("rdmasched client 0 did not answer in 600 s")
        first = self.conns[0].recv()
        self.stop_bg.set()
        rest = []
        for k, c in enumerate(self.conns[1:], 1):
            if not c.poll(120):
                raise RuntimeError(f"rdmasched client {k} did not answer in 120 s")
            rest.append(c.recv())
        return [first, *rest]

    def preempt(self) -> dict[str, Any]:
        p = self.p
        res = self._background(p.busy_ms, 2 * p.slots, p.preempt_samples, 0.0, p.busy_ms * 1.3)
        return {
            "lat_ns": res[0]["lat"],
            "tasks": sum(r["tasks"] for r in res),
            "preemptions": sum(r["preempted"] for r in res),
        }

    def mixed(self) -> dict[str, Any]:
        p = self.p
        n = max(1, int(p.mixed_s * 1000 / p.every_ms))
        res = self._background(p.short_ms, p.mixed_inflight, n, p.crit_ms, p.every_ms)
        return {
            "lat_ns": res[0]["lat"],
            "tasks": sum(r["tasks"] for r in res),
            "run_s": (max(r["t1"] for r in res) - min(r["t0"] for r in res)) / 1e9,
            "preemptions": sum(r["preempted"] for r in res),
        }

    def close(self) -> None:
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.send(("quit", {}))
        for proc in self.procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(30)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait(10)


class _Pool:
    """A driver feeding a pool of workers (Ray's, Dask's): the background stream and the
    critical tasks sampled beside it, written once; each peer gives ``_feed`` (keep
    ``inflight`` background tasks going until ``stop``, counting them in ``done``) and
    ``_critical`` (run one critical task, return when it started, ns)."""

    p: Params

    def _feed(self, bg_ms: float, inflight: int, stop: threading.Event, done: list[int]) -> None:
        raise NotImplementedError

    def _critical(self, crit_ms: float) -> int:
        raise NotImplementedError

    def _background(
        self, bg_ms: float, inflight: int, samples: int, crit_ms: float, period_ms: float
    ) -> dict[str, Any]:
        stop = threading.Event()
        done = [0]
        t0 = time.monotonic_ns()
        th = threading.Thread(target=self._feed, args=(bg_ms, inflight, stop, done), daemon=True)
        th.start()
        time.sleep(0.3)
        lat = []
        t_begin = time.monotonic()
        for i in range(samples):
            _pace(period_ms / 1000, i, t_begin)
            s = time.monotonic_ns()
            lat.append(self._critical(crit_ms) - s)
        stop.set()
        th.join(120)
        return {
            "lat_ns": lat,
            "tasks": done[0] + len(lat),
            "run_s": (time.monotonic_ns() - t0) / 1e9,
        }

    def preempt(self) -> dict[str, Any]:
        p = self.p
        r = self._background(p.busy_ms, 2 * p.slots, p.preempt_samples, 0.0, p.busy_ms * 1.3)
        del r["run_s"]
        return r

    def mixed(self) -> dict[str, Any]:
        p = self.p
        n = max(1, int(p.mixed_s * 1000 / p.every_ms))
        return self._background(p.short_ms, p.mixed_inflight, n, p.crit_ms, p.every_ms)


# ---- Ray --------------------------------------------------------------------------------
class _Ray(_Pool):
    def __init__(self, p: Params) -> None:
        import importlib
        import logging

        self.ray = ray = importlib.import_module("ray")  # untyped: Any
        self.p = p
        ray.init(
            num_cpus=p.slots,
            include_dashboard=False,
            resources={"critical": 1},
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
        self.f = ray.remote(num_cpus=1)(work)
        # the critical tasks: the slot kept for them (a custom resource), no CPU
        self.crit = self.f.options(num_cpus=0, resources={"critical": 1})

    def warmup(self) -> None:
        ray = self.ray
        ray.get([self.f.remote(0) for _ in range(200)])
        ray.get([self.f.remote(100) for _ in range(self.p.slots)])  # every worker started
        ray.get(self.crit.remote(0))

    def throughput(self) -> dict[str, Any]:
        ray, n = self.ray, self.p.tasks
        t0 = time.monotonic_ns()
        ray.get([self.f.remote(0) for _ in range(n)])
        return {"tasks": n, "run_s": (time.monotonic_ns() - t0) / 1e9}

    def latency(self) -> dict[str, Any]:
        ray, lat = self.ray, []
        for _ in range(self.p.latency_samples):
            t0 = time.monotonic_ns()
            lat.append(ray.get(self.f.remote(0)) - t0)
        return {"lat_ns": lat, "tasks": len(lat)}

    def _feed(self, bg_ms: float, inflight: int, stop: threading.Event, done: list[int]) -> None:
        ray = self.ray
        refs = [self.f.remote(bg_ms) for _ in range(inflight)]
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            done[0] += len(ready)
            if not stop.is_set():
                refs.extend(self.f.remote(bg_ms) for _ in ready)

    def _critical(self, crit_ms: float) -> int:
        return int(self.ray.get(self.crit.remote(crit_ms)))

    def close(self) -> None:
        self.ray.shutdown()


# ---- Dask distributed --------------------------------------------------------------------
class _Dask(_Pool):
    def __init__(self, p: Params) -> None:
        import importlib
        import logging

        dd: Any = importlib.import_module("distributed")  # untyped: Any
        Client, LocalCluster = dd.Client, dd.LocalCluster
        self.as_completed = dd.as_completed
        logging.getLogger("distributed").setLevel(logging.ERROR)
        self.p = p
        self.cluster: Any = LocalCluster(
            n_workers=p.slots,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.CRITICAL,  # a worker's heartbeat racing the shutdown
        )
        self.client: Any = Client(self.cluster)

    def warmup(self) -> None:
        c = self.client
        c.gather(c.map(work, [0] * 200, pure=False))
        c.gather(c.map(work, [100] * self.p.slots, pure=False))

    def throughput(self) -> dict[str, Any]:
        c, n = self.client, self.p.tasks
        t0 = time.monotonic_ns()
        c.gather(c.map(work, [0] * n, pure=False))
        return {"tasks": n, "run_s": (time.monotonic_ns() - t0) / 1e9}

    def latency(self) -> dict[str, Any]:
        c, lat = self.client, []
        for _ in range(self.p.latency_samples):
            t0 = time.monotonic_ns()
            lat.append(c.submit(work, 0, pure=False).result() - t0)
        return {"lat_ns": lat, "tasks": len(lat)}

    def _feed(self, bg_ms: float, inflight: int, stop: threading.Event, done: list[int]) -> None:
        c = self.client
        ac = self.as_completed(
            [c.submit(work, bg_ms, priority=0, pure=False) for _ in range(inflight)]
        )
        for _ in ac:
            done[0] += 1
            if not stop.is_set():
                ac.add(c.submit(work, bg_ms, priority=0, pure=False))

    def _critical(self, crit_ms: float) -> int:
        return int(self.client.submit(work, crit_ms, priority=DASK_HIGH, pure=False).result())

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


_SYSTEM: dict[str, Any] = {"rdmasched": _Rdmasched, "ray": _Ray, "dask": _Dask}


def _round(row: str, system: str, spin_us: int | None, p: Params, out: Any) -> None:
    """One round of one row (a system; rdmasched's at a spin), in a process of its own: every
    workload, each measured (wall, the tree's CPU); the tree's processes before shutting
    down (to check them gone)."""
    cpu = TreeCPU()
    res: dict[str, Any] = {"system": row}
    try:
        t = time.monotonic()
        sysm = _Rdmasched(p, spin_us) if system == "rdmasched" else _SYSTEM[system](p)
        sysm.warmup()
        res["start_s"] = time.monotonic() - t
        try:
            for name in WORKLOADS:
                print(f"bench peers:   {row} {name}", file=sys.stderr, flush=True)
                w: dict[str, Any] = {}
                with _measured(cpu, w):
                    w.update(getattr(sysm, name)())
                res[name] = w
            res["pids"] = cpu.pids()
        finally:
            sysm.close()
    except BaseException as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            res["pids"] = cpu.pids()
    out.put(res)


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for pkg in ("rdmasched", "ray", "distributed", "dask"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def missing(systems: tuple[str, ...]) -> list[str]:
    """The peers' packages of `systems` that are not installed."""
    import importlib.util

    need = {"ray": "ray", "dask": "distributed"}
    return [need[s] for s in systems if s in need and importlib.util.find_spec(need[s]) is None]


def run(p: Params, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every round of every row (`rows`), interleaved (round r: the rows in turn, starting
    one further each round); the figures merged over rounds, per row and workload."""
    rounds: list[dict[str, Any]] = []
    stray: dict[str, list[int]] = {}
    all_rows = rows(p)
    for r in range(p.rounds):
        order = [*all_rows[r % len(all_rows) :], *all_rows[: r % len(all_rows)]]
        for system, base, spin in order:
            progress(f"round {r + 1}/{p.rounds}: {system}")
            q = _ctx.Queue()
            proc = _ctx.Process(target=_round, args=(system, base, spin, p, q))
            proc.start()
            res: dict[str, Any] | None = None
            deadline = time.monotonic() + 3600
            while res is None and time.monotonic() < deadline:
                try:
                    res = q.get(timeout=1)
                except Exception:  # queue.Empty
                    if not proc.is_alive() and q.empty():
                        break
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join(10)
            if res is None:
                res = {"system": system, "error": f"the round's process exited {proc.exitcode}"}
            time.sleep(0.5)  # what the shutdown signalled, gone
            left = strays([(int(a), int(b)) for a, b in res.pop("pids", [])])
            if left:
                stray.setdefault(system, []).extend(left)
            res["round"] = r + 1
            rounds.append(res)
            if "error" in res:
                raise RuntimeError(f"bench peers: {system} round {r + 1}: {res['error']}")
    return {
        "params": asdict(p),
        "versions": _versions(),
        "systems": {s: _merge([x for x in rounds if x["system"] == s], p) for s, _, _ in all_rows},
        "rounds": [_round_summary(x) for x in rounds],
        "strays": stray,
    } | _goals(rounds, p)


def _lat(ns: list[int]) -> dict[str, Any]:
    h = Histogram(ns)
    return {
        "n": len(h),
        "p50_us": h.percentile_us(50.0),
        "p99_us": h.percentile_us(99.0),
        "max_us": h.max_us(),
    }


def _merge(rs: list[dict[str, Any]], p: Params) -> dict[str, Any]:
    """A system's figures over its rounds: counts and seconds added, latencies' samples
    pooled."""
    out: dict[str, Any] = {"rounds": len(rs), "start_s": [x.get("start_s") for x in rs]}
    for name in WORKLOADS:
        ws = [x[name] for x in rs]
        tasks = sum(w["tasks"] for w in ws)
        cpu = sum(w["cpu_s"] for w in ws)
        wall = sum(w["wall_s"] for w in ws)
        m: dict[str, Any] = {"tasks": tasks, "wall_s": wall, "cpu_s": cpu}
        m["cpu_cores"] = cpu / wall if wall else None
        m["tasks_per_cpu_s"] = tasks / cpu if cpu else None
        if "run_s" in ws[0]:
            run_s = sum(w["run_s"] for w in ws)
            m["tasks_per_s"] = tasks / run_s if run_s else None
        if "lat_ns" in ws[0]:
            m["start"] = _lat([v for w in ws for v in w["lat_ns"]])
        if "preemptions" in ws[0]:
            m["preemptions"] = sum(w["preemptions"] for w in ws)
        out[name] = m
    return out


def _round_summary(x: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"round": x["round"], "system": x["system"]}
    for name in WORKLOADS:
        w = x.get(name)
        if w is None:
            continue
        s = {k: v for k, v in w.items() if k != "lat_ns"}
        if "lat_ns" in w:
            s["start"] = _lat(w["lat_ns"])
        out[name] = s
    return out


def _goals(rounds: list[dict[str, Any]], p: Params) -> dict[str, Any]:
    """The issue's two goals, from this run, for each of rdmasched's rows (`goals_by_row`;
    `goals`: the first row's, the defaults' by default): tasks per CPU-second against Ray's
    (>= 20x, median of the rounds' ratios) and the high-priority start p99 against the better
    peer's (<= 1/100, pooled samples)."""
    by = {(x["round"], x["system"]): x for x in rounds}
    ours = [row for row, s, _ in rows(p) if s == "rdmasched"]
    peers = [s for s in p.systems if s != "rdmasched"]

    def p99(s: str) -> float:
        v = _lat([v for x in rounds if x["system"] == s for v in x["preempt"]["lat_ns"]])
        return float(v["p99_us"] or 0.0)

    by_row: dict[str, dict[str, Any]] = {}
    for row in ours:
        goals: dict[str, Any] = {}
        if "ray" in p.systems:
            ratios = []
            for r in range(1, p.rounds + 1):
                a, b = by[(r, row)]["throughput"], by[(r, "ray")]["throughput"]
                if a["cpu_s"] and b["cpu_s"]:
                    ratios.append((a["tasks"] / a["cpu_s"]) / (b["tasks"] / b["cpu_s"]))
            ratios.sort()
            med = ratios[len(ratios) // 2] if ratios else None
            goals["tasks_per_cpu_s_vs_ray"] = {
                "ratio_median_of_rounds": med,
                "per_round": ratios,
                "goal": 20.0,
                "met": med is not None and med >= 20.0,
            }
        if peers:
            best = min(peers, key=p99)
            ratio = p99(row) / p99(best) if p99(best) else None
            goals["preempt_p99_vs_best_peer"] = {
                "best_peer": best,
                "ratio": ratio,
                "goal": 0.01,
                "met": ratio is not None and ratio <= 0.01,
            }
        by_row[row] = goals
    return {"goals": by_row[ours[0]] if ours else {}, "goals_by_row": by_row}


def report(doc: dict[str, Any]) -> str:
    """The table: a row per system and workload."""
    p = doc["params"]
    v = doc["versions"]
    lines = [
        f"rdmasched bench peers: {p['slots']} slots each, {p['rounds']} interleaved round(s); "
        f"rdmasched {v['rdmasched']}, ray {v['ray']}, distributed {v['distributed']}",
        f"a {p['tasks']} no-op tasks; b one no-op at a time, free slots; c a high-priority "
        f"no-op while every slot runs {p['busy_ms']:g} ms low-priority tasks; d {p['mixed_s']:g}"
        f" s of {p['short_ms']:g} ms low-priority tasks ({p['mixed_inflight']} in flight) and "
        f"a {p['crit_ms']:g} ms critical one every {p['every_ms']:g} ms",
        "",
        "| system | a tasks/s | a tasks/CPU-s | a CPU cores | b start p50 / p99 us | "
        "c start p50 / p99 us | d critical p50 / p99 us | d tasks/s | d tasks/CPU-s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(x: float | None, fmt: str = ",.0f") -> str:
        return "-" if x is None else format(x, fmt)

    for s, m in doc["systems"].items():
        a, b, c, d = (m[w] for w in WORKLOADS)
        lines.append(
            f"| {s} | {f(a['tasks_per_s'])} | {f(a['tasks_per_cpu_s'])} | "
            f"{f(a['cpu_cores'], '.2f')} | {f(b['start']['p50_us'])} / "
            f"{f(b['start']['p99_us'])} | {f(c['start']['p50_us'])} / "
            f"{f(c['start']['p99_us'])} | {f(d['start']['p50_us'])} / "
            f"{f(d['start']['p99_us'])} | {f(d['tasks_per_s'])} | {f(d['tasks_per_cpu_s'])} |"
        )
    lines.append("")
    for row, g in doc["goals_by_row"].items():
        if "tasks_per_cpu_s_vs_ray" in g:
            x = g["tasks_per_cpu_s_vs_ray"]
            lines.append(
                f"goal ({row}): a tasks/CPU-s >= 20x Ray's: "
                f"{f(x['ratio_median_of_rounds'], '.1f')}x (median of rounds) - "
                f"{'met' if x['met'] else 'NOT met'}"
            )
        if "preempt_p99_vs_best_peer" in g:
            x = g["preempt_p99_vs_best_peer"]
            lines.append(
                f"goal ({row}): c p99 <= 1/100 of the better peer's ({x['best_peer']}): "
                f"{f(x['ratio'], '.4f')} - {'met' if x['met'] else 'NOT met'}"
            )
    if doc["strays"]:
        lines.append(f"stray processes killed after the rounds: {doc['strays']}")
    else:
        lines.append("no stray process left after any round")
    return "\n".join(lines)


def params_from(
    quick: bool = False,
    rounds: int | None = None,
    tasks: int | None = None,
    slots: int = 4,
    systems: tuple[str, ...] = SYSTEMS,
    rdmasched_spin_us: tuple[int | None, ...] | None = None,
) -> Params:
    """The run's parameters: the defaults (or `Params.quick()`), with what was given."""
    p = Params.quick() if quick else Params()
    p.slots, p.systems = slots, tuple(dict.fromkeys(systems))
    if rdmasched_spin_us is not None:
        p.rdmasched_spin_us = tuple(dict.fromkeys(rdmasched_spin_us))
    if rounds is not None:
        p.rounds = rounds
    if tasks is not None:
        p.tasks = max(tasks, slots)
    return p


def cli(args: Any) -> int:
    """`rdmasched bench peers`: the table (or the JSON, with the run's description)."""
    from rdmasched.bench.output import run_info

    p = params_from(
        args.quick,
        args.rounds,
        args.tasks,
        args.slots,
        tuple(args.systems),
        args.rdmasched_spin_us,
    )
    lack = missing(p.systems)
    if lack:
        print(
            f"rdmasched bench peers: {', '.join(lack)} not installed: pip install -e '.[peers]' "
            "(scripts/setup.sh installs it), or leave them out with --systems",
            file=sys.stderr,
        )
        return 2
    doc = run(p, progress=lambda s: print(f"bench peers: {s}", file=sys.stderr, flush=True))
    if args.json:
        import json

        print(json.dumps({**run_info(asdict(p)), **doc}, indent=2))
    else:
        print(report(doc))
    return 0
