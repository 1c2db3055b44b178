"""The mixed stream in the simulator (rdmasched/sim/mixed.py; docs/SIM.md, "Mixed priorities"):
short low-priority tasks kept in flight on every node and a latency-critical task every
period, under rdmasched, fifo, two-level and central."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rdmasched.cli import main
from rdmasched.demo.taskid import KIND_COMPUTE, task_kind
from rdmasched.errors import ArgumentError
from rdmasched.sim import Run, SimConfig, simulate
from rdmasched.sim.costs import CENTRAL_CALL_PRESETS
from rdmasched.sim.mixed import MixedConfig, MixedTrainer, calibrate, real_peers

SHORT = MixedConfig(duration_ms=300, warmup_ms=40)


def cfg(scheduler: str, nodes: int = 4, **kw: Any) -> SimConfig:
    m = kw.pop("mixed", SHORT)
    return SimConfig(nodes=nodes, scheduler=scheduler, mixed=m, **kw)


def trainers(run: Run) -> list[MixedTrainer]:
    out = [t for t in run.trainers if isinstance(t, MixedTrainer)]
    assert len(out) == len(run.trainers)
    return out


# ---- the critical task: preempts under rdmasched, waits under the others ---------------------
def test_a_critical_task_preempts_under_rdmasched_and_waits_under_fifo_and_two_level() -> None:
    low_us = SHORT.low_ms * 1000
    r = simulate(cfg("rdmasched"))
    assert r["finished"] and r["critical_samples"] > 0 and r["critical_censored"] == 0
    # every slot runs a low-priority task when a critical one comes: it takes one at once
    assert r["preemptions_window"] >= r["critical_samples"]
    assert r["critical_start_p99_us"] < 50  # the client lanes and the yield, microseconds
    assert r["work_lost_pct"] > 0  # a rollout restarts (the default)
    for sched in ("fifo", "two-level"):
        o = simulate(cfg(sched))
        assert o["preemptions_window"] == 0 and o["work_lost_slot_s"] == 0
        # in line behind the queued low-priority tasks: far more than one task's length
        assert o["critical_start_p50_us"] > low_us
    c = simulate(cfg("central", nodes=2))
    # Dask-like: the queue in priority order, no preemption: it waits for a slot only
    assert c["preemptions_window"] == 0 and c["preemptions"] == 0
    assert c["critical_start_p50_us"] < simulate(cfg("fifo", nodes=2))["critical_start_p50_us"]


def test_a_kept_progress_loses_nothing_and_the_reserved_worker_runs_critical_tasks_apart() -> None:
    keep = simulate(cfg("rdmasched", mixed=replace(SHORT, preempted="keep")))
    assert keep["preemptions_window"] > 0 and keep["work_lost_slot_s"] == 0
    res = simulate(cfg("two-level", mixed=replace(SHORT, reserve=True)))
    # on its own worker, the critical task waits for Ray's turn and start latency only
    assert res["critical_start_p99_us"] < SHORT.low_ms * 1000
    assert res["reserved_workers"] == 4 and 0 < res["reserved_idle_pct"] < 100


# ---- conservation -----------------------------------------------------------------------
@pytest.mark.parametrize("scheduler", ["rdmasched", "fifo", "two-level", "central"])
@pytest.mark.parametrize("preempted", ["restart", "keep"])
def test_every_task_submitted_completes_once_or_is_in_flight_at_the_end(
    scheduler: str, preempted: str
) -> None:
    c = cfg(scheduler, nodes=3, mixed=replace(SHORT, preempted=preempted, low_sigma=0.5))
    run = Run(c)
    out = run.run()
    assert out["finished"]
    ts = trainers(run)
    subs = [(t.node, tid) for t in ts for tid in t.submitted_ids]
    done = [(t.node, tid) for t in ts for tid in t.done_ids]
    assert len(set(subs)) == len(subs) and len(set(done)) == len(done)
    assert set(done) <= set(subs)
    assert out["in_flight_at_end"] == len(subs) - len(done) > 0
    assert out["low_submitted"] + out["critical_submitted"] == len(subs)
    if scheduler in ("rdmasched", "fifo"):
        # what is in flight is exactly what the node cores hold, or on its way to them
        for t, core in zip(ts, run.cores, strict=True):
            held = {x.id for x in (*core.scheduler.running(), *core.scheduler.queued())}
            left = set(t.submitted_ids) - set(t.done_ids)
            assert left == held | t.in_transit and not held & t.in_transit
    # the tasks in flight at the end were not lost: with no more submitted, each completes
    end = run.engine.now
    run.engine.run(lambda: False, end + 10_000_000_000)
    led = run.ledger
    assert all(n == 1 for n in led.completed.values()), "a task completed twice"
    assert set(led.completed) == set(subs), "a task submitted never completed"
    crit = [k for k in subs if task_kind(k[1]) == KIND_COMPUTE]
    assert crit and len(crit) == out["critical_submitted"]


# ---- determinism ---------------------------------------------------------------------------
def _figures(r: dict[str, Any]) -> dict[str, Any]:
    skip = {"wall_s", "build_s", "cpu_s", "build_cpu_s", "events_per_s", "events_per_cpu_s"}
    return {k: v for k, v in r.items() if k not in skip}


@pytest.mark.parametrize("scheduler", ["rdmasched", "two-level", "central"])
def test_a_seed_gives_the_same_figures_and_another_seed_others(scheduler: str) -> None:
    m = replace(SHORT, low_sigma=0.5)
    a = simulate(cfg(scheduler, mixed=m, seed=3))
    b = simulate(cfg(scheduler, mixed=m, seed=3))
    assert _figures(a) == _figures(b)
    c = simulate(cfg(scheduler, mixed=m, seed=4))
    assert _figures(c) != _figures(a)


# ---- the calibration against bench peers' real run ------------------------------------------
def test_the_calibration_runs_the_real_runs_parameters_beside_its_figures(tmp_path: Path) -> None:
    real = real_peers()
    p = real["params"]
    seen: list[SimConfig] = []

    def run(c: SimConfig) -> dict[str, Any]:
        seen.append(c)
        return simulate(replace(c, mixed=replace(c.mixed, duration_ms=400)))  # type: ignore[arg-type]

    rows = calibrate(SimConfig(nodes=1), run, CENTRAL_CALL_PRESETS["dask"])
    assert {r["system"] for r in rows} >= {"rdmasched", "ray", "dask"}
    for c in seen:
        assert c.nodes == 1 and c.slots == p["slots"] and c.links.name == "shm"
        assert c.mixed is not None and c.mixed.inflight == p["mixed_inflight"]
        assert c.mixed.low_ms == p["short_ms"] and c.mixed.preempted == "keep"
    by = {r["system"]: r for r in rows}
    assert by["ray"]["sim"]["mixed"]["reserve"] and by["dask"]["sim"]["central_call_ns"] > 10**5
    real_p50 = real["rows"]["ray"]["start"]["p50_us"]
    assert by["ray"]["critical_p50_us"]["real"] == real_p50
    e = by["ray"]["critical_p50_us"]
    assert e["error_pct"] == pytest.approx(100 * (e["sim"] / e["real"] - 1))
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(ArgumentError, match="not a bench peers JSON"):
        real_peers(bad)


# ---- the command ---------------------------------------------------------------------------
def test_cli_mixed_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "--mixed", "--sizes", "4", "--mixed-ms", "200", "--schedulers", "rdmasched,fifo"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    runs = doc["runs"]
    assert [r["scheduler"] for r in runs] == ["rdmasched", "fifo"]
    assert all(r["workload"] == "mixed" and r["mixed"]["inflight"] == 32 for r in runs)
    assert runs[0]["critical_start_p99_us"] < runs[1]["critical_start_p50_us"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "crit p99 us" in out and "low/node/s" in out


@pytest.mark.parametrize(
    "bad",
    [
        ["--mixed", "--schedulers", "k8s"],
        ["--mixed", "--schedulers", "exclusive"],
        ["--mixed", "--harvest"],
        ["--mixed", "--pipeline", "2", "--sizes", "4"],
        ["--mixed", "--mixed-ms", "100", "--mixed-warmup-ms", "200"],
        ["--mixed", "--mixed-low-ms", "0"],
        ["--mixed", "--mixed-inflight", "0"],
        ["--mixed", "--mixed-preempted", "lose"],
        ["--mixed", "--mixed-critical-ms", "-1"],
    ],
)
def test_cli_bad_mixed_arguments(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", *bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error" in err[-1] and not any("Traceback" in e for e in err)


def test_cli_a_bad_peers_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "peers.json"
    bad.write_text("[1, 2]")
    assert main(["sim", "--mixed-calibrate", "--peers-json", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a bench peers JSON" in err[0]
