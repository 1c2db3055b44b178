"""`rdmasched bench stages`: instructions per message of each stage of the daemon's path,
counted by callgrind, so a figure can be compared from run to run and machine to machine
(instruction counts do not depend on the machine's noise; times do).

The path is the real one: two `Node`s in one process over shm, node 0 writes N PREEMPTs into
node 1's lane, then node 1's loop (`Node.run`, the loop and driver every daemon runs) takes
them: each preempts node 1's running task, whose preempt handler returns at once, and the
task starts again, ready for the next one. The lane holds all N, so `LaneSet.wait` never
waits for a message. The run happens once per stage, under `valgrind --tool=callgrind
--collect-atstart=no`, with a `StageCounter` probe on node 1 (rdmasched/daemon/probe.py) that
turns counting on at the stage's first point and off at the next: the run's total is that
stage's instructions. One more run ("calibrate") counts what a probe's on/off pair costs by
itself; it is subtracted, once per pair. Per message = (total - pairs x pair cost) / N.

`python -m rdmasched.bench.stages STAGE N` is one run (what valgrind runs); `run()` runs them
all and needs valgrind and the rdmasched._callgrind module (built where valgrind's headers
are).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from rdmasched.daemon.probe import STAGES, StageCounter
from rdmasched.stats import Histogram

#: stage -> what its instructions are (docs/PERFORMANCE.md)
WHAT = {
    "poll": "LaneSet.wait: slots read and checked, Message objects made (per message of a batch)",
    "handoff": "the loop hands the message to the driver (Node._on_message)",
    "core": "NodeCore.receive: the fields read, the scheduler's decision, its effects",
    "driver": "the driver carries out the effects up to the preempt handler's call",
    "after": "the handler's return: NodeCore.preempted, the task started again",
}
CALIBRATE = "calibrate"


def _config(n: int) -> Any:
    from rdmasched.cluster import ClusterConfig

    slots = 1
    while slots < 2 * n + 64:
        slots <<= 1
    return ClusterConfig.from_dict(
        {
            "cluster": {
                "name": f"st{uuid.uuid4().hex[:8]}",
                "transport": "shm",
                "slots_per_lane": slots,
                # no timer and no liveness decision during the run (valgrind is ~50x slower)
                "heartbeat_ms": 600_000,
                "dead_after_ms": 3_600_000,
            },
            "node": [{"name": "n0", "slots": 1}, {"name": "n1", "slots": 1}],
        },
        source="bench stages",
    )


def open_pair(n: int, events: int = 4096) -> tuple[Any, Any]:
    """Nodes 0 and 1 of `_config(n)` in this process, opened (each waits for the other's
    lanes, so node 0 opens on a thread); both stopped again if either fails."""
    from rdmasched.daemon.node import Node

    cfg = _config(n)
    a = Node(cfg, 0, spin_us=0, events=events)
    b = Node(cfg, 1, spin_us=0, events=events)
    opened: list[BaseException] = []

    def open_a() -> None:
        try:
            a.open()
        except BaseException as exc:  # reported below
            opened.append(exc)

    t = threading.Thread(target=open_a)
    t.start()
    b.open()
    t.join()
    if opened:
        b.stop()
        raise opened[0]
    return a, b


def one(stage: str, n: int) -> dict[str, Any]:
    """One run: the path for `n` PREEMPTs with `stage` counted (in this process)."""

    if stage == CALIBRATE:
        counter = StageCounter("core")
        for _ in range(n):
            counter.mark(2)
            counter.mark(3)
        return {"stage": stage, "pairs": counter.count, "n": n}
    counter = StageCounter(stage)
    a, b = open_pair(n)
    try:
        b.on_dispatch(lambda task, slot: None)
        b.on_preempt(lambda task, slot, cancel: task.progress_ns + 1)
        b.dispatch(1, job=1, priority=10, cost_ns=10**12)
        for _ in range(n):
            a.preempt(1, node=1)
        assert a.loop is not None
        a.loop.run_pending()  # node 0 writes the N PREEMPTs into node 1's lane
        b.probe = counter
        b.run(until=lambda: b.reactions.count >= n)
        b.probe = None
        return {"stage": stage, "pairs": counter.count, "n": b.reactions.count}
    finally:
        b.stop()
        a.stop()


class _Pair:
    """Two `Node`s in this process over shm, as in `one`, for `telemetry_cost`: node 1 runs
    one task; `turn(k)` has node 0 write k PREEMPTs of it into node 1's lane, then times (on
    the thread's CPU clock) node 1's loop taking them: the PREEMPT path up to the handler,
    and the task's restart.  ``gaps``: per PREEMPT of a turn but its first, the wall-clock
    time from the previous handler call to this one (one PREEMPT's path, back to back)."""

    def __init__(self, k: int, events: int) -> None:
        self.a, self.b = open_pair(k, events)
        self.b.on_dispatch(lambda task, slot: None)
        self.entered: list[int] = []
        self.gaps: list[int] = []
        entered = self.entered

        def handler(task: Any, slot: int, cancel: bool) -> int:
            entered.append(time.perf_counter_ns())
            return int(task.progress_ns) + 1

        self.b.on_preempt(handler)
        self.b.dispatch(1, job=1, priority=10, cost_ns=10**12)

    def turn(self, k: int) -> int:
        a, b = self.a, self.b
        assert a.loop is not None
        for _ in range(k):
            a.preempt(1, node=1)
        a.loop.run_pending()
        target = b.reactions.count + k
        entered = self.entered
        entered.clear()
        t0 = time.thread_time_ns()
        b.run(until=lambda: b.reactions.count >= target)
        took = time.thread_time_ns() - t0
        self.gaps.extend(entered[i] - entered[i - 1] for i in range(1, len(entered)))
        return took

    def close(self) -> None:
        try:
            self.b.stop()
        finally:
            self.a.stop()


def telemetry_cost(
    n: int = 50_000, turn: int = 500, *, rounds: int = 3, events: int = 4096
) -> dict[str, Any]:
    """The CPU time of the PREEMPT path (as `one` drives it: lane, loop, scheduler, preempt
    handler, the task's restart) with the event rings on (``events``) and off, side by
    side: two pairs of nodes in this process, driven in turns of ``turn`` PREEMPTs, which
    goes first alternating, each turn timed on the thread's CPU clock (as `bench scheduler
    --telemetry-cost` does).  ``rounds`` runs of ``n`` PREEMPTs a setting.  ``ratio``: CPU
    time per PREEMPT on / off over every turn; ``pair_ratio_p50`` and ``pair_ratio_p99``:
    the median and 99th percentile over the pairs of turns of on time / off time;
    ``gap_p50_us``/``gap_p99_us``: of the wall-clock time from one preempt handler call to
    the next within a turn (one PREEMPT's path: what its reaction is on top of the lane's
    transit), and ``gap_p99_ratio`` on / off."""
    cpu = {True: 0, False: 0}
    done = {True: 0, False: 0}
    pairs: list[float] = []
    gaps = {True: Histogram(), False: Histogram()}
    recorded = {True: 0, False: 0}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            rigs: dict[bool, _Pair] = {}
            try:
                for on in (True, False):
                    rigs[on] = _Pair(turn, events if on else 0)
                for k in range(max(1, n // turn)):
                    took = {}
                    for on in (True, False) if k % 2 == 0 else (False, True):
                        took[on] = rigs[on].turn(turn)
                        cpu[on] += took[on]
                        done[on] += turn
                    if took[True] > 0 and took[False] > 0:
                        pairs.append(took[True] / took[False])
                for on, rig in rigs.items():
                    gaps[on].merge(Histogram(rig.gaps))
                    recorded[on] += rig.b.scheduler.events_recorded
            finally:
                for rig in rigs.values():
                    rig.close()
    finally:
        if gc_was_enabled:
            gc.enable()
    pairs.sort()
    per = {on: cpu[on] / done[on] for on in (True, False)}
    g = {on: gaps[on].summary() for on in (True, False)}
    return {
        "events": events,
        "rounds": rounds,
        "turn": turn,
        "preempts": done[True],
        "turns": len(pairs),
        "events_on": {
            "cpu_ns_per_preempt": round(per[True]),
            "gap_p50_us": g[True]["p50"],
            "gap_p99_us": g[True]["p99"],
            "events_recorded": recorded[True],
        },
        "events_off": {
            "cpu_ns_per_preempt": round(per[False]),
            "gap_p50_us": g[False]["p50"],
            "gap_p99_us": g[False]["p99"],
            "events_recorded": recorded[False],
        },
        "gap_p99_ratio": g[True]["p99"] / g[False]["p99"],
        "ratio": per[True] / per[False],
        "pair_ratio_p50": pairs[len(pairs) // 2] if pairs else None,
        "pair_ratio_p99": pairs[min(len(pairs) - 1, len(pairs) * 99 // 100)] if pairs else None,
    }


_TOTALS = re.compile(r"^(?:totals|summary):\s+(\d+)", re.M)


def _valgrind(stage: str, n: int, tmp: str) -> tuple[int, dict[str, Any]]:
    out = os.path.join(tmp, f"callgrind.{stage}")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "rdmasched.bench.stages",
        stage,
        str(n),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    info = json.loads(r.stdout.strip().splitlines()[-1])
    with open(out) as f:
        m = _TOTALS.search(f.read())
    if m is None:
        raise RuntimeError(f"no totals in callgrind's output {out}")
    return int(m.group(1)), info


def available() -> str | None:
    """None if `run` can run here, else why not."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (Debian: apt-get install valgrind)"
    try:
        from rdmasched import _callgrind  # noqa: F401
    except ImportError:
        return (
            "rdmasched._callgrind is not built (valgrind's headers were missing at build "
            "time): install valgrind and rebuild (python setup.py build_ext --inplace)"
        )
    return None


def run(n: int = 20_000, stages: tuple[str, ...] = tuple(STAGES)) -> dict[str, Any]:
    """Instructions per message of each stage (see the module text)."""
    why = available()
    if why is not None:
        from rdmasched.errors import RdmaschedError

        raise RdmaschedError(f"bench stages: {why}")
    with tempfile.TemporaryDirectory(prefix="rdmasched-stages-") as tmp:
        cal_total, cal = _valgrind(CALIBRATE, n, tmp)
        pair = cal_total / max(1, cal["pairs"])
        rows = {}
        for stage in stages:
            total, info = _valgrind(stage, n, tmp)
            if info["n"] < n:
                raise RuntimeError(f"stage {stage}: {info['n']} of {n} PREEMPTs handled")
            rows[stage] = {
                "instructions_per_message": (total - pair * info["pairs"]) / n,
                "total": total,
                "pairs": info["pairs"],
                "what": WHAT[stage],
            }
    return {
        "messages": n,
        "probe_pair_instructions": pair,
        "stages": rows,
        "path_instructions_per_message": sum(r["instructions_per_message"] for r in rows.values()),
    }


def main(argv: list[str]) -> int:
    stage, n = argv[0], int(argv[1])
    print(json.dumps(one(stage, n)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def from_args(args: argparse.Namespace) -> dict[str, Any]:
    """`rdmasched bench stages`'s figures from its parsed options (the command prints them,
    `bench all` stores them)."""
    return run(args.messages)
