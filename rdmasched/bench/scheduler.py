"""Scheduler decision rate: a realistic mix on a fake clock, one core, no I/O.

    python -m rdmasched.bench.scheduler [--n 1000000] [--nslots 8] [--json]

The driver plays the daemon: it keeps the node busy with about ``nslots + queue_depth``
tasks in the system, so that every dispatch either starts a task or queues it and every
completion starts the next one.  96% of dispatches are ordinary compute (priority 100) and
4% urgent (priority 200): those preempt a running task; the driver then calls
``yielded()`` as the daemon would after the preempt handler.  Every 64th operation is a
SYNC_READY report to a 4-member group, so a sync task is released (and preempts compute)
every 256 operations.

A *decision* is one decision event (start, queue, preempt, requeue, release, ...);
completions and SYNC_READY reports that release nothing are calls but not decisions.  The
figure includes the driver's own loop (which a daemon would also pay); ``calls_per_s``
counts every scheduler method call.  Nothing here is asserted: it prints figures.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import itertools
import json
import platform
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

from rdmasched.scheduler import Preempt, Start, core, task

CHUNK = 4096


def scheduler_class(impl: str) -> Any:
    """The Scheduler class of ``impl``: "auto" (what ``import`` gives: compiled if
    built), "compiled" (required), or "python" (core.py as plain Python, always)."""
    if impl == "auto":
        return core.Scheduler
    if impl == "compiled":
        if core.IMPLEMENTATION != "compiled":
            raise RuntimeError("the compiled core is not built (see docs/SCHEDULER.md)")
        return core.Scheduler
    if impl != "python":
        raise ValueError(f"impl must be auto, compiled or python, not {impl!r}")
    if core.IMPLEMENTATION == "python" and task.__file__.endswith(".py"):
        return core.Scheduler
    assert core.__file__ is not None
    here = core.__file__.rsplit("/", 1)[0]
    # the plain core runs on the plain Task (task.py is compiled too): the baseline is the
    # whole source as Python, not Python calling into compiled Tasks
    plain_task = _load_plain(f"{here}/task.py", "rdmasched_scheduler_task_pure")
    compiled_task = sys.modules[task.__name__]
    sys.modules[task.__name__] = plain_task  # what core.py's imports of it find
    try:
        mod = _load_plain(f"{here}/core.py", "rdmasched_scheduler_core_pure")
    finally:
        sys.modules[task.__name__] = compiled_task
    return mod.Scheduler


def _load_plain(src: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, src)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def task_class(sched_cls: Any) -> Any:
    """The Task class the core of ``sched_cls`` (see ``scheduler_class``) was built with."""
    # (the compiled core cimports Task: the name is not in its module's dict)
    return getattr(sys.modules[sched_cls.__module__], "Task", task.Task)


def _driver(s: Any, Task: Any, nslots: int, depth: int, seed: int) -> Iterator[int]:
    """Play the daemon on scheduler ``s`` (module docstring): each ``next()`` makes CHUNK
    operations and gives the scheduler method calls made so far.  The operations depend on
    ``seed`` only (and on the decisions, which the event ring does not change)."""
    rng = random.Random(seed)
    # pre-drawn randomness, so that the timed loop draws none
    mask = CHUNK - 1
    prios = [200 if rng.random() < 0.04 else 100 for _ in range(CHUNK)]
    picks = [rng.randrange(nslots) for _ in range(CHUNK)]
    members = 4
    s.define_group(
        1,
        range(members),
        lambda g, step: Task(id=(1 << 62) + step, job=-1, priority=0, cost_ns=0),
    )
    pool = [
        Task(id=0, job=i % 16, priority=100, cost_ns=1_000_000) for i in range(nslots + depth + 64)
    ]
    occupant: list[Any] = [None] * nslots  # the Task on each slot, or None
    target = nslots + depth

    dispatch, complete, yielded, sync_ready = (
        s.dispatch,
        s.complete,
        s.yielded,
        s.sync_ready,
    )
    inflight = 0
    next_id = 1
    step = 0
    calls = 0
    i = 0
    while True:
        for _ in range(CHUNK):
            i += 1
            if i & 63 == 0:  # a SYNC_READY report
                acts = sync_ready(1, step >> 2, step & 3)
                step += 1
            elif inflight < target or occupant[picks[i & mask]] is None:
                t = pool.pop()
                t.id = next_id
                next_id += 1
                t.priority = prios[i & mask]
                t.progress_ns = 0
                acts = dispatch(t)
                inflight += 1
            else:
                slot = picks[i & mask]
                t = occupant[slot]
                if t.group is not None:  # a sync task: it completes too, not counted
                    occupant[slot] = None
                acts = complete(t.id)
                if t.group is None:
                    inflight -= 1
                    pool.append(t)
            calls += 1
            for a in acts:
                if a.__class__ is Start:
                    occupant[a.slot] = a.task
                elif a.__class__ is Preempt:
                    v = a.victim
                    # the preempt handler checkpoints and returns the progress
                    yielded(v.id, 1000)
                    calls += 1
        yield calls


def _scheduler(cls: Any, nslots: int, events: int) -> Any:
    # a fake clock that moves 250 ns per read: a C-level callable, like time.monotonic_ns
    clock = itertools.count(0, 250).__next__
    return cls(nslots, clock=clock, starvation_us=10_000, events=events)


def run(
    n: int = 1_000_000,
    nslots: int = 8,
    *,
    queue_depth: int | None = None,
    seed: int = 1,
    impl: str = "auto",
    quiet: bool = False,
    events: int = 4096,
) -> dict[str, Any]:
    """Drive a scheduler until it has taken at least ``n`` decisions; return the figures.

    ``impl`` picks the build: "auto", "compiled" or "python" (see ``scheduler_class``).
    ``events``: the decision event ring's size; 0 turns the telemetry off.
    """
    cls = scheduler_class(impl)
    Task = task_class(cls)  # the class of the core being driven
    implementation = "python" if cls.__module__ != core.__name__ else core.IMPLEMENTATION
    depth = 2 * nslots if queue_depth is None else queue_depth
    s = _scheduler(cls, nslots, events)
    drive = _driver(s, Task, nslots, depth, seed)
    stats = s.stats
    calls = 0
    decisions = 0
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as a daemon would around its poll loop; the loop allocates no cycles
    c0 = time.process_time_ns()
    t0 = time.perf_counter_ns()
    try:
        while decisions < n:
            calls = next(drive)
            decisions = stats().decisions
    finally:
        t1 = time.perf_counter_ns()
        c1 = time.process_time_ns()
        if gc_was_enabled:
            gc.enable()
    secs = (t1 - t0) / 1e9
    cpu = (c1 - c0) / 1e9
    st = s.stats()
    out: dict[str, Any] = {
        "decisions": decisions,
        "calls": calls,
        "seconds": round(secs, 4),
        "decisions_per_s": round(decisions / secs),
        "calls_per_s": round(calls / secs),
        "ns_per_decision": round(secs * 1e9 / decisions, 1),
        # the same on the process's CPU time: steadier when other work shares the core
        "cpu_seconds": round(cpu, 4),
        "cpu_decisions_per_s": round(decisions / cpu),
        "implementation": implementation,
        "events": events,
        "nslots": nslots,
        "queue_depth": depth,
        "mix": {
            "starts": st.starts,
            "queued": st.queued,
            "preemptions": st.preemptions,
            "requeues": st.requeues,
            "sync_releases": st.sync_releases,
            "starved_starts": st.starved_starts,
            "completions": st.completions,
        },
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
    if not quiet:
        print(
            f"scheduler: {out['decisions_per_s']:,} decisions/s "
            f"({out['ns_per_decision']} ns each), {out['calls_per_s']:,} calls/s, "
            f"{out['cpu_decisions_per_s']:,} decisions per CPU-second; "
            f"{decisions:,} decisions in {secs:.3f} s, nslots={nslots}, "
            f"queue depth ~{depth}, {implementation} core, {out['python']}"
        )
        print(f"  mix: {out['mix']}")
    return out


def telemetry_cost(
    n: int = 1_000_000, nslots: int = 8, *, rounds: int = 3, events: int = 4096, seed: int = 1
) -> dict[str, Any]:
    """The decision rate with the event ring on (``events``) and off (0), side by side.

    Two schedulers, one with the ring and one without, are driven through the same
    operations (the same seed) in turns of CHUNK operations, which goes first alternating,
    each turn timed on the thread's CPU clock; a pair of turns does the same work on both.
    So both see the same moments of a shared machine.  ``rounds`` such runs of ``n``
    decisions each.  ``ratio``: the decision rate on / off over every turn;
    ``pair_ratio_p50``: the median over the pairs of turns of off time / on time (steadier
    when other work takes the core away now and then)."""
    cls = scheduler_class("auto")
    Task = task_class(cls)
    depth = 2 * nslots
    cpu = {True: 0, False: 0}
    dec = {True: 0, False: 0}
    pairs: list[float] = []
    clock = time.thread_time_ns
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            sched = {on: _scheduler(cls, nslots, events if on else 0) for on in (True, False)}
            drive = {on: _driver(sched[on], Task, nslots, depth, seed) for on in (True, False)}
            k = 0
            done = 0
            while done < n:
                took = {}
                for on in (True, False) if k % 2 == 0 else (False, True):
                    t0 = clock()
                    next(drive[on])
                    took[on] = clock() - t0
                k += 1
                if took[True] > 0 and took[False] > 0:
                    pairs.append(took[False] / took[True])
                for on in (True, False):
                    cpu[on] += took[on]
                done = sched[True].stats().decisions
            for on in (True, False):
                dec[on] += sched[on].stats().decisions
    finally:
        if gc_was_enabled:
            gc.enable()
    if dec[True] != dec[False]:
        raise AssertionError("the event ring changed the decisions")  # a test checks it
    rate = {on: dec[on] / (cpu[on] / 1e9) for on in (True, False)}
    pairs.sort()
    return {
        "events": events,
        "rounds": rounds,
        "decisions": dec[True],
        "turns": len(pairs),
        "chunk": CHUNK,
        "implementation": core.IMPLEMENTATION,
        "events_on": {"cpu_decisions_per_s": round(rate[True]), "cpu_seconds": cpu[True] / 1e9},
        "events_off": {
            "cpu_decisions_per_s": round(rate[False]),
            "cpu_seconds": cpu[False] / 1e9,
        },
        # on the thread's CPU time: steadier than wall-clock when other work shares the core
        "ratio": rate[True] / rate[False],
        "pair_ratio_p50": pairs[len(pairs) // 2] if pairs else None,
        "ns_per_decision_added": round(1e9 / rate[True] - 1e9 / rate[False], 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="decisions to take (at least)")
    ap.add_argument("--nslots", type=int, default=8, help="execution slots (GPUs)")
    ap.add_argument(
        "--queue-depth",
        type=int,
        default=None,
        help="queued tasks to keep (default 2*nslots)",
    )
    ap.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    ap.add_argument(
        "--impl",
        choices=("auto", "compiled", "python"),
        default="auto",
        help="which build of the core: what import gives (auto), or force one",
    )
    ap.add_argument("--json", action="store_true", help="print the best run as JSON")
    args = ap.parse_args(argv)
    if args.n < 1 or args.nslots < 1 or args.repeat < 1:
        ap.error("--n, --nslots and --repeat must be >= 1")
    runs = [
        run(
            args.n,
            args.nslots,
            queue_depth=args.queue_depth,
            impl=args.impl,
            quiet=args.json,
        )
        for _ in range(args.repeat)
    ]
    best = max(runs, key=lambda r: r["decisions_per_s"])
    best_cpu = max(r["cpu_decisions_per_s"] for r in runs)
    if args.json:
        print(json.dumps(best))
    else:
        print(
            f"best of {args.repeat} ({best['implementation']} core): "
            f"{best['decisions_per_s']:,} decisions/s wall-clock, "
            f"{best_cpu:,} decisions per CPU-second"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())


def from_args(args: argparse.Namespace) -> dict[str, Any]:
    """`rdmasched bench scheduler`'s figures from its parsed options (the command prints them,
    `bench all` stores them)."""
    if args.telemetry_cost:
        return telemetry_cost(
            args.decisions, args.exec_slots, rounds=args.rounds, events=args.events
        )
    # The baseline in the same run: the same policy source as plain Python.
    ev = args.events
    compiled = run(args.decisions, args.exec_slots, impl="auto", quiet=True, events=ev)
    python = run(args.decisions, args.exec_slots, impl="python", quiet=True, events=ev)
    return {
        "results": [compiled, python],
        "speedup": compiled["decisions_per_s"] / python["decisions_per_s"],
        # on each run's CPU time: steadier than wall-clock when other work shares the core
        "cpu_speedup": compiled["cpu_decisions_per_s"] / python["cpu_decisions_per_s"],
    }
