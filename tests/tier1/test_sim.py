"""`rdmasched sim` (issue 9): the simulator drives the real node core, deterministically,
and conserves work; its CLI. Everything here runs in one process on the virtual clock."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rdmasched.cli import main
from rdmasched.cluster import MAX_NODES
from rdmasched.demo.central import Coordinator
from rdmasched.demo.job import GROUP, Trainer, WorkloadConfig
from rdmasched.demo.taskid import (
    KIND_BACKGROUND,
    KIND_COMPUTE,
    task_id,
    task_kind,
    task_node,
    task_seq,
)
from rdmasched.errors import ArgumentError, LaneError
from rdmasched.messages import SyncReady
from rdmasched.scheduler import Task
from rdmasched.sim import PRESETS, Run, SimConfig, simulate
from rdmasched.sim.drivers import SimLoop
from rdmasched.sim.engine import Endpoint, Engine, Network
from rdmasched.sim.trace import TRACE_GROUP_BASE
from rdmasched.workload import load

TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
#: figures that depend on the wall clock, not on the model
WALL = ("wall_s", "events_per_s", "build_s", "build_cpu_s", "cpu_s", "events_per_cpu_s")


@pytest.fixture(autouse=True)
def _quiet() -> None:
    # the central baseline's races are counted in "rejected"; their log lines are noise here
    logging.getLogger("rdmasched.daemon").setLevel(logging.ERROR)


def cfg(n: int, scheduler: str = "rdmasched", steps: int = 3, **kw: Any) -> SimConfig:
    return SimConfig(
        nodes=n,
        scheduler=scheduler,
        workload=WorkloadConfig(steps=steps),
        central_call_ns=2_000,
        **kw,
    )


def model_figures(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in r.items() if k not in WALL}


def check_conservation(run: Run, result: dict[str, Any]) -> None:
    """Every compute task completes exactly once; every run of a task on a slot ends
    (finished or preempted) exactly once or is still running; every step's sync is
    released exactly once on every node that ran the step."""
    led = run.ledger
    assert all(c == 1 for c in led.completed.values()), "a task completed twice"
    running = sum(len(t.started_at) for t in run.trainers)
    assert led.run_starts == led.run_ends + running
    for t in run.trainers:
        if not run.alive[t.node]:
            continue
        done = len(t.step_times_ns)
        for step in range(done):
            assert led.releases.get((t.node, run.group_of(t.node), step)) == 1, (t.node, step)
        # compute tasks of finished steps: all completed, once
        computes = [k for k in led.completed if k[0] == t.node and task_kind(k[1]) == KIND_COMPUTE]
        assert len(computes) >= done * run.cfg.slots
    assert max(led.releases.values(), default=1) == 1


@pytest.mark.parametrize("scheduler", ["rdmasched", "fifo", "central"])
def test_same_seed_same_figures(scheduler: str) -> None:
    c = cfg(24, scheduler, sigma=0.1, stragglers=0.1, job_nodes=8)
    a, b = simulate(c), simulate(c)
    assert a["finished"] and a["steps"] == 3
    assert json.dumps(model_figures(a), sort_keys=True) == json.dumps(
        model_figures(b), sort_keys=True
    )
    other = simulate(replace(c, seed=2))
    assert model_figures(other) != model_figures(a)


@pytest.mark.parametrize(
    "scheduler",
    [
        "rdmasched",
        "fifo",
        "central",
        "k8s",
    ],
)
@pytest.mark.parametrize("jobs", [0, 4])
def test_conservation(scheduler: str, jobs: int) -> None:
    c = cfg(16, scheduler, sigma=0.05, k8s_pods_per_s=5_000.0, job_nodes=jobs)
    run = Run(c)
    r = run.run()
    assert r["finished"], r["stopped"]
    check_conservation(run, r)


def test_real_core_decides() -> None:
    """The cores are the daemon's: their schedulers counted the decisions, sync tasks
    preempted background work, and rdmasched's priority beats fifo on step time."""
    run = Run(cfg(16))
    r = run.run()
    assert all(c.scheduler.stats().preemptions > 0 for c in run.cores)
    assert r["preemptions"] > 0 and r["rejected"] == 0
    fifo = simulate(cfg(16, "fifo"))
    assert r["step_time_ms"] < fifo["step_time_ms"]


def test_link_model_sets_release_latency() -> None:
    ib = simulate(cfg(64, links=PRESETS["ib"]))
    rxe = simulate(cfg(64, links=PRESETS["softroce"]))
    assert rxe["sync_release_p50_us"] > 10 * ib["sync_release_p50_us"]
    assert rxe["step_time_ms"] > ib["step_time_ms"]


def test_stragglers_slow_the_step() -> None:
    base = simulate(cfg(32))
    slow = simulate(cfg(32, stragglers=0.1, straggler_slowdown=2.0))
    assert slow["step_time_ms"] > 1.5 * base["step_time_ms"]


def test_kill_mid_run_conserves_work() -> None:
    """A node killed mid-run: nothing completes twice, no step is released twice."""
    c = cfg(16, steps=6, kill=((1, 12.0),), heartbeat_ms=5, dead_after_ms=20, stall_ms=100)
    run = Run(c)
    r = run.run()
    assert len(r["killed"]) == 1
    check_conservation(run, r)


def test_kill_mid_run_live_nodes_finish() -> None:
    """A dead member is dropped from its sync group once the live nodes declare it dead
    (liveness over links, news gossiped: docs/SCALE.md sections 10, 11): the live nodes
    run every step."""
    c = cfg(16, steps=6, kill=((1, 12.0),), heartbeat_ms=5, dead_after_ms=20, stall_ms=100)
    r = simulate(c)
    assert r["finished"] and r["steps"] == 6


def test_kill_mid_run_multi_leaf_live_nodes_finish() -> None:
    """The same across leaves and pods, where the dead node's far peers learn of its death
    by gossip and messages are relayed: the live nodes finish, and nothing runs twice."""
    c = cfg(
        64, steps=6, leaf=8, pod=32, kill=((2, 12.0),), heartbeat_ms=5, dead_after_ms=20,
        stall_ms=200,
    )  # fmt: skip
    run = Run(c)
    r = run.run()
    assert len(r["killed"]) == 2
    assert r["finished"] and r["steps"] == 6, r["stopped"]
    check_conservation(run, r)


def test_kill_mid_run_report_relayed_through_the_dead() -> None:
    """Node 9's combined SYNC_READY for pod 0's combiner, node 1, goes 9 -> 12 -> 4 -> 1 and
    is lost with node 4, killed before anyone on the route declared it dead. The combiner
    does not change, so only the rule "a report whose route crossed a node that died is
    sent again" (docs/SCALE.md section 9) gets the step released."""
    c = cfg(
        64, steps=3, leaf=8, pod=32, sigma=0.1, stragglers=0.1, kill=((2, 12.0),),
        heartbeat_ms=5, dead_after_ms=20, stall_ms=200,
    )  # fmt: skip
    run = Run(c)
    r = run.run()
    assert r["killed"] == [4, 27]
    assert run.topo.path(9, 1) == [9, 12, 4, 1]
    assert r["finished"] and r["steps"] == 3, r["stopped"]


def tree_sync_msgs(run: Run, steps: int) -> int:
    """SYNC_READYs a step costs in the hierarchical sync (docs/SCALE.md section 9): per
    group of M members, M - 1 readiness reports up the tree and M - 1 releases down it."""
    return steps * sum(2 * (len(run.members_of(g)) - 1) for g in run.groups)


def test_messages_per_node_grow_at_most_logarithmically() -> None:
    small = simulate(cfg(32, heartbeat_ms=10_000, dead_after_ms=20_000))
    large = simulate(cfg(256, heartbeat_ms=10_000, dead_after_ms=20_000))
    assert large["msgs_per_node_per_step"] < 2 * small["msgs_per_node_per_step"]
    assert large["lane_writes_per_node_per_step"] < 2 * small["lane_writes_per_node_per_step"]


def test_messages_counted_per_kind() -> None:
    run = Run(cfg(16, heartbeat_ms=10_000, dead_after_ms=20_000))
    r = run.run()
    kinds = r["msgs_by_kind"]
    # the sync tree: 2 (N - 1) SYNC_READYs per step for the one group of 16
    assert run.groups == [GROUP] and len(run.members_of(GROUP)) == 16
    assert kinds["SYNC_READY"] == tree_sync_msgs(run, 3) == 2 * 15 * 3
    assert r["msgs"] == sum(kinds.values())
    assert r["lane_writes"] == r["msgs"] + sum(r["relays_by_kind"].values())


def test_messages_relayed_over_links() -> None:
    """With several leaves and pods, a node holds lanes to its links only: a SYNC_READY for
    a combiner it has no lane to is written to the next hop of its route and relayed
    (docs/PROTOCOL.md section 10). Every lane write goes over a lane (the network refuses
    any other, as the real loop does); a relay is one more write, not one more message."""
    c = cfg(64, leaf=8, pod=32, heartbeat_ms=10_000, dead_after_ms=20_000)
    run = Run(c)
    r = run.run()
    assert r["finished"] and r["steps"] == 3
    check_conservation(run, r)
    relays = sum(r["relays_by_kind"].values())
    assert r["relays_by_kind"].get("SYNC_READY", 0) > 0
    assert r["lane_writes"] == r["msgs"] + relays
    assert sum(c.relayed for c in run.cores) == relays
    # every node's lanes are its topology links, fewer than the 63 others
    assert all(len(c.links) < 63 for c in run.cores)
    assert r["lanes_per_node"] == max(len(c.links) for c in run.cores)


def test_write_without_a_lane_is_refused() -> None:
    """The simulated network, like the real loop, has no lane between two nodes that are
    not linked: a write over one is a LaneError, not a silent delivery."""
    run = Run(cfg(64, leaf=8, pod=32))
    far = next(j for j in range(64) if j not in run.cores[0].links and j != 0)
    with pytest.raises(LaneError, match="no lane"):
        run.net.send(0, far, SyncReady(GROUP, 0, 0, sent_ns=0, job=GROUP), 0, 0)


def test_full_mesh_is_the_flat_protocol() -> None:
    """`full_mesh`: the cores get no topology, as the demo's nodes without --leaf (what
    --calibrate compares with): every member tells every member, N (N - 1) SYNC_READYs per
    step, and every node holds a lane to every other."""
    r = simulate(cfg(16, full_mesh=True, heartbeat_ms=10_000, dead_after_ms=20_000))
    assert r["finished"] and r["steps"] == 3
    assert r["msgs_by_kind"]["SYNC_READY"] == 16 * 15 * 3
    assert r["lanes_per_node"] == 15 and not r["relays_by_kind"]


def test_thousand_nodes() -> None:
    """1,000 nodes running 31 jobs of 32 nodes and one of 8, each its own sync tree: every
    job's SYNC_READYs are 2 (M - 1) per step, so the cluster's grow linearly with N."""
    run = Run(cfg(1000, steps=2, job_nodes=32))
    r = run.run()
    assert r["finished"] and r["steps"] == 2
    assert len(run.groups) == 32
    assert r["msgs_by_kind"]["SYNC_READY"] == tree_sync_msgs(run, 2) == 2 * (31 * 2 * 31 + 2 * 7)
    assert r["lanes_per_node"] <= 64
    check_conservation(run, r)


def test_trace_replay() -> None:
    wl = load(TRACES / "mlp.json.gz")
    c = cfg(8, steps=3, trace=wl, sigma=0.05)
    run = Run(c)
    r = run.run()
    assert r["finished"] and r["steps"] == 3
    buckets = [len(s.syncs) for s in wl.steps]
    led = run.ledger
    for node in range(8):
        for step in range(3):
            for j in range(buckets[step % len(wl.steps)]):
                assert led.releases[(node, TRACE_GROUP_BASE + j, step)] == 1
    # a step takes at least the trace's compute on the fastest node
    fastest = min(run.rep.slowdown) if run.rep else 1.0
    least = min(s.compute_ns() for s in wl.steps) * fastest / 1e6
    assert r["step_time_ms"] >= least * 0.99
    assert model_figures(r) == model_figures(simulate(c))


def test_cli_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "--sizes", "8,16", "--steps", "2", "--central-call-ns", "2000"]
    args += ["--schedulers", "rdmasched,fifo,central,k8s"]  # the default: test_sim_baselines
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    runs = doc["runs"]
    assert [(r["nodes"], r["scheduler"]) for r in runs] == [
        (n, s) for n in (8, 16) for s in ("rdmasched", "fifo", "central", "k8s")
    ]
    assert doc["central_call_ns"] == 2000 and not doc["central_call_measured"]
    assert main([*args, "--schedulers", "rdmasched,fifo"]) == 0
    out = capsys.readouterr().out
    assert "idle %" in out and "fifo" in out and "central" not in out


def test_cli_json_carries_the_run_info(capsys: pytest.CaptureFixture[str]) -> None:
    """As bench's JSON (bench/output.run_info): the version, the options, machine, commit."""
    from rdmasched import __version__

    args = ["sim", "--sizes", "4", "--steps", "1", "--schedulers", "rdmasched", "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] == __version__ and doc["config"]["sizes"] == [4]
    assert doc["machine"]["nproc"] >= 1 and "commit" in doc["commit"] and doc["date_utc"]


def test_cli_central_baselines_up_to_a_size(capsys: pytest.CaptureFixture[str]) -> None:
    """The central and k8s baselines run at sizes up to --central-max-nodes (their
    simulation grows with the coordinator's queue); the sizes above are listed as not run,
    with why, in the JSON and under the table. Each row is compared with rdmasched's at
    its size."""
    args = ["sim", "--sizes", "8,16", "--steps", "2", "--central-call-ns", "2000"]
    args += ["--schedulers", "rdmasched,fifo,central,k8s"]
    assert main([*args, "--central-max-nodes", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["nodes"], r["scheduler"]) for r in doc["runs"]] == [
        (8, "rdmasched"), (8, "fifo"), (8, "central"), (8, "k8s"), (16, "rdmasched"),
        (16, "fifo"),
    ]  # fmt: skip
    assert [(r["nodes"], r["scheduler"]) for r in doc["not_run"]] == [
        (16, "central"),
        (16, "k8s"),
    ]
    assert all("--central-max-nodes 8" in r["why"] for r in doc["not_run"])
    by = {(r["nodes"], r["scheduler"]): r for r in doc["runs"]}
    for (n, _), r in by.items():
        base = by[n, "rdmasched"]
        assert r["vs_rdmasched"]["step_time_x"] == pytest.approx(
            r["step_time_ms"] / base["step_time_ms"]
        )
        assert r["vs_rdmasched"]["idle_pct_points"] == pytest.approx(
            r["slot_idle_pct"] - base["slot_idle_pct"]
        )
    assert main([*args, "--central-max-nodes", "8"]) == 0
    out = capsys.readouterr().out
    assert "central at 16 nodes: not run" in out and "x rdms" in out


@pytest.mark.parametrize(
    "bad",
    [
        ["--sizes", "0"],
        ["--sizes", "a,b"],
        ["--schedulers", "slurm"],
        ["--kill", "3"],
        ["--links", "carrier-pigeon"],
        ["--steps", "0"],
        ["--stall-ms", "0"],
        ["--central-max-nodes", "-1"],
        ["--central-max-nodes", "many"],
        # issue 20 item 15: these exited 1 (checked after parsing), as no other bad argument
        ["--job-nodes", "-1"],
        ["--backlog", "-1"],
        ["--jitter", "1"],
        ["--cpu-ns", "-5"],
        ["--k8s-pods-per-s", "0"],
        ["--straggler-slowdown", "0.5"],
    ],
)
def test_cli_bad_arguments(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", *bad]) == 2
    assert "error" in capsys.readouterr().err


def test_bad_config_is_an_argument_error() -> None:
    with pytest.raises(ArgumentError, match="heartbeat"):
        Run(cfg(4, heartbeat_ms=600, dead_after_ms=500))
    with pytest.raises(ArgumentError, match="scheduler"):
        Run(cfg(4, "slurm"))


def test_the_central_coordinator_counts_a_sync_once_not_once_per_member() -> None:
    """The coordinator tracks a sync group once: each SYNC_READY is one call (a count), the
    last one of a step releases it on every member's core (N calls). Handing every
    SYNC_READY to every member's core cost N calls each, N² per step: at 256 nodes and
    4 us a call, 1 ms of coordinator time per SYNC_READY, and the releases queued behind
    hundreds of milliseconds of them."""
    r = simulate(replace(cfg(256, "central", steps=2), central_call_ns=4_000))
    assert r["finished"]
    # the last SYNC_READY costs 257 calls of 4 us (about 1 ms), behind the background
    # work's messages queued at the coordinator: 8.1 ms here, 268 ms with N² calls
    assert r["sync_release_p99_us"] < 30_000, r["sync_release_p99_us"]
    assert r["step_time_ms"] < 60, r["step_time_ms"]


def test_the_central_coordinator_refuses_a_sync_ready_of_a_stranger() -> None:
    """A SYNC_READY for a group it does not know, or from a node that is not a member,
    is refused and counted; the group's own step still releases once."""
    eng = Engine()
    net = Network(eng, PRESETS["shm"], None)
    eps: dict[int, Endpoint] = {}
    sent: list[tuple[int, Any]] = []
    loop = SimLoop(eng, net, 4, lambda: eps[4])
    loop.send = lambda dst, *out: sent.append((dst, out))  # type: ignore[method-assign]
    coord = Coordinator(
        loop,  # type: ignore[arg-type]
        dict.fromkeys(range(3), 1),
        group=GROUP,
        sync_cost_ns=1_000_000,
        starvation_us=1_000_000,
        aging_us=100_000,
        events=0,
    )
    coded = net._coded

    def ready(group: int, member: int, peer: int) -> None:
        m = coded(peer, 0, SyncReady(group, 0, member, sent_ns=0, job=group), 4)[0]
        coord.on_message(m, peer)

    with pytest.raises(ValueError, match=r"members \[5\] unknown"):
        coord.define_group(GROUP + 2, frozenset({0, 5}))  # node 5 is not decided for here
    ready(GROUP + 1, 0, 0)  # no such group
    ready(GROUP, 7, 0)  # not a member
    assert coord.rejected == 2
    for node in range(3):
        assert not sent
        ready(GROUP, node, node)
        ready(GROUP, node, node)  # a repeat counts once
    assert sorted(dst for dst, _ in sent) == [0, 1, 2]  # the sync task started on each
    assert coord.rejected == 2


def test_a_slow_baseline_is_a_stall_only_past_the_stall_window() -> None:
    """The k8s baseline binds 100 pods per virtual second: at 16 nodes its first compute
    task is done after the background work queued ahead of it (64 pods, 0.64 s). A stall
    window shorter than that stops the run as stalled; the default lets it finish."""
    r = simulate(cfg(16, "k8s", steps=1, stall_ms=100))
    assert not r["finished"] and r["stopped"].startswith("stalled")
    r = simulate(cfg(16, "k8s", steps=1))
    assert r["finished"] and r["stopped"] is None


def test_the_default_stall_window_waits_for_a_k8s_round_of_pods() -> None:
    """At 1,000 nodes the k8s baseline binds the 4,000 background pods queued ahead of the
    first compute task for 40 virtual s: the default stall window is long enough for a
    round of every node's pods at its rate, so the run finishes; the other schedulers keep
    5 s, and a window given stands."""
    c = cfg(1000, "k8s", steps=1)
    assert c.stall_window_ms() == 2 * 1000 * (4 + 4 + 1) * 1000 / 100
    assert cfg(1000, "rdmasched").stall_window_ms() == 5_000
    assert cfg(1000, "k8s", stall_ms=100).stall_window_ms() == 100
    r = simulate(c)
    assert r["finished"], r["stopped"]


def test_sizes_are_one_grammar_with_topology(capsys: pytest.CaptureFixture[str]) -> None:
    """`--sizes 1k` means 1,000 nodes in `sim` as in `topology` (one argument type)."""
    from rdmasched.cli import build_parser

    p = build_parser()
    a = p.parse_args(["sim", "--sizes", "1k,2", "--calibrate-sizes", "4,1K"])
    assert (a.sizes, a.calibrate_sizes) == ([1000, 2], [4, 1000])
    assert p.parse_args(["topology", "--sizes", "1k,2"]).sizes == [1000, 2]
    errs = []
    for cmd in ("sim", "topology"):
        assert main([cmd, "--sizes", "1k,x"]) == 2
        errs.append(capsys.readouterr().err.split("error: ", 1)[1].split(" (see: ")[0])
    assert errs[0] == errs[1], errs


def test_cli_bad_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.json"
    f.write_text("{not json")
    assert main(["sim", "--sizes", "4", "--workload", str(f)]) == 1
    assert str(f) in capsys.readouterr().err


def test_cli_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "sim.png"
    args = ["sim", "--sizes", "4,8", "--steps", "2", "--central-call-ns", "2000"]
    assert main([*args, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_engine_runs_events_by_time_then_in_the_order_scheduled() -> None:
    """The engine's heap holds times, and the events of one time are one batch: an event
    scheduled for the current time while its batch runs comes after every event already
    due then, as with a heap of (time, sequence) pairs."""
    eng = Engine()
    log: list[tuple[int, str]] = []

    def ev(name: str, then: str | None = None) -> None:
        log.append((eng.now, name))
        if then is not None:
            eng.at(eng.now, ev, then)
            eng.at(eng.now - 1, ev, then + "'")  # in the past: now

    eng.at(5, ev, "a", "a2")
    eng.at(3, ev, "b")
    eng.at(5, ev, "c")
    eng.at(1, ev, "d")
    assert eng.run(lambda: False, 4) is False
    assert log == [(1, "d"), (3, "b")]
    assert eng.next_at() == 5
    eng.run(lambda: False, 100)
    assert log[2:] == [(5, "a"), (5, "c"), (5, "a2"), (5, "a2'")]
    assert eng.next_at() is None and eng.events == 6


def test_engine_stopped_within_a_batch_keeps_the_rest_in_order() -> None:
    """`done()` is asked every 64 events: a run stopped in the middle of one time's batch
    leaves the rest of it, in order, for the next run."""
    eng = Engine()
    log: list[int] = []
    for i in range(100):
        eng.at(7, log.append, i)
    eng.at(8, log.append, 100)
    assert eng.run(lambda: len(log) >= 64, 100) is True
    assert log == list(range(64)) and eng.next_at() == 7
    assert eng.run(lambda: False, 100) is False
    assert log == list(range(101)) and eng.events == 101


def test_a_busy_node_drains_its_inbox_only_while_nothing_else_is_due() -> None:
    """A node handles queued messages back to back without the heap only while no other
    event is due before it is free, also one of the batch that is running now."""
    eng = Engine()
    log: list[tuple[int, Any]] = []
    ep = Endpoint(eng, 0, 5, lambda m, writer: log.append((eng.now, m)))
    eng.at(0, ep.arrive, "m0", 1)  # handled at once: busy until 5
    eng.at(2, ep.arrive, "m1", 1)  # waits: handled at 5
    eng.at(3, ep.arrive, "m2", 1)  # waits: handled at 10
    # scheduled after m1's turn at 5, so it runs after m1 and before m2, at 5
    eng.at(4, lambda: eng.at(5, lambda: log.append((eng.now, "probe"))))
    eng.run(lambda: False, 100)
    assert log == [(0, "m0"), (5, "m1"), (5, "probe"), (10, "m2")]


@pytest.mark.parametrize("node", [0, 16_383, 16_384, 65_535, 65_536, 99_999, MAX_NODES - 1])
def test_task_ids_hold_every_node_id(node: int) -> None:
    """The demo workload's task ids (kind | node | sequence) keep the kind and the node of
    every node a cluster may have, below the sync tasks' ids (>= 2**63). With 14 bits for
    the node, node 65,536 and up made ids in the sync range and 100,000 nodes never
    finished a step."""
    for kind in (KIND_COMPUTE, KIND_BACKGROUND):
        tid = task_id(kind, node, 12_345)
        assert (task_kind(tid), task_node(tid), task_seq(tid)) == (kind, node, 12_345)
        assert tid < 1 << 63
    with pytest.raises(ValueError):
        task_id(KIND_COMPUTE, 1 << 24, 0)


def test_a_trainer_of_node_99999_announces_its_step() -> None:
    """The demo's trainer on node 99,999 counts its compute tasks and announces SYNC_READY
    when they are done (it never did with 14-bit node ids: its tasks looked like sync)."""

    class Backend:
        def __init__(self) -> None:
            self.t = 0
            self.tasks: list[Task] = []
            self.later: list[Any] = []
            self.ready: list[int] = []

        def now(self) -> int:
            return self.t

        def call_later(self, delay_ns: int, fn: Any) -> None:
            self.later.append(fn)

        def submit_local(self, task: Task) -> None:
            self.tasks.append(task)

        def sync_ready(self, step: int) -> None:
            self.ready.append(step)

        def complete(self, task: Task, runtime_ns: int) -> None:
            pass

    b = Backend()
    tr = Trainer(99_999, 2, WorkloadConfig(steps=1, background_backlog=0), b)
    tr.begin()
    assert [task_kind(t.id) for t in b.tasks] == [KIND_COMPUTE] * 2
    for slot, t in enumerate(b.tasks):
        tr.on_start(t, slot)
    for fn in b.later:
        fn()
    assert b.ready == [0]
