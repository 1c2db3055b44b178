"""shm lanes between processes: volume, back-pressure, crashes, restarts, many senders."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from rdmasched import Batch, Kind, LaneSet
from rdmasched.errors import LaneBusyError, LaneFullError, PeerDeadError
from rdmasched.transport import shm

Names = Callable[[str], str]
ctx = mp.get_context("fork")


def spawn(fn: Callable[..., Any], *args: Any) -> mp.process.BaseProcess:
    p = ctx.Process(target=fn, args=args, daemon=True)
    p.start()
    return p


def attach_when_ready(name: str, src: int = 0, timeout_s: float = 10) -> shm.ShmTxLane:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return shm.attach_lane(name, src=src, timeout_us=20_000_000)
        except PeerDeadError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)


def wait_exit(p: mp.process.BaseProcess, timeout: float = 60) -> int:
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        raise AssertionError("child did not finish")
    assert p.exitcode is not None
    return p.exitcode


# ---- one lane, a million messages -----------------------------------------------------------
def _send_range(name: str, start: int, n: int, meta_every: int) -> None:
    with attach_when_ready(name, src=1) as tx:
        for i in range(start, start + n):
            if meta_every and i % meta_every == 0:
                tx.send(Kind.DISPATCH, i, meta={"i": i, "pad": "p" * (i % 97)})
            else:
                tx.send(Kind.DISPATCH, i)


@pytest.mark.slow
def test_million_messages_in_order_with_random_consumer_pauses(lane_name: Names) -> None:
    n = 1_000_000
    rng = random.Random(1234)
    with shm.create_lane(lane_name(), 64) as rx:
        p = spawn(_send_range, lane_name(), 0, n, 997)
        expect = 0
        deadline = time.monotonic() + 120
        while expect < n:
            m = rx.poll(1_000_000)
            if m is None:
                assert time.monotonic() < deadline, f"stuck at {expect}"
                continue
            assert m.id == expect and m.seq == expect
            if expect % 997 == 0:
                assert m.meta == {"i": expect, "pad": "p" * (expect % 97)}
            expect += 1
            r = rng.random()
            if r < 0.0002:
                time.sleep(rng.random() * 0.003)  # the consumer stalls; the lane fills
            elif r < 0.01:
                for _ in range(rng.randrange(200)):  # a short busy pause
                    pass
        assert wait_exit(p) == 0
        assert rx.poll() is None
        st = rx.stats()
        assert st["delivered"] == n
        assert (
            sum(
                st[k]
                for k in (
                    "bad_crc",
                    "malformed",
                    "stale_epoch",
                    "stale_lap",
                    "truncated",
                    "orphans",
                    "gaps",
                    "bad_meta",
                )
            )
            == 0
        )


# ---- back-pressure across processes --------------------------------------------------------
def _fill_until_full(name: str, q: Any) -> None:
    with attach_when_ready(name) as tx:
        sent = 0
        try:
            while True:
                tx.send(Kind.DISPATCH, sent, timeout_us=50_000)
                sent += 1
        except LaneFullError as exc:
            q.put((sent, str(exc)))


def test_lane_full_across_processes(lane_name: Names) -> None:
    q = ctx.Queue()
    with shm.create_lane(lane_name(), 32) as rx:
        p = spawn(_fill_until_full, lane_name(), q)
        sent, err = q.get(timeout=30)
        assert wait_exit(p) == 0
        assert sent == 32
        assert "is full" in err and "running but not consuming" in err
        got = [m.id for m in iter(lambda: rx.poll(), None)]
        assert got == list(range(32))


# ---- a sender that crashes and restarts -------------------------------------------------------
def _send_forever(name: str, ready: Any) -> None:
    with attach_when_ready(name, src=1) as tx:
        i = 0
        while True:
            tx.send(Kind.DISPATCH, 1_000_000 + i, meta={"i": i, "pad": "q" * (i % 150)})
            i += 1
            if i == 20:
                ready.set()


def test_restarted_sender_never_causes_a_stale_delivery(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 64) as rx:
        ready = ctx.Event()
        a = spawn(_send_forever, lane_name(), ready)
        assert ready.wait(30)
        first = [rx.poll(100_000) for _ in range(5)]  # read a little while it writes
        time.sleep(0.05)
        os.kill(a.pid, signal.SIGKILL)  # crash mid-stream, lane full
        a.join()
        b = spawn(_send_range, lane_name(), 2_000_000, 5, 0)  # restart: epoch 2, 5 messages
        got = [m for m in first if m is not None]
        deadline = time.monotonic() + 30
        while (
            not any(m.id >= 2_000_000 for m in got)
            or len([m for m in got if m.id >= 2_000_000]) < 5
        ):
            m = rx.poll(100_000)
            if m is not None:
                got.append(m)
            assert time.monotonic() < deadline
        for _ in range(200):  # nothing else may ever come out
            m = rx.poll(1000)
            assert m is None, f"unexpected {m}"
        assert wait_exit(b) == 0
        old = [m for m in got if m.id < 2_000_000]
        new = [m.id for m in got if m.id >= 2_000_000]
        # every message the crashed sender completed, once, in order, whole; then the new one
        assert [m.id for m in old] == [1_000_000 + i for i in range(len(old))]
        assert all(
            m.meta == {"i": m.id - 1_000_000, "pad": "q" * ((m.id - 1_000_000) % 150)} for m in old
        )
        assert len(old) >= 20
        assert new == [2_000_000 + i for i in range(5)]
        assert got.index(next(m for m in got if m.id >= 2_000_000)) == len(old)
        assert rx.epoch == 2
        st = rx.stats()
        assert st["bad_crc"] == st["malformed"] == st["truncated"] == st["orphans"] == 0


# ---- many senders, one receiver -------------------------------------------------------------
def _sender_k(name: str, k: int, n: int) -> None:
    with attach_when_ready(name, src=k) as tx:
        b = Batch(64)
        i = 0
        while i < n:
            b.clear()
            for _ in range(min(64, n - i)):
                b.append(Kind.DISPATCH, (k << 32) | i, k)
                i += 1
            tx.send_batch(b)


def test_eight_senders_into_one_receiver_lose_nothing(lane_name: Names) -> None:
    n, senders = 20_000, 8
    lanes = [shm.create_lane(lane_name(f"-{k}"), 128) for k in range(senders)]
    try:
        ls = LaneSet()
        for lane in lanes:
            ls.add(lane)
        procs = [spawn(_sender_k, lane_name(f"-{k}"), k, n) for k in range(senders)]
        nxt = [0] * senders
        b = Batch(256)
        deadline = time.monotonic() + 120
        while sum(nxt) < n * senders:
            b.clear()
            ls.wait(b, timeout_us=100_000)
            for m in b:
                k = m.lane
                assert m.id == (k << 32) | nxt[k] and m.src == k and m.job == k
                nxt[k] += 1
            assert time.monotonic() < deadline, f"stuck at {nxt}"
        for p in procs:
            assert wait_exit(p) == 0
        assert nxt == [n] * senders
    finally:
        for lane in lanes:
            lane.close()


# ---- crashes leave nothing that breaks the next start ----------------------------------------
def _create_and_die(name: str, ready: Any) -> None:
    rx = shm.create_lane(name, 16)  # held open: the kill, not a close, ends it
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)
    rx.close()  # never reached


def test_crashed_receiver_leaves_nothing_that_breaks_a_restart(
    lane_name: Names, caplog: pytest.LogCaptureFixture
) -> None:
    ready = ctx.Event()
    p = spawn(_create_and_die, lane_name(), ready)
    assert ready.wait(30)
    p.join()
    assert p.exitcode == -signal.SIGKILL
    assert shm.lane_segment_name(lane_name()) in shm.list_segments()
    with pytest.raises(PeerDeadError, match="no longer running"):
        shm.attach_lane(lane_name())  # the sender side is told plainly
    with (
        caplog.at_level("INFO", logger="rdmasched.shm"),
        shm.create_lane(lane_name(), 16) as rx,
        shm.attach_lane(lane_name()) as tx,
    ):
        tx.send(Kind.DISPATCH, 1)
        m = rx.poll()
        assert m is not None and m.id == 1
    assert "removing stale" in caplog.text


def test_remove_stale_cleans_only_dead_owners(lane_name: Names) -> None:
    ready = ctx.Event()
    p = spawn(_create_and_die, lane_name("-dead"), ready)
    assert ready.wait(30)
    p.join()
    with shm.create_lane(lane_name("-live"), 16):
        removed = shm.remove_stale()
        assert shm.lane_segment_name(lane_name("-dead")) in removed
        assert shm.lane_segment_name(lane_name("-live")) in shm.list_segments()


def _attach_and_hold(name: str, ready: Any, done: Any) -> None:
    with attach_when_ready(name):
        ready.set()
        done.wait(30)


def test_one_live_sender_per_lane(lane_name: Names) -> None:
    ready, done = ctx.Event(), ctx.Event()
    with shm.create_lane(lane_name(), 16):
        p = spawn(_attach_and_hold, lane_name(), ready, done)
        assert ready.wait(30)
        try:
            with pytest.raises(LaneBusyError, match=f"pid {p.pid}"):
                shm.attach_lane(lane_name())
        finally:
            done.set()
            wait_exit(p)


def _receive_then_die(name: str, ready: Any) -> None:
    rx = shm.create_lane(name, 16)
    ready.set()
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)
    rx.close()  # never reached


def test_sender_learns_that_the_receiver_died(lane_name: Names) -> None:
    ready = ctx.Event()
    p = spawn(_receive_then_die, lane_name(), ready)
    assert ready.wait(30)
    with attach_when_ready(lane_name()) as tx:
        p.join()
        with pytest.raises(LaneFullError, match="no longer running"):
            for i in range(17):
                tx.send(Kind.DISPATCH, i, timeout_us=20_000)
    shm.ShmSegment.unlink_name(shm.lane_segment_name(lane_name()))


# ---- issue 7 item 21: restarting a killed node ------------------------------------------------
def _node_then_die(lane: str, bell: str, ready: Any) -> None:
    b = shm.Doorbell.create(bell)
    rx = shm.create_lane(lane, 16, doorbell=b)
    ready.set()
    time.sleep(60)
    rx.close()  # never reached: killed
    b.close()


def test_a_killed_node_restarts_although_its_peers_map_its_doorbell(lane_name: Names) -> None:
    bell = lane_name("-b")[-20:]
    ready = ctx.Event()
    p = spawn(_node_then_die, lane_name(), bell, ready)
    assert ready.wait(30)
    tx = attach_when_ready(lane_name())  # a healthy peer: maps the lane and the doorbell
    try:
        p.kill()
        p.join()
        # the restarted node: its doorbell and lane were its dead predecessor's
        with (
            shm.Doorbell.create(bell) as b,
            shm.create_lane(lane_name(), 16, doorbell=b) as rx,
            shm.attach_lane(lane_name()) as tx2,
        ):
            tx2.send(Kind.DISPATCH, 7)
            m = rx.poll(timeout_us=1_000_000)
            assert m is not None and m.id == 7
            # a live owner is still refused, saying what to do
            with pytest.raises(LaneBusyError, match="already running\\? Stop that process"):
                shm.Doorbell.create(bell)
    finally:
        tx.close()


def test_a_killed_unreaped_sender_does_not_block_reattach(lane_name: Names) -> None:
    ready, done = ctx.Event(), ctx.Event()
    with shm.create_lane(lane_name(), 16) as rx:
        p = spawn(_attach_and_hold, lane_name(), ready, done)
        assert ready.wait(30)
        os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (shm._stat(p.pid) or [b"Z"])[0] != b"Z":  # killed, not reaped: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.01)
        try:
            with shm.attach_lane(lane_name(), timeout_us=20_000_000) as tx:
                assert tx.epoch == 2  # the killed sender's claim is gone: a new incarnation
                for _ in range(20_000):  # the receiver accepts epoch 2 when it polls
                    if rx.poll() is None and tx.acked:
                        break
                tx.send(Kind.DISPATCH, 5)
                got = rx.poll(timeout_us=10_000_000)
                assert got is not None and got.id == 5
        finally:
            p.join()


def _links_node(cluster: str, me: int, ready: Any, hold_s: float) -> None:
    from rdmasched.daemon.links import ShmLinks

    links = ShmLinks(cluster, me, [0, 1], connect_timeout_s=30)
    ready.set()
    time.sleep(hold_s)
    links.close()


def test_a_killed_daemon_node_comes_back_up(lane_name: Names) -> None:
    # The issue's report: node 0 killed, restarted, failed with "LaneBusyError: ...bell.0 is
    # in use by pid <node 1>" because node 1 maps node 0's doorbell to ring it.
    from rdmasched.daemon.links import ShmLinks

    cluster = lane_name("-c")
    ready = ctx.Event()
    first = spawn(_links_node, cluster, 0, ready, 60.0)
    links = ShmLinks(cluster, 1, [0, 1], connect_timeout_s=30)
    try:
        assert ready.wait(30)
        first.kill()
        first.join()
        ready2 = ctx.Event()
        again = spawn(_links_node, cluster, 0, ready2, 0.5)
        assert ready2.wait(30), "the restarted node did not come up"
        assert wait_exit(again) == 0
    finally:
        links.close()
    for seg in shm.list_segments():  # the killed node's segments were replaced, then closed
        if cluster in seg:
            shm.ShmSegment.unlink_name(seg)
