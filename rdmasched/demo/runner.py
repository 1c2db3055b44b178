"""`rdmasched demo`: a local cluster of N node processes over shm, under rdmasched and under
a central scheduler, with the same workload; prints both side by side.

Each mode: start the processes (and, for the central baseline, the coordinator), connect the
lanes, start the workload on every node at once, show progress, and collect every node's
figures when all nodes have run all steps.

With `leaf` (and `pod`) the rdmasched nodes run a generated [topology]: each holds lanes only
to its links (docs/SCALE.md section 8). Beside the scheduling figures both modes report the
cost of the control plane: lanes and ring memory per node, control messages per node per
step (counted by each node's loop as it writes them, by kind) and the sync release latency.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import resource
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rdmasched.demo.job import GROUP, Trainer, WorkloadConfig
from rdmasched.errors import RdmaschedError
from rdmasched.stats import percentile_us
from rdmasched.telemetry import records

if TYPE_CHECKING:
    from rdmasched.scheduler import Scheduler

ctx = mp.get_context("fork")


@dataclass(frozen=True)
class DemoConfig:
    nodes: int = 4
    slots: int = 4
    spin_us: int = 50
    starvation_us: int = 1_000_000
    aging_us: int = 100_000
    #: the run fails when no node finishes a step for this long (a stalled cluster)
    stall_s: float = 60.0
    #: and, if set, when it is not finished after this long
    timeout_s: float | None = None
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    trace_dir: str | None = None
    #: a generated [topology] for the rdmasched nodes: nodes per leaf (None: a full mesh)
    leaf: int | None = None
    #: and nodes per pod, a multiple of `leaf` (None: one pod)
    pod: int | None = None
    #: liveness of the rdmasched nodes (cluster.heartbeat_ms, cluster.dead_after_ms)
    heartbeat_ms: int = 50
    dead_after_ms: int = 500


def _percentile(samples: list[int], q: float) -> float | None:
    """The `q` (0..1) quantile of `samples` (ns), us; rdmasched.stats's."""
    return percentile_us(samples, q * 100.0)


# ---- processes ------------------------------------------------------------------------------
class _Shared:
    def __init__(self, n: int) -> None:
        self.progress = ctx.RawArray("i", n)
        self.stop = ctx.RawValue("i", 0)
        self.go = ctx.Barrier(n + 1)  # every node (and the runner) connected


class Interrupted(KeyboardInterrupt):
    """The demo was stopped by a signal (SIGTERM, SIGHUP, SIGINT); its processes were
    stopped and their shared memory removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class DemoError(RdmaschedError, RuntimeError):
    """The demo could not run to the end: a process failed, or the cluster stalled."""


_PR_SET_PDEATHSIG = 1


def _child_signals(shared: _Shared | None) -> None:
    """In a node process: stop cleanly (closing its lanes) on SIGTERM or when the demo
    process dies; leave Ctrl-C (SIGINT, sent to the whole process group) to the parent,
    which stops every node."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def stop(signum: int, frame: Any) -> None:
        if shared is not None:
            shared.stop.value = 1

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _child(fn: Callable[..., dict[str, Any]], out: Any, *args: Any) -> None:
    shared = next((a for a in args if isinstance(a, _Shared)), None)
    _child_signals(shared)
    try:
        out.send(("ok", fn(*args)))
    except BaseException as exc:
        # A process that cannot start breaks the start barrier at once, so the others and
        # the runner report this error now rather than a barrier timeout a minute later.
        if shared is not None:
            shared.go.abort()
        out.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        out.close()


def _progress_timer(loop: Any, trainer: Trainer, shared: _Shared, idx: int) -> None:
    def tick() -> None:
        shared.progress[idx] = trainer.step
        loop.call_later(50_000_000, tick)

    loop.call_later(50_000_000, tick)


class Meter:
    """What the host gave this process over its run: CPU time (every thread's) and context
    switches from the start barrier to its last step (`done` true; the coordinator: to the
    stop), and how many passes of its loop took messages. The calibration's host model is
    checked on these (scripts/ring_turns.py measures its ring's turns with it too)."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.start = self._usage()
        self.used: dict[str, Any] | None = None

    @staticmethod
    def _usage() -> tuple[float, int, int]:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime, ru.ru_nvcsw, ru.ru_nivcsw

    def end(self, done: bool = True) -> bool:
        """Take the figures the first time `done` is true; returns `done`."""
        if done and self.used is None:
            cpu, vcsw, ivcsw = (b - a for a, b in zip(self.start, self._usage(), strict=True))
            self.used = {"cpu_s": cpu, "vcsw": vcsw, "ivcsw": ivcsw, "batches": self.loop.batches}
        return done

    def figures(self) -> dict[str, Any]:
        self.end()
        assert self.used is not None
        return self.used


def rdmasched_node(cfg: DemoConfig, cluster_name: str, i: int, shared: _Shared) -> dict[str, Any]:
    from rdmasched.cluster import local_cluster
    from rdmasched.daemon.node import LATER, Node
    from rdmasched.scheduler import Task

    w = cfg.workload
    cluster = local_cluster(
        cfg.nodes,
        cfg.slots,
        name=cluster_name,
        leaf=cfg.leaf,
        pod=cfg.pod,
        heartbeat_ms=cfg.heartbeat_ms,
        dead_after_ms=cfg.dead_after_ms,
    )
    node = Node(
        cluster,
        i,
        spin_us=cfg.spin_us,
        starvation_us=cfg.starvation_us,
        aging_us=cfg.aging_us,
        sync_cost_ns=int(w.sync_ms * 1e6),
    )

    class Backend:
        def now(self) -> int:
            return node.clock()

        def call_later(self, delay_ns: int, fn: Any) -> None:
            node.loop.call_later(delay_ns, fn)  # type: ignore[union-attr]

        def submit_local(self, task: Task) -> None:
            node.dispatch(task.id, job=task.job, priority=task.priority, cost_ns=task.cost_ns)

        def sync_ready(self, step: int) -> None:
            node.sync_ready(GROUP, step)

        def complete(self, task: Task, runtime_ns: int) -> None:
            node.complete(task.id, runtime_ns=runtime_ns)

    trainer = Trainer(i, cfg.slots, w, Backend())
    node.on_dispatch(trainer.on_start)

    @node.on_sync
    def sync(task: Task, slot: int) -> object:
        trainer.on_start(task, slot)
        return LATER  # it runs on simulated time: the trainer completes it

    node.on_preempt(trainer.on_preempt)
    try:
        node.open()
        node.define_group(GROUP, range(cfg.nodes))
        shared.go.wait(60)
        assert node.loop is not None
        meter = Meter(node.loop)
        node.call_later(0, trainer.begin)
        _progress_timer(node.loop, trainer, shared, i)
        node.run(until=lambda: meter.end(trainer.done) and bool(shared.stop.value))
        _write_trace(cfg, f"rdmasched-node{i}", i, node.scheduler)
        st = node.stats()
        return {
            **trainer.figures(),
            **_plane(node.loop),
            **meter.figures(),
            "msgs_in": st["msgs_in"],
            "msgs_out": st["msgs_out"],
            "reactions": node.reactions.samples,
            "rejected": st["rejected"],
            "bad_slots": st["bad_slots"],
            "decisions": st["scheduler"].get("decisions"),
        }
    finally:
        node.stop()


def coordinator_proc(cfg: DemoConfig, cluster_name: str, shared: _Shared) -> dict[str, Any]:
    from rdmasched.daemon.links import ShmLinks
    from rdmasched.daemon.loop import Loop
    from rdmasched.demo.central import Coordinator

    me = cfg.nodes
    links = ShmLinks(cluster_name, me, range(cfg.nodes), nslots=256)
    try:
        loop = Loop(links, spin_us=cfg.spin_us)
        coord = Coordinator(
            loop,
            dict.fromkeys(range(cfg.nodes), cfg.slots),
            group=GROUP,
            sync_cost_ns=int(cfg.workload.sync_ms * 1e6),
            starvation_us=cfg.starvation_us,
            aging_us=cfg.aging_us,
        )
        shared.go.wait(60)
        meter = Meter(loop)
        t0 = time.monotonic()
        loop.run(coord.on_message, until=lambda: bool(shared.stop.value))
        used = meter.figures()
        for node, sched in coord.sched.items():
            _write_trace(cfg, f"central-node{node}", node, sched)
        return {
            **_plane(loop),
            **used,
            "msgs_in": loop.msgs_in,
            "msgs_out": loop.msgs_out,
            "duration_s": time.monotonic() - t0,
            "decisions": coord.decisions,
            "rejected": coord.rejected,
        }
    finally:
        links.close()


def central_node(cfg: DemoConfig, cluster_name: str, i: int, shared: _Shared) -> dict[str, Any]:
    from rdmasched.daemon.links import ShmLinks
    from rdmasched.daemon.loop import Loop
    from rdmasched.demo.central import Executor

    links = ShmLinks(cluster_name, i, [cfg.nodes], nslots=256)
    try:
        loop = Loop(links, spin_us=cfg.spin_us)
        ex = Executor(loop, i, cfg.nodes)
        trainer = Trainer(i, cfg.slots, cfg.workload, ex)
        ex.trainer = trainer
        shared.go.wait(60)
        meter = Meter(loop)
        loop.call_later(0, trainer.begin)
        _progress_timer(loop, trainer, shared, i)
        loop.run(ex.on_message, until=lambda: meter.end(trainer.done) and bool(shared.stop.value))
        return {
            **trainer.figures(),
            **_plane(loop),
            **meter.figures(),
            "msgs_in": loop.msgs_in,
            "msgs_out": loop.msgs_out,
            "reactions": ex.reactions.samples,
        }
    finally:
        links.close()


def _plane(loop: Any) -> dict[str, Any]:
    """A process's control-plane cost: its lanes (one each way per peer), the ring memory of
    its inbound lanes (their shm segments' sizes) and the messages it wrote, by kind."""
    links = loop.links
    ring = getattr(links, "ring_bytes", None)
    return {
        "lanes": len(links.outbound),
        "lanes_to": sorted(links.outbound),
        "ring_bytes": ring() if ring is not None else None,
        "sent_kinds": {str(k): v for k, v in loop.sent_kinds.items()},
    }


def _write_trace(cfg: DemoConfig, name: str, node: int, scheduler: Scheduler) -> None:
    """`--trace DIR`: `node`'s scheduler ring as DIR/NAME.jsonl, in the trace record format
    (records.write_scheduler: a header with the slots, the ring's counters and the anchor of
    the monotonic clock the events are on, then the events)."""
    if not cfg.trace_dir:
        return
    os.makedirs(cfg.trace_dir, exist_ok=True)
    path = os.path.join(cfg.trace_dir, f"{name}.jsonl")
    records.write_scheduler(path, node, scheduler, source="demo", anchor_ns=records.anchor())


# ---- one mode -------------------------------------------------------------------------------
def run_mode(
    mode: str, cfg: DemoConfig, progress: Callable[[str, list[int]], None] | None
) -> dict[str, Any]:
    name = f"{mode[:4]}{os.getpid() % 10000}{uuid.uuid4().hex[:6]}"
    nproc = cfg.nodes + (1 if mode == "central" else 0)
    if progress:
        sys.stderr.write(f"  {mode:<9} starting {nproc} processes (cluster {name})\n")
        sys.stderr.flush()
    shared = _Shared(nproc)
    jobs: list[tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]] = []
    for i in range(cfg.nodes):
        fn = rdmasched_node if mode == "rdmasched" else central_node
        jobs.append((fn, (cfg, name, i, shared)))
    if mode == "central":
        jobs.append((coordinator_proc, (cfg, name, shared)))
    pipes: list[Any] = []
    procs: list[Any] = []
    results: list[dict[str, Any]] = []
    finished = False
    try:  # a signal while the processes start stops those started (the `finally` below)
        for fn, args in jobs:
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(fn, w, *args), daemon=True)
            p.start()
            procs.append(p)
            w.close()
            pipes.append(r)
        try:
            shared.go.wait(60)
        except threading.BrokenBarrierError:
            raise DemoError(
                f"{mode}: the processes did not all start: {_child_errors(pipes)}"
            ) from None
        start = last_move = time.monotonic()
        steps = cfg.workload.steps
        before: list[int] = []
        while True:
            done = [shared.progress[i] for i in range(cfg.nodes)]
            if progress:
                progress(mode, done)
            if all(d >= steps for d in done):
                break
            now = time.monotonic()
            if done != before:
                before, last_move = done, now
            for p in procs:
                if not p.is_alive():
                    raise DemoError(
                        f"{mode}: a node process exited early (exit code {p.exitcode}): "
                        f"{_child_errors(pipes)}"
                    )
            if now - last_move > cfg.stall_s:
                raise DemoError(
                    f"{mode}: no node finished a step for {cfg.stall_s:g} s "
                    f"(steps done per node: {done})"
                )
            if cfg.timeout_s is not None and now - start > cfg.timeout_s:
                raise DemoError(
                    f"{mode}: not finished within {cfg.timeout_s:g} s (steps done per node: {done})"
                )
            time.sleep(0.1)
        shared.stop.value = 1
        for r in pipes:
            if not r.poll(60):
                raise DemoError(f"{mode}: a process did not report")
            status, value = r.recv()
            if status != "ok":
                raise DemoError(f"{mode}: a process failed: {value}")
            results.append(value)
        finished = True
    finally:
        shared.stop.value = 1
        shared.go.abort()  # a process still starting gives up at once
        # stopped (a signal, an error): 2 s to stop before a kill, so a SIGTERM ends the demo
        # within seconds even while its nodes still connect; the segments go below either way
        deadline = time.monotonic() + (10 if finished else 2)
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        remove_segments(name, nproc)
    return summarize(mode, cfg, results)


def remove_segments(cluster: str, nodes: int) -> list[str]:
    """Remove what is left of a stopped local cluster's shared memory: its lanes and its
    nodes' doorbells (left only by a process that was killed). Returns the names removed."""
    from rdmasched.daemon.links import ShmLinks
    from rdmasched.transport import shm

    mine = {shm.lane_segment_name(ShmLinks.bell_name(cluster, i)) for i in range(nodes)}
    lanes = shm.lane_segment_name(cluster) + "."
    removed = []
    for seg in shm.list_segments():
        if (seg in mine or seg.startswith(lanes)) and shm.ShmSegment.unlink_name(seg):
            removed.append(seg)
    return removed


def _child_errors(pipes: list[Any]) -> str:
    errors = []
    for r in pipes:
        if r.poll(2):
            status, value = r.recv()
            if status != "ok":
                errors.append(value)
    return "\n".join(errors) or "no process reported an error (a start-up timeout?)"


def summarize(mode: str, cfg: DemoConfig, results: list[dict[str, Any]]) -> dict[str, Any]:
    nodes = results[: cfg.nodes]
    extra = results[cfg.nodes :]
    all_reactions: list[int] = []
    per_node = []
    release = _release_latencies(
        [r.pop("ready_ns") for r in nodes], [r.pop("release_ns") for r in nodes]
    )
    for r in nodes:
        reactions = r.pop("reactions")
        all_reactions += reactions
        dur = r["duration_s"]
        per_node.append(
            {
                "node": r["node"],
                "slot_idle_pct": r["slot_idle_pct"],
                "step_time_ms": r["step_time_ms"],
                "preempt_reaction_p50_us": _percentile(reactions, 0.5),
                "preempt_reaction_p99_us": _percentile(reactions, 0.99),
                "msgs_per_s": r["msgs_in"] / dur if dur else 0.0,
                "preemptions": r["preemptions"],
                "steps": r["steps"],
                "duration_s": dur,
                "lanes": r["lanes"],
                "lanes_to": r["lanes_to"],
                "ring_bytes": r["ring_bytes"],
                "sent_kinds": r["sent_kinds"],
                "cpu_s": r["cpu_s"],
                "batches": r["batches"],
                "completions": r["completions"],
            }
        )
    dur = max(r["duration_s"] for r in nodes)
    msgs = sum(r["msgs_in"] for r in nodes) + sum(r["msgs_in"] for r in extra)
    steps = [n["step_time_ms"] for n in per_node if n["step_time_ms"] is not None]
    nsteps = max(1, min(r["steps"] for r in nodes))
    out: dict[str, Any] = {
        **_plane_summary(nodes + extra, cfg.nodes, nsteps),
        "host": _host_summary(nodes, extra, nsteps, dur),
        "sync_release_p50_us": _percentile(release, 0.5),
        "sync_release_p99_us": _percentile(release, 0.99),
        "slot_idle_pct": sum(n["slot_idle_pct"] for n in per_node) / len(per_node),
        "step_time_ms": sum(steps) / len(steps) if steps else None,
        "preempt_reaction_p50_us": _percentile(all_reactions, 0.5),
        "preempt_reaction_p99_us": _percentile(all_reactions, 0.99),
        "msgs_per_s": msgs / dur if dur else 0.0,
        "duration_s": dur,
        "nodes": per_node,
    }
    if extra:
        out["coordinator"] = extra[0]
    return out


def _release_latencies(ready: list[list[int]], release: list[list[int]]) -> list[int]:
    """Per (node, step): from the last member's SYNC_READY of the step (the moment the step
    could be released) to the start of that node's sync task, ns. Every process of the demo
    reads the same monotonic clock (one host)."""
    steps = min(min(len(r) for r in ready), min(len(r) for r in release))
    out: list[int] = []
    for s in range(steps):
        last = max(r[s] for r in ready)
        out.extend(max(0, rel[s] - last) for rel in release)
    return out


def _host_summary(
    nodes: list[dict[str, Any]], extra: list[dict[str, Any]], steps: int, dur: float
) -> dict[str, Any]:
    """What the host gave the run, every process (the coordinator too) from the start
    barrier to the end: CPU time per step and the share of the host's CPUs it kept busy
    (a spinning loop counts: it holds its CPU) and per task completed, context switches
    per step (involuntary: the kernel took the CPU from a process that still wanted it),
    and the messages a loop pass took (the nodes' mean; the coordinator's)."""
    procs = nodes + extra
    cpu = sum(r["cpu_s"] for r in procs)
    cpus = len(os.sched_getaffinity(0))
    node_batches = sum(r["batches"] for r in nodes)
    tasks = sum(r["completions"] for r in nodes)
    coord = extra[0] if extra else None
    return {
        "cpus": cpus,
        "cpu_ms_per_step": 1000.0 * cpu / steps,
        "cpu_busy_pct": 100.0 * cpu / (dur * cpus) if dur else None,
        "cpu_us_per_task": 1e6 * cpu / tasks if tasks else None,
        "voluntary_switches_per_step": sum(r["vcsw"] for r in procs) / steps,
        "involuntary_switches_per_step": sum(r["ivcsw"] for r in procs) / steps,
        "msgs_per_batch": sum(r["msgs_in"] for r in nodes) / node_batches if node_batches else None,
        "coordinator_msgs_per_batch": coord["msgs_in"] / coord["batches"]
        if coord and coord["batches"]
        else None,
    }


def _plane_summary(procs: list[dict[str, Any]], nodes: int, steps: int) -> dict[str, Any]:
    """Lanes and ring memory per process (the coordinator too), and the messages every
    process wrote (the coordinator's too) per node per step, in all and by kind."""
    from rdmasched.wire import Kind

    lanes = [r["lanes"] for r in procs]
    rings = [r["ring_bytes"] for r in procs if r["ring_bytes"] is not None]
    kinds: dict[str, float] = {}
    for r in procs:
        for k, v in r["sent_kinds"].items():
            name = Kind(int(k)).name if int(k) in Kind._value2member_map_ else f"kind{k}"
            kinds[name] = kinds.get(name, 0.0) + v / nodes / steps
    return {
        "lanes_max": max(lanes),
        "lanes_mean": sum(lanes) / len(lanes),
        "ring_bytes_max": max(rings) if rings else None,
        "ring_bytes_mean": sum(rings) / len(rings) if rings else None,
        "msgs_per_node_step": sum(kinds.values()),
        "msgs_per_node_step_by_kind": dict(sorted(kinds.items())),
    }


def run(cfg: DemoConfig, progress: bool = True) -> dict[str, Any]:
    """Both modes, one after the other. With `progress`, each mode's start-up line goes to
    stderr, and on a terminal a progress bar too."""
    tty = sys.stderr.isatty()

    def bar(mode: str, done: list[int]) -> None:
        if not tty:
            return
        total = cfg.workload.steps * cfg.nodes
        k = sum(min(d, cfg.workload.steps) for d in done)
        width = 30
        fill = int(width * k / total) if total else width
        sys.stderr.write(
            f"\r  {mode:<9} [{'#' * fill}{'.' * (width - fill)}] {k}/{total} node-steps"
        )
        if k >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    cb = bar if progress else None
    with signals_interrupt():
        return {
            "rdmasched": run_mode("rdmasched", cfg, cb),
            "central": run_mode("central", cfg, cb),
        }


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM, SIGHUP and SIGINT (Ctrl-C) raise Interrupted (a KeyboardInterrupt), so the
    demo stops its processes and removes their shared memory on the way out."""

    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if not fired:  # once: a second signal must not cut the clean-up short
            fired.append(signum)
            raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {
        sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    }
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def print_report(cfg: DemoConfig, res: dict[str, Any], file: Any = None) -> None:
    file = file or sys.stdout
    w = cfg.workload
    if cfg.leaf is None:
        links = "a full mesh of lanes"
    else:
        links = f"a topology of leaves of {cfg.leaf}" + (
            f", pods of {cfg.pod}" if cfg.pod is not None else ""
        )
    print(
        f"rdmasched demo: {cfg.nodes} nodes x {cfg.slots} slots on shm ({links}), {w.steps} "
        f"steps of {cfg.slots} compute tasks ({w.compute_ms:g} ms +-{w.jitter:.0%}) + gradient "
        f"sync ({w.sync_ms:g} ms), background tasks of {w.background_ms:g} ms",
        file=file,
    )
    rows = [
        ("slot idle %", "slot_idle_pct", "{:.2f}"),
        ("step time ms", "step_time_ms", "{:.2f}"),
        ("preempt reaction p50 us", "preempt_reaction_p50_us", "{:.1f}"),
        ("preempt reaction p99 us", "preempt_reaction_p99_us", "{:.1f}"),
        ("messages/s (cluster)", "msgs_per_s", "{:,.0f}"),
        ("sync release p50 us", "sync_release_p50_us", "{:.1f}"),
        ("sync release p99 us", "sync_release_p99_us", "{:.1f}"),
        ("lanes per node, max", "lanes_max", "{:.0f}"),
        ("lanes per node, mean", "lanes_mean", "{:.1f}"),
        ("ring KiB per node, max", "ring_kib_max", "{:,.0f}"),
        ("msgs per node per step", "msgs_per_node_step", "{:.1f}"),
    ]
    a, c = dict(res["rdmasched"]), dict(res["central"])  # (the rows' fields: ours, not res's)
    for mode in (a, c):
        ring = mode.get("ring_bytes_max")
        mode["ring_kib_max"] = None if ring is None else ring / 1024
    # what the host gave each run (`_host_summary`: every process, the coordinator too)
    cpus = (a.get("host") or c.get("host") or {}).get("cpus")
    for label, key, fmt in HOST_ROWS:
        rows.append((label.format(cpus=cpus), f"host.{key}", fmt))
        for mode in (a, c):
            mode[f"host.{key}"] = (mode.get("host") or {}).get(key)
    print(f"{'':<26}{'rdmasched':>14}{'central':>14}{'central/rdmasched':>20}", file=file)
    for label, key, fmt in rows:
        va, vc = a.get(key), c.get(key)
        ratio = f"{vc / va:.2f}x" if va and vc else "-"
        print(f"{label:<26}{_fmt(fmt, va):>14}{_fmt(fmt, vc):>14}{ratio:>20}", file=file)
    print("\nper node (rdmasched | central):", file=file)
    print(
        f"{'node':>4} {'idle %':>14} {'step ms':>16} {'react p50 us':>16} "
        f"{'react p99 us':>16} {'msgs/s':>20}",
        file=file,
    )
    for na, nc in zip(a["nodes"], c["nodes"], strict=True):
        print(
            f"{na['node']:>4} "
            f"{_fmt('{:.2f}', na['slot_idle_pct']):>6} | {_fmt('{:.2f}', nc['slot_idle_pct']):>5} "
            f"{_fmt('{:.2f}', na['step_time_ms']):>7} | {_fmt('{:.2f}', nc['step_time_ms']):>6} "
            f"{_fmt('{:.1f}', na['preempt_reaction_p50_us']):>7} | "
            f"{_fmt('{:.1f}', nc['preempt_reaction_p50_us']):>6} "
            f"{_fmt('{:.1f}', na['preempt_reaction_p99_us']):>7} | "
            f"{_fmt('{:.1f}', nc['preempt_reaction_p99_us']):>6} "
            f"{_fmt('{:,.0f}', na['msgs_per_s']):>9} | {_fmt('{:,.0f}', nc['msgs_per_s']):>8}",
            file=file,
        )
    print(
        "\ncontrol messages per node per step, by kind (every message a process wrote; "
        "central: the coordinator's too, and its lanes and ring memory count in the rows above):",
        file=file,
    )
    for label, mode in (("rdmasched", a), ("central", c)):
        kinds = mode.get("msgs_per_node_step_by_kind") or {}
        print(
            f"  {label:<10}" + ", ".join(f"{k} {v:.1f}" for k, v in kinds.items()),
            file=file,
        )
    print("\nsummary (each x: central's figure over rdmasched's):", file=file)
    s = summary(res)
    for label, key, fmt, unit in SUMMARY:
        row = s[key]
        fa, fc, times = row["rdmasched"], row["central"], row["central/rdmasched"]
        line = (
            f"  {label:<22} rdmasched {_fmt(fmt, fa)}{unit}   central {_fmt(fmt, fc)}{unit}   "
            f"{_fmt('{:.2f}x', times)}"
        )
        if key == "slot_idle_pct" and fa is not None and fc:
            line += f" ({fc - fa:+.2f} points; {100 * (fc - fa) / fc:.0f}% less idle time)"
        print(line, file=file)


#: the report's rows of what the host gave each run: label, key in a mode's `host`, format
HOST_ROWS = (
    ("host CPU ms per step", "cpu_ms_per_step", "{:.2f}"),
    ("host CPU busy % ({cpus} CPUs)", "cpu_busy_pct", "{:.1f}"),
    ("host CPU us per task", "cpu_us_per_task", "{:.1f}"),
    ("invol. switches per step", "involuntary_switches_per_step", "{:.1f}"),
    ("msgs per loop pass", "msgs_per_batch", "{:.1f}"),
    ("coordinator msgs per pass", "coordinator_msgs_per_batch", "{:.1f}"),
)

#: the summary's figures: label, key in a mode's results, format, unit
SUMMARY = (
    ("slot idle", "slot_idle_pct", "{:.2f}", "%"),
    ("step time", "step_time_ms", "{:.2f}", " ms"),
    ("preempt reaction p50", "preempt_reaction_p50_us", "{:.1f}", " us"),
)


def summary(res: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Slot idle %, step time (ms) and preemption reaction p50 (us) of each scheduler the
    demo ran, and central's figure over rdmasched's (None where either is missing or 0):
    the summary `print_report` prints and `rdmasched demo --json` carries."""
    out: dict[str, dict[str, float | None]] = {}
    for _, key, _, _ in SUMMARY:
        ra, rc = res["rdmasched"].get(key), res["central"].get(key)
        ratio = round(rc / ra, 6) if ra and rc is not None else None
        out[key] = {"rdmasched": ra, "central": rc, "central/rdmasched": ratio}
    return out


def _fmt(fmt: str, v: Any) -> str:
    return "-" if v is None else fmt.format(v)
