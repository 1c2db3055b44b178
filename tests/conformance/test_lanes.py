"""Transport conformance: every transport passes these same tests (fixture `pairs`).

On shm they run in one process (tier 1); on verbs inside the Soft-RoCE VM (tier 3).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from rdmasched import Batch, Kind
from rdmasched.errors import LaneClosedError, LaneFullError, MessageTooLargeError


def recv_all(rx: Any, n: int, timeout_s: float = 10.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        m = rx.poll(10_000)
        if m is not None:
            out.append(m)
        assert time.monotonic() < deadline, f"got {len(out)} of {n}"
    return out


def test_round_trip_of_every_field(pairs: Any) -> None:
    tx, rx = pairs.pair(64)
    tx.load = 321
    tx.send(
        Kind.SYNC_READY,
        2**64 - 1,
        2**32 - 1,
        255,
        0x7,
        2**40,
        3,
        2**32 - 1,
        9,
        {"step": 12, "members": [1, 2, 3], "blob": b"\x00\xff" * 40},
        dst=0xFFFFFE,
        src=0xABCDEF,
        relays=255,
    )
    tx.send(Kind.PREEMPT, 1)  # src: the lane's own node id; dst 0; relays 0
    m, own = recv_all(rx, 2)
    assert (m.src, m.dst, m.relays) == (0xABCDEF, 0xFFFFFE, 255)
    assert (own.src, own.dst, own.relays) == (tx.src, 0, 0)
    assert (m.kind, m.id, m.job, m.priority, m.flags, m.arg0, m.arg1, m.arg2, m.hops) == (
        Kind.SYNC_READY,
        2**64 - 1,
        2**32 - 1,
        255,
        0x7,
        2**40,
        3,
        2**32 - 1,
        9,
    )
    assert m.meta == {"step": 12, "members": [1, 2, 3], "blob": b"\x00\xff" * 40}
    assert (m.load, m.seq) == (321, 0)
    assert rx.peer_load == 321


def test_many_laps_in_order(pairs: Any) -> None:
    tx, rx = pairs.pair(16)
    got: list[int] = []
    for i in range(2000):
        tx.send(Kind.DISPATCH, i, meta={"i": i} if i % 7 == 0 else None, timeout_us=5_000_000)
        while (m := rx.poll()) is not None:
            got.append(m.id)
    got += [m.id for m in recv_all(rx, 2000 - len(got))]
    assert got == list(range(2000))
    assert rx.stats()["gaps"] == 0


def test_back_pressure_then_credit(pairs: Any) -> None:
    tx, rx = pairs.pair(16)
    for i in range(16):
        tx.send(Kind.DISPATCH, i, timeout_us=1_000_000)
    with pytest.raises(LaneFullError):
        tx.send(Kind.DISPATCH, 99, timeout_us=10_000)
    assert [m.id for m in recv_all(rx, 16)] == list(range(16))
    tx.send(Kind.DISPATCH, 16, timeout_us=5_000_000)  # the credit came back
    assert [m.id for m in recv_all(rx, 1)] == [16]
    assert rx.poll(10_000) is None  # 99 was never written


def test_batches(pairs: Any) -> None:
    tx, rx = pairs.pair(256)
    b = Batch(200)
    for i in range(200):
        b.append(Kind.DISPATCH, i, meta={"x": i} if i % 50 == 0 else None)
    assert tx.send_batch(b) == 200
    out = Batch(256)
    seen: list[int] = []
    deadline = time.monotonic() + 10
    while len(seen) < 200 and time.monotonic() < deadline:
        out.clear()
        rx.drain(out)
        seen += [m.id for m in out]
    assert seen == list(range(200))


def test_too_large_is_refused_before_writing(pairs: Any) -> None:
    tx, rx = pairs.pair(16)
    with pytest.raises(MessageTooLargeError):
        tx.send(Kind.DISPATCH, 1, meta={"b": b"x" * 1000})
    tx.send(Kind.DISPATCH, 2)
    assert [m.id for m in recv_all(rx, 1)] == [2]


def test_closed_ends_refuse(pairs: Any) -> None:
    tx, rx = pairs.pair(16)
    tx.close()
    tx.close()
    with pytest.raises(LaneClosedError):
        tx.send(Kind.DISPATCH, 1)
    rx.close()
    rx.close()
    with pytest.raises(LaneClosedError):
        rx.poll()
