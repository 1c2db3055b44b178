"""The multi-job cluster in the simulator (rdmasched/sim/jobs.py, docs/SIM.md "Multi-job
cluster"): gangs placed whole by the node cores, the exclusive queue's EASY backfill,
preemption of a low-priority job by a high one under rdmasched, conservation."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from rdmasched.cli import main
from rdmasched.errors import ArgumentError
from rdmasched.scheduler.gang import GANG_WAITING, Phase
from rdmasched.sim import SimConfig, simulate
from rdmasched.sim.jobs import (
    HIGH,
    LOW,
    EasyBackfill,
    Job,
    JobCluster,
    JobsConfig,
    load_jobs,
    write_jobs,
)
from rdmasched.sim.philly import PhillyReplay, PhillyRow, parse_philly, read_philly

S = 1_000_000_000
STEP = 100_000_000  # 100 ms


def _cfg(nodes: int, scheduler: str, jobs: tuple[Job, ...], ckpt: int = 50) -> SimConfig:
    return SimConfig(
        nodes=nodes,
        scheduler=scheduler,
        leaf=8,
        heartbeat_ms=1000,
        dead_after_ms=3000,
        jobs=JobsConfig(jobs=jobs, source="test", checkpoint_steps=ckpt),
    )


def _job(i: int, at_s: float, nodes: int, secs: float, prio: int = LOW) -> Job:
    return Job(i, int(at_s * S), nodes, int(secs * S) // STEP, STEP, prio)


def test_two_gangs_of_the_whole_cluster_on_two_coordinators_both_run() -> None:
    """4 nodes; B and D want all 4 and wait on two coordinators (nodes 1 and 2) while A
    and C run. Once the cluster is idle their attempts refuse each other; after an abort the
    targets' load hints stay high until their next heartbeats, which reach both
    coordinators at one instant, so both try again at once. With a back-off that ended
    before the next heartbeat (a round trip x 2^6) they collided at every heartbeat and
    neither ever ran (2,660 failed attempts); it doubles until it spans heartbeats."""
    jobs = (_job(1, 0, 1, 1.0), _job(2, 0.1, 4, 0.5), _job(3, 0.2, 1, 0.5), _job(4, 0.3, 4, 0.5))
    cfg = replace(_cfg(4, "rdmasched", jobs), leaf=4, pod=4, heartbeat_ms=50, dead_after_ms=500)
    c = JobCluster(cfg)
    r = c.run()
    assert r["finished"], r["gang_attempts_failed"]
    assert all(st.first_start >= 0 for st in c.state.values())
    assert r["overlaps"] == 0 and r["partial_runs"] == 0


def test_a_gang_is_placed_whole_or_not_at_all() -> None:
    # 8 nodes; A takes 6, B (4) arrives while only 2 are free: none of B's members may
    # start (no node held for it, its gang waits for capacity) until A ends, then all 4
    jobs = (_job(1, 0, 6, 20), _job(2, 1, 4, 5), _job(3, 2, 2, 3))
    c = JobCluster(_cfg(8, "rdmasched", jobs))
    c.begin()
    c.engine.run(lambda: False, 10 * S)
    b = c.state[2].current
    assert b is not None and b.started == 0 and b.t_first < 0
    assert not any(r is b for r in c.busy)
    gang = c.nodes[b.coord].core.gangs.gangs[b.core_job]
    assert gang.phase is Phase.WAITING and gang.reason == GANG_WAITING
    assert c.nodes[b.coord].core.gangs.stats()["held_for_others"] == 0
    # C (2 nodes) fitted beside A and ran at once: a small gang passes a large waiting one
    assert c.state[3].end > 0
    r = c.run()
    assert r["finished"] and r["overlaps"] == 0 and r["partial_runs"] == 0
    assert c.state[2].first_start >= c.state[1].end
    # all of a gang's members start within a message's latency of each other
    assert r["gang_start_spread_max_us"] < 1000
    assert r["gangs_placed"] == 3 and r["rejected"] == 0


def test_easy_backfill_never_delays_the_head_reservation() -> None:
    q = EasyBackfill(5)
    left = {1: 10 * S, 2: 10 * S, 3: 20 * S, 4: 20 * S, 5: 5 * S}
    a = Job(1, 0, 3, 100, STEP)
    q.submit(a)
    assert [j.id for j, _ in q.schedule(0, lambda j: left[j.id])] == [1]
    for j in (Job(2, 1, 4, 100, STEP), Job(3, 2, 1, 200, STEP), Job(4, 3, 1, 200, STEP)):
        q.submit(j)
    q.submit(Job(5, 4, 1, 50, STEP))
    # B (4 nodes) waits for A: its reservation at 10 s needs 4 of the 5 nodes, one spare.
    # C (1 node, to 20 s) takes the spare node; D (1 node, to 20 s) would delay B: it
    # waits; E (1 node, ends at 5 s) ends before B's reservation: backfilled
    started = [j.id for j, _ in q.schedule(0, lambda j: left[j.id])]
    assert started == [3, 5]
    assert [j.id for j in q.queue] == [2, 4]
    q.finish(5)  # E ends at 5 s: D still may not start (it would run past 10 s on B's node)
    assert q.schedule(5 * S, lambda j: left[j.id]) == []
    q.finish(1)  # A ends at 10 s: B starts on the 4 free nodes, D still waits
    got = q.schedule(10 * S, lambda j: left[j.id])
    assert [(j.id, len(n)) for j, n in got] == [(2, 4)]
    assert q.backfilled == 2


def test_exclusive_starts_a_job_only_when_its_gang_fits_and_never_preempts() -> None:
    jobs = (_job(1, 0, 6, 20), _job(2, 1, 4, 5, HIGH), _job(3, 2, 2, 3))
    c = JobCluster(_cfg(8, "exclusive", jobs))
    r = c.run()
    assert r["finished"] and r["preemptions"] == 0 and r["overlaps"] == 0
    # B is high priority but waits for A (no preemption); C backfills beside A
    assert c.state[2].first_start >= c.state[1].end
    assert c.state[3].first_start < c.state[1].end
    assert r["backfilled"] == 1


def test_rdmasched_preempts_a_low_priority_job_for_a_high_one() -> None:
    # L takes all 8 nodes for 60 s; H (4 nodes, high) arrives at 10.35 s: under rdmasched
    # L's gang is cancelled, H runs within a few heartbeats, L is placed again after H
    # started and loses only the steps since its last checkpoint (every 50 steps: 5 s; at
    # 10.05 s H's gang, tried the moment the victims' slots free, ran before L's first step
    # past the checkpoint ended, so L lost none)
    jobs = (_job(1, 0, 8, 60), _job(2, 10.35, 4, 10, HIGH))
    c = JobCluster(_cfg(8, "rdmasched", jobs))
    r = c.run()
    low, high = c.state[1], c.state[2]
    assert r["finished"] and r["overlaps"] == 0
    assert low.preemptions == 1 and r["preemptions"] == 1
    assert high.first_start - high.job.arrival_ns < 3 * S
    assert 0 < low.lost_steps < 50
    assert low.runs == 2 and low.end > high.first_start
    # the same mix under exclusive: H waits for L's end
    e = JobCluster(_cfg(8, "exclusive", jobs))
    re = e.run()
    assert re["preemptions"] == 0
    assert e.state[2].first_start >= e.state[1].end
    assert r["by_priority"]["high"]["jct_mean_s"] < re["by_priority"]["high"]["jct_mean_s"]


@pytest.mark.parametrize("scheduler", ["rdmasched", "exclusive"])
def test_conservation(scheduler: str) -> None:
    cfg = SimConfig(
        nodes=32,
        scheduler=scheduler,
        leaf=8,
        heartbeat_ms=1000,
        dead_after_ms=3000,
        jobs=JobsConfig(count=40, load=1.5, high=0.3, median_steps=100, checkpoint_steps=20),
    )
    c = JobCluster(cfg)
    r = c.run()
    assert r["finished"] and r["finished"] is True
    assert r["overlaps"] == 0 and r["partial_runs"] == 0 and r["rejected"] == 0
    assert all(st.left == 0 and st.end > 0 for st in c.state.values())
    assert r["jobs"] == 40 == sum(s["jobs"] for s in r["by_size"].values())
    # every node-second a job held is its work kept, its work lost, or what a preempted
    # run did past its last whole step and its gang's start spread
    useful = sum(j.work_ns * j.nodes for j in c.jobs)
    lost = sum(st.lost_steps * st.job.step_ns * st.job.nodes for st in c.state.values())
    assert r["useful_node_s"] == pytest.approx(useful / S)
    slack = sum(st.preemptions * st.job.nodes * st.job.step_ns for st in c.state.values())
    assert useful + lost <= c.busy_ns <= useful + lost + slack + 40 * 10**6
    assert all(x is None for x in c.busy) and not c.by_task
    assert 0 <= r["device_idle_pct"] <= 100
    assert r["utilisation_pct"] == pytest.approx(
        100 - r["device_idle_pct"] - 100 * lost / S / (32 * r["virtual_s"]), abs=0.5
    )
    if scheduler == "exclusive":
        assert r["preemptions"] == 0 and r["gangs_placed"] == 0
    else:
        assert r["gangs_placed"] == 40 + r["preemptions"]


def test_the_same_seed_gives_the_same_figures() -> None:
    cfg = _cfg(16, "rdmasched", (_job(1, 0, 8, 5), _job(2, 0.5, 6, 3, HIGH), _job(3, 1, 4, 2)))
    a, b = simulate(cfg), simulate(cfg)
    for k in ("jct_mean_s", "queue_p99_s", "device_idle_pct", "preemptions", "msgs"):
        assert a[k] == b[k]


def test_a_jobs_file(tmp_path: Path) -> None:
    p = tmp_path / "jobs.csv"
    p.write_text("arrival_s,nodes,duration_s,step_ms,priority\n0,2,3,100,low\n0.5,1,1,100,high\n")
    cfg = load_jobs(str(p))
    assert [(j.nodes, j.steps, j.priority) for j in cfg.jobs] == [(2, 30, LOW), (1, 10, HIGH)]
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,nodes\n0,2\n")
    with pytest.raises(ArgumentError, match="line 2"):
        load_jobs(str(bad))
    big = SimConfig(nodes=4, scheduler="rdmasched", leaf=4, jobs=load_jobs(str(p)))
    assert simulate(big)["finished"]


def test_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "jobs.csv"
    p.write_text("arrival_s,nodes,duration_s,step_ms,priority\n0,2,2,100,low\n")
    args = ["sim", "--sizes", "4", "--leaf", "4", "--pod", "4", "--jobs", str(p)]
    args += ["--heartbeat-ms", "1000", "--dead-after-ms", "3000"]
    assert main([*args, "--schedulers", "rdmasched,exclusive,fifo"]) == 0
    out = capsys.readouterr().out
    assert "rdmasched" in out and "exclusive" in out
    assert main(["sim", "--sizes", "4", "--jobs", str(tmp_path / "none.csv")]) == 2
    assert "No such file" in capsys.readouterr().err
    assert main([*args, "--schedulers", "fifo"]) == 2
    with pytest.raises(ArgumentError, match="rdmasched or exclusive"):
        SimConfig(nodes=4, scheduler="central", jobs=JobsConfig()).check()


def test_gangs_waiting_while_every_node_is_busy_are_spread_over_the_nodes() -> None:
    # 16 nodes in two leaves, all busy with one-node jobs ending at 10..25 s; 12 one-node
    # jobs arrive at 1-2 s. Before, each waited on the leaf's first node (node 0), which
    # tries its gangs one at a time and reaches its links only, so nodes stood idle while
    # jobs waited. Now they wait on distinct nodes and each starts within a few heartbeats
    # of a node freeing: no job waits longer than under exclusive by more than that.
    jobs = [_job(i + 1, 0, 1, 10 + i) for i in range(16)]
    jobs += [_job(17 + i, 1 + i / 12, 1, 30) for i in range(12)]
    c = JobCluster(_cfg(16, "rdmasched", tuple(jobs)))
    c.begin()
    c.engine.run(lambda: False, 3 * S)
    waiting = [c.state[j].current for j in range(17, 29)]
    assert all(r is not None and r.t_first < 0 for r in waiting)
    coords = [r.coord for r in waiting if r is not None]
    assert len(set(coords)) == 12, coords
    r = c.run()
    assert r["finished"] and r["overlaps"] == 0
    e = JobCluster(_cfg(16, "exclusive", tuple(jobs)))
    re = e.run()
    for j in range(17, 29):
        late = c.state[j].first_start - e.state[j].first_start
        assert late < 4 * S, (j, late / S)
    assert r["queue_mean_s"] < re["queue_mean_s"] + 2.5


# ---- Microsoft Philly's trace (rdmasched/sim/philly.py) -------------------------------------
#: real rows of petuum/adaptdl's simulator/traces/philly.csv (commit de25dcc, lines 1-4, 55,
#: 98, 101 and 235; tests/data/traces/philly/README.md): 1, 8 and 4 GPUs, 30 s to 10 days
PHILLY_ROWS = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,11cb48
2017-10-09 06:13:03,2951.0,1,2951.0,6214e9
2017-09-29 07:58:32,860662.0,1,860662.0,6c71a0
2017-10-07 01:11:39,193256.0,8,1546048.0,ee9e8c
2017-10-09 04:44:14,7944.0,1,7944.0,6214e9
2017-10-06 23:27:26,197281.0,4,789124.0,103959
2017-10-09 06:18:57,30.0,8,240.0,ee9e8c
"""


def _philly(text: str = PHILLY_ROWS) -> list[PhillyRow]:
    return parse_philly(text.splitlines(keepends=True), "philly.csv")


def test_the_philly_converter_on_real_rows(tmp_path: Path) -> None:
    rows = _philly()
    assert [(r.line, r.gpus, r.nodes, r.duration_s) for r in rows[:4]] == [
        (2, 1, 1, 66.0),
        (3, 1, 1, 2951.0),
        (4, 1, 1, 860662.0),
        (5, 8, 1, 193256.0),
    ]
    assert rows[5].nodes == 1 and rows[0].cluster == "11cb48"
    assert rows[0].submit_s - rows[1].submit_s == 48 * 60 + 52  # 07:01:55 - 06:13:03
    # every job of 60 s to 3 days from the first submission on: by submission time
    rep = PhillyReplay(tuple(rows), count=10, max_s=3 * 86400, scale=60, load=0.5)
    picked = rep.window()
    assert [r.line for r in picked] == [7, 5, 6, 3, 2]  # 30 s and 10 days left out
    jobs = rep.jobs(nodes=4, max_nodes=4)
    assert [j.id for j in jobs] == [1, 2, 3, 4, 5] and jobs[0].arrival_ns == 0
    k = rep.compression(4)
    work = sum(r.nodes * r.duration_s for r in picked)
    span = picked[-1].submit_s - picked[0].submit_s
    assert k == pytest.approx(0.5 * 4 * span / work)
    # arrivals compressed by k and scaled by 60, run times scaled by 60, steps of 1 trace s
    assert jobs[-1].arrival_ns == round(span / k / 60 * S)
    assert [j.steps for j in jobs] == [round(r.duration_s) for r in picked]
    assert jobs[1].work_ns == pytest.approx(193256 / 60 * S, rel=1e-6)
    assert all(j.priority == LOW for j in jobs)
    # one-node jobs of at most an hour as high priority (the option)
    hi = replace(rep, high_max_s=3600).jobs(4, 4)
    assert [j.priority for j in hi] == [LOW, LOW, LOW, HIGH, HIGH]
    # written as the CSV --jobs FILE reads, and read back the same
    out = tmp_path / "philly-jobs.csv"
    with open(out, "w") as f:
        write_jobs(jobs, f)
    back = load_jobs(str(out)).jobs
    assert [(j.arrival_ns, j.nodes, j.steps, j.step_ns, j.priority) for j in back] == [
        (j.arrival_ns, j.nodes, j.steps, j.step_ns, j.priority) for j in jobs
    ]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("time,duration\n", "need the header timestamp,duration,num_gpus"),
        ("", "need the header"),
        (PHILLY_ROWS + "2017-10-09 25:01:55,66.0,1,66.0,11cb48\n", "line 9: need timestamp"),
        (PHILLY_ROWS + "2017-10-09 07:01:55,-1,1,0,11cb48\n", "line 9: need .*duration"),
        (PHILLY_ROWS + "2017-10-09 07:01:55,66.0,0,0,11cb48\n", "line 9: .*num_gpus"),
        (PHILLY_ROWS + "2017-10-09 07:01:55,nan,1,1,11cb48\n", "line 9"),
        (PHILLY_ROWS + "2017-10-09 07:01:55,66.0,1\n", "line 9"),
        ("timestamp,duration,num_gpus,gpu_time,cluster\n", "no jobs"),
    ],
)
def test_bad_philly_rows_give_one_clear_line(text: str, match: str) -> None:
    with pytest.raises(ArgumentError, match=match):
        _philly(text)


def test_bad_philly_replays_and_files_give_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tuple(_philly())
    with pytest.raises(ArgumentError, match="no job submitted"):
        PhillyReplay(rows, start="2018-01-01 00:00:00").check()
    with pytest.raises(ArgumentError, match="YYYY-MM-DD"):
        PhillyReplay(rows, start="yesterday").check()
    with pytest.raises(ArgumentError, match="--jobs-scale"):
        PhillyReplay(rows, scale=0).check()
    with pytest.raises(ArgumentError, match="line 99: 16 GPUs take 2 nodes; at most 1 here"):
        PhillyReplay(_with_a_big_job(rows), max_s=1e6).jobs(nodes=1, max_nodes=1)
    bad = tmp_path / "philly.csv"
    bad.write_text(PHILLY_ROWS + "2017-10-09 07:01:55,66.0,x,66.0,11cb48\n")
    args = ["sim", "--sizes", "4", "--leaf", "4", "--pod", "4", "--jobs", f"philly:{bad}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 9" in err[0]
    assert main(["sim", "--sizes", "4", "--jobs", f"philly:{tmp_path / 'none.csv'}"]) == 2
    assert "No such file" in capsys.readouterr().err


def _with_a_big_job(rows: tuple[PhillyRow, ...]) -> tuple[PhillyRow, ...]:
    return (*rows, replace(rows[0], line=99, gpus=16))


@pytest.mark.parametrize("scheduler", ["rdmasched", "exclusive"])
def test_a_philly_slice_replays_deterministically_and_conserves_jobs(
    scheduler: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "philly.csv"
    p.write_text(PHILLY_ROWS)
    # the slice: the five jobs of 60 s to 3 days, on 4 nodes at an offered load of 1.5
    # (a queue forms), 3,600 trace s a virtual s
    args = ["sim", "--sizes", "4", "--leaf", "4", "--pod", "4", "--jobs", f"philly:{p}"]
    args += ["--philly-max-s", "259200", "--jobs-load", "1.5", "--jobs-scale", "3600"]
    args += ["--heartbeat-ms", "1000", "--dead-after-ms", "3000", "--schedulers", scheduler]
    runs = []
    for _ in range(2):
        assert main([*args, "--json"]) == 0
        runs.append(json.loads(capsys.readouterr().out)["runs"][0])
    a, b = runs
    for k in ("jct_mean_s", "jct_p99_s", "queue_mean_s", "device_idle_pct", "msgs", "events"):
        assert a[k] == b[k], k
    assert a["finished"] and a["jobs"] == a["ended"] == 5
    assert sum(s["jobs"] for s in a["by_size"].values()) == 5
    assert a["overlaps"] == 0 and a["partial_runs"] == 0
    work = (66 + 2951 + 193256 + 7944 + 197281) / 3600  # node-s, virtual
    assert a["useful_node_s"] == pytest.approx(work, rel=1e-6)
    assert a["jobs_replay"]["arrival_compression"] > 0
    assert a["jobs_replay"]["trace_s_per_virtual_s"] == 3600


def test_a_compressed_philly_file_is_read_as_the_plain_one(tmp_path: Path) -> None:
    import lzma

    p = tmp_path / "philly.csv.xz"
    p.write_bytes(lzma.compress(PHILLY_ROWS.encode()))
    assert read_philly(str(p)) == _philly()
    bad = tmp_path / "bad.csv.xz"
    bad.write_bytes(b"not xz")
    with pytest.raises(ArgumentError, match=r"bad\.csv\.xz"):
        read_philly(str(bad))


def test_jobs_out_writes_the_jobs_a_run_would_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "philly.csv"
    p.write_text(PHILLY_ROWS)
    out = tmp_path / "jobs.csv"
    args = ["sim", "--sizes", "4", "--leaf", "4", "--jobs", f"philly:{p}", "--philly-max-s"]
    assert main([*args, "259200", "--jobs-scale", "600", "--jobs-out", str(out)]) == 0
    assert "5 jobs for 4 nodes written" in capsys.readouterr().out
    want = PhillyReplay(tuple(_philly()), max_s=259200, scale=600).jobs(4, 4)
    got = load_jobs(str(out)).jobs
    assert [(j.arrival_ns, j.nodes, j.steps, j.step_ns) for j in got] == [
        (j.arrival_ns, j.nodes, j.steps, j.step_ns) for j in want
    ]
    poisson = ["sim", "--sizes", "8", "--jobs", "poisson", "--jobs-count", "7"]
    assert main([*poisson, "--jobs-out", str(out)]) == 0
    assert len(load_jobs(str(out)).jobs) == 7
    assert main([*poisson, "--jobs-out", str(tmp_path / "no" / "such.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--jobs-out" in err[0]
