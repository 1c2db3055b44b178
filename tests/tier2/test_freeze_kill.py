"""`Freezer(kill=True)`: the work dies with its freezer (issue 20 item 6; docs/PREEMPTION.md).

`close()` kills the group and removes its cgroup; an owner killed with SIGKILL (no
``finally``, no atexit) leaves the same to its reaper. The work here is two sleeping
processes (a session leader and its child), on both mechanisms.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rdmasched.integrations.freeze import Freezer, cgroup_available, read_stat
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
WORK = ["sh", "-c", "sleep 300 & exec sleep 300"]  # a session leader and its child

OWNER = f"""
import subprocess, sys
from rdmasched.integrations.freeze import Freezer
fz = Freezer(sys.argv[1], kill=True)
work = subprocess.Popen({WORK!r}, start_new_session=True)
import time; time.sleep(0.2)  # its child is forked
fz.add(work.pid)
if sys.argv[2] == "frozen":
    fz.freeze()
print(work.pid, fz.path or "-", *fz.pids(), flush=True)
time.sleep(300)
"""


def mechanism_or_skip(mechanism: str) -> None:
    if mechanism == "cgroup":
        ok, why = cgroup_available()
        if not ok:
            if os.environ.get("CI") == "true":
                pytest.fail(f"the cgroup v2 freezer must be tested in CI (runs as root): {why}")
            pytest.skip(f"no writable cgroup v2 here ({why})")


def alive(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.state not in "ZX"


@pytest.mark.parametrize("state", ["running", "frozen"])
@pytest.mark.parametrize("mechanism", ["cgroup", "signal"])
def test_an_owner_killed_without_closing_leaves_its_work_to_the_reaper(
    mechanism: str, state: str
) -> None:
    mechanism_or_skip(mechanism)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, mechanism, state],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    held: list[int] = []
    path = "-"
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().split()
        assert line, "the owner did not start"
        path, held = line[1], [int(x) for x in line[2:]]
        assert len(held) == 2 and all(alive(p) for p in held)
        owner.kill()  # SIGKILL: no finally, no atexit, no close()
        owner.wait(30)
        wait_for(lambda: not any(alive(p) for p in held), f"the work {held} killed", 30)
        if path != "-":
            wait_for(lambda: not os.path.exists(path), f"{path} removed", 30)
    finally:
        if owner.poll() is None:
            owner.kill()
        for p in held:
            if alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("mechanism", ["cgroup", "signal"])
def test_close_kills_the_work_and_removes_the_group(mechanism: str) -> None:
    mechanism_or_skip(mechanism)
    work = subprocess.Popen(WORK, start_new_session=True)
    try:
        fz = Freezer(mechanism, kill=True)
        wait_for(lambda: len(_children(work.pid)) == 1, "the work's child forked")
        fz.add(work.pid)
        fz.freeze()
        held = fz.pids()
        path = fz.path
        reaper = fz._reaper
        assert len(held) == 2 and reaper is not None
        fz.close()
        work.wait(30)  # our child: reaped here
        wait_for(lambda: not any(alive(p) for p in held), f"the work {held} killed", 30)
        assert path is None or not os.path.exists(path)
        assert reaper.proc.poll() == 0  # told it was done: it reaped nothing
    finally:
        if work.poll() is None:
            os.killpg(work.pid, signal.SIGKILL)
            work.wait()


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
