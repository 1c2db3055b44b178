"""`rdmasched topology`: build a topology, choose each node's links within the lane budget,
verify them, and print lanes, QPs and ring memory per node and the hops (docs/SCALE.md).

The options are None unless given: the defaults below are taken then, and `--config` keeps
its file's budget unless `--budget` is given.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from rdmasched import limits
from rdmasched.commands.args import int_range, lane_slots, node_counts
from rdmasched.errors import ConfigError
from rdmasched.topology import (
    DEFAULT_BUDGET,
    DEFAULT_SLOTS_PER_LANE,
    LANE_HEADER_BYTES,
    SLOT_BYTES,
    Report,
    Topology,
    check_leaf_pod,
    verify,
)

HELP = "lanes, QPs and ring memory per node and the hop bound of a cluster topology"
#: the defaults of a generated topology and of its verification
NODES, LEAF, POD = 1024, 32, 1024
EXHAUSTIVE, SOURCES, BFS = 2048, 4, 2

_at_least_0 = int_range(0)
_at_least_1 = int_range(1)


def add_arguments(topo: argparse.ArgumentParser) -> None:
    topo.description = (
        "Build a topology (generated, --config TOML or --slurm topology.conf), "
        "choose each node's links within the lane budget and verify them: lanes, RC QPs and "
        "ring memory per node, and the hops of every checked route (docs/SCALE.md)."
    )
    tsrc = topo.add_mutually_exclusive_group()
    tsrc.add_argument("--config", metavar="FILE", help="a TOML file with a [topology] table")
    tsrc.add_argument("--slurm", metavar="FILE", help="a Slurm topology.conf (tree plugin)")
    topo.add_argument(
        "--nodes",
        type=int_range(1, limits.MAX_NODES),
        help=f"generate this many nodes (default {NODES})",
    )
    topo.add_argument(
        "--sizes",
        type=node_counts,
        metavar="N,N,...",
        help="generate and verify one topology per size (e.g. 1k,10k,100k) and print one "
        "table row each: lanes, QPs and ring memory per node, hops, targets missed (default "
        "off: one topology)",
    )
    topo.add_argument(
        "--leaf", type=_at_least_1, help=f"generated: nodes per leaf switch (default {LEAF})"
    )
    topo.add_argument(
        "--pod",
        type=_at_least_1,
        help=f"generated: nodes per pod, a multiple of --leaf (default {POD})",
    )
    topo.add_argument(
        "--budget",
        type=_at_least_1,
        help=f"most lanes (and RC QPs) per node (default {DEFAULT_BUDGET})",
    )
    topo.add_argument(
        "--lane-slots",
        type=lane_slots,
        help=f"slots per lane, as cluster.slots_per_lane (default {DEFAULT_SLOTS_PER_LANE})",
    )
    topo.add_argument(
        "--exhaustive",
        metavar="N",
        type=_at_least_0,
        help=f"check every (src, dst) route up to N nodes, else sample sources (default "
        f"{EXHAUSTIVE})",
    )
    topo.add_argument(
        "--sources",
        type=_at_least_1,
        help=f"above --exhaustive: sources whose routes are all checked (default {SOURCES})",
    )
    topo.add_argument(
        "--bfs", type=_at_least_0, help=f"sources of a BFS over the links (default {BFS})"
    )
    topo.add_argument("--json", action="store_true", help="print JSON instead of text")


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--sizes and --nodes/--leaf/--pod generate; --config and --slurm read a topology."""
    if args.sizes is not None and (args.config or args.slurm or args.nodes is not None):
        other = "--config" if args.config else "--slurm" if args.slurm else "--nodes"
        parser.error(f"--sizes generates its topologies; it cannot be combined with {other}")
    generated = [o for o in ("nodes", "leaf", "pod") if getattr(args, o) is not None]
    if (args.config or args.slurm) and generated:
        parser.error(
            f"--{generated[0]} generates a topology; it cannot be combined with "
            f"{'--config' if args.config else '--slurm'}"
        )
    if not (args.config or args.slurm):
        try:
            check_leaf_pod(_or(args.leaf, LEAF), _or(args.pod, POD))
        except ConfigError as exc:
            parser.error(str(exc))


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _verify(args: argparse.Namespace, topo: Topology) -> Report:
    return verify(
        topo,
        slots_per_lane=_or(args.lane_slots, DEFAULT_SLOTS_PER_LANE),
        exhaustive_limit=_or(args.exhaustive, EXHAUSTIVE),
        sources=_or(args.sources, SOURCES),
        bfs_sources=_or(args.bfs, BFS),
    )


def main(args: argparse.Namespace) -> int:
    """Build, plan, verify, print. A topology that cannot be built raises ConfigError."""
    budget = _or(args.budget, DEFAULT_BUDGET)
    if args.sizes is not None:
        return _sizes(args, budget)
    if args.config:
        topo = Topology.load(args.config, budget=args.budget)
    elif args.slurm:
        topo = Topology.load_slurm(args.slurm, budget=budget)
    else:
        topo = Topology.generate(
            _or(args.nodes, NODES), _or(args.leaf, LEAF), _or(args.pod, POD), budget=budget
        )
    rep = _verify(args, topo)
    if args.json:
        print(json.dumps(rep.as_dict(), indent=2))
    else:
        print(format_report(rep))
    return 0


def _sizes(args: argparse.Namespace, budget: int) -> int:
    """`rdmasched topology --sizes 1k,10k,100k`: one generated topology per size, verified
    as one `--nodes` run verifies it, printed as one table row each (docs/SCALE.md 6)."""
    reports = [
        _verify(args, Topology.generate(n, _or(args.leaf, LEAF), _or(args.pod, POD), budget=budget))
        for n in args.sizes
    ]
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    else:
        print(format_table(reports))
    return 0


def table_row(r: Report) -> list[str]:
    """A report as a row of docs/SCALE.md's figures table (after the N column)."""
    return [
        r.scheme,
        f"{r.max_lanes} / {r.mean_lanes:.1f}",
        str(r.max_qps),
        _mib(r.max_ring_bytes),
        str(r.hop_bound),
        str(max(r.max_hops, r.bfs_max_distance)),
        str(r.max_hops_one_dead),
    ]


def format_table(reports: Sequence[Report]) -> str:
    """Reports as a Markdown table: lanes, QPs and ring memory per node, hops, targets."""
    head = (
        "| N | plan | lanes max / mean | RC QPs max | ring memory max | hop bound "
        "| max hops checked | first relay dead | targets missed |"
    )
    lines = [head, "|---:|---|---|---|---|---|---|---|---|"]
    for r in reports:
        missed = [k for k, ok in r.targets().items() if not ok]
        cells = [f"{r.nodes:,}", *table_row(r), ", ".join(missed) or "none"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mib(b: float) -> str:
    return f"{b / (1 << 20):.2f} MiB"


def format_report(r: Report) -> str:
    if r.scheme == "leaf-dragonfly":
        how = f"leaf mesh + rail-aligned gateways, {r.copies} link(s) per pair of leaves"
    else:
        how = f"leaf mesh + rail planes, plane groups of <= {r.group_leaves} leaves in a pod"
    lines = [
        f"topology: {r.nodes} nodes, {r.leaves} leaves (largest {r.largest_leaf}), {r.pods} pods",
        f"links: {r.scheme} ({how}); budget {r.budget} lanes per node",
        f"lanes per node (one RC QP each): max {r.max_lanes}, mean {r.mean_lanes:.1f}, "
        f"min {r.min_lanes}",
        f"RC QPs per node: max {r.max_qps}, mean {r.mean_qps:.1f}",
        f"ring memory per node: max {_mib(r.max_ring_bytes)}, mean {_mib(r.mean_ring_bytes)} "
        f"(inbound lanes x ({r.slots_per_lane} slots x {SLOT_BYTES} B + "
        f"{LANE_HEADER_BYTES} B header))",
        f"hops: bound {r.hop_bound}; max {r.max_hops} over {r.paths_checked} routes "
        f"({r.path_check}); BFS from {r.bfs_sources} sources: max {r.bfs_max_distance}; "
        f"first relay dead: max {r.max_hops_one_dead}"
        + (f" ({r.no_alternative} pairs without an alternative)" if r.no_alternative else ""),
        "targets: " + ", ".join(f"{k} {'ok' if ok else 'MISSED'}" for k, ok in r.targets().items()),
    ]
    return "\n".join(lines)
