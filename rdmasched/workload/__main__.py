"""`python -m rdmasched.workload FILE`: what a torch.profiler trace or a Chakra execution trace
becomes as a workload."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rdmasched.workload import load
from rdmasched.workload.chakra import looks_like_chakra
from rdmasched.workload.model import PHASES, ComputeTask, SyncTask, Workload, WorkloadError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rdmasched.workload",
        description="Read a torch.profiler Chrome trace (.json or .json.gz) or a Chakra execution "
        "trace (.et) of one DDP rank and "
        "print its workload: steps, compute time per phase, gradient buckets and their sizes, "
        "and the dependency graph (docs/WORKLOADS.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "file", metavar="FILE", help="the trace (export_chrome_trace output, or a Chakra .et)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument(
        "--graph", action="store_true", help="also list every task with its dependencies"
    )
    return p


def _text(wl: Workload, graph: bool, chakra: bool = False) -> str:
    lines = [
        f"{wl.source}: {wl.device} trace, backend {wl.backend or '?'}, "
        f"rank {wl.rank if wl.rank is not None else '?'} of "
        f"{wl.world_size if wl.world_size is not None else '?'}, {len(wl.steps)} steps"
    ]
    for s in wl.steps:
        name = f"ProfilerStep#{s.profiler_step}" if s.profiler_step is not None else "whole trace"
        comp = ", ".join(f"{p} {s.compute_ns(p) / 1e3:.0f}" for p in PHASES)
        lines.append(
            f"step {s.index} ({name}): {s.duration_ns / 1e3:.0f} us wall; compute us: {comp}"
        )
        sizes = ", ".join(f"{b.nbytes}" for b in s.buckets)
        lines.append(f"  {len(s.buckets)} gradient buckets, bytes: [{sizes}]")
        for x in s.syncs:
            if not x.is_bucket:
                lines.append(
                    f"  other sync {x.name} ({x.phase}, {x.stream}): {x.nbytes} bytes, "
                    f"ran {x.duration_ns / 1e3:.0f} us"
                )
        if s.device_idle_pct:
            idle = ", ".join(f"{k} {v:.1f}" for k, v in s.device_idle_pct.items())
            lines.append(f"  device idle % (HTA's count): {idle}")
        if graph:
            for t in s.tasks:
                what = (
                    f"{t.duration_ns / 1e3:.1f} us, {t.ops} ops"
                    if isinstance(t, ComputeTask)
                    else f"{t.nbytes} B, ran {t.duration_ns / 1e3:.1f} us"
                )
                assert isinstance(t, ComputeTask | SyncTask)
                lines.append(f"    [{t.id}] {t.name:<14} {what}; after {list(t.deps)}")
    if chakra:
        lines.append(
            "dependencies: the trace's own (ctrl_deps and data_deps), between the tasks that "
            "hold the nodes; a task without any follows the one before it"
        )
    else:
        lines.append(
            "dependencies: compute in issue order; each sync after the compute that produced it "
            "(a collective other than a bucket also after the one before it on its stream); "
            "a collective other than a bucket holds up the first compute that started after it "
            "ended; the optimizer after the step's buckets; side streams in their own order; "
            "the next step after the last task"
        )
    if wl.ignored:
        lines.append(
            "ignored events: " + ", ".join(f"{k} {v}" for k, v in sorted(wl.ignored.items()))
        )
    for w in wl.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        wl = load(args.file)
    except WorkloadError as exc:
        print(f"python -m rdmasched.workload: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = wl.to_dict() if args.graph else wl.summary()
        print(json.dumps(out, indent=2))
    else:
        print(_text(wl, args.graph, looks_like_chakra(args.file)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
