"""Two hosts for real: two VMs (two kernels), an rxe device each on a virtual wire.

Runs only inside `tests/vm/run-in-vm.sh --hosts 2` (env RDMASCHED_VM_ROLE=a|b,
RDMASCHED_PEER_IP, RDMASCHED_SELF_IP): node a listens, node b connects through the bootstrap
over the wire, and each sends N messages to the other while receiving; both check that
every message arrived, in order, once. Elsewhere it is skipped.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from rdmasched import Kind
from rdmasched.errors import LaneFullError
from rdmasched.transport import verbs

ROLE = os.environ.get("RDMASCHED_VM_ROLE")
PEER = os.environ.get("RDMASCHED_PEER_IP")
SELF = os.environ.get("RDMASCHED_SELF_IP")
PORT = 18600
N = int(os.environ.get("RDMASCHED_TWO_HOSTS_N", "10000"))
TOKEN = "two-hosts-test-token"

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
