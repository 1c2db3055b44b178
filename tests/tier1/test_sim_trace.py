"""Trace replay true to the trace (issue 21 item 3), its two targets kept as tests:

1. one job replayed alone reproduces its trace's own step (as its GPU ran it) within 10%;
2. the gain of priority (fifo's step against rdmasched's) agrees within 1 point with the
   small model of the same trace (rdmasched.workload.critpath, none of the simulator's
   code), on the real traces and on a DDP-shaped case built from the ResNet-50 trace's
   measured kernels on a slower network, where priority order does gain.

And: collectives keep their measured time up to the traced world size, the link model
(per collective) past it or when asked; device idle per stream beside slot idle."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from rdmasched.cli import main
from rdmasched.demo.job import WorkloadConfig
from rdmasched.sim import PRESETS, Run, SimConfig
from rdmasched.sim.linkmodel import LinkModel
from rdmasched.sim.trace import bus_factor, collective_ns, sync_times
from rdmasched.sim.tracefig import ethernet, figures
from rdmasched.workload import Workload, load
from rdmasched.workload.critpath import replay
from rdmasched.workload.streams import Mode

TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
STEPS = 8
#: a 10 Gb/s network (1.25 GB/s, 10 us a message): slower than the compute of the ResNet-50
#: trace's backward, where the order of its buckets matters
ETH10 = ethernet(10)


@cache
def trace(name: str) -> Workload:
    suffix = ".et" if name.endswith("chakra") else ".json.gz"
    return load(TRACES / f"{name}{suffix}")


def sim(
    name: str,
    scheduler: str,
    nodes: int = 0,
    mode: Mode = "host",
    links: LinkModel = PRESETS["ib"],
    link_model: bool = False,
) -> tuple[dict[str, Any], Run]:
    wl = trace(name)
    c = SimConfig(
        nodes=nodes or wl.world_size or 2,
        scheduler=scheduler,
        workload=WorkloadConfig(steps=STEPS, background_backlog=0),
        trace=wl,
        trace_mode=mode,
        links=links,
        link_model=link_model,
    )
    run = Run(c)
    r = run.run()
    assert r["finished"], r["stopped"]
    return r, run


def own_step_ms(name: str) -> float:
    steps = trace(name).device_steps_ns()
    return sum(steps) / len(steps) / 1e6


@pytest.mark.parametrize("name", ["dlrm-hta", "resnet50-hta"])
def test_target_1_one_job_alone_reproduces_its_traces_step(name: str) -> None:
    """At the traced world size, alone (no background work), with the host that issued the
    ops: the replayed step within 10% of the trace's own step as its GPU ran it."""
    for scheduler in ("fifo", "rdmasched"):
        r, _ = sim(name, scheduler)
        assert abs(r["step_time_ms"] / own_step_ms(name) - 1) < 0.10, r["step_time_ms"]


def test_the_gpu_alone_is_no_slower_than_its_trace() -> None:
    """Without the host (mode "device") the replay is the GPU's alone: never slower than
    the trace (whose step holds the host's waits too). The DLRM rank's GPU waited for its
    host about a tenth of its step (68.5 ms against 76.8); the ResNet-50 rank's was idle
    77% of it, waiting for a host that took about 100 ms for each of forward and backward."""
    dlrm, _ = sim("dlrm-hta", "fifo", mode="device")
    assert 0.85 < dlrm["step_time_ms"] / own_step_ms("dlrm-hta") < 1.0
    resnet, _ = sim("resnet50-hta", "fifo", mode="device")
    assert resnet["step_time_ms"] / own_step_ms("resnet50-hta") < 0.9


def test_the_review_s_replay_no_longer() -> None:
    """The review: the DLRM trace of 8 ranks at 8 nodes gave 166 ms a step where its own
    steps are 75-81 ms (every collective the all-reduce formula, at 12.5 GB/s)."""
    r, run = sim("dlrm-hta", "rdmasched")
    assert r["step_time_ms"] < 85
    wl = trace("dlrm-hta")
    measured = {x.id: x.duration_ns for s in wl.steps for x in s.syncs}
    assert run.sync_ns == measured


def _gain(fifo: dict[str, Any], prio: dict[str, Any]) -> float:
    return 100.0 * (fifo["step_time_ms"] - prio["step_time_ms"]) / fifo["step_time_ms"]


def _model_gain(name: str, sync_ns: dict[int, int], mode: Mode) -> float:
    wl = trace(name)
    a = replay(wl, "launch", STEPS, sync_ns, mode).step_ns
    b = replay(wl, "priority", STEPS, sync_ns, mode).step_ns
    return 100.0 * (a - b) / a


@pytest.mark.parametrize(
    ("name", "nodes", "mode", "links", "least"),
    [
        ("dlrm-hta", 0, "host", PRESETS["ib"], None),
        ("resnet50-hta", 0, "host", PRESETS["ib"], None),
        ("mlp", 0, "host", PRESETS["ib"], None),
        # DDP-shaped: ResNet-50's measured kernels (GPU-bound), 16 ranks, 10 Gb/s
        ("resnet50-hta", 16, "kernels", ETH10, 3.0),
    ],
)
def test_target_2_priority_gain_agrees_with_the_model(
    name: str, nodes: int, mode: Mode, links: LinkModel, least: float | None
) -> None:
    fifo, run = sim(name, "fifo", nodes, mode, links, link_model=nodes > 0)
    prio, _ = sim(name, "rdmasched", nodes, mode, links, link_model=nodes > 0)
    got = _gain(fifo, prio)
    model = _model_gain(name, run.sync_ns, mode)
    assert abs(got - model) <= 1.0, (got, model)
    if least is not None:  # where the network lags, priority order does gain
        assert got >= least and model >= least
    # and the model's steps are the simulator's (no rendezvous in the model: within 2%)
    a = replay(trace(name), "launch", STEPS, run.sync_ns, mode).step_ns / 1e6
    assert abs(fifo["step_time_ms"] / a - 1) < 0.02


def test_device_idle_per_stream_beside_slot_idle() -> None:
    """HTA's count: time with no kernel on a stream / on any stream; the replay's against
    the trace's own (its steps' device_idle_pct), within 5 points."""
    for name in ("dlrm-hta", "resnet50-hta"):
        r, _ = sim(name, "rdmasched")
        own = [s.device_idle_pct for s in trace(name).steps if s.device_idle_pct]
        mean = {k: sum(o[k] for o in own) / len(own) for k in own[0]}
        assert abs(r["device_idle_pct"] - mean["device"]) < 5, (r["device_idle_pct"], mean)
        assert abs(r["stream_idle_pct"]["compute"] - mean["compute"]) < 5
        assert set(r["stream_idle_pct"]) == set(mean) - {"device"}
        assert "slot_idle_pct" in r and r["device_idle_pct"] <= min(r["stream_idle_pct"].values())


def test_collectives_measured_up_to_the_traced_world_then_the_link_model() -> None:
    wl = trace("dlrm-hta")
    ib = PRESETS["ib"]
    measured = sync_times(wl, 8, ib, 1)
    assert all(measured[x.id] == x.duration_ns for s in wl.steps for x in s.syncs)
    past = sync_times(wl, 16, ib, 1)
    forced = sync_times(wl, 8, ib, 1, force_model=True)
    for s in wl.steps:
        for x in s.syncs:
            assert past[x.id] == collective_ns(x.collective, x.nbytes, 16, ib, 1)
            assert forced[x.id] == collective_ns(x.collective, x.nbytes, 8, ib, 1)
    big = next(x for x in wl.steps[0].syncs if x.nbytes > 250_000_000)
    # an all_to_all moves (n-1)/n of its bytes, not an all-reduce's 2(n-1)/n
    bw = ib.levels[1].bandwidth
    assert forced[big.id] == pytest.approx(7 / 8 * big.nbytes / bw * 1e9, rel=0.01)


def test_bus_factors_are_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for c in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(c, 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 8) == 1.0
    assert collective_ns("all_reduce", 1 << 20, 1, PRESETS["ib"], 1) == 0


@pytest.mark.parametrize("name", ["lm", "mlp", "mlp-chakra"])
def test_the_cpu_traces_still_replay(name: str) -> None:
    for scheduler in ("fifo", "rdmasched", "central"):
        r, _ = sim(name, scheduler)
        assert r["steps"] == STEPS and r["step_time_ms"] > 0
        assert 0 <= r["device_idle_pct"] <= 100


def test_cli_link_model_and_trace_mode(capsys: pytest.CaptureFixture[str]) -> None:
    f = str(TRACES / "resnet50-hta.json.gz")
    base = ["sim", "--sizes", "2", "--steps", "3", "--backlog", "0", "--workload", f]
    base += ["--schedulers", "rdmasched", "--json"]
    assert main(base) == 0
    measured = json.loads(capsys.readouterr().out)["runs"][0]
    assert main([*base, "--trace-mode", "kernels", "--link-model"]) == 0
    kernels = json.loads(capsys.readouterr().out)["runs"][0]
    assert kernels["step_time_ms"] < 0.5 * measured["step_time_ms"]
    assert {"compute", "comm.0"} <= set(kernels["stream_idle_pct"])
    assert main([*base, "--trace-mode", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--trace-mode" in err and len(err.strip().splitlines()) == 1


def test_tracefig_prints_the_targets(capsys: pytest.CaptureFixture[str]) -> None:
    from rdmasched.sim.tracefig import main as tracefig

    out = figures(str(TRACES / "resnet50-hta.json.gz"), 16, "kernels", 10.0, 4)
    assert out["collectives"] == "link model" and out["nodes"] == 16
    assert abs(out["priority_gain_pct"]["sim"] - out["priority_gain_pct"]["model"]) <= 1.0
    assert tracefig([str(TRACES / "mlp.json.gz"), "--steps", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["collectives"] == "measured" and doc["replay"]["fifo"]["finished"]
    assert tracefig([str(TRACES / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
