"""`rdmasched bench`: the benchmarks (rdmasched/bench/, docs/BENCH.md), each printed as a
table or as JSON; `bench all` runs them all into one JSON file (bench/suite.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from rdmasched.commands.args import (
    MAX_SECONDS,
    MAX_SPIN_US,
    Parser,
    add_command,
    add_exec_slots,
    add_lane_slots,
    float_range,
    int_range,
    json_flag,
    meta_sizes,
    output_file,
    positive,
    spin_us,
)
from rdmasched.limits import DSCP_DEFAULT, DSCP_MAX, SERVICE_LEVEL_DEFAULT, SERVICE_LEVEL_MAX

HELP = "benchmarks that print figures"
#: `bench idle` keeps its own bound: idle nodes of a full mesh, each beating to every other
IDLE_MAX_NODES = 16


def spin_list(text: str) -> tuple[int | None, ...]:
    """`--rdmasched-spin-us`: comma-separated spins, each `default` (None) or a `spin_us`."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip()
        if part == "":
            raise argparse.ArgumentTypeError(f"{text!r}: an empty item (as default,0)")
        out.append(None if part == "default" else spin_us(part))
    return tuple(out)


def add_arguments(bench: argparse.ArgumentParser) -> None:
    from rdmasched.bench import latency

    bsub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")

    lat = add_command(bsub, "latency", "round trip of a 64-byte message, with baselines")
    lat.add_argument("--transport", choices=["shm", "verbs"], default="shm", help="transport")
    lat.add_argument(
        "--rows",
        nargs="+",
        choices=latency.ROWS,
        default=list(latency.ROWS),
        metavar="ROW",
        help="rows to measure",
    )
    lat.add_argument(
        "--iterations",
        type=positive,
        default=200_000,
        help="round trips per shm row, over all rounds (at least --rounds)",
    )
    lat.add_argument(
        "--slow-iterations",
        type=positive,
        default=20_000,
        help="round trips of the kernel-based rows zmq-ipc, unix-socket (at least --rounds)",
    )
    lat.add_argument(
        "--warmup",
        type=int_range(0, 10_000_000),
        default=2_000,
        help="round trips discarded first, each round",
    )
    lat.add_argument(
        "--rounds",
        type=int_range(1, 1000),
        default=5,
        help="interleaved rounds; ratios are taken within a round",
    )
    add_lane_slots(lat, 256)
    json_flag(lat)
    lat.add_argument(
        "--sizes",
        type=meta_sizes,
        default=None,
        metavar="all|N,N,...",
        help="metadata-size sweep (like perftest's -a): the rows that have a metadata path "
        f"({', '.join(latency.SIZED_ROWS)}) are measured once per size, in bytes of msgpack "
        f"metadata per message; all: {','.join(map(str, latency.SIZES_ALL))}; "
        "None: no metadata",
    )
    lat.add_argument(
        "--duration",
        type=float_range(0.01, MAX_SECONDS),
        default=None,
        metavar="SECONDS",
        help="run each row about this long per round instead of a count of round trips "
        "(the count comes from a short probe of the row): per row and per round, so the "
        "total is about rows x rounds x SECONDS (6 rows x 5 rounds unless --rows or "
        "--rounds say otherwise: 30 x SECONDS), said on stderr before the run; "
        "None: --iterations",
    )
    lat.add_argument(
        "--csv", metavar="FILE", type=output_file(), help="also write every row and round as CSV"
    )
    lat.add_argument(
        "--hdr-log",
        metavar="FILE",
        type=output_file(),
        help="also write an HdrHistogram log (one interval histogram per row and round)",
    )
    lat.add_argument(
        "--plot",
        metavar="FILE.png",
        type=output_file(".png"),
        help="also draw each row's latency CDF and histogram into a PNG (needs matplotlib)",
    )
    # --transport verbs (rdmasched/bench/verbs_latency.py): inside the Soft-RoCE VM
    lat.add_argument(
        "--device",
        default=None,
        help="verbs: RDMA device (None: $RDMASCHED_DEVICE, else the first)",
    )
    lat.add_argument(
        "--gid-index",
        type=int_range(0, 255),
        default=None,
        help="verbs: GID index (None: $RDMASCHED_GID_INDEX, else RoCE v2 IPv4)",
    )
    lat.add_argument(
        "--service-level",
        type=int_range(0, SERVICE_LEVEL_MAX),
        default=SERVICE_LEVEL_DEFAULT,
        help="verbs: the lanes' InfiniBand service level, as the config's verbs.service_level "
        "(ib_write_lat gets --sl with it); the client's on both sides",
    )
    lat.add_argument(
        "--dscp",
        type=int_range(0, DSCP_MAX),
        default=DSCP_DEFAULT,
        help="verbs: the lanes' RoCE v2 DSCP, as the config's verbs.dscp (ib_write_lat gets "
        "--tclass=4*DSCP); the client's on both sides",
    )
    two = lat.add_mutually_exclusive_group()
    two.add_argument(
        "--server",
        action="store_true",
        help="verbs, two hosts: be the echo side and wait for one --client (as perftest's "
        "server; the client gives the parameters)",
    )
    two.add_argument(
        "--client",
        metavar="HOST",
        default=None,
        help="verbs, two hosts: measure against the --server at HOST; None: both sides here",
    )
    lat.add_argument(
        "--port",
        type=int_range(1, 65_000),
        default=None,
        help="verbs, two hosts: the control port (rows use the next three); None: 18520",
    )
    lat.add_argument(
        "--perftest-iterations",
        type=positive,
        default=None,
        help="verbs: ib_write_lat iterations per round (None: as rdmasched)",
    )

    tput = add_command(bsub, "throughput", "one lane's messages/s, per message and batched")
    tput.add_argument(
        "--messages", type=int_range(1, 10**9), default=2_000_000, help="messages per run"
    )
    tput.add_argument(
        "--batch",
        type=positive,
        default=256,
        help="batch size for the batch API (at most --messages and half of --lane-slots)",
    )
    add_lane_slots(tput, 1024)
    json_flag(tput)

    sched = add_command(bsub, "scheduler", "scheduling decisions per second on one core")
    sched.add_argument(
        "--decisions", type=int_range(1, 10**9), default=1_000_000, help="decisions per run"
    )
    add_exec_slots(sched, 8, "execution slots (GPUs) of the scheduler")
    _add_telemetry_flags(sched)
    json_flag(sched)

    pre = add_command(bsub, "preempt", "preemption reaction through the node daemon")
    pre.add_argument(
        "--preempts", type=int_range(1, 10_000_000), default=20_000, help="PREEMPTs measured"
    )
    pre.add_argument(
        "--interval-us",
        type=int_range(1, MAX_SPIN_US, "a whole number of microseconds"),
        default=200,
        help="time between PREEMPTs, us",
    )
    pre.add_argument(
        "--spin-us",
        type=spin_us,
        default=5_000,
        help="how long the preempted node spins after a message, us",
    )
    _add_telemetry_flags(pre)
    pre.add_argument(
        "--jitter",
        action="store_true",
        help="instead: compare the loop thread's options (pinned CPU, SCHED_FIFO, gc "
        "frozen, all) with none, processes unpinned, in interleaved rounds",
    )
    pre.add_argument(
        "--stages",
        action="store_true",
        help="also time each stage of the path (written -> polled -> taken -> decided -> "
        "handler) with a probe on the node (a few clock reads per message)",
    )
    pre.add_argument(
        "--quantum-us",
        type=int_range(1, 60_000_000, "a run quantum, us"),
        default=None,
        help="instead: what a run quantum costs in reaction time: urgent DISPATCHes "
        "(ordinary and critical) against background work, with quantum 0 and with this "
        "one, in one run (--preempts of each kind)",
    )
    json_flag(pre)

    stg = add_command(
        bsub,
        "stages",
        "instructions per message of each stage of the daemon's path (PREEMPT: poll, core, "
        "driver, handler return), counted by callgrind (needs valgrind)",
    )
    stg.add_argument(
        "--messages",
        type=int_range(10, 10_000_000),
        default=20_000,
        help="PREEMPTs per stage run (each stage is one run under valgrind)",
    )
    json_flag(stg)

    idle = add_command(bsub, "idle", "CPU an idle node daemon costs")
    idle.add_argument(
        "--nodes",
        type=int_range(1, IDLE_MAX_NODES, "a number of node processes on this host"),
        default=4,
        help="idle node processes",
    )
    idle.add_argument(
        "--seconds",
        type=float_range(0.0, MAX_SECONDS),
        default=5.0,
        help="how long to measure, s",
    )
    idle.add_argument(
        "--spin-us", type=spin_us, default=200, help="spin after a message before sleeping, us"
    )
    json_flag(idle)

    hof = add_command(
        bsub,
        "handoff",
        "a call from another thread to the node's handler (submit -> on_dispatch p50/p99) and "
        "tasks/s through a daemon with client ranks running the tasks",
    )
    hof.add_argument(
        "--quick", action="store_true", help="fewer calls and tasks (to check it runs)"
    )
    json_flag(hof)

    peers = add_command(
        bsub,
        "peers",
        "rdmasched, Ray and Dask distributed on the same workloads, interleaved rounds "
        "(needs the [peers] extra; docs/BENCH.md)",
    )
    peers.add_argument(
        "--quick", action="store_true", help="a short run of every system (to check it runs)"
    )
    peers.add_argument(
        "--rounds", type=int_range(1, 100), default=None, help="interleaved rounds (default 3)"
    )
    peers.add_argument(
        "--tasks",
        type=int_range(1, 10**7),
        default=None,
        help="no-op tasks of workload a (default 10000)",
    )
    peers.add_argument(
        "--slots", type=int_range(1, 64), default=4, help="worker slots of every system"
    )
    peers.add_argument(
        "--systems",
        nargs="+",
        choices=["rdmasched", "ray", "dask"],
        default=["rdmasched", "ray", "dask"],
        help="the systems measured",
    )
    peers.add_argument(
        "--rdmasched-spin-us",
        type=spin_list,
        default="default,0",
        metavar="LIST",
        help="rdmasched's rows, one per spin, us, comma-separated: 'default' (row rdmasched: "
        "the daemon's and the clients' defaults) or N (row rdmasched-spinN: rdmasched "
        "daemon --spin-us N and Client(spin_us=N))",
    )
    json_flag(peers)

    ball = add_command(
        bsub,
        "all",
        "every benchmark above and the demo, with their defaults, in one run; writes the "
        "figures with the date, the machine and the commit to a JSON file",
    )
    ball.add_argument(
        "--json-out", metavar="FILE", required=True, help="where to write the figures (JSON)"
    )
    ball.add_argument(
        "--quick",
        action="store_true",
        help="a tenth of the iterations (to check it runs; the figures are noisier)",
    )

    from rdmasched.bench import freeze as bench_freeze

    frz = add_command(
        bsub,
        "freeze",
        "freeze/thaw latency of co-located work: cgroup v2 freezer against SIGSTOP/SIGCONT",
    )
    bench_freeze.add_arguments(frz)

    from rdmasched.bench import failover as bench_failover

    fov = add_command(
        bsub,
        "failover",
        "a host of a torchrun DDP job frozen: every survivor out, the restart, goodput, with "
        "rdmasched and without (needs torch)",
    )
    bench_failover.add_arguments(fov)


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What one option alone cannot say: relations between options, paths."""
    if args.bench == "latency":
        for opt in ("iterations", "slow_iterations"):
            if getattr(args, opt) < args.rounds:
                parser.error(
                    f"--{opt.replace('_', '-')} ({getattr(args, opt)}) must be at least "
                    f"--rounds ({args.rounds}): every round measures at least one round trip"
                )
    if args.bench == "throughput":
        if args.batch > args.messages:
            parser.error(f"--batch ({args.batch}) must be at most --messages ({args.messages})")
        if args.batch > args.lane_slots // 2:
            parser.error(
                f"--batch ({args.batch}) must be at most half of --lane-slots "
                f"({args.lane_slots}): a sender gets credit back every quarter lane"
            )
    if args.bench == "latency" and args.transport != "verbs":
        for opt in ("server", "client", "port"):
            if getattr(args, opt) not in (None, False):
                parser.error(f"--{opt} is for --transport verbs (two hosts)")
    if args.bench == "latency" and args.sizes:
        need = 2 * (1 + -(-max(args.sizes) // 51))  # a message may take half the lane
        if args.lane_slots < need:
            parser.error(
                f"--sizes up to {max(args.sizes)} B needs --lane-slots >= {need} "
                f"(a message of 1 + ceil(size / 51) slots may take at most half the lane)"
            )
    if args.bench == "all":
        out = os.path.dirname(os.path.abspath(args.json_out))
        if os.path.isdir(args.json_out):
            parser.error(f"--json-out {args.json_out} is a directory; give a file name")
        if not os.path.isdir(out):
            parser.error(f"--json-out {args.json_out}: no directory {out}")


def main(args: argparse.Namespace) -> int:
    run: dict[str, Callable[[argparse.Namespace], int]] = {
        "latency": _latency,
        "throughput": _throughput,
        "scheduler": _scheduler,
        "preempt": _preempt,
        "stages": _stages,
        "idle": _idle,
        "all": _all,
        "freeze": _freeze,
        "handoff": _handoff,
        "peers": _peers,
        "failover": _failover,
    }
    return run[args.bench](args)


def suite_parser() -> argparse.ArgumentParser:
    """The commands `bench all` runs, `bench ...` and `demo ...`, as the command line parses
    them (bench/suite.py takes the parser: library code does not import the commands)."""
    from rdmasched.commands import demo

    p = Parser(prog="rdmasched")
    sub = p.add_subparsers(dest="command", required=True)
    add_arguments(add_command(sub, "bench", HELP))
    demo.add_arguments(add_command(sub, "demo", demo.HELP))
    return p


def _add_telemetry_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--events",
        type=int_range(0, 10**7, "a number of events"),
        default=4096,
        help="decision event ring per node (default 4096); 0 turns the telemetry off",
    )
    p.add_argument(
        "--telemetry-cost",
        action="store_true",
        help="measure with the event ring on (--events) and off, side by side in one run, "
        "and print the ratio (docs/TELEMETRY.md)",
    )
    p.add_argument(
        "--rounds",
        type=int_range(1, 1000, "a number of rounds"),
        default=5,
        help="--telemetry-cost: runs of each setting (scheduler: interleaved in turns; "
        "preempt: alternating)",
    )


def latency_total_line(duration: float, rows: int, rounds: int) -> str:
    """What `bench latency --duration` adds up to (it is per row and round, not a total)."""
    total = duration * rows * rounds
    return (
        f"bench latency: --duration {duration:g} s per row and round: {rows} rows x {rounds} "
        f"rounds, about {total:g} s in all (plus each row's probe and warm-up)"
    )


def _latency(args: argparse.Namespace) -> int:
    from rdmasched.bench.common import dump_json, print_table

    if args.transport == "verbs":
        from rdmasched.bench import verbs_latency

        return verbs_latency.main(args)
    from rdmasched.bench import latency, output

    if args.duration is not None:
        rows = sum(
            len(args.sizes) if args.sizes and row in latency.SIZED_ROWS else 1 for row in args.rows
        )
        print(latency_total_line(args.duration, rows, args.rounds), file=sys.stderr, flush=True)
    started = time.time()
    r = latency.from_args(args, quiet=args.json)
    floor = "c-shm-floor" if "c-shm-floor" in r["refs"] else None
    sizes = {
        row.name: int(row.name.rsplit("@", 1)[1][:-1]) for row in r["results"] if "@" in row.name
    }
    if args.csv:
        output.write_csv(args.csv, r["results"], r["per_round"], sizes, floor)
    if args.hdr_log:
        output.write_hdr_log(args.hdr_log, r["per_round"], started)
    if args.plot:
        output.plot(
            args.plot,
            r["results"],
            f"rdmasched bench latency, {args.rounds} rounds, cores {tuple(r['cores'])}",
        )
    if args.json:
        extra = {k: r[k] for k in ("ratios_p50_median_of_rounds", "rounds", "cores")}
        config = {k: v for k, v in vars(args).items() if k not in ("func",)}
        print(dump_json(r["results"], {**extra, **output.run_info(config)}))
        return 0
    print_table(
        f"rdmasched bench latency: round trip (us) of a 64-byte message each way, two "
        f"processes pinned to cores {tuple(r['cores'])}, {args.rounds} interleaved rounds\n"
        f"msgs/s counts both directions; ratios are p50/p50 within a round, median of rounds",
        r["results"],
        r["ratios_p50_median_of_rounds"],
        r["refs"],
    )
    return 0


def _throughput(args: argparse.Namespace) -> int:
    from rdmasched.bench import throughput

    res = throughput.from_args(args)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"rdmasched bench throughput: one shm lane of {args.lane_slots} slots, "
        f"{args.messages} messages, receiver-side rate"
    )
    for r in res["results"]:
        print(
            f"  {r['name']:<12} batch {r['batch']:>4}: {r['msgs_per_s']:>13,.0f} msgs/s "
            f"(sender {r['sender_msgs_per_s']:,.0f})"
        )
    return 0


def _scheduler(args: argparse.Namespace) -> int:
    from rdmasched.bench import scheduler

    res = scheduler.from_args(args)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"rdmasched bench scheduler: a realistic mix on a fake clock, {args.exec_slots} "
        "execution slots, one core (rdmasched/bench/scheduler.py)"
    )
    if args.telemetry_cost:
        print(
            f"  two schedulers, ring on and off, driven in turns of {res['chunk']} operations "
            f"({res['turns']} pairs of turns, {res['rounds']} rounds, {res['implementation']} "
            "core)"
        )
        for key, name in (("events_on", f"events {args.events}"), ("events_off", "events off")):
            r = res[key]
            print(f"  {name:<12} {r['cpu_decisions_per_s']:>12,} decisions per CPU-second")
        print(
            f"  telemetry on / off: {res['ratio']:.3f} over all turns, "
            f"{res['pair_ratio_p50']:.3f} median of the pairs "
            f"({res['ns_per_decision_added']} ns per decision added)"
        )
        return 0
    for r in res["results"]:
        print(
            f"  {r['implementation']:<10} {r['decisions_per_s']:>12,} decisions/s "
            f"({r['ns_per_decision']} ns each; {r['cpu_decisions_per_s']:,} per CPU-second)"
        )
    print(
        f"  compiled / pure Python: {res['speedup']:.2f}x wall-clock, "
        f"{res['cpu_speedup']:.2f}x per CPU-second"
    )
    return 0


def _preempt(args: argparse.Namespace) -> int:
    from rdmasched.bench import preempt

    if getattr(args, "jitter", False):
        return _jitter(args)
    r = preempt.from_args(args)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    if getattr(args, "quantum_us", None) is not None:
        return _quantum(r)
    if args.telemetry_cost:
        print(
            f"rdmasched bench preempt --telemetry-cost: {r['rounds']} rounds of "
            f"{args.preempts} PREEMPTs each with the event ring on and off, alternating"
        )
        for key, name in (("events_on", f"events {args.events}"), ("events_off", "events off")):
            x = r[key]
            print(
                f"  {name:<12} p50 {x['reaction_p50_us']:.2f} us  p99 "
                f"{x['reaction_p99_us']:.2f} us  p99.9 {x['reaction_p999_us']:.2f} us "
                f"({x['preempts']} samples)"
            )
        print(f"  telemetry on / off: p50 {r['p50_ratio']:.3f}, p99 {r['p99_ratio']:.3f}")
        p = r["path"]
        print(
            f"  the PREEMPT path in one process, ring on and off in interleaved turns of "
            f"{p['turn']} ({p['turns']} pairs of turns, {p['preempts']} PREEMPTs each):"
        )
        for key, name in (("events_on", f"events {args.events}"), ("events_off", "events off")):
            x = p[key]
            print(
                f"  {name:<12} {x['cpu_ns_per_preempt']:,} CPU-ns per PREEMPT; one PREEMPT "
                f"after another: p50 {x['gap_p50_us']:.2f} us  p99 {x['gap_p99_us']:.2f} us"
            )
        print(
            f"  telemetry on / off: CPU {p['ratio']:.3f} over all turns, "
            f"{p['pair_ratio_p50']:.3f} median of the pairs; p99 {p['gap_p99_ratio']:.3f}"
        )
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
    if r.get("stages"):
        print("  stages of the path (rdmasched/daemon/probe.py), us, this run with the probe on:")
        print(f"    {'stage':<22} {'p50':>8} {'p99':>8} {'p99.9':>9} {'mean':>8}")
        for name, st in r["stages"].items():
            print(
                f"    {name:<22} {st['p50']:8.2f} {st['p99']:8.2f} {st['p999']:9.2f} "
                f"{st['mean']:8.2f}"
            )
    return 0


def _quantum(r: dict[str, Any]) -> int:
    q = r["quantum_us"]
    print(
        f"rdmasched bench preempt --quantum-us {q}: urgent DISPATCHes, one every "
        f"{r['interval_us']} us, ordinary (priority 100) and critical (220) alternating, "
        f"{r['per_kind']} of each; stamp -> the urgent task's dispatch handler entered"
    )
    for qq, row in r["runs"].items():
        for kind, x in row.items():
            print(
                f"  quantum {qq:>7} us  {kind:<9} p50 {x['p50']:9.2f} us  p99 {x['p99']:9.2f} us"
                f"  p99.9 {x['p999']:9.2f} us  max {x['max']:9.1f} us ({x['n']} samples)"
            )
    for kind, x in r["ratio"].items():
        p50 = "-" if x["p50"] is None else f"{x['p50']:.2f}x"
        p99 = "-" if x["p99"] is None else f"{x['p99']:.2f}x"
        print(f"  quantum {q} us / quantum 0, {kind}: p50 {p50}, p99 {p99}")
    return 0


def _jitter(args: argparse.Namespace) -> int:
    from rdmasched.bench import preempt

    r = preempt.jitter(args.preempts, args.interval_us, args.spin_us)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"rdmasched bench preempt --jitter: the victim's loop-thread options, processes "
        f"unpinned, {r['rounds']} interleaved rounds of {r['preempts_per_round']} PREEMPTs"
    )
    print(f"  {'variant':<10} {'p50':>8} {'p99':>9} {'p99.9':>9} {'max':>10}   options")
    base = r["variants"]["none"]
    for name, v in r["variants"].items():
        if "refused" in v:
            print(f"  {name:<10} refused: {v['refused']}")
            continue
        ratio = f" (p99 {v['p99'] / base['p99']:.2f}x none)" if "p99" in base else ""
        print(
            f"  {name:<10} {v['p50']:8.2f} {v['p99']:9.2f} {v['p999']:9.2f} {v['max']:10.1f}"
            f"   {v['options']}{ratio}"
        )
    return 0


def _stages(args: argparse.Namespace) -> int:
    from rdmasched.bench import stages

    r = stages.from_args(args)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"rdmasched bench stages: instructions per PREEMPT on the daemon's path, callgrind, "
        f"{r['messages']} messages per stage (probe on/off pair: "
        f"{r['probe_pair_instructions']:.0f} instructions, subtracted)"
    )
    print(f"  {'stage':<10} {'instr/msg':>10}  what")
    for name, st in r["stages"].items():
        print(f"  {name:<10} {st['instructions_per_message']:10.0f}  {st['what']}")
    print(f"  {'path':<10} {r['path_instructions_per_message']:10.0f}  (the sum)")
    return 0


def _idle(args: argparse.Namespace) -> int:
    from rdmasched.bench import idle

    r = idle.from_args(args)
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


def _all(args: argparse.Namespace) -> int:
    from rdmasched.bench import suite

    doc = suite.run(suite_parser(), args.json_out, quick=args.quick)
    print(suite.markdown(doc))
    print(f"\nfigures written to {args.json_out}", file=sys.stderr)
    return 0


def _freeze(args: argparse.Namespace) -> int:
    from rdmasched.bench import freeze

    return freeze.cli(args, prog="rdmasched bench freeze")


def _handoff(args: argparse.Namespace) -> int:
    from rdmasched.bench import handoff
    from rdmasched.bench.output import run_info

    figures = handoff.run(quick=args.quick)
    if args.json:
        print(json.dumps({**run_info({"quick": args.quick}), **figures}, indent=2))
    else:
        print(handoff.report(figures))
    return 0


def _peers(args: argparse.Namespace) -> int:
    from rdmasched.bench import peers

    return peers.cli(args)


def _failover(args: argparse.Namespace) -> int:
    from rdmasched.bench import failover

    return failover.cli(args)
