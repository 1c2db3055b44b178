"""`rdmasched why TASK`: why a task has not started, asked of running daemons (the way
`rdmasched top --live` asks them: their metrics port's `/why`, docs/SCHEDULER.md)."""

from __future__ import annotations

import argparse
import json
import sys

from rdmasched.commands.args import UserError, add_token_file, host_port, int_range, json_flag
from rdmasched.limits import U64_MAX

HELP = (
    "why a task has not started: its ranked reasons (reason codes such as NoFreeSlot, "
    "RunQuantum), asked of running daemons over their metrics port. Exit 0: found; 2: no "
    "daemon asked holds the task; 1: a daemon did not answer"
)

#: the exit status when no daemon asked holds the task
NOT_FOUND = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", type=int_range(0, U64_MAX, "a task id (a u64)"), help="the task id")
    p.add_argument(
        "--live",
        metavar="HOST:PORT",
        type=host_port,
        action="append",
        required=True,
        help="a running daemon's metrics port (rdmasched.launch.serve_metrics); repeatable",
    )
    p.add_argument(
        "--origin",
        type=int_range(0, None, "a node id"),
        default=None,
        help="the node that submitted it (default any: ids are unique per origin)",
    )
    add_token_file(p)
    json_flag(p)


def describe(node: int, t: dict[str, object]) -> list[str]:
    """A task's lines: what it is, then its reasons ranked."""
    head = (
        f"task {t['task_id']} (origin {t['origin']}, job {t['job']}, priority {t['priority']}) "
        f"on node {node}: {t['state']}"
    )
    reasons = t.get("reasons") or []
    assert isinstance(reasons, list)
    if t["state"] != "queued":
        return [head + (f" on slot {t['slot']}" if t.get("slot") is not None else "")]
    if not reasons:
        return [head + ", no reason known (it starts at the next decision)"]
    lines = [head + ", waiting:"]
    for i, r in enumerate(reasons, 1):
        lines.append(f"  {i}. {r['code']}: {r['message']}")
    return lines


def main(args: argparse.Namespace) -> int:
    from rdmasched.telemetry.records import TraceError
    from rdmasched.views import live

    found: list[tuple[int, dict[str, object]]] = []
    for addr in args.live:
        try:
            answer = live.why(addr, args.task, args.origin, token=args.token)
        except TraceError as exc:
            raise UserError(str(exc)) from None
        found += [(answer["node"], t) for t in answer["tasks"] if isinstance(t, dict)]
    if args.json:
        print(json.dumps([{"node": n, **t} for n, t in found]))
    if not found:
        where = ", ".join(args.live)
        origin = "" if args.origin is None else f" of origin {args.origin}"
        print(f"rdmasched why: no task {args.task}{origin} on {where}", file=sys.stderr)
        return NOT_FOUND
    if not args.json:
        for n, t in found:
            print("\n".join(describe(n, t)))
    return 0
