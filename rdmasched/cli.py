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
    lat.add_argument("--rows", nargs="+", choices=latency.ROWS, default=list(latency.ROWS),
                     metavar="ROW", help=f"rows to measure (default all: {', '.join(latency.ROWS)})")
    lat.add_argument("--iterations", type=_positive, default=200_000,
                     help="round trips per shm row, over all rounds (default 200000)")
    lat.add_argument("--slow-iterations", type=_positive, default=20_000,
                     help="round trips for the kernel-based rows zmq-ipc, unix-socket")
    lat.add_argument("--warmup", type=int, default=2_000, help="round trips discarded first")
    lat.add_argument("--rounds", type=_positive, default=5,
                     help="interleaved rounds; ratios are taken within a round (default 5)")
    lat.add_argument("--slots", type=_slots, default=256, help="lane size in slots")
    lat.add_argument("--json", action="store_true", help="print JSON instead of a table")

    tput = bsub.add_parser("throughput", help="one lane's messages/s, per message and batched")
    tput.add_argument("--messages", type=_positive, default=2_000_000)
    tput.add_argument("--batch", type=_positive, default=256, help="batch size for the batch API")
    tput.add_argument("--slots", type=_slots, default=1024)
    tput.add_argument("--json", action="store_true")

    # --transport verbs (rdmasched/bench/verbs_latency.py): inside the Soft-RoCE VM
    lat.add_argument("--device", default=None,
                     help="verbs: RDMA device (default: $RDMASCHED_DEVICE, else the first)")
    lat.add_argument("--gid-index", type=int, default=None,
                     help="verbs: GID index (default: $RDMASCHED_GID_INDEX, else RoCE v2 IPv4)")
    lat.add_argument("--perftest-iterations", type=_positive, default=None,
                     help="verbs: ib_write_lat iterations per round (default: as rdmasched)")

    doc = sub.add_parser("doctor", help="RDMA devices, ports, GIDs; is Soft-RoCE usable here")
    doc.add_argument("--json", action="store_true", help="print JSON instead of text")
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
            print(f"  round {r + 1}/{args.rounds}: {name:<18} p50 {row.p50_us:7.2f} us",  # type: ignore[attr-defined]
                  file=sys.stderr)

    results, per_round = latency.run(rows, args.iterations, args.slow_iterations, args.warmup,
                                     args.rounds, args.slots, progress)
    refs = [r for r in ("c-shm-floor", "rdmasched-shm") if r in rows]
    ratios = {
        row.name: {ref: statistics.median(latency.round_ratios(per_round, row.name, ref))
                   for ref in refs}
        for row in results
    }
    cores = pick_cores()
    if args.json:
        print(dump_json(results, {"ratios_p50_median_of_rounds": ratios, "rounds": args.rounds,
                                  "cores": list(cores)}))
        return 0
    print_table(
        f"rdmasched bench latency: round trip (us) of a 64-byte message each way, two "
        f"processes pinned to cores {cores}, {args.rounds} interleaved rounds\n"
        f"msgs/s counts both directions; ratios are p50/p50 within a round, median of rounds",
        results, ratios, refs)
    return 0


def cmd_bench_throughput(args: argparse.Namespace) -> int:
    from rdmasched.bench import throughput

    res = [throughput.run(args.messages, 1, args.slots),
           throughput.run(args.messages, args.batch, args.slots)]
    if args.json:
        print(json.dumps({"results": res}, indent=2))
        return 0
    print(f"rdmasched bench throughput: one shm lane of {args.slots} slots, "
          f"{args.messages} messages, receiver-side rate")
    for r in res:
        print(f"  {r['name']:<12} batch {r['batch']:>4}: {r['msgs_per_s']:>13,.0f} msgs/s "
              f"(sender {r['sender_msgs_per_s']:,.0f})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        from rdmasched import doctor

        return doctor.main(args.json)
    if args.command == "bench":
        if args.bench == "latency":
            return cmd_bench_latency(args)
        return cmd_bench_throughput(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
