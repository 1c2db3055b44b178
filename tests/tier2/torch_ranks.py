"""One rank of a test scenario of rdmasched.integrations.torch (run by tests/tier2/test_torch.py).

    python -m tests.tier2.torch_ranks SCENARIO OUT      (env: RANK, WORLD_SIZE, LOCAL_RANK,
        LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RDMASCHED_CLUSTER, RDMASCHED_HOST)

Every rank is a client of the host's daemon (`host_client`): started by local rank 0, or,
with RDMASCHED_TEST_DAEMON_PID set, one the test started (`rdmasched daemon`).
Writes what the rank saw to OUT (JSON); the test asserts on it. Scenarios:

- ``order [MAX_INFLIGHT]``: DDP over gloo, a stack of linear layers in several buckets, tiny
  batches (the all-reduces, not the compute, take the time, so released buckets wait for the
  comm queue), under the hook with compute() (the scheduler's `max_inflight`, default 1);
  beside it the same model under plain DDP on the same data.
- ``daemon_gone``: rank 0 kills the host's daemon (SIGKILL) between two steps.
- ``rank_killed``: rank 1 kills itself (SIGKILL) before its third step.
- ``freeze MECHANISM``: a real burning process as a `Colocated` job; CPU time while the
  training step's compute task holds the slot, and after.
- ``linger LINGER_S``: a real burning process as a `Colocated` job, and 5 steps back to back
  under compute() (the scheduler's `linger_s`), then the rank idle: the task ids the steps
  ran as and the co-located task's dispatches.
- ``close_queued``: a `Colocated` job started while the step holds the host's only slot,
  and closed before it ever ran: what the daemon refused.
- ``idle``: the same with `Colocated(preempt="idle")`: the burner's scheduling policy (its
  every thread) while the step's compute task holds the slot, and after.
- ``backend``: the job's process group on a second backend (tests/tier2/counting_backend.py:
  gloo behind a Python group that counts its collectives), a few steps under the hook.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rdmasched.daemon.tuning import get_slice
from rdmasched.integrations.freeze import read_stat
from rdmasched.integrations.torch import Colocated, RankScheduler, _autogroup, host_client

BURN = "import zlib\nd = bytes(range(256)) * 4096\nwhile True: zlib.compress(d, 6)"


def model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


def train(
    ddp: nn.Module, steps: int, sched: RankScheduler | None, seed: int, width: int = 256
) -> None:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(2, width, generator=g)
        y = torch.randint(0, 4, (2,), generator=g)
        opt.zero_grad()
        if sched is not None:
            with sched.compute():
                nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
        else:
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()


def flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in m.parameters()])


def cpu_ticks(pid: int) -> int:
    st = read_stat(pid)
    assert st is not None
    return st.utime + st.stime


def main() -> int:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    backend = "gloo"
    if scenario == "backend":
        from tests.tier2 import counting_backend

        counting_backend.register()
        backend = counting_backend.NAME
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=30))
    daemon_pid = int(os.environ.get("RDMASCHED_TEST_DAEMON_PID", "0"))
    node = host_client(start_daemon=not daemon_pid).open()
    result: dict[str, Any] = {"rank": rank, "endpoint": node.endpoint}
    inflight = int(sys.argv[3]) if scenario == "order" and len(sys.argv) > 3 else 1
    linger = float(sys.argv[3]) if scenario == "linger" else 0.05
    sched = RankScheduler(
        node, sync_timeout_s=30, collective_timeout_s=30, max_inflight=inflight, linger_s=linger
    )
    result["members"], result["local"] = sched.members, sched.local
    t0 = time.monotonic()
    try:
        if scenario == "order":
            a = model(256, 8)
            ddp = DistributedDataParallel(a, bucket_cap_mb=0.25)
            ddp.register_comm_hook(None, sched.hook)
            b = model(256, 8)
            plain = DistributedDataParallel(b, bucket_cap_mb=0.25)
            train(ddp, 8, sched, seed=rank)
            train(plain, 8, None, seed=rank)
            result["log"] = list(sched.log)
            result["handoffs"] = sched.handoffs
            result["preemptions"] = node.stats()["scheduler"]["preemptions"]
            result["slice_us"] = sched.slice_us
            me = threading.get_native_id()
            result["main_slice"] = get_slice(me)
            result["slices"] = {  # the threads there when the RankScheduler was made
                n: get_slice(int(n)) for n in os.listdir("/proc/self/task") if int(n) != me
            }
            result["comm_slice"] = get_slice(sched._comm.native_id or 0)
            result["reader_slice"] = get_slice(node._thread.native_id or 0)  # type: ignore[union-attr]
            result["params"] = flat(a).tolist()[:64]
            result["max_diff_vs_plain_ddp"] = float((flat(a) - flat(b)).abs().max())
        elif scenario == "backend":
            from tests.tier2.counting_backend import Counting

            ddp = DistributedDataParallel(model(64, 4), bucket_cap_mb=0.01)
            ddp.register_comm_hook(None, sched.hook)
            train(ddp, 3, sched, seed=rank, width=64)
            result["log"] = list(sched.log)
            result["backend"] = dist.get_backend()
            result["comm_backend"] = dist.get_backend(sched._comm_pg)
            result["counts"] = [dict(g.counts) for g in Counting.groups]
            result["params"] = flat(ddp.module).tolist()[:64]
        elif scenario == "daemon_gone":
            ddp = DistributedDataParallel(model(64, 2))
            ddp.register_comm_hook(None, sched.hook)
            train(ddp, 2, sched, seed=rank, width=64)
            dist.barrier()
            if rank == 0:
                os.kill(daemon_pid, signal.SIGKILL)
            for what in ("backward", "compute"):
                try:
                    train(ddp, 1, sched if what == "compute" else None, seed=rank, width=64)
                except Exception as exc:
                    result[what] = f"{type(exc).__name__}: {exc}"
            result["sched_error"] = f"{type(sched.error).__name__}: {sched.error}"
        elif scenario == "rank_killed":
            ddp = DistributedDataParallel(model(64, 2))
            ddp.register_comm_hook(None, sched.hook)
            train(ddp, 2, sched, seed=rank, width=64)
            if rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            t0 = time.monotonic()
            try:
                train(ddp, 5, sched, seed=rank, width=64)
            except Exception as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
            result["sched_error"] = f"{type(sched.error).__name__}: {sched.error}"
        elif scenario == "managed":
            # steps longer than the default starvation cap (1 s), co-located work waiting
            proc = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
            try:
                colo = Colocated(sched).add(proc.pid).start()
                ddp = DistributedDataParallel(model(256, 4), bucket_cap_mb=0.25)
                ddp.register_comm_hook(None, sched.hook)
                opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
                seen = []
                steps = 0
                while True:
                    x = torch.randn(2, 256)
                    with sched.compute() as tid:
                        # every rank in its step: every slot of the host is the job's, so
                        # every co-located task is preempted (another rank's compute may
                        # have started a moment before this rank's freeze was done)
                        dist.barrier()
                        seen.append(not _settles(lambda: not colo.running))
                        time.sleep(1.2)  # a step longer than the default starvation cap
                        nn.functional.cross_entropy(
                            ddp(x), torch.zeros(2, dtype=torch.long)
                        ).backward()
                        opt.step()
                        # the buckets' syncs took a slot and gave it back: to the step's
                        # compute task, not to co-located work that has waited past the cap
                        dist.barrier()
                        seen.append(not _settles(lambda: not colo.running))
                        if seen[-1]:  # why: the daemon's decisions about both tasks
                            result["explain"] = _story(node, colo.task_id) + _story(node, tid)
                        # no rank ends its step before every rank has looked: a rank that
                        # left compute() would free its slot, rightly, to co-located work
                        dist.barrier()
                    steps += 1
                    dist.barrier()  # the same number of steps on both ranks
                    if steps == 3:
                        break
                result["steps"] = steps
                result["colocated_ran_during_a_step"] = any(seen)
                result["seen"] = seen
                result["errors"] = colo.errors
                colo.close()
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        elif scenario == "freeze":
            proc = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
            try:
                colo = Colocated(sched, mechanism=sys.argv[3]).add(proc.pid).start()
                result["mechanism"] = colo.mechanism
                _wait(lambda: colo.running, "the co-located job dispatched")
                t = cpu_ticks(proc.pid)
                _wait(lambda: cpu_ticks(proc.pid) > t, "it burns CPU once dispatched")
                with sched.compute():
                    result["running_in_compute"] = colo.running
                    time.sleep(0.05)  # the last task may still be on its way into the trap
                    t = cpu_ticks(proc.pid)
                    time.sleep(0.5)
                    result["ticks_while_frozen"] = cpu_ticks(proc.pid) - t
                _wait(lambda: colo.running, "dispatched again after the step")
                t = cpu_ticks(proc.pid)
                _wait(lambda: cpu_ticks(proc.pid) > t, "it burns CPU again")
                result["freezes"] = len(colo.freeze_ns)
                result["thaws"] = len(colo.thaw_ns)
                result["errors"] = colo.errors
                colo.close()
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        elif scenario == "linger":
            proc = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
            try:
                colo = Colocated(sched).add(proc.pid).start()
                _wait(lambda: colo.running, "the co-located job dispatched")
                before = len(colo.thaw_ns)
                tids = []
                for _ in range(5):
                    with sched.compute() as tid:
                        tids.append(tid)
                        result.setdefault("running_in_compute", []).append(colo.running)
                result["tids"] = tids
                result["dispatches_during_the_steps"] = len(colo.thaw_ns) - before
                # the rank idle: its compute task given back, the co-located job dispatched
                _wait(lambda: colo.running, "dispatched once the rank is idle")
                result["errors"] = colo.errors
                colo.close()
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        elif scenario == "close_queued":
            proc = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
            try:
                with sched.compute():
                    colo = Colocated(sched).add(proc.pid).start()
                    # queued behind the step's compute task on the host's one slot
                    _wait(
                        lambda: node.stats()["scheduler"]["queue_len"] == 1,
                        "the co-located task queued",
                    )
                    colo.close()
                result["ran"] = bool(colo.thaw_ns)
                st = node.stats()  # asked after the close: its answer comes after any refusal
                result["rejected"] = [st["rejected"], st["scheduler"]["rejected"]]
                result["queue_len"] = st["scheduler"]["queue_len"]
                result["errors"] = colo.errors
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        elif scenario == "idle":
            # a burner with a second thread: every thread of the work changes class
            two = "import threading\n" + BURN.replace(
                "while True:",
                "threading.Thread(target=lambda: [zlib.compress(d, 6) for _ "
                "in iter(int, 1)], daemon=True).start()\nwhile True:",
            )
            proc = subprocess.Popen([sys.executable, "-c", two], start_new_session=True)
            try:
                _wait(lambda: len(os.listdir(f"/proc/{proc.pid}/task")) == 2, "two threads")
                colo = Colocated(sched, preempt="idle").add(proc.pid).start()
                _wait(lambda: colo.running, "the co-located job dispatched")
                result["policy_dispatched"] = _policies(proc.pid)
                with sched.compute():
                    result["running_in_compute"] = colo.running
                    result["policy_in_compute"] = _policies(proc.pid)
                    result["group_nice_in_compute"] = _group_nice(proc.pid)
                    t = cpu_ticks(proc.pid)
                    time.sleep(0.3)
                    result["ticks_in_compute"] = cpu_ticks(proc.pid) - t
                _wait(lambda: colo.running, "dispatched again after the step")
                result["policy_after"] = _policies(proc.pid)
                result["group_nice_after"] = _group_nice(proc.pid)
                result["rank_group_nice"] = _group_nice(os.getpid())
                result["preemptions"] = len(colo.freeze_ns)
                result["dispatches"] = len(colo.thaw_ns)
                result["errors"] = colo.errors
                colo.close()
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    except Exception:
        result["crash"] = traceback.format_exc()
    result["seconds_after_failure"] = time.monotonic() - t0
    out.write_text(json.dumps(result))
    sched.close()
    node.close()
    if scenario in ("rank_killed", "daemon_gone"):
        os._exit(0)  # the gloo groups still name a dead peer: do not wait on their teardown
    dist.destroy_process_group()
    return 0


def _group_nice(pid: int) -> int | None:
    """The nice of the autogroup of `pid` (None: no autogroup here: a kernel without them, or
    a process in a cgroup of its own, whose /proc/PID/autogroup reads empty)."""
    group = _autogroup(pid)
    return None if group is None else group[1]


def _policies(pid: int) -> list[str]:
    """The scheduling policy of each thread of `pid`."""
    names = {os.SCHED_OTHER: "other", os.SCHED_IDLE: "idle", os.SCHED_BATCH: "batch"}
    return sorted(
        names.get(os.sched_getscheduler(int(t)), "?") for t in os.listdir(f"/proc/{pid}/task")
    )


def _story(node: Any, task_id: int) -> list[str]:
    """A task's decisions, one short line each (for a failing check's message)."""
    return [
        f"{e.t_ns} {e.decision} {e.task_id} slot={e.slot} {e.reason} beaten={e.beaten}"
        for e in node.explain(task_id)
    ]


def _settles(cond: Any, deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def _wait(cond: Any, what: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main())
