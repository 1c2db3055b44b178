"""`rdmasched demo`: a local cluster under rdmasched and under a central scheduler, side by
side (rdmasched/demo/)."""

from __future__ import annotations

import argparse
import json
import os

from rdmasched.commands.args import (
    UserError,
    add_exec_slots,
    check_liveness,
    dead_after_ms,
    heartbeat_ms,
    int_range,
    jitter,
    json_flag,
    ms,
    spin_us,
)
from rdmasched.demo.defaults import (
    DEMO_DEFAULT_LEAF,
    DEMO_MAX_NODES,
    DEMO_QUIET_NODES,
    demo_config,
    liveness,
)

HELP = "a local cluster under rdmasched and under a central scheduler, same workload, side by side"


def add_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument(
        "--nodes",
        type=int_range(1, DEMO_MAX_NODES, "a number of node processes on this host"),
        default=4,
        help="node processes on this host (each holds lanes to its topology links)",
    )
    demo.add_argument(
        "--leaf",
        type=int_range(1, DEMO_MAX_NODES, "a number of nodes per leaf"),
        help="rdmasched's nodes run in a generated topology with this many nodes per leaf "
        f"switch: each node holds lanes only to its links (default min(--nodes, "
        f"{DEMO_DEFAULT_LEAF}))",
    )
    demo.add_argument(
        "--full-mesh",
        action="store_true",
        help="instead: no topology, every node holds a lane to every other (the small-cluster "
        "path: all-to-all sync and heartbeats)",
    )
    demo.add_argument(
        "--pod",
        type=int_range(1, DEMO_MAX_NODES, "a number of nodes per pod"),
        help="with --leaf: nodes per pod, a multiple of --leaf (default one pod)",
    )
    demo.add_argument(
        "--heartbeat-ms",
        type=heartbeat_ms,
        help=f"rdmasched nodes' heartbeat period, ms (default 50 up to {DEMO_QUIET_NODES} "
        "nodes, 100 above)",
    )
    demo.add_argument(
        "--dead-after-ms",
        type=dead_after_ms,
        help=f"a peer silent this long is dead, ms (default 500 up to {DEMO_QUIET_NODES} "
        "nodes, 5000 above: N processes share this host's cores)",
    )
    add_exec_slots(demo, 4, "execution slots (GPUs) per node")
    demo.add_argument("--steps", type=int_range(1, 10_000_000), default=200, help="training steps")
    demo.add_argument("--compute-ms", type=ms, default=4.0, help="compute task length, ms")
    demo.add_argument(
        "--jitter",
        type=jitter,
        default=0.25,
        help="compute task length varies by +- this fraction, in [0, 1)",
    )
    demo.add_argument("--sync-ms", type=ms, default=1.0, help="gradient sync task length, ms")
    demo.add_argument("--background-ms", type=ms, default=2.0, help="background task length, ms")
    demo.add_argument(
        "--spin-us",
        type=spin_us,
        default=50,
        help="how long a node spins after a message before it sleeps, us",
    )
    demo.add_argument("--seed", type=int, default=1, help="seed of the workload's randomness")
    json_flag(demo)
    demo.add_argument(
        "--trace",
        metavar="DIR",
        help="write every node's decision events as JSON lines into DIR (created if missing)",
    )


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.full_mesh and (args.leaf or args.pod) is not None:
        parser.error("--full-mesh takes no --leaf or --pod (it has no topology)")
    if args.pod is not None and args.leaf is None:
        parser.error("--pod needs --leaf (the nodes per leaf of the topology)")
    if args.leaf is not None and args.pod is not None:
        from rdmasched.errors import ConfigError
        from rdmasched.topology import check_leaf_pod

        try:
            check_leaf_pod(args.leaf, args.pod, "--leaf/--pod")
        except ConfigError as exc:
            parser.error(str(exc))
    hb, dead = liveness(args.nodes, args.heartbeat_ms, args.dead_after_ms)
    check_liveness(parser, hb, dead)
    if args.trace is not None and os.path.exists(args.trace) and not os.path.isdir(args.trace):
        parser.error(f"--trace {args.trace}: not a directory")


def main(args: argparse.Namespace) -> int:
    from rdmasched.bench.output import run_info
    from rdmasched.demo.runner import print_report, run, summary

    if args.trace is not None:
        try:
            os.makedirs(args.trace, exist_ok=True)
        except OSError as exc:
            raise UserError(f"--trace {args.trace}: {exc.strerror}") from None
        if not os.access(args.trace, os.W_OK | os.X_OK):
            raise UserError(f"--trace {args.trace}: not writable")
    cfg = demo_config(args)
    if cfg.leaf is not None:  # a bad topology is one line here, not an error in 2N processes
        from rdmasched.cluster import local_cluster

        local_cluster(cfg.nodes, cfg.slots, leaf=cfg.leaf, pod=cfg.pod)
    res = run(cfg, progress=True)
    if args.json:
        # the summary's figures are each mode's own; its ratios go with central's
        ratios = {k: v["central/rdmasched"] for k, v in summary(res).items()}
        res["central"]["central/rdmasched"] = ratios
        print(json.dumps(res | run_info(vars(args)), indent=2))
    else:
        print_report(cfg, res)
    return 0
