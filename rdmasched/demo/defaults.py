"""The demo's defaults by its size: the most nodes, nodes per leaf, liveness; and the demo's
configuration from the options of `rdmasched demo` (which `bench all` runs too).

The simulator's calibration (sim/report.py) runs the same cluster the demo runs by default,
from the same functions.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rdmasched.demo.runner import DemoConfig

#: every node is a process on this host (about 24 MB resident each, measured; the central
#: baseline adds its coordinator): 64 take 1.6 GB, and a full mesh of 64 is 4,032 lanes of
#: 16.6 KB in /dev/shm. The bound is the cores: on 2 vCPUs 32 full-mesh nodes already take a
#: 7 ms step to hundreds of ms; past 64 one host only measures its own CPU contention
#: (docs/SCALE.md section 8 has the measured runs)
DEMO_MAX_NODES = 64
#: up to this many demo nodes the cluster defaults hold (heartbeat 50 ms, dead after 500 ms);
#: above, a node process can wait longer than 500 ms for a core of a small host and would be
#: declared dead (a 32-node run on 2 cores: thousands of false deaths, the steps stalled)
DEMO_QUIET_NODES = 16
#: the demo's default nodes per leaf: its nodes run in a generated topology (lanes to their
#: links, relays, the sync tree, liveness over links) unless --full-mesh; up to 8 nodes one
#: leaf holds them all (each is linked to every other, through the same code path)
DEMO_DEFAULT_LEAF = 8


def liveness(
    nodes: int, heartbeat_ms: int | None = None, dead_after_ms: int | None = None
) -> tuple[int, int]:
    """The demo's heartbeat period and dead-peer time, ms: as given, else by its size."""
    quiet = nodes <= DEMO_QUIET_NODES
    hb = heartbeat_ms or (50 if quiet else 100)
    dead = dead_after_ms or max(500 if quiet else 5000, 3 * hb)
    return hb, dead


def leaf(nodes: int, leaf: int | None = None, full_mesh: bool = False) -> int | None:
    """The demo's nodes per leaf: `leaf`, else min(nodes, DEMO_DEFAULT_LEAF); None with
    `full_mesh` (no topology)."""
    if full_mesh:
        return None
    return leaf if leaf is not None else min(nodes, DEMO_DEFAULT_LEAF)


def demo_config(args: argparse.Namespace) -> DemoConfig:
    """The demo's configuration from the options of `rdmasched demo`."""
    from rdmasched.demo.job import WorkloadConfig
    from rdmasched.demo.runner import DemoConfig

    w = WorkloadConfig(
        steps=args.steps,
        compute_ms=args.compute_ms,
        jitter=args.jitter,
        sync_ms=args.sync_ms,
        background_ms=args.background_ms,
        seed=args.seed,
    )
    hb, dead = liveness(args.nodes, args.heartbeat_ms, args.dead_after_ms)
    return DemoConfig(
        nodes=args.nodes,
        slots=args.exec_slots,
        spin_us=args.spin_us,
        workload=w,
        trace_dir=args.trace,
        leaf=leaf(args.nodes, args.leaf, args.full_mesh),
        pod=args.pod,
        heartbeat_ms=hb,
        dead_after_ms=dead,
    )
