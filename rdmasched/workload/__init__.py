"""Training workloads for the cluster simulator: a typed task graph per rank.

`load(path)` reads a torch.profiler Chrome trace (`.json` or `.json.gz`) of one DDP rank into
a `Workload` (docs/WORKLOADS.md); `replicate(workload, nodes, ...)` spreads it over N nodes
with a seeded per-node slowdown. `python -m rdmasched.workload FILE` prints a summary.
"""

from rdmasched.workload.model import (
    PHASES,
    ComputeTask,
    Phase,
    Step,
    SyncTask,
    Task,
    Workload,
    WorkloadError,
)
from rdmasched.workload.replicate import Replicated, replicate
from rdmasched.workload.torch_trace import load, parse

__all__ = [
    "PHASES",
    "ComputeTask",
    "Phase",
    "Replicated",
    "Step",
    "SyncTask",
    "Task",
    "Workload",
    "WorkloadError",
    "load",
    "parse",
    "replicate",
]
