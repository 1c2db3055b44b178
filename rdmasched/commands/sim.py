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
from rdmasched.sim.hostmodel import SPEC_KEYS, parse_spec
from rdmasched.sim.linkmodel import PRESETS, preset
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
from rdmasched.sim.run import CENTRAL, SCHEDULERS, SimConfig, measure_central_call_ns, simulate

HELP = (
    "simulate a cluster of up to 100,000 nodes running the real node core, against "
    "central, k8s-class and fifo baselines (docs/SIM.md)"
)
#: the default of --central-max-nodes: the baselines at every size
CENTRAL_MAX_NODES = 0


def _schedulers(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in out if x not in SCHEDULERS]
    if not out or bad:
        raise argparse.ArgumentTypeError(
            f"schedulers are a comma-separated subset of {','.join(SCHEDULERS)}"
        )
    return list(dict.fromkeys(out))


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
        default=",".join(SCHEDULERS),
        help="schedulers to run at each size, comma-separated",
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
        type=_pos_int,
        help="the central coordinator's cost per call into a node core (default measured "
        "at start-up by timing the real coordinator code)",
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


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the simulator takes is what `demo`, `topology` and the cluster config take: the
    same liveness rule, the same leaf/pod rule; the calibration's real runs are demo runs,
    at most the demo's nodes; and every size's configuration checked before any run."""
    from rdmasched.errors import RdmaschedError
    from rdmasched.topology import check_leaf_pod

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
    if args.fit_sizes is not None:
        if not (args.calibrate and args.host_model is not None):
            parser.error("--fit-sizes fits the host model: it needs --calibrate --host-model")
        out = [n for n in args.fit_sizes if n not in args.calibrate_sizes]
        if out:
            parser.error(f"--fit-sizes {out[0]}: not one of --calibrate-sizes")
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
        full_mesh=args.full_mesh,
        host_model=None if args.host_model is None else parse_spec(args.host_model),
    )
    return cfg


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
    call = args.central_call_ns or (old or {}).get("central_call_ns") or measure_central_call_ns()
    how = (
        "given" if args.central_call_ns else ("of the real runs' file" if old else "measured here")
    )
    say(f"central coordinator: {call} ns per call into a node core ({how})")
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
        reals = old["reals"] if old is not None else real_runs(sizes, _real_demo(args, base))
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
    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    if args.measure_wakeups:
        from rdmasched.sim.hostmodel import measure_wakeups

        w = measure_wakeups()
        load = round(os.getloadavg()[0], 2)
        if args.json:
            print(json.dumps({"wakeups": w, "loadavg_after": load} | run_info(vars(args))))
        else:
            print(_wakeups_line(w) + f" (load average {load} after)")
        return 0
    if args.calibrate:
        return _calibrate(args, base, say)
    cap = args.central_max_nodes
    runs: list[tuple[int, str]] = []
    not_run: list[dict[str, Any]] = []
    for n in args.sizes:
        for sched in args.schedulers:
            if sched in CENTRAL and cap and n > cap:
                why = f"--central-max-nodes {cap}: one coordinator handles every node's tasks"
                not_run.append({"nodes": n, "scheduler": sched, "why": why})
            else:
                runs.append((n, sched))
    needs_central = any(s in CENTRAL for _, s in runs)
    call = args.central_call_ns
    measured = False
    if call is None:
        call = measure_central_call_ns() if needs_central else base.central_call_ns
        measured = needs_central
    if needs_central:
        how = "measured on this machine" if measured else "given"
        say(f"central coordinator: {call} ns per call into a node core ({how})")
    base = replace(base, central_call_ns=call)
    if args.trace:
        base = replace(base, events=args.trace_events)
        replace(base, nodes=max(args.sizes)).check()  # the rings' memory, before any run
    rows: list[dict[str, Any]] = []
    for n, sched in runs:
        if not args.json:
            print(f"  {sched} at {n} nodes ...", file=sys.stderr, flush=True)
        cfg = replace(base, nodes=n, scheduler=sched)
        if args.trace:
            sub = args.trace if len(runs) == 1 else os.path.join(args.trace, f"{sched}-n{n}")
            cfg = replace(cfg, trace_dir=sub)
        rows.append(simulate(cfg))
        gc.collect()  # the run's cluster (GBs at 100,000 nodes) before the next is built
    compare(rows)
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        doc = {
            "command": "rdmasched sim",
            "links": base.links.as_dict(),
            "central_call_ns": call,
            "central_call_measured": measured,
            "workload": base.workload.as_dict()
            | ({"trace": base.trace.source} if base.trace is not None else {}),
            "runs": rows,
            "not_run": not_run,
        } | run_info(vars(args))
        print(json.dumps(doc, indent=2))
    else:
        print(format_table(rows, not_run))
        if args.plot:
            print(f"plot: {args.plot}")
        for r in rows:
            if r.get("trace"):
                print(f"trace: {r['trace']} ({r['scheduler']} at {r['nodes']} nodes)")
    return 0


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
