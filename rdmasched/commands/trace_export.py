"""`rdmasched trace export DIR -o FILE`: trace records as one Perfetto trace
(telemetry/perfetto.py). cli.py routes `trace export` here, so that `trace DIR` keeps its
meaning."""

from __future__ import annotations

import argparse

from rdmasched.commands.args import UserError, add_token_file, host_port, output_file

HELP = "write trace records (demo --trace, a node's dump, rdmasched sim) as a Perfetto trace"


def add_arguments(texp: argparse.ArgumentParser) -> None:
    texp.description = (
        "Read the trace records (JSON lines, docs/TELEMETRY.md) in each DIR, and of each "
        "live node given with --live, and write one Perfetto trace (protobuf; open it in "
        "ui.perfetto.dev): a track per node slot with its tasks, counters for queue depth "
        "and load, flow arrows for DISPATCH, SYNC_READY and PREEMPT."
    )
    texp.add_argument("dirs", metavar="DIR", nargs="*", help="directories of trace records")
    texp.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        required=True,
        type=output_file(),
        help="the trace to write",
    )
    texp.add_argument(
        "--prefix",
        default="",
        help="only the files whose name starts with this (e.g. rdmasched-node: the demo "
        "writes central-node* too); default: all",
    )
    texp.add_argument(
        "--live",
        metavar="HOST:PORT",
        type=host_port,
        action="append",
        default=[],
        help="also a running node's events, from its metrics port (rdmasched.launch.serve_metrics)",
    )
    add_token_file(texp)


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.dirs and not args.live:
        parser.error("give at least one DIR (or --live HOST:PORT)")


def main(args: argparse.Namespace) -> int:
    from rdmasched.telemetry import perfetto
    from rdmasched.telemetry.records import read_dir
    from rdmasched.views import live

    traces = [t for d in args.dirs for t in read_dir(d, args.prefix)]
    traces += [live.fetch(addr, token=args.token) for addr in args.live]
    seen: dict[int, str] = {}
    for t in traces:
        if t.node in seen:
            raise UserError(
                f"two traces of node {t.node} ({seen[t.node]}, {t.name}): pick one with --prefix"
            )
        seen[t.node] = t.name
    try:
        counts = perfetto.export(traces, args.output)
    except OSError as exc:
        raise UserError(f"-o {args.output}: {exc.strerror}") from None
    events = sum(len(t.events) for t in traces)
    print(
        f"wrote {args.output}: {len(traces)} nodes, {events} events -> {counts['tracks']} "
        f"tracks, {counts['slices']} task slices, {counts['instants']} decisions, "
        f"{counts['flows']} flows (open it in https://ui.perfetto.dev)"
    )
    lost = {t.name: int(t.head.get("dropped", 0)) for t in traces if t.head.get("dropped")}
    if lost:  # the rings wrapped: the trace starts later on those nodes
        print(
            "  events lost to a wrapped ring (only the newest are kept): "
            + ", ".join(f"{name} {n}" for name, n in lost.items())
        )
    return 0
