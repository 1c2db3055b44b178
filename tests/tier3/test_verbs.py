"""The verbs transport on a real device: faults, reconnects, two processes (tier 3, in the VM).

Every wait is bounded: a test that finds the transport hanging fails on its own deadline.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from rdmasched import Kind
from rdmasched.errors import ConfigError, DeviceError, LaneFullError, PeerDeadError
from rdmasched.transport import verbs
from tests.tier3.verbs_pairs import TOKEN, connect_pair

ctx = mp.get_context("fork")


def wait_exit(p: Any, timeout: float = 60) -> int:
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        raise AssertionError("child did not finish")
    return int(p.exitcode)


def recv_ids(rx: Any, n: int, timeout_s: float = 30.0) -> list[int]:
    out: list[int] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        m = rx.poll(10_000)
        if m is not None:
            out.append(m.id)
        assert time.monotonic() < deadline, f"got {len(out)} of {n}"
    return out


# ---- device errors ---------------------------------------------------------------------------
def test_missing_device_names_the_setup_script(device: Any) -> None:
    with pytest.raises(DeviceError, match=r"soft-roce-setup\.sh"):
        verbs.Device("no-such-rdma-device")


def test_empty_gid_index_is_a_config_error(device: Any) -> None:
    with pytest.raises(ConfigError, match=r"GID index 200 .* is empty or does not exist"):
        verbs.Device(device.name, gid_index=200)


def test_default_gid_is_roce_v2_ipv4(device: Any) -> None:
    assert device.state == "ACTIVE"
    if device.link_layer == "Ethernet":
        assert device.gid.type == "RoCE v2" and device.gid.ipv4 is not None


def test_inactive_port_names_the_setup_script(device: Any) -> None:
    netdev = os.environ.get("RDMASCHED_NETDEV")
    if not netdev or os.environ.get("RDMASCHED_IN_VM") != "1":
        pytest.skip("takes the netdev down: only inside the test VM (RDMASCHED_NETDEV)")
    name = device.name
    subprocess.run(["ip", "link", "set", netdev, "down"], check=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                verbs.Device(name).close()
            except DeviceError as exc:
                assert "not ACTIVE" in str(exc) and "soft-roce-setup.sh" in str(exc)
                break
            assert time.monotonic() < deadline, "port stayed ACTIVE with its netdev down"
            time.sleep(0.1)
    finally:
        subprocess.run(["ip", "link", "set", netdev, "up"], check=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                verbs.Device(name).close()
                break
            except DeviceError:
                assert time.monotonic() < deadline, "port did not come back ACTIVE"
                time.sleep(0.2)


# ---- memlock -----------------------------------------------------------------------------------
_MEMLOCK_CHILD = r"""
import ctypes, resource, sys, threading
from rdmasched.transport import verbs
from rdmasched.errors import DeviceError
# Root has CAP_IPC_LOCK, which exempts it from RLIMIT_MEMLOCK: drop it (capget/capset).
libc = ctypes.CDLL(None, use_errno=True)
class Hdr(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]
hdr, data = Hdr(0x20080522, 0), (Data * 2)()
assert libc.syscall(125, ctypes.byref(hdr), data) == 0
data[0].effective &= ~(1 << 14); data[0].permitted &= ~(1 << 14)
assert libc.syscall(126, ctypes.byref(hdr), data) == 0
resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))
dev, gid = sys.argv[1], int(sys.argv[2])
a = verbs.Endpoint(dev, 1, token="memlock-test-token", gid_index=gid, nslots=1 << 15)
b = verbs.Endpoint(dev, 2, token="memlock-test-token", gid_index=gid, nslots=1 << 15)
from tests.tier3.verbs_pairs import connect_pair
try:
    connect_pair(a, b, timeout_s=10)
except DeviceError as exc:
    print("DEVICE-ERROR:", exc)
    sys.exit(3)
finally:
    a.close(); b.close()
print("registered beyond the limit?")
"""


def test_registration_beyond_memlock_says_which_limit(device_args: Any) -> None:
    dev, gid = device_args
    r = subprocess.run(
        [sys.executable, "-c", _MEMLOCK_CHILD, dev, str(gid)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert "RLIMIT_MEMLOCK" in r.stdout and "ulimit -l" in r.stdout
    assert "64 KiB soft" in r.stdout


# ---- peers that go away ------------------------------------------------------------------------
def _peer(
    dev: str, gid: int, port: int, node: int, first: int, n: int, mode: str, ready: Any
) -> None:
    """Connect to the parent, send ids first..first+n-1, then `mode`: hang (to be killed),
    close, or exit without closing."""
    ep = verbs.Endpoint(dev, node, token=TOKEN, gid_index=gid, nslots=256)
    conn = ep.connect("127.0.0.1", port, timeout_s=20)
    for i in range(first, first + n):
        conn.tx.send(
            Kind.DISPATCH, i, meta={"i": i} if i % 10 == 0 else None, timeout_us=20_000_000
        )
    # Wait until the writes completed (they are in the parent's memory) before going away.
    deadline = time.monotonic() + 20
    while conn.tx.vstats()["retired"] < conn.tx.vstats()["posted"] - 64:
        conn.qp.poll()
        assert time.monotonic() < deadline
        time.sleep(0.001)
    time.sleep(0.2)
    ready.set()
    if mode == "close":
        conn.close()
        ep.close()
    elif mode == "hang":
        time.sleep(120)
    os._exit(0)


def _accept_in_thread(ep: Any, timeout_s: float = 30) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["conn"] = ep.accept(timeout_s)
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("how", ["killed", "closed"])
def test_peer_that_disappears_mid_stream(device: Any, device_args: Any, how: str) -> None:
    dev, gid = device_args
    with verbs.Endpoint(device, 1, token=TOKEN, nslots=256) as ep:
        lst = ep.listen("127.0.0.1", 0)
        t, out = _accept_in_thread(ep)
        ready = ctx.Event()
        p = ctx.Process(
            target=_peer,
            args=(dev, gid, lst.port, 5, 0, 50, "hang" if how == "killed" else "close", ready),
        )
        p.start()
        t.join(40)
        conn = out["conn"]
        assert ready.wait(40)
        if how == "killed":
            p.kill()
        wait_exit(p)
        # Everything that landed is delivered, then the lane reports the peer gone.
        assert recv_ids(conn.rx, 50) == list(range(50))
        t0 = time.monotonic()
        with pytest.raises(PeerDeadError, match="node 5") as ei:
            while time.monotonic() - t0 < 30:
                conn.rx.poll(100_000)
        assert time.monotonic() - t0 < 30
        print("receiver:", ei.value)
        # The sender side: sends fail with PeerDeadError (not a hang, not 'lane full').
        t0 = time.monotonic()
        with pytest.raises(PeerDeadError) as es:
            for i in range(100_000):
                conn.tx.send(Kind.DISPATCH, i, timeout_us=20_000_000)
        assert time.monotonic() - t0 < 30
        print("sender:", es.value)
        assert conn.rx.dead_code != 0
        if how == "killed":
            assert conn.tx.dead_code != 0 and "retry" in str(es.value)
        else:
            assert "closed the connection" in str(es.value)


def test_full_lane_to_a_dead_peer_is_peer_dead_not_lane_full(device: Any, device_args: Any) -> None:
    dev, gid = device_args
    with verbs.Endpoint(device, 1, token=TOKEN, nslots=256) as ep:
        lst = ep.listen("127.0.0.1", 0)
        t, out = _accept_in_thread(ep)
        ready = ctx.Event()
        p = ctx.Process(target=_peer, args=(dev, gid, lst.port, 5, 0, 1, "hang", ready))
        p.start()
        t.join(40)
        conn = out["conn"]
        assert ready.wait(40)
        for i in range(conn.tx.nslots):  # fill the peer's lane while it lives
            conn.tx.send(Kind.DISPATCH, i)
        with pytest.raises(LaneFullError):
            conn.tx.send(Kind.DISPATCH, 0, timeout_us=10_000)
        p.kill()
        wait_exit(p)
        t0 = time.monotonic()
        with pytest.raises(PeerDeadError, match="node 5"):
            conn.tx.send(Kind.DISPATCH, 1, timeout_us=30_000_000)
        assert time.monotonic() - t0 < 30


# ---- a sender that comes back ------------------------------------------------------------------
@pytest.mark.parametrize("how", ["closed", "killed"])
def test_reconnecting_sender_gets_a_new_epoch_after_the_old_is_drained(
    device: Any, device_args: Any, how: str
) -> None:
    dev, gid = device_args
    with verbs.Endpoint(device, 1, token=TOKEN, nslots=256) as ep:
        lst = ep.listen("127.0.0.1", 0)
        t, out = _accept_in_thread(ep)
        ready = ctx.Event()
        p = ctx.Process(
            target=_peer,
            args=(dev, gid, lst.port, 5, 0, 100, "close" if how == "closed" else "hang", ready),
        )
        p.start()
        t.join(40)
        first = out["conn"]
        rx = first.rx
        assert ready.wait(40) and rx.epoch == 1
        if how == "killed":
            p.kill()
        wait_exit(p)
        # Nothing polled yet: the 100 old messages wait in the ring while the new sender
        # (same node id) connects, and its first send waits until they are drained.
        t, out = _accept_in_thread(ep)
        ready2 = ctx.Event()
        p2 = ctx.Process(target=_peer, args=(dev, gid, lst.port, 5, 100, 100, "close", ready2))
        p2.start()
        t.join(40)
        second = out["conn"]
        assert second.rx is rx, "the inbound lane outlives the connection"
        got: list[int] = []
        deadline = time.monotonic() + 60
        while len(got) < 200:
            try:
                m = rx.poll(10_000)
            except PeerDeadError:
                m = None  # between incarnations: tolerated, the lane revives
            if m is not None:
                got.append(m.id)
                if m.id % 10 == 0:
                    assert m.meta == {"i": m.id}
            assert time.monotonic() < deadline, f"got {len(got)} of 200"
        assert got == list(range(200))
        assert rx.epoch == 2
        assert rx.stats()["stale_epoch"] == 0
        assert wait_exit(p2) == 0
        assert first.tx.dead_code != 0  # the lane to the old incarnation is dead
        with pytest.raises(PeerDeadError, match=r"reconnected|gone"):
            first.tx.send(Kind.DISPATCH, 1)


# ---- two processes, both ways ---------------------------------------------------------------
def _echo_node(dev: str, gid: int, port: int, n: int) -> None:
    with verbs.Endpoint(dev, 2, token=TOKEN, gid_index=gid, nslots=64) as ep:
        conn = ep.connect("127.0.0.1", port, timeout_s=20)
        got = 0
        while got < n:
            m = conn.rx.poll(20_000_000)
            if m is None:
                os._exit(4)
            conn.tx.send(m.kind, m.id, m.job, m.priority, meta=m.meta, timeout_us=20_000_000)
            got += 1
        # Let the last echoes land before the connection goes away.
        time.sleep(0.5)
        conn.close()


def test_two_processes_echo_in_order_with_metadata(device: Any, device_args: Any) -> None:
    dev, gid = device_args
    n = 5000
    with verbs.Endpoint(device, 1, token=TOKEN, nslots=64) as ep:
        lst = ep.listen("127.0.0.1", 0)
        t, out = _accept_in_thread(ep)
        p = ctx.Process(target=_echo_node, args=(dev, gid, lst.port, n))
        p.start()
        t.join(40)
        conn = out["conn"]
        sent = recvd = 0
        deadline = time.monotonic() + 120
        while recvd < n:
            while sent < n and sent - recvd < 48:
                conn.tx.send(
                    Kind.DISPATCH,
                    sent,
                    sent * 3,
                    sent % 256,
                    meta={"k": sent, "pad": "x" * (sent % 70)} if sent % 5 == 0 else None,
                )
                sent += 1
            m = conn.rx.poll(100_000)
            if m is not None:
                assert (m.id, m.job, m.priority) == (recvd, recvd * 3, recvd % 256)
                if recvd % 5 == 0:
                    assert m.meta == {"k": recvd, "pad": "x" * (recvd % 70)}
                recvd += 1
            assert time.monotonic() < deadline, f"{recvd} of {n}"
        assert wait_exit(p) == 0
        s = conn.tx.vstats()
        assert s["signalled"] <= s["posted"] // s["signal_every"] + 2  # selective signalling
        assert conn.rx.stats()["gaps"] == 0


def test_resources_close_in_order_and_twice(device: Any) -> None:
    a = verbs.Endpoint(device, 1, token=TOKEN)
    b = verbs.Endpoint(device, 2, token=TOKEN)
    ca, cb = connect_pair(a, b)
    ca.tx.send(Kind.DISPATCH, 1)
    assert recv_ids(cb.rx, 1) == [1]
    ca.close()
    ca.close()
    b.close()
    b.close()
    a.close()
    assert a.closed and b.closed and ca.closed and cb.closed


def test_a_verbs_parent_closes_its_children_first(device: Any) -> None:
    # The teardown order is the handles' own: closing the context first closes its PD
    # (the QP, then the MRs) and the completion channel, instead of failing with EBUSY.
    from rdmasched import _verbs

    access = 1 | 2 | 4  # IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ
    ctx = _verbs.DeviceContext(device.name)
    pd = _verbs.ProtectionDomain(ctx)
    chan = _verbs.CompletionChannel(ctx)
    ctl = pd.register(_verbs.CTL_BYTES, access)
    ring = pd.register(4096, access)
    qp = _verbs.QueuePair(pd, ctl, device.port, channel=chan)
    qp.modify_init()
    assert qp.query_state() == "INIT"
    del pd, chan  # a child keeps its parents: the QP still works
    assert qp.qpn > 0 and not ctx.closed
    ctx.close()
    assert qp.closed and qp.query_state() == "DESTROYED"
    assert ctl.closed and ring.closed and ctx.closed
    ctx.close()  # safe twice
    qp.close()
    with _verbs.DeviceContext(device.name) as ctx2, _verbs.ProtectionDomain(ctx2) as pd2:
        mr = pd2.register(4096, access)
    assert mr.closed and pd2.closed and ctx2.closed


def test_endpoint_collected_open_warns(device: Any) -> None:
    import gc

    a = verbs.Endpoint(device, 1, token=TOKEN)
    with pytest.warns(ResourceWarning, match="not closed"):
        del a
        gc.collect()


def test_doctor_finds_the_active_port(device: Any) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "rdmasched.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["usable"] is True
    ports = [p for d in rep["devices"] for p in d["ports"] if d["name"] == device.name]
    assert any(p["state"] == "ACTIVE" for p in ports)
    gids = [g for p in ports for g in p["gids"]]
    assert any(g["type"] == "RoCE v2" and g["ipv4"] for g in gids)
