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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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

    @property
    def is_bucket(self) -> bool:
        """A DDP gradient bucket: an all-reduce issued during the backward phase."""
        return self.collective == "all_reduce" and self.phase == "backward"


Task = ComputeTask | SyncTask


@dataclass(frozen=True)
class Step:
    index: int
    #: N of the trace's ProfilerStep#N, None for a trace without profiler steps
    profiler_step: int | None
    #: wall time of the step in the trace, ns
    duration_ns: int
    tasks: tuple[Task, ...]

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
        return sum(t.duration_ns for t in self.computes if phase is None or t.phase == phase)


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
