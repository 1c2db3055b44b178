"""A small model of a trace's stream graph: its steps' critical path, with and without
priority order of the gradient buckets (as P3 and ByteScheduler reason about it).

It reads the same stream plan as the simulator (`rdmasched.workload.streams.plan`) and
nothing of the simulator: no node core, no network, no rendezvous (every rank is the
traced one). It lays the ops of `steps` unrolled steps on the device's streams by list
scheduling:

- the compute stream: one op at a time, the earliest ready first (ties: plan order);
- side streams and communication streams without buckets: in plan order, each op when its
  deps are done and the op before it on the stream has ended;
- the bucket stream: one collective at a time; `order="launch"`: the earliest ready first
  (as NCCL runs one stream); `order="priority"`: the most urgent ready one first (a
  collective other than a bucket, then the bucket of the first layers: the highest launch
  rank), and a more urgent one that becomes ready preempts the one running, which resumes
  where it stopped (P3 slices tensors so that it may).

`replay(wl)` gives the step time (the time the unrolled steps took, over their number: the
simulator's `step_time_ms`) and the critical path of the last step: the chain of
ops, each the one the next waited for last (a dep, or its stream). `priority_gain(wl)` is
what priority order gains over launch order, in percent of launch order's step.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal

from rdmasched.workload.model import Workload
from rdmasched.workload.streams import (
    COMPUTE,
    Mode,
    Op,
    bucket_stream,
    host_start,
    plan,
    prev_deps,
)

Order = Literal["launch", "priority"]
Key = tuple[int, int]


@dataclass(frozen=True)
class Result:
    order: Order
    step_ns: float
    #: per unrolled step, when its last op ended, ns
    step_ends: tuple[int, ...]
    #: the last step's critical path: op names, first to last
    critical_path: tuple[str, ...]


def replay(
    wl: Workload,
    order: Order = "launch",
    steps: int = 8,
    sync_ns: dict[int, int] | None = None,
    mode: Mode = "host",
) -> Result:
    """Lay `steps` steps of the trace on its streams (module doc); `sync_ns`: per sync task
    id, its time if not the measured one (a cluster larger than the traced world); `mode`:
    how a GPU trace is replayed (rdmasched.workload.streams: "host", "device", "kernels")."""
    gpu = wl.device == "gpu"
    plans = [plan(s, gpu, mode) for s in wl.steps]
    walls = [s.duration_ns for s in wl.steps]
    core = [bucket_stream(s) for s in wl.steps]

    def op(k: Key) -> Op:
        return plans[k[0] % len(plans)][k[1]]

    deps: dict[Key, list[Key]] = {}
    for r in range(steps):
        ops, prev = plans[r % len(plans)], plans[(r - 1) % len(plans)] if r else []
        for o in ops:
            deps[(r, o.index)] = [(r, i) for i in o.deps] + [(r - 1, i) for i in prev_deps(o, prev)]

    def on_core(k: Key) -> bool:
        o = op(k)
        return o.sync is not None and o.stream == core[k[0] % len(plans)]

    def urgency(k: Key) -> tuple[int, ...]:
        o = op(k)
        if order == "launch":
            return ()
        return (0,) if o.bucket is None else (1, -o.bucket)

    end: dict[Key, int] = {}
    why: dict[Key, Key | None] = {}
    left = {k: len(v) for k, v in deps.items()}
    users: dict[Key, list[Key]] = {}
    for u, v in deps.items():
        for w in v:
            users.setdefault(w, []).append(u)
    ready_at: dict[Key, int] = {}
    # in-order streams: their ops in plan order
    lanes: dict[str, list[Key]] = {}
    for k in sorted(deps):
        o = op(k)
        if o.stream != COMPUTE and not on_core(k):
            lanes.setdefault(o.stream, []).append(k)
    pos = dict.fromkeys(lanes, 0)
    last_on: dict[str, Key | None] = {}
    # events: (time, seq, kind, key)
    ev: list[tuple[int, int, str, Key]] = []
    seq = 0

    def push(t: int, kind: str, k: Key) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(ev, (t, seq, kind, k))

    compute_q: list[tuple[int, Key]] = []
    core_q: list[tuple[tuple[int, ...], int, Key]] = []
    running: dict[str, tuple[Key, int, int] | None] = {}  # stream -> (key, began, left)
    remaining: dict[Key, int] = {}

    for k in deps:
        if op(k).issue_ns is not None:
            left[k] += 1  # and the host's issue
    hosts: list[int] = []
    ended: dict[int, int] = {}  # step -> when its last op ended
    n_left = {r: len(plans[r % len(plans)]) for r in range(steps)}

    def host_issue(now: int) -> None:
        """Begin the host's next steps that may begin (step r once r-2 has ended)."""
        while len(hosts) < steps and (len(hosts) < 2 or len(hosts) - 2 in ended):
            r = len(hosts)
            prev = hosts[-1] if hosts else 0
            hosts.append(host_start(r, prev, walls[(r - 1) % len(walls)], ended.get(r - 2, 0)))
            for o in plans[r % len(plans)]:
                if o.issue_ns is not None:
                    push(max(now, hosts[r] + o.issue_ns), "issue", (r, o.index))

    for k, n in left.items():
        if n == 0:
            ready_at[k] = 0
            push(0, "ready", k)
    host_issue(0)

    def start(stream: str, k: Key, now: int) -> None:
        o = op(k)
        full = sync_ns.get(o.task.id, o.duration_ns) if sync_ns and o.sync else o.duration_ns
        dur = remaining.pop(k, full)
        running[stream] = (k, now, dur)
        if now > ready_at[k] and last_on.get(stream) is not None:
            why[k] = last_on[stream]  # it waited for its stream, not for a dep
        push(now + dur, "end", k)

    def dispatch(now: int) -> None:
        if running.get(COMPUTE) is None and compute_q:
            _, k = heapq.heappop(compute_q)
            start(COMPUTE, k, now)
        for name, keys in lanes.items():
            i = pos[name]
            if running.get(name) is None and i < len(keys) and keys[i] in ready_at:
                pos[name] += 1
                start(name, keys[i], now)
        if core_q:
            top = core_q[0]
            cur = running.get("core")
            if cur is None:
                heapq.heappop(core_q)
                start("core", top[2], now)
            elif order == "priority" and top[0] < urgency(cur[0]):
                k, began, dur = cur
                remaining[k] = dur - (now - began)
                heapq.heappush(core_q, (urgency(k), -1, k))  # keeps its place among equals
                heapq.heappop(core_q)
                running["core"] = None
                start("core", top[2], now)

    while ev:
        now, _, kind, k = heapq.heappop(ev)
        if kind == "end":
            stream = "core" if on_core(k) else op(k).stream
            cur = running.get(stream)
            if cur is None or cur[0] != k or cur[1] + cur[2] != now:
                continue  # preempted meanwhile
            running[stream] = None
            last_on[stream] = k
            end[k] = now
            n_left[k[0]] -= 1
            if n_left[k[0]] == 0:
                ended[k[0]] = now
                host_issue(now)
            for u in users.get(k, ()):
                left[u] -= 1
                if left[u] == 0:
                    ready_at[u] = now
                    why[u] = k  # the dep that ended last
                    push(now, "ready", u)
        elif kind == "issue":
            left[k] -= 1
            if left[k] == 0:
                ready_at[k] = now
                why[k] = None  # it waited for the host
                push(now, "ready", k)
        elif kind == "ready":
            o = op(k)
            if on_core(k):
                heapq.heappush(core_q, (urgency(k), now, k))
            elif o.stream == COMPUTE:
                heapq.heappush(compute_q, (now, k))
        dispatch(now)
    ends = tuple(max(end[(r, o.index)] for o in plans[r % len(plans)]) for r in range(steps))
    step_ns = max(ends) / steps  # as the simulator's step time: the run over its steps
    last = steps - 1
    at: Key | None = max((x for x in end if x[0] == last), key=lambda x: end[x])
    path: list[str] = []
    while at is not None and at[0] == last:
        path.append(op(at).name)
        at = why.get(at)
    return Result(order, step_ns, ends, tuple(reversed(path)))


def priority_gain(
    wl: Workload, steps: int = 8, sync_ns: dict[int, int] | None = None, mode: Mode = "host"
) -> float:
    """How much shorter a step is with the buckets in priority order than in launch order,
    percent of launch order's step."""
    a = replay(wl, "launch", steps, sync_ns, mode).step_ns
    b = replay(wl, "priority", steps, sync_ns, mode).step_ns
    return 100.0 * (a - b) / a if a else 0.0
