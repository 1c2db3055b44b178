"""`rdmasched top`: the mirror in a terminal (views/top.py)."""

from __future__ import annotations

import argparse

from rdmasched.commands.args import positive_float
from rdmasched.commands.mirror import add_source_arguments

HELP = "the mirror in a terminal: slots, queues, sync groups, decisions"


def add_arguments(topc: argparse.ArgumentParser) -> None:
    add_source_arguments(topc)
    topc.add_argument("--once", action="store_true", help="print one frame and exit")
    topc.add_argument(
        "--speed",
        type=positive_float,
        default=0.01,
        help="with --trace: replay speed, times real time",
    )


def main(args: argparse.Namespace) -> int:
    from rdmasched.views import mirror, top

    source = mirror.open_source(
        args.trace or [], args.live or [], args.prefix or "", args.interval, args.token
    )
    try:
        return top.run(
            source, once=args.once, at=args.at, interval_s=args.interval, speed=args.speed
        )
    finally:
        source.close()
