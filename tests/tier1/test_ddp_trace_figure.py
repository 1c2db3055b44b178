"""The profiler trace of a managed run that `examples/ddp_train.py --compare --trace` wrote
(docs/figures/ddp-managed.json.gz, shown in docs/TORCH.md) is a workload the parser reads
(issue 10 item 5): every profiled step has DDP's gradient buckets, the same ones each step,
started from the scheduler's comm thread, and rank 0's choices of their order."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rdmasched.workload import load

TRACE = Path(__file__).resolve().parents[2] / "docs" / "figures" / "ddp-managed.json.gz"


def test_the_managed_runs_trace_parses_with_its_buckets() -> None:
    wl = load(TRACE)
    wl.validate()
    assert not wl.warnings
    assert wl.device == "cpu" and wl.backend == "gloo" and wl.world_size == 2
    assert len(wl.steps) == 3  # schedule(wait=1, warmup=1, active=3)
    sizes = [Counter(b.nbytes for b in s.buckets) for s in wl.steps]
    assert sizes[0] and all(s == sizes[0] for s in sizes)  # the same buckets, any order
    for s in wl.steps:
        assert all(b.nbytes > 0 and b.collective == "all_reduce" for b in s.buckets)
        # one 16-byte broadcast (rank 0's choice: two int64s) per bucket
        choices = [t for t in s.syncs if t.collective == "broadcast" and t.nbytes == 16]
        assert len(choices) == len(s.buckets)
