"""The `rdmasched` command: bench, doctor, and (with the daemon) demo and trace.

Argument checking happens here, before anything starts; the work lives in the modules the
subcommands call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _slots(text: str) -> int:
    value = int(text)
    if value < 16 or value > (1 << 20) or value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two in 16..{1 << 20}, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from rdmasched.bench import latency

    p = argparse.ArgumentParser(prog="rdmasched", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmarks that print figures")
    bsub = bench.add_subparsers(dest="bench", required=True)
    lat = bsub.add_parser("latency", help="round trip of a 64-byte message, with baselines")
    lat.add_argument("--transport", choices=["shm", "verbs"], default="shm")
    lat.add_argument(
        "--rows",
        nargs="+",
        choices=latency.ROWS,
        default=list(latency.ROWS),
        metavar="ROW",
        help=f"rows to measure (default all: {', '.join(latency.ROWS)})",
    )
    lat.add_argument(
        "--iterations",
        type=_positive,
        default=200_000,
        help="round trips per shm row, over all rounds (default 200000)",
    )
    lat.add_argument(
        "--slow-iterations",
        type=_positive,
        default=20_000,
        help="round trips for the kernel-based rows zmq-ipc, unix-socket",
    )
    lat.add_argument("--warmup", type=int, default=2_000, help="round trips discarded first")
    lat.add_argument(
        "--rounds",
        type=_positive,
        default=5,
        help="interleaved rounds; ratios are taken within a round (default 5)",
    )
    lat.add_argument("--slots", type=_slots, default=256, help="lane size in slots")
    lat.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sched = bsub.add_parser("scheduler", help="scheduling decisions per second on one core")
    sched.add_argument("--decisions", type=_positive, default=1_000_000)
    sched.add_argument("--slots", type=_positive, default=8)
    sched.add_argument("--json", action="store_true")

    pre = bsub.add_parser("preempt", help="preemption reaction through the node daemon")
    pre.add_argument("--preempts", type=_positive, default=20_000)
    pre.add_argument("--interval-us", type=_positive, default=200, help="time between PREEMPTs")
    pre.add_argument(
        "--spin-us",
        type=int,
        default=5_000,
        help="how long the preempted node spins after a message",
    )
    pre.add_argument("--json", action="store_true")

    idle = bsub.add_parser("idle", help="CPU an idle node daemon costs")
    idle.add_argument("--nodes", type=_positive, default=4)
    idle.add_argument("--seconds", type=float, default=5.0)
    idle.add_argument("--spin-us", type=int, default=200)
    idle.add_argument("--json", action="store_true")

    tput = bsub.add_parser("throughput", help="one lane's messages/s, per message and batched")
    tput.add_argument("--messages", type=_positive, default=2_000_000)
    tput.add_argument("--batch", type=_positive, default=256, help="batch size for the batch API")
    tput.add_argument("--slots", type=_slots, default=1024)
    tput.add_argument("--json", action="store_true")

    demo = sub.add_parser(
        "demo",
        help="a local cluster under rdmasched and under a central "
        "scheduler, same workload, side by side",
    )
    demo.add_argument("--nodes", type=_positive, default=4)
    demo.add_argument("--slots", type=_positive, default=4, help="execution slots per node")
    demo.add_argument("--steps", type=_positive, default=200, help="training steps")
    demo.add_argument("--compute-ms", type=float, default=4.0)
    demo.add_argument(
        "--jitter", type=float, default=0.25, help="compute task length varies by +- this fraction"
    )
    demo.add_argument("--sync-ms", type=float, default=1.0)
    demo.add_argument("--background-ms", type=float, default=2.0)
    demo.add_argument(
        "--spin-us",
        type=int,
        default=50,
        help="how long a node spins after a message before it sleeps",
    )
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument("--json", action="store_true")
    demo.add_argument(
        "--trace", metavar="DIR", help="write every node's decision events as JSON lines into DIR"
    )

    trace = sub.add_parser(
        "trace",
        help="print decision events (JSON lines) written by "
        "`rdmasched demo --trace DIR`, merged in time order",
    )
    trace.add_argument("dir")
    trace.add_argument("--task", type=int, help="only the events that name this task")

    # --transport verbs (rdmasched/bench/verbs_latency.py): inside the Soft-RoCE VM
    lat.add_argument(
        "--device",
        default=None,
        help="verbs: RDMA device (default: $RDMASCHED_DEVICE, else the first)",
    )
    lat.add_argument(
        "--gid-index",
        type=int,
        default=None,
        help="verbs: GID index (default: $RDMASCHED_GID_INDEX, else RoCE v2 IPv4)",
    )
    lat.add_argument(
        "--perftest-iterations",
        type=_positive,
        default=None,
        help="verbs: ib_write_lat iterations per round (default: as rdmasched)",
    )

    doc = sub.add_parser("doctor", help="RDMA devices, ports, GIDs; is Soft-RoCE usable here")
    doc.add_argument("--json", action="store_true", help="print JSON instead of text")

    # values are checked in cmd_topology (one line on stderr), not by argparse types
    topo = sub.add_parser(
        "topology",
        help="lanes, QPs and ring memory per node and the hop bound of a cluster topology",
        description="Build a topology (generated, --config TOML or --slurm topology.conf), "
        "choose each node's links within the lane budget and verify them: lanes, RC QPs and "
        "ring memory per node, and the hops of every checked route (docs/SCALE.md).",
    )
    tsrc = topo.add_mutually_exclusive_group()
    tsrc.add_argument("--config", metavar="FILE", help="a TOML file with a [topology] table")
    tsrc.add_argument("--slurm", metavar="FILE", help="a Slurm topology.conf (tree plugin)")
    topo.add_argument("--nodes", help="generate this many nodes (default 1024)")
    topo.add_argument("--leaf", help="generated: nodes per leaf switch (default 32)")
    topo.add_argument("--pod", help="generated: nodes per pod, a multiple of --leaf (default 1024)")
    topo.add_argument("--budget", help="most lanes (and RC QPs) per node (default 64)")
    topo.add_argument("--slots", help="slots per lane, as cluster.slots_per_lane (default 256)")
    topo.add_argument(
        "--exhaustive",
        metavar="N",
        help="check every (src, dst) route up to N nodes, else sample sources (default 2048)",
    )
    topo.add_argument(
        "--sources", help="above --exhaustive: sources whose routes are all checked (default 4)"
    )
    topo.add_argument("--bfs", help="sources of a BFS over the links (default 2)")
    topo.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def cmd_bench_latency(args: argparse.Namespace) -> int:
    from rdmasched.bench import latency
    from rdmasched.bench.common import dump_json, pick_cores, print_table

    if args.transport == "verbs":
        from rdmasched.bench import verbs_latency

        return verbs_latency.main(args)
    rows = list(args.rows)

    def progress(r: int, name: str, row: object) -> None:
        if not args.json:
            print(
                f"  round {r + 1}/{args.rounds}: {name:<18} p50 {row.p50_us:7.2f} us",  # type: ignore[attr-defined]
                file=sys.stderr,
            )

    results, per_round = latency.run(
        rows, args.iterations, args.slow_iterations, args.warmup, args.rounds, args.slots, progress
    )
    refs = [r for r in ("c-shm-floor", "rdmasched-shm") if r in rows]
    ratios = {
        row.name: {
            ref: statistics.median(latency.round_ratios(per_round, row.name, ref)) for ref in refs
        }
        for row in results
    }
    cores = pick_cores()
    if args.json:
        print(
            dump_json(
                results,
                {
                    "ratios_p50_median_of_rounds": ratios,
                    "rounds": args.rounds,
                    "cores": list(cores),
                },
            )
        )
        return 0
    print_table(
        f"rdmasched bench latency: round trip (us) of a 64-byte message each way, two "
        f"processes pinned to cores {cores}, {args.rounds} interleaved rounds\n"
        f"msgs/s counts both directions; ratios are p50/p50 within a round, median of rounds",
        results,
        ratios,
        refs,
    )
    return 0


def cmd_bench_throughput(args: argparse.Namespace) -> int:
    from rdmasched.bench import throughput

    res = [
        throughput.run(args.messages, 1, args.slots),
        throughput.run(args.messages, args.batch, args.slots),
    ]
    if args.json:
        print(json.dumps({"results": res}, indent=2))
        return 0
    print(
        f"rdmasched bench throughput: one shm lane of {args.slots} slots, "
        f"{args.messages} messages, receiver-side rate"
    )
    for r in res:
        print(
            f"  {r['name']:<12} batch {r['batch']:>4}: {r['msgs_per_s']:>13,.0f} msgs/s "
            f"(sender {r['sender_msgs_per_s']:,.0f})"
        )
    return 0


def cmd_bench_scheduler(args: argparse.Namespace) -> int:
    from rdmasched.bench import scheduler

    # The baseline in the same run: the same policy source as plain Python.
    compiled = scheduler.run(args.decisions, args.slots, impl="auto", quiet=True)
    python = scheduler.run(args.decisions, args.slots, impl="python", quiet=True)
    ratio = compiled["decisions_per_s"] / python["decisions_per_s"]
    if args.json:
        print(json.dumps({"results": [compiled, python], "speedup": ratio}, indent=2))
        return 0
    print(
        f"rdmasched bench scheduler: a realistic mix on a fake clock, {args.slots} slots, "
        "one core (rdmasched/bench/scheduler.py)"
    )
    for r in (compiled, python):
        print(
            f"  {r['implementation']:<10} {r['decisions_per_s']:>12,} decisions/s "
            f"({r['ns_per_decision']} ns each; {r['cpu_decisions_per_s']:,} per CPU-second)"
        )
    print(f"  compiled / pure Python: {ratio:.2f}x")
    return 0


def cmd_bench_preempt(args: argparse.Namespace) -> int:
    from rdmasched.bench import preempt

    r = preempt.run(args.preempts, args.interval_us, args.spin_us)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"rdmasched bench preempt: {r['preempts']} PREEMPTs, one every {r['interval_us']} us,"
        f" node spinning {r['spin_us']} us after each message; trigger stamp -> preempt "
        "handler entered"
    )
    print(
        f"  reaction p50 {r['reaction_p50_us']:.2f} us  p99 {r['reaction_p99_us']:.2f} us  "
        f"p99.9 {r['reaction_p999_us']:.2f} us  max {r['reaction_max_us']:.1f} us"
    )
    print(
        f"  C floor one-way (same run) {r['floor_one_way_us']:.3f} us; "
        f"reaction p50 / floor: {r['p50_over_floor']:.1f}x"
    )
    return 0


def cmd_bench_idle(args: argparse.Namespace) -> int:
    from rdmasched.bench import idle

    r = idle.run(args.nodes, args.seconds, args.spin_us)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"rdmasched bench idle: {r['nodes']} idle node daemons for {r['seconds']:g} s "
        f"(heartbeats only, spin {r['spin_us']} us, then sleep on the doorbell)"
    )
    cells = ", ".join(f"{p:.2f}%" for p in r["cpu_pct_per_node"])
    print(f"  CPU per node, % of one core: {cells} (max {r['max_cpu_pct']:.2f}%)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from rdmasched.demo.runner import DemoConfig, print_report, run
    from rdmasched.demo.workload import WorkloadConfig

    if not 0 <= args.jitter < 1:
        raise SystemExit("rdmasched demo: --jitter must be in [0, 1)")
    for name in ("compute_ms", "sync_ms", "background_ms"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"rdmasched demo: --{name.replace('_', '-')} must be > 0")
    w = WorkloadConfig(
        steps=args.steps,
        compute_ms=args.compute_ms,
        jitter=args.jitter,
        sync_ms=args.sync_ms,
        background_ms=args.background_ms,
        seed=args.seed,
    )
    cfg = DemoConfig(
        nodes=args.nodes, slots=args.slots, spin_us=args.spin_us, workload=w, trace_dir=args.trace
    )
    res = run(cfg, progress=True)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_report(cfg, res)
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from rdmasched.demo.runner import read_traces

    for line in read_traces(args.dir, args.task):
        print(line)
    return 0


def cmd_topology(args: argparse.Namespace) -> int:
    from rdmasched import topology
    from rdmasched.errors import ConfigError

    try:
        return topology.cli(args)
    except ConfigError as exc:
        raise SystemExit(f"rdmasched topology: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        from rdmasched import doctor

        return doctor.main(args.json)
    if args.command == "bench":
        return {
            "latency": cmd_bench_latency,
            "throughput": cmd_bench_throughput,
            "scheduler": cmd_bench_scheduler,
            "preempt": cmd_bench_preempt,
            "idle": cmd_bench_idle,
        }[args.bench](args)
    if args.command == "demo":
        return cmd_demo(args)
    if args.command == "trace":
        return cmd_trace(args)
    if args.command == "topology":
        return cmd_topology(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
