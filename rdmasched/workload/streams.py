"""A trace's step as work on the device's streams: what a replay runs (docs/WORKLOADS.md).

`plan(step)` turns one step of a `Workload` into `Op`s, each on one stream of the device:

- the compute stream ("compute"): the rank's compute, one op at a time, in the order the
  ops became ready (within a step that is issue order: its ops form a chain);
- side streams ("side.K"): copies and kernels beside the compute, in order on their stream;
- communication streams ("comm", "comm.K"): collectives; on the stream that carries DDP's
  gradient buckets, the scheduler picks the order (`Op.bucket` ranks them), on the others
  they run in order.

Gradient buckets overlap the next step as P3 (Jayarajan et al., "Priority-based Parameter
Propagation for Distributed DNN Training", MLSys 2019) and ByteScheduler (Peng et al., SOSP
2019) have it: the optimizer is cut into one piece per bucket (by the bucket's bytes), run
when that bucket's sync ends, and the next step's forward into one piece per bucket, the
first layers' piece first; the forward piece of the layers whose gradients bucket k holds
waits for bucket k's optimizer piece of the step before (`Op.after_buckets`), not for the
whole step; the forward's first piece also waits for the step before's collectives of the
next batch (`SyncTask.next_batch`: TorchRec's pipelined input-dist, `Op.after_inputs`).
DDP fills buckets in reverse layer order, so the last bucket launched holds the first
layers: its forward piece comes first. How much of the forward each bucket's layers
take is the share of the backward compute between its launch and the previous bucket's
(backward time per layer tracks forward time per layer). A step without buckets, or
without forward or optimizer compute, keeps the barrier: its first op waits for every op
of the step before.

How a GPU trace is replayed is its `Mode` (a CPU trace's compute is its host: always
"device", its ops' busy time):

- "host" (the default): the device's ops also wait for the host that issued them: the host
  runs the trace's steps at their measured wall time, each op issued at its offset in the
  step, at most one step ahead of the device (`host_start`); a trace whose host was slower
  than its GPU (launch-bound, as HTA calls it) keeps its step so;
- "device": the device alone (GPU-bound): no host, each compute op for the span of its
  kernels (the launch gaps between them kept);
- "kernels": the device alone with no launch gaps: each compute op for its kernels' busy
  time only (a GPU-bound rank whose host always kept ahead).

Deps are indices into the same step's op list; `after_buckets`, `after_inputs` and
`barrier` are the only links to the step before (`prev_deps` resolves them). Nothing here
imports the simulator: `rdmasched.sim.trace` replays a plan on the node cores,
`rdmasched.workload.critpath` evaluates it alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

from rdmasched.workload.model import ComputeTask, Step, SyncTask, Task

COMPUTE = "compute"


@dataclass(frozen=True)
class Op:
    index: int
    name: str
    stream: str
    #: how long it holds its stream, ns (compute on a GPU: the span of its kernels, launch
    #: gaps between them included; a CPU trace: its busy time; a sync: its measured run)
    duration_ns: int
    #: of that, time a kernel (or op) ran, ns: what device idle counts as busy
    busy_ns: int
    deps: tuple[int, ...]
    task: Task
    #: a gradient bucket: its launch order in the step (0 = the first launched)
    bucket: int | None = None
    #: a forward piece: waits for these buckets' optimizer pieces of the step before
    after_buckets: tuple[int, ...] = ()
    #: waits for every op of the step before (no bucket overlap)
    barrier: bool = False
    #: the forward's first piece: waits for the step before's `next_batch` collectives (its
    #: input, TorchRec's pipelined input-dist)
    after_inputs: bool = False
    #: an optimizer piece: the bucket it applies
    applies: int | None = None
    #: with the host model: when the host issues it, ns after the host began the step (it
    #: starts no earlier); None: no such bound
    issue_ns: int | None = None

    @property
    def sync(self) -> SyncTask | None:
        return self.task if isinstance(self.task, SyncTask) else None


def host_start(r: int, prev_start: int, prev_wall: int, ended_two_before: int) -> int:
    """When the host begins replay step r (ns, on the replay's clock): the host runs the
    trace's steps back to back at their own wall time (`Step.duration_ns`), one step ahead
    of the device at most: step r not before step r-2 ended on the device (`ended_two_before`,
    for r >= 2). Step 0 begins at `prev_start`."""
    if r == 0:
        return prev_start
    start = prev_start + prev_wall
    return max(start, ended_two_before) if r >= 2 else start


Mode = Literal["host", "device", "kernels"]
MODES: tuple[Mode, ...] = ("host", "device", "kernels")


def prev_deps(op: Op, prev: list[Op]) -> list[int]:
    """The ops of the step before (its plan `prev`) that `op` waits for."""
    out: list[int] = []
    if op.barrier:
        out += [o.index for o in prev]
    for k in op.after_buckets:
        out += [o.index for o in prev if o.applies == k]
    if op.after_inputs:
        out += [o.index for o in prev if o.sync is not None and o.sync.next_batch]
    return out


def occupancy(t: Task, gpu: bool) -> int:
    """How long a task holds its stream: a GPU compute task's span (launch gaps included),
    else its duration."""
    if isinstance(t, ComputeTask) and gpu:
        return max(t.span_ns, t.duration_ns)
    return t.duration_ns


def bucket_stream(step: Step) -> str | None:
    """The stream that carries the step's gradient buckets (None: the step has none)."""
    b = step.buckets
    return b[0].stream if b else None


def plan(step: Step, gpu: bool, mode: Mode = "host", overlap: bool = True) -> list[Op]:
    """The step's ops in issue order (module doc) for a replay in `mode`; `overlap`: P3's
    bucket-by-bucket overlap of the next step's forward where the step has buckets, forward
    and optimizer compute. With mode "host" (GPU traces), each op (the first piece of a cut
    one) carries its issue time (`host_start`)."""
    host = gpu and mode == "host"
    gpu = gpu and mode != "kernels"  # "kernels": busy time, as a CPU trace's
    tasks = step.tasks
    ids = {t.id for t in tasks}
    buckets = step.buckets
    rank = {x.id: k for k, x in enumerate(buckets)}
    fwd = {t.id for t in step.computes if t.stream == COMPUTE and t.phase == "forward"}
    opt = [t for t in step.computes if t.stream == COMPUTE and t.phase == "optimizer"]
    opt_ids = {t.id for t in opt}
    p3 = overlap and bool(buckets) and bool(fwd) and bool(opt)
    ops: list[Op] = []
    #: trace task id -> the op indices a dependent waits for
    ends: dict[int, list[int]] = {}
    n = len(buckets)
    fwd_total = sum(occupancy(t, gpu) for t in tasks if t.id in fwd)
    #: where region r of the forward starts, ns into the forward (r = 0: the first layers)
    starts = [round(x * fwd_total) for x in _forward_regions(step, buckets)] if p3 else []
    fwd_done = 0
    opt_pieces: list[int] = []

    def add(**kw: Any) -> Op:
        t = kw["task"]
        first = kw.pop("first", True)  # the first piece of its task: the host issues it
        op = Op(index=len(ops), issue_ns=t.offset_ns if host and first else None, **kw)
        ops.append(op)
        return op

    for t in tasks:
        deps = sorted({i for d in t.deps if d in ids for i in ends.get(d, [])})
        occ = occupancy(t, gpu)
        if p3 and t.id in fwd:
            # cut where a region of layers starts (cumulative forward time)
            lo, hi = fwd_done, fwd_done + occ
            fwd_done = hi
            cuts = sorted({lo, hi, *(c for c in starts if lo < c < hi)})
            if len(cuts) == 1:
                cuts = [lo, hi]
            pieces: list[int] = []
            for c0, c1 in pairwise(cuts):
                # the buckets whose regions start here (several: regions of no width; the
                # forward's last piece also those of no width at its end)
                last = c1 == fwd_total == hi
                waits = tuple(
                    n - 1 - r for r, c in enumerate(starts) if c == c0 or (last and c >= c1)
                )
                op = add(
                    name=f"{t.name}@{c0 - lo}",
                    stream=COMPUTE,
                    duration_ns=c1 - c0,
                    busy_ns=round(t.duration_ns * (c1 - c0) / occ) if occ else 0,
                    deps=tuple(deps if not pieces else [pieces[-1]]),
                    task=t,
                    after_buckets=waits,
                    after_inputs=c0 == 0,
                    first=not pieces,
                )
                pieces.append(op.index)
            ends[t.id] = [pieces[-1]]
        elif p3 and t.id in opt_ids:
            if not opt_pieces:  # the whole optimizer, cut by the buckets' bytes
                total = sum(occupancy(o, gpu) for o in opt)
                busy_total = sum(o.duration_ns for o in opt)
                sizes = [max(0, x.nbytes) for x in buckets]
                whole = sum(sizes)
                shares = [z / whole for z in sizes] if whole else [1 / n] * n
                for k, x in enumerate(buckets):
                    op = add(
                        name=f"optimizer@{x.name}",
                        stream=COMPUTE,
                        duration_ns=round(total * shares[k]),
                        busy_ns=round(busy_total * shares[k]),
                        deps=tuple(ends[x.id]),
                        task=t,
                        applies=k,
                    )
                    opt_pieces.append(op.index)
            ends[t.id] = opt_pieces
        else:
            barrier = False
            if not deps and p3 and t.stream != COMPUTE:
                # the step's first ops on other streams: after its first compute, if any
                # came before; else only their stream's order
                first_compute = next((o.index for o in ops if o.stream == COMPUTE), None)
                deps = [first_compute] if first_compute is not None else []
            elif not deps:
                barrier = True
            op = add(
                name=t.name,
                stream=t.stream,
                duration_ns=occ,
                busy_ns=t.duration_ns,
                deps=tuple(deps),
                task=t,
                bucket=rank.get(t.id),
                barrier=barrier,
            )
            ends[t.id] = [op.index]
    return ops


def _forward_regions(step: Step, buckets: tuple[SyncTask, ...]) -> list[float]:
    """Where each forward region r starts, as a share of the forward (r = 0: the first
    layers, whose gradients the last bucket holds, starts at 0). Region r's width is the
    share of the backward compute done between the launch of bucket n-1-r and of the
    bucket before it."""
    bwd = [t for t in step.computes if t.stream == COMPUTE and t.phase == "backward"]
    before = [sum(t.duration_ns for t in bwd if t.offset_ns < b.offset_ns) for b in buckets]
    widths = [max(0, w) for w in [before[0]] + [y - x for x, y in pairwise(before)]]
    total = sum(widths)
    n = len(buckets)
    shares = [w / total for w in widths] if total else [1 / n] * n
    out, acc = [], 0.0
    for r in range(n):
        out.append(acc)
        acc += shares[n - 1 - r]
    return out
