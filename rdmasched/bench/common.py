"""What every benchmark shares: two pinned processes, summary statistics, the table."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import traceback
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rdmasched.stats import Histogram

Side = Callable[[Any], Any]


def pick_cores() -> tuple[int | None, int | None]:
    """Two distinct CPUs to pin the two sides to, or (None, None) with only one."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return cpus[0], cpus[1]


def _child(fn: Side, arg: Any, cpu: int | None, out: Any) -> None:
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        out.send(("ok", fn(arg)))
    except BaseException as exc:  # report anything, the parent decides
        out.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        out.close()


def run_pair(
    a: Side, b: Side, arg: Any, timeout_s: float = 120.0, pin: bool = True
) -> tuple[Any, Any]:
    """Run `a(arg)` and `b(arg)` in two new processes pinned to two cores (unless not
    `pin`: then where the kernel puts them); their results.

    Both sides must be importable functions. Raises RuntimeError with the child's traceback
    if either failed, or if either is still running after `timeout_s`.
    """
    ctx = mp.get_context("fork")
    cpu_a, cpu_b = pick_cores() if pin else (None, None)
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [
        ctx.Process(target=_child, args=(a, arg, cpu_a, pipes[0][1]), daemon=True),
        ctx.Process(target=_child, args=(b, arg, cpu_b, pipes[1][1]), daemon=True),
    ]
    for p in procs:
        p.start()
    for _, w in pipes:
        w.close()
    results = []
    try:
        for (r, _), p in zip(pipes, procs, strict=True):
            if not r.poll(timeout_s):
                raise RuntimeError(f"benchmark side {p.name} did not finish in {timeout_s} s")
            status, value = r.recv()
            if status != "ok":
                raise RuntimeError(f"benchmark side failed: {value}")
            results.append(value)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    return results[0], results[1]


@dataclass
class Row:
    """One benchmark row: the summary of its samples (one HdrHistogram, rdmasched.stats)."""

    name: str
    what: str
    n: int
    min_us: float
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float
    msgs_per_s: float
    mean_us: float = 0.0
    stddev_us: float = 0.0
    p90_us: float = 0.0
    #: the sum of the samples, ns (the rate's denominator; not in JSON)
    total_ns: int = 0
    #: the samples, for merging rounds, CSV, HdrHistogram logs and plots (not in JSON)
    hist: Histogram = field(default_factory=Histogram, repr=False, compare=False)

    @classmethod
    def from_samples(
        cls, name: str, what: str, samples_ns: Sequence[int], msgs_per_sample: int = 2
    ) -> Row:
        if not len(samples_ns):
            raise ValueError(f"{name}: no samples")
        return cls.from_hist(name, what, Histogram(samples_ns), sum(samples_ns), msgs_per_sample)

    @classmethod
    def from_hist(
        cls, name: str, what: str, hist: Histogram, total_ns: int, msgs_per_sample: int = 2
    ) -> Row:
        """A row from a histogram and the exact sum of its samples (for the rate)."""
        if not hist.count:
            raise ValueError(f"{name}: no samples")
        s = hist.summary()
        total_s = total_ns / 1e9
        return cls(
            name,
            what,
            s["n"],
            s["min"],
            s["p50"],
            s["p99"],
            s["p999"],
            s["max"],
            msgs_per_sample * s["n"] / total_s if total_s else 0.0,
            mean_us=s["mean"],
            stddev_us=s["stddev"],
            p90_us=s["p90"],
            total_ns=total_ns,
            hist=hist,
        )

    @classmethod
    def merged(cls, rows: Sequence[Row], msgs_per_sample: int = 2) -> Row:
        """One row over the samples of `rows` (rounds of the same row): exact percentiles."""
        if not rows:
            raise ValueError("no rows to merge")
        hist = Histogram.merged(r.hist for r in rows)
        total_ns = sum(r.total_ns for r in rows)
        return cls.from_hist(rows[0].name, rows[0].what, hist, total_ns, msgs_per_sample)


def samples_array(n: int) -> array[int]:
    return array("Q", bytes(8 * n))


def print_table(
    title: str,
    rows: list[Row],
    ratios: dict[str, dict[str, float]],
    refs: list[str],
    file: Any = None,
) -> None:
    """A fixed-width table; `ratios[row][ref]` is the row's p50 over the reference's."""
    file = file or sys.stdout
    print(title, file=file)
    head = f"{'name':<20} {'min':>8} {'p50':>8} {'p99':>8} {'p99.9':>8} {'max':>9} {'msgs/s':>11}"
    widths = [max(10, len(ref) + 5) for ref in refs]
    for ref, w in zip(refs, widths, strict=True):
        head += f" {'p50/' + ref:>{w}}"
    print(head, file=file)
    for r in rows:
        line = (
            f"{r.name:<20} {r.min_us:8.2f} {r.p50_us:8.2f} {r.p99_us:8.2f} {r.p999_us:8.2f} "
            f"{r.max_us:9.1f} {r.msgs_per_s:11,.0f}"
        )
        for ref, w in zip(refs, widths, strict=True):
            value = ratios.get(r.name, {}).get(ref)
            cell = f"{value:.2f}x" if value is not None else "-"
            line += f" {cell:>{w}}"
        print(line, file=file)


JSON_FIELDS = (
    "name",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "msgs_per_s",
    "min_us",
    "mean_us",
    "stddev_us",
    "p90_us",
    "n",
    "what",
)


def row_dict(r: Row) -> dict[str, Any]:
    return {k: getattr(r, k) for k in JSON_FIELDS}


def dump_json(rows: list[Row], extra: dict[str, Any] | None = None) -> str:
    return json.dumps({"results": [row_dict(r) for r in rows], **(extra or {})}, indent=2)
