"""`rdmasched daemon`: this host's node daemon in the foreground (docs/CLIENT.md)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from rdmasched import limits
from rdmasched.commands.args import UserError, int_range, us_or_off
from rdmasched.errors import RdmaschedError
from rdmasched.limits import CLIENT_QUEUED_DEFAULT, CLIENT_QUEUED_MAX

HELP = (
    "run this host's node daemon in the foreground; the host's ranks are its clients "
    "(docs/CLIENT.md). The cluster comes from --config, else from the launcher's "
    "environment (Slurm's node list, or torchrun's rendezvous store)"
)
#: --starvation-us off: a cap no task reaches (about 12 days)
STARVATION_OFF_US = 1 << 40


def add_arguments(daemon: argparse.ArgumentParser) -> None:
    daemon.add_argument("--config", metavar="FILE", help="cluster config (TOML, docs/CONFIG.md)")
    daemon.add_argument("--node", help="this host's node name or id in --config")
    daemon.add_argument(
        "--max-clients",
        type=int_range(1, 255, "a number of client ranks"),
        default=None,
        help="client ranks served, indexes 0..N-1 (default the node's slots)",
    )
    daemon.add_argument(
        "--max-queued-per-client",
        type=int_range(1, CLIENT_QUEUED_MAX, "a number of tasks"),
        default=None,
        help=f"tasks one rank may hold here (queued, running or placed elsewhere); past it "
        f"its submits raise QueueFullError (default {CLIENT_QUEUED_DEFAULT})",
    )
    daemon.add_argument(
        "--exit-when-idle",
        action="store_true",
        help="exit once every client that connected has left, or if none connected in 120 s "
        "(for a daemon a rank started)",
    )
    daemon.add_argument(
        "--starvation-us",
        type=us_or_off,
        default=None,
        help="the scheduler's starvation cap, us, or 'off' (strict priorities) (default "
        "$RDMASCHED_STARVATION_US, else 1000000)",
    )
    daemon.add_argument(
        "--aging-us",
        type=us_or_off,
        default=None,
        help="the scheduler's aging step, us, or 'off' (default $RDMASCHED_AGING_US, else 100000)",
    )
    add_preemption_arguments(daemon)


#: the no-thrash options: flag -> (Scheduler keyword, type, help) (docs/PREEMPTION.md)
PREEMPTION_FLAGS = {
    "--quantum-us": (
        "quantum_us",
        int_range(0, limits.QUANTUM_US_MAX, "a run quantum, us"),
        "a task runs at least this long before an ordinary task may preempt it (default "
        "the config's [preemption] quantum_us, else 0: off)",
    ),
    "--task-budget": (
        "task_budget",
        int_range(0, limits.BUDGET_MAX, "a number of preemptions"),
        "ordinary preemptions one task may suffer here, at most (default the config's, else "
        "no bound)",
    ),
    "--job-budget": (
        "job_budget",
        int_range(0, limits.BUDGET_MAX, "a number of preemptions"),
        "ordinary preemptions of one job's tasks per --job-window-us, at most (default the "
        "config's, else no bound)",
    ),
    "--job-window-us": (
        "job_window_us",
        int_range(1, limits.JOB_WINDOW_US_MAX, "a window, us"),
        f"the window of --job-budget (default the config's, else {limits.JOB_WINDOW_US_DEFAULT})",
    ),
    "--critical-priority": (
        "critical_priority",
        int_range(0, 255, "a priority"),
        "tasks at or above it (and sync tasks) preempt at once, ungoverned (default the "
        f"config's, else {limits.CRITICAL_PRIORITY_DEFAULT})",
    ),
}


def add_preemption_arguments(p: argparse.ArgumentParser) -> None:
    """The no-thrash options; each overrides the cluster config's [preemption] key."""
    for flag, (dest, kind, text) in PREEMPTION_FLAGS.items():
        p.add_argument(flag, dest=dest, type=kind, default=None, help=text)


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if (args.config is None) != (args.node is None):
        parser.error("--config and --node go together")


def daemon_policy(args: argparse.Namespace) -> dict[str, Any]:
    """The daemon's scheduling policy: its options, else RDMASCHED_STARVATION_US and
    RDMASCHED_AGING_US (which a daemon started by a rank inherits), else Node's defaults."""
    kw: dict[str, Any] = {}
    for name in ("starvation_us", "aging_us"):
        value = getattr(args, name)
        var = f"RDMASCHED_{name.upper()}"
        if value is None and os.environ.get(var):
            try:
                value = us_or_off(os.environ[var])
            except argparse.ArgumentTypeError as exc:
                raise UserError(f"{var}={os.environ[var]!r}: {exc}") from None
        if value is None:
            continue
        if value == 0:  # off
            value = STARVATION_OFF_US if name == "starvation_us" else None
        kw[name] = value
    preemption = {
        dest: getattr(args, dest)
        for dest, _, _ in PREEMPTION_FLAGS.values()
        if getattr(args, dest, None) is not None
    }
    if preemption:
        kw["preemption"] = preemption
    return kw


def main(args: argparse.Namespace) -> int:
    import threading
    import time

    from rdmasched import launch
    from rdmasched.daemon.node import Node

    policy = daemon_policy(args)
    if args.config is not None:
        node = Node.from_config(
            args.config, int(args.node) if args.node.isdigit() else args.node, **policy
        )
    else:
        node = launch.host_node(**policy)
    done = threading.Event()

    def stop(signum: int, frame: object) -> None:
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    node.start()
    try:
        hub = launch.serve(
            node, max_clients=args.max_clients, max_queued=args.max_queued_per_client
        )
        print(
            f"rdmasched daemon: node {node.id} ({node.spec.name}) of cluster "
            f"{node.cluster.name!r}, {node.spec.slots} slots, {len(node.cluster.nodes)} nodes; "
            f"clients 0..{hub.max_clients - 1} at {hub.endpoint}",
            flush=True,
        )
        idle_since: float | None = None
        started = time.monotonic()
        while not done.wait(0.1):
            if not node.healthy:
                raise RdmaschedError(f"the node's loop failed: {node.error!r}")
            if args.exit_when_idle and not hub.connects and time.monotonic() - started > 120:
                print("rdmasched daemon: no client came in 120 s; exiting", file=sys.stderr)
                break
            if args.exit_when_idle and hub.connects and not hub.clients:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 1.0:
                    break
            else:
                idle_since = None
    finally:
        node.stop()
    return 0
