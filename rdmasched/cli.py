"""The `rdmasched` command: demo, bench, doctor, trace, mirror, top, cleanup.

Argument checking happens here, before anything starts; the work lives in the modules the
subcommands call. A user error is one line on stderr and a non-zero exit (2 for a bad
argument, 1 for a problem found while running), never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from rdmasched.errors import RdmaschedError

#: bounds of the values a command accepts; beyond them nothing useful happens on one host
#: every node is a process on this host (about 24 MB resident each, measured; the central
#: baseline adds its coordinator): 64 take 1.6 GB, and a full mesh of 64 is 4,032 lanes of
#: 16.6 KB in /dev/shm. The bound is the cores: on 2 vCPUs 32 full-mesh nodes already take a
#: 7 ms step to hundreds of ms; past 64 one host only measures its own CPU contention
#: (docs/SCALE.md section 8 has the measured runs)
DEMO_MAX_NODES = 64
#: up to this many demo nodes the cluster defaults hold (heartbeat 50 ms, dead after 500 ms);
#: above, a node process can wait longer than 500 ms for a core of a small host and would be
#: declared dead (a 32-node run on 2 cores: thousands of false deaths, the steps stalled)
DEMO_QUIET_NODES = 16
#: the demo's default nodes per leaf: its nodes run in a generated topology (lanes to their
#: links, relays, the sync tree, liveness over links) unless --full-mesh; up to 8 nodes one
#: leaf holds them all (each is linked to every other, through the same code path)
DEMO_DEFAULT_LEAF = 8
#: `bench idle` keeps its own bound: idle nodes of a full mesh, each beating to every other
IDLE_MAX_NODES = 16
MAX_SPIN_US = 10_000_000
MAX_EXEC_SLOTS = 255  # as in the cluster config
MAX_MS = 3_600_000.0
MAX_SECONDS = 3600.0


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line: what is wrong and where to look."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None and "default" in (action.help or ""):
            return action.help  # the help says what is taken instead of None
        text = super()._get_help_string(action)
        if text and isinstance(action.default, list):
            text = text.replace("%(default)s", " ".join(map(str, action.default)))
        return text


def _int_range(lo: int, hi: int | None = None, what: str = "an integer") -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"must be {what} in {bound}, not {text}")
        return value

    return parse


#: --starvation-us off: a cap no task reaches (about 12 days)
STARVATION_OFF_US = 1 << 40


def _us_or_off(text: str) -> int:
    """A number of us > 0, or 'off' (0)."""
    if text.strip().lower() == "off":
        return 0
    return _int_range(1, None, "a number of us > 0 or 'off'")(text)


def _daemon_policy(args: argparse.Namespace) -> dict[str, Any]:
    """The daemon's scheduling policy: its options, else RDMASCHED_STARVATION_US and
    RDMASCHED_AGING_US (which a daemon started by a rank inherits), else Node's defaults."""
    kw: dict[str, Any] = {}
    for name in ("starvation_us", "aging_us"):
        value = getattr(args, name)
        var = f"RDMASCHED_{name.upper()}"
        if value is None and os.environ.get(var):
            try:
                value = _us_or_off(os.environ[var])
            except argparse.ArgumentTypeError as exc:
                raise _UserError(f"{var}={os.environ[var]!r}: {exc}") from None
        if value is None:
            continue
        if value == 0:  # off
            value = STARVATION_OFF_US if name == "starvation_us" else None
        kw[name] = value
    return kw


def _float_range(lo: float, hi: float, *, lo_open: bool = True) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
        low_ok = value > lo if lo_open else value >= lo
        if not math.isfinite(value) or not low_ok or value > hi:
            interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise argparse.ArgumentTypeError(f"must be a finite number in {interval}, not {text}")
        return value

    return parse


def _sizes(text: str) -> tuple[int, ...]:
    """`all` or a comma-separated list of metadata sizes in bytes (0, or 5..4096)."""
    from rdmasched.bench import latency

    if text.strip() == "all":
        return latency.SIZES_ALL
    out: list[int] = []
    for part in text.split(","):
        try:
            size = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be 'all' or sizes in bytes like 0,64,4096, not {text!r}"
            ) from None
        try:
            latency.meta_of_size(size)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if size not in out:
            out.append(size)
    return tuple(out)


def _lane_slots(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 16 or value > (1 << 20) or value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two in 16..{1 << 20}, not {text}")
    return value


def _jitter(text: str) -> float:
    value = _float_range(0.0, 1.0, lo_open=False)(text)
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"must be a finite number in [0, 1), not {text}")
    return value


_positive = _int_range(1, None, "a positive integer")
_spin_us = _int_range(0, MAX_SPIN_US, "a whole number of microseconds")
_exec_slots = _int_range(1, MAX_EXEC_SLOTS, "a number of execution slots")
_ms = _float_range(0.0, MAX_MS)
_positive_float = _float_range(0.0, MAX_SECONDS)
_fraction = _float_range(0.0, 1.0, lo_open=False)


class _Renamed(argparse.Action):
    """An old spelling that meant different things in different commands: say what to use."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        self.new = kw.pop("new")
        super().__init__(option_strings, dest, nargs=1, help=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        parser.error(f"--slots was renamed: use {self.new}")


def _add_lane_slots(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument(
        "--lane-slots",
        type=_lane_slots,
        default=default,
        help="lane size, in 64-byte slots (a power of two)",
    )
    p.add_argument("--slots", action=_Renamed, new="--lane-slots (lane size, in 64-byte slots)")


def _add_exec_slots(p: argparse.ArgumentParser, default: int, what: str) -> None:
    p.add_argument("--exec-slots", type=_exec_slots, default=default, help=what)
    p.add_argument(
        "--slots", action=_Renamed, new="--exec-slots (execution slots, i.e. GPUs, per node)"
    )


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_parser() -> argparse.ArgumentParser:
    from rdmasched import __version__
    from rdmasched.bench import latency

    p = _Parser(prog="rdmasched", description=__doc__, formatter_class=_Help)
    p.add_argument("--version", action="version", version=f"rdmasched {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(parent: Any, name: str, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = parent.add_parser(
            name, help=help, description=help, formatter_class=_Help
        )
        return parser

    # ---- demo -------------------------------------------------------------------------------
    demo = add(
        sub,
        "demo",
        "a local cluster under rdmasched and under a central scheduler, same workload, "
        "side by side",
    )
    demo.add_argument(
        "--nodes",
        type=_int_range(1, DEMO_MAX_NODES, "a number of node processes on this host"),
        default=4,
        help="node processes on this host (each holds lanes to its topology links)",
    )
    demo.add_argument(
        "--leaf",
        type=_int_range(1, DEMO_MAX_NODES, "a number of nodes per leaf"),
        help="rdmasched's nodes run in a generated topology with this many nodes per leaf "
        f"switch: each node holds lanes only to its links (default min(--nodes, "
        f"{DEMO_DEFAULT_LEAF}))",
    )
    demo.add_argument(
        "--full-mesh",
        action="store_true",
        help="instead: no topology, every node holds a lane to every other (the small-cluster "
        "path: all-to-all sync and heartbeats)",
    )
    demo.add_argument(
        "--pod",
        type=_int_range(1, DEMO_MAX_NODES, "a number of nodes per pod"),
        help="with --leaf: nodes per pod, a multiple of --leaf (default one pod)",
    )
    demo.add_argument(
        "--heartbeat-ms",
        type=_int_range(1, 60_000),
        help=f"rdmasched nodes' heartbeat period, ms (default 50 up to {DEMO_QUIET_NODES} "
        "nodes, 100 above)",
    )
    demo.add_argument(
        "--dead-after-ms",
        type=_int_range(3, 600_000),
        help=f"a peer silent this long is dead, ms (default 500 up to {DEMO_QUIET_NODES} "
        "nodes, 5000 above: N processes share this host's cores)",
    )
    _add_exec_slots(demo, 4, "execution slots (GPUs) per node")
    demo.add_argument("--steps", type=_int_range(1, 10_000_000), default=200, help="training steps")
    demo.add_argument("--compute-ms", type=_ms, default=4.0, help="compute task length, ms")
    demo.add_argument(
        "--jitter",
        type=_jitter,
        default=0.25,
        help="compute task length varies by +- this fraction, in [0, 1)",
    )
    demo.add_argument("--sync-ms", type=_ms, default=1.0, help="gradient sync task length, ms")
    demo.add_argument("--background-ms", type=_ms, default=2.0, help="background task length, ms")
    demo.add_argument(
        "--spin-us",
        type=_spin_us,
        default=50,
        help="how long a node spins after a message before it sleeps, us",
    )
    demo.add_argument("--seed", type=int, default=1, help="seed of the workload's randomness")
    _json_flag(demo)
    demo.add_argument(
        "--trace",
        metavar="DIR",
        help="write every node's decision events as JSON lines into DIR (created if missing)",
    )

    # ---- daemon -----------------------------------------------------------------------------
    daemon = add(
        sub,
        "daemon",
        "run this host's node daemon in the foreground; the host's ranks are its clients "
        "(docs/CLIENT.md). The cluster comes from --config, else from the launcher's "
        "environment (Slurm's node list, or torchrun's rendezvous store)",
    )
    daemon.add_argument("--config", metavar="FILE", help="cluster config (TOML, docs/CONFIG.md)")
    daemon.add_argument("--node", help="this host's node name or id in --config")
    daemon.add_argument(
        "--max-clients",
        type=_int_range(1, 255, "a number of client ranks"),
        default=None,
        help="client ranks served, indexes 0..N-1 (default the node's slots)",
    )
    daemon.add_argument(
        "--exit-when-idle",
        action="store_true",
        help="exit once every client that connected has left, or if none connected in 120 s "
        "(for a daemon a rank started)",
    )
    daemon.add_argument(
        "--starvation-us",
        type=_us_or_off,
        default=None,
        help="the scheduler's starvation cap, us, or 'off' (strict priorities) (default "
        "$RDMASCHED_STARVATION_US, else 1000000)",
    )
    daemon.add_argument(
        "--aging-us",
        type=_us_or_off,
        default=None,
        help="the scheduler's aging step, us, or 'off' (default $RDMASCHED_AGING_US, else 100000)",
    )

    # ---- sim --------------------------------------------------------------------------------
    from rdmasched.sim import cli as sim_cli

    sim_cli.add_arguments(
        add(
            sub,
            "sim",
            "simulate a cluster of up to 100,000 nodes running the real node core, against "
            "central, k8s-class and fifo baselines (docs/SIM.md)",
        )
    )

    # ---- bench ------------------------------------------------------------------------------
    bench = add(sub, "bench", "benchmarks that print figures")
    bsub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")

    lat = add(bsub, "latency", "round trip of a 64-byte message, with baselines")
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
        type=_positive,
        default=200_000,
        help="round trips per shm row, over all rounds (at least --rounds)",
    )
    lat.add_argument(
        "--slow-iterations",
        type=_positive,
        default=20_000,
        help="round trips of the kernel-based rows zmq-ipc, unix-socket (at least --rounds)",
    )
    lat.add_argument(
        "--warmup",
        type=_int_range(0, 10_000_000),
        default=2_000,
        help="round trips discarded first, each round",
    )
    lat.add_argument(
        "--rounds",
        type=_int_range(1, 1000),
        default=5,
        help="interleaved rounds; ratios are taken within a round",
    )
    _add_lane_slots(lat, 256)
    _json_flag(lat)
    lat.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        metavar="all|N,N,...",
        help="metadata-size sweep (like perftest's -a): the rows that have a metadata path "
        f"({', '.join(latency.SIZED_ROWS)}) are measured once per size, in bytes of msgpack "
        f"metadata per message; all: {','.join(map(str, latency.SIZES_ALL))}; "
        "None: no metadata",
    )
    lat.add_argument(
        "--duration",
        type=_float_range(0.01, MAX_SECONDS),
        default=None,
        metavar="SECONDS",
        help="run each row about this long per round instead of a count of round trips "
        "(the count comes from a short probe of the row); None: --iterations",
    )
    lat.add_argument("--csv", metavar="FILE", help="also write every row and round as CSV")
    lat.add_argument(
        "--hdr-log",
        metavar="FILE",
        help="also write an HdrHistogram log (one interval histogram per row and round)",
    )
    lat.add_argument(
        "--plot",
        metavar="FILE.png",
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
        type=_int_range(0, 255),
        default=None,
        help="verbs: GID index (None: $RDMASCHED_GID_INDEX, else RoCE v2 IPv4)",
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
        type=_int_range(1, 65_000),
        default=None,
        help="verbs, two hosts: the control port (rows use the next three); None: 18520",
    )
    lat.add_argument(
        "--perftest-iterations",
        type=_positive,
        default=None,
        help="verbs: ib_write_lat iterations per round (None: as rdmasched)",
    )

    tput = add(bsub, "throughput", "one lane's messages/s, per message and batched")
    tput.add_argument(
        "--messages", type=_int_range(1, 10**9), default=2_000_000, help="messages per run"
    )
    tput.add_argument(
        "--batch",
        type=_positive,
        default=256,
        help="batch size for the batch API (at most --messages and half of --lane-slots)",
    )
    _add_lane_slots(tput, 1024)
    _json_flag(tput)

    sched = add(bsub, "scheduler", "scheduling decisions per second on one core")
    sched.add_argument(
        "--decisions", type=_int_range(1, 10**9), default=1_000_000, help="decisions per run"
    )
    _add_exec_slots(sched, 8, "execution slots (GPUs) of the scheduler")
    _add_telemetry_flags(sched)
    _json_flag(sched)

    pre = add(bsub, "preempt", "preemption reaction through the node daemon")
    pre.add_argument(
        "--preempts", type=_int_range(1, 10_000_000), default=20_000, help="PREEMPTs measured"
    )
    pre.add_argument(
        "--interval-us",
        type=_int_range(1, MAX_SPIN_US, "a whole number of microseconds"),
        default=200,
        help="time between PREEMPTs, us",
    )
    pre.add_argument(
        "--spin-us",
        type=_spin_us,
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
    _json_flag(pre)

    stg = add(
        bsub,
        "stages",
        "instructions per message of each stage of the daemon's path (PREEMPT: poll, core, "
        "driver, handler return), counted by callgrind (needs valgrind)",
    )
    stg.add_argument(
        "--messages",
        type=_int_range(10, 10_000_000),
        default=20_000,
        help="PREEMPTs per stage run (each stage is one run under valgrind)",
    )
    _json_flag(stg)

    idle = add(bsub, "idle", "CPU an idle node daemon costs")
    idle.add_argument(
        "--nodes",
        type=_int_range(1, IDLE_MAX_NODES, "a number of node processes on this host"),
        default=4,
        help="idle node processes",
    )
    idle.add_argument(
        "--seconds",
        type=_float_range(0.0, MAX_SECONDS),
        default=5.0,
        help="how long to measure, s",
    )
    idle.add_argument(
        "--spin-us", type=_spin_us, default=200, help="spin after a message before sleeping, us"
    )
    _json_flag(idle)

    ball = add(
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

    frz = add(
        bsub,
        "freeze",
        "freeze/thaw latency of co-located work: cgroup v2 freezer against SIGSTOP/SIGCONT",
    )
    bench_freeze.add_arguments(frz)

    # ---- the rest ---------------------------------------------------------------------------
    trace = add(
        sub,
        "trace",
        "print decision events (JSON lines) written by `rdmasched demo --trace DIR`, "
        "merged in time order",
    )
    trace.add_argument("dir", metavar="DIR", help="the directory given to demo --trace")
    trace.add_argument(
        "--task", type=int, default=None, help="only the events that name this task id"
    )
    trace.epilog = "rdmasched trace export DIR -o FILE: a Perfetto trace (see its --help)"

    # `rdmasched trace export ...` (main() routes it here: `trace DIR` keeps its meaning)
    texp = add(
        sub,
        "trace export",
        "write trace records (demo --trace, a node's dump, rdmasched sim) as a Perfetto trace",
    )
    texp.description = (
        "Read the trace records (JSON lines, docs/TELEMETRY.md) in each DIR, and of each "
        "live node given with --live, and write one Perfetto trace (protobuf; open it in "
        "ui.perfetto.dev): a track per node slot with its tasks, counters for queue depth "
        "and load, flow arrows for DISPATCH, SYNC_READY and PREEMPT."
    )
    texp.add_argument("dirs", metavar="DIR", nargs="*", help="directories of trace records")
    texp.add_argument("-o", "--output", metavar="FILE", required=True, help="the trace to write")
    texp.add_argument(
        "--prefix",
        default="",
        help="only the files whose name starts with this (e.g. rdmasched-node: the demo "
        "writes central-node* too); default: all",
    )
    texp.add_argument(
        "--live",
        metavar="HOST:PORT",
        action="append",
        default=[],
        help="also a running node's events, from its metrics port (Node(metrics_port=...))",
    )

    # ---- mirror, top (docs/TELEMETRY.md, "Live mirror") -------------------------------------
    mirror = add(
        sub,
        "mirror",
        "serve a web page of the cluster from its decision events: slots, queues, sync "
        "groups, the latest decisions and why; click a task for its story across nodes",
    )
    topc = add(sub, "top", "the mirror in a terminal: slots, queues, sync groups, decisions")
    for mp in (mirror, topc):
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
            action="append",
            help="a running daemon's metrics port (Node(metrics_port=...)), polled; "
            "repeatable (default none)",
        )
        mp.add_argument(
            "--prefix",
            help="with --trace: only the files whose name starts with this (e.g. "
            "rdmasched-node: the demo writes central-node* too) (default all)",
        )
        mp.add_argument(
            "--interval", type=_positive_float, default=0.5, help="seconds between polls/frames"
        )
        mp.add_argument(
            "--at",
            type=_fraction,
            default=None,
            help="with --trace: the moment shown first, as a fraction of the run in [0, 1] "
            "(default the end for the page and --once; top replays from the start)",
        )
    mirror.add_argument("--port", type=_int_range(0, 65535), default=8765, help="0: any free port")
    mirror.add_argument("--addr", default="127.0.0.1", help="the address to listen on")
    topc.add_argument("--once", action="store_true", help="print one frame and exit")
    topc.add_argument(
        "--speed",
        type=_positive_float,
        default=0.01,
        help="with --trace: replay speed, times real time",
    )

    doc = add(sub, "doctor", "RDMA devices, ports, GIDs; is Soft-RoCE usable here")
    _json_flag(doc)

    clean = add(
        sub,
        "cleanup",
        "remove rdmasched shared-memory segments (/dev/shm/rdmasched.*) whose creating "
        "process is gone, e.g. after a node was killed with SIGKILL",
    )
    clean.add_argument("--json", action="store_true", help="print the removed names as JSON")
    clean.add_argument(
        "--cluster", metavar="NAME", help="only this cluster's segments (default all)"
    )
    clean.add_argument(
        "--dry-run", action="store_true", help="say what would be removed; remove nothing"
    )

    # values are checked in cmd_topology (one line on stderr), not by argparse types
    topo = add(
        sub,
        "topology",
        "lanes, QPs and ring memory per node and the hop bound of a cluster topology",
    )
    topo.description = (
        "Build a topology (generated, --config TOML or --slurm topology.conf), "
        "choose each node's links within the lane budget and verify them: lanes, RC QPs and "
        "ring memory per node, and the hops of every checked route (docs/SCALE.md)."
    )
    tsrc = topo.add_mutually_exclusive_group()
    tsrc.add_argument("--config", metavar="FILE", help="a TOML file with a [topology] table")
    tsrc.add_argument("--slurm", metavar="FILE", help="a Slurm topology.conf (tree plugin)")
    topo.add_argument("--nodes", help="generate this many nodes (default 1024)")
    topo.add_argument(
        "--sizes",
        metavar="N,N,...",
        help="generate and verify one topology per size (e.g. 1k,10k,100k) and print one "
        "table row each: lanes, QPs and ring memory per node, hops, targets missed (default "
        "off: one topology)",
    )
    topo.add_argument("--leaf", help="generated: nodes per leaf switch (default 32)")
    topo.add_argument("--pod", help="generated: nodes per pod, a multiple of --leaf (default 1024)")
    topo.add_argument("--budget", help="most lanes (and RC QPs) per node (default 64)")
    topo.add_argument(
        "--lane-slots", help="slots per lane, as cluster.slots_per_lane (default 256)"
    )
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


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What one option alone cannot say: relations between options, paths."""
    if args.command == "bench" and args.bench == "latency":
        for opt in ("iterations", "slow_iterations"):
            if getattr(args, opt) < args.rounds:
                parser.error(
                    f"--{opt.replace('_', '-')} ({getattr(args, opt)}) must be at least "
                    f"--rounds ({args.rounds}): every round measures at least one round trip"
                )
    if args.command == "bench" and args.bench == "throughput":
        if args.batch > args.messages:
            parser.error(f"--batch ({args.batch}) must be at most --messages ({args.messages})")
        if args.batch > args.lane_slots // 2:
            parser.error(
                f"--batch ({args.batch}) must be at most half of --lane-slots "
                f"({args.lane_slots}): a sender gets credit back every quarter lane"
            )
    if args.command == "demo" and args.full_mesh and (args.leaf or args.pod) is not None:
        parser.error("--full-mesh takes no --leaf or --pod (it has no topology)")
    if args.command == "demo" and args.pod is not None and args.leaf is None:
        parser.error("--pod needs --leaf (the nodes per leaf of the topology)")
    if args.command == "demo":
        hb, dead = demo_liveness(args)
        if dead <= 2 * hb:
            parser.error(f"--dead-after-ms ({dead}) must be more than 2 x --heartbeat-ms ({hb})")
    if args.command == "bench" and args.bench == "latency" and args.transport != "verbs":
        for opt in ("server", "client", "port"):
            if getattr(args, opt) not in (None, False):
                parser.error(f"--{opt} is for --transport verbs (two hosts)")
    if args.command == "bench" and args.bench == "latency" and args.sizes:
        need = 2 * (1 + -(-max(args.sizes) // 51))  # a message may take half the lane
        if args.lane_slots < need:
            parser.error(
                f"--sizes up to {max(args.sizes)} B needs --lane-slots >= {need} "
                f"(a message of 1 + ceil(size / 51) slots may take at most half the lane)"
            )
    trace_dir = getattr(args, "trace", None) if args.command == "demo" else None
    if trace_dir is not None and os.path.exists(trace_dir) and not os.path.isdir(trace_dir):
        parser.error(f"--trace {args.trace}: not a directory")
    if args.command == "bench" and args.bench == "all":
        out = os.path.dirname(os.path.abspath(args.json_out))
        if os.path.isdir(args.json_out):
            parser.error(f"--json-out {args.json_out} is a directory; give a file name")
        if not os.path.isdir(out):
            parser.error(f"--json-out {args.json_out}: no directory {out}")
    if args.command == "trace":
        if not os.path.exists(args.dir):
            parser.error(f"no directory {args.dir}")
        if not os.path.isdir(args.dir):
            parser.error(f"{args.dir} is not a directory (give the directory of demo --trace)")


# ---- bench ----------------------------------------------------------------------------------
def bench_latency(args: argparse.Namespace, quiet: bool = False) -> dict[str, Any]:
    """The latency rows, their ratios within rounds; progress on stderr unless `quiet` or
    stderr is not a terminal."""
    from rdmasched.bench import latency
    from rdmasched.bench.common import pick_cores

    rows = list(args.rows)
    sizes: tuple[int, ...] = tuple(getattr(args, "sizes", None) or ())
    quiet = quiet or not sys.stderr.isatty()

    def progress(r: int, name: str, row: Any) -> None:
        if not quiet:
            print(
                f"  round {r + 1}/{args.rounds}: {name:<18} p50 {row.p50_us:7.2f} us",
                file=sys.stderr,
            )

    results, per_round = latency.run(
        rows,
        args.iterations,
        args.slow_iterations,
        args.warmup,
        args.rounds,
        args.lane_slots,
        progress,
        sizes=sizes,
        duration_s=getattr(args, "duration", None),
    )
    # in a size sweep the sized rows are renamed (row@<size>B): only the floor is a reference
    refs = [
        r
        for r in ("c-shm-floor", "rdmasched-shm")
        if r in rows and not (r in latency.SIZED_ROWS and sizes)
    ]
    ratios = {
        row.name: {
            ref: statistics.median(latency.round_ratios(per_round, row.name, ref)) for ref in refs
        }
        for row in results
    }
    return {
        "results": results,
        "ratios_p50_median_of_rounds": ratios,
        "refs": refs,
        "rounds": args.rounds,
        "cores": list(pick_cores()),
        "per_round": per_round,
    }


def cmd_bench_latency(args: argparse.Namespace) -> int:
    from rdmasched.bench.common import dump_json, print_table

    if args.transport == "verbs":
        from rdmasched.bench import verbs_latency

        return verbs_latency.main(args)
    from rdmasched.bench import output

    started = time.time()
    r = bench_latency(args, quiet=args.json)
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


def bench_throughput(args: argparse.Namespace) -> dict[str, Any]:
    from rdmasched.bench import throughput

    return {
        "results": [
            throughput.run(args.messages, 1, args.lane_slots),
            throughput.run(args.messages, args.batch, args.lane_slots),
        ]
    }


def cmd_bench_throughput(args: argparse.Namespace) -> int:
    res = bench_throughput(args)
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


def _add_telemetry_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--events",
        type=_int_range(0, 10**7, "a number of events"),
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
        type=_int_range(1, 1000, "a number of rounds"),
        default=5,
        help="--telemetry-cost: runs of each setting (scheduler: interleaved in turns; "
        "preempt: alternating)",
    )


def bench_scheduler(args: argparse.Namespace) -> dict[str, Any]:
    from rdmasched.bench import scheduler

    if args.telemetry_cost:
        return scheduler.telemetry_cost(
            args.decisions, args.exec_slots, rounds=args.rounds, events=args.events
        )
    # The baseline in the same run: the same policy source as plain Python.
    ev = args.events
    compiled = scheduler.run(args.decisions, args.exec_slots, impl="auto", quiet=True, events=ev)
    python = scheduler.run(args.decisions, args.exec_slots, impl="python", quiet=True, events=ev)
    return {
        "results": [compiled, python],
        "speedup": compiled["decisions_per_s"] / python["decisions_per_s"],
        # on each run's CPU time: steadier than wall-clock when other work shares the core
        "cpu_speedup": compiled["cpu_decisions_per_s"] / python["cpu_decisions_per_s"],
    }


def cmd_bench_scheduler(args: argparse.Namespace) -> int:
    res = bench_scheduler(args)
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


def bench_preempt(args: argparse.Namespace) -> dict[str, Any]:
    from rdmasched.bench import preempt

    if args.telemetry_cost:
        return preempt.telemetry_cost(
            args.preempts, args.interval_us, args.spin_us, rounds=args.rounds, events=args.events
        )
    return preempt.run(
        args.preempts,
        args.interval_us,
        args.spin_us,
        stages=getattr(args, "stages", False),
        events=args.events,
    )


def cmd_bench_preempt(args: argparse.Namespace) -> int:
    if getattr(args, "jitter", False):
        return cmd_bench_jitter(args)
    r = bench_preempt(args)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
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


def cmd_bench_jitter(args: argparse.Namespace) -> int:
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


def bench_stages(args: argparse.Namespace) -> dict[str, Any]:
    from rdmasched.bench import stages

    return stages.run(args.messages)


def cmd_bench_stages(args: argparse.Namespace) -> int:
    r = bench_stages(args)
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


def bench_idle(args: argparse.Namespace) -> dict[str, Any]:
    from rdmasched.bench import idle

    return idle.run(args.nodes, args.seconds, args.spin_us)


def cmd_bench_idle(args: argparse.Namespace) -> int:
    r = bench_idle(args)
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


def cmd_bench_all(args: argparse.Namespace) -> int:
    from rdmasched.bench import suite

    doc = suite.run(build_parser(), args.json_out, quick=args.quick)
    print(suite.markdown(doc))
    print(f"\nfigures written to {args.json_out}", file=sys.stderr)
    return 0


# ---- demo, trace, cleanup -------------------------------------------------------------------
def demo_liveness(args: argparse.Namespace) -> tuple[int, int]:
    """The demo's heartbeat period and dead-peer time, ms: as given, else by its size."""
    quiet = args.nodes <= DEMO_QUIET_NODES
    hb = getattr(args, "heartbeat_ms", None) or (50 if quiet else 100)
    dead = getattr(args, "dead_after_ms", None) or max(500 if quiet else 5000, 3 * hb)
    return hb, dead


def demo_config(args: argparse.Namespace) -> Any:
    from rdmasched.demo.runner import DemoConfig
    from rdmasched.demo.workload import WorkloadConfig

    w = WorkloadConfig(
        steps=args.steps,
        compute_ms=args.compute_ms,
        jitter=args.jitter,
        sync_ms=args.sync_ms,
        background_ms=args.background_ms,
        seed=args.seed,
    )
    return DemoConfig(
        nodes=args.nodes,
        slots=args.exec_slots,
        spin_us=args.spin_us,
        workload=w,
        trace_dir=args.trace,
        leaf=demo_leaf(args),
        pod=getattr(args, "pod", None),
        heartbeat_ms=demo_liveness(args)[0],
        dead_after_ms=demo_liveness(args)[1],
    )


def demo_leaf(args: argparse.Namespace) -> int | None:
    """The demo's nodes per leaf: --leaf, else min(--nodes, DEMO_DEFAULT_LEAF); None with
    --full-mesh (no topology)."""
    if getattr(args, "full_mesh", False):
        return None
    leaf: int | None = getattr(args, "leaf", None)
    return leaf if leaf is not None else min(args.nodes, DEMO_DEFAULT_LEAF)


def cmd_demo(args: argparse.Namespace) -> int:
    from rdmasched.demo.runner import print_report, run

    if args.trace is not None:
        try:
            os.makedirs(args.trace, exist_ok=True)
        except OSError as exc:
            raise _UserError(f"--trace {args.trace}: {exc.strerror}") from None
        if not os.access(args.trace, os.W_OK | os.X_OK):
            raise _UserError(f"--trace {args.trace}: not writable")
    cfg = demo_config(args)
    if cfg.leaf is not None:  # a bad topology is one line here, not an error in 2N processes
        from rdmasched.cluster import local_cluster

        local_cluster(cfg.nodes, cfg.slots, leaf=cfg.leaf, pod=cfg.pod)
    res = run(cfg, progress=True)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_report(cfg, res)
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from rdmasched.telemetry.records import events_of, read_dir

    task = args.task
    for tr, ev in events_of(read_dir(args.dir)):
        if task is None or ev.names(task):
            print(json.dumps(ev.as_dict() | {"source": tr.name}))
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    from rdmasched.sim import cli as sim_cli

    return sim_cli.main(args)


def cmd_trace_export(args: argparse.Namespace) -> int:
    from rdmasched.telemetry import live, perfetto
    from rdmasched.telemetry.records import read_dir

    if not args.dirs and not args.live:
        raise _UserError("give at least one DIR (or --live HOST:PORT)")
    traces = [t for d in args.dirs for t in read_dir(d, args.prefix)]
    traces += [live.fetch(addr) for addr in args.live]
    seen: dict[int, str] = {}
    for t in traces:
        if t.node in seen:
            raise _UserError(
                f"two traces of node {t.node} ({seen[t.node]}, {t.name}): pick one with --prefix"
            )
        seen[t.node] = t.name
    try:
        counts = perfetto.export(traces, args.output)
    except OSError as exc:
        raise _UserError(f"-o {args.output}: {exc.strerror}") from None
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


def cmd_mirror(args: argparse.Namespace) -> int:
    from rdmasched.telemetry import mirror

    source = mirror.open_source(args.trace or [], args.live or [], args.prefix or "", args.interval)
    mirror.serve_forever(source, args.port, args.addr, args.at)
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    from rdmasched.telemetry import mirror, top

    source = mirror.open_source(args.trace or [], args.live or [], args.prefix or "", args.interval)
    try:
        return top.run(
            source, once=args.once, at=args.at, interval_s=args.interval, speed=args.speed
        )
    finally:
        source.close()


def cmd_topology(args: argparse.Namespace) -> int:
    from rdmasched import topology

    return topology.cli(args)  # a ConfigError is one line, as every RdmaschedError


def cmd_bench_freeze(args: argparse.Namespace) -> int:
    from rdmasched.bench import freeze

    return freeze.cli(args, prog="rdmasched bench freeze")


def cmd_daemon(args: argparse.Namespace) -> int:
    import threading
    import time

    from rdmasched.daemon.clients import ClientHub
    from rdmasched.daemon.node import Node

    if (args.config is None) != (args.node is None):
        raise _UserError("--config and --node go together")
    policy = _daemon_policy(args)
    if args.config is not None:
        node = Node.from_config(
            args.config, int(args.node) if args.node.isdigit() else args.node, **policy
        )
    else:
        node = Node.from_env(**policy)
    done = threading.Event()

    def stop(signum: int, frame: object) -> None:
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    node.start()
    try:
        hub = ClientHub(node, max_clients=args.max_clients).open()
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


def cmd_cleanup(args: argparse.Namespace) -> int:
    from rdmasched.transport import shm

    try:
        rep = shm.cleanup(args.cluster, dry_run=args.dry_run)
    except ValueError as exc:
        raise _UserError(f"--cluster {args.cluster!r}: {exc}") from None
    if args.json:
        print(json.dumps(dataclasses.asdict(rep)))
        return 0
    verb = "would remove" if rep.dry_run else "removed"
    for name in rep.removed:
        print(f"{verb} {shm.SHM_DIR}{name}")
    for name, why in rep.skipped:
        print(f"skipped {shm.SHM_DIR}{name}: {why}")
    if not rep.removed:
        print("no stale rdmasched segments")
    return 0


class _UserError(Exception):
    """A problem with what the user asked, found after parsing: one line, exit 1."""


def _demo_error() -> type[Exception]:
    from rdmasched.demo.runner import DemoError

    return DemoError


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["trace", "export"]:  # a sub-command of trace, beside `trace DIR`
        argv[:2] = ["trace export"]
    try:
        args = parser.parse_args(argv)
        _check(parser, args)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    prog = f"rdmasched {args.command}" + (f" {args.bench}" if args.command == "bench" else "")
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "demo": cmd_demo,
        "trace": cmd_trace,
        "trace export": cmd_trace_export,
        "cleanup": cmd_cleanup,
        "daemon": cmd_daemon,
        "bench latency": cmd_bench_latency,
        "bench throughput": cmd_bench_throughput,
        "bench scheduler": cmd_bench_scheduler,
        "bench preempt": cmd_bench_preempt,
        "bench stages": cmd_bench_stages,
        "bench idle": cmd_bench_idle,
        "bench all": cmd_bench_all,
        "bench freeze": cmd_bench_freeze,
        "topology": cmd_topology,
        "sim": cmd_sim,
        "mirror": cmd_mirror,
        "top": cmd_top,
    }
    try:
        if args.command == "doctor":
            from rdmasched import doctor

            return doctor.main(args.json)
        return handlers[prog.removeprefix("rdmasched ")](args)
    except BrokenPipeError:
        # The reader went away (`rdmasched trace DIR | head`): stop quietly, as Unix tools do.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP in the demo (runner.Interrupted)
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"{prog}: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    except _demo_error() as exc:  # what went wrong in the node processes, in full
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except (_UserError, RdmaschedError) as exc:
        text = " ".join(str(exc).split("\n")[0].split())
        print(f"{prog}: error: {text}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
