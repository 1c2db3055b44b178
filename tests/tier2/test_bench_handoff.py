"""`rdmasched.bench.handoff` runs end to end and returns its figures (issue 20 item 1); the
figures themselves are in docs/PERFORMANCE.md, never asserted on (a shared machine)."""

from __future__ import annotations

from rdmasched.bench import handoff


def test_submit_latency_returns_percentiles() -> None:
    f = handoff.submit_latency(calls=50)
    assert f["calls"] == 50 and 0 < f["p50_us"] <= f["p99_us"] <= f["max_us"]


def test_client_throughput_runs_every_task_of_every_rank() -> None:
    f = handoff.client_throughput(ranks=2, tasks=100, inflight=4, slots=2)
    assert f["tasks"] == 200 and f["tasks_per_s"] > 0
    assert f["daemon_msgs_in"] >= 2 * 200  # a submit and a complete per task, at least
