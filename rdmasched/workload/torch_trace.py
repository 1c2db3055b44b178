"""Read a torch.profiler Chrome trace (`.json` or `.json.gz`) of one DDP rank as a `Workload`.

What is read (docs/WORKLOADS.md has the full account):

- steps: the `ProfilerStep#N` ranges (one step over the whole trace, with a warning, if none);
- phases: ranges named `forward` / `backward` / `optimizer` (record_function annotations),
  else torch's own `DistributedDataParallel.forward`, `Optimizer.step#...` and the first
  autograd op of the step (`autograd::engine::evaluate_function: ...`, `...Backward0`);
- communication: on CPU threads the c10d ops (`c10d::allreduce_`, `record_param_comms`,
  `nccl:*`, `gloo:*` ...); a gloo collective's run on its worker thread gives its duration;
  on GPUs the NCCL kernels (`ncclKernel_*`, `ncclDevKernel_*`) with their launch time;
- sizes: `In msg nelems` / `Out msg nelems` / `dtype` where the trace has them, else the
  `Input Dims` and `Input type` of the collective (needs `record_shapes=True`);
- compute: the time the rank is busy in other ops (CPU `cpu_op` on threads that compute;
  GPU kernels, memcpy and memset on every stream), cut at every communication issue.

Every other event is ignored and counted by kind. Nothing here imports torch.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rdmasched.limits import U64_MAX
from rdmasched.workload.model import (
    ComputeTask,
    Phase,
    Step,
    SyncTask,
    Task,
    TaskBuilder,
    Workload,
    WorkloadError,
    is_bucket,
    read_bytes,
    union,
)

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
NCCL_KERNEL_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
COMM_PREFIXES = ("c10d::", "nccl:", "gloo:", "ucc:", "mpi:")
USER_PHASES: dict[str, Phase] = {
    "forward": "forward",
    "fwd": "forward",
    "forward pass": "forward",
    "forward_pass": "forward",
    "backward": "backward",
    "bwd": "backward",
    "backward pass": "backward",
    "backward_pass": "backward",
    "optimizer": "optimizer",
    "optimizer step": "optimizer",
    "optimizer_step": "optimizer",
    "optimizer.step": "optimizer",
    "optim": "optimizer",
    "opt": "optimizer",
}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: categories of CPU-side ranges (record_function annotations and operators)
CPU_RANGE_CATS = ("user_annotation", "cpu_op")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime", "xpu_runtime")
#: bytes per element, by c10 ScalarType name and by the C++ names of `Input type`, lowercased
DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "half": 2,
    "bfloat16": 2,
    "c10::half": 2,
    "c10::bfloat16": 2,
    "byte": 1,
    "char": 1,
    "short": 2,
    "int": 4,
    "long": 8,
    "long int": 8,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "short int": 2,
    "complexfloat": 8,
    "complexdouble": 16,
    "float8_e5m2": 1,
    "float8_e4m3fn": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
}
#: a collective's name in the trace, normalised
COLLECTIVES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allreduce_sparse": "all_reduce",
    "broadcast": "broadcast",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "allgather_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_all",
    "sendrecv": "send_recv",
    "send": "send",
    "recv": "recv",
    "recv_any_source": "recv",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
}


def normalise_collective(name: str) -> str:
    """`c10d::allreduce_`, `nccl:all_reduce`, `allreduce`, `AllReduce` -> `all_reduce`."""
    for p in COMM_PREFIXES:
        if name.startswith(p):
            name = name[len(p) :]
    key = name.strip("_").lower()
    if key in COLLECTIVES:
        return COLLECTIVES[key]
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name.strip("_")).lower()  # AllReduce -> all_reduce
    return COLLECTIVES.get(snake, COLLECTIVES.get(snake.replace("_", ""), key))


def read_trace(path: str | Path) -> Any:
    """The JSON document of a trace file, gzipped or not; WorkloadError naming the file."""
    p = Path(path)
    raw = read_bytes(p)
    try:
        return json.loads(raw)
    except RecursionError:
        raise WorkloadError(f"{p}: not a trace: JSON nested too deep") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{p}: not a JSON trace (not UTF-8 text: {exc.reason})") from None
    except json.JSONDecodeError as exc:
        cut = exc.pos >= len(raw.rstrip()) or exc.msg.startswith("Unterminated")
        what = "truncated JSON" if cut else "not valid JSON"
        raise WorkloadError(
            f"{p}: {what} at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


def load(path: str | Path) -> Workload:
    """Parse a torch.profiler Chrome trace file (`.json` or `.json.gz`) into a Workload."""
    return parse(read_trace(path), source=str(path))


# ---- internal records -------------------------------------------------------------------------
@dataclass
class _Ev:
    name: str
    cat: str
    tid: Any
    start: int  # ns
    end: int  # ns
    args: dict[str, Any]


@dataclass
class _Comm:
    """One collective as seen where it was issued (outermost comm event and what it nests)."""

    issue: int  # ns
    end: int
    tid: Any
    collective: str
    nelems: int = 0
    dtype: str = ""
    duration: int = 0
    events: list[_Ev] = field(default_factory=list)
    #: when it started running (a GPU trace: its kernel's start; -1: at its issue)
    start: int = -1
    #: its stream ("comm" on a CPU trace, "comm.K" for the K-th NCCL stream of a GPU trace)
    stream: str = "comm"

    @property
    def done(self) -> int:
        """When it ended in the trace: its start (or issue) plus its duration."""
        return (self.start if self.start >= 0 else self.issue) + self.duration


@dataclass
class _Unit:
    """A piece of compute: issued at `issue`, busy over [start, end)."""

    issue: int
    start: int
    end: int
    ops: int = 1
    #: None on the compute stream (or thread); "side.K" on the K-th other stream
    side: str | None = None


#: the largest time a trace may give, us (2**62 ns: centuries; Infinity is not a time)
_MAX_US = float(1 << 62) / 1000.0


def _ns(v: Any) -> int:
    """A trace's time (us, as a number or its text) in ns; ValueError if it is not finite
    and within +-2**62 ns."""
    us = float(v)
    if not -_MAX_US <= us <= _MAX_US:  # also NaN
        raise ValueError(f"{v!r} is not a time")
    return round(us * 1000.0)


def _size_of(evs: list[_Ev]) -> tuple[int, str]:
    """(nelems, dtype) of a collective from the args of its events ((0, "") if unknown)."""
    nelems, dtype = 0, ""
    for e in evs:
        a = e.args
        n = max(_int(a.get("In msg nelems")), _int(a.get("Out msg nelems")))
        if n > 0:
            nelems = n
            dtype = str(a.get("dtype") or dtype)
    if nelems:
        return nelems, dtype
    for e in evs:
        dims, types = e.args.get("Input Dims"), e.args.get("Input type")
        if not isinstance(dims, list) or not dims:
            continue
        n = _elements(dims[0])
        if n > 0:
            t = types[0] if isinstance(types, list) and types else ""
            t = t if isinstance(t, str) and t.lower() in DTYPE_BYTES else ""
            if n > nelems or (n == nelems and t and not dtype):
                nelems, dtype = n, t or dtype
    return nelems, dtype


def _elements(dims: Any) -> int:
    """Elements of one `Input Dims` entry: [a, b] is one tensor, [[a], [b, c]] a TensorList."""
    if isinstance(dims, list) and dims and all(isinstance(d, list) for d in dims):
        return sum(_elements(d) for d in dims)
    if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    return 0


def _int(v: Any) -> int:
    """A count the trace gives (elements of a collective), 0 if it is not a count in u64."""
    try:
        n = int(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: Infinity
        return 0
    return n if 0 <= n <= U64_MAX else 0


def _subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Disjoint sorted intervals a minus disjoint sorted intervals b."""
    out: list[tuple[int, int]] = []
    j = 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _split(ivs: list[tuple[int, int]], cuts: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in ivs:
        i = bisect.bisect_right(cuts, s)
        while i < len(cuts) and cuts[i] < e:
            out.append((s, cuts[i]))
            s = cuts[i]
            i += 1
        out.append((s, e))
    return out


def _outermost(evs: list[_Ev]) -> list[list[_Ev]]:
    """Group one thread's events (sorted by start, longest first) into outermost + nested."""
    groups: list[list[_Ev]] = []
    for e in evs:
        if groups and e.start < groups[-1][0].end:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


def _is_comm(name: str) -> bool:
    return name.startswith(COMM_PREFIXES) or name == "record_param_comms"


def _user_phase(name: str) -> Phase | None:
    return USER_PHASES.get(name.strip("# ").lower())


def _builtin_phase(name: str) -> Phase | None:
    if name == "DistributedDataParallel.forward":
        return "forward"
    if name.startswith("Optimizer.step#"):
        return "optimizer"
    return None


def _looks_backward(name: str) -> bool:
    return name.startswith("autograd::engine::evaluate_function") or bool(
        re.search(r"Backward\d*$", name)
    )


# ---- the parser -------------------------------------------------------------------------------
def parse(doc: Any, source: str = "<trace>") -> Workload:
    """Parse a loaded Chrome-trace document (dict with traceEvents, or a bare event list)."""
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
        if not isinstance(events, list):
            raise WorkloadError(f"{source}: not a Chrome trace (no traceEvents list)")
        dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    elif isinstance(doc, list):
        events, dist = doc, {}
    else:
        raise WorkloadError(f"{source}: not a Chrome trace (a JSON {type(doc).__name__})")
    assert isinstance(dist, dict)

    ignored: Counter[str] = Counter()
    warnings: list[str] = []
    steps_ev: list[tuple[int, _Ev]] = []
    phase_user: list[tuple[Phase, _Ev]] = []
    phase_builtin: list[tuple[Phase, _Ev]] = []
    cpu_ops: dict[Any, list[_Ev]] = defaultdict(list)
    comm_ev: dict[Any, list[_Ev]] = defaultdict(list)
    gpu: list[_Ev] = []
    runtime: dict[int, _Ev] = {}
    bad = 0

    for raw in events:
        if not isinstance(raw, dict):
            bad += 1
            continue
        ph, cat, name = raw.get("ph"), str(raw.get("cat", "")), raw.get("name")
        if ph != "X" or not isinstance(name, str):
            ignored[f"{ph}/{cat}" if cat else str(ph)] += 1
            continue
        try:
            start = _ns(raw["ts"])
            end = start + max(0, _ns(raw.get("dur", 0)))
        except (KeyError, TypeError, ValueError):
            bad += 1
            continue
        args = raw.get("args") if isinstance(raw.get("args"), dict) else {}
        assert isinstance(args, dict)
        ev = _Ev(name, cat, (raw.get("pid"), raw.get("tid")), start, end, args)
        m = STEP_RE.match(name) if cat in CPU_RANGE_CATS else None
        if m:  # not kineto's gpu_user_annotation copies on the GPU rows
            steps_ev.append((int(m.group(1)), ev))
        elif cat in GPU_CATS:
            gpu.append(ev)
        elif cat in RUNTIME_CATS:
            corr = args.get("correlation")
            if isinstance(corr, int):
                runtime[corr] = ev
        elif _is_comm(name) and cat in CPU_RANGE_CATS:
            comm_ev[ev.tid].append(ev)
        elif (p := _user_phase(name)) is not None and cat in CPU_RANGE_CATS:
            phase_user.append((p, ev))
        elif (p := _builtin_phase(name)) is not None and cat in CPU_RANGE_CATS:
            phase_builtin.append((p, ev))
        elif cat == "cpu_op":
            cpu_ops[ev.tid].append(ev)
        else:
            ignored[f"X/{cat}" if cat else "X"] += 1
    if bad:
        warnings.append(f"{bad} malformed events skipped")
        ignored["malformed"] += bad

    # -- communication: outermost comm event per thread, with what it nests
    comms: dict[Any, list[_Comm]] = defaultdict(list)
    for tid, evs in comm_ev.items():
        evs.sort(key=lambda e: (e.start, -e.end))
        for g in _outermost(evs):
            coll_names = [str(e.args.get("Collective name", "")) for e in g]
            coll = next((c for c in coll_names if c), "")
            if not coll:
                coll = next((e.name for e in g if e.name != "record_param_comms"), g[0].name)
            nelems, dtype = _size_of(g)
            c = _Comm(g[0].start, g[0].end, tid, normalise_collective(coll), nelems, dtype)
            c.events = g
            comms[tid].append(c)
        # operators inside a collective are part of it, not compute
        ranges = [(c.issue, c.end) for c in comms[tid]]
        starts = [r[0] for r in ranges]
        kept = []
        for e in cpu_ops.get(tid, []):
            i = bisect.bisect_right(starts, e.start) - 1
            if i >= 0 and e.end <= ranges[i][1]:
                ignored["X/cpu_op (inside a collective)"] += 1
            else:
                kept.append(e)
        if tid in cpu_ops:
            cpu_ops[tid] = kept
    # a collective is issued on a thread that computes; on another thread (gloo's) it runs
    compute_tids = {tid for tid, evs in cpu_ops.items() if evs}
    issues = [c for tid, cs in comms.items() if tid in compute_tids for c in cs]
    runs = [c for tid, cs in comms.items() if tid not in compute_tids for c in cs]
    issues.sort(key=lambda c: c.issue)
    runs.sort(key=lambda c: c.issue)
    # a collective's run on a worker thread (gloo) is the k-th of its kind and size
    queue: dict[tuple[str, int], deque[_Comm]] = defaultdict(deque)
    for r in runs:
        queue[(r.collective, r.nelems)].append(r)
    for c in issues:
        q = queue.get((c.collective, c.nelems))
        if q:
            r = q.popleft()
            c.duration = r.end - r.issue
            c.dtype = c.dtype or r.dtype

    device = "gpu" if gpu else "cpu"
    names: dict[Any, str] = {}  # GPU stream -> its name (the compute stream's: "compute")
    units: list[_Unit] = []
    syncs: list[_Comm] = []
    if device == "gpu":
        for c in issues + runs:  # CPU-side comm events give sizes to the kernels they launch
            ignored["X/cpu_op (collective issue, GPU trace)"] += len(c.events)
        by_tid: dict[Any, list[_Comm]] = defaultdict(list)
        for c in issues + runs:
            by_tid[c.tid].append(c)
        main = _compute_stream(gpu)
        names[main] = "compute"
        for k in gpu:
            corr = k.args.get("correlation")
            launch = runtime.get(corr) if isinstance(corr, int) else None
            issue = launch.start if launch is not None else k.start
            m = NCCL_KERNEL_RE.match(k.name)
            if m is None:
                side = None if k.tid == main else _stream_name(names, "side", k.tid)
                units.append(_Unit(issue, k.start, k.end, side=side))
                continue
            coll = str(k.args.get("Collective name") or m.group(1))
            nelems, dtype = _size_of([k])
            if not nelems and launch is not None:
                for c in by_tid.get(launch.tid, []):
                    if c.issue <= launch.start <= c.end:
                        nelems, dtype = c.nelems, c.dtype
                        coll = c.collective if not k.args.get("Collective name") else coll
                        break
            c = _Comm(
                issue, issue, k.tid, normalise_collective(coll), nelems, dtype, k.end - k.start
            )
            c.start, c.stream = k.start, _stream_name(names, "comm", k.tid)
            syncs.append(c)
        for ev in runtime.values():
            ignored[f"X/{ev.cat}"] += 1
    else:
        for r in runs:
            ignored[f"X/{r.events[0].cat} (collective run)"] += len(r.events)
        syncs = issues
        for ev in runtime.values():
            ignored[f"X/{ev.cat}"] += 1
    syncs.sort(key=lambda c: c.issue)

    # -- steps
    steps_ev.sort(key=lambda se: se[1].start)
    windows: list[tuple[int | None, int, int]] = [(n, e.start, e.end) for n, e in steps_ev]
    if not windows:
        times = [e.start for evs in cpu_ops.values() for e in evs] + [u.issue for u in syncs]
        times += [k.start for k in gpu]
        if not times:
            raise WorkloadError(f"{source}: no operator or kernel events: nothing to replay")
        ends = [e.end for evs in cpu_ops.values() for e in evs] + [k.end for k in gpu]
        windows = [(None, min(times), max(ends + times) + 1)]
        warnings.append("no ProfilerStep#N ranges: the whole trace is read as one step")

    # -- CPU compute: busy time of compute threads minus collective issue, cut at every cut
    if device == "cpu":
        busy = union([(e.start, e.end) for evs in cpu_ops.values() for e in evs])
        busy = _subtract(busy, union([(c.issue, c.end) for c in issues]))
        cuts = sorted({c.issue for c in syncs} | {t for _, s, e in windows for t in (s, e)})
        op_starts = sorted(e.start for evs in cpu_ops.values() for e in evs)
        units = [_Unit(s, s, e, 0) for s, e in _split(busy, cuts)]
        # count each op once, in the piece its start falls in
        starts = [u.start for u in units]
        for t in op_starts:
            i = bisect.bisect_right(starts, t) - 1
            if i >= 0 and t < units[i].end:
                units[i].ops += 1
    units.sort(key=lambda u: u.issue)

    # -- per step: phase boundaries, then tasks in issue order
    backward_ops = sorted(
        e.start for evs in cpu_ops.values() for e in evs if _looks_backward(e.name)
    )
    out_steps: list[Step] = []
    b = _GraphBuilder()
    unit_iss = [u.issue for u in units]
    sync_iss = [c.issue for c in syncs]
    for index, (pstep, w0, w1) in enumerate(windows):
        lo, hi = bisect.bisect_left(unit_iss, w0), bisect.bisect_left(unit_iss, w1)
        s_lo, s_hi = bisect.bisect_left(sync_iss, w0), bisect.bisect_left(sync_iss, w1)
        step_units, step_syncs = units[lo:hi], syncs[s_lo:s_hi]
        markers = _markers(w0, w1, phase_user or phase_builtin, backward_ops)
        if "backward" not in {p for _, p in markers} and step_units:
            warnings.append(f"step {index}: no backward phase found")
        tasks = b.step(index, w0, markers, step_units, step_syncs)
        first = min((u.start for u in step_units if u.side is None), default=0)
        for task in tasks:
            if isinstance(task, SyncTask) and task.nelems and not task.nbytes:
                warnings.append(f"step {index}: {task.name}: unknown dtype {task.dtype!r}, size 0")
            elif isinstance(task, SyncTask) and not task.nelems:
                warnings.append(
                    "collectives without a size (0 bytes): record the trace with record_shapes=True"
                )
        out_steps.append(Step(index, pstep, w1 - w0, tuple(tasks), first))

    if device == "gpu":
        out_steps = _device_idle(out_steps, gpu, names)
    if device == "cpu" and not syncs:
        warnings.append("no collectives found: a single-rank or non-distributed trace")
    backend = dist.get("backend") if isinstance(dist.get("backend"), str) else None
    wl = Workload(
        source=source,
        device=device,
        backend=backend,
        rank=dist.get("rank") if isinstance(dist.get("rank"), int) else None,
        world_size=dist.get("world_size") if isinstance(dist.get("world_size"), int) else None,
        steps=tuple(out_steps),
        ignored=dict(ignored),
        warnings=tuple(dict.fromkeys(warnings)),
    )
    wl.validate()
    return wl


def _device_idle(steps: list[Step], gpu: list[_Ev], names: dict[Any, str]) -> list[Step]:
    """Each step's device idle as HTA counts it (percent of the step's time with no kernel,
    copy or memset on that stream / on any stream of the device), over the step as the
    device ran it: from its first compute-stream work to the next step's (the last step
    has no such end and gets none)."""
    out = list(steps)
    for i in range(len(steps) - 1):
        a, b = steps[i].device_start_ns, steps[i + 1].device_start_ns
        if not (a and b > a):
            continue
        per: dict[Any, list[tuple[int, int]]] = defaultdict(list)
        for k in gpu:
            if k.end > a and k.start < b:
                per[k.tid].append((max(a, k.start), min(b, k.end)))
        idle = {
            names.get(tid, str(tid)): 100.0 * (1 - sum(e - s for s, e in union(iv)) / (b - a))
            for tid, iv in per.items()
        }
        every = union([x for iv in per.values() for x in iv])
        idle["device"] = 100.0 * (1 - sum(e - s for s, e in every) / (b - a))
        out[i] = replace(steps[i], device_idle_pct=dict(sorted(idle.items())))
    return out


def _compute_stream(gpu: list[_Ev]) -> Any:
    """The GPU stream (pid, tid) with the most compute-kernel time: the compute stream; the
    others that run kernels or copies are side streams."""
    busy: Counter[Any] = Counter()
    for k in gpu:
        if NCCL_KERNEL_RE.match(k.name) is None:
            busy[k.tid] += k.end - k.start
    return busy.most_common(1)[0][0] if busy else None


def _stream_name(names: dict[Any, str], kind: str, tid: Any) -> str:
    """`kind.K`: the K-th stream of that kind, numbered by first use."""
    if tid not in names:
        names[tid] = f"{kind}.{sum(1 for v in names.values() if v.startswith(kind + '.'))}"
    return names[tid]


def _markers(
    w0: int, w1: int, annotations: list[tuple[Phase, _Ev]], backward_ops: list[int]
) -> list[tuple[int, Phase]]:
    """Sorted (time, phase) marks of the step [w0, w1): from then on, that phase runs.

    Phase ranges (the user's `forward`/`backward`/`optimizer` if the trace has any, else
    torch's `DistributedDataParallel.forward` and `Optimizer.step#...`) mark their start;
    without a backward range, the first autograd op after each forward mark does."""
    marks = sorted((e.start, p) for p, e in annotations if w0 <= e.start < w1)
    if not any(p == "backward" for _, p in marks):
        fwd_starts = [t for t, p in marks if p == "forward"] or [w0]
        ends = [t for t, p in marks if p != "forward" and t > fwd_starts[0]]
        for k, f in enumerate(fwd_starts):
            nxt = fwd_starts[k + 1] if k + 1 < len(fwd_starts) else w1
            i = bisect.bisect_left(backward_ops, f)
            if i < len(backward_ops) and backward_ops[i] < nxt:
                t = backward_ops[i]
                if not any(f < e <= t for e in ends):
                    marks.append((t, "backward"))
        marks.sort()
    return marks


class _GraphBuilder(TaskBuilder[_Unit]):
    """Turns each step's compute units and collectives, in issue order, into tasks with deps.

    Rules (docs/WORKLOADS.md, "Dependencies"):
    - compute-stream tasks of a step form a chain (stream order); a compute task ends at each
      collective's issue, at each phase change, and where a collective it may wait for ended;
    - a sync depends on the compute task just before it (the one that produced its data); a
      sync other than a gradient bucket also on the one before it on its stream (in order);
      gradient buckets depend on nothing else: the scheduler picks their order;
    - a collective other than a bucket holds up only the first compute-stream task that
      started, in the trace, after it ended; one issued in the forward after the forward's
      last compute is the next batch's (TorchRec's pipelined input-dist: `next_batch`) and
      holds up nothing in its step;
    - the first optimizer task waits for the step's gradient buckets (DDP's finalize: only
      DDP's own buckets); the backward compute never waits for a bucket;
    - side-stream work (copies, kernels on other streams) is its own tasks on its stream:
      each after the one before on its stream, the first after the compute issued before it;
    - the first task of a step depends on the last of the previous step.
    """

    def step(
        self,
        index: int,
        w0: int,
        markers: list[tuple[int, Phase]],
        units: list[_Unit],
        syncs: list[_Comm],
    ) -> list[Task]:
        times = [t for t, _ in markers]

        def phase_at(t: int) -> Phase:
            i = bisect.bisect_right(times, t) - 1
            return markers[i][1] if i >= 0 else "forward"

        self.begin_step(index)
        self.w0 = w0
        self.buckets: list[int] = []  # since the last optimizer task
        self.blocking: list[int] = []
        self.waiting: list[tuple[int, int]] = []  # (sync id, when it ended)
        self.last_on: dict[str, int] = {}  # stream -> its last non-bucket sync / side task
        self.last_compute: int | None = None
        self.side: dict[str, tuple[Phase, list[_Unit], tuple[int, ...]]] = {}
        #: issue of the forward's last compute-stream work
        self.last_forward = max(
            (u.issue for u in units if u.side is None and phase_at(u.issue) == "forward"),
            default=None,
        )
        items: list[tuple[int, int, _Unit | _Comm]] = [(u.issue, 0, u) for u in units]
        items += [(c.issue, 1, c) for c in syncs]
        items.sort(key=lambda x: (x[0], x[1]))
        for _, _, item in items:
            ph = phase_at(item.issue)
            if isinstance(item, _Comm):
                self.flush()
                self._sync(item, ph)
            elif item.side is not None:
                self._side_unit(item, ph)
            else:
                due = [sid for sid, done in self.waiting if done <= item.start]
                if due:
                    self.flush()
                    self.blocking += due
                    self.waiting = [(sid, d) for sid, d in self.waiting if d > item.start]
                self.compute(item, ph)
        self.flush()
        for stream in list(self.side):
            self._side_flush(stream)
        return self.tasks

    def _prev(self) -> list[int]:
        if self.last_compute is not None:
            return [self.last_compute]
        return [self.last_id] if self.last_id is not None else []

    def _group(self, phase: Phase, items: list[_Unit]) -> None:
        deps = self._prev() + self.blocking
        if phase == "optimizer" and self.buckets:
            deps += self.buckets  # DDP's finalize: the optimizer after every bucket
            self.buckets = []
        t = self._add_group(phase, items, tuple(dict.fromkeys(deps)), "compute")
        self.last_compute = t.id
        self.blocking = []

    def _add_group(
        self, phase: Phase, items: list[_Unit], deps: tuple[int, ...], stream: str
    ) -> ComputeTask:
        iv = union([(u.start, u.end) for u in items])
        return self.add_compute(
            phase,
            duration_ns=sum(e - s for s, e in iv),
            offset_ns=items[0].issue - self.w0,
            span_ns=max(u.end for u in items) - min(u.start for u in items),
            ops=sum(u.ops for u in items),
            deps=deps,
            stream=stream,
        )

    def _side_unit(self, u: _Unit, ph: Phase) -> None:
        assert u.side is not None
        cur = self.side.get(u.side)
        if cur is not None and cur[0] != ph:
            self._side_flush(u.side)
            cur = None
        if cur is None:
            before = self.last_on.get(u.side)
            deps = tuple([before] if before is not None else self._prev())
            self.side[u.side] = (ph, [u], deps)
        else:
            cur[1].append(u)

    def _side_flush(self, stream: str) -> None:
        ph, items, deps = self.side.pop(stream)
        if not deps and self.last_id is not None:
            deps = (self.last_id,)  # the very first task of a trace that starts on a side
        self.last_on[stream] = self._add_group(ph, items, deps, stream).id

    def _sync(self, c: _Comm, ph: Phase) -> None:
        bucket = is_bucket(c.collective, ph)
        last = self.last_forward
        after = not bucket and ph == "forward" and last is not None and c.issue > last
        before = None if bucket else self.last_on.get("sync:" + c.stream)
        deps = self._prev() + ([before] if before is not None else [])
        t = self.add_sync(
            ph,
            c.collective,
            nbytes=c.nelems * DTYPE_BYTES.get(c.dtype.lower(), 0),
            nelems=c.nelems,
            dtype=c.dtype,
            duration_ns=max(0, c.duration),
            offset_ns=c.issue - self.w0,
            deps=tuple(dict.fromkeys(deps)),
            stream=c.stream,
            next_batch=after,
        )
        if bucket:
            self.buckets.append(t.id)
        else:
            self.last_on["sync:" + c.stream] = t.id
            if not after:
                self.waiting.append((t.id, c.done))
