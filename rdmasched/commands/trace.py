"""`rdmasched trace DIR`: the decision events a run wrote, merged in time order."""

from __future__ import annotations

import argparse
import json
import os

HELP = (
    "print decision events (JSON lines) written by `rdmasched demo --trace DIR`, "
    "merged in time order"
)


def add_arguments(trace: argparse.ArgumentParser) -> None:
    trace.add_argument("dir", metavar="DIR", help="the directory given to demo --trace")
    trace.add_argument(
        "--task", type=int, default=None, help="only the events that name this task id"
    )
    trace.epilog = "rdmasched trace export DIR -o FILE: a Perfetto trace (see its --help)"


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not os.path.exists(args.dir):
        parser.error(f"no directory {args.dir}")
    if not os.path.isdir(args.dir):
        parser.error(f"{args.dir} is not a directory (give the directory of demo --trace)")


def main(args: argparse.Namespace) -> int:
    from rdmasched.telemetry.records import events_of, read_dir

    task = args.task
    for tr, ev in events_of(read_dir(args.dir)):
        if task is None or ev.names(task):
            print(json.dumps(ev.as_dict() | {"source": tr.name}))
    return 0
