"""Two hosts for real: two VMs (two kernels), an rxe device each on a virtual wire.

Runs only inside `tests/vm/run-in-vm.sh --hosts 2` (env RDMASCHED_VM_ROLE=a|b,
RDMASCHED_PEER_IP, RDMASCHED_SELF_IP): node a listens, node b connects through the bootstrap
over the wire, and each sends N messages to the other while receiving; both check that
every message arrived, in order, once. Then one daemon per host (`rdmasched daemon`, over
verbs) with two client ranks each (tests/ranks.py), all launched from Slurm's variables:
the ranks of both hosts sync four steps, each rank's tasks run and complete, and each
rank hears only of its own tasks among those of its host. And the lanes' class of service
(`[verbs] dscp`): the RoCE v2 packets (UDP 4791) of a connection, captured on the wire
(eth0) both ways, carry the configured DSCP, the default's and another. Elsewhere it is
skipped.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Any

import pytest

from rdmasched import Kind
from rdmasched.errors import LaneFullError
from rdmasched.limits import DSCP_DEFAULT
from rdmasched.transport import verbs

ROLE = os.environ.get("RDMASCHED_VM_ROLE")
PEER = os.environ.get("RDMASCHED_PEER_IP")
SELF = os.environ.get("RDMASCHED_SELF_IP")
PORT = 18600
N = int(os.environ.get("RDMASCHED_TWO_HOSTS_N", "10000"))
TOKEN = "two-hosts-test-token"
#: the tier's patience with a silent peer, 10 s, as the daemons' (RDMASCHED_DEAD_AFTER_MS
#: below) and the hot ping's: a VM of this tier is at times not run for seconds on a busy
#: host (guest-stalls.py measured 3.6 s), past Endpoint's default retry budget of 0.5 s;
#: a longer stall voids a failed run (tests/vm/README.md)
PATIENCE_MS = 10_000
QP_TIMEOUT = verbs.qp_timeout_for(PATIENCE_MS)

pytestmark = pytest.mark.skipif(
    ROLE not in ("a", "b") or not PEER or not SELF,
    reason="two-VM test: runs inside tests/vm/run-in-vm.sh --hosts 2 "
    "(RDMASCHED_VM_ROLE, RDMASCHED_PEER_IP, RDMASCHED_SELF_IP)",
)


def exchange(conn: Any, me: int, n: int, timeout_s: float) -> tuple[int, int]:
    """Send ids 0..n-1 (arg0 = my node) while receiving the peer's; check order; counts."""
    sent = recvd = 0
    deadline = time.monotonic() + timeout_s
    while sent < n or recvd < n:
        if sent < n:
            try:
                conn.tx.send(
                    Kind.DISPATCH,
                    sent,
                    arg0=me,
                    meta={"from": me, "i": sent} if sent % 100 == 0 else None,
                    timeout_us=1000,
                )
                sent += 1
            except LaneFullError:
                pass  # the peer has not consumed yet: receive meanwhile
        # Stop at n: once the peer has all of ours it closes, and a drained lane whose
        # peer closed raises PeerDeadError (as it should) on the next poll.
        while recvd < n and (m := conn.rx.poll(0 if sent < n else 50_000)) is not None:
            assert m.id == recvd and m.seq == recvd, f"expected {recvd}, got {m.id}"
            assert m.arg0 != me and m.src == conn.peer_node
            if recvd % 100 == 0:
                assert m.meta == {"from": m.arg0, "i": recvd}
            recvd += 1
        assert time.monotonic() < deadline, f"sent {sent}, received {recvd} of {n}"
    return sent, recvd


def test_two_nodes_exchange_both_ways_over_the_wire() -> None:
    dev = os.environ.get("RDMASCHED_DEVICE")
    gid = os.environ.get("RDMASCHED_GID_INDEX")
    me = 1 if ROLE == "a" else 2
    with verbs.Endpoint(
        dev,
        me,
        token=TOKEN,
        gid_index=int(gid) if gid else None,
        nslots=256,
        bootstrap_timeout_s=60,
        qp_timeout=QP_TIMEOUT,
    ) as ep:
        if ROLE == "a":
            ep.listen(SELF or "0.0.0.0", PORT)
            conn = ep.accept(120)
        else:
            assert PEER is not None
            conn = ep.connect(PEER, PORT, attempts=120, connect_timeout_s=1)
        assert conn.peer_node == (2 if me == 1 else 1)
        t0 = time.monotonic()
        sent, recvd = exchange(conn, me, N, timeout_s=600)
        took = time.monotonic() - t0
        assert (sent, recvd) == (N, N)
        assert conn.rx.stats()["gaps"] == 0 and conn.rx.stats()["bad_crc"] == 0
        print(f"node {me}: {N} each way in {took:.1f} s; tx {conn.tx.vstats()}")
        conn.close()


# ---- one daemon per host, two client ranks each, launched from Slurm's variables -------------
def slurm_env(local: int) -> dict[str, str]:
    """What srun gives a task of a 2-node, 2-tasks-per-node job (the VMs' addresses as the
    node names, so that they resolve), plus the rdmasched settings of the job."""
    assert SELF and PEER
    me = 0 if ROLE == "a" else 1
    hosts = [SELF, PEER] if me == 0 else [PEER, SELF]
    env = dict(os.environ)
    for var in ("MASTER_ADDR", "GROUP_RANK", "NODE_RANK", "LOCAL_RANK", "RDMASCHED_HOST"):
        env.pop(var, None)
    env.update(
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST=",".join(hosts),
        SLURM_NODEID=str(me),
        SLURM_NTASKS_PER_NODE="2",
        SLURM_LOCALID=str(local),
        SLURM_PROCID=str(me * 2 + local),
        RDMASCHED_TOKEN=TOKEN,
        RDMASCHED_PORT="18700",
        # a TCG VM with one vCPU runs four processes here: generous liveness settings
        RDMASCHED_HEARTBEAT_MS="200",
        RDMASCHED_DEAD_AFTER_MS=str(PATIENCE_MS),
        RANKS_TASKS="2",
        RANKS_STEPS="3",
    )
    return env


def test_two_daemons_with_two_client_ranks_each_over_verbs() -> None:
    import json
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    me = 0 if ROLE == "a" else 1
    cmd = "import sys; from rdmasched.cli import main; sys.exit(main(sys.argv[1:]))"
    daemon = subprocess.Popen(  # as `srun --ntasks-per-node=1 rdmasched daemon` would
        [sys.executable, "-c", cmd, "daemon"],
        cwd=root,
        env=slurm_env(0),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.stdout is not None
        line = daemon.stdout.readline()
        assert f"node {me} ({SELF})" in line and "2 nodes" in line, line
        ranks = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.ranks"],
                cwd=root,
                env=slurm_env(local),
                stdout=subprocess.PIPE,
                text=True,
            )
            for local in (0, 1)
        ]
        got = []
        for p in ranks:
            out, _ = p.communicate(timeout=600)
            assert p.returncode == 0, out
            got.append(json.loads(out.strip().splitlines()[-1]))
        for r in got:
            assert r["node"] == me and r["name"] == SELF and r["nodes"] == [0, 1]
            assert r["syncs"] == [0, 1, 2, 3]  # every step released on both hosts
            assert r["done"] == sorted(r["rank"] * 1000 + i for i in range(2))
            assert r["rejected"] == {} and r["handler_errors"] == {}
            for ev in r["seen"]:
                if ev[0] in ("start", "preempt") and ev[2] == me:
                    assert ev[1] // 1000 == r["rank"], ev  # this host's: the rank's own
        print(f"host {me}: {got}")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


# ---- the lanes' class of service, seen on the wire -----------------------------------------
ROCE_V2_PORT = 4791
ETH_P_ALL = 0x0003  # a socket for one protocol gets only what arrives; ETH_P_ALL also what leaves
ETH_P_IP = 0x0800
PACKET_OUTGOING = 4
SO_RCVBUFFORCE = 33
SOL_PACKET, PACKET_STATISTICS = 263, 6


class RoceCapture:
    """Every IPv4 RoCE v2 packet (UDP to port 4791) that crosses `netdev` either way, as
    (outgoing, TOS byte, BTH destination QP), from an AF_PACKET socket (root; no tcpdump)."""

    def __init__(self, netdev: str) -> None:
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
        # past net.core.rmem_max (root): a one-vCPU guest runs this thread between the
        # exchange's polls, and a packet that finds the buffer full is lost to the capture
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
        self.sock.bind((netdev, ETH_P_ALL))
        self.sock.settimeout(0.1)
        self.packets: list[tuple[bool, int, int]] = []
        self.seen = self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="roce-capture", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Until stopped and the kernel's queue is empty (a read that waited 0.1 s for
        # nothing): a one-vCPU guest runs this thread behind the exchange, and a stop that
        # left the queue unread saw 41 of the 300-odd packets each way of a run.
        while True:
            try:
                data, addr = self.sock.recvfrom(65535)
            except TimeoutError:
                if self._stop.is_set():
                    return
                continue
            got = parse_roce_v2(data) if addr[1] == ETH_P_IP else None
            if got is not None:
                self.packets.append((addr[2] == PACKET_OUTGOING, *got))

    def stop(self) -> list[tuple[bool, int, int]]:
        self._stop.set()
        self._thread.join(5)
        # struct tpacket_stats: packets, drops (those the buffer had no room for), since open
        self.seen, self.dropped = struct.unpack(
            "II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        )
        self.sock.close()
        return self.packets


def parse_roce_v2(ip: bytes) -> tuple[int, int] | None:
    """(TOS byte, destination QP) of an IPv4 packet that is RoCE v2, else None."""
    if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != socket.IPPROTO_UDP:
        return None
    ihl = (ip[0] & 0xF) * 4
    udp = ip[ihl : ihl + 8]
    if len(udp) < 8 or struct.unpack("!H", udp[2:4])[0] != ROCE_V2_PORT:
        return None
    bth = ip[ihl + 8 : ihl + 20]  # the base transport header: opcode .. dest QP (24 bits)
    if len(bth) < 12:
        return None
    return ip[1], int.from_bytes(bth[5:8], "big")


@pytest.mark.parametrize("dscp", [None, 10], ids=["default", "dscp10"])
def test_the_lanes_packets_carry_the_configured_dscp(dscp: int | None) -> None:
    """Both hosts configure the same class; every RoCE v2 packet of the connection, the
    WRITEs out and the peer's (its WRITEs and ACKs) in, carries it: TOS = DSCP << 2."""
    dev = os.environ.get("RDMASCHED_DEVICE")
    gid = os.environ.get("RDMASCHED_GID_INDEX")
    netdev = os.environ.get("RDMASCHED_NETDEV", "eth0")
    want = DSCP_DEFAULT if dscp is None else dscp
    me = 1 if ROLE == "a" else 2
    port = PORT + 1 + (0 if dscp is None else 1)
    cls: dict[str, int] = {} if dscp is None else {"dscp": dscp}
    cap = RoceCapture(netdev)
    try:
        with verbs.Endpoint(
            dev,
            me,
            token=TOKEN,
            gid_index=int(gid) if gid else None,
            nslots=64,
            bootstrap_timeout_s=60,
            qp_timeout=QP_TIMEOUT,
            **cls,
        ) as ep:
            if ROLE == "a":
                ep.listen(SELF or "0.0.0.0", port)
                conn = ep.accept(120)
            else:
                assert PEER is not None
                conn = ep.connect(PEER, port, attempts=120, connect_timeout_s=1)
            assert ep.dscp == want
            exchange(conn, me, 300, timeout_s=300)
            mine, theirs = conn.qp.qpn, conn.remote.qpn
            conn.close()
    finally:
        packets = cap.stop()
    out = [tos for outgoing, tos, qp in packets if outgoing and qp == theirs]
    into = [tos for outgoing, tos, qp in packets if not outgoing and qp == mine]
    print(
        f"node {me}: dscp {want}: {len(out)} packets out, {len(into)} in; TOS seen "
        f"out {sorted(set(out))}, in {sorted(set(into))}"
    )
    assert cap.dropped == 0, f"the capture missed {cap.dropped} of {cap.seen} packets"
    # every message is at least one WRITE (docs/VERBS.md, the data path): 300 out, and the
    # peer's 300 in (its ACKs besides, one for several of our WRITEs)
    assert len(out) >= 300 and len(into) >= 300, (len(out), len(into), len(packets))
    assert set(out) == {want << 2} and set(into) == {want << 2}
