"""The workload model: one rank's training steps as a graph of compute tasks and syncs.

A `Workload` is what a trace parser (`rdmasched.workload.torch_trace`) produces and what a
simulator consumes. It depends on nothing but the standard library. Times are integer
nanoseconds.

Per step, tasks come in issue order (the order the rank started them). A `ComputeTask` is a
stretch of compute of one phase (forward, backward, optimizer) between two communication
events; a `SyncTask` is one collective (a DDP gradient bucket all-reduce in the backward
phase; a buffer broadcast in the forward phase) with its size in bytes. `deps` name the ids of
the tasks that must end before a task may start; ids are unique over the whole workload, and
the first task of a step depends on the last task of the step before.

`TaskBuilder` is the one place tasks are made, numbered and named, and `read_bytes` the one
place a trace file is read (gzipped or not); both readers (profiler and Chakra traces) use
them and add only what their formats differ in: how a group of compute items is timed and
which tasks a task depends on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from rdmasched import files
from rdmasched.errors import WorkloadError

Phase = Literal["forward", "backward", "optimizer"]
PHASES: tuple[Phase, ...] = ("forward", "backward", "optimizer")
__all__ = [
    "PHASES",
    "ComputeTask",
    "Phase",
    "Step",
    "SyncTask",
    "Task",
    "Workload",
    "WorkloadError",
]


#: the most bytes a trace file may hold, and inflate to if gzipped (a profiler trace of a
#: few steps is tens of MB; a larger one is not read rather than exhausting memory)
MAX_TRACE_BYTES = 1 << 30


def read_bytes(path: str | Path) -> bytes:
    """The bytes of a trace file, gunzipped if it is gzipped, at most MAX_TRACE_BYTES of a
    regular file (rdmasched.files); WorkloadError naming the file."""
    p = Path(path)
    try:
        return files.read_bytes(p, MAX_TRACE_BYTES, gunzip=True)
    except files.FileRefused as exc:
        raise WorkloadError(f"{exc}: not a trace") from None
    except OSError as exc:
        raise WorkloadError(f"{p}: cannot read: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class ComputeTask:
    """A stretch of one phase's compute between two communication events."""

    id: int
    step: int
    phase: Phase
    name: str
    #: time the rank was busy computing (union of its ops' intervals), ns
    duration_ns: int
    #: issue time of the first op, from the step's start in the trace, ns
    offset_ns: int
    #: wall time from the first op's issue to the last op's end, ns (>= duration_ns)
    span_ns: int
    ops: int
    deps: tuple[int, ...] = ()
    kind: Literal["compute"] = "compute"
    #: the stream it ran on: "compute" (the rank's compute stream or thread), or a side
    #: stream "side.K" (a copy or kernel stream beside it, GPU traces)
    stream: str = "compute"


@dataclass(frozen=True)
class SyncTask:
    """One collective: a gradient bucket's all-reduce (backward) or another sync."""

    id: int
    step: int
    phase: Phase
    name: str
    #: collective as named by the trace, normalised: "all_reduce", "broadcast", ...
    collective: str
    #: bytes of the buffer reduced/sent (max of in and out), 0 when the trace has no size
    nbytes: int
    nelems: int
    dtype: str
    #: time the collective ran (gloo worker / NCCL kernel), ns; 0 when the trace has none
    duration_ns: int
    #: issue time, from the step's start, ns
    offset_ns: int
    deps: tuple[int, ...] = ()
    kind: Literal["sync"] = "sync"
    #: the communication stream it ran on ("comm", or "comm.K" for the K-th NCCL stream of
    #: a GPU trace, numbered by first use)
    stream: str = "comm"
    #: the next batch's data: issued in the forward after its last compute (TorchRec's
    #: pipelined input-dist), it holds up nothing in its step; the next step's forward
    #: waits for it
    next_batch: bool = False

    @property
    def is_bucket(self) -> bool:
        """A DDP gradient bucket: an all-reduce issued during the backward phase."""
        return is_bucket(self.collective, self.phase)


def is_bucket(collective: str, phase: Phase) -> bool:
    return collective == "all_reduce" and phase == "backward"


Task = ComputeTask | SyncTask


@dataclass(frozen=True)
class Step:
    index: int
    #: N of the trace's ProfilerStep#N, None for a trace without profiler steps
    profiler_step: int | None
    #: wall time of the step in the trace, ns
    duration_ns: int
    tasks: tuple[Task, ...]
    #: trace time (ns) the step's first compute-stream work started (a GPU trace: its first
    #: kernel on the compute stream; 0 if unknown): from one step's to the next's is the
    #: step as the device ran it (`device_steps_ns`)
    device_start_ns: int = 0
    #: a GPU trace: the step's device idle, percent, per stream and "device" (any stream),
    #: as HTA counts it; {} when unknown (torch_trace._device_idle)
    device_idle_pct: dict[str, float] = field(default_factory=dict)

    @property
    def computes(self) -> tuple[ComputeTask, ...]:
        return tuple(t for t in self.tasks if isinstance(t, ComputeTask))

    @property
    def syncs(self) -> tuple[SyncTask, ...]:
        return tuple(t for t in self.tasks if isinstance(t, SyncTask))

    @property
    def buckets(self) -> tuple[SyncTask, ...]:
        """The gradient bucket syncs, in issue order."""
        return tuple(t for t in self.syncs if t.is_bucket)

    def compute_ns(self, phase: Phase | None = None) -> int:
        """Busy time of the compute stream (side streams apart), of one phase or all."""
        return sum(
            t.duration_ns
            for t in self.computes
            if t.stream == "compute" and (phase is None or t.phase == phase)
        )


@dataclass(frozen=True)
class Workload:
    source: str
    #: "cpu" (ops on CPU threads, e.g. gloo) or "gpu" (kernels on streams, e.g. NCCL)
    device: str
    backend: str | None
    rank: int | None
    world_size: int | None
    steps: tuple[Step, ...]
    #: events the parser did not use, by kind ("ph/cat"), counted
    ignored: dict[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def tasks(self) -> list[Task]:
        return [t for s in self.steps for t in s.tasks]

    def device_steps_ns(self) -> list[int]:
        """The trace's own steps as its device ran them: from each step's first compute-stream
        work to the next step's (one fewer than the steps; [] without device times). For a
        GPU trace this is the step the GPU ran, CPU-side step ranges apart."""
        st = [s.device_start_ns for s in self.steps]
        if len(st) < 2 or not all(st):
            return []
        return [b - a for a, b in pairwise(st)]

    def validate(self) -> None:
        """Raise WorkloadError unless every dep names an earlier task (so the graph is acyclic)
        and every task but the very first has a dep."""
        seen: set[int] = set()
        first = True
        for t in self.tasks():
            if t.id in seen:
                raise WorkloadError(f"task id {t.id} is used twice")
            for d in t.deps:
                if d not in seen:
                    raise WorkloadError(f"task {t.name} (id {t.id}) depends on {d}, not earlier")
            if not t.deps and not first:
                raise WorkloadError(f"task {t.name} (id {t.id}) depends on nothing")
            if t.duration_ns < 0:
                raise WorkloadError(f"task {t.name} (id {t.id}) has a negative duration")
            seen.add(t.id)
            first = False

    def summary(self) -> dict[str, Any]:
        """What `python -m rdmasched.workload FILE` prints (its --json form)."""
        steps = []
        for s in self.steps:
            steps.append(
                {
                    "index": s.index,
                    "profiler_step": s.profiler_step,
                    "duration_us": s.duration_ns / 1e3,
                    "compute_us": {p: s.compute_ns(p) / 1e3 for p in PHASES},
                    "device_idle_pct": s.device_idle_pct,
                    "tasks": len(s.tasks),
                    "buckets": [
                        {"name": b.name, "bytes": b.nbytes, "dtype": b.dtype} for b in s.buckets
                    ],
                    "other_syncs": [
                        {"name": x.name, "collective": x.collective, "bytes": x.nbytes}
                        for x in s.syncs
                        if not x.is_bucket
                    ],
                }
            )
        return {
            "source": self.source,
            "device": self.device,
            "backend": self.backend,
            "rank": self.rank,
            "world_size": self.world_size,
            "device_steps_us": [x / 1e3 for x in self.device_steps_ns()],
            "steps": steps,
            "ignored_events": dict(sorted(self.ignored.items())),
            "warnings": list(self.warnings),
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (the full graph)."""
        out = self.summary()
        out["graph"] = [
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in t.__dict__.items()}
            for t in self.tasks()
        ]
        return out


def union(ivs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Intervals [start, end) merged into disjoint sorted ones (busy time, idle time)."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(ivs):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


#: one piece of compute as a reader sees it (a profiler busy interval, a Chakra node)
Item = TypeVar("Item")


class TaskBuilder(Generic[Item]):
    """Makes a workload's tasks in issue order, one step after the other.

    Ids count over the whole workload; names count per step, by phase for compute
    (`backward.2`) and by collective for syncs (`broadcast.0`; a backward all-reduce is a
    gradient bucket, `bucket.1`). Compute items of one phase issued one after the other are
    one `ComputeTask`: `compute(item, phase)` gathers them, `flush()` ends the group (at
    each sync, phase change and step end) and hands it to `_group`, which the reader
    writes: it times the group and says its deps, then calls `add_compute`. Before a task
    is added, `next_id` is the id it will get (for deps that must not name itself)."""

    def __init__(self) -> None:
        self.next_id = 0
        #: the last task made, of any step
        self.last_id: int | None = None
        self.index = 0
        self.tasks: list[Task] = []
        self.counters: Counter[str] = Counter()
        self.pending: list[Item] = []
        self.pending_phase: Phase = "forward"

    def begin_step(self, index: int) -> None:
        """Start step `index` (after a `flush()` of the step before)."""
        self.index = index
        self.tasks, self.counters = [], Counter()
        self.pending, self.pending_phase = [], "forward"

    def compute(self, item: Item, phase: Phase) -> None:
        if self.pending and phase != self.pending_phase:
            self.flush()
        self.pending_phase = phase
        self.pending.append(item)

    def flush(self) -> None:
        if self.pending:
            phase, items = self.pending_phase, self.pending
            self.pending = []
            self._group(phase, items)

    def _group(self, phase: Phase, items: list[Item]) -> None:
        raise NotImplementedError

    def add_compute(
        self,
        phase: Phase,
        *,
        duration_ns: int,
        offset_ns: int,
        span_ns: int,
        ops: int,
        deps: tuple[int, ...],
        stream: str = "compute",
    ) -> ComputeTask:
        label = phase if stream == "compute" else f"{stream}.{phase}"
        t = ComputeTask(
            id=self.next_id,
            step=self.index,
            phase=phase,
            name=f"{label}.{self.counters[label]}",
            duration_ns=duration_ns,
            offset_ns=offset_ns,
            span_ns=span_ns,
            ops=ops,
            deps=deps,
            stream=stream,
        )
        self.counters[label] += 1
        self._add(t)
        return t

    def add_sync(
        self,
        phase: Phase,
        collective: str,
        *,
        nbytes: int,
        nelems: int,
        dtype: str,
        duration_ns: int,
        offset_ns: int,
        deps: tuple[int, ...],
        stream: str = "comm",
        next_batch: bool = False,
    ) -> SyncTask:
        label = "bucket" if is_bucket(collective, phase) else collective
        t = SyncTask(
            id=self.next_id,
            step=self.index,
            phase=phase,
            name=f"{label}.{self.counters['s:' + label]}",
            collective=collective,
            nbytes=nbytes,
            nelems=nelems,
            dtype=dtype,
            duration_ns=duration_ns,
            offset_ns=offset_ns,
            deps=deps,
            stream=stream,
            next_batch=next_batch,
        )
        self.counters["s:" + label] += 1
        self._add(t)
        return t

    def _add(self, t: Task) -> None:
        self.tasks.append(t)
        self.last_id = t.id
        self.next_id += 1
