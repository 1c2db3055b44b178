"""Jitter below the daemon: what a user of a microsecond daemon expects to be able to set on
its loop thread. Each is off by default; docs/PERFORMANCE-LOG.md has their measured effect
(`rdmasched bench preempt --jitter`).

* `cpu`: pin the loop thread to one CPU (`sched_setaffinity` of that thread), so the host's
  scheduler does not move it and its caches stay warm. Pick a CPU nothing else is pinned to.
* `fifo`: run the loop thread under SCHED_FIFO at this priority (1..99), so ordinary
  (SCHED_OTHER) work cannot preempt it. Needs root or CAP_SYS_NICE. A spinning SCHED_FIFO
  thread can starve everything else on its CPU: the loop sleeps on the doorbell after
  `spin_us`, and the kernel's RT throttling (sched_rt_runtime_us, 95% by default) is the
  last guard; combine with `cpu` to keep it off the CPUs the training job uses.
* `gc_freeze`: after start-up, collect once and `gc.freeze()` every object that exists, so
  the collector's passes over the node's long-lived state (scheduler, peers, handlers) stop
  and a collection triggered on the path only looks at new objects.

`LoopTuning.apply()` acts on the calling thread: the node calls it first thing on its loop
thread.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

from rdmasched.errors import ArgumentError, RdmaschedError


@dataclass(frozen=True)
class LoopTuning:
    cpu: int | None = None
    fifo: int | None = None
    gc_freeze: bool = False

    def __post_init__(self) -> None:
        if self.cpu is not None:
            usable = os.sched_getaffinity(0)
            if type(self.cpu) is not int or self.cpu not in usable:
                raise ArgumentError(
                    f"cpu={self.cpu!r}: not a CPU this process may run on ({sorted(usable)})"
                )
        if self.fifo is not None and (type(self.fifo) is not int or not 1 <= self.fifo <= 99):
            raise ArgumentError(f"fifo={self.fifo!r}: a SCHED_FIFO priority is 1..99")

    def apply(self) -> list[str]:
        """Apply to the calling thread; what was done (for the log). RdmaschedError if the
        system refuses (SCHED_FIFO without the privilege)."""
        done: list[str] = []
        if self.cpu is not None:
            os.sched_setaffinity(0, {self.cpu})  # pid 0: this thread
            done.append(f"pinned to CPU {self.cpu}")
        if self.fifo is not None:
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(self.fifo))
            except PermissionError as exc:
                raise RdmaschedError(
                    f"SCHED_FIFO priority {self.fifo} refused ({exc}): it needs root or "
                    "CAP_SYS_NICE (or an RLIMIT_RTPRIO of at least that priority)"
                ) from exc
            done.append(f"SCHED_FIFO priority {self.fifo}")
        if self.gc_freeze:
            gc.collect()
            gc.freeze()
            done.append(f"gc frozen ({gc.get_freeze_count()} objects)")
        return done

    def __bool__(self) -> bool:
        return self.cpu is not None or self.fifo is not None or self.gc_freeze


__all__ = ["LoopTuning"]
