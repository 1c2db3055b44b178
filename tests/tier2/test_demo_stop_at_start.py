"""A demo stopped while it is still starting its processes (issue 20 item 15: SIGTERM of a
`sim --calibrate` at 1,000 nodes did not stop it, and left its segments): the processes
already started are stopped and the cluster's shared memory removed."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from rdmasched.demo import runner
from rdmasched.demo.job import WorkloadConfig
from rdmasched.transport import shm

pytestmark = pytest.mark.tier2


def test_a_signal_while_starting_stops_the_started_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[Any] = []
    real = runner.ctx.Process

    def process(*a: Any, **kw: Any) -> Any:
        p = real(*a, **kw)
        start = p.start

        def start_then_maybe_stop() -> None:
            if len(started) == 3:  # SIGTERM arrives as the fourth process starts
                raise runner.Interrupted(signal.SIGTERM)
            start()
            started.append(p)

        p.start = start_then_maybe_stop
        return p

    monkeypatch.setattr(runner.ctx, "Process", process)
    before = set(shm.list_segments())
    cfg = runner.DemoConfig(nodes=6, workload=WorkloadConfig(steps=1_000_000))
    t0 = time.monotonic()
    with pytest.raises(runner.Interrupted):
        runner.run_mode("rdmasched", cfg, None)
    assert time.monotonic() - t0 < 5  # the brief: a SIGTERM stops it within 5 s
    assert len(started) == 3
    for p in started:
        p.join(5)
        assert not p.is_alive(), "a started node process was left running"
    left = set(shm.list_segments()) - before
    assert not {s for s in left if "rdma" in s}, left
