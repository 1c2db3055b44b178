"""A real DDP job under rdmasched (issue 10): the comm hook, OS-enforced preemption of
co-located work, and the hook's failure paths.

Every rank is a real process (`python -m tests.tier2.torch_ranks`, gloo on the CPU), a client
of the host's daemon (one per host: started by local rank 0, `host_client()`, or by the
test as a user would, `rdmasched daemon`); the assertions read what the ranks wrote. Needs
torch (the [torch] extra, installed by scripts/setup.sh): without it these tests skip,
except with CI=true, where a missing torch fails. No assertion is timed; every wait has a
generous deadline, so a hang is a failure, not a stuck run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("torch") is None:
    if os.environ.get("CI") == "true":
        pytest.fail(
            "torch is not installed: CI must test the PyTorch integration (scripts/setup.sh "
            "installs it)",
            pytrace=False,
        )
    pytest.skip("torch is not installed (pip install -e '.[torch]')", allow_module_level=True)

from rdmasched.clientproto import endpoint_name
from rdmasched.integrations.freeze import cgroup_available
from rdmasched.launch import daemon_running
from rdmasched.transport import shm
from tests.waiting import wait_for

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def new_cluster() -> str:
    return f"t{os.getpid()}-{uuid.uuid4().hex[:8]}"


def host_env(world: int, cluster: str, port: int) -> dict[str, str]:
    """One host of `world` ranks, as torchrun's variables give it (without GROUP_RANK: the
    one-host cluster)."""
    return {
        **os.environ,
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RDMASCHED_CLUSTER": cluster,
        "RDMASCHED_HOST": "host0",
        "PYTHONPATH": str(ROOT),
    }


def run_ranks(
    tmp_path: Path,
    scenario: str,
    world: int,
    *extra: str,
    cluster: str | None = None,
    daemon: str = "rank0",
    hosts: int = 1,
    env_extra: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Run `scenario` on `world` rank processes; what each rank wrote (None: it wrote
    nothing, as a killed rank). `daemon`: "rank0" (local rank 0 starts it) or "user" (this
    test runs `rdmasched daemon` first, with strict priorities, and stops it after).
    `hosts` > 1: that many "hosts" on this machine (RDMASCHED_HOST host0, host1, ..., shm
    between their daemons), found as under torchrun: GROUP_RANK, and a TCPStore at
    MASTER_ADDR:MASTER_PORT run here as torchrun's agent runs it (the ranks' own store is a
    client of it, TORCHELASTIC_USE_AGENT_STORE). `env_extra`: more variables for every rank.
    Fails if any rank or daemon is still running at the deadline."""
    port = free_port()
    cluster = cluster or new_cluster()
    env = {**host_env(world, cluster, port), **(env_extra or {})}
    per_host = world // hosts
    store = None
    if hosts > 1:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        env.update(
            GROUP_WORLD_SIZE=str(hosts),
            LOCAL_WORLD_SIZE=str(per_host),
            RDMASCHED_TRANSPORT="shm",
            TORCHELASTIC_USE_AGENT_STORE="True",
        )
    user = None
    if daemon == "user":
        user = subprocess.Popen(
            [sys.executable, "-m", "rdmasched.cli", "daemon", "--starvation-us", "off",
             "--aging-us", "off"],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert user.stdout is not None
        line = user.stdout.readline()
        assert line.startswith("rdmasched daemon:"), line
        env["RDMASCHED_TEST_DAEMON_PID"] = str(user.pid)
    procs = []
    for rank in range(world):
        out = tmp_path / f"rank{rank}.json"
        procs.append(
            (
                out,
                subprocess.Popen(
                    [sys.executable, "-m", "tests.tier2.torch_ranks", scenario, str(out), *extra],
                    env={**env, **_rank_env(rank, per_host, hosts)},
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
            )
        )
    results: list[dict[str, Any]] = []
    try:
        for out, p in procs:
            try:
                log, _ = p.communicate(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{scenario}: a rank was still running after {DEADLINE_S} s (hung)")
            r = json.loads(out.read_text()) if out.exists() else None
            if r is not None:
                assert "crash" not in r, f"rank {r['rank']} crashed:\n{r['crash']}\n{log[-3000:]}"
                r["output"] = log
            results.append(r)  # type: ignore[arg-type]
    finally:
        for _, q in procs:
            if q.poll() is None:
                q.kill()
        if user is not None and user.poll() is None:
            user.send_signal(signal.SIGTERM)
            user.wait(60)
    # a daemon a rank started leaves once its ranks have (--exit-when-idle)
    for h in range(hosts):
        endpoint = endpoint_name(cluster, f"host{h}")
        wait_for(lambda e=endpoint: not daemon_running(e), "the daemon exits after its ranks")
    del store
    return results


def _rank_env(rank: int, per_host: int, hosts: int) -> dict[str, str]:
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank % per_host)}
    if hosts > 1:
        host = rank // per_host
        env.update(
            GROUP_RANK=str(host), RDMASCHED_HOST=f"host{host}", RDMASCHED_PORT=str(free_port())
        )
    return env


def test_buckets_start_in_priority_order_in_one_order_on_every_rank(tmp_path: Path) -> None:
    # two hosts: each host's daemon releases a bucket when its own rank and the other host
    # have reported, so the two ranks see releases at their own times; rank 0 chooses
    r0, r1 = run_ranks(tmp_path, "order", 2, hosts=2)
    log0 = [tuple(e) for e in r0["log"]]
    starts = [[(s, i) for ev, s, i, _ in r["log"] if ev == "start"] for r in (r0, r1)]
    assert starts[0], "no all-reduce started"
    # collectives of one group start in one order on every rank (else gloo mixes them up)
    assert starts[0] == starts[1]
    # rank 0 chose, each time, the released bucket of highest priority (index: P3's order)
    waiting: set[tuple[int, int]] = set()
    skipped = 0
    chosen = []
    for ev, step, index, _ in log0:
        if ev == "release":
            waiting.add((step, index))
        elif ev == "choose":
            assert (step, index) in waiting, f"bucket {index} step {step} started unreleased"
            assert index == max(i for _, i in waiting), (index, sorted(waiting))
            skipped += len(waiting) - 1
            waiting.discard((step, index))
            chosen.append((step, index))
    assert chosen == starts[0]
    assert not waiting
    # the order mattered: released buckets did wait for the comm queue, and the ones holding
    # the first layers (higher indexes) went ahead of lower ones released before them
    assert skipped > 0, "no bucket ever waited: the priority order was never exercised"
    assert chosen != sorted(chosen, key=lambda c: (c[0], c[1]))
    # and the training is DDP's: the same parameters as plain DDP, and on both ranks
    assert r0["max_diff_vs_plain_ddp"] < 1e-5
    assert r1["max_diff_vs_plain_ddp"] < 1e-5
    assert r0["params"] == r1["params"]


@pytest.mark.parametrize("inflight", ["1", "3", "64"])
def test_on_one_host_buckets_start_in_the_daemons_release_order(
    tmp_path: Path, inflight: str
) -> None:
    # one host: its one daemon releases each bucket's sync to both ranks, in one order, so
    # each rank starts its buckets in release order with no control broadcast (no choice)
    r0, r1 = run_ranks(tmp_path, "order", 2, inflight, env_extra={"RDMASCHED_SLICE_US": "300"})
    most = int(inflight)
    starts = []
    for r in (r0, r1):
        log = [tuple(e) for e in r["log"]]
        assert not [e for e in log if e[0] == "choose"], "a one-host rank chose (broadcast)"
        # a bucket released with room under max_inflight starts in the sync handler itself;
        # only one that waited for room is handed to the comm thread (64: room for all)
        if most == 64:
            assert r["handoffs"] == 0, r["handoffs"]
        elif most == 1:
            assert r["handoffs"] > 0, "no bucket waited for room: the test lost its point"
        # the buckets' syncs overlap the step (RankScheduler(overlap=True)): a release takes
        # no slot, so the step's compute tasks, holding both of the host's, are never preempted
        assert r["preemptions"] == 0, r["preemptions"]
        released = [(s, i) for ev, s, i, _ in log if ev == "release"]
        started = [(s, i) for ev, s, i, _ in log if ev == "start"]
        assert started and started == released  # in release order, every bucket once
        seen: set[tuple[int, int]] = set()
        inflight_now: set[tuple[int, int]] = set()
        peak = 0
        for ev, step, index, _ in log:
            if ev == "release":
                seen.add((step, index))
            elif ev == "start":
                assert (step, index) in seen, f"bucket {index} step {step} started unreleased"
                inflight_now.add((step, index))
                peak = max(peak, len(inflight_now))
            elif ev == "done":
                inflight_now.discard((step, index))
        assert peak <= most, (peak, most)
        starts.append(started)
    # one order on every rank (else gloo mixes the collectives up): the daemon's
    assert starts[0] == starts[1]
    # RDMASCHED_SLICE_US: the threads of the control path ask for that slice, the training
    # thread keeps its own (a kernel before 6.12 reports none: nothing to check there)
    for r in (r0, r1):
        assert r["slice_us"] == 300, r["slice_us"]
        if r["main_slice"] is not None:
            assert r["comm_slice"] == r["reader_slice"] == 300, r
            assert r["main_slice"] != 300, r
            assert list(r["slices"].values()).count(300) >= 4, r["slices"]
    assert r0["max_diff_vs_plain_ddp"] < 1e-5
    assert r1["max_diff_vs_plain_ddp"] < 1e-5
    assert r0["params"] == r1["params"]


def test_one_daemon_serves_the_ranks_of_the_host(tmp_path: Path) -> None:
    # two ranks, one host: one sync group member (the host), waiting for its two ranks
    r0, r1 = run_ranks(tmp_path, "order", 2)
    for r in (r0, r1):
        assert r["endpoint"] == r0["endpoint"]
        assert r["members"] == [0] and r["local"] == 2


def test_two_hosts_one_rank_each_sync_over_both_daemons(tmp_path: Path) -> None:
    # two daemons (two "hosts" on this machine), found through the launcher's store: each
    # bucket is one sync group over both hosts, each host waiting for its one rank
    r0, r1 = run_ranks(tmp_path, "order", 2, hosts=2)
    assert r0["endpoint"] != r1["endpoint"]
    for r in (r0, r1):
        assert r["members"] == [0, 1] and r["local"] == 1
        assert r["max_diff_vs_plain_ddp"] < 1e-5
    starts = [[(s, i) for ev, s, i, _ in r["log"] if ev == "start"] for r in (r0, r1)]
    assert starts[0] and starts[0] == starts[1]
    assert r0["params"] == r1["params"]


def test_daemon_gone_fails_the_step_with_a_clear_error(tmp_path: Path) -> None:
    cluster = new_cluster()
    results = run_ranks(tmp_path, "daemon_gone", 2, cluster=cluster, daemon="user")
    # the killed daemon's lanes stay behind (as after any SIGKILL: `rdmasched cleanup`)
    for s in [s for s in shm.list_segments() if cluster in s]:
        shm.ShmSegment.unlink_name(s)
    for r in results:
        assert r["sched_error"].startswith("SchedulerGoneError"), r["sched_error"]
        assert "daemon" in r["sched_error"] and "gone" in r["sched_error"], r["sched_error"]
        # the step raised: plain backward (DDP's RuntimeError naming the error) and compute()
        assert "gone" in r["backward"], r["backward"]
        assert r["compute"].startswith("SchedulerGoneError"), r["compute"]


def test_rank_killed_fails_the_survivor_instead_of_hanging(tmp_path: Path) -> None:
    cluster = new_cluster()
    r0, r1 = run_ranks(tmp_path, "rank_killed", 2, cluster=cluster)
    # the lane the killed rank created stays behind (as after any SIGKILL: `rdmasched
    # cleanup`); the survivor and the daemon removed theirs
    left = [s for s in shm.list_segments() if cluster in s]
    for s in left:
        shm.ShmSegment.unlink_name(s)
    assert all(".c1." in s for s in left), left
    assert r1 is None  # killed before it could write
    assert "error" in r0, "the survivor's training loop did not fail"
    # rank 1's process is gone: a clear error, raised by the step (compute() turns DDP's
    # RuntimeError into it)
    assert r0["error"] == r0["sched_error"], r0
    assert r0["error"].startswith("RankLostError"), r0
    assert "rank(s) [1]" in r0["error"]


def test_managed_training_keeps_its_slot_past_the_starvation_cap(tmp_path: Path) -> None:
    # Regression: with the scheduler's default starvation cap (1 s) the waiting co-located
    # task took the slot when a bucket sync freed it, the step's compute task was left
    # queued, and the next step's compute task was never dispatched ("not dispatched within
    # 60 s" in the first `ddp_train.py --compare`). host_client's daemon runs strict
    # priorities.
    r0, r1 = run_ranks(tmp_path, "managed", 2)
    for r in (r0, r1):
        assert r["steps"] == 3
        story = "\n".join(r.get("explain", []))
        assert r["colocated_ran_during_a_step"] is False, f"{r['seen']}\n{story}"
        assert r["errors"] == []


@pytest.mark.parametrize("mechanism", ["cgroup", "signal"])
def test_colocated_work_is_frozen_during_the_step_and_thawed_after(
    tmp_path: Path, mechanism: str
) -> None:
    if mechanism == "cgroup":
        ok, why = cgroup_available()
        if not ok:
            if os.environ.get("CI") == "true":
                pytest.fail(f"the cgroup v2 freezer must be tested in CI (runs as root): {why}")
            pytest.skip(f"no writable cgroup v2 here ({why}); run as root to test it")
    (r,) = run_ranks(tmp_path, "freeze", 1, mechanism)
    assert r["mechanism"] == mechanism
    assert r["running_in_compute"] is False  # preempted before the step's body ran
    assert r["ticks_while_frozen"] == 0
    assert r["freezes"] >= 1 and r["thaws"] >= 2  # start(), the step's preemption; 2 dispatches
    assert r["errors"] == []


def test_the_buckets_all_reduce_on_the_process_groups_own_backend(tmp_path: Path) -> None:
    # Regression (issue 20 item 7): the integration made its all-reduce group with gloo
    # whatever the job's backend was (a GPU job on NCCL would all-reduce over gloo). Here
    # the job runs on a second backend, "counting" (gloo behind a Python group that counts
    # its collectives): every bucket's all-reduce goes through a group of that backend.
    r0, r1 = run_ranks(tmp_path, "backend", 2)
    for r in (r0, r1):
        assert r["backend"] == "counting" and r["comm_backend"] == "counting", r
        starts = [(s, i) for ev, s, i, _ in r["log"] if ev == "start"]
        assert len(starts) >= 3  # a few buckets a step, 3 steps
        # the groups of that backend: the job's default group, then the integration's
        # all-reduce group (its control group stays on gloo: CPU tensors)
        job, comm = r["counts"]
        assert comm.get("allreduce", 0) == len(starts), r["counts"]
        assert job.get("allreduce", 0) == 0  # DDP's gradients all went through the hook
    assert r0["params"] == r1["params"]


def test_several_buckets_in_flight_keep_one_order_and_the_priority(tmp_path: Path) -> None:
    # max_inflight 3: rank 0 chooses up to three released buckets at once, in priority
    # order, in one control message; every rank starts them in that order
    r0, r1 = run_ranks(tmp_path, "order", 2, "3", hosts=2)
    starts = [[(s, i) for ev, s, i, _ in r["log"] if ev == "start"] for r in (r0, r1)]
    assert starts[0] and starts[0] == starts[1]
    waiting: set[tuple[int, int]] = set()
    inflight: set[tuple[int, int]] = set()
    most = 0
    chosen = []
    for ev, step, index, _ in (tuple(e) for e in r0["log"]):
        if ev == "release":
            waiting.add((step, index))
        elif ev == "choose":
            assert (step, index) in waiting, f"bucket {index} step {step} started unreleased"
            assert index == max(i for _, i in waiting), (index, sorted(waiting))
            waiting.discard((step, index))
            inflight.add((step, index))
            most = max(most, len(inflight))
            chosen.append((step, index))
        elif ev == "done":
            inflight.discard((step, index))
    assert chosen == starts[0]
    assert not waiting and not inflight
    assert 1 < most <= 3, most  # more than one at a time, never more than asked
    assert r0["max_diff_vs_plain_ddp"] < 1e-5
    assert r1["max_diff_vs_plain_ddp"] < 1e-5
    assert r0["params"] == r1["params"]


def test_colocated_work_in_the_idle_class_during_the_step(tmp_path: Path) -> None:
    # Colocated(preempt="idle"): preempted, every thread of the work goes into the kernel's
    # idle class (it runs only on CPU time nothing else wants) instead of being stopped;
    # dispatched, back to its own policy
    (r,) = run_ranks(tmp_path, "idle", 1)
    assert r["errors"] == []
    assert r["policy_dispatched"] == ["other", "other"]
    assert r["running_in_compute"] is False  # preempted before the step's body ran
    assert r["policy_in_compute"] == ["idle", "idle"]
    assert r["policy_after"] == ["other", "other"]
    assert r["preemptions"] >= 1 and r["dispatches"] >= 2
    # the work runs in a session of its own: with the kernel's autogroups its task group
    # competed with the ranks' as an equal whatever its threads' class; preempted, that
    # group is at nice 19, dispatched at its own again; the rank's own group untouched
    if r["rank_group_nice"] is not None:
        assert r["group_nice_in_compute"] == 19
        assert r["group_nice_after"] == 0
        assert r["rank_group_nice"] == 0


@pytest.mark.parametrize("linger_s", [0.05, 0.0])
def test_steps_back_to_back_hold_one_compute_task(tmp_path: Path, linger_s: float) -> None:
    # the gap between two steps is far shorter than a freeze and a thaw: a step that follows
    # within linger_s takes the previous step's compute task (no call to the daemon, the
    # co-located work not dispatched in between); the rank idle, the task is given back.
    # linger_s=0: a task per step, the co-located work dispatched after each
    (r,) = run_ranks(tmp_path, "linger", 1, str(linger_s))
    assert r["errors"] == []
    assert r["running_in_compute"] == [False] * 5
    if linger_s:
        assert len(set(r["tids"])) == 1, r["tids"]
        # the previous step's body ends and the next begins within far less than 50 ms;
        # on a loaded machine a gap may exceed it once in a while
        assert r["dispatches_during_the_steps"] <= 1
    else:
        assert len(set(r["tids"])) == 5
        assert r["dispatches_during_the_steps"] >= 4


def test_closing_colocated_work_that_never_ran_is_not_refused(tmp_path: Path) -> None:
    # Regression: with the step's compute task held from step to step, a co-located task
    # may never get a slot; its close() completed it, and the daemon refused the COMPLETE of
    # a queued task that never ran ("complete of task N that is queued"). It is cancelled.
    (r,) = run_ranks(tmp_path, "close_queued", 1)
    assert r["errors"] == []
    assert r["ran"] is False
    assert r["rejected"] == [{}, {}], r["rejected"]
    assert r["queue_len"] == 0  # and it is gone from the daemon's queue
