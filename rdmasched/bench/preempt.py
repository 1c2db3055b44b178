"""`rdmasched bench preempt`: preemption reaction through the node daemon, on shm.

Two node daemons (the real `Node`), pinned to the two cores. Node 1 runs long tasks on its
execution slots; node 0 sends PREEMPT for one of them every `interval_us`. Reaction is the
time from the PREEMPT slot's trigger stamp (node 0's clock just before it writes the slot)
to node 1's preempt handler being entered: lane, poll loop, scheduler decision, handler
call. Node 1's scheduler requeues the task and restarts it at once, so there is always a
task to preempt. Node 1 spins for `spin_us` after every message, longer than the interval,
so it is polling when the PREEMPT lands, as a node under load is; a node that has gone to
sleep on its doorbell pays a kernel wake-up on top (see the demo's figures).

Shutdown: the side that is done stops its loop and says so; the other stops its loop too;
only when both loops have stopped do they close their lanes, so neither sees the other as a
dead peer.

Baseline in the same run: the C floor's one-way time (half its round trip).

`--quantum-us Q` (`quantum()`): what the run quantum (docs/PREEMPTION.md, "No thrash")
costs in reaction time. A peer's PREEMPT is never governed by it, so here node 0 sends
urgent DISPATCHes instead, one every `interval_us`, alternately ordinary (priority 100) and
critical (220, above the default critical priority 200), each stamped with node 0's clock
(in its `cost_ns`, which the scheduler does not rank on); node 1's slots run background
tasks (priority 10) and each urgent task completes as soon as it starts, so the background
task is back on its slot, its quantum started again. Reaction: the stamp -> the urgent
task's dispatch handler entered (its victim's preempt handler has returned by then). The
same run with quantum 0 first, then with Q, on the same two daemons' code; node 1 has one
slot, so each urgent task's victim is the task the previous one displaced (`quantum()`).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
import uuid
from typing import Any

from rdmasched.bench.common import run_pair
from rdmasched.daemon.probe import StageClock
from rdmasched.daemon.tuning import LoopTuning
from rdmasched.stats import Histogram

#: `--quantum-us`: the urgent tasks' job and priorities (ordinary, then critical: above the
#: default critical priority, limits.CRITICAL_PRIORITY_DEFAULT)
URGENT_JOB = 2
ORDINARY, CRITICAL = 100, 220


def _victim(cfg: dict[str, Any]) -> dict[str, Any]:
    from rdmasched.cluster import local_cluster
    from rdmasched.daemon.node import Node

    cluster = local_cluster(2, cfg["slots"], name=cfg["cluster"])
    tuning = LoopTuning(**cfg["tuning"]) if cfg.get("tuning") else None
    quantum = cfg.get("quantum_us")
    node = Node(
        cluster,
        1,
        spin_us=cfg["spin_us"],
        events=cfg["events"],
        tuning=tuning,
        preemption=None if quantum is None else {"quantum_us": quantum},
    )
    if quantum is not None:
        return _victim_urgent(node, cfg)
    node.on_dispatch(lambda task, slot: None)  # "runs" until preempted
    node.on_preempt(lambda task, slot, cancel: task.progress_ns + 1000)
    probe = StageClock(node.clock) if cfg.get("stages") else None
    node.probe = probe
    node.open()
    done, total = cfg["done"], cfg["n"] + cfg["warmup"]
    try:
        for k in range(cfg["slots"]):
            node.dispatch(k + 1, job=1, priority=10, cost_ns=10**12)
        assert node.loop is not None
        # ready once the loop runs (its tuning applied: a gc.freeze of a big forked heap
        # takes a while); the preemptor waits for it, so no PREEMPT piles up before
        node.loop.call_later(1_000_000, lambda: done.__setitem__(2, 1))
        node.run(until=lambda: node.reactions.count >= total or bool(done[0]))
        # the loop checks `until` between batches: a few more than `total` may have come
        keep = slice(cfg["warmup"], total)
        out: dict[str, Any] = {
            "samples": node.reactions.samples[keep],
            "stats": _end(node, 1, cfg),
        }
        if probe is not None:
            out["stages"] = {k: v[keep] for k, v in probe.stages_ns().items()}
        return out
    finally:
        node.stop()


def _victim_urgent(node: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """`--quantum-us`: the urgent DISPATCHes' reactions, ordinary and critical apart."""
    got: dict[str, list[int]] = {"ordinary": [], "critical": []}

    def on_dispatch(task: Any, slot: int) -> None:
        if task.job == URGENT_JOB:
            kind = "critical" if task.priority == CRITICAL else "ordinary"
            got[kind].append(node.clock() - task.cost_ns)
            node.complete(task.id, origin=task.origin)  # done: the background task is back

    node.on_dispatch(on_dispatch)
    node.on_preempt(lambda task, slot, cancel: task.progress_ns + 1000)
    node.open()
    done, total = cfg["done"], cfg["n"] + cfg["warmup"]
    try:
        for k in range(cfg["slots"]):
            node.dispatch(k + 1, job=1, priority=10, cost_ns=10**12)
        assert node.loop is not None
        node.loop.call_later(1_000_000, lambda: done.__setitem__(2, 1))
        node.run(until=lambda: min(len(v) for v in got.values()) >= total or bool(done[0]))
        keep = slice(cfg["warmup"], total)
        return {"samples": {k: v[keep] for k, v in got.items()}, "stats": _end(node, 1, cfg)}
    finally:
        node.stop()


def _end(node: Any, side: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """A side's loop has stopped: say so, and close only once the other's has stopped too
    (a node closing its lanes while its peer still sends is, to the peer, a dead node)."""
    cfg["done"][side] = 1
    cfg["stopped"].wait(60)
    stats: dict[str, Any] = node.stats()
    return stats


def _preemptor(cfg: dict[str, Any]) -> dict[str, Any]:
    from rdmasched.cluster import local_cluster
    from rdmasched.daemon.node import Node

    cluster = local_cluster(2, cfg["slots"], name=cfg["cluster"])
    node = Node(cluster, 0, spin_us=0, events=cfg["events"])
    node.open()
    sent = 0
    total = cfg["n"] + cfg["warmup"]
    urgent = cfg.get("quantum_us") is not None
    if urgent:  # as many of each kind
        total *= 2
    done = cfg["done"]
    interval = cfg["interval_us"] * 1000

    last_sent = [0.0]

    def fire() -> None:
        nonlocal sent
        assert node.loop is not None
        if not done[2]:  # the victim's loop is not running yet
            node.loop.call_later(interval, fire)
            return
        # a few spare, in case some find the slot changing (urgent: until the victim has
        # its samples of both kinds, however many a stalled loop lost)
        if (urgent or sent < total + 50) and not done[1]:
            if urgent:  # stamped with the clock now, in its cost (not ranked on)
                prio = CRITICAL if sent % 2 else ORDINARY
                node.dispatch(
                    1000 + sent, to=1, job=URGENT_JOB, priority=prio, cost_ns=node.clock()
                )
            else:
                node.preempt(1 + sent % cfg["slots"], node=1)
            sent += 1
            last_sent[0] = time.monotonic()
            assert node.loop is not None
            node.loop.call_later(interval, fire)

    def finished() -> bool:
        # the victim has its samples; or all are sent and it had 5 s to read them
        now = time.monotonic()
        spent = not urgent and sent >= total + 50
        return bool(done[1]) or now > deadline or (spent and now > last_sent[0] + 5)

    try:
        assert node.loop is not None
        node.loop.call_later(50_000_000, fire)  # let node 1 start its tasks first
        deadline = time.monotonic() + 60 + total * interval / 1e9
        node.run(until=finished)
        return {"sent": sent, "stats": _end(node, 0, cfg)}
    finally:
        node.stop()


def run_daemons(
    n: int,
    interval_us: int,
    spin_us: int,
    slots: int,
    stages: bool = False,
    tuning: dict[str, Any] | None = None,
    pin: bool = True,
    events: int = 4096,
    quantum_us: int | None = None,
) -> dict[str, Any]:
    """The two node daemons only: the reaction samples, and how each side ended; with
    `stages`, the victim's stage probe too (rdmasched/daemon/probe.py); `tuning`: the
    victim's LoopTuning fields; `pin`: the two processes pinned to two cores; `events`:
    each node's decision event ring (0 turns the telemetry off); `quantum_us`: urgent
    DISPATCHes instead of PREEMPTs, the victim's run quantum that (module doc); its
    samples are then {"ordinary": [...], "critical": [...]}."""
    cfg = {
        "quantum_us": quantum_us,
        "stages": stages,
        "tuning": tuning,
        "n": n,
        "warmup": 200,
        "interval_us": interval_us,
        "spin_us": spin_us,
        "slots": slots,
        "events": events,
        "cluster": f"pb{uuid.uuid4().hex[:8]}",
        # fork: both sides share these; [0] preemptor done, [1] victim done, [2] victim's
        # loop running
        "done": mp.get_context("fork").RawArray("i", 3),
        "stopped": mp.get_context("fork").Barrier(2),
    }
    victim, preemptor = run_pair(
        _victim, _preemptor, cfg, timeout_s=120 + n * interval_us / 1e6, pin=pin
    )
    sides = {"victim": victim["stats"], "preemptor": preemptor["stats"]}
    return {
        "samples": victim["samples"],
        "stages": victim.get("stages"),
        "dead_peers": {k: st["dead_peers"] for k, st in sides.items()},
        "dropped": {k: st["dropped"] for k, st in sides.items()},
    }


def run(
    n: int = 20_000,
    interval_us: int = 200,
    spin_us: int = 5_000,
    slots: int = 4,
    stages: bool = False,
    events: int = 4096,
) -> dict[str, Any]:
    """The reaction figures beside the C floor of the same run; with `stages`, the
    breakdown per stage of the path (each stage's p50/p99, us) from the victim's probe."""
    from rdmasched.bench import latency

    res = run_daemons(n, interval_us, spin_us, slots, stages, events=events)
    h = Histogram(res["samples"])
    s = h.summary()
    floor, _ = latency.run_row("c-shm-floor", 100_000, 2_000)
    one_way = floor.p50_us / 2
    return {
        "preempts": s["n"],
        "interval_us": interval_us,
        "spin_us": spin_us,
        "reaction_p50_us": s["p50"],
        "reaction_p99_us": s["p99"],
        "reaction_p999_us": s["p999"],
        "reaction_max_us": s["max"],
        "reaction_mean_us": s["mean"],
        "reaction_stddev_us": s["stddev"],
        "floor_one_way_us": one_way,
        "p50_over_floor": s["p50"] / one_way if one_way else None,
        "stages": None
        if not res["stages"]
        else {name: _stage(v) for name, v in res["stages"].items()},
    }


def quantum(
    n: int = 5_000,
    interval_us: int = 200,
    spin_us: int = 5_000,
    slots: int = 1,
    quantum_us: int = 1_000,
) -> dict[str, Any]:
    """`--quantum-us`: the urgent DISPATCH reaction with quantum 0 and with `quantum_us`,
    in one run (0 first), ordinary and critical tasks apart (p50/p99/p99.9/max, us), and
    the ratios against quantum 0. One slot by default: every urgent task then has the same
    victim, whose quantum starts again after each urgent task, so an ordinary one arriving
    `interval_us` after the last waits about `quantum_us - interval_us` (the worst case;
    with more slots another background task has usually run its quantum already)."""
    out: dict[str, Any] = {
        "interval_us": interval_us,
        "spin_us": spin_us,
        "quantum_us": quantum_us,
        "per_kind": n,
        "runs": {},
    }
    for q in (0, quantum_us):
        res = run_daemons(n, interval_us, spin_us, slots, quantum_us=q)
        row = {}
        for kind, samples in res["samples"].items():
            s = Histogram(samples).summary()
            row[kind] = {k: s[k] for k in ("n", "p50", "p99", "p999", "max", "mean")}
        out["runs"][str(q)] = row
    base, gov = out["runs"]["0"], out["runs"][str(quantum_us)]
    out["ratio"] = {
        kind: {k: gov[kind][k] / base[kind][k] if base[kind][k] else None for k in ("p50", "p99")}
        for kind in ("ordinary", "critical")
    }
    return out


def _stage(samples_ns: list[int]) -> dict[str, float]:
    """A stage's p50, p99, p99.9 and mean, us. Stages across two processes (written ->
    polled) read the same CLOCK_MONOTONIC; a negative value would be a clock problem and
    counts as 0."""
    h = Histogram(max(0, v) for v in samples_ns)
    s = h.summary()
    return {k: s[k] for k in ("n", "p50", "p99", "p999", "mean")}


#: `bench preempt --jitter`: the victim's loop-thread options compared, processes unpinned
#: (so that pinning the loop thread is what is measured)
JITTER_VARIANTS: dict[str, dict[str, Any]] = {
    "none": {},
    "cpu": {"cpu": -1},  # -1: the last CPU this process may use (filled in below)
    "gc-freeze": {"gc_freeze": True},
    "fifo": {"fifo": 50},
    "all": {"cpu": -1, "fifo": 50, "gc_freeze": True},
}


def jitter(
    n: int = 10_000, interval_us: int = 200, spin_us: int = 5_000, rounds: int = 2, slots: int = 4
) -> dict[str, Any]:
    """Reaction p50/p99/p99.9 of each JITTER_VARIANTS option of the victim's loop thread,
    in `rounds` interleaved rounds; each variant's samples over all rounds merged. Variants
    the system refuses (SCHED_FIFO without privilege) are reported as such."""
    import os

    last_cpu = max(os.sched_getaffinity(0))
    hists: dict[str, Histogram] = {k: Histogram() for k in JITTER_VARIANTS}
    refused: dict[str, str] = {}
    for _ in range(rounds):
        for name, opts in JITTER_VARIANTS.items():
            if name in refused:
                continue
            tuning = {k: (last_cpu if k == "cpu" else v) for k, v in opts.items()}
            try:
                res = run_daemons(n, interval_us, spin_us, slots, tuning=tuning, pin=False)
            except RuntimeError as exc:
                if "SCHED_FIFO" not in str(exc):
                    raise
                refused[name] = str(exc).splitlines()[0]
                continue
            hists[name].merge(Histogram(res["samples"]))
    out: dict[str, Any] = {"preempts_per_round": n, "rounds": rounds, "variants": {}}
    for name, h in hists.items():
        if name in refused or not h.count:
            out["variants"][name] = {"refused": refused.get(name, "no samples")}
            continue
        s = h.summary()
        out["variants"][name] = {
            "options": {
                k: (last_cpu if k == "cpu" else v) for k, v in JITTER_VARIANTS[name].items()
            },
            **{k: s[k] for k in ("n", "p50", "p99", "p999", "max", "mean")},
        }
    return out


def telemetry_cost(
    n: int = 20_000,
    interval_us: int = 200,
    spin_us: int = 5_000,
    slots: int = 4,
    *,
    rounds: int = 2,
    events: int = 4096,
) -> dict[str, Any]:
    """The reaction with the event rings on (``events``) and off (0), side by side:
    ``rounds`` pairs of runs, alternating; the samples of each setting are merged.
    ``p99_ratio`` is on / off.  ``path``: the same PREEMPT path in one process, on and off
    in interleaved turns on the thread's CPU clock (`stages.telemetry_cost`): what the
    rings add to a reaction, which the two-process figures cannot show when other work
    takes the cores (their p99 is then the machine's)."""
    from rdmasched.bench import stages

    on, off = Histogram(), Histogram()
    for k in range(rounds):  # on first in even rounds, off first in odd ones
        for ev in (events, 0) if k % 2 == 0 else (0, events):
            got = run_daemons(n, interval_us, spin_us, slots, events=ev)["samples"]
            (on if ev else off).merge(Histogram(got))
    res: dict[str, Any] = {"rounds": rounds, "interval_us": interval_us, "spin_us": spin_us}
    for name, h in (("events_on", on), ("events_off", off)):
        s = h.summary()
        res[name] = {
            "preempts": s["n"],
            "reaction_p50_us": s["p50"],
            "reaction_p99_us": s["p99"],
            "reaction_p999_us": s["p999"],
        }
    res["p50_ratio"] = res["events_on"]["reaction_p50_us"] / res["events_off"]["reaction_p50_us"]
    res["p99_ratio"] = res["events_on"]["reaction_p99_us"] / res["events_off"]["reaction_p99_us"]
    res["path"] = stages.telemetry_cost(n, rounds=rounds, events=events)
    return res


def from_args(args: argparse.Namespace) -> dict[str, Any]:
    """`rdmasched bench preempt`'s figures from its parsed options (the command prints them,
    `bench all` stores them)."""
    if getattr(args, "quantum_us", None) is not None:
        return quantum(args.preempts, args.interval_us, args.spin_us, quantum_us=args.quantum_us)
    if args.telemetry_cost:
        return telemetry_cost(
            args.preempts, args.interval_us, args.spin_us, rounds=args.rounds, events=args.events
        )
    return run(
        args.preempts,
        args.interval_us,
        args.spin_us,
        stages=getattr(args, "stages", False),
        events=args.events,
    )
