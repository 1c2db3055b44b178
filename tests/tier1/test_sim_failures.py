"""The failure model (rdmasched/sim/failures.py, docs/SIM.md "Failures"): detection measured
on the node cores, the re-dispatch of a dead node's forwarded work (nothing lost, nothing
completed twice), the modelled timeline against its first-order expectation, the
calibration against the real `bench failover` run, and the command's bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rdmasched.demo.job import WorkloadConfig
from rdmasched.errors import ArgumentError
from rdmasched.sim import failures as f
from rdmasched.sim.run import SimConfig

pytestmark = pytest.mark.tier1

ROOT = Path(__file__).resolve().parents[2]


def _small(nodes: int = 16, seed: int = 1, **kw: object) -> SimConfig:
    w = WorkloadConfig(steps=3, compute_ms=20)
    cfg = SimConfig(nodes=nodes, seed=seed, heartbeat_ms=10, dead_after_ms=100, workload=w)
    return f.failure_config(replace(cfg, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("dead_after_ms", [100, 200])
def test_detection_is_what_the_cores_liveness_gives(dead_after_ms: int) -> None:
    """Every survivor counts the killed node lost after its silence passed dead_after and
    before one more heartbeat period (and the probe's step) has: measured, so it moves
    with the setting."""
    m = f.measure(_small(dead_after_ms=dead_after_ms), probe_ms=1.0, spill=False)
    assert m["finished"] and len(m["killed"]) == 1
    assert m["detected"] == m["survivors"] == 15
    assert dead_after_ms <= m["detect_first_ms"] <= m["detect_max_ms"]
    assert m["detect_max_ms"] <= dead_after_ms + 10 + 1 + 1
    assert m["step_s"] is not None and 0.02 < m["step_s"] < 0.03


def test_a_dead_nodes_forwarded_work_comes_back_nothing_lost_nothing_twice() -> None:
    """Co-located tasks forwarded by the placement: the killed node held some; their
    origins took them back (redispatches) and placed them again. At the end each task
    completed once, or is still held by a live node, or went with its dead origin.
    Seed 2's figures are the same in every process (the placement's draws are seeded
    from the run's seed: tests/tier1/test_sim_determinism.py)."""
    m = f.measure(_small(nodes=32, seed=2), probe_ms=1.0)
    assert m["forwards"] > 0
    assert m["redispatches"] > 0
    assert m["spill_completed_twice"] == 0
    assert m["spill_lost"] == 0
    parts = ("spill_completed_once", "spill_held_at_end", "spill_gone_with_origin")
    assert sum(m[k] for k in parts) == m["spill_submitted"] == 32 // 4 * 8


def test_a_dead_origins_work_goes_with_it_nothing_lost() -> None:
    """Seed 5 kills a node that submitted co-located work (one of every 4th): its tasks
    not done go with it, and the rest is conserved."""
    m = f.measure(_small(nodes=32, seed=5), probe_ms=1.0)
    assert m["killed"][0] % 4 == 0 and m["spill_gone_with_origin"] > 0
    assert m["spill_completed_twice"] == 0 and m["spill_lost"] == 0
    parts = ("spill_completed_once", "spill_held_at_end", "spill_gone_with_origin")
    assert sum(m[k] for k in parts) == m["spill_submitted"] == 32 // 4 * 8


def test_two_deaths_lose_nothing_either() -> None:
    m = f.measure(_small(nodes=32, seed=3, kill=((2, 30.0),)), probe_ms=1.0)
    assert len(m["killed"]) == 2 and m["detected"] == m["survivors"] == 30
    assert m["spill_completed_twice"] == 0 and m["spill_lost"] == 0


def test_the_timeline_agrees_with_its_first_order_expectation() -> None:
    model = f.FailureModel(window_s=60 * 86_400.0)
    for detect, restart in ((0.55, 28.0), (600.0, 13.6)):
        tl = f.timeline(nodes=1000, step_s=0.1, detect_s=detect, restart_s=restart, model=model)
        want = 100 * f.expected_effective(
            nodes=1000, detect_s=detect, restart_s=restart, model=model
        )
        assert tl["failures"] > 100
        assert abs(tl["effective_pct"] - want) < 1.0
        total = tl["useful_s"] + tl["lost_s"] + tl["ckpt_s"] + tl["down_s"]
        assert total == pytest.approx(model.window_s)
    assert f.timeline(nodes=8, step_s=0.1, detect_s=1, restart_s=1, model=model) == f.timeline(
        nodes=8, step_s=0.1, detect_s=1, restart_s=1, model=model
    )


def test_a_recovery_longer_than_the_jobs_mtbf_leaves_little_goodput() -> None:
    model = f.FailureModel(window_s=86_400.0)
    slow = f.timeline(nodes=100_000, step_s=0.1, detect_s=600, restart_s=13.6, model=model)
    fast = f.timeline(nodes=100_000, step_s=0.1, detect_s=0.6, restart_s=28.0, model=model)
    assert slow["effective_pct"] < 30 < 60 < fast["effective_pct"]


def test_shrink_loses_a_node_per_failure_and_spare_none() -> None:
    model = f.FailureModel(window_s=30 * 86_400.0, restart="shrink")
    tl = f.timeline(nodes=1000, step_s=0.1, detect_s=1, restart_s=10, model=model)
    assert tl["failures"] > 0 and tl["nodes_at_end"] == 1000 - tl["failures"]
    spare = f.timeline(
        nodes=1000, step_s=0.1, detect_s=1, restart_s=10, model=replace(model, restart="spare")
    )
    assert spare["nodes_at_end"] == 1000
    assert tl["goodput_samples_per_s"] < spare["goodput_samples_per_s"]


def test_sources_are_the_figures_they_say() -> None:
    mtbf, cost = f.MTBF_NODE_S, f.CKPT_COST_S
    assert mtbf == pytest.approx(54 * 86_400 * 2048 / 419)
    assert cost == pytest.approx(405e9 * 16 / 2e12)
    assert f.young_interval_s(2.0, 100.0) == pytest.approx(20.0)
    assert f.FailureModel().interval_s(1000) == pytest.approx(
        (2 * f.CKPT_COST_S * f.MTBF_NODE_S / 1000) ** 0.5
    )


def test_restart_costs_are_the_real_runs_means() -> None:
    doc = f.real_failover()
    for sched, mode in (("rdmasched", True), ("exclusive", False)):
        run = next(r for r in doc["runs"] if r["rdmasched"] is mode)
        rc = f.restart_costs(doc, sched)
        want = sum(
            sum(x[p] for x in run["failures"]) / len(run["failures"]) for p in f.RESTART_PARTS
        )
        assert rc["total_s"] == pytest.approx(want)


def test_a_bad_failover_document_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(ArgumentError, match="not a `rdmasched bench failover --json`"):
        f.real_failover(bad)
    with pytest.raises(ArgumentError):
        f.FailureModel(restart="grow").check()


def test_compare_exclusive_waits_for_the_timeout_and_rdmasched_does_not() -> None:
    doc = f.real_failover()
    base = SimConfig(
        nodes=16, heartbeat_ms=10, dead_after_ms=100, workload=WorkloadConfig(compute_ms=20)
    )
    model = f.FailureModel(mtbf_node_s=86_400.0)  # a failure every 1.5 h: some in a week
    rows = f.compare(replace(base, workload=replace(base.workload, steps=3)), model, doc)
    rd, ex = rows
    assert (rd["scheduler"], ex["scheduler"]) == ("rdmasched", "exclusive")
    assert ex["detect_s"] == f.NCCL_PG_TIMEOUT_S and rd["detect_s"] < 0.2
    assert ex["measured"]["killed"] == [] and "redispatches" in rd["measured"]
    assert rd["failures"] > 10 and ex["failures"] > 10
    assert rd["effective_pct"] > ex["effective_pct"] + 5


def test_the_calibration_is_within_ten_percent_of_the_real_run() -> None:
    rows = f.calibrate(f.real_failover())
    assert [r["scheduler"] for r in rows] == ["rdmasched", "exclusive"]
    for r in rows:
        assert abs(r["goodput_error_pct"]) < 10
    assert 0.5 <= rows[0]["sim_detect_s"] <= 0.55


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmasched", "sim", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    p = _sim("--failures", "--sizes", "64", "--failures-measure-max-nodes", "16")
    assert p.returncode == 2 and "no size up to 16" in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    p = _sim("--failures-calibrate", "--failover-json", str(bad))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    p = _sim("--failures", "--restart", "grow")
    assert p.returncode == 2


def test_cli_calibration_json() -> None:
    p = _sim("--failures-calibrate", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert {r["scheduler"] for r in doc["calibration"]} == {"rdmasched", "exclusive"}
    assert "commit" in doc and "machine" in doc


def test_a_measured_size_stands_beside_its_model_from_the_smallest() -> None:
    """Two sizes measured: the larger one's rows beside the rows modelled at its size from
    the smaller one's step and detection (what `--failures-measure-max-nodes` does for a
    size too costly to simulate), with the difference: the model's error is a figure."""
    p = _sim(
        "--failures", "--sizes", "16,32", "--compute-ms", "20", "--steps", "3",
        "--heartbeat-ms", "10", "--dead-after-ms", "100", "--json",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    runs = {(r["nodes"], r["scheduler"]): r for r in doc["runs"]}
    checks = doc["model_check"]
    assert [(c["nodes"], c["scheduler"]) for c in checks] == [
        (32, "rdmasched"),
        (32, "exclusive"),
    ]
    for c in checks:
        meas, small = runs[(32, c["scheduler"])], runs[(16, c["scheduler"])]
        assert c["modelled_from_nodes"] == 16
        assert c["step_s"]["measured"] == meas["step_s"]
        assert c["step_s"]["modelled"] == small["step_s"]
        for k in f.CHECKED:
            d = c[k]
            assert d["diff"] == pytest.approx(d["modelled"] - d["measured"])
        want = f.timeline(
            nodes=32,
            step_s=small["step_s"],
            detect_s=small["detect_s"],
            restart_s=meas["restart_s"],
            model=f.FailureModel(**doc["model"]),
        )
        assert c["effective_pct"]["modelled"] == pytest.approx(want["effective_pct"])
    only_one = _sim("--failures", "--sizes", "16", "--compute-ms", "20", "--steps", "3",
                    "--heartbeat-ms", "10", "--dead-after-ms", "100", "--json")  # fmt: skip
    assert only_one.returncode == 0 and "model_check" not in json.loads(only_one.stdout)


def test_the_docs_example_runs() -> None:
    """docs/SIM.md's "Failures" section: its Python example runs as written."""
    text = (ROOT / "docs" / "SIM.md").read_text()
    section = text.split("\n## Failures\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/SIM.md (Failures)", "exec"), {})


@pytest.mark.parametrize("nodes", [128, 256])
def test_a_death_costs_the_simulator_linear_work_not_quadratic(
    nodes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every core that hears of a far node's death splits its leaf into the members with a
    link out of it and those without (NodeCore._cut_off): a pure function of the topology,
    made once per process (`Topology.shared`), not once per core. Per core it cost
    `Topology.neighbours` for every member of the leaf: N² calls in all (3.94M at 2,000
    nodes, the 10,000-node failure run out of reach)."""
    from rdmasched.topology import Topology

    calls = 0
    plain = Topology.neighbours

    def counted(self: Topology, node: int) -> list[int]:
        nonlocal calls
        calls += 1
        return plain(self, node)

    monkeypatch.setattr(Topology, "neighbours", counted)
    m = f.measure(_small(nodes=nodes, leaf=16), probe_ms=1.0, spill=False)
    assert m["finished"] and m["detected"] == m["survivors"] == nodes - 1
    assert calls <= 4 * nodes, calls
