"""`rdmasched sim --calibrate` (issue 9 item 5): the simulator beside real `rdmasched demo`
runs of the same cluster. The demo runs its nodes in a topology (leaves of 8) unless
--full-mesh, so the simulated cluster must be the same one: same lanes, same liveness."""

from __future__ import annotations

import json
import logging

import pytest

from rdmasched.cli import main
from rdmasched.sim.report import demo_cluster

pytestmark = pytest.mark.tier2


def test_calibrate_default_sizes_reach_32() -> None:
    from rdmasched.cli import build_parser

    args = build_parser().parse_args(["sim", "--calibrate"])
    assert args.calibrate_sizes == [4, 8, 16, 32]


def test_demo_cluster_is_the_demos_default() -> None:
    # the demo's own defaults (rdmasched/demo/defaults.py): leaves of 8, liveness by size
    assert demo_cluster(4) == (4, 50, 500)
    assert demo_cluster(16) == (8, 50, 500)
    leaf, hb, dead = demo_cluster(32)
    assert leaf == 8 and hb > 50 and dead > 500
    assert demo_cluster(32, full_mesh=True)[0] is None


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--full-mesh"]])
def test_calibrate_compares_the_same_cluster(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """At 12 nodes (leaves of 8: two leaves, so relays) the simulated rdmasched nodes hold the
    lanes the real demo's do, and both sides report every figure."""
    logging.getLogger("rdmasched.daemon").setLevel(logging.ERROR)
    argv = ["sim", "--calibrate", "--calibrate-sizes", "12", "--steps", "4", "--json"]
    assert main([*argv, "--central-call-ns", "4000", *extra]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["calibration"]
    assert [r["scheduler"] for r in rows] == ["rdmasched", "central"]
    want = "full mesh" if extra else "leaves of 8"
    for r in rows:
        assert r["nodes"] == 12 and r["links"] == want and r["sim_finished"]
        assert len(r["loadavg_before_after_real"]) == 2
        for name in ("step_time_ms", "slot_idle_pct", "msgs_per_step", "msgs_per_step_no_hb"):
            assert r[f"sim_{name}"] is not None and r[f"real_{name}"] is not None
    a = rows[0]
    assert a["sim_lanes_per_node"] == a["real_lanes_per_node"]
    assert a["sim_lanes_per_node"] == (11 if extra else 8)
    # rdmasched's control messages other than heartbeats (the sync tree's, or flat sync's,
    # each relay hop counted) are the protocol's, not the host's: the model has them right
    # (heartbeats per step grow with the step's wall time, which the model does not have)
    assert abs(a["diff_msgs_per_step_no_hb_pct"]) <= 15
    assert a["sim_msgs_per_step_no_hb"] > 0


@pytest.mark.slow
def test_host_model_gives_the_real_runs_shape(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21 item 5: real demo runs of N processes on this host's few CPUs take longer
    steps as N grows (every message and timer waits for a wake-up and a CPU); the simulator
    with the host model (as many CPUs as this host, its wake-ups measured here) does too,
    and without it (a CPU per node) it does not. A property, not a figure: loose enough not
    to depend on the machine's load."""
    import os

    logging.getLogger("rdmasched.daemon").setLevel(logging.ERROR)
    cpus = len(os.sched_getaffinity(0))
    small, big = 4, min(32, 16 * cpus)  # here 32: the step grows 1.6-1.7x (16: 1.2x)
    argv = ["sim", "--calibrate", "--calibrate-sizes", f"{small},{big}", "--steps", "20"]
    assert main([*argv, "--host-model", "--central-call-ns", "4000", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["host_model"]["cpus"] == cpus
    assert doc["wakeups"]["message"]["p50_us"] > 0
    rows = {r["nodes"]: r for r in doc["calibration"] if r["scheduler"] == "rdmasched"}

    def grows(key: str) -> float:
        return float(rows[big][key] / rows[small][key])

    real, hosted, plain = (
        grows("real_step_time_ms"),
        grows("sim_step_time_ms"),
        grows("plain_sim_step_time_ms"),
    )
    assert real > 1.3, f"the real step did not grow from {small} to {big} nodes: {real:.2f}x"
    assert hosted > 1.3, f"with the host model: {hosted:.2f}x (real {real:.2f}x)"
    assert plain < 1.1, f"without it (a CPU per node): {plain:.2f}x"
    for r in doc["calibration"]:
        assert r["sim_finished"] and r["host_model"]["cpu_busy_pct"] > 0
