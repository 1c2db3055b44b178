"""A second torch.distributed backend for the tests: gloo behind a thin Python process group
that counts the collectives it runs (tests/tier2/torch_ranks.py, scenario ``backend``).

``register()`` registers it as ``"counting"`` (`torch.distributed.Backend.register_backend`),
for the CPU. Every group made with it (`init_process_group("counting")`, `new_group(
backend="counting")`) is a `Counting` wrapping its own `ProcessGroupGloo`, listed in
`Counting.groups` in the order they were made. A job whose code hard-coded gloo makes no
`Counting` for its groups, so its all-reduces are not counted.
"""

from __future__ import annotations

import datetime
from typing import Any, ClassVar

import torch.distributed as dist

NAME = "counting"


class Counting(dist.ProcessGroup):
    """gloo, counted: `counts[op]` collectives run through this group."""

    groups: ClassVar[list[Counting]] = []

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self.inner = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.counts: dict[str, int] = {}
        Counting.groups.append(self)

    def _count(self, op: str) -> Any:
        self.counts[op] = self.counts.get(op, 0) + 1
        return getattr(self.inner, op)

    def allreduce(self, tensors: Any, opts: Any) -> Any:
        return self._count("allreduce")(tensors, opts)

    def allreduce_coalesced(self, tensors: Any, opts: Any) -> Any:
        return self._count("allreduce_coalesced")(tensors, opts)

    def broadcast(self, tensors: Any, opts: Any) -> Any:
        return self._count("broadcast")(tensors, opts)

    def allgather(self, outputs: Any, inputs: Any, opts: Any) -> Any:
        return self._count("allgather")(outputs, inputs, opts)

    def _allgather_base(self, output: Any, input: Any, opts: Any) -> Any:
        return self._count("_allgather_base")(output, input, opts)

    def barrier(self, opts: Any) -> Any:
        return self._count("barrier")(opts)

    def getBackendName(self) -> str:
        return NAME


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Counting:
    return Counting(store, rank, size, timeout)


def register() -> None:
    """Register the ``"counting"`` backend (once per process)."""
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _create, devices=["cpu"])
