"""A demo stopped while it is still starting its processes (issue 20 item 15: SIGTERM of a
`sim --calibrate` at 1,000 nodes did not stop it, and left its segments): the processes
already started are stopped and the cluster's shared memory removed."""

from __future__ import annotations

import contextlib
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


@pytest.mark.slow
def test_sigterm_stops_a_calibration_and_removes_its_segments() -> None:
    """`sim --calibrate`: SIGTERM during its real demo run stops it within seconds, one line,
    no traceback, no segment of its cluster left."""
    import os
    import subprocess
    import sys

    argv = ["sim", "--calibrate", "--calibrate-sizes", "4", "--steps", "10000000"]
    p = subprocess.Popen(
        [sys.executable, "-m", "rdmasched.cli", *argv, "--central-call-ns", "4000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    mine = shm.lane_segment_name(f"rdma{p.pid % 10000}")  # runner.run_mode's cluster names
    try:
        deadline = time.monotonic() + 120
        while len([s for s in shm.list_segments() if s.startswith(mine)]) < 4 * 3:
            assert p.poll() is None, p.communicate()[1]
            assert time.monotonic() < deadline, "the real demo's lanes did not appear"
            time.sleep(0.05)
        time.sleep(0.5)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        assert time.monotonic() - t0 < 5, err
        assert p.returncode == 128 + signal.SIGTERM, err
        assert err.rstrip().endswith("rdmasched sim: stopped by SIGTERM"), err[-500:]
        assert "Traceback" not in err
        assert not [s for s in shm.list_segments() if s.startswith(mine)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)
        for s in shm.list_segments():
            if s.startswith(mine):
                shm.ShmSegment.unlink_name(s)
