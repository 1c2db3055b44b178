"""`rdmasched mirror`: a web page of the cluster from its decision events (docs/TELEMETRY.md,
"Live mirror"); its sources (`add_source_arguments`) are `rdmasched top`'s too."""

from __future__ import annotations

import argparse

from rdmasched.commands.args import add_token_file, fraction, host_port, int_range, positive_float

HELP = (
    "serve a web page of the cluster from its decision events: slots, queues, sync "
    "groups, the latest decisions and why; click a task for its story across nodes"
)


def add_source_arguments(mp: argparse.ArgumentParser) -> None:
    """Where the events come from: trace records replayed, or running daemons polled."""
    mp.add_argument(
        "--trace",
        metavar="DIR",
        action="append",
        help="replay the trace records in DIR (rdmasched demo --trace DIR, a node's "
        "dump); repeatable (default none)",
    )
    mp.add_argument(
        "--live",
        metavar="HOST:PORT",
        type=host_port,
        action="append",
        help="a running daemon's metrics port (rdmasched.launch.serve_metrics), polled; "
        "repeatable (default none)",
    )
    add_token_file(mp)
    mp.add_argument(
        "--prefix",
        help="with --trace: only the files whose name starts with this (e.g. "
        "rdmasched-node: the demo writes central-node* too) (default all)",
    )
    mp.add_argument(
        "--interval", type=positive_float, default=0.5, help="seconds between polls/frames"
    )
    mp.add_argument(
        "--at",
        type=fraction,
        default=None,
        help="with --trace: the moment shown first, as a fraction of the run in [0, 1] "
        "(default the end for the page and --once; top replays from the start)",
    )


def add_arguments(mirror: argparse.ArgumentParser) -> None:
    add_source_arguments(mirror)
    mirror.add_argument("--port", type=int_range(0, 65535), default=8765, help="0: any free port")
    mirror.add_argument("--addr", default="127.0.0.1", help="the address to listen on")


def main(args: argparse.Namespace) -> int:
    from rdmasched.views import mirror

    source = mirror.open_source(
        args.trace or [], args.live or [], args.prefix or "", args.interval, args.token
    )
    mirror.serve_forever(source, args.port, args.addr, args.at)
    return 0
