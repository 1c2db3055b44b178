"""One daemon per host, its ranks as clients (issue 8 item 7; docs/CLIENT.md).

Real processes on shm: two client ranks on one daemon (each gets only its own tasks'
callbacks, both get the sync release, the sync preempts one of them), a daemon killed under
its clients (they raise, within the bound, instead of hanging), a client killed under its
daemon (the daemon goes on, counts it, cancels its tasks, takes a new process as that
client), and a torchrun-style launch: two "hosts" on this machine (two daemons with
different host names, RDMASCHED_HOST), each started by its local rank 0, finding each other
through a TCPStore at MASTER_ADDR:MASTER_PORT as torchrun's agent runs one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdmasched.client import Client, DaemonGoneError
from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.clients import ClientHub
from rdmasched.daemon.node import Node
from rdmasched.errors import ArgumentError, ArgumentTypeError, ConfigError, LaneBusyError
from rdmasched.limits import NO_SLOT
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def one_host(name: str, slots: int = 2) -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "cluster": {"name": name, "heartbeat_ms": 20, "dead_after_ms": 200},
            "node": [{"name": "h0", "slots": slots}],
        }
    )


@pytest.fixture
def daemon() -> Iterator[tuple[Node, ClientHub]]:
    """A one-host daemon in this process, serving 2 clients."""
    node = Node(one_host(f"c{os.getpid()}-{uuid.uuid4().hex[:6]}"), "h0", spin_us=50).start()
    hub = ClientHub(node).open()
    try:
        yield node, hub
    finally:
        node.stop()


def rank_env(node: Node, k: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("SLURM_JOB_NODELIST", "SLURM_NODEID", "MASTER_ADDR", "GROUP_RANK", "NODE_RANK"):
        env.pop(var, None)
    env.update(
        PYTHONPATH=str(ROOT),
        RDMASCHED_CLUSTER=node.cluster.name,
        RDMASCHED_HOST=node.spec.name,
        LOCAL_RANK=str(k),
        RANK=str(k),
        **extra,
    )
    return env


def ranks(envs: list[dict[str, str]]) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [PY, "-m", "tests.ranks"], cwd=ROOT, env=e, stdout=subprocess.PIPE, text=True
        )
        for e in envs
    ]


def results(procs: list[subprocess.Popen[str]], timeout_s: float = 300) -> list[dict[str, Any]]:
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=timeout_s)
        assert p.returncode == 0, f"rank exited {p.returncode}: {stdout}"
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_two_ranks_on_one_daemon_get_only_their_own_callbacks(
    daemon: tuple[Node, ClientHub],
) -> None:
    node, hub = daemon
    got = results(ranks([rank_env(node, k, RANKS_TASKS="2", RANKS_STEPS="2") for k in (0, 1)]))
    preempts = []
    for r in got:
        mine = {r["rank"] * 1000 + i for i in range(2)}
        assert r["done"] == sorted(mine)
        for ev in r["seen"]:
            if ev[0] in ("start", "preempt"):
                assert ev[1] in mine and ev[2] == node.id, (r["rank"], ev)
            if ev[0] == "preempt":
                preempts.append(ev)
        assert r["syncs"] == [0, 1, 2]  # every participant ran every step's release
        assert r["rejected"] == {} and r["handler_errors"] == {}
        assert r["nodes"] == [node.id] and r["name"] == "h0"
    # both slots were busy when step 0 was released (nothing completes before): the sync
    # task took one, preempting a task of one of the two ranks, which that rank alone heard
    assert len(preempts) >= 1
    wait_for(lambda: hub.stats()["clients_left"] == 2, what="both ranks to leave")
    s = node.stats()
    assert s["clients"]["connects"] == 2 and s["clients"]["clients_dead"] == 0
    assert s["rejected"] == {} and s["scheduler"]["running"] == 0


def test_an_overlapping_groups_release_preempts_no_rank(daemon: tuple[Node, ClientHub]) -> None:
    # the same two ranks, group 1 overlapping: both slots are busy when step 0 is released,
    # and yet no task is preempted: every on_sync runs with slot NO_SLOT, beside the tasks
    node, hub = daemon
    envs = [rank_env(node, k, RANKS_TASKS="2", RANKS_STEPS="2", RANKS_OVERLAP="1") for k in (0, 1)]
    got = results(ranks(envs))
    for r in got:
        assert r["syncs"] == [0, 1, 2]
        assert r["sync_slots"] == [NO_SLOT] * 3
        assert [ev for ev in r["seen"] if ev[0] == "preempt"] == []
        assert r["rejected"] == {} and r["handler_errors"] == {}
    wait_for(lambda: hub.stats()["clients_left"] == 2, what="both ranks to leave")
    s = node.stats()
    assert s["scheduler"]["preemptions"] == 0 and s["scheduler"]["sync_releases"] == 3
    assert s["scheduler"]["running"] == 0 and node.core.beside == set()


def test_ranks_that_disagree_on_overlap_get_a_clear_error(
    daemon: tuple[Node, ClientHub],
) -> None:
    _, hub = daemon
    with Client(hub.endpoint, 0) as a, Client(hub.endpoint, 1) as b:
        a.define_group(4, ["h0"], overlap=True)
        with pytest.raises(ArgumentError, match="overlap=True"):
            b.define_group(4, ["h0"])
        with pytest.raises(ArgumentTypeError, match="overlap must be"):
            b.define_group(5, ["h0"], overlap=1)  # type: ignore[arg-type]
        with pytest.raises(ArgumentError, match="overlap=True"):  # the same client, again
            a.define_group(4, ["h0"])
        a.define_group(4, ["h0"], overlap=True)  # alike: nothing to do


def test_a_task_started_before_any_client_connected_waits_for_the_first_one(
    daemon: tuple[Node, ClientHub],
) -> None:
    """A host's ranks connect after its daemon joined: work placed on the host meanwhile (a
    peer's, or the daemon's own) starts on a slot no rank serves yet. It is handed to the
    first rank that connects, not lost (the two-host runs lost such a task: its origin never
    heard it complete, and the last step's barrier hung)."""
    node, hub = daemon
    node.dispatch(7, priority=1, cost_ns=1000)  # no client yet, and no handler of its own
    node.dispatch(8, priority=1, cost_ns=1000)
    node.dispatch(9, priority=1, cost_ns=1000)  # queued: both slots are taken
    wait_for(lambda: node.stats()["scheduler"]["running"] == 2, what="7 and 8 started")
    assert hub.stats()["waiting_starts"] == 2
    started: list[tuple[int, int]] = []
    preempted: list[int] = []
    c = Client(hub.endpoint, 1)
    c.on_dispatch(lambda t, slot: started.append((t.id, slot)))
    c.on_preempt(lambda t, slot, cancel: preempted.append(t.id) or t.progress_ns)
    with c:
        wait_for(lambda: len(started) == 2, what="the waiting starts handed to the client")
        assert sorted(t for t, _ in started) == [7, 8]
        assert hub.stats()["waiting_starts"] == 0
        c.complete(7)
        wait_for(lambda: len(started) == 3, what="task 9 started in 7's slot")
        assert started[2][0] == 9
        c.complete(8)
        c.complete(9)
        wait_for(lambda: node.stats()["scheduler"]["running"] == 0, what="all three done")
    assert node.stats()["rejected"] == {} and preempted == []
    assert node.stats()["scheduler"]["completions"] == 3


def test_a_waiting_start_preempted_before_any_client_came_answers_at_once(
    daemon: tuple[Node, ClientHub],
) -> None:
    """Preempting (or cancelling) a task that waits for a client needs no client: it never
    ran, so its progress is what it was, and the slot is free at once."""
    node, hub = daemon
    node.dispatch(7, priority=1, cost_ns=1000)
    node.dispatch(8, priority=2, cost_ns=1000)
    wait_for(lambda: hub.stats()["waiting_starts"] == 2, what="7 and 8 waiting")
    node.dispatch(9, priority=5, cost_ns=1000)  # outranks 7: preempts it, takes its slot
    node.preempt(8, cancel=True)  # its slot goes to 7, requeued
    wait_for(lambda: node.stats()["scheduler"]["cancels"] == 1, what="8 cancelled")
    s = node.stats()["scheduler"]
    assert s["running"] == 2 and s["queue_len"] == 0 and s["preemptions"] == 1
    assert hub.stats()["waiting_starts"] == 2
    started: list[int] = []
    c = Client(hub.endpoint, 0)
    c.on_dispatch(lambda t, slot: started.append(t.id))
    with c:
        wait_for(lambda: sorted(started) == [7, 9], what="9 and the requeued 7 handed over")
    assert node.stats()["rejected"] == {}


def test_a_start_that_came_before_on_dispatch_was_registered_is_handed_to_it(
    daemon: tuple[Node, ClientHub],
) -> None:
    node, hub = daemon
    started: list[tuple[int, int]] = []
    with Client(hub.endpoint, 0) as c:
        node.dispatch(7, priority=1, cost_ns=1000)
        node.dispatch(8, priority=1, cost_ns=1000)
        wait_for(lambda: c.stats()["client"]["running"] == 2, what="both starts received")
        c.on_dispatch(lambda t, slot: started.append((t.id, slot)))
        wait_for(lambda: len(started) == 2, what="the earlier starts handed to on_dispatch")
        assert sorted(started) == [(7, 0), (8, 1)] or sorted(started) == [(7, 1), (8, 0)]
        c.complete(7)
        c.complete(8)
        wait_for(lambda: node.stats()["scheduler"]["running"] == 0, what="both done")
    assert c.handler_errors == {} and node.stats()["rejected"] == {}


def test_bad_requests_get_clear_errors(daemon: tuple[Node, ClientHub]) -> None:
    _, hub = daemon
    with Client(hub.endpoint, 0) as c:
        with pytest.raises(ConfigError, match="no node 'nope'"):
            c.define_group(1, ["nope"])
        with pytest.raises(ArgumentError, match="local must be"):
            c.define_group(1, ["h0"], local=7)
        with pytest.raises(ArgumentError, match="never declared"):
            c.sync_ready(2, 0)
        with pytest.raises(ArgumentError):
            c.submit(-1)
        c.submit(5, priority=3)
        c.submit(5, priority=3)  # the same id while the first lives: refused by the daemon
        c.flush()
        assert c.rejected == {"ArgumentError": 1}
        assert "still held" in (c.last_rejection or "")
        with pytest.raises(LaneBusyError, match=r"another running process|is taken"):
            Client(hub.endpoint, 0, connect_timeout_s=2).open()
    wait_for(lambda: not hub.clients, what="the client to leave")


def test_no_daemon_is_a_clear_error_at_connect(lane_name: Any) -> None:
    with pytest.raises(DaemonGoneError, match=r"no rdmasched daemon serves .*rdmasched daemon"):
        Client(f"{lane_name('x')}.h0", 0, connect_timeout_s=0.5).open()


def test_killed_daemon_makes_waiting_clients_raise(tmp_path: Path) -> None:
    name = f"k{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(f'[cluster]\nname = "{name}"\n\n[[node]]\nname = "h0"\nslots = 2\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = "import sys; from rdmasched.cli import main; sys.exit(main(sys.argv[1:]))"
    d = subprocess.Popen(
        [PY, "-c", cmd, "daemon", "--config", str(cfg), "--node", "h0"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert d.stdout is not None
        line = d.stdout.readline()
        assert f"at {name}.h0" in line, line
        c = Client(f"{name}.h0", 1).open()
        c.submit(1, priority=5)
        c.flush()
        os.kill(d.pid, signal.SIGKILL)
        d.wait()
        # wait_for would wait 600 s for a condition that never holds; it raises instead
        with pytest.raises(DaemonGoneError, match="is gone"):
            c.wait_for(lambda: False, timeout_s=600)
        with pytest.raises(DaemonGoneError):
            c.submit(2)
        with pytest.raises(DaemonGoneError):
            c.flush()
        c.close()
    finally:
        if d.poll() is None:
            d.kill()
            d.wait()
        # what the killed daemon left (only its own segments: others' are not ours to touch)
        from rdmasched.clientproto import bell_name
        from rdmasched.daemon.links import ShmLinks
        from rdmasched.transport import shm

        bells = {
            f"/rdmasched.{ShmLinks.bell_name(name, 0)}",
            f"/rdmasched.{bell_name(name + '.h0', 'd')}",
        }
        for seg in shm.list_segments():
            if seg.startswith(f"/rdmasched.{name}.") or seg in bells:
                shm.ShmSegment.unlink_name(seg)


def test_killed_client_is_dropped_counted_and_replaced(daemon: tuple[Node, ClientHub]) -> None:
    node, hub = daemon
    (p,) = [
        subprocess.Popen(
            [PY, "-m", "tests.ranks"],
            cwd=ROOT,
            env=rank_env(node, 0, RANKS_TASKS="3", RANKS_HOLD="1"),
            stdout=subprocess.PIPE,
            text=True,
        )
    ]
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    wait_for(lambda: node.stats()["scheduler"]["running"] == 2, what="two tasks running")
    p.kill()
    p.wait()
    wait_for(lambda: hub.stats()["clients_dead"] == 1, what="the daemon to notice")
    node.flush()
    s = node.stats()
    assert s["clients"]["cancelled"] == 3 and s["clients"]["owned_tasks"] == 0
    assert s["scheduler"]["running"] == 0 and s["scheduler"]["queue_len"] == 0
    # the daemon goes on: a new process as client 0 runs its tasks
    started: list[int] = []
    with Client(hub.endpoint, 0) as c:
        c.on_dispatch(lambda t, slot: started.append(t.id))
        c.submit(0, priority=1)  # the dead rank's id 0 is free again
        c.flush()
        assert started == [0]
        c.complete(0)
        c.flush()
    assert node.stats()["rejected"] == {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_torchrun_style_two_hosts_find_each_other_through_the_tcpstore() -> None:
    torch_distributed = pytest.importorskip("torch.distributed")
    port = free_port()
    # what torchrun's agent runs: the rendezvous store at MASTER_ADDR:MASTER_PORT
    store = torch_distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    name = f"tr{os.getpid()}-{uuid.uuid4().hex[:6]}"
    envs = []
    for host in (0, 1):
        for local in (0, 1):
            env = dict(os.environ)
            for var in ("SLURM_JOB_NODELIST", "SLURM_NODEID", "RDMASCHED_SLOTS"):
                env.pop(var, None)
            env.update(
                PYTHONPATH=str(ROOT),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                GROUP_RANK=str(host),
                GROUP_WORLD_SIZE="2",
                WORLD_SIZE="4",
                LOCAL_WORLD_SIZE="2",
                LOCAL_RANK=str(local),
                RANK=str(host * 2 + local),
                TORCHELASTIC_RUN_ID=name,
                RDMASCHED_HOST=f"host{host}",  # two "hosts" on this machine
                RDMASCHED_TRANSPORT="shm",
                RDMASCHED_PORT=str(free_port()),
                RANKS_SPAWN="1",  # local rank 0 starts its host's daemon
                RANKS_TASKS="2",
                RANKS_STEPS="3",
            )
            envs.append(env)
    try:
        got = results(ranks(envs), timeout_s=600)
    finally:
        del store
    for r in got:
        assert r["nodes"] == [0, 1], r  # both hosts in every daemon's cluster
        assert r["node"] == r["rank"] // 2 and r["name"] == f"host{r['rank'] // 2}"
        assert r["syncs"] == [0, 1, 2, 3]
        assert r["done"] == sorted(r["rank"] * 1000 + i for i in range(2))
        assert r["rejected"] == {} and r["handler_errors"] == {}
        for ev in r["seen"]:
            if ev[0] == "start" and ev[2] == r["node"]:
                assert ev[1] // 1000 == r["rank"], ev  # own host's tasks: this rank's own
    # the daemons exit once their ranks have left (--exit-when-idle), leaving nothing
    from rdmasched.transport import shm

    wait_for(
        lambda: not [s for s in shm.list_segments() if name in s],
        what="the daemons to exit and remove their segments",
    )


@pytest.mark.slow
def test_slurm_two_hosts_on_shm_daemons_and_ranks() -> None:
    """The tier-3 two-VM run's launch (tests/tier3/test_two_hosts.py) on this machine: two
    `rdmasched daemon`s and two ranks each from Slurm's variables, over shm."""
    job = f"{os.getpid()}{uuid.uuid4().hex[:4]}"
    hosts = [f"sh{job}a", f"sh{job}b"]
    cmd = "import sys; from rdmasched.cli import main; sys.exit(main(sys.argv[1:]))"

    def env(host: int, local: int) -> dict[str, str]:
        e = dict(os.environ)
        for var in ("MASTER_ADDR", "GROUP_RANK", "NODE_RANK", "LOCAL_RANK", "RDMASCHED_HOST"):
            e.pop(var, None)
        e.update(
            PYTHONPATH=str(ROOT),
            SLURM_JOB_ID=job,
            SLURM_JOB_NODELIST=",".join(hosts),
            SLURM_NODEID=str(host),
            SLURM_NTASKS_PER_NODE="2",
            SLURM_LOCALID=str(local),
            SLURM_PROCID=str(host * 2 + local),
            RDMASCHED_TRANSPORT="shm",
            RANKS_TASKS="2",
            RANKS_STEPS="2",
        )
        return e

    daemons = [
        subprocess.Popen(
            [PY, "-c", cmd, "daemon"], env=env(h, 0), stdout=subprocess.PIPE, text=True
        )
        for h in (0, 1)
    ]
    try:
        for h, d in enumerate(daemons):
            assert d.stdout is not None
            line = d.stdout.readline()
            assert f"node {h} ({hosts[h]})" in line and f"at job{job}.{hosts[h]}" in line, line
        got = results(ranks([env(h, k) for h in (0, 1) for k in (0, 1)]))
        for r in got:
            h = r["rank"] // 2
            assert (r["node"], r["name"], r["nodes"]) == (h, hosts[h], [0, 1])
            assert r["syncs"] == [0, 1, 2]
            assert r["done"] == sorted(r["rank"] * 1000 + i for i in range(2))
            assert r["rejected"] == {} and r["handler_errors"] == {}
        for d in daemons:
            d.send_signal(signal.SIGTERM)
            assert d.wait(60) == 0
    finally:
        for d in daemons:
            if d.poll() is None:
                d.kill()
                d.wait()


@pytest.mark.slow
def test_real_torchrun_two_agents_as_two_hosts() -> None:
    """torchrun itself: two agents (--nnodes 2, c10d rendezvous), two "hosts" on this
    machine by RDMASCHED_HOST, two ranks each; each host's local rank 0 starts its daemon,
    and the daemons meet in the agents' rendezvous store at MASTER_ADDR:MASTER_PORT."""
    pytest.importorskip("torch.distributed.run")
    port = free_port()
    job = f"trr{os.getpid()}-{uuid.uuid4().hex[:6]}"
    procs = []
    for host in (0, 1):
        env = dict(os.environ)
        for var in ("SLURM_JOB_NODELIST", "SLURM_NODEID", "RDMASCHED_SLOTS", "LOCAL_RANK"):
            env.pop(var, None)
        env.update(
            PYTHONPATH=str(ROOT),
            RDMASCHED_HOST=f"{job}h{host}",
            RDMASCHED_CLUSTER=job,
            RDMASCHED_TRANSPORT="shm",
            RANKS_SPAWN="1",
            RANKS_TASKS="2",
            RANKS_STEPS="2",
        )
        cmd = [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2"]
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        cmd += ["--rdzv-id", job, "-m", "tests.ranks"]
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    got = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
        got += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in got) == [0, 1, 2, 3]
    # which agent became group rank 0 is the rendezvous' choice: each host one node id
    assert len({(r["node"], r["name"]) for r in got}) == 2
    for r in got:
        assert r["nodes"] == [0, 1] and r["name"] in (f"{job}h0", f"{job}h1"), r
        assert r["syncs"] == [0, 1, 2]
        assert r["done"] == sorted(r["rank"] * 1000 + i for i in range(2))
        assert r["rejected"] == {} and r["handler_errors"] == {}
    from rdmasched.transport import shm

    wait_for(
        lambda: not [s for s in shm.list_segments() if job in s],
        what="the daemons to exit and remove their segments",
    )


def test_killed_client_tasks_placed_on_another_host_are_cancelled_there() -> None:
    """A rank's task that its daemon placed on another host is cancelled there too when
    the rank dies (PREEMPT(cancel) to the holder)."""
    cfg = ClusterConfig.from_dict(
        {
            "cluster": {"name": f"c{os.getpid()}-{uuid.uuid4().hex[:6]}"},
            "node": [{"name": "h0", "slots": 1}, {"name": "h1", "slots": 1}],
        }
    )
    nodes = [Node(cfg, i, spin_us=50) for i in (0, 1)]
    opened = [threading.Thread(target=n.open) for n in nodes]  # each waits for the other
    for t in opened:
        t.start()
    for t in opened:
        t.join(60)
    for n in nodes:
        n.start()
    try:
        hub = ClientHub(nodes[0], max_clients=1).open()
        p = subprocess.Popen(
            [PY, "-m", "tests.ranks"],
            cwd=ROOT,
            env=rank_env(nodes[0], 0, RANKS_TASKS="2", RANKS_HOLD="1"),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        # one task runs on h0, the other was placed on h1 (h0's one slot is busy)
        wait_for(lambda: nodes[1].stats()["scheduler"]["running"] == 1, what="a task on h1")
        p.kill()
        p.wait()
        wait_for(lambda: hub.stats()["clients_dead"] == 1, what="h0 to notice")
        wait_for(lambda: nodes[1].stats()["scheduler"]["running"] == 0, what="h1 to cancel it")
        nodes[0].flush()
        assert hub.stats()["cancelled"] == 2
        s = nodes[0].stats()
        assert s["scheduler"]["running"] == 0 and s["held_by_peers"] == 0
    finally:
        for n in nodes:
            n.stop()


def test_call_later_runs_on_the_reader_thread_as_on_a_node(daemon: tuple[Node, ClientHub]) -> None:
    """Code written for a Node (`call_later` to finish simulated work) runs on a client."""
    node, hub = daemon
    done: list[int] = []
    with Client(hub.endpoint, 0) as c:

        @c.on_dispatch
        def start(task: Any, slot: int) -> None:
            c.call_later(2_000_000, lambda: (c.complete(task.id), done.append(task.id)))

        c.call_later(1_000, lambda: 1 / 0)  # counted, the client goes on
        for i in range(4):
            c.submit(i, priority=5)
        assert c.wait_for(lambda: len(done) == 4, 60)
        c.flush()
        assert sorted(done) == [0, 1, 2, 3] and c.handler_errors == {"call_later": 1}
        assert node.stats()["scheduler"]["running"] == 0
        with pytest.raises(ArgumentError):
            c.call_later(-1, lambda: None)
