"""`rdmasched bench all`: every benchmark and the demo in one run, each with the defaults of
its own command; the figures go to one JSON file with the date, the machine and the commit,
so that a figure quoted anywhere can be traced to a run and the run repeated.

`markdown(doc)` renders the tables the README shows from such a file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from rdmasched.bench.common import row_dict
from rdmasched.bench.output import commit, machine

#: the benchmarks, in the order they run, with the arguments `--quick` adds (a tenth)
BENCHES: dict[str, tuple[list[str], list[str]]] = {
    "latency": (
        ["bench", "latency", "--rows", "rdmasched-shm", "rdmasched-shm-hot", "rdmasched-shm-c",
         "c-shm-floor", "zmq-ipc", "unix-socket"],
        ["--iterations", "20000", "--slow-iterations", "2000"],
    ),
    "throughput": (["bench", "throughput"], ["--messages", "200000"]),
    "scheduler": (["bench", "scheduler"], ["--decisions", "100000"]),
    "preempt": (["bench", "preempt"], ["--preempts", "2000"]),
    "idle": (["bench", "idle"], ["--seconds", "1"]),
    "demo": (["demo"], ["--steps", "20"]),
}  # fmt: skip


def _progress(text: str) -> None:
    print(f"bench all: {text}", file=sys.stderr, flush=True)


def run(
    parser: argparse.ArgumentParser,
    json_out: str,
    quick: bool = False,
    extra: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Run every benchmark, write the figures to `json_out`, return them.

    `extra`: more arguments for some benchmarks, by name (the tests make them small)."""
    from rdmasched.bench import idle, latency, preempt, scheduler, throughput
    from rdmasched.demo.defaults import demo_config
    from rdmasched.demo.runner import run as run_demo

    figures: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
        "throughput": throughput.from_args,
        "scheduler": scheduler.from_args,
        "preempt": preempt.from_args,
        "idle": idle.from_args,
    }
    started = time.monotonic()
    doc: dict[str, Any] = {
        "command": "rdmasched bench all --json-out FILE" + (" --quick" if quick else ""),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "commit": commit(),
        "quick": quick,
        "arguments": {},
        "figures": {},
    }
    for name, (argv, quick_argv) in BENCHES.items():
        args = parser.parse_args(argv + (quick_argv if quick else []) + (extra or {}).get(name, []))
        doc["arguments"][name] = {
            k: v for k, v in sorted(vars(args).items()) if k not in ("command", "bench")
        }
        _progress(f"{name} ({' '.join(argv[:2])}) ...")
        t0 = time.monotonic()
        if name == "latency":
            r = latency.from_args(args, quiet=True)
            fig: dict[str, Any] = {
                "rows": [row_dict(row) for row in r["results"]],
                "ratios_p50_median_of_rounds": r["ratios_p50_median_of_rounds"],
                "rounds": r["rounds"],
                "cores": r["cores"],
            }
        elif name == "demo":
            fig = run_demo(demo_config(args), progress=True)
        else:
            fig = figures[name](args)
        fig["seconds"] = round(time.monotonic() - t0, 1)
        doc["figures"][name] = fig
    doc["duration_s"] = round(time.monotonic() - started, 1)
    doc["machine"]["loadavg_1_5_15_after"] = list(os.getloadavg())
    with open(json_out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    return doc


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def markdown(doc: dict[str, Any]) -> str:
    """The README's figure tables, from a `bench all` JSON file."""
    m, c, fig = doc["machine"], doc["commit"], doc["figures"]
    out = [
        f"Run {doc['date']} on {m['cpu_model']} ({m['nproc']} CPUs, kernel {m['kernel']}, "
        f"load {m['loadavg_1_5_15'][0]:.2f} at the start), commit "
        f"{(c['commit'] or '?')[:12]}{' (modified)' if c['dirty'] else ''}, "
        f"{doc['duration_s']:.0f} s: `{doc['command']}`",
        "",
    ]
    d = fig.get("demo")
    if d:
        a, z = d["rdmasched"], d["central"]
        out += [
            "| `rdmasched demo` | rdmasched | central | central / rdmasched |",
            "|---|---:|---:|---:|",
        ]
        for label, key, fmt in (
            ("slot idle %", "slot_idle_pct", "{:.2f}"),
            ("step time, ms", "step_time_ms", "{:.2f}"),
            ("preemption reaction p50, us", "preempt_reaction_p50_us", "{:.0f}"),
            ("preemption reaction p99, us", "preempt_reaction_p99_us", "{:.0f}"),
            ("messages/s, cluster", "msgs_per_s", "{:,.0f}"),
        ):
            va, vz = a.get(key), z.get(key)
            ratio = f"{vz / va:.2f}x" if va and vz else "-"
            out.append(f"| {label} | {_f(va, fmt)} | {_f(vz, fmt)} | {ratio} |")
        out.append("")
    lat = fig.get("latency")
    if lat:
        out += [
            "| `bench latency` row | p50, us | p99, us | p50 / floor (median of rounds) |",
            "|---|---:|---:|---:|",
        ]
        for row in lat["rows"]:
            r = lat["ratios_p50_median_of_rounds"].get(row["name"], {}).get("c-shm-floor")
            out.append(
                f"| {row['name']} | {row['p50_us']:.2f} | {row['p99_us']:.2f} | "
                f"{_f(r, '{:.2f}x')} |"
            )
        z = lat["ratios_p50_median_of_rounds"].get("zmq-ipc", {}).get("rdmasched-shm")
        if z:
            out += ["", f"zmq-ipc is {z:.0f}x slower than rdmasched-shm (p50, median of rounds)."]
        out.append("")
    out += ["| bench | figure |", "|---|---|"]
    t = fig.get("throughput")
    if t:
        cells = "; ".join(
            f"{r['name']} (batch {r['batch']}) {r['msgs_per_s'] / 1e6:.2f} M msgs/s"
            for r in t["results"]
        )
        out.append(f"| `bench throughput` (one lane) | {cells} |")
    s = fig.get("scheduler")
    if s:
        comp, py = s["results"]
        out.append(
            f"| `bench scheduler` | {comp['decisions_per_s'] / 1e6:.2f} M decisions/s "
            f"({comp['implementation']}); {py['decisions_per_s'] / 1e6:.2f} M as plain Python "
            f"({s['speedup']:.2f}x) |"
        )
    p = fig.get("preempt")
    if p:
        out.append(
            f"| `bench preempt` (PREEMPT written -> handler entered, node polling) | "
            f"p50 {p['reaction_p50_us']:.1f} us, p99 {p['reaction_p99_us']:.1f} us, "
            f"p99.9 {p['reaction_p999_us']:.1f} us |"
        )
    i = fig.get("idle")
    if i:
        pct = i["cpu_pct_per_node"]
        out.append(
            f"| `bench idle` ({i['nodes']} idle nodes, {i['seconds']:g} s) | "
            f"{min(pct):.2f}-{max(pct):.2f}% of a core per node |"
        )
    return "\n".join(out)
