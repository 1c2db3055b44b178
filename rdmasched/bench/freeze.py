"""Freeze and thaw latency of OS-enforced preemption, against CPU-hungry co-located work.

`python -m rdmasched.bench.freeze` (later `rdmasched bench freeze`). A real co-located job
(a process pool of `workers` processes compressing data with zlib, all burning CPU, in its
own session) is held by a `rdmasched.integrations.freeze.Freezer`, and frozen and thawed
`repetitions` times per mechanism: cgroup v2 (``cgroup.freeze``) and SIGSTOP/SIGCONT,
alternating in rounds over the same job so both see the same load. Measured:

- freeze latency: `Freezer.freeze()` called -> every process confirmed stopped
  (cgroup.events ``frozen 1`` / every thread 'T' in /proc);
- thaw latency: `Freezer.thaw()` called -> confirmed running (``frozen 0`` / no 'T').

And, `checks` times per mechanism, that it is real: the CPU time of every held process
(utime + stime in /proc/<pid>/stat, and the ns of /proc/<pid>/schedstat) does not move
while frozen for `check_ms` (from SETTLE_S after the freeze: see there), and moves again
after the thaw.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from rdmasched.errors import ArgumentError, ArgumentTypeError, RdmaschedError
from rdmasched.integrations.freeze import (
    MECHANISMS,
    Freezer,
    cgroup_available,
    descendants,
    proc_table,
    read_stat,
)
from rdmasched.stats import Histogram

PROG = "python -m rdmasched.bench.freeze"
DEADLINE_S = 60.0
_BLOCK = b"".join(
    b"%d,%x;step %d loss %.4f\n" % (i, i * 7919, i % 97, 1 / (i + 1)) for i in range(8000)
)


# ---- the co-located job ----------------------------------------------------------------------
def _compress(i: int) -> int:
    import zlib

    return len(zlib.compress(_BLOCK[i % 64 :], 6))


def workload_main(workers: int) -> None:
    """The co-located job: a pool of `workers` processes compressing data forever."""
    import itertools
    import multiprocessing as mp

    with mp.get_context("fork").Pool(workers) as pool:
        for _ in pool.imap_unordered(_compress, itertools.count(), chunksize=1):
            pass


def _start_workload(workers: int) -> subprocess.Popen[bytes]:
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    code = f"from rdmasched.bench.freeze import workload_main; workload_main({workers})"
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, start_new_session=True, stdin=subprocess.DEVNULL
    )


def _stop_workload(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


# ---- measuring -------------------------------------------------------------------------------
def _cpu(pids: Sequence[int]) -> tuple[int, int]:
    """(clock ticks of utime + stime from /proc/<pid>/stat, on-CPU ns from schedstat)."""
    ticks = ns = 0
    for p in pids:
        st = read_stat(p)
        if st is not None:
            ticks += st.utime + st.stime
        with contextlib.suppress(OSError, ValueError, IndexError):
            ns += int(Path(f"/proc/{p}/schedstat").read_text().split()[0])
    return ticks, ns


def summary_us(samples_ns: Sequence[int]) -> dict[str, float]:
    """n, min, mean, stddev, p50, p90, p99, p999, p9999, max of a sample, us
    (rdmasched.stats, the project's one percentile implementation)."""
    return Histogram(samples_ns).summary()


def _cycles(fz: Freezer, n: int, hold_s: float, gap_s: float, out: dict[str, list[int]]) -> None:
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        fz.freeze()
        t1 = clock()
        time.sleep(hold_s)
        t2 = clock()
        fz.thaw()
        t3 = clock()
        out["freeze"].append(t1 - t0)
        out["thaw"].append(t3 - t2)
        time.sleep(gap_s)


#: after freeze() returns, the last task may still be on its way into the scheduler: the
#: kernel counts a task frozen (cgroup) or stopped ('T') just before it calls schedule(),
#: so a few microseconds of kernel time can still be charged; the check starts after this
SETTLE_S = 0.05


def _check(fz: Freezer, check_s: float) -> dict[str, Any]:
    """Frozen: no CPU time at all over check_s (after SETTLE_S). Thawed: CPU time moves."""
    fz.freeze()
    pids = fz.pids()
    z = _cpu(pids)
    time.sleep(SETTLE_S)
    a = _cpu(pids)
    time.sleep(check_s)
    b = _cpu(pids)
    fz.thaw()
    t0 = time.monotonic()
    while _cpu(pids)[0] <= b[0]:  # a clock tick (10 ms of CPU) at least
        if time.monotonic() - t0 > DEADLINE_S:
            break
        time.sleep(0.001)
    resumed = time.monotonic() - t0
    c = _cpu(pids)
    time.sleep(check_s)
    d = _cpu(pids)
    return {
        "processes": len(pids),
        "settle_ns": a[1] - z[1],
        "frozen_ticks": b[0] - a[0],
        "frozen_ns": b[1] - a[1],
        "resumed_ms": resumed * 1000 if resumed <= DEADLINE_S else None,
        "running_ticks": d[0] - c[0],
        "running_ns": d[1] - c[1],
    }


def _int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an integer, not {value!r}")
    if value < low:
        raise ArgumentError(f"{name} must be >= {low}, not {value}")
    return value


def _ms(name: str, value: object, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentTypeError(f"{name} must be a number of ms, not {value!r}")
    if value < 0 or (positive and value == 0):
        raise ArgumentError(f"{name} must be {'> 0' if positive else '>= 0'}, not {value}")
    return float(value)


def run(
    repetitions: int = 200,
    workers: int = 2,
    hold_ms: float = 2.0,
    gap_ms: float = 10.0,
    rounds: int = 2,
    checks: int = 3,
    check_ms: float = 300.0,
    mechanisms: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Measure; returns the figures as a dict (see `print_report`).

    `mechanisms` None means both, the cgroup one left out (with the reason) where it is
    not usable; naming "cgroup" where it is not usable raises `FreezerUnavailableError`
    (or `FreezePermissionError`). Bad arguments raise `ArgumentError`.
    """
    _int("repetitions", repetitions, 1)
    _int("workers", workers, 1)
    _int("rounds", rounds, 1)
    _int("checks", checks, 0)
    hold_s = _ms("hold_ms", hold_ms) / 1000
    gap_s = _ms("gap_ms", gap_ms) / 1000
    check_s = _ms("check_ms", check_ms, positive=True) / 1000
    strict = mechanisms is not None
    mechs = list(MECHANISMS) if mechanisms is None else list(dict.fromkeys(mechanisms))
    if not mechs or any(m not in MECHANISMS for m in mechs):
        raise ArgumentError(f"mechanisms must be among {', '.join(MECHANISMS)}, not {mechs}")
    unavailable: dict[str, str] = {}
    if "cgroup" in mechs:
        ok, why = cgroup_available()
        if not ok:
            if strict:
                Freezer("cgroup").close()  # raises the precise error
            unavailable["cgroup"] = why
            mechs.remove("cgroup")

    load0 = os.getloadavg()
    proc = _start_workload(workers)
    try:
        end = time.monotonic() + DEADLINE_S
        while len(descendants([proc.pid], proc_table())) < workers:
            if proc.poll() is not None or time.monotonic() > end:
                raise RdmaschedError(f"the co-located job did not start {workers} workers")
            time.sleep(0.01)
        samples: dict[str, dict[str, list[int]]] = {m: {"freeze": [], "thaw": []} for m in mechs}
        progress: dict[str, list[dict[str, Any]]] = {m: [] for m in mechs}
        held: dict[str, int] = {}
        per_round = [repetitions // rounds + (r < repetitions % rounds) for r in range(rounds)]
        per_check = [checks // rounds + (r < checks % rounds) for r in range(rounds)]
        for r in range(rounds):
            for m in mechs:
                with Freezer(m) as fz:
                    fz.add(proc.pid)
                    held[m] = len(fz.pids())
                    _cycles(fz, 2, hold_s, gap_s, {"freeze": [], "thaw": []})  # warm-up
                    _cycles(fz, per_round[r], hold_s, gap_s, samples[m])
                    for _ in range(per_check[r]):
                        progress[m].append(_check(fz, check_s))
    finally:
        _stop_workload(proc)
    load1 = os.getloadavg()

    results: dict[str, Any] = {}
    verified = True
    for m in mechs:
        checks_m = progress[m]
        ok = all(
            c["frozen_ticks"] == 0 and c["frozen_ns"] == 0 and c["resumed_ms"] is not None
            for c in checks_m
        )
        verified &= ok
        results[m] = {
            "processes": held[m],
            "freeze_us": summary_us(samples[m]["freeze"]),
            "thaw_us": summary_us(samples[m]["thaw"]),
            "checks": checks_m,
            "no_progress_while_frozen_and_resumed": ok,
        }
    return {
        "workers": workers,
        "repetitions": repetitions,
        "rounds": rounds,
        "hold_ms": hold_s * 1000,
        "gap_ms": gap_s * 1000,
        "check_ms": check_s * 1000,
        "cpus": len(os.sched_getaffinity(0)),
        "loadavg_before": list(load0),
        "loadavg_after": list(load1),
        "mechanisms": results,
        "unavailable": unavailable,
        "verified": verified,
    }


def print_report(r: dict[str, Any], file: Any = None) -> None:
    file = file or sys.stdout
    mechs = r["mechanisms"]
    procs = ", ".join(f"{m} {v['processes']}" for m, v in mechs.items())
    print(
        f"freeze/thaw of a co-located zlib pool ({r['workers']} workers burning CPU; processes "
        f"held: {procs}); {r['repetitions']} cycles per mechanism in {r['rounds']} rounds, "
        f"held {r['hold_ms']:g} ms, {r['gap_ms']:g} ms between; {r['cpus']} CPUs, load "
        f"{r['loadavg_before'][0]:.1f} -> {r['loadavg_after'][0]:.1f}",
        file=file,
    )
    print(
        f"{'mechanism':<10} {'op':<7} {'n':>5} {'min':>9} {'p50':>9} {'p90':>9} {'p99':>9} "
        f"{'max':>10}  (us)",
        file=file,
    )
    for m, v in mechs.items():
        for op in ("freeze", "thaw"):
            s = v[f"{op}_us"]
            print(
                f"{m:<10} {op:<7} {s['n']:>5} {s['min']:9.1f} {s['p50']:9.1f} {s['p90']:9.1f} "
                f"{s['p99']:9.1f} {s['max']:10.1f}",
                file=file,
            )
    for m, v in mechs.items():
        cs = v["checks"]
        if not cs:
            continue
        frozen = ", ".join(f"+{c['frozen_ticks']} ticks/+{c['frozen_ns']} ns" for c in cs)
        settle = max(c["settle_ns"] for c in cs)
        resumed = ", ".join(
            "never" if c["resumed_ms"] is None else f"{c['resumed_ms']:.0f} ms" for c in cs
        )
        running = ", ".join(f"+{c['running_ticks']} ticks" for c in cs)
        verdict = "ok" if v["no_progress_while_frozen_and_resumed"] else "FAILED"
        print(
            f"{m}: CPU time while frozen {r['check_ms']:g} ms: {frozen} (before that, at most "
            f"+{settle} ns as the last task entered the scheduler); thawed: moving again "
            f"after {resumed}, then {running} per {r['check_ms']:g} ms: {verdict}",
            file=file,
        )
    for m, why in r["unavailable"].items():
        print(f"{m}: not measured: {why}", file=file)


# ---- command line ----------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not the usage
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, not {text}")
    return value


def _millis(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of ms, not {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of ms >= 0, not {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options, for this module's parser and for a `rdmasched bench freeze` one."""
    p.add_argument(
        "--repetitions",
        type=_positive,
        default=200,
        help="freeze/thaw cycles per mechanism",
    )
    p.add_argument(
        "--workers",
        type=_positive,
        default=2,
        help="zlib processes of the co-located job",
    )
    p.add_argument(
        "--hold-ms",
        type=_millis,
        default=2.0,
        help="how long each freeze is held",
    )
    p.add_argument(
        "--gap-ms",
        type=_millis,
        default=10.0,
        help="running time between cycles",
    )
    p.add_argument(
        "--rounds",
        type=_positive,
        default=2,
        help="rounds alternating the mechanisms",
    )
    p.add_argument(
        "--checks",
        type=_count,
        default=3,
        help="no-progress checks per mechanism",
    )
    p.add_argument(
        "--check-ms",
        type=_millis,
        default=300.0,
        help="how long each check watches",
    )
    p.add_argument(
        "--mechanism",
        nargs="+",
        choices=MECHANISMS,
        default=None,
        help="mechanisms to measure (default both, cgroup left out with the reason where "
        "it is not usable; naming it makes that an error)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(p)
    return p


def cli(args: argparse.Namespace, prog: str = PROG) -> int:
    """Run from parsed arguments; 0 if verified, 1 if a check failed, 2 on an error."""
    try:
        r = run(
            args.repetitions,
            args.workers,
            args.hold_ms,
            args.gap_ms,
            args.rounds,
            args.checks,
            args.check_ms,
            args.mechanism,
        )
    except RdmaschedError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print_report(r)
    return 0 if r["verified"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    return cli(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
