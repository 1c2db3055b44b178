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
* `slice_us`: ask the kernel for a shorter time slice for the loop thread (EEVDF's custom
  slice, Linux 6.12+: `sched_setattr` with `sched_runtime`, 100..100000 us). A thread woken
  on a CPU that runs another thread preempts it only if its deadline (its wake-up plus its
  slice) is the earlier; with the default slice (the kernel's base slice scaled by the
  CPUs: 1.4 ms on this project's 2-CPU machines, `get_slice()`) a wake-up on a host whose
  every CPU runs a rank waits for up to that long. A
  short slice asks for the CPU sooner and gives it back sooner; its share of the CPU is the
  same. It is not a privilege: any thread may ask it for itself. An older kernel ignores
  it: `apply()` then says so in one line, and nothing else changes. `set_slice` and
  `get_slice` do the same for any thread of the process (the training integration's
  threads, docs/TORCH.md).
* `gc_freeze`: after start-up, collect once and `gc.freeze()` every object that exists, so
  the collector's passes over the node's long-lived state (scheduler, peers, handlers) stop
  and a collection triggered on the path only looks at new objects.

`LoopTuning.apply()` acts on the calling thread: the node calls it first thing on its loop
thread.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import platform
import struct
from dataclasses import dataclass

from rdmasched.errors import ArgumentError, RdmaschedError
from rdmasched.limits import SLICE_US_MAX, SLICE_US_MIN

#: struct sched_attr (include/uapi/linux/sched/types.h): size, policy, flags, nice,
#: priority, runtime, deadline, period, util_min, util_max
_ATTR = struct.Struct("IIQiIQQQII")
#: (sched_setattr, sched_getattr) system call numbers of this machine, if known
_CALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}.get(platform.machine())
#: the policies with an EEVDF slice: SCHED_OTHER, SCHED_BATCH, SCHED_IDLE
_FAIR = (0, 3, 5)


def check_slice_us(name: str, value: object) -> int:
    """`value` as a slice request, us; ArgumentError naming `name` if it is not one."""
    if type(value) is not int or not SLICE_US_MIN <= value <= SLICE_US_MAX:
        raise ArgumentError(
            f"{name}={value!r}: a slice is a whole number of us in {SLICE_US_MIN}..{SLICE_US_MAX}"
        )
    return value


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _attr(tid: int) -> list[int] | str:
    """Thread `tid`'s sched_attr fields, or why they cannot be read."""
    if _CALLS is None:
        return f"sched_setattr is not known on {platform.machine()}"
    buf = ctypes.create_string_buffer(_ATTR.size)
    if _libc().syscall(_CALLS[1], tid, buf, _ATTR.size, 0) != 0:
        return f"sched_getattr of thread {tid}: {os.strerror(ctypes.get_errno())}"
    return list(_ATTR.unpack(buf.raw))


def get_slice(tid: int = 0) -> int | None:
    """Thread `tid`'s (0: the calling thread's) EEVDF slice, us; None where the kernel does
    not report one (before Linux 6.12, or a policy with no slice)."""
    f = _attr(tid)
    if isinstance(f, str):
        return None
    return f[5] // 1000 if f[1] in _FAIR and f[5] else None


def set_slice(slice_us: int, tid: int = 0) -> str | None:
    """Ask for an EEVDF slice of `slice_us` for thread `tid` (0: the calling thread),
    keeping its policy and nice. None once the kernel has it (read back); else why not, in
    one line: a kernel before 6.12 (which ignores it), a policy with no slice (SCHED_FIFO),
    a thread gone, a refusal."""
    check_slice_us("slice_us", slice_us)
    f = _attr(tid)
    if isinstance(f, str):
        return f
    if f[1] not in _FAIR:
        return f"thread {tid} runs policy {f[1]}, which has no slice (SCHED_FIFO/RR: none)"
    f[0], f[2], f[5] = _ATTR.size, 0, slice_us * 1000  # no flags: policy and nice as read
    buf = ctypes.create_string_buffer(_ATTR.pack(*f), _ATTR.size)
    assert _CALLS is not None  # (_attr answered)
    if _libc().syscall(_CALLS[0], tid, buf, 0) != 0:
        return f"sched_setattr of thread {tid}: {os.strerror(ctypes.get_errno())}"
    if get_slice(tid) != slice_us:
        return f"this kernel ({platform.release()}) ignores it: custom slices are Linux 6.12+"
    return None


@dataclass(frozen=True)
class LoopTuning:
    cpu: int | None = None
    fifo: int | None = None
    gc_freeze: bool = False
    slice_us: int | None = None

    def __post_init__(self) -> None:
        if self.cpu is not None:
            usable = os.sched_getaffinity(0)
            if type(self.cpu) is not int or self.cpu not in usable:
                raise ArgumentError(
                    f"cpu={self.cpu!r}: not a CPU this process may run on ({sorted(usable)})"
                )
        if self.fifo is not None and (type(self.fifo) is not int or not 1 <= self.fifo <= 99):
            raise ArgumentError(f"fifo={self.fifo!r}: a SCHED_FIFO priority is 1..99")
        if self.slice_us is not None:
            check_slice_us("slice_us", self.slice_us)
            if self.fifo is not None:
                raise ArgumentError("fifo and slice_us: a SCHED_FIFO thread has no slice")

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
        if self.slice_us is not None:
            why = set_slice(self.slice_us)
            done.append(
                f"EEVDF slice {self.slice_us} us" if why is None else f"no EEVDF slice: {why}"
            )
        if self.gc_freeze:
            gc.collect()
            gc.freeze()
            done.append(f"gc frozen ({gc.get_freeze_count()} objects)")
        return done

    def __bool__(self) -> bool:
        return (
            self.cpu is not None
            or self.fifo is not None
            or self.gc_freeze
            or self.slice_us is not None
        )


__all__ = ["LoopTuning", "check_slice_us", "get_slice", "set_slice"]
