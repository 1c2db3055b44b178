"""The DDP example's managed step under two settings, A/B in interleaved pairs
(docs/PERFORMANCE-LOG.md, "The slice, and one host's order"): a setting one run apart is
inside this machine's noise (alone's step moves 40-55 ms between runs), so each round runs
training alone, then A and B in alternating order (ABBA), and the ratios are taken within
the round.

    .venv/bin/python scripts/ddp_env_ab.py --rounds 10 [--steps 80] [--json-out F] \
        [--mode managed] [--a RDMASCHED_SLICE_US=] [--b RDMASCHED_SLICE_US=100] \
        [-- EXTRA ddp_train.py ARGS]

`--a`/`--b`: space-separated settings for the managed run: VAR=VALUE, a variable of its
environment (VAR= sets it empty, which the launcher's variables read as unset), or --FLAG,
an argument of ddp_train.py (as `--b=--sync-takes-slot`). The default `--a` is the kernel's
own slice, `--b` a 100 us slice for the control path's threads; `--b RDMASCHED_SLICE_US=`
makes an A/A run, the noise alone. `--mode`: the managed mode to run (managed, or
managed-freeze). Prints each round and the medians; `--json-out` keeps every run's summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_train.py"


def _settings(text: str) -> tuple[dict[str, str], list[str]]:
    """`text`'s variables (VAR=VALUE) and ddp_train.py arguments (--FLAG)."""
    env, argv = {}, []
    for part in text.split():
        if part.startswith("--"):
            argv.append(part)
            continue
        name, eq, value = part.partition("=")
        if not eq or not name:
            raise SystemExit(f"ddp_env_ab: {part!r} is neither VAR=VALUE nor --FLAG")
        env[name] = value
    return env, argv


def _run(mode: str, env: dict[str, str], steps: int, extra: list[str]) -> dict[str, Any] | None:
    """One `ddp_train.py --compare --repeat 1 --modes MODE` run; its summary row, or None
    (one line on stderr, its round left out) if the run failed."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run.json"
        argv = [sys.executable, str(EXAMPLE), "--compare", "--repeat", "1", "--steps", str(steps)]
        argv += ["--modes", mode, *extra, "--json-out", str(out)]
        p = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True)
        if p.returncode != 0 or not out.exists():
            last = (p.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"ddp_env_ab: a {mode} run failed (exit {p.returncode}): {last}", file=sys.stderr)
            return None
        summary = json.loads(out.read_text())["summary"]
    row: dict[str, Any] = summary[next(iter(summary))]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--a", default="RDMASCHED_SLICE_US=", help="A's settings (VAR=VALUE ...)")
    p.add_argument("--b", default="RDMASCHED_SLICE_US=100", help="B's settings (VAR=VALUE ...)")
    p.add_argument("--mode", choices=("managed", "managed-freeze"), default="managed")
    p.add_argument("--json-out", default=None)
    p.add_argument("extra", nargs="*", help="after --: more ddp_train.py arguments")
    args = p.parse_args()
    a, b = _settings(args.a), _settings(args.b)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load0 = os.getloadavg()[0]
    rounds = []
    failed = 0
    for r in range(args.rounds):
        alone = _run("alone", {}, args.steps, args.extra)
        order = [("a", a), ("b", b)] if r % 2 == 0 else [("b", b), ("a", a)]
        got = {
            name: _run(args.mode, env, args.steps, [*args.extra, *flags])
            for name, (env, flags) in order
        }
        if alone is None or got["a"] is None or got["b"] is None:
            failed += 1
            print(f"round {r + 1}: left out (a run failed)", flush=True)
            continue
        row = {
            "alone_ms": alone["step_ms"][0],
            "a_ms": got["a"]["step_ms"][0],
            "b_ms": got["b"]["step_ms"][0],
            "a_harvest": got["a"]["harvested_over_idle"][0],
            "b_harvest": got["b"]["harvested_over_idle"][0],
            # CPU-seconds a second: the daemon, and rdmasched's threads in the ranks
            "a_daemon_cpus": got["a"]["daemon_cpus"][0],
            "b_daemon_cpus": got["b"]["daemon_cpus"][0],
            "a_threads_cpus": got["a"]["rdmasched_threads_cpus"][0],
            "b_threads_cpus": got["b"]["rdmasched_threads_cpus"][0],
        }
        rounds.append(row)
        print(
            f"round {r + 1}: alone {row['alone_ms']:.1f} ms, A {row['a_ms']:.1f} "
            f"({row['a_ms'] / row['alone_ms']:.3f}x), B {row['b_ms']:.1f} "
            f"({row['b_ms'] / row['alone_ms']:.3f}x), B / A {row['b_ms'] / row['a_ms']:.3f}",
            flush=True,
        )

    if not rounds:
        raise SystemExit("ddp_env_ab: every round failed")

    def med(num: str, den: str) -> float:
        return statistics.median(x[num] / x[den] for x in rounds)

    ba = [x["b_ms"] / x["a_ms"] for x in rounds]
    print(
        f"{started}, load {load0:.1f} -> {os.getloadavg()[0]:.1f}, {len(rounds)} rounds "
        f"({failed} left out: a run failed); "
        f"A = {args.a!r}, B = {args.b!r}\n"
        f"median step / alone's: A {med('a_ms', 'alone_ms'):.3f}, B {med('b_ms', 'alone_ms'):.3f}; "
        f"median B / A {statistics.median(ba):.3f} ({min(ba):.3f}-{max(ba):.3f}); "
        f"harvested / idle, median: A {statistics.median(x['a_harvest'] for x in rounds):.0%}, "
        f"B {statistics.median(x['b_harvest'] for x in rounds):.0%}; "
        f"daemon CPUs, median: A {statistics.median(x['a_daemon_cpus'] for x in rounds):.3f}, "
        f"B {statistics.median(x['b_daemon_cpus'] for x in rounds):.3f}; rdmasched's threads "
        f"in the ranks: A {statistics.median(x['a_threads_cpus'] for x in rounds):.3f}, "
        f"B {statistics.median(x['b_threads_cpus'] for x in rounds):.3f}"
    )
    if args.json_out:
        meta = {"started": started, "load": [load0, os.getloadavg()[0]], "a": args.a, "b": args.b}
        meta["mode"] = args.mode
        meta["failed_rounds"] = failed
        meta["command"] = " ".join(["scripts/ddp_env_ab.py", *sys.argv[1:]])
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True)
        meta["commit"] = head.stdout.decode().strip()
        Path(args.json_out).write_text(json.dumps({"meta": meta, "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
