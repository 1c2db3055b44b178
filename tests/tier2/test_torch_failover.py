"""Fast failure for PyTorch (issue 22 item 4; docs/TORCH.md, "Fast failure").

- The liveness news: a host's daemon tells its ranks the moment it declares another host
  dead (OP_PEER, docs/CLIENT.md), and tells a rank that connects later what it declared
  before; a host that comes back is told as alive again. Two `rdmasched daemon`s of one
  cluster on shm (Slurm's variables), the other host's daemon stopped with SIGSTOP.
- The failover: a short `rdmasched bench failover` run with rdmasched (two torchrun agents,
  `--nnodes 1:2`, each "host" in a cgroup of its own, the second frozen): the survivor
  exits with `EXIT_LOST` (75) within the liveness bound's sense (well before the process
  group's timeout), its agent restarts the job on the host left, which finishes; nothing
  of the run is left behind (no process, no cgroup), whatever the outcome.

Needs torch (the [torch] extra): without it these tests skip, except with CI=true, where a
missing torch fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

if importlib.util.find_spec("torch") is None:
    if os.environ.get("CI") == "true":
        pytest.fail("torch is not installed: CI must test the PyTorch integration", pytrace=False)
    pytest.skip("torch is not installed (pip install -e '.[torch]')", allow_module_level=True)

from rdmasched.client import Client
from rdmasched.integrations.freeze import read_stat
from rdmasched.integrations.torch import EXIT_LOST
from tests.waiting import wait_for

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def test_a_rank_hears_at_once_that_another_host_was_declared_dead() -> None:
    job = f"{os.getpid()}{uuid.uuid4().hex[:4]}"
    hosts = [f"pl{job}a", f"pl{job}b"]

    def env(host: int) -> dict[str, str]:
        e = dict(os.environ)
        for var in ("MASTER_ADDR", "GROUP_RANK", "NODE_RANK", "LOCAL_RANK", "RDMASCHED_HOST"):
            e.pop(var, None)
        e.update(
            PYTHONPATH=str(ROOT),
            SLURM_JOB_ID=job,
            SLURM_JOB_NODELIST=",".join(hosts),
            SLURM_NODEID=str(host),
            SLURM_NTASKS_PER_NODE="2",
            RDMASCHED_TRANSPORT="shm",
            RDMASCHED_HEARTBEAT_MS="20",
            RDMASCHED_DEAD_AFTER_MS="200",
        )
        return e

    daemons = [
        subprocess.Popen(
            [PY, "-m", "rdmasched.cli", "daemon"], env=env(h), stdout=subprocess.PIPE, text=True
        )
        for h in (0, 1)
    ]
    news: list[tuple[int, bool, str]] = []
    clients: list[Client] = []
    try:
        for d in daemons:
            assert d.stdout is not None
            assert "rdmasched daemon" in d.stdout.readline()
        first = Client(f"job{job}.{hosts[0]}", 0, session="")
        first.on_peer(lambda node, dead, why: news.append((node, dead, why)))
        clients.append(first.open())
        assert first.dead_peers == set()
        daemons[1].send_signal(signal.SIGSTOP)  # host 1 hangs
        wait_for(lambda: news, "the news of host 1 declared dead", 10)
        assert news[0][:2] == (1, True) and news[0][2], news
        assert first.dead_peers == {1}
        # a rank that connects later is told what was declared before it came
        later = Client(f"job{job}.{hosts[0]}", 1, session="")
        clients.append(later.open())
        wait_for(lambda: later.dead_peers == {1}, "a later rank told of host 1", 5)
        daemons[1].send_signal(signal.SIGCONT)  # it comes back, a new incarnation
        wait_for(lambda: len(news) > 1, "the news of host 1 alive again", 20)
        assert news[1][:2] == (1, False), news
        wait_for(lambda: first.dead_peers == set() == later.dead_peers, "no host dead", 5)
    finally:
        for c in clients:
            c.close()
        for d in daemons:
            d.send_signal(signal.SIGCONT)
            d.send_signal(signal.SIGTERM)
        for d in daemons:
            try:
                d.wait(30)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()


@pytest.mark.slow
def test_a_frozen_host_ends_the_survivor_with_exit_lost_and_torchrun_restarts(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    cmd = [PY, "-m", "rdmasched.cli", "bench", "failover", "--quick", "--only", "rdmasched"]
    proc = subprocess.run(
        [*cmd, "--json", "--out-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        doc = json.loads(proc.stdout)
        assert {"version", "machine", "commit"} <= set(doc)
        (run,) = doc["runs"]
        (failure,) = run["failures"]
        assert failure["exit_code"] == EXIT_LOST, failure
        # within the liveness bound's sense: the daemon's dead_after_ms (500 ms) and a
        # loaded machine's delays, far below the process group's timeout
        assert failure["exit_s"] < doc["timeout_s"] / 4, failure
        assert failure["error"] is None, failure  # the rank exited before any error handler
        # the agent restarted the job on the host left, which finished it
        ran = Path(failure["out"])
        events = [json.loads(line) for line in (ran / "events.jsonl").read_text().splitlines()]
        again = [e for e in events if e["ev"] == "start" and e["host"] == "hostA" and e["restart"]]
        assert again and again[0]["world"] == 1, events[-5:]
        assert any(e["ev"] == "done" for e in events)
        assert failure["agent_exit"] == 0  # the agent of the host left finished the job
        for path in failure["cgroups"]:
            assert not os.path.exists(path), f"the cgroup {path} was left"
        lost = (ran / "hostA.log").read_text()
        assert f"exits with {EXIT_LOST}" in lost and "will restart worker group" in lost
    finally:
        # nothing of the run left behind, frozen or not: every process it started is gone
        pids = []
        for path in out.glob("**/events.jsonl"):
            for line in path.read_text().splitlines():
                pid = json.loads(line).get("pid")
                if pid:
                    pids.append(pid)
        left = [p for p in pids if (st := read_stat(p)) is not None and st.state not in "ZX"]
        assert not left, f"processes of the run left: {left}"
