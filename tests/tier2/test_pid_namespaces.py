"""A daemon and its client in separate PID namespaces, as two Kubernetes pods are (issue 22
item 3; docs/PROTOCOL.md section 9, "Liveness tokens"; docs/KUBERNETES.md).

Pods of one host share /dev/shm (a hostPath) but not their PID namespaces: a process of one
cannot see the other's /proc/<pid>. Each test runs one end under `unshare -p --fork
--mount-proc` (its own PID namespace, its own /proc, the host's /dev/shm) and the other in
this process, and shows that the client works, that a live client (or daemon) in the other
namespace is not taken for dead, and that a killed one is found gone within the liveness
bound (the hub's `check_ms`, the client's `check_ms`). Liveness comes from the lanes'
liveness tokens (open-file-description locks), which the kernel drops when the process dies
and which any namespace sees; a forked child of a rank does not keep the rank alive, and
another user can neither take a token nor open a lane.

These tests need root (unshare -p, a second user): CI runs as root, so with CI=true a
missing capability fails them instead of skipping.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmasched.client import Client, DaemonGoneError
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.clients import ClientHub
from rdmasched.daemon.node import Node
from rdmasched.errors import LaneBusyError
from rdmasched.transport import shm
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
CHECK_MS = 50
#: the liveness bound these tests hold the ends to: one check period, and the loop pass
#: that acts on it, with room for a busy 2-core machine (the figure is a bound, not a
#: measurement: a death is found on the first check after it)
BOUND_S = 2.0
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


def _need_unshare() -> None:
    why = ""
    if os.geteuid() != 0:
        why = "needs root (unshare --pid)"
    else:
        r = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True)
        if r.returncode != 0:
            why = f"unshare --pid fails here: {r.stderr.strip()}"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PID-namespace liveness must be tested in CI (runs as root): {why}")
        pytest.skip(why)


def one_host(name: str) -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "cluster": {"name": name, "heartbeat_ms": 20, "dead_after_ms": 200},
            "node": [{"name": "h0", "slots": 2}],
        }
    )


@pytest.fixture
def daemon() -> Iterator[tuple[Node, ClientHub]]:
    """A one-host daemon in this process (this PID namespace)."""
    _need_unshare()
    node = Node(one_host(f"ns{os.getpid()}-{uuid.uuid4().hex[:6]}"), "h0", spin_us=0).start()
    hub = ClientHub(node, check_ms=CHECK_MS).open()
    try:
        yield node, hub
    finally:
        node.stop()


#: a rank: connects, submits task 7, reports its pid (1: its namespace's first process) and
#: the start, then stays connected until its stdin closes (or it is killed)
CLIENT = """
import os, sys
from rdmasched.client import Client
c = Client(sys.argv[1], 0, connect_timeout_s=30, check_ms={check})
started = []
c.on_dispatch(lambda t, slot: started.append(t.id))
with c:
    c.submit(7, priority=1)
    assert c.wait_for(lambda: started, 30), "task 7 did not start"
    if len(sys.argv) > 2:  # a forked child that outlives its parent (a dataloader worker)
        if os.fork() == 0:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            import time
            time.sleep(60)
            os._exit(0)
    print("pid", os.getpid(), "started", started[0], flush=True)
    sys.stdin.read()
"""

#: a host's daemon: serves client 0 of h0, says so, runs until its stdin closes
DAEMON = """
import os, sys
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.clients import ClientHub
from rdmasched.daemon.node import Node
cfg = ClusterConfig.from_dict(
    {{"cluster": {{"name": sys.argv[1]}}, "node": [{{"name": "h0", "slots": 2}}]}}
)
node = Node(cfg, "h0", spin_us=0).start()
hub = ClientHub(node, check_ms={check}).open()
print("pid", os.getpid(), "endpoint", hub.endpoint, flush=True)
sys.stdin.read()
node.stop()
"""


def _spawn(argv: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _first_line(p: subprocess.Popen[str]) -> list[str]:
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        p.kill()
        _, err = p.communicate(timeout=30)
        raise AssertionError(f"the process in the other namespace failed:\n{err}")
    return line.split()


def _stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    p.communicate(timeout=30)


def test_a_client_in_another_pid_namespace_works_stays_and_is_dropped_when_killed(
    daemon: tuple[Node, ClientHub],
) -> None:
    node, hub = daemon
    p = _spawn([*UNSHARE, PY, "-c", CLIENT.format(check=CHECK_MS), hub.endpoint])
    try:
        words = _first_line(p)
        # (a) it works: connected, its task started on it; and it is its namespace's pid 1,
        # which in this namespace is another process (or none)
        assert words == ["pid", "1", "started", "7"], words
        assert hub.stats()["connects"] == 1
        # (c) alive in another namespace: not dropped over many check periods
        time.sleep(20 * CHECK_MS / 1000)
        s = hub.stats()
        assert s["clients"] == [0] and s["clients_dead"] == 0, s
        assert node.stats()["scheduler"]["running"] == 1
        # (b) killed: dropped within the bound, its task cancelled
        killed = time.monotonic()
        p.kill()  # --kill-child: the namespace's processes get SIGKILL
        wait_for(lambda: hub.stats()["clients"] == [], "the killed client dropped", BOUND_S)
        assert time.monotonic() - killed <= BOUND_S
        assert hub.stats()["clients_dead"] == 1
        wait_for(lambda: node.stats()["scheduler"]["running"] == 0, "its task cancelled")
    finally:
        _stop(p)


def test_a_daemon_in_another_pid_namespace_serves_and_is_found_gone() -> None:
    _need_unshare()
    cluster = f"nsd{os.getpid()}-{uuid.uuid4().hex[:6]}"
    p = _spawn([*UNSHARE, PY, "-c", DAEMON.format(check=CHECK_MS), cluster])
    try:
        words = _first_line(p)
        assert words[:2] == ["pid", "1"], words
        endpoint = words[3]
        c = Client(endpoint, 0, connect_timeout_s=30, check_ms=CHECK_MS)
        started: list[int] = []
        c.on_dispatch(lambda t, slot: started.append(t.id))
        with c:
            c.submit(9, priority=1)
            assert c.wait_for(lambda: bool(started), 30)
            # a live daemon in another namespace is not taken for gone
            assert not c.wait_for(lambda: False, 20 * CHECK_MS / 1000)
            assert c.healthy
            killed = time.monotonic()
            p.kill()
            with pytest.raises(DaemonGoneError):
                c.wait_for(lambda: False, BOUND_S)
            assert time.monotonic() - killed <= BOUND_S
    finally:
        _stop(p)


def test_a_forked_child_does_not_keep_a_killed_rank_alive(
    daemon: tuple[Node, ClientHub],
) -> None:
    """A rank's fork (a dataloader worker) inherits its descriptors; it must not inherit
    the rank's liveness token (docs/PROTOCOL.md: forked children close theirs)."""
    _node, hub = daemon
    p = _spawn([PY, "-c", CLIENT.format(check=CHECK_MS), hub.endpoint, "fork"])
    child = 0
    try:
        words = _first_line(p)
        assert words[2:] == ["started", "7"], words
        kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
        assert len(kids) == 1, kids
        child = int(kids[0])
        p.kill()
        p.wait(30)
        wait_for(lambda: hub.stats()["clients"] == [], "the killed rank dropped", BOUND_S)
        assert Path(f"/proc/{child}").exists()  # its child still runs
    finally:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        _stop(p)


def test_another_user_can_neither_take_a_token_nor_open_a_lane(
    daemon: tuple[Node, ClientHub],
) -> None:
    """Hostile local user: a lane is mode 0600, so another user can open it neither to
    write nor to lock a byte of it (to fake a live client) nor to hold the daemon's token;
    the hub's checks never block on what another user does."""
    _node, hub = daemon
    path = shm.SHM_DIR + shm.lane_segment_name(f"{hub.endpoint}.c0.up")
    assert os.stat(path).st_mode & 0o777 == 0o600
    probe = (
        "import fcntl, os, struct, sys\n"
        "for flags in (os.O_RDWR, os.O_RDONLY):\n"
        "    try:\n"
        "        fd = os.open(sys.argv[1], flags)\n"
        "    except PermissionError:\n"
        "        continue\n"
        "    lock = struct.pack('@hhqqi4x', fcntl.F_RDLCK, 0, 68, 1, 0)\n"
        "    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)\n"
        "    print('locked'); sys.exit(1)\n"
        "print('refused')\n"
    )
    r = subprocess.run(
        ["/usr/bin/python3", "-c", probe, path],
        user=65534,
        group=65534,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.strip() == "refused", r.stdout + r.stderr
    # and a second sender of this user is refused while a live one holds the lane
    c = Client(hub.endpoint, 0, connect_timeout_s=30, check_ms=CHECK_MS).open()
    try:
        with pytest.raises(LaneBusyError):
            shm.attach_lane(f"{hub.endpoint}.c0.up")
    finally:
        c.close()


def test_the_jobs_wait_for_the_daemon_sees_a_daemon_of_another_namespace(
    daemon: tuple[Node, ClientHub],
) -> None:
    """deploy/kubernetes/job.yaml's init container, run as it is in its own PID namespace,
    finds the daemon of this one (launch.daemon_running reads the lane's token)."""
    yaml = pytest.importorskip("yaml") if os.environ.get("CI") != "true" else __import__("yaml")
    node, hub = daemon
    docs = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/job.yaml").read_text()))
    pod = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]
    init = next(c for c in pod["initContainers"] if c["name"] == "wait-for-daemon")
    assert init["command"][:2] == ["python3", "-c"]
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        RDMASCHED_CLUSTER=node.cluster.name,
        RDMASCHED_HOST=node.spec.name,
    )
    r = subprocess.run(
        [*UNSHARE, PY, "-c", init["command"][2]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert hub.stats()["connects"] == 0  # it only looked
