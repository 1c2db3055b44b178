"""The harvest workload in the simulator (issue 21 item 4): co-located work on the job's
devices, the device's preemption cost, the `timeslice` baseline, the 1F1B pipeline job.
Everything here runs in one process on the virtual clock."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rdmasched.cli import main
from rdmasched.demo.job import WorkloadConfig
from rdmasched.demo.taskid import KIND_BACKGROUND, KIND_COMPUTE, task_kind
from rdmasched.errors import ArgumentError
from rdmasched.sim import Run, SimConfig, simulate
from rdmasched.sim.harvest import TIMESLICE_INTERFERENCE
from rdmasched.sim.pipeline import BACKWARD, FORWARD, PipelineConfig, bubble_fraction, schedule
from rdmasched.workload import load
from rdmasched.workload.streams import COMPUTE

TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
PIPE = PipelineConfig(stages=4, micro_batches=8, forward_ms=1.0, backward_ms=2.0)


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("rdmasched.daemon").setLevel(logging.ERROR)


def cfg(
    n: int, scheduler: str = "rdmasched", backlog: int = 4, steps: int = 3, **kw: Any
) -> SimConfig:
    w = WorkloadConfig(steps=steps, background_backlog=backlog)
    return SimConfig(nodes=n, scheduler=scheduler, workload=w, harvest=True, **kw)


def alone(c: SimConfig) -> dict[str, Any]:
    """The job-alone reference: the workload under fifo, its co-located work off."""
    return simulate(
        replace(c, scheduler="fifo", workload=replace(c.workload, background_backlog=0))
    )


# ---- the 1F1B pipeline ----------------------------------------------------------------------
@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 16), (4, 2), (1, 4)])
def test_the_1f1b_order_runs_every_pass_once_forward_before_backward(p: int, m: int) -> None:
    for s in range(p):
        order = schedule(s, p, m)
        assert sorted(order) == sorted(
            [(FORWARD, j) for j in range(m)] + [(BACKWARD, j) for j in range(m)]
        )
        assert all(order.index((FORWARD, j)) < order.index((BACKWARD, j)) for j in range(m))
        # in flight on stage s: at most p - s forwards without their backward (1F1B's memory)
        live = peak = 0
        for kind, _ in order:
            live += 1 if kind == FORWARD else -1
            peak = max(peak, live)
        assert peak == min(p - s, m)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 16), (4, 2)])
def test_the_1f1b_bubble_of_a_replay_equals_the_formula(p: int, m: int) -> None:
    pipe = PipelineConfig(stages=p, micro_batches=m, forward_ms=1.0, backward_ms=2.0)
    r = simulate(cfg(2 * p, "fifo", backlog=0, pipeline=pipe))
    assert r["finished"] and r["steps"] == 3
    assert r["pipeline_bubble_formula_pct"] == pytest.approx(100 * (p - 1) / (m + p - 1))
    assert bubble_fraction(p, m) == (p - 1) / (m + p - 1)
    # the replay's bubble is the formula's plus the transfers (a link's latency a hop)
    assert r["pipeline_bubble_formula_pct"] <= r["pipeline_bubble_pct"]
    assert r["pipeline_bubble_pct"] == pytest.approx(r["pipeline_bubble_formula_pct"], abs=0.1)


def test_activations_over_the_link_widen_the_bubble() -> None:
    base = simulate(cfg(8, "fifo", backlog=0, pipeline=PIPE))
    big = simulate(cfg(8, "fifo", backlog=0, pipeline=replace(PIPE, activation_mb=50.0)))
    assert big["pipeline_bubble_pct"] > base["pipeline_bubble_pct"] + 1


def test_a_pipeline_needs_whole_pipelines() -> None:
    with pytest.raises(ArgumentError, match="multiple of the stages"):
        SimConfig(nodes=6, pipeline=PIPE).check()


# ---- the device's preemption cost -----------------------------------------------------------
@pytest.mark.parametrize("workload", ["data-parallel", "1f1b"])
def test_with_no_device_preemption_cost_the_job_steps_as_alone_while_work_is_harvested(
    workload: str,
) -> None:
    kw: dict[str, Any] = {"device_preempt_us": 0.0}
    if workload == "1f1b":
        kw["pipeline"] = PIPE
    c = cfg(16, **kw)
    r, a = simulate(c), alone(c)
    assert r["finished"] and a["finished"]
    assert r["step_time_ms"] == pytest.approx(a["step_time_ms"], rel=1e-3)
    assert r["harvested_device_s"] > 0.1 * r["job_device_s"]
    assert a["harvested_device_s"] == 0
    assert r["job_device_s"] == pytest.approx(a["job_device_s"], rel=1e-6)
    assert r["cluster_idle_pct"] < a["cluster_idle_pct"] / 2
    assert r["useful_pct"] > a["useful_pct"]


def test_the_device_preemption_cost_delays_the_job_by_what_it_charges() -> None:
    c = cfg(16, device_preempt_us=100.0)
    r, free = simulate(c), simulate(replace(c, device_preempt_us=0.0))
    assert r["device_switches"] > 0
    assert r["switch_device_s"] == pytest.approx(r["device_switches"] * 100e-6, rel=0.01)
    assert r["step_time_ms"] > free["step_time_ms"] + 0.1  # two switches on a step's path
    assert r["step_time_ms"] < free["step_time_ms"] + 3 * 0.1
    # the victim keeps its progress: the co-located work done is the same work
    assert r["harvested_device_s"] == pytest.approx(free["harvested_device_s"], rel=0.2)


def test_a_victim_that_began_this_instant_costs_no_switch() -> None:
    """One node, one device, no gap in the job: every co-located task that takes the freed
    slot is preempted at the same instant by the job's next task (launched ahead on a real
    stream), so the device never switches and nothing is harvested."""
    w = WorkloadConfig(steps=2, jitter=0.0, background_backlog=1)
    c = SimConfig(nodes=1, slots=1, workload=w, harvest=True, device_preempt_us=100.0)
    r = simulate(c)
    assert r["device_switches"] == 0 and r["harvested_device_s"] == 0
    assert r["step_time_ms"] == pytest.approx(5.0)


def test_no_co_located_work_no_switch() -> None:
    r = simulate(cfg(16, "fifo", backlog=0, device_preempt_us=1000.0))
    assert r["device_switches"] == 0 and r["harvested_device_s"] == 0


# ---- timeslice ------------------------------------------------------------------------------
def test_the_interference_factor_is_the_real_ddp_examples() -> None:
    assert round(TIMESLICE_INTERFERENCE, 6) == round(88.2 / 49.1, 6)


@pytest.mark.parametrize("pipeline", [None, PIPE])
def test_timeslice_slows_the_job_by_the_calibrated_factor(pipeline: PipelineConfig | None) -> None:
    c = cfg(16, "timeslice", pipeline=pipeline)
    r, a = simulate(c), alone(c)
    assert r["finished"]
    assert r["step_time_ms"] / a["step_time_ms"] == pytest.approx(TIMESLICE_INTERFERENCE, rel=0.01)
    assert r["device_switches"] == 0  # no preemption: the device is shared
    assert r["harvested_device_s"] > 0
    # while they share a device the co-located task gets the rest of it
    f = TIMESLICE_INTERFERENCE
    device = r["device_s"]
    job_time = r["job_device_s"] * f
    assert r["harvested_device_s"] <= (device - job_time) + job_time * (1 - 1 / f) + 1e-3
    other = simulate(replace(c, interference=3.0))
    assert other["step_time_ms"] / a["step_time_ms"] == pytest.approx(3.0, rel=0.01)


# ---- conservation ---------------------------------------------------------------------------
@pytest.mark.parametrize("scheduler", ["rdmasched", "fifo", "timeslice"])
@pytest.mark.parametrize("workload", ["data-parallel", "1f1b", "trace"])
def test_conservation_of_the_co_located_work(scheduler: str, workload: str) -> None:
    """Every co-located task submitted is completed once, or is still running or queued at
    the end (on the node core, or on the device under timeslice): nothing run twice,
    nothing lost; every job task completes once."""
    c = cfg(
        8,
        scheduler,
        backlog=6,
        device_preempt_us=40.0,
        sigma=0.1,
        pipeline=PIPE if workload == "1f1b" else None,
        trace=load(str(TRACES / "dlrm-hta.json.gz")) if workload == "trace" else None,
    )
    run = Run(c)
    r = run.run()
    assert r["finished"], r["stopped"]
    led = run.ledger
    assert all(v == 1 for v in led.completed.values()), "a task completed twice"
    assert led.run_starts == led.run_ends + sum(len(t.started_at) for t in run.trainers)
    for h, core in zip(run.harvests, run.cores, strict=True):
        assert all(v == 1 for v in h.colocated_done.values())
        submitted = h.colocated_submitted
        assert all(v == 1 for v in submitted.values()), "a co-located task submitted twice"
        held = [t.id for t in (*core.scheduler.running(), *core.scheduler.queued())]
        held = [t for t in held if task_kind(t) == KIND_BACKGROUND] + h.in_flight()
        done = set(h.colocated_done)
        assert not done & set(held)
        assert sorted(done | set(held)) == sorted(submitted), "a co-located task was lost"
        if scheduler != "timeslice":
            assert {tid for node, tid in led.completed if node == h.trainer.node} >= done
        assert h.harvested <= len(done)
    computes = [k for k in led.completed if task_kind(k[1]) == KIND_COMPUTE]
    if workload == "trace":  # every node's every compute-stream kernel, once
        assert len(computes) == 8 * compute_ops(c)
    else:
        assert len(computes) >= 3 * 8 * c.slots


# ---- a traced job's devices (the real A100 traces) ------------------------------------------
VARIABLE = ("wall_s", "cpu_s", "build_s", "build_cpu_s", "events_per_s", "events_per_cpu_s")


def traced(name: str, scheduler: str = "rdmasched", nodes: int = 0, **kw: Any) -> SimConfig:
    wl = load(str(TRACES / f"{name}.json.gz"))
    kw.setdefault("device_preempt_us", 40.0)
    return cfg(nodes or wl.world_size or 2, scheduler, steps=4, trace=wl, **kw)


def compute_ops(c: SimConfig) -> int:
    """The compute-stream ops of one node's replay (each is one kernel task on the core)."""
    run = Run(c)
    assert run.replay is not None
    return sum(
        sum(o.stream == COMPUTE for o in run.replay.plans[r % len(run.replay.plans)])
        for r in range(c.workload.steps)
    )


@pytest.mark.parametrize("name", ["dlrm-hta", "resnet50-hta"])
def test_a_traced_jobs_kernels_preempt_the_co_located_work_under_rdmasched(name: str) -> None:
    """The replay's compute-stream kernels are the job's tasks on the core's slot: under
    rdmasched the core preempts the co-located work for each (a switch each time a kernel
    finds the device harvested), the job steps within +1% of alone's, and with a free
    switch exactly as alone; under fifo (one priority) the kernels wait behind it."""
    c = traced(name)
    r, a = simulate(c), alone(c)
    assert r["finished"] and a["finished"]
    assert r["harvested_device_s"] > 0.05 * r["job_device_s"]
    assert r["device_switches"] > 0
    assert r["switch_device_s"] == pytest.approx(r["device_switches"] * 40e-6, rel=0.01)
    assert r["job_device_s"] == pytest.approx(a["job_device_s"], rel=1e-6)
    assert a["step_time_ms"] < r["step_time_ms"] < 1.01 * a["step_time_ms"]
    assert r["cluster_idle_pct"] < a["cluster_idle_pct"] / 10
    free = simulate(replace(c, device_preempt_us=0.0))
    assert free["step_time_ms"] == pytest.approx(a["step_time_ms"], rel=1e-9)
    assert free["harvested_device_s"] > 0
    fifo = simulate(replace(c, scheduler="fifo"))
    assert fifo["step_time_ms"] > 1.2 * a["step_time_ms"]
    assert fifo["device_switches"] == 0


@pytest.mark.parametrize(
    ("name", "nodes"), [("dlrm-hta", 0), ("dlrm-hta", 64), ("resnet50-hta", 0)]
)
@pytest.mark.parametrize("scheduler", ["fifo", "exclusive"])
def test_under_alone_a_trace_replays_as_without_harvest(
    name: str, nodes: int, scheduler: str
) -> None:
    """No co-located work: the replay with the harvest hooks (the compute stream's kernels
    through the core, the bucket stream in the order its collectives met) gives the replay
    without them, step by step and stream by stream (past the traced world size too)."""
    c = traced(name, scheduler, nodes, backlog=0)
    runs = []
    for harvest in (True, False):
        run = Run(replace(c, harvest=harvest, device_preempt_us=40.0 if harvest else 0.0))
        runs.append((run.run(), run))
    (h, hrun), (p, prun) = runs
    assert h["finished"] and p["finished"]
    assert [t.step_times_ns for t in hrun.trainers] == [t.step_times_ns for t in prun.trainers]
    assert h["trace_device_idle_pct"] == pytest.approx(p["device_idle_pct"], abs=1e-9)
    assert h["stream_idle_pct"] == pytest.approx(p["stream_idle_pct"], abs=1e-9)
    assert h["device_switches"] == 0 and h["harvested_device_s"] == 0
    # the device the core gives out is held for a kernel op's whole span (its launch gaps
    # included): idle no more than the compute stream's kernels leave it
    assert h["device_idle_pct"] <= p["stream_idle_pct"]["compute"] + 1e-9


def test_timeslice_shares_a_traced_jobs_device() -> None:
    c = traced("dlrm-hta", "timeslice")
    r, a = simulate(c), alone(c)
    assert r["finished"] and r["device_switches"] == 0
    assert r["harvested_device_s"] > 0
    # only the kernels that find co-located work on the device are slowed
    assert a["step_time_ms"] * 1.05 < r["step_time_ms"] < a["step_time_ms"] * TIMESLICE_INTERFERENCE


@pytest.mark.parametrize("scheduler", ["rdmasched", "timeslice"])
def test_background_tasks_done_counts_the_co_located_tasks_alone(scheduler: str) -> None:
    """`background_tasks_done` is the co-located tasks' completions, counted as they
    complete. It was every completion on a core less the job's progress, and a traced
    replay's stream ops count as progress without completing on a core: alone's read -N."""
    c = traced("dlrm-hta", scheduler)
    assert alone(c)["background_tasks_done"] == 0
    r = simulate(c)
    assert r["background_tasks_done"] >= r["harvested_tasks"] > 0


@pytest.mark.parametrize("scheduler", ["rdmasched", "timeslice"])
def test_a_traced_harvest_is_deterministic(scheduler: str) -> None:
    c = traced("dlrm-hta", scheduler, nodes=16, sigma=0.1)
    one, two = simulate(c), simulate(c)
    for k in VARIABLE:
        one.pop(k), two.pop(k)
    assert one == two
    assert one["harvested_tasks"] > 0


# ---- the command ----------------------------------------------------------------------------
def test_cli_harvest_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "--harvest", "--sizes", "8", "--steps", "2", "--pipeline", "4"]
    assert main([*args, "--micro-batches", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    runs = doc["runs"]
    assert [r["scheduler"] for r in runs] == ["fifo", "rdmasched", "fifo", "timeslice"]
    assert runs[0]["reference"] == "alone" and "reference" not in runs[1]
    assert all(r["workload"] == "1f1b-p4-m4" for r in runs)
    assert runs[1]["vs_alone"]["step_pct"] >= 0
    assert doc["workload"]["pipeline"]["stages"] == 4
    assert main([*args, "--schedulers", "rdmasched"]) == 0
    out = capsys.readouterr().out
    assert "alone (fifo, no co-located work)" in out and "harvested dev-s" in out


@pytest.mark.parametrize(
    "bad",
    [
        ["--harvest", "--schedulers", "central"],
        ["--pipeline", "3", "--sizes", "8"],
        ["--harvest", "--device-preempt-us", "-1"],
        ["--interference", "0.5"],
        ["--pipeline", "0"],
    ],
)
def test_cli_bad_harvest_arguments(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--steps", "1", *bad]) == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err
