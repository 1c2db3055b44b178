"""The trace replay's two targets as figures (docs/SIM.md, "Trace replay"):

    python -m rdmasched.sim.tracefig TRACE [--nodes N] [--mode host|device|kernels]
                                     [--gbps G] [--steps S]

prints one JSON document: the trace's own step as its device ran it, the replayed step of
one job alone (no background work) under fifo and rdmasched and its error, device idle
(the trace's and the replay's, per stream), and the priority gain of the simulator beside
the small model's (rdmasched.workload.critpath) on the same trace. `--gbps G` runs every
collective on the link model of a G Gb/s network (10 us a message) instead of its measured
time; so does a `--nodes` past the traced world size (on the ib preset without `--gbps`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rdmasched.demo.job import WorkloadConfig
from rdmasched.errors import RdmaschedError
from rdmasched.sim.linkmodel import PRESETS, Level, LinkModel
from rdmasched.sim.run import Run, SimConfig
from rdmasched.workload import load
from rdmasched.workload.critpath import replay
from rdmasched.workload.streams import MODES, Mode

#: a message's latency on the `--gbps` network, ns (an Ethernet switch hop and NIC)
ETH_LATENCY_NS = 10_000


def ethernet(gbps: float) -> LinkModel:
    """A flat network of `gbps` Gb/s and ETH_LATENCY_NS at every level."""
    return replace(
        PRESETS["ib"],
        name=f"eth{gbps:g}",
        levels=(Level(ETH_LATENCY_NS, gbps * 1e9 / 8),) * 4,
        source=f"a {gbps:g} Gb/s network, {ETH_LATENCY_NS} ns a message (tracefig --gbps)",
    )


def figures(
    path: str, nodes: int = 0, mode: Mode = "host", gbps: float | None = None, steps: int = 8
) -> dict[str, Any]:
    wl = load(path)
    n = nodes or wl.world_size or 2
    links = ethernet(gbps) if gbps else PRESETS["ib"]
    runs: dict[str, dict[str, Any]] = {}
    sync_ns: dict[int, int] = {}
    for sched in ("fifo", "rdmasched"):
        cfg = SimConfig(
            nodes=n,
            scheduler=sched,
            workload=WorkloadConfig(steps=steps, background_backlog=0),
            links=links,
            trace=wl,
            trace_mode=mode,
            link_model=gbps is not None,
        )
        run = Run(cfg)
        r = run.run()
        sync_ns = run.sync_ns
        runs[sched] = {
            k: r.get(k)
            for k in (
                "finished",
                "step_time_ms",
                "slot_idle_pct",
                "device_idle_pct",
                "stream_idle_pct",
                "preemptions",
            )
        }
    own = wl.device_steps_ns()
    own_ms = sum(own) / len(own) / 1e6 if own else None
    idle = [s.device_idle_pct for s in wl.steps if s.device_idle_pct]
    trace_idle = {k: sum(x[k] for x in idle) / len(idle) for k in idle[0]} if idle else {}
    launch = replay(wl, "launch", steps, sync_ns, mode)
    prio = replay(wl, "priority", steps, sync_ns, mode)
    fifo, rdms = runs["fifo"]["step_time_ms"], runs["rdmasched"]["step_time_ms"]

    def gain(a: float, b: float) -> float:
        return 100.0 * (a - b) / a

    return {
        "trace": path,
        "device": wl.device,
        "world_size": wl.world_size,
        "nodes": n,
        "mode": mode,
        "links": links.as_dict(),
        "collectives": "link model" if gbps is not None or n > (wl.world_size or 0) else "measured",
        "steps": steps,
        "trace_device_steps_ms": [x / 1e6 for x in own],
        "trace_step_ms": own_ms,
        "trace_device_idle_pct": trace_idle,
        "replay": runs,
        "replay_error_pct": 100.0 * (fifo / own_ms - 1) if own_ms else None,
        "model": {
            "launch_step_ms": launch.step_ns / 1e6,
            "priority_step_ms": prio.step_ns / 1e6,
            "critical_path_launch": list(launch.critical_path),
        },
        "priority_gain_pct": {
            "sim": gain(fifo, rdms),
            "model": gain(launch.step_ns, prio.step_ns),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rdmasched.sim.tracefig", description=__doc__)
    p.add_argument("trace")
    p.add_argument("--nodes", type=int, default=0, help="nodes (default the traced world)")
    p.add_argument("--mode", choices=MODES, default="host")
    p.add_argument("--gbps", type=float, help="collectives on a network of this many Gb/s")
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args(argv)
    if args.nodes < 0 or args.steps < 1 or (args.gbps is not None and not args.gbps > 0):
        p.error("--nodes >= 0, --steps >= 1, --gbps > 0")
    try:
        out = figures(args.trace, args.nodes, args.mode, args.gbps, args.steps)
    except RdmaschedError as exc:
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
