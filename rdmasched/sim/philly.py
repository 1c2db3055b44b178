"""Microsoft Philly's GPU-cluster job trace as the multi-job workload (docs/SIM.md,
"Multi-job cluster", "The Philly trace").

The trace is the job table Pollux's artifact derived from Philly's (petuum/adaptdl,
`simulator/traces/philly.csv`; from msr-fiddle/philly-traces, the trace of Jeon et al.,
ATC'19): one job a line, the columns `timestamp,duration,num_gpus,gpu_time,cluster`
(submission time, run time in s, GPUs, GPU-seconds, the virtual cluster's hash). This module
reads it (`read_philly`: bad input is one ArgumentError naming the line) and replays a
window of it as jobs.py's jobs (`PhillyReplay.jobs`):

- a job takes `ceil(num_gpus / GPUS_PER_NODE)` whole nodes (a node is one slot: its GPUs);
- the replayed jobs are the first `count` at or after `start` whose run time is in
  [`min_s`, `max_s`] (the trace's order is by submission);
- arrivals are compressed by the factor that makes the jobs' node-time offer `load` of the
  run's cluster (so one window serves 1,000 and 10,000 nodes at the same load), and then the
  whole replay (arrivals and run times alike) runs `scale` trace seconds per virtual second;
- a step is `step_s` trace seconds (the trace has no steps: an assumption); the trace has no
  priorities: every job is `low`, or, with `high_max_s`, the one-node jobs of at most that
  run time are `high` (an oracle of the run time, in the spirit of Tiresias' least attained
  service first, which favours small short jobs).
"""

from __future__ import annotations

import calendar
import csv
import gzip
import lzma
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rdmasched.errors import ArgumentError
from rdmasched.sim.jobs import HIGH, LOW, MEMBERS_MAX, Job

#: the trace's columns, in its order
COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
#: GPUs of one Philly server (the trace's machine list: "m31,8, 24GB"; docs/SIM.md)
GPUS_PER_NODE = 8
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
S = 1_000_000_000


@dataclass(frozen=True)
class PhillyRow:
    """One job of the trace: submitted at `submit_s` (s since the epoch, the trace's clock),
    run for `duration_s` on `gpus` GPUs; `line` is its line in the file."""

    line: int
    submit_s: int
    duration_s: float
    gpus: int
    cluster: str

    @property
    def nodes(self) -> int:
        return -(-self.gpus // GPUS_PER_NODE)


def parse_philly(lines: Iterable[str], name: str) -> list[PhillyRow]:
    """The rows of a Philly CSV (a header line first), in the file's order. Bad input: an
    ArgumentError naming the line and what it needs."""
    reader = csv.reader(lines)
    try:
        head = next(reader, None)
    except csv.Error as exc:
        raise ArgumentError(f"{name}: {exc}") from None
    if head is None or tuple(h.strip() for h in head) != COLUMNS:
        raise ArgumentError(f"{name}: need the header {','.join(COLUMNS)} (Philly's job table)")
    rows: list[PhillyRow] = []
    try:
        for n, rec in enumerate(reader, 2):
            if not rec:
                continue
            rows.append(_row(rec, n, name))
    except csv.Error as exc:
        raise ArgumentError(f"{name} line {reader.line_num}: {exc}") from None
    if not rows:
        raise ArgumentError(f"{name}: no jobs")
    return rows


def _row(rec: list[str], n: int, name: str) -> PhillyRow:
    need = (
        f"{name} line {n}: need timestamp (YYYY-MM-DD HH:MM:SS), duration (s, > 0), "
        "num_gpus (>= 1), gpu_time, cluster"
    )
    if len(rec) != len(COLUMNS):
        raise ArgumentError(need)
    try:
        submit = calendar.timegm(time.strptime(rec[0].strip(), TIME_FORMAT))
        duration = float(rec[1])
        gpus = int(rec[2])
    except ValueError:
        raise ArgumentError(need) from None
    if not (math.isfinite(duration) and duration > 0 and 1 <= gpus <= MEMBERS_MAX):
        raise ArgumentError(need)
    return PhillyRow(n, submit, duration, gpus, rec[4].strip())


def read_philly(path: str) -> list[PhillyRow]:
    """The rows of the Philly CSV file at `path` (compressed if it ends in .gz or .xz)."""
    try:
        if path.endswith((".gz", ".xz")):
            opener = gzip.open if path.endswith(".gz") else lzma.open
            with opener(path, "rt", newline="") as f:
                return parse_philly(f, path)
        with open(path, newline="") as f:
            return parse_philly(f, path)
    except (OSError, EOFError, UnicodeDecodeError, lzma.LZMAError) as exc:
        raise ArgumentError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class PhillyReplay:
    """A window of the trace replayed as jobs (the module's docstring says how)."""

    rows: tuple[PhillyRow, ...]
    source: str = "philly"
    start: str | None = None
    count: int = 4000
    min_s: float = 60.0
    max_s: float = 3600.0
    load: float = 1.0
    scale: float = 60.0
    step_s: float = 1.0
    high_max_s: float = 0.0

    def check(self) -> None:
        if self.count < 1:
            raise ArgumentError(f"--jobs-count must be >= 1, not {self.count}")
        if not (0 < self.min_s <= self.max_s and math.isfinite(self.max_s)):
            raise ArgumentError("--philly-min-s and --philly-max-s: 0 < min <= max")
        for flag, v in (("--jobs-load", self.load), ("--jobs-scale", self.scale)):
            if not (math.isfinite(v) and v > 0):
                raise ArgumentError(f"{flag} must be > 0, not {v}")
        if not (math.isfinite(self.step_s) and 0 < self.step_s <= self.min_s):
            raise ArgumentError("--philly-step-s: 0 < step <= --philly-min-s")
        if not (math.isfinite(self.high_max_s) and self.high_max_s >= 0):
            raise ArgumentError("--philly-high-max-s must be >= 0")
        self.window()

    def _start_s(self) -> int:
        if self.start is None:
            return min(r.submit_s for r in self.rows)
        try:
            return calendar.timegm(time.strptime(self.start, TIME_FORMAT))
        except ValueError:
            raise ArgumentError(
                f"--philly-start {self.start!r}: need YYYY-MM-DD HH:MM:SS (the trace's clock)"
            ) from None

    def window(self) -> list[PhillyRow]:
        """The replayed rows: the first `count` submitted at or after `start` whose run time
        is in [min_s, max_s], by submission time (then line)."""
        t0 = self._start_s()
        picked = sorted(
            (r for r in self.rows if r.submit_s >= t0 and self.min_s <= r.duration_s <= self.max_s),
            key=lambda r: (r.submit_s, r.line),
        )[: self.count]
        if not picked:
            raise ArgumentError(
                f"{self.source}: no job submitted at or after {self.start or 'the start'} "
                f"runs {self.min_s:g}-{self.max_s:g} s"
            )
        return picked

    def compression(self, nodes: int, rows: list[PhillyRow] | None = None) -> float:
        """The factor arrivals are compressed by so the window's node-time offers `load` of
        `nodes` nodes over its (compressed) arrival span."""
        rows = self.window() if rows is None else rows
        span = rows[-1].submit_s - rows[0].submit_s
        work = sum(r.nodes * r.duration_s for r in rows)
        return self.load * nodes * span / work if span > 0 else 1.0

    def jobs(self, nodes: int, max_nodes: int) -> list[Job]:
        """The window's jobs for a run on `nodes` nodes (a job larger than `max_nodes`:
        an ArgumentError)."""
        rows = self.window()
        big = [r for r in rows if r.nodes > max_nodes]
        if big:
            raise ArgumentError(
                f"{self.source} line {big[0].line}: {big[0].gpus} GPUs take {big[0].nodes} "
                f"nodes; at most {max_nodes} here (the cluster's nodes, and one leaf)"
            )
        k = self.compression(nodes, rows)
        t0 = rows[0].submit_s
        step_ns = max(1, round(self.step_s / self.scale * S))
        out = []
        for i, r in enumerate(rows, 1):
            arrival = round((r.submit_s - t0) / k / self.scale * S)
            steps = max(1, round(r.duration_s / self.step_s))
            high = r.nodes == 1 and r.duration_s <= self.high_max_s
            out.append(Job(i, arrival, r.nodes, steps, step_ns, HIGH if high else LOW))
        return out

    def describe(self, nodes: int) -> dict[str, Any]:
        """What a run on `nodes` nodes replays (its JSON's `jobs_replay`)."""
        rows = self.window()
        k = self.compression(nodes, rows)
        first, last = rows[0].submit_s, rows[-1].submit_s
        return {
            "trace_first_submit": time.strftime(TIME_FORMAT, time.gmtime(first)),
            "trace_last_submit": time.strftime(TIME_FORMAT, time.gmtime(last)),
            "trace_window_h": (last - first) / 3600,
            "trace_node_h": sum(r.nodes * r.duration_s for r in rows) / 3600,
            "arrival_compression": k,
            "virtual_arrivals_s": (last - first) / k / self.scale,
            "trace_s_per_virtual_s": self.scale,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "format": "philly",
            "start": self.start,
            "count": self.count,
            "min_s": self.min_s,
            "max_s": self.max_s,
            "load": self.load,
            "scale": self.scale,
            "step_s": self.step_s,
            "high_max_s": self.high_max_s,
            "gpus_per_node": GPUS_PER_NODE,
        }
