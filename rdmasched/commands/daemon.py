"""`rdmasched daemon`: this host's node daemon in the foreground (docs/CLIENT.md; in
production, docs/DAEMON.md, "Running in production": metrics and probes, logs, systemd)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from rdmasched import limits
from rdmasched.commands.args import UserError, int_range, slice_us, spin_us, us_or_off
from rdmasched.errors import RdmaschedError
from rdmasched.limits import CLIENT_QUEUED_DEFAULT, CLIENT_QUEUED_MAX

if TYPE_CHECKING:
    from rdmasched.daemon.node import Node

HELP = (
    "run this host's node daemon in the foreground; the host's ranks are its clients "
    "(docs/CLIENT.md). The cluster comes from --config, else from the launcher's "
    "environment (Slurm's node list, or torchrun's rendezvous store)"
)
#: --starvation-us off: a cap no task reaches (about 12 days)
STARVATION_OFF_US = 1 << 40
LOG_LEVELS = ("debug", "info", "warning", "error")
#: the logger every rdmasched module logs under (``logging.getLogger(__name__)``)
LOGGER = "rdmasched"


class _NodeField(logging.Filter):
    """Puts the node's name (once known) on every record, as ``record.node``."""

    def __init__(self) -> None:
        super().__init__()
        self.node: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.node
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601, ms), level, logger, msg, node (its name,
    null before it is known), and exc (the traceback, when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "node": getattr(record, "node", None),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class Interrupted(KeyboardInterrupt):
    """A signal while the node joins its cluster: the CLI says so and exits 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def configure_logging(level: str, fmt: str) -> _NodeField:
    """The daemon's logging: every rdmasched logger at `level` and above, to stderr, as
    text or JSON lines. Returns the filter whose ``node`` names the node on each line."""
    field = _NodeField()
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(field)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        text = "%(asctime)s %(levelname)s %(name)s [node %(node)s] %(message)s"
        handler.setFormatter(logging.Formatter(text))
    log = logging.getLogger(LOGGER)
    for old in list(log.handlers):
        log.removeHandler(old)
    log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False
    return field


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
    daemon.add_argument(
        "--spin-us",
        type=spin_us,
        default=None,
        metavar="US",
        help="how long the node's loop and the client lanes' reader spin after a message "
        "before they sleep, us (0: sleep at once; less CPU, a slower wake-up) (default "
        'the loop 200, the reader 50; docs/DAEMON.md, "Spinning")',
    )
    daemon.add_argument(
        "--slice-us",
        type=slice_us,
        default=None,
        metavar="US",
        help="the EEVDF time slice the node's loop thread asks the kernel for, us, "
        f"{limits.SLICE_US_MIN}..{limits.SLICE_US_MAX} (Linux 6.12+; shorter: a wake-up "
        "preempts a busy CPU sooner) (default $RDMASCHED_SLICE_US, else the kernel's; "
        'docs/DAEMON.md, "The slice")',
    )
    daemon.add_argument(
        "--metrics-port",
        type=int_range(0, 65535, "a port"),
        default=None,
        metavar="PORT",
        help="serve Prometheus /metrics, /events and the probes /healthz and /readyz on "
        "this port (0: any free port; e.g. 9464) (default off)",
    )
    daemon.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address the metrics server listens on (0.0.0.0: every interface; any "
        "address not loopback wants --metrics-token-file or a network policy around it)",
    )
    daemon.add_argument(
        "--metrics-token-file",
        metavar="FILE",
        default=None,
        help="a file holding a bearer token that /metrics and /events require "
        "(Authorization: Bearer TOKEN); the probes need none",
    )
    daemon.add_argument(
        "--log-level", choices=LOG_LEVELS, default="warning", help="the daemon's log level"
    )
    daemon.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text lines, or JSON lines (ts, level, logger, msg, node) for a log collector",
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
    from rdmasched.errors import ConfigError
    from rdmasched.telemetry.http import read_token

    if (args.config is None) != (args.node is None):
        parser.error("--config and --node go together")
    if args.metrics_port is None and (
        args.metrics_token_file is not None or args.metrics_addr != "127.0.0.1"
    ):
        parser.error("--metrics-addr and --metrics-token-file need --metrics-port")
    if args.metrics_addr not in ("", "localhost"):
        try:
            ipaddress.ip_address(args.metrics_addr)
        except ValueError:
            parser.error(
                f"--metrics-addr {args.metrics_addr!r} is not an IP address (127.0.0.1, "
                "0.0.0.0, ::, the pod's address) or localhost"
            )
    args.metrics_token = None
    if args.metrics_token_file is not None:
        try:
            args.metrics_token = read_token(args.metrics_token_file)
        except ConfigError as exc:
            parser.error(f"--metrics-token-file: {exc}")


def option_or_env(value: Any, var: str, parse: Callable[[str], Any]) -> Any:
    """An option's `value`, else the variable `var` (which a daemon started by a rank
    inherits from it) read with the option's own `parse`, else None; a bad variable is one
    line naming it."""
    if value is not None or not os.environ.get(var):
        return value
    try:
        return parse(os.environ[var])
    except argparse.ArgumentTypeError as exc:
        raise UserError(f"{var}={os.environ[var]!r}: {exc}") from None


def daemon_policy(args: argparse.Namespace) -> dict[str, Any]:
    """The daemon's scheduling policy: its options, else RDMASCHED_STARVATION_US and
    RDMASCHED_AGING_US (which a daemon started by a rank inherits), else Node's defaults."""
    kw: dict[str, Any] = {}
    for name in ("starvation_us", "aging_us"):
        value = option_or_env(getattr(args, name), f"RDMASCHED_{name.upper()}", us_or_off)
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


def daemon_spin_us(args: argparse.Namespace) -> int | None:
    """--spin-us, else RDMASCHED_SPIN_US (the ranks' own spin, CLIENT.md: `host_client()`
    sets it to 0 on a host whose every CPU runs a rank), else None (the defaults)."""
    return cast(int | None, option_or_env(args.spin_us, "RDMASCHED_SPIN_US", spin_us))


def daemon_slice_us(args: argparse.Namespace) -> int | None:
    """--slice-us, else RDMASCHED_SLICE_US (the ranks' own slice, CLIENT.md, "The slice"),
    else None (the kernel's default slice)."""
    return cast(int | None, option_or_env(args.slice_us, "RDMASCHED_SLICE_US", slice_us))


def main(args: argparse.Namespace) -> int:
    from rdmasched import launch
    from rdmasched.daemon.node import Node

    field = configure_logging(args.log_level, args.log_format)
    policy = daemon_policy(args)
    args.spin_us = daemon_spin_us(args)
    if args.spin_us is not None:
        policy["spin_us"] = args.spin_us
    args.slice_us = daemon_slice_us(args)
    if args.slice_us is not None:
        from rdmasched.daemon.tuning import LoopTuning

        policy["tuning"] = LoopTuning(slice_us=args.slice_us)
    if args.config is not None:
        node = Node.from_config(
            args.config, int(args.node) if args.node.isdigit() else args.node, **policy
        )
    else:
        node = launch.host_node(**policy)
    field.node = node.spec.name
    done = threading.Event()
    joining = True

    def stop(signum: int, frame: object) -> None:
        done.set()
        if joining:  # node.start() waits for the peers' lanes: stop waiting now
            raise Interrupted(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    metrics = ""
    try:
        # served before the node joins: /readyz says "joining" meanwhile (503)
        if args.metrics_port is not None:
            token = getattr(args, "metrics_token", None)  # read by check()
            server = launch.serve_metrics(node, args.metrics_port, args.metrics_addr, token=token)
            host = args.metrics_addr or "0.0.0.0"
            host = f"[{host}]" if ":" in host else host
            metrics = f"; metrics at http://{host}:{server.port}/metrics"
        node.start()
        joining = False
        run(node, args, done, metrics)
    finally:
        try:
            node.stop()
        finally:
            if node.metrics is not None:  # the node never started: stop() had nothing to stop
                node.metrics.close()
                node.metrics = None
    return 0


def run(node: Node, args: argparse.Namespace, done: threading.Event, metrics: str) -> None:
    """Serve the started `node`'s ranks until a signal (or, --exit-when-idle, their end)."""
    from rdmasched import launch

    hub = launch.serve(
        node,
        max_clients=args.max_clients,
        max_queued=args.max_queued_per_client,
        spin_us=args.spin_us,
    )
    print(
        f"rdmasched daemon: node {node.id} ({node.spec.name}) of cluster "
        f"{node.cluster.name!r}, {node.spec.slots} slots, {len(node.cluster.nodes)} nodes; "
        f"clients 0..{hub.max_clients - 1} at {hub.endpoint}{metrics}",
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
