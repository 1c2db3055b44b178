"""Training workloads for the cluster simulator: a typed task graph per rank.

`load(path)` reads a torch.profiler Chrome trace (`.json` or `.json.gz`) or a Chakra
execution trace (`.et`, needs chakra's schema: the `[chakra]` extra) of one DDP rank into a
`Workload` (docs/WORKLOADS.md); `replicate(workload, nodes, ...)` spreads it over N nodes
with a seeded per-node slowdown. `python -m rdmasched.workload FILE` prints a summary.
"""

from pathlib import Path

from rdmasched.workload import chakra, torch_trace
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
from rdmasched.workload.torch_trace import parse


def load(path: str | Path) -> Workload:
    """A trace file as a Workload: a Chakra ET if it is named `.et` / `.et.gz` or is not JSON
    (`chakra.looks_like_chakra`), else a torch.profiler Chrome trace."""
    if chakra.looks_like_chakra(path):
        return chakra.load(path)
    return torch_trace.load(path)


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
    "chakra",
    "load",
    "parse",
    "replicate",
]
