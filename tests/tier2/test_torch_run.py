"""The real managed job under torchrun (issue 20): examples/ddp_train.py ``--mode managed``,
two ranks of `torchrun --nproc-per-node 2`, gloo on the CPU: beside a daemon the test starts
as a user would ("Run it yourself", docs/CLIENT.md; strict priorities, docs/TORCH.md), and
failing in three ways, which must leave nothing behind.

The job's own model (TinyLM, 0.9 M parameters, eight 0.25 MB buckets): with
`--sync-takes-slot` every bucket sync preempts a rank's compute task (both slots hold the
step's compute tasks), so each step has eight preemptions. (A smaller model in smaller
buckets did not show the deadlock below in 3 runs; this one did in 3 runs of 4 at 10 to 30
steps.) The runs go one at a time. Needs torch (the [torch] extra): without it these tests
skip, except with CI=true, where a missing torch fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

if importlib.util.find_spec("torch") is None:
    if os.environ.get("CI") == "true":
        pytest.fail("torch is not installed: CI must test the PyTorch integration", pytrace=False)
    pytest.skip("torch is not installed (pip install -e '.[torch]')", allow_module_level=True)

from rdmasched.client import Client
from rdmasched.daemon.clients import endpoint_name
from rdmasched.transport import shm
from tests.waiting import wait_for

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "ddp_train.py"
DEADLINE_S = 150.0


def job_env(cluster: str) -> dict[str, str]:
    return {
        **os.environ,
        "RDMASCHED_CLUSTER": cluster,
        "RDMASCHED_HOST": "host0",
        "RDMASCHED_SLOTS": "2",
        "PYTHONPATH": str(ROOT),
    }


def torchrun(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(TRAIN), "--mode", "managed", *args],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def test_managed_run_under_repeated_preemption_completes_every_step(tmp_path: Path) -> None:
    # Regression (issue 20 item 2), with syncs that take a slot (--sync-takes-slot, the
    # integration's overlap=False): a bucket sync preempts a rank's compute task; its handler
    # yields (the step goes on: a forward pass cannot stop midway), the daemon requeues it,
    # and the rank then completes it. The daemon refused that COMPLETE ("complete of task N
    # that is queued"), later started the finished task again, the start held a slot for
    # ever and the next step failed with SyncTimeoutError. Now a COMPLETE of a task queued
    # after its yield ends it: every step completes, no task is started once completed.
    cluster = f"r{os.getpid()}-{uuid.uuid4().hex[:8]}"
    env = job_env(cluster)
    steps, warmup = 20, 1
    daemon = subprocess.Popen(
        [sys.executable, "-m", "rdmasched.cli", "daemon", "--starvation-us", "off",
         "--aging-us", "off", "--max-clients", "3"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert daemon.stdout is not None
        line = daemon.stdout.readline()
        assert line.startswith("rdmasched daemon:"), line
        result = tmp_path / "result.json"
        run = torchrun(
            env, "--steps", str(steps), "--warmup", str(warmup), "--result", str(result),
            "--sync-takes-slot",
        )  # fmt: skip
        try:
            log, _ = run.communicate(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
            pytest.fail(f"the managed run was still running after {DEADLINE_S} s (hung)")
        assert run.returncode == 0 and result.exists(), log[-6000:]
        out = json.loads(result.read_text())
        assert len(out["step_s"]) == steps
        assert out["errors"] == [] and out["same_bucket_order_on_every_rank"]
        # what the daemon decided, asked as a third client once the ranks have left
        with Client(endpoint_name(cluster, "host0"), 2) as probe:
            stats = probe.stats()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        for s in [s for s in shm.list_segments() if cluster in s]:
            shm.ShmSegment.unlink_name(s)
    sched = stats["scheduler"]
    # the preemption was repeated: bucket syncs took the compute tasks' slots, many times
    assert sched["preemptions"] >= steps, sched
    # every COMPLETE was taken (the one of a task queued after its yield was refused)
    assert stats["rejected"] == {} and sched["rejected"] == {}, stats
    # and no task was started again once its rank had completed it: such a start held its
    # slot until the rank left, and the daemon cancelled it then
    assert stats["clients"]["cancelled"] == 0, stats["clients"]
    assert sched["running"] == 0 and sched["queue_len"] == 0, sched


def ours(cluster: str) -> list[int]:
    """The live processes of the run: every one that has RDMASCHED_CLUSTER=`cluster` in
    its environment (torchrun, the ranks, the daemon, the co-located jobs, ...)."""
    marker = f"RDMASCHED_CLUSTER={cluster}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")  # a zombie's is empty
        except OSError:
            continue
        if marker in env:
            out.append(int(name))
    return out


@pytest.mark.parametrize("how", ["raise", "kill", "sigterm"])
def test_a_failed_managed_run_leaves_no_process_and_no_cgroup(tmp_path: Path, how: str) -> None:
    # Regression (issue 20 item 6): a managed run that failed left its co-located job
    # running (one process per rank burning a core share for minutes) in a freezer cgroup
    # that nobody removed. Whatever way the run fails (an exception in a rank's step, a
    # rank killed, SIGTERM to the launcher), the co-located processes are killed and their
    # cgroups removed: here none of the run's processes is left, and no cgroup it made.
    cluster = f"f{os.getpid()}-{uuid.uuid4().hex[:8]}"
    env = job_env(cluster)
    args = ["--steps", "40", "--warmup", "1"]
    if how != "sigterm":
        args += ["--fail-at-step", "4", "--fail-how", how]
    run = torchrun(env, *args)
    lines: list[str] = []
    assert run.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(run.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    held: dict[int, str] = {}  # the co-located jobs: pid -> its cgroup (or "signals")

    def both_held() -> bool:
        for line in list(lines):
            m = re.search(r"co-located job (\d+) held by (\S+)", line)
            if m:
                held[int(m.group(1))] = m.group(2)
        return len(held) == 2

    try:
        try:
            wait_for(both_held, "both ranks' co-located jobs held", DEADLINE_S)
        except AssertionError as exc:  # what the run said so far: where it stopped
            raise AssertionError(f"{exc}; the run printed:\n{''.join(lines)[-6000:]}") from None
        if how == "sigterm":
            run.send_signal(signal.SIGTERM)  # the launcher alone (its own session)
        try:
            run.wait(DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the failed run was still running after {DEADLINE_S} s (hung)")
        reader.join(10)
        assert run.returncode != 0, "".join(lines)[-4000:]
        cgroups = [p for p in held.values() if p != "signals"]
        wait_for(
            lambda: not ours(cluster) and not any(os.path.exists(p) for p in cgroups),
            f"no process of the run left ({ours(cluster)}) and no cgroup ({cgroups})",
            60,
        )
    finally:  # what a failure left: killed, removed, so that it costs the next tests nothing
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        for pid in ours(cluster):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for path in held.values():
            with contextlib.suppress(OSError, AssertionError):
                wait_for(lambda p=path: not _procs(p), "the leftover processes die", 10)
                os.rmdir(path)
        for s in [s for s in shm.list_segments() if cluster in s]:
            shm.ShmSegment.unlink_name(s)


def _procs(cgroup: str) -> list[str]:
    try:
        return Path(cgroup, "cgroup.procs").read_text().split()
    except OSError:
        return []


def test_compare_runs_the_modes_with_nothing_co_located(tmp_path: Path) -> None:
    # `alone` and `alone-hook` (DDP's all-reduce in a Python comm hook): both train, and the
    # table and the JSON name them
    out = tmp_path / "compare.json"
    p = subprocess.run(
        [sys.executable, str(TRAIN), "--compare", "--repeat", "1", "--steps", "3",
         "--warmup", "1", "--modes", "alone", "alone-hook", "--json-out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    assert "| training alone, DDP's all-reduce in a Python comm hook |" in p.stdout, p.stdout
    runs = json.loads(out.read_text())["runs"]
    assert [r["mode"] for r in runs] == ["alone", "alone-hook"]
    assert all(len(r["step_s"]) == 3 and r["colocated_bytes"] == 0 for r in runs)
