"""OS-enforced preemption: a `Freezer` stops and resumes real processes (issue 10 item 2).

Every test runs on both mechanisms: the cgroup v2 freezer (needs root or a delegated
subtree; CI runs as root, so with CI=true it must not skip) and SIGSTOP/SIGCONT. Progress is
the CPU time the kernel counts in /proc/<pid>/stat; no assertion is timed: conditions are
waited for with generous deadlines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmasched.errors import ArgumentError, ArgumentTypeError, RdmaschedError
from rdmasched.integrations import freeze
from rdmasched.integrations.freeze import (
    FreezePermissionError,
    Freezer,
    FreezerClosedError,
    FreezerUnavailableError,
    NoSuchProcessError,
)
from tests.waiting import wait_for

DEADLINE_S = 60.0
QUIET_S = 0.5  # how long a frozen process is watched for progress
SETTLE_S = 0.05

# burns CPU; prints its pid, then (on stdin "spawn") starts a burning child and prints its pid
WORK = textwrap.dedent(
    """
    import os, subprocess, sys, threading, zlib
    BURN = "import zlib\\nd = bytes(range(256)) * 4096\\nwhile True: zlib.compress(d, 6)"
    kids = []
    def listen():
        for line in sys.stdin:
            if line.strip() == "spawn":
                kids.append(subprocess.Popen([sys.executable, "-c", BURN]))
                print(kids[-1].pid, flush=True)
    threading.Thread(target=listen, daemon=True).start()
    print(os.getpid(), flush=True)
    d = bytes(range(256)) * 4096
    while True:
        zlib.compress(d, 6)
    """
)


def cpu_ticks(pid: int) -> int:
    st = freeze.read_stat(pid)
    assert st is not None, f"pid {pid} is gone"
    return st.utime + st.stime


def advances(pid: int) -> None:
    """Wait until the process burns CPU (a tick, 10 ms, at least)."""
    t0 = cpu_ticks(pid)
    wait_for(lambda: cpu_ticks(pid) > t0, f"pid {pid} makes progress")


def still(pids: list[int]) -> None:
    """The processes make no progress at all over QUIET_S (from SETTLE_S after the freeze:
    the kernel counts a task frozen or stopped just before it leaves the CPU)."""
    time.sleep(SETTLE_S)
    before = {p: cpu_ticks(p) for p in pids}
    time.sleep(QUIET_S)
    after = {p: cpu_ticks(p) for p in pids}
    assert after == before, f"frozen processes ran: {before} -> {after}"


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def v2_path(pid: int) -> str:
    return freeze.cgroup2_path(Path(f"/proc/{pid}/cgroup").read_text()) or ""


class Work:
    """A CPU-burning process that spawns burning children on request."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.pid = int(self.proc.stdout.readline())
        self.kids: list[int] = []

    def spawn(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("spawn\n")
        self.proc.stdin.flush()
        self.kids.append(int(self.proc.stdout.readline()))
        return self.kids[-1]

    def close(self) -> None:
        for p in self.kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(30)


def _cgroup_or_skip() -> None:
    ok, reason = freeze.cgroup_available()
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the cgroup v2 freezer must be tested in CI (runs as root): {reason}")
    pytest.skip(f"no writable cgroup v2 here ({reason}); run as root to test it")


@pytest.fixture(params=["cgroup", "signal"])
def mechanism(request: pytest.FixtureRequest) -> str:
    if request.param == "cgroup":
        _cgroup_or_skip()
    return str(request.param)


@pytest.fixture
def work() -> Iterator[Work]:
    w = Work()
    try:
        yield w
    finally:
        w.close()


def held_state(fz: Freezer, pid: int) -> bool:
    """Whether the kernel says `pid` is held: cgroup.events frozen 1, or 'T' in its stat."""
    if fz.mechanism == "cgroup":
        assert fz.path is not None
        return "frozen 1" in Path(fz.path, "cgroup.events").read_text().splitlines()
    st = freeze.read_stat(pid)
    return st is not None and st.state in "Tt"


def test_freeze_stops_progress_and_thaw_resumes(mechanism: str, work: Work) -> None:
    with Freezer(mechanism) as fz:
        assert fz.mechanism == mechanism
        fz.add(work.pid)
        assert fz.pids() == [work.pid]
        advances(work.pid)
        for _ in range(3):
            fz.freeze()
            assert fz.frozen and held_state(fz, work.pid)
            still([work.pid])
            fz.thaw()
            assert not fz.frozen and not held_state(fz, work.pid)
            advances(work.pid)


def test_children_of_the_work_are_held_too(mechanism: str, work: Work) -> None:
    early = work.spawn()  # a child before add(): add takes it with its parent
    with Freezer(mechanism) as fz:
        fz.add(work.pid)
        late = work.spawn()  # a child spawned while held: found at freeze
        wait_for(lambda: late in fz.pids(), "the late child is held")
        fz.freeze()
        assert sorted(fz.pids()) == sorted([work.pid, early, late])
        still([work.pid, early, late])
        fz.thaw()
        for p in (work.pid, early, late):
            advances(p)


def test_a_child_spawned_while_frozen_waits_to_be_held(mechanism: str, work: Work) -> None:
    with Freezer(mechanism) as fz:
        fz.add(work.pid)
        fz.freeze()
        fz.thaw()
        kid = work.spawn()
        fz.freeze()  # the new child is frozen with the rest
        still([work.pid, kid])
        fz.thaw()
        advances(kid)


def test_a_process_exiting_while_frozen_is_dropped(mechanism: str, work: Work) -> None:
    kid = work.spawn()
    with Freezer(mechanism) as fz:
        fz.add(work.pid)
        fz.freeze()
        os.kill(kid, signal.SIGKILL)  # a fatal signal gets through either freezer
        wait_for(lambda: kid not in fz.pids(), "the dead child is dropped")
        fz.freeze()  # idempotent, and no error for the dead child
        still([work.pid])
        fz.thaw()
        advances(work.pid)
        assert fz.pids() == [work.pid]


def test_close_releases_and_leaves_processes_running(mechanism: str, work: Work) -> None:
    kid = work.spawn()
    origin = v2_path(work.pid)
    fz = Freezer(mechanism)
    fz.add(work.pid)
    path = fz.path
    if mechanism == "cgroup":
        assert path is not None and Path(path).is_dir()
        assert v2_path(work.pid) == v2_path(kid) != origin
    fz.freeze()
    fz.close()
    fz.close()  # safe twice
    assert fz.closed and fz.path is None
    if mechanism == "cgroup":
        assert path is not None and not Path(path).exists()
        assert v2_path(work.pid) == origin
        assert v2_path(kid) == origin  # moved to the group it came from with its parent
    for p in (work.pid, kid):
        st = freeze.read_stat(p)
        assert st is not None and st.state not in "TtZ"
        advances(p)
    with pytest.raises(FreezerClosedError):
        fz.freeze()
    with pytest.raises(FreezerClosedError):
        fz.add(work.pid)


def test_freeze_and_thaw_are_idempotent(mechanism: str, work: Work) -> None:
    with Freezer(mechanism) as fz:
        fz.thaw()  # thawing a thawed group
        fz.add(work.pid)
        fz.thaw()
        fz.freeze()
        fz.freeze()  # freezing twice
        assert fz.frozen
        still([work.pid])
        fz.thaw()
        fz.thaw()
        advances(work.pid)


def test_adding_to_a_frozen_group_holds_the_newcomer(mechanism: str, work: Work) -> None:
    other = Work()
    try:
        with Freezer(mechanism) as fz:
            fz.add(work.pid)
            fz.freeze()
            fz.add(other.pid)
            still([work.pid, other.pid])
            fz.thaw()
            advances(other.pid)
    finally:
        other.close()


def test_errors_are_clear(mechanism: str, work: Work) -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    with Freezer(mechanism) as fz:
        with pytest.raises(NoSuchProcessError, match=f"pid {pid_max + 1} does not exist"):
            fz.add(pid_max + 1)
        with pytest.raises(ProcessLookupError):  # the builtin a caller would reach for
            fz.add(pid_max + 1)
        with pytest.raises(ArgumentError, match="calling process"):
            fz.add(os.getpid())
        with pytest.raises(ArgumentError, match="calling process"):
            fz.add(os.getppid())  # an ancestor: freezing it could freeze us
        kthreads = [p for p, st in freeze.proc_table().items() if st.flags & freeze.PF_KTHREAD]
        if kthreads:  # none in a pid namespace of its own
            with pytest.raises(ArgumentError, match="kernel thread"):
                fz.add(kthreads[0])
        with pytest.raises(ArgumentTypeError):
            fz.add(True)
        with pytest.raises(ArgumentError):
            fz.add(0)
        zombie = subprocess.Popen([sys.executable, "-c", "pass"])
        wait_for(lambda: (s := freeze.read_stat(zombie.pid)) is None or s.state == "Z", "exit")
        with pytest.raises(NoSuchProcessError, match="exited"):
            fz.add(zombie.pid)
        zombie.wait()
        assert fz.pids() == []
        fz.add(work.pid)  # the errors lost nothing
        fz.freeze()
        still([work.pid])


def test_unknown_mechanism_and_a_parent_outside_cgroup2(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="mechanism"):
        Freezer("freezer")
    with pytest.raises(FreezerUnavailableError, match=str(tmp_path)):
        Freezer("cgroup", parent=str(tmp_path))
    assert issubclass(FreezerUnavailableError, RdmaschedError)


def test_auto_prefers_the_cgroup_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    _cgroup_or_skip()
    with caplog.at_level(logging.INFO, logger="rdmasched.freeze"), Freezer() as fz:
        assert fz.mechanism == "cgroup"
        assert fz.path is not None and Path(fz.path).is_dir()
        assert Path(fz.path).parent == Path(freeze.find_cgroup2() or "/nonexistent") / (
            v2_path(os.getpid()).lstrip("/")
        )
    assert any(
        "cgroup" in r.getMessage() and "cgroup.freeze" in r.getMessage() for r in caplog.records
    )
    with caplog.at_level(logging.INFO, logger="rdmasched.freeze"), Freezer("signal") as fz:
        assert fz.mechanism == "signal" and fz.path is None
    assert any("SIGSTOP" in r.getMessage() for r in caplog.records)


# ---- without privileges: a child process drops root (or already runs without it) ----------
UNPRIVILEGED = textwrap.dedent(
    """
    import os, sys
    if os.getuid() == 0:
        os.setgid(65534); os.setuid(65534)
    from rdmasched.integrations.freeze import Freezer, FreezePermissionError
    victim = int(sys.argv[1])
    try:
        Freezer("cgroup")
    except FreezePermissionError as e:
        print("cgroup:", type(e).__name__, e)
    except Exception as e:
        print("cgroup:", type(e).__name__, e)
    with Freezer() as fz:
        print("auto:", fz.mechanism, "|", fz.reason)
        try:
            fz.add(victim)
        except PermissionError as e:
            print("add:", type(e).__name__, e)
    """
)


def test_without_privileges_cgroup_is_refused_and_auto_falls_back(work: Work) -> None:
    if os.getuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("drops root to test the unprivileged path: run as root")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run(
        [sys.executable, "-c", UNPRIVILEGED, str(work.pid)],
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE_S,
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    # cgroup forced: a clear error naming the file it could not write (or no cgroup2 here)
    assert lines["cgroup"].startswith(("FreezePermissionError", "FreezerUnavailableError"))
    if lines["cgroup"].startswith("FreezePermissionError"):
        assert "/" in lines["cgroup"] and "ermission denied" in lines["cgroup"]
    assert lines["auto"].startswith("signal |")  # fell back, and says why
    assert len(lines["auto"]) > len("signal | ")
    # signalling a process of another user: a clear error naming the pid
    assert lines["add"].startswith("FreezePermissionError")
    assert str(work.pid) in lines["add"]
    assert issubclass(FreezePermissionError, PermissionError)


# ---- the benchmark: a short real run ---------------------------------------------------------
def test_the_benchmark_measures_both_mechanisms_and_verifies_no_progress() -> None:
    from rdmasched.bench import freeze as bench

    ok, why = freeze.cgroup_available()
    if not ok and os.environ.get("CI") == "true":
        pytest.fail(f"the cgroup v2 freezer must be measured in CI: {why}")
    before = set(freeze.proc_table())
    r = bench.run(repetitions=6, workers=2, hold_ms=1, gap_ms=2, rounds=2, checks=2, check_ms=200)
    expect = ["cgroup", "signal"] if ok else ["signal"]
    assert sorted(r["mechanisms"]) == expect, r
    assert r["verified"], r
    for m in expect:
        v = r["mechanisms"][m]
        assert v["processes"] == 3  # the pool's parent and its two workers
        assert v["freeze_us"]["n"] == v["thaw_us"]["n"] == 6
        assert 0 < v["freeze_us"]["min"] <= v["freeze_us"]["p50"] <= v["freeze_us"]["max"]
        assert len(v["checks"]) == 2
        for c in v["checks"]:
            assert c["frozen_ticks"] == 0 and c["frozen_ns"] == 0
            assert c["resumed_ms"] is not None

    # the co-located job is gone (its killed workers are reaped by init soon after)
    def left() -> list[int]:
        return [
            pid
            for pid, st in freeze.proc_table().items()
            if pid not in before and st.state != "Z" and b"rdmasched.bench.freeze" in cmdline(pid)
        ]

    wait_for(lambda: not left(), "the co-located job's processes are gone")


def test_the_benchmark_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    from rdmasched.bench import freeze as bench

    rc = bench.main(
        [
            "--repetitions",
            "2",
            "--rounds",
            "1",
            "--checks",
            "1",
            "--check-ms",
            "100",
            "--mechanism",
            "signal",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    r = json.loads(out)
    assert list(r["mechanisms"]) == ["signal"] and r["verified"]
    assert (
        bench.main(
            ["--repetitions", "2", "--rounds", "1", "--checks", "0", "--mechanism", "signal"]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "signal     freeze" in table and "signal     thaw" in table


def test_groups_created_below_ours_are_removed_first(work: Work) -> None:
    _cgroup_or_skip()
    kid = work.spawn()
    origin = v2_path(kid)
    fz = Freezer("cgroup")
    fz.add(work.pid)
    assert fz.path is not None
    sub = Path(fz.path, "sub", "deeper")
    sub.mkdir(parents=True)  # as a container runtime inside the work might
    (sub / "cgroup.procs").write_text(str(kid))
    fz.freeze()  # the subgroup is frozen with ours
    still([work.pid, kid])
    assert sorted(fz.pids()) == sorted([work.pid, kid])
    fz.close()
    assert not Path(fz_path := str(sub.parent.parent)).exists(), fz_path
    assert v2_path(kid) == origin
    advances(kid)


def test_a_forked_child_cannot_use_or_release_the_group(mechanism: str, work: Work) -> None:
    fz = Freezer(mechanism)
    try:
        fz.add(work.pid)
        fz.freeze()
        pid = os.fork()
        if pid == 0:  # the child: refused, and its close() leaves the group alone
            code = 1
            try:
                fz.thaw()
            except freeze.FreezeError as exc:
                code = 3 if "belongs to pid" in str(exc) else 2
            fz.close()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 3
        assert fz.frozen and held_state(fz, work.pid)
        if mechanism == "cgroup":
            assert fz.path is not None and Path(fz.path).is_dir()
        still([work.pid])
        fz.thaw()
        advances(work.pid)
    finally:
        fz.close()


def test_children_false_holds_the_process_alone(mechanism: str, work: Work) -> None:
    kid = work.spawn()
    with Freezer(mechanism) as fz:
        fz.add(work.pid, children=False)
        assert fz.pids() == [work.pid]
        fz.freeze()
        assert fz.pids() == [work.pid]
        still([work.pid])
        advances(kid)  # the child was not taken
        fz.thaw()
        advances(work.pid)


def test_a_group_inside_a_given_parent(work: Work) -> None:
    _cgroup_or_skip()
    with Freezer("cgroup") as outer:
        assert outer.path is not None
        inner = Freezer("cgroup", parent=outer.path, name="job")
        assert inner.path == os.path.join(outer.path, "job")
        inner.add(work.pid)
        outer.freeze()  # freezing a group freezes the groups below it
        still([work.pid])
        outer.thaw()
        advances(work.pid)
        inner.freeze()
        still([work.pid])
        inner.close()
        assert not Path(outer.path, "job").exists()
        advances(work.pid)
        with pytest.raises(ArgumentError, match="one directory name"):
            Freezer("cgroup", parent=outer.path, name="a/b")


# forks a child (that sleeps) every millisecond, up to 400, printing its own pid first
FORKER = textwrap.dedent(
    """
    import os, sys, time
    print(os.getpid(), flush=True)
    for _ in range(400):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        time.sleep(0.001)
    time.sleep(60)
    """
)


def test_a_child_forked_while_its_parent_is_added_is_held_too() -> None:
    # Regression: a co-located job's worker forked while the rank added the job (after the
    # freezer read /proc for the job's descendants, before the job was in the cgroup) was
    # born outside the group: never frozen, and left running by the close that killed the
    # group (found after a managed DDP run: the job's worker alive, its cgroup empty). Every
    # descendant of a process added is in the group when add() returns.
    _cgroup_or_skip()
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", FORKER], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            pid = int(proc.stdout.readline())
            time.sleep(0.05)  # forking now
            with Freezer("cgroup") as fz:
                fz.add(pid)
                kids = freeze.descendants([pid], freeze.proc_table())
                outside = sorted(k for k in kids if v2_path(k) != v2_path(pid))
                assert outside == [], f"{len(outside)} of {len(kids)} children outside the group"
        finally:
            for k in freeze.descendants([proc.pid], freeze.proc_table()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(k, signal.SIGKILL)
            proc.kill()
            proc.wait(30)
