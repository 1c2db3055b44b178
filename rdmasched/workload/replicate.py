"""One rank's workload replicated over N nodes, each slowed by a seeded random factor.

Data-parallel ranks run the same program; what differs between nodes is speed. Node `i` runs
every compute task of the base workload `slowdown[i]` times as long, where the slowdowns are
drawn once per node from a lognormal distribution (median 1, shape `sigma`), and a chosen
fraction of nodes (the stragglers) are slowed by a further factor. Syncs keep their recorded
duration: how long a collective takes is the network model's business, not the node's.

Deterministic for a seed: the same (workload, nodes, sigma, stragglers, seed) gives the same
factors on every machine and Python version (`random.Random` with an integer seed).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from rdmasched.errors import ArgumentError
from rdmasched.workload.model import ComputeTask, Task, Workload


@dataclass(frozen=True)
class Replicated:
    base: Workload
    #: per node: the factor its compute durations are multiplied by
    slowdown: tuple[float, ...]
    stragglers: frozenset[int]
    seed: int
    sigma: float

    @property
    def nodes(self) -> int:
        return len(self.slowdown)

    def duration_ns(self, node: int, task: Task) -> int:
        """How long `task` of the base workload takes on `node`."""
        if isinstance(task, ComputeTask):
            return round(task.duration_ns * self.slowdown[node])
        return task.duration_ns

    def node_tasks(self, node: int) -> list[Task]:
        """Node `node`'s copy of the base tasks, durations scaled (same ids and deps)."""
        return [replace(t, duration_ns=self.duration_ns(node, t)) for t in self.base.tasks()]


def replicate(
    workload: Workload,
    nodes: int,
    *,
    sigma: float = 0.05,
    stragglers: float = 0.0,
    straggler_slowdown: float = 2.0,
    seed: int = 0,
) -> Replicated:
    """Replicate `workload` over `nodes` nodes.

    sigma: shape of the lognormal per-node slowdown (0 = identical nodes; 0.05 means about
    5% spread between nodes). stragglers: the fraction of nodes (rounded to a whole number)
    further slowed by `straggler_slowdown` (>= 1), chosen at random for the seed.
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ArgumentError(f"nodes must be a positive integer, not {nodes!r}")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ArgumentError(f"sigma must be a finite number >= 0, not {sigma!r}")
    if not (0.0 <= stragglers <= 1.0):
        raise ArgumentError(f"stragglers must be a fraction in [0, 1], not {stragglers!r}")
    if not (math.isfinite(straggler_slowdown) and straggler_slowdown >= 1.0):
        raise ArgumentError(f"straggler_slowdown must be >= 1, not {straggler_slowdown!r}")
    rng = random.Random(seed)
    factors = [rng.lognormvariate(0.0, sigma) if sigma > 0 else 1.0 for _ in range(nodes)]
    chosen = frozenset(rng.sample(range(nodes), round(stragglers * nodes)))
    for i in chosen:
        factors[i] *= straggler_slowdown
    return Replicated(workload, tuple(factors), chosen, seed, sigma)
