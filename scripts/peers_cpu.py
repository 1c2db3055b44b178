"""rdmasched's row of `bench peers` alone, for looking into it (docs/PERFORMANCE-LOG.md, "The
client hub's reader thread"): a diagnostic, not a benchmark (the ratios against Ray and Dask
are `rdmasched bench peers`'s).

    .venv/bin/python scripts/peers_cpu.py a [--spin-us N] [--tasks 20000]
    .venv/bin/python scripts/peers_cpu.py c [--spin-us N] [--samples 150] [--nice -10]

`a`: workload a (no-op tasks, 32 in flight on each of 4 clients) and the CPU it took, thread
by thread, from /proc/<pid>/task/*/stat (utime + stime) of the daemon and its clients;
threads are named by `py-spy dump` when py-spy is installed (Python does not name its
threads for the kernel), else listed by process. `c`: workload c (a high-priority no-op
submitted while every slot runs 50 ms low-priority tasks): its submit -> start p50/p90/p99.
`--nice N` sets the daemon's threads' nice (N < 0 needs root) before the workload.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys


def _ticks(pid: int) -> dict[int, int]:
    """CPU ticks of each thread of `pid` (utime + stime)."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                s = f.read()
        except OSError:
            continue
        fields = s[s.rindex(")") + 2 :].split()
        out[int(t)] = int(fields[11]) + int(fields[12])
    return out


def _names(pid: int) -> dict[int, str]:
    """Thread id -> Python thread name, from `py-spy dump` (empty without py-spy)."""
    spy = shutil.which("py-spy") or shutil.which(
        os.path.join(os.path.dirname(sys.executable), "py-spy")
    )
    if spy is None:
        return {}
    out = subprocess.run([spy, "dump", "-p", str(pid)], capture_output=True, text=True).stdout
    return {int(m[1]): m[2] for m in re.finditer(r'Thread (\d+) \([^)]*\): "([^"]+)"', out)}


def main() -> int:
    from rdmasched.bench import peers
    from rdmasched.stats import percentile_us

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", choices=("a", "c"))
    ap.add_argument("--spin-us", type=int, default=None, help="daemon and clients")
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--nice", type=int, default=None, help="the daemon's threads' nice")
    args = ap.parse_args()
    p = peers.Params(tasks=args.tasks, preempt_samples=args.samples)
    r = peers._Rdmasched(p, args.spin_us)
    try:
        if args.nice is not None:
            for t in os.listdir(f"/proc/{r.daemon.pid}/task"):
                os.setpriority(os.PRIO_PROCESS, int(t), args.nice)
        r.warmup()
        print(f"load {os.getloadavg()[0]:.2f}; spin {args.spin_us}; nice {args.nice}")
        if args.workload == "c":
            lat = r.preempt()["lat_ns"]
            p50, p90, p99 = (percentile_us(lat, x) or 0.0 for x in (50, 90, 99))
            print(f"c: submit -> start p50 {p50:.0f} p90 {p90:.0f} p99 {p99:.0f} us (n={len(lat)})")
            return 0
        pids: dict[str, int] = {"daemon": r.daemon.pid}
        pids.update((f"client{k}", int(x.pid or 0)) for k, x in enumerate(r.procs))
        before = {k: _ticks(v) for k, v in pids.items()}
        res = r.throughput()
        after = {k: _ticks(v) for k, v in pids.items()}
        names = {k: _names(v) for k, v in pids.items()}
        hz = os.sysconf("SC_CLK_TCK")
        n = res["tasks"]
        split: dict[tuple[str, str], float] = collections.defaultdict(float)
        for k in pids:
            for tid, v in after[k].items():
                name = names[k].get(tid, "?")
                name = "work (the benchmark's pool)" if name.startswith("work") else name
                who = "daemon" if k == "daemon" else "clients"
                split[(who, name)] += (v - before[k].get(tid, 0)) / hz
        total = sum(split.values())
        print(
            f"a: {n} tasks in {res['run_s']:.2f} s = {n / res['run_s']:,.0f}/s; CPU {total:.2f} s "
            f"= {total / n * 1e6:.0f} us a task, {n / total:,.0f} tasks/CPU-s"
        )
        for (who, name), s in sorted(split.items(), key=lambda x: -x[1]):
            print(f"  {who:8s} {name:28s} {s:6.2f} s {s / n * 1e6:6.1f} us a task")
    finally:
        r.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
