"""`rdmasched sim`: the simulator's command (rdmasched/sim/, docs/SIM.md)."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
from dataclasses import replace
from typing import Any

from rdmasched.commands.args import (
    add_exec_slots,
    check_liveness,
    dead_after_ms,
    heartbeat_ms,
    int_range,
    jitter,
    ms,
    node_counts,
    output_dir,
    output_file,
)
from rdmasched.demo.defaults import DEMO_MAX_NODES
from rdmasched.demo.job import WorkloadConfig
from rdmasched.sim import costs
from rdmasched.sim.harvest import (
    ALONE,
    DEVICE_PREEMPT_US,
    TIMESLICE_INTERFERENCE,
    compare_to_alone,
    format_harvest,
)
from rdmasched.sim.hostmodel import SPEC_KEYS, parse_spec
from rdmasched.sim.jobs import (
    JOB_SCHEDULERS,
    JobsConfig,
    format_jobs_table,
    load_jobs,
    write_jobs,
)
from rdmasched.sim.linkmodel import PRESETS, preset
from rdmasched.sim.philly import PhillyReplay, read_philly
from rdmasched.sim.pipeline import PipelineConfig
from rdmasched.sim.report import (
    calibrate,
    compare,
    demo_cluster,
    fit_host_model,
    format_calibration,
    format_table,
    plot,
    real_runs,
    reals_from,
    score,
)
from rdmasched.sim.run import (
    CENTRAL,
    DEFAULT_SCHEDULERS,
    SCHEDULERS,
    SimConfig,
    measure_central_call_ns,
    simulate,
)
from rdmasched.workload.streams import MODES

HELP = (
    "simulate a cluster of up to 100,000 nodes running the real node core, against "
    "exclusive (Slurm/Kueue gang), two-level (Ray-like), central (Dask-like) and fifo "
    "baselines (docs/SIM.md)"
)
#: the schedulers run unless --schedulers says (with --harvest: the node cores' ones)
HARVEST_SCHEDULERS = ("rdmasched", "fifo", "timeslice")
#: the default of --central-max-nodes: the baselines at every size
CENTRAL_MAX_NODES = 0


def _schedulers(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    known = tuple(dict.fromkeys(SCHEDULERS + JOB_SCHEDULERS))
    bad = [x for x in out if x not in known]
    if not out or bad:
        raise argparse.ArgumentTypeError(
            f"schedulers are a comma-separated subset of {','.join(known)}"
        )
    return list(dict.fromkeys(out))


def _central_call(text: str) -> int:
    from rdmasched.errors import ArgumentError
    from rdmasched.sim.costs import central_call_ns

    try:
        return central_call_ns(text)
    except ArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _kill(text: str) -> tuple[int, float]:
    count, sep, at = text.partition("@")
    try:
        c, t = int(count), float(at)
    except ValueError:
        c, t = -1, -1.0
    if not sep or c < 0 or not t >= 0:
        raise argparse.ArgumentTypeError(f"--kill takes COUNT@MS (e.g. 2@20), not {text!r}")
    return c, t


def _nonneg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"not a number >= 0: {text!r}")
    return v


def _positive(text: str) -> float:
    v = _nonneg(text)
    if v == 0:
        raise argparse.ArgumentTypeError(f"not a number > 0: {text!r}")
    return v


def _slowdown(text: str) -> float:
    v = _nonneg(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"not a factor >= 1: {text!r}")
    return v


#: an integer >= 0, and one >= 1 (the command line's one parser of integer ranges)
_count, _pos_int = int_range(0), int_range(1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sizes",
        type=node_counts,
        default="1000",
        help="cluster sizes (nodes), comma-separated; 1k is 1,000",
    )
    p.add_argument(
        "--schedulers",
        type=_schedulers,
        default=None,
        help="schedulers to run at each size, comma-separated, of "
        f"{','.join(SCHEDULERS)} (default {','.join(DEFAULT_SCHEDULERS)}; with --harvest "
        f"{','.join(HARVEST_SCHEDULERS)}; k8s: a pod bound per task, not what anyone runs "
        "for training, only when named)",
    )
    p.add_argument(
        "--central-max-nodes",
        type=_count,
        default=CENTRAL_MAX_NODES,
        help="run the central and k8s baselines only at sizes up to this many nodes, and "
        "list the larger ones as not run (default 0: at every size; at 100,000 nodes each "
        "takes about 10 CPU minutes: docs/SIM.md, 'Speed')",
    )
    p.add_argument("--steps", type=_pos_int, default=10, help="training steps")
    add_exec_slots(p, 4, "execution slots (GPUs) per node")
    p.add_argument("--compute-ms", type=ms, default=4.0, help="compute task length, ms")
    p.add_argument("--jitter", type=jitter, default=0.25, help="compute length +- fraction")
    p.add_argument("--sync-ms", type=_nonneg, default=1.0, help="gradient sync task length, ms")
    p.add_argument("--background-ms", type=_nonneg, default=2.0, help="background task, ms")
    p.add_argument("--backlog", type=_count, default=4, help="background tasks queued per node")
    p.add_argument(
        "--job-nodes",
        type=_count,
        default=0,
        help="nodes per data-parallel job: the cluster runs N/J jobs side by side "
        "(0: one job over every node)",
    )
    p.add_argument(
        "--workload",
        metavar="FILE",
        help="replay a torch.profiler trace (.json/.json.gz) or a Chakra execution trace "
        "(.et) instead of the synthetic job (default none: the synthetic job)",
    )
    p.add_argument(
        "--link-model",
        action="store_true",
        help="--workload: every collective takes the link model's time (nccl-tests' formula "
        "per collective), not its measured one (the default up to the traced world size)",
    )
    p.add_argument(
        "--trace-mode",
        choices=MODES,
        default="host",
        help="--workload, a GPU trace: host (ops wait for the host that issued them, at the "
        "trace's pace), device (the GPU alone), kernels (the GPU alone, no launch gaps)",
    )
    p.add_argument(
        "--jobs",
        metavar="FILE|poisson|philly:FILE",
        help="the multi-job workload instead of the synthetic job: jobs arriving as gangs of "
        "whole nodes, from a CSV file (arrival_s,nodes,duration_s,step_ms,priority), a "
        "Poisson mix or a window of Microsoft Philly's job trace; run under rdmasched and "
        "exclusive (docs/SIM.md, 'Multi-job cluster') (default none)",
    )
    p.add_argument(
        "--jobs-count", type=_pos_int, help="--jobs poisson|philly: jobs (default 200|4000)"
    )
    p.add_argument(
        "--jobs-load", type=_positive, help="--jobs poisson|philly: offered load (default 0.9|1.0)"
    )
    p.add_argument(
        "--jobs-scale",
        type=_positive,
        default=60.0,
        help="--jobs philly: trace seconds per virtual second, arrivals and run times alike",
    )
    p.add_argument(
        "--philly-start", help="--jobs philly: the window's first submission (YYYY-MM-DD HH:MM:SS)"
    )
    p.add_argument(
        "--philly-min-s", type=_positive, default=60.0, help="--jobs philly: shortest run time, s"
    )
    p.add_argument(
        "--philly-max-s", type=_positive, default=3600.0, help="--jobs philly: longest run time, s"
    )
    p.add_argument(
        "--philly-step-s", type=_positive, default=1.0, help="--jobs philly: a step, trace s"
    )
    p.add_argument(
        "--philly-high-max-s",
        type=_nonneg,
        default=0.0,
        help="--jobs philly: one-node jobs of at most this run time are high priority (0: none)",
    )
    p.add_argument(
        "--jobs-out",
        metavar="FILE",
        help="--jobs: write the jobs of the first size as the CSV --jobs FILE reads, and stop",
    )
    p.add_argument(
        "--jobs-high", type=_nonneg, default=0.2, help="--jobs poisson: high-priority share"
    )
    p.add_argument("--jobs-step-ms", type=_positive, default=100.0, help="--jobs poisson: step, ms")
    p.add_argument(
        "--jobs-steps", type=_pos_int, default=300, help="--jobs poisson: median steps a job"
    )
    p.add_argument(
        "--jobs-checkpoint-steps",
        type=_pos_int,
        default=50,
        help="--jobs: a preempted job keeps its steps up to its last checkpoint, every this "
        "many steps",
    )
    p.add_argument("--links", choices=sorted(PRESETS), default="ib", help="link model")
    p.add_argument("--cpu-ns", type=_count, help="per-message CPU cost, ns (default the model's)")
    p.add_argument("--leaf", type=_pos_int, default=32, help="nodes per leaf switch")
    p.add_argument(
        "--full-mesh",
        action="store_true",
        help="no topology in the cores: a lane between every two nodes, flat sync and "
        "liveness (as `rdmasched demo --full-mesh`; with --calibrate, both sides run so)",
    )
    p.add_argument("--pod", type=_pos_int, default=1024, help="nodes per pod")
    p.add_argument("--seed", type=int, default=1, help="seed of every random choice")
    p.add_argument("--sigma", type=_nonneg, default=0.0, help="per-node lognormal slowdown")
    p.add_argument("--stragglers", type=_nonneg, default=0.0, help="fraction of stragglers")
    p.add_argument("--straggler-slowdown", type=_slowdown, default=2.0, help="their factor")
    p.add_argument(
        "--kill",
        type=_kill,
        action="append",
        default=None,
        metavar="COUNT@MS",
        help="kill COUNT random nodes at virtual time MS, repeatable (default none)",
    )
    p.add_argument("--heartbeat-ms", type=heartbeat_ms, default=50, help="heartbeat period, ms")
    p.add_argument(
        "--dead-after-ms",
        type=dead_after_ms,
        default=500,
        help="silence = dead, ms (more than 2 x --heartbeat-ms, as cluster.dead_after_ms)",
    )
    p.add_argument(
        "--central-call-ns",
        type=_central_call,
        help="the central coordinator's cost per call into a node core, ns, or a preset: "
        "compiled, or dask (Dask distributed's measured cost per task, halved: a task is "
        "two calls) (default compiled: this coordinator's recorded figure, or --measure's; "
        "docs/SIM.md, 'Costs')",
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="measure the costs this machine can measure again (the compiled central "
        "coordinator's cost per call), print them beside the recorded ones and use them "
        "(default: the recorded figures of rdmasched/sim/costs.py)",
    )
    p.add_argument(
        "--k8s-pods-per-s", type=_positive, default=100.0, help="k8s baseline: decisions/s"
    )
    p.add_argument(
        "--k8s-period-ms", type=_nonneg, default=0.0, help="k8s baseline: scheduling cycle, ms"
    )
    p.add_argument(
        "--stall-ms",
        type=_positive,
        default=None,
        help="stop a run when no compute or sync task is done for this long, virtual ms "
        "(default 5,000; under k8s at least twice the time it takes to bind one round of "
        "every node's pods: minutes of virtual time at 1,000 nodes)",
    )
    p.add_argument(
        "--wall-limit-s",
        type=_nonneg,
        default=900.0,
        help="stop a run after this much wall time (0: never); it is marked unfinished",
    )
    p.add_argument(
        "--trace",
        metavar="DIR",
        type=output_dir,
        help="write every node's decision events to DIR at the end (one trace file per node, "
        "as `rdmasched trace`, `trace export` and `mirror` read; several runs: a "
        "subdirectory SCHEDULER-nN each) (default none: the event rings stay off)",
    )
    p.add_argument(
        "--trace-events",
        type=_pos_int,
        default=4096,
        help="--trace: each node's event ring, events (about 120 bytes each; a run's rings "
        "may take 2 GiB at most)",
    )
    p.add_argument(
        "--harvest",
        action="store_true",
        help="watch every node's devices: the co-located (background) work harvested, "
        "device idle, useful work, the device's preemption cost; each size also runs the "
        "job-alone reference (fifo, --backlog 0) and the table compares against it "
        "(docs/SIM.md, 'Harvest'); node-core schedulers only",
    )
    p.add_argument(
        "--device-preempt-us",
        type=_nonneg,
        default=DEVICE_PREEMPT_US,
        help="with --harvest: a device's context switch on a preemption, us (the task the "
        f"core starts begins that much later; default {DEVICE_PREEMPT_US:g})",
    )
    p.add_argument(
        "--interference",
        type=_slowdown,
        default=TIMESLICE_INTERFERENCE,
        help="timeslice: a job task beside co-located work takes this many times its length "
        f"(default {TIMESLICE_INTERFERENCE:.3f} = 88.2/49.1 ms, the real DDP example)",
    )
    p.add_argument(
        "--pipeline",
        type=_pos_int,
        metavar="STAGES",
        help="a 1F1B pipeline-parallel job of STAGES stages on consecutive nodes instead of "
        "the synthetic data-parallel job (the nodes a multiple of STAGES)",
    )
    p.add_argument("--micro-batches", type=_pos_int, default=16, help="--pipeline: per step")
    p.add_argument("--forward-ms", type=ms, default=1.0, help="--pipeline: a forward pass, ms")
    p.add_argument("--backward-ms", type=ms, default=2.0, help="--pipeline: a backward pass, ms")
    p.add_argument(
        "--pipeline-mb",
        type=_nonneg,
        default=0.0,
        help="--pipeline: activations sent stage to stage per micro-batch, MB",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        type=output_file(".png"),
        help="a PNG of idle percent and step time against N (default none)",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="the same workload in the simulator (shm model) and in real `rdmasched demo` "
        "runs, side by side (at --calibrate-sizes), in the demo's topology (leaves of 8) "
        "unless --full-mesh",
    )
    p.add_argument(
        "--host-model",
        nargs="?",
        const="",
        default=None,
        metavar="K=V,...",
        help="run the nodes as processes sharing one host's CPUs, each a loop that spins, "
        "sleeps and wakes (rdmasched/sim/hostmodel.py; docs/SIM.md 'Calibration'); optional "
        "K=V pairs, K one of: " + ", ".join(SPEC_KEYS) + " (default none: a CPU per node)",
    )
    p.add_argument(
        "--fit-sizes",
        type=node_counts,
        default=None,
        help="with --calibrate --host-model: fit the host model's free parameters on the "
        "real runs at these sizes (some of --calibrate-sizes) and score it on the others "
        "(default none: the parameters as given)",
    )
    p.add_argument(
        "--calibrate-rounds",
        type=int,
        default=1,
        metavar="R",
        help="with --calibrate: run the real demo at every size R times, interleaved "
        "(4, 8, 16, 32, 4, ...), and compare each figure's median over the rounds: this "
        "host's speed drifts from minute to minute (default 1)",
    )
    p.add_argument(
        "--calibrate-real",
        metavar="FILE",
        help="with --calibrate: take the real runs (and the wake-ups measured beside them) "
        "from FILE, an earlier `--calibrate --json` output, instead of running them",
    )
    p.add_argument(
        "--measure-wakeups",
        action="store_true",
        help="measure a sleeping loop's wake-up on this host (a message, a timer: the "
        "host model's distributions) and print it",
    )
    p.add_argument(
        "--calibrate-sizes",
        type=node_counts,
        default="4,8,16,32",
        help=f"node counts to calibrate at: real `rdmasched demo` runs, so each at most "
        f"{DEMO_MAX_NODES} (the demo's nodes)",
    )
    _add_failure_arguments(p)
    _add_mixed_arguments(p)


def _add_mixed_arguments(p: argparse.ArgumentParser) -> None:
    """The mixed stream's options (docs/SIM.md, "Mixed priorities"; rdmasched/sim/mixed.py)."""
    from rdmasched.sim import mixed as m

    d = m.MixedConfig()
    g = p.add_argument_group("mixed priorities (docs/SIM.md, 'Mixed priorities')")
    g.add_argument(
        "--mixed",
        action="store_true",
        help="the mixed stream instead of the synthetic job: on every node short "
        "low-priority tasks kept in flight and a latency-critical task every period "
        f"(bench peers' workload d), under {','.join(m.MIXED_SCHEDULERS)}",
    )
    g.add_argument(
        "--mixed-calibrate",
        action="store_true",
        help="the mixed stream at the size of bench peers' real run (one host, its "
        "parameters) beside its figures (--peers-json)",
    )
    g.add_argument(
        "--peers-json",
        metavar="FILE",
        default=str(m.PEERS_JSON),
        help="the real bench peers run (default docs/figures/bench-peers.json)",
    )
    g.add_argument(
        "--mixed-ms", type=_positive, default=d.duration_ms, help="virtual time it runs, ms"
    )
    g.add_argument(
        "--mixed-warmup-ms",
        type=_nonneg,
        default=d.warmup_ms,
        help="the figures are measured from this virtual time on, ms",
    )
    g.add_argument(
        "--mixed-low-ms",
        type=_positive,
        default=d.low_ms,
        help="a low-priority task's median length, ms (bench peers' d: 5)",
    )
    g.add_argument(
        "--mixed-low-sigma",
        type=_nonneg,
        default=d.low_sigma,
        help="the low-priority lengths' lognormal shape (0: all --mixed-low-ms)",
    )
    g.add_argument(
        "--mixed-inflight",
        type=_pos_int,
        default=d.inflight,
        help="low-priority tasks kept in flight per node (bench peers' d: 32 on one host)",
    )
    g.add_argument(
        "--mixed-critical-ms",
        type=_positive,
        default=d.critical_every_ms,
        help="a critical task every this many ms per node, one at a time",
    )
    g.add_argument(
        "--mixed-critical-cost-ms",
        type=_positive,
        default=d.critical_cost_ms,
        help="a critical task's length, ms",
    )
    g.add_argument(
        "--mixed-preempted",
        choices=m.PREEMPTED,
        default=d.preempted,
        help="a preempted low-priority task restarts (its work lost: a rollout) or keeps "
        "its progress",
    )
    g.add_argument(
        "--mixed-reserve",
        action="store_true",
        help="two-level: the critical tasks on a worker kept for them (Ray's custom "
        "resource, as bench peers sets Ray up), beside the node's slots",
    )


def _add_failure_arguments(p: argparse.ArgumentParser) -> None:
    """The failure model's options (docs/SIM.md, "Failures"; rdmasched/sim/failures.py)."""
    from rdmasched.sim import failures as f

    g = p.add_argument_group("failures (docs/SIM.md, 'Failures')")
    g.add_argument(
        "--failures",
        action="store_true",
        help="a node dies mid-step: detection, restart and goodput for rdmasched and "
        "exclusive at each size",
    )
    g.add_argument(
        "--failures-calibrate",
        action="store_true",
        help="the failure model at 2 nodes with the real `rdmasched bench failover` run's "
        "settings, beside its figures (--failover-json)",
    )
    g.add_argument(
        "--failover-json",
        metavar="FILE",
        default=str(f.FAILOVER_JSON),
        help="the real run the restart costs come from (default docs/figures/failover.json)",
    )
    g.add_argument(
        "--mtbf-node-h",
        type=_positive,
        default=f.MTBF_NODE_S / 3600,
        help="each node's mean time between failures, hours (default Llama 3's: 419 "
        "interruptions in 54 days on 2,048 nodes)",
    )
    g.add_argument(
        "--ckpt-cost-s",
        type=_nonneg,
        default=f.CKPT_COST_S,
        help="a checkpoint's blocking cost, s (default Llama 3 405B's state at 2 TB/s)",
    )
    g.add_argument(
        "--ckpt-interval-s",
        type=_positive,
        default=None,
        help="seconds of work between checkpoints (default Young's optimum for the job)",
    )
    g.add_argument(
        "--pg-timeout-s",
        type=_positive,
        default=f.NCCL_PG_TIMEOUT_S,
        help="exclusive: the process group's timeout the survivors wait for, s (default "
        "PyTorch's for NCCL, 600)",
    )
    g.add_argument(
        "--requeue-s",
        type=_nonneg,
        default=0.0,
        help="exclusive: from the job's failure to its restart by the scheduler, s",
    )
    g.add_argument(
        "--restart",
        choices=f.RESTARTS,
        default="spare",
        help="the job restarts on the survivors plus a spare node, or on the survivors alone",
    )
    g.add_argument("--window-h", type=_positive, default=168.0, help="the modelled window, hours")
    g.add_argument(
        "--failures-measure-max-nodes",
        type=_count,
        default=0,
        metavar="M",
        help="simulate the failure only at sizes up to M; a larger size's timeline takes "
        "the step and detection measured at the largest of those (default 0: every size)",
    )


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the simulator takes is what `demo`, `topology` and the cluster config take: the
    same liveness rule, the same leaf/pod rule; the calibration's real runs are demo runs,
    at most the demo's nodes; and every size's configuration checked before any run."""
    from rdmasched.errors import RdmaschedError
    from rdmasched.sim.mixed import MIXED_SCHEDULERS
    from rdmasched.topology import check_leaf_pod

    mixed = args.mixed or args.mixed_calibrate
    if args.schedulers is None:
        args.schedulers = list(
            MIXED_SCHEDULERS
            if mixed
            else HARVEST_SCHEDULERS
            if args.harvest
            else DEFAULT_SCHEDULERS
        )
    if mixed:
        bad = [s for s in args.schedulers if s not in MIXED_SCHEDULERS]
        if bad:
            parser.error(f"--mixed runs under {','.join(MIXED_SCHEDULERS)}, not {bad[0]}")
        other = [
            flag
            for flag, on in (
                ("--harvest", args.harvest),
                ("--workload", args.workload),
                ("--pipeline", args.pipeline is not None),
                ("--jobs", args.jobs),
                ("--calibrate", args.calibrate),
                ("--host-model", args.host_model is not None),
                ("--failures", args.failures or args.failures_calibrate),
            )
            if on
        ]
        if other:
            parser.error(f"--mixed is its own workload: not with {other[0]}")
    check_liveness(parser, args.heartbeat_ms, args.dead_after_ms)
    try:
        check_leaf_pod(args.leaf, args.pod, "--leaf/--pod")
    except RdmaschedError as exc:
        parser.error(str(exc))
    sizes = list(args.sizes)
    if args.calibrate:
        big = [n for n in args.calibrate_sizes if n > DEMO_MAX_NODES]
        if big:
            parser.error(
                f"--calibrate-sizes {big[0]}: the calibration's real runs are `rdmasched demo` "
                f"runs, which take at most {DEMO_MAX_NODES} nodes (processes on this host)"
            )
        sizes = list(args.calibrate_sizes)
    if args.harvest and (args.calibrate or any(s in CENTRAL for s in args.schedulers)):
        parser.error(
            "--harvest watches the node cores' devices: give --schedulers from "
            "rdmasched,fifo,timeslice (not central or k8s), and no --calibrate"
        )
    if args.fit_sizes is not None:
        if not (args.calibrate and args.host_model is not None):
            parser.error("--fit-sizes fits the host model: it needs --calibrate --host-model")
        out = [n for n in args.fit_sizes if n not in args.calibrate_sizes]
        if out:
            parser.error(f"--fit-sizes {out[0]}: not one of --calibrate-sizes")
    if args.calibrate_rounds < 1:
        parser.error(f"--calibrate-rounds {args.calibrate_rounds}: at least 1")
    if args.calibrate_rounds != 1 and args.calibrate_real is not None:
        parser.error("--calibrate-rounds runs the real demo: not with --calibrate-real")
    args.calibrate_doc = None
    if args.calibrate_real is not None:
        if not args.calibrate:
            parser.error(
                "--calibrate-real takes the real runs of a calibration: it needs --calibrate"
            )
        args.calibrate_doc = _calibration_doc(parser, args)
    try:
        base = base_config(args, load_trace=False)
    except RdmaschedError as exc:
        parser.error(str(exc))
    for n in sizes:
        try:
            replace(base, nodes=n).check()
        except RdmaschedError as exc:
            parser.error(f"at {n} nodes: {exc}")


def _calibration_doc(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """--calibrate-real FILE: an earlier calibration's JSON, with a real run at every size."""
    from rdmasched.errors import RdmaschedError
    from rdmasched.files import read_text

    path = args.calibrate_real
    try:
        doc = json.loads(read_text(path, "--calibrate-real", "a JSON file"))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        reals = reals_from(doc)
    except (RdmaschedError, ValueError) as exc:
        parser.error(f"--calibrate-real {path}: {exc}")
    missing = [n for n in args.calibrate_sizes if n not in reals]
    if missing:
        parser.error(f"--calibrate-real {path}: no real run at {missing[0]} nodes")
    doc["reals"] = reals
    return doc


def base_config(args: argparse.Namespace, load_trace: bool = True) -> SimConfig:
    """The simulator's configuration from the options (`load_trace`: read --workload)."""
    trace = None
    if args.workload and load_trace:
        from rdmasched.workload import load

        trace = load(args.workload)
        trace.validate()
    model = preset(args.links)
    if args.cpu_ns is not None:
        model = model.with_cpu(args.cpu_ns)
    w = WorkloadConfig(
        steps=args.steps,
        compute_ms=args.compute_ms,
        jitter=args.jitter,
        sync_ms=args.sync_ms,
        background_ms=args.background_ms,
        background_backlog=args.backlog,
        seed=args.seed,
    )
    cfg = SimConfig(
        nodes=1,
        slots=args.exec_slots,
        workload=w,
        links=model,
        leaf=args.leaf,
        pod=args.pod,
        seed=args.seed,
        sigma=args.sigma,
        stragglers=args.stragglers,
        straggler_slowdown=args.straggler_slowdown,
        kill=tuple(args.kill or ()),
        heartbeat_ms=args.heartbeat_ms,
        dead_after_ms=args.dead_after_ms,
        k8s_pods_per_s=args.k8s_pods_per_s,
        k8s_period_ms=args.k8s_period_ms,
        wall_limit_s=args.wall_limit_s,
        stall_ms=args.stall_ms,
        job_nodes=args.job_nodes,
        trace=trace,
        link_model=args.link_model,
        trace_mode=args.trace_mode,
        full_mesh=args.full_mesh,
        harvest=args.harvest,
        device_preempt_us=args.device_preempt_us if args.harvest else 0.0,
        interference=args.interference,
        pipeline=None
        if args.pipeline is None
        else PipelineConfig(
            stages=args.pipeline,
            micro_batches=args.micro_batches,
            forward_ms=args.forward_ms,
            backward_ms=args.backward_ms,
            activation_mb=args.pipeline_mb,
        ),
        jobs=_jobs(args),
        host_model=None if args.host_model is None else parse_spec(args.host_model),
        mixed=_mixed(args),
    )
    return cfg


def _mixed(args: argparse.Namespace) -> Any:
    """--mixed: the mixed stream (None: another workload)."""
    if not args.mixed:
        return None
    from rdmasched.sim.mixed import MixedConfig

    return MixedConfig(
        duration_ms=args.mixed_ms,
        warmup_ms=args.mixed_warmup_ms,
        low_ms=args.mixed_low_ms,
        low_sigma=args.mixed_low_sigma,
        inflight=args.mixed_inflight,
        critical_every_ms=args.mixed_critical_ms,
        critical_cost_ms=args.mixed_critical_cost_ms,
        preempted=args.mixed_preempted,
        reserve=args.mixed_reserve,
    )


def _workload_name(args: argparse.Namespace) -> str:
    if args.pipeline is not None:
        return f"1f1b-p{args.pipeline}-m{args.micro_batches}"
    if args.workload:
        return f"trace:{os.path.basename(args.workload)}"
    return "data-parallel"


def _jobs(args: argparse.Namespace) -> JobsConfig | None:
    """--jobs: the multi-job workload (None: the synthetic job or a trace)."""
    if not args.jobs:
        return None
    if args.jobs.startswith("philly:"):
        path = args.jobs[len("philly:") :]
        replay = PhillyReplay(
            tuple(read_philly(path)),
            source=path,
            start=args.philly_start,
            count=4000 if args.jobs_count is None else args.jobs_count,
            min_s=args.philly_min_s,
            max_s=args.philly_max_s,
            load=1.0 if args.jobs_load is None else args.jobs_load,
            scale=args.jobs_scale,
            step_s=args.philly_step_s,
            high_max_s=args.philly_high_max_s,
        )
        return JobsConfig(replay=replay, checkpoint_steps=args.jobs_checkpoint_steps)
    if args.jobs != "poisson":
        return load_jobs(args.jobs, args.jobs_checkpoint_steps)
    return JobsConfig(
        count=200 if args.jobs_count is None else args.jobs_count,
        load=0.9 if args.jobs_load is None else args.jobs_load,
        high=args.jobs_high,
        step_ms=args.jobs_step_ms,
        median_steps=args.jobs_steps,
        checkpoint_steps=args.jobs_checkpoint_steps,
    )


def _jobs_main(args: argparse.Namespace, base: SimConfig) -> int:
    """--jobs: each size under the schedulers of --schedulers that run it."""
    from rdmasched.bench.output import run_info

    assert base.jobs is not None
    if args.jobs_out:
        jobs = base.jobs.mix(args.sizes[0], base.leaf, base.seed)
        try:
            with open(args.jobs_out, "w") as f:
                write_jobs(jobs, f)
        except OSError as exc:
            print(f"rdmasched sim: --jobs-out {args.jobs_out}: {exc}", file=sys.stderr)
            return 2
        print(f"{len(jobs)} jobs for {args.sizes[0]} nodes written to {args.jobs_out}")
        return 0
    scheds = [s for s in args.schedulers if s in JOB_SCHEDULERS]
    not_run = [
        {"scheduler": s, "why": "the multi-job workload runs under rdmasched and exclusive"}
        for s in args.schedulers
        if s not in JOB_SCHEDULERS
    ]
    if not scheds:
        print(
            f"rdmasched sim: --jobs runs under {' or '.join(JOB_SCHEDULERS)}; "
            "give one of them in --schedulers",
            file=sys.stderr,
        )
        return 2
    rows = []
    for n in args.sizes:
        for sched in scheds:
            if not args.json:
                print(f"  {sched} at {n} nodes ...", file=sys.stderr, flush=True)
            rows.append(simulate(replace(base, nodes=n, scheduler=sched)))
            gc.collect()
    if args.json:
        doc = {
            "command": "rdmasched sim --jobs",
            "links": base.links.as_dict(),
            "jobs": base.jobs.as_dict(),
            "heartbeat_ms": base.heartbeat_ms,
            "dead_after_ms": base.dead_after_ms,
            "runs": rows,
            "not_run": not_run,
        } | run_info(vars(args))
        print(json.dumps(doc, indent=2))
    else:
        print(format_jobs_table(rows))
    return 0


def _real_demo(args: argparse.Namespace, cfg: SimConfig) -> Any:
    def run(n: int) -> dict[str, Any]:
        from rdmasched.demo.runner import DemoConfig
        from rdmasched.demo.runner import run as demo_run

        leaf, hb, dead = demo_cluster(n, args.full_mesh)
        print(f"real demo at {n} nodes ...", file=sys.stderr)
        demo = DemoConfig(
            nodes=n,
            slots=cfg.slots,
            workload=cfg.workload,
            leaf=leaf,
            heartbeat_ms=hb,
            dead_after_ms=dead,
        )
        return demo_run(demo, progress=False)

    return run


def _call_ns(args: argparse.Namespace, base: SimConfig, say: Any) -> tuple[int, str]:
    """The central coordinator's cost per call, and how it was had: "given"
    (--central-call-ns), "measured" (--measure, printed beside the recorded figure) or
    "recorded" (costs.CENTRAL_CALL, the default)."""
    recorded = int(costs.CENTRAL_CALL.value)
    if args.central_call_ns is not None:
        call, how = args.central_call_ns, "given"
    elif args.measure:
        call, how = measure_central_call_ns(), "measured"
    else:
        call, how = base.central_call_ns, "recorded"
    extra = f"; recorded {recorded} ns ({costs.CENTRAL_CALL.source})" if how != "recorded" else ""
    say(f"central coordinator: {call} ns per call into a node core ({how}{extra})")
    return call, how


def _wakeups_line(w: dict[str, Any]) -> str:
    m, t = w["message"], w["timer"]
    return (
        f"a sleeping loop's wake-up ({w['samples']} of each, spin {w['spin_us']} us): on a "
        f"message p50 {m['p50_us']} us, p99 {m['p99_us']} us, mean {m['mean_us']} us; on its "
        f"timer p50 {t['p50_us']} us, p99 {t['p99_us']} us, mean {t['mean_us']} us"
    )


def _calibrate(args: argparse.Namespace, base: SimConfig, say: Any) -> int:
    """`--calibrate`: the real runs (or those of --calibrate-real), the host model's wake-ups
    measured just before them (unless given), its fit (--fit-sizes), the table."""
    from rdmasched.bench.output import run_info
    from rdmasched.demo.runner import signals_interrupt
    from rdmasched.sim.hostmodel import measure_wakeups

    old: dict[str, Any] | None = args.calibrate_doc
    if old is not None and args.central_call_ns is None and old.get("central_call_ns"):
        call = int(old["central_call_ns"])
        say(f"central coordinator: {call} ns per call into a node core (the real runs' file)")
    else:
        call, _ = _call_ns(args, base, say)
    base = replace(base, central_call_ns=call)
    hm = base.host_model
    wake: dict[str, Any] | None = None
    if hm is not None and "cpus=" not in args.host_model:  # the real runs' host
        hm = replace(hm, cpus=len(os.sched_getaffinity(0)))
        base = replace(base, host_model=hm)
    if hm is not None and "wake=" not in args.host_model:
        wake = (old or {}).get("wakeups") if old else measure_wakeups()
        if wake is not None:
            say(_wakeups_line(wake) + (" (the real runs' file)" if old else " (measured here)"))
            hm = replace(
                hm,
                wake_msg_us=tuple(wake["message"]["percentiles_us"]),
                wake_timer_us=tuple(wake["timer"]["percentiles_us"]),
            )
            base = replace(base, host_model=hm)
    sizes = args.calibrate_sizes
    # SIGTERM/SIGHUP/SIGINT stop the calibration as they stop the demo (its real runs
    # stop their processes and remove their segments), in its simulated runs too
    with signals_interrupt():
        reals = (
            old["reals"]
            if old is not None
            else real_runs(sizes, _real_demo(args, base), rounds=args.calibrate_rounds)
        )
        fit_sizes = list(args.fit_sizes or ())
        fit: dict[str, Any] | None = None
        if fit_sizes:
            hm, best, tried = fit_host_model(
                base, reals, fit_sizes, full_mesh=args.full_mesh, progress=_stderr
            )
            base = replace(base, host_model=hm)
            fit = {"sizes": fit_sizes, "score_pct": best, "fitted": hm.free(), "tried": tried}
            say(f"host model fitted on {fit_sizes} nodes: {hm.free()} (mean error {best:.1f}%)")
        cal = calibrate(base, sizes, reals, full_mesh=args.full_mesh, fitted_on=fit_sizes)
    others = [n for n in sizes if n not in fit_sizes]
    scores = {
        "fitted_sizes_pct": score(cal, fit_sizes) if fit_sizes else None,
        "other_sizes_pct": score(cal, others) if others else None,
    }
    if args.json:
        doc: dict[str, Any] = {"central_call_ns": call, "calibration": cal}
        if base.host_model is not None:
            doc |= {"host_model": base.host_model.as_dict(), "wakeups": wake, "fit": fit}
            doc["scores"] = scores
        if old is not None:
            doc["real_runs_from"] = {
                "file": args.calibrate_real,
                "commit": old.get("commit"),
                "date_utc": old.get("date_utc"),
            }
        print(json.dumps(doc | run_info(vars(args)), indent=2))
    else:
        print(format_calibration(cal))
        if base.host_model is not None:
            print(
                f"host model {base.host_model.free()}, {base.host_model.cpus} CPUs, spin "
                f"{base.host_model.spin_us:g} us: mean |error| of step time, idle % and "
                f"messages per step {_pct(scores['fitted_sizes_pct'])} on the sizes fitted "
                f"on, {_pct(scores['other_sizes_pct'])} on the others"
            )
    return 0


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def main(args: argparse.Namespace) -> int:
    from rdmasched.bench.output import run_info

    logging.getLogger("rdmasched.daemon").setLevel(logging.ERROR)
    base = base_config(args)
    if base.jobs is not None:
        return _jobs_main(args, base)
    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    if args.failures or args.failures_calibrate:
        return _failures(args, base, say)
    if args.measure_wakeups:
        from rdmasched.sim.hostmodel import measure_wakeups

        wake = measure_wakeups()
        load = round(os.getloadavg()[0], 2)
        if args.json:
            print(json.dumps({"wakeups": wake, "loadavg_after": load} | run_info(vars(args))))
        else:
            print(_wakeups_line(wake) + f" (load average {load} after)")
        return 0
    if args.calibrate:
        return _calibrate(args, base, say)
    if args.mixed_calibrate:
        return _mixed_calibrate(args, base)
    cap = args.central_max_nodes
    runs: list[tuple[int, str]] = []
    not_run: list[dict[str, Any]] = []
    for n in args.sizes:
        if args.harvest:
            runs.append((n, ALONE))  # the job-alone reference first
        for sched in args.schedulers:
            if sched in CENTRAL and cap and n > cap:
                why = f"--central-max-nodes {cap}: one coordinator handles every node's tasks"
                not_run.append({"nodes": n, "scheduler": sched, "why": why})
            else:
                runs.append((n, sched))
    needs_central = any(s in CENTRAL for _, s in runs)
    if needs_central or args.measure:
        call, how = _call_ns(args, base, say)
    else:
        call, how = base.central_call_ns, "recorded"
    measured = how == "measured"
    base = replace(base, central_call_ns=call)
    if args.trace:
        base = replace(base, events=args.trace_events)
        replace(base, nodes=max(args.sizes)).check()  # the rings' memory, before any run
    rows: list[dict[str, Any]] = []
    for n, sched in runs:
        if not args.json:
            print(f"  {sched} at {n} nodes ...", file=sys.stderr, flush=True)
        cfg = replace(base, nodes=n, scheduler=sched)
        if sched == ALONE:  # the workload under fifo, its co-located work off
            w = replace(base.workload, background_backlog=0)
            cfg = replace(cfg, scheduler="fifo", workload=w)
        if args.trace:
            sub = args.trace if len(runs) == 1 else os.path.join(args.trace, f"{sched}-n{n}")
            cfg = replace(cfg, trace_dir=sub)
        row = simulate(cfg)
        if args.harvest:
            row["workload"] = _workload_name(args)
            if sched == ALONE:
                row["reference"] = ALONE
        rows.append(row)
        gc.collect()  # the run's cluster (GBs at 100,000 nodes) before the next is built
    compare(rows)
    if args.harvest:
        compare_to_alone(rows)
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        doc = {
            "command": "rdmasched sim",
            "links": base.links.as_dict(),
            "central_call_ns": call,
            "central_call_measured": measured,
            "central_call_how": how,
            "costs": costs.table(),
            "workload": base.workload.as_dict()
            | ({"trace": base.trace.source} if base.trace is not None else {})
            | ({"pipeline": base.pipeline.as_dict()} if base.pipeline is not None else {}),
            **({"mixed": base.mixed.as_dict()} if base.mixed is not None else {}),
            "runs": rows,
            "not_run": not_run,
        } | run_info(vars(args))
        print(json.dumps(doc, indent=2))
    elif args.harvest:
        print(format_harvest(rows))
    elif args.mixed:
        from rdmasched.sim.mixed import format_mixed

        print(format_mixed(rows))
    else:
        print(format_table(rows, not_run))
        if args.plot:
            print(f"plot: {args.plot}")
        for r in rows:
            if r.get("trace"):
                print(f"trace: {r['trace']} ({r['scheduler']} at {r['nodes']} nodes)")
    return 0


def _mixed_calibrate(args: argparse.Namespace, base: SimConfig) -> int:
    """`--mixed-calibrate`: the mixed stream at bench peers' size beside its real figures."""
    from rdmasched.bench.output import run_info
    from rdmasched.errors import RdmaschedError
    from rdmasched.sim import mixed

    dask = costs.CENTRAL_CALL_PRESETS["dask"]
    try:
        rows = mixed.calibrate(base, simulate, dask, args.peers_json)
    except RdmaschedError as exc:
        print(f"rdmasched sim: {exc}", file=sys.stderr)
        return 2
    if args.json:
        doc = {"command": "rdmasched sim --mixed-calibrate", "peers_json": args.peers_json}
        print(json.dumps(doc | {"calibration": rows} | run_info(vars(args)), indent=2))
    else:
        print(mixed.format_calibration(rows))
    return 0


def _failures(args: argparse.Namespace, base: SimConfig, say: Any) -> int:
    """`--failures` and `--failures-calibrate` (rdmasched/sim/failures.py)."""
    from rdmasched.bench.output import run_info
    from rdmasched.errors import RdmaschedError
    from rdmasched.sim import failures as f

    try:
        doc = f.real_failover(args.failover_json)
        if args.failures_calibrate:
            cal = f.calibrate(doc)
            out: dict[str, Any] = {"calibration": cal, "failover_json": args.failover_json}
            text = f.format_calibration(cal)
        else:
            model = f.FailureModel(
                mtbf_node_s=args.mtbf_node_h * 3600,
                ckpt_cost_s=args.ckpt_cost_s,
                ckpt_interval_s=args.ckpt_interval_s,
                pg_timeout_s=args.pg_timeout_s,
                requeue_s=args.requeue_s,
                restart=args.restart,
                window_s=args.window_h * 3600,
                seed=args.seed,
            )
            model.check()
            scheds = tuple(f.REAL_MODE)  # rdmasched and exclusive, whatever --schedulers
            rows: list[dict[str, Any]] = []
            cap = args.failures_measure_max_nodes
            last: dict[str, dict[str, Any]] | None = None
            first: dict[str, dict[str, Any]] | None = None
            checks: list[dict[str, Any]] = []
            for n in sorted(args.sizes):
                reuse = last if cap and n > cap else None
                if cap and n > cap and last is None:
                    print(f"rdmasched sim: no size up to {cap} to measure {n} by", file=sys.stderr)
                    return 2
                got = f.compare(replace(base, nodes=n), model, doc, scheds, say, reuse)
                if reuse is None:
                    last = {r["scheduler"]: r for r in got}
                    if first is None:
                        first = last
                    else:  # measured: beside the model from the smallest size measured
                        cfg_n = replace(base, nodes=n)
                        checks += f.model_check(
                            got, f.compare(cfg_n, model, doc, scheds, None, first)
                        )
                rows += got
                gc.collect()
            out = {"model": model.as_dict(), "failover_json": args.failover_json, "runs": rows}
            out["workload"] = base.workload.as_dict()
            text = f.format_rows(rows)
            if checks:
                out["model_check"] = checks
                text += "\n\n" + f.format_model_check(checks)
    except RdmaschedError as exc:
        print(f"rdmasched sim: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out | run_info(vars(args)), indent=2))
    else:
        print(text)
    return 0


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
