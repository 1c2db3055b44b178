"""The simulator's fair baselines (issue 21 item 2, docs/SIM.md "Schedulers" and "Costs"):
exclusive, two-level, the reworked central; each one's defining property, conservation
under each, and the recorded costs. Everything runs in one process on the virtual clock."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from rdmasched.cli import main
from rdmasched.demo.job import WorkloadConfig
from rdmasched.demo.taskid import KIND_BACKGROUND, task_kind
from rdmasched.errors import ArgumentError
from rdmasched.sim import Run, SimConfig, costs, simulate
from rdmasched.sim.baselines import BatchEndpoint, TwoLevelNode
from rdmasched.sim.engine import Engine
from rdmasched.sim.run import DEFAULT_SCHEDULERS, SCHEDULERS

from .test_sim import check_conservation


def cfg(n: int, scheduler: str, steps: int = 3, **kw: Any) -> SimConfig:
    return SimConfig(nodes=n, scheduler=scheduler, workload=WorkloadConfig(steps=steps), **kw)


@pytest.mark.parametrize("scheduler", ["exclusive", "two-level", "central"])
@pytest.mark.parametrize("jobs", [0, 8])
def test_conservation(scheduler: str, jobs: int) -> None:
    run = Run(cfg(16, scheduler, sigma=0.05, job_nodes=jobs))
    r = run.run()
    assert r["finished"], r["stopped"]
    check_conservation(run, r)


def test_exclusive_runs_no_background_task_and_pays_one_binding_per_job() -> None:
    """Nothing co-located (the backlog forced to 0 whatever the workload asks), every task
    of one priority, and one gang binding per job at kube-scheduler's recorded rate."""
    c = cfg(32, "exclusive", job_nodes=8)
    assert c.workload.background_backlog == 4
    run = Run(c)
    r = run.run()
    assert r["finished"]
    assert r["background_tasks_done"] == 0
    assert not any(task_kind(k[1]) == KIND_BACKGROUND for k in run.ledger.completed)
    assert r["bindings"] == 4 and r["pods_bound"] == 32
    assert r["admission_s"] == 8 / costs.K8S_PODS_PER_S.value
    assert r["admission_all_s"] == 32 / costs.K8S_PODS_PER_S.value
    # one priority: the step of fifo without background work, not rdmasched's with it
    fifo = simulate(
        replace(c, scheduler="fifo", workload=replace(c.workload, background_backlog=0))
    )
    assert r["step_time_ms"] == fifo["step_time_ms"]
    assert simulate(replace(c, scheduler="rdmasched"))["background_tasks_done"] > 0


def test_two_level_spills_only_when_no_slot_is_free() -> None:
    """With no background work every task has its slot: nothing spills, the global
    scheduler places nothing. With it, background tasks that find every slot busy spill,
    and each placement costs the global scheduler its recorded decision cost."""
    quiet = simulate(
        replace(cfg(16, "two-level"), workload=WorkloadConfig(steps=3, background_backlog=0))
    )
    assert quiet["finished"] and quiet["spilled"] == 0 and quiet["global_placements"] == 0
    run = Run(cfg(16, "two-level"))
    r = run.run()
    assert r["finished"] and r["spilled"] > 0 and r["global_placements"] > 0
    g = run.glob
    assert g is not None
    msg = costs.RAY_TASK.value  # decision_ns is taken as one Ray task's turn
    assert g.decision_ns == int(costs.RAY_GLOBAL_DECISION.value) == int(msg)
    assert r["global_busy_ns"] == (g.placements * g.decision_ns + (g.spills + g.reports) * g.msg_ns)
    # only background tasks spill: every compute task ran on its own node
    spilled = sum(n.spilled for n in g.nodes)
    assert spilled == r["spilled"]


def test_two_level_places_a_spilled_task_on_a_free_node() -> None:
    """A background task a full node spills runs on the node that reported a free slot."""
    run = Run(cfg(2, "two-level", steps=1))
    g = run.glob
    assert g is not None
    a, b = g.nodes
    assert isinstance(a, TwoLevelNode)
    eng = run.engine
    # node 1 reports its 4 free slots; node 0 is full
    b.reported = 4
    g.report(1, 4)
    eng.run(lambda: False, 10**8)
    from rdmasched.demo.taskid import task_id
    from rdmasched.scheduler import Task

    busy = [Task(task_id(KIND_BACKGROUND, 0, 100 + k), 2, 10, 10**9, origin=0) for k in range(4)]
    for t in busy:
        a.do(a.core.dispatch(t, eng.now))
    assert a.core.scheduler.free_slots() == 0
    extra = Task(task_id(KIND_BACKGROUND, 0, 200), 2, 10, 10**6, origin=0)
    a.submit_local(extra)
    eng.run(lambda: False, eng.now + 10**7)
    assert a.spilled == 1 and b.ran_for_others == 1
    assert run.ledger.completed.get((1, extra.id)) == 1  # it ran there, once
    assert (0, extra.id) not in run.ledger.completed


def test_central_barrier_costs_o1_calls_per_step() -> None:
    """A SYNC_READY is one call (a counter), the last one of a step one more (the release
    broadcast): the coordinator's CPU is one turn cost per turn and one call per message,
    plus one call per step, at 64 nodes as at 256 (N calls per release would add 2 N)."""
    for n in (64, 256):
        w = WorkloadConfig(steps=2, background_backlog=0)
        r = simulate(replace(cfg(n, "central"), workload=w))
        assert r["finished"]
        call, batch = r["central_call_ns"], r["central_batch_ns"]
        msgs, turns = r["coordinator_msgs"], r["coordinator_turns"]
        assert r["coordinator_busy_ns"] == turns * batch + call * (msgs + 2)


def test_central_is_batched_and_sharded_per_job() -> None:
    """A turn takes every message waiting (fewer turns than messages, each paying the
    turn's cost once), and --job-nodes gives one coordinator per job."""
    r = simulate(cfg(64, "central", job_nodes=16))
    assert r["finished"] and r["coordinators"] == 4
    assert r["coordinator_turns"] < r["coordinator_msgs"]
    one = simulate(cfg(64, "central"))
    assert one["coordinators"] == 1
    # four coordinators share the load: the step is shorter than one coordinator's
    assert r["step_time_ms"] <= one["step_time_ms"]


def test_batch_endpoint_charges_per_turn_plus_per_message() -> None:
    eng = Engine()
    seen: list[int] = []
    ep = BatchEndpoint(eng, 0, 500, lambda m: 100, lambda m, w: seen.append(eng.now))
    for _ in range(3):
        eng.at(1000, ep.arrive, object(), 1)  # type: ignore[arg-type]
    eng.run(lambda: False, 10**6)
    assert ep.turns == 1 and ep.handled == 3
    assert ep.busy_until == 1000 + 500 + 3 * 100


def test_costs_come_from_costs_py_unless_measured(capsys: pytest.CaptureFixture[str]) -> None:
    """The defaults are the recorded figures; the run says so; --measure measures the
    coordinator again, prints it beside the recorded figure and uses it."""
    c = SimConfig(nodes=4)
    assert c.central_call_ns == int(costs.CENTRAL_CALL.value)
    assert c.central_batch_ns == int(costs.CENTRAL_BATCH.value)
    assert c.two_level_task_ns == int(costs.RAY_TASK.value)
    assert c.k8s_pods_per_s == costs.K8S_PODS_PER_S.value
    args = ["sim", "--sizes", "4", "--steps", "1", "--schedulers", "central", "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["central_call_ns"] == int(costs.CENTRAL_CALL.value)
    assert doc["central_call_how"] == "recorded" and not doc["central_call_measured"]
    assert set(doc["costs"]) == {x.name for x in costs.ALL}
    assert main([*args, "--measure"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["central_call_how"] == "measured" and doc["central_call_measured"]
    assert "recorded" in out.err and "measured" in out.err
    assert doc["runs"][0]["central_call_ns"] == doc["central_call_ns"]
    assert main([*args, "--central-call-ns", "dask"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["central_call_ns"] == costs.CENTRAL_CALL_PRESETS["dask"]
    assert doc["central_call_how"] == "given"


def test_bad_central_call_preset_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--sizes", "4", "--central-call-ns", "slurm"]) == 2
    err = capsys.readouterr().err
    assert "compiled, dask" in err
    with pytest.raises(ArgumentError):
        costs.central_call_ns("0")


def test_k8s_per_task_is_out_of_the_default_schedulers() -> None:
    """The default runs the baselines users run; the per-task k8s only when named."""
    assert "k8s" in SCHEDULERS and "k8s" not in DEFAULT_SCHEDULERS
    assert DEFAULT_SCHEDULERS == ("rdmasched", "fifo", "exclusive", "two-level", "central")
    from rdmasched.cli import build_parser
    from rdmasched.commands import sim as sim_command

    parser = build_parser()
    a = parser.parse_args(["sim"])
    sim_command.check(parser, a)  # the default is resolved there (--harvest has its own)
    assert a.schedulers == list(DEFAULT_SCHEDULERS)


def test_the_headline_compares_with_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "--sizes", "16", "--steps", "2", "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["scheduler"]: r for r in doc["runs"]}
    assert rows["exclusive"]["vs_exclusive"]["step_time_x"] == 1.0
    assert rows["rdmasched"]["vs_exclusive"]["background_x"] is None  # exclusive did none
    assert rows["two-level"]["vs_rdmasched"]["step_time_x"] > 1.0
    assert main(["sim", "--sizes", "16", "--steps", "2"]) == 0
    assert "x excl" in capsys.readouterr().out


@pytest.mark.parametrize(
    "bad",
    [
        {"central_call_ns": -1},
        {"central_batch_ns": -5},
        {"two_level_task_ns": -1},
        {"two_level_report_ns": 0},
    ],
)
def test_bad_costs_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ArgumentError, match=next(iter(bad))):
        Run(replace(cfg(4, "two-level"), **bad))
