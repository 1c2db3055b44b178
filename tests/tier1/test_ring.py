"""Ring lanes in one process: credit, back-pressure, and every way a slot can be bad.

Slots are written into the lane's memory by the struct mirror (rdmasched/wire.py), an
independent writer that follows docs/PROTOCOL.md, or by the lane's own sender.
"""

from __future__ import annotations

import ctypes
import gc
import struct
import threading
import time
import warnings
from collections.abc import Callable

import msgpack
import pytest

from rdmasched import Batch, Kind, LaneSet, wire
from rdmasched.errors import (
    EpochError,
    LaneBusyError,
    LaneClosedError,
    LaneError,
    LaneFullError,
    MessageTooLargeError,
    PeerDeadError,
)
from rdmasched.transport import shm
from rdmasched.wire import Fields

Names = Callable[[str], str]


def put(rx: shm.ShmRxLane, pos: int, slots: list[bytes]) -> None:
    """Store raw slots at lane positions pos, pos+1, ... (as a remote writer would)."""
    base = rx.segment.address + shm.HEADER_BYTES
    for k, slot in enumerate(slots):
        assert len(slot) == 64
        ctypes.memmove(base + ((pos + k) % rx.nslots) * 64, slot, 64)


def slots_of(f: Fields, pos: int, nslots: int, epoch: int = 1) -> list[bytes]:
    return wire.encode(f, epoch=epoch, pos=pos, nslots=nslots)


def drain_ids(rx: shm.ShmRxLane, polls: int = 10) -> list[int]:
    out = []
    for _ in range(polls):
        m = rx.poll()
        while m is not None:
            out.append(m.id)
            m = rx.poll()
    return out


@pytest.fixture
def rx(lane_name: Names) -> shm.ShmRxLane:
    lane = shm.create_lane(lane_name(), 64, grace_us=0)
    yield lane
    lane.close()


# ---- the document is the contract ---------------------------------------------------------
def test_independent_writer_is_accepted(rx: shm.ShmRxLane) -> None:
    pos = 0
    sent = []
    for i in range(300):  # several laps of a 64-slot lane, some with metadata
        meta = {"i": i, "pad": "x" * (i % 120)} if i % 3 == 0 else None
        f = Fields(kind=Kind.DISPATCH, id=i, job=2, priority=i % 256, seq=i, src=4, meta=meta)
        s = slots_of(f, pos, 64)
        put(rx, pos, s)
        pos += len(s)
        m = rx.poll()
        assert m is not None and (m.id, m.seq, m.src, m.meta) == (i, i, 4, meta)
        sent.append(i)
    assert rx.stats()["delivered"] == 300
    assert rx.stats()["gaps"] == 0


def test_sender_writes_what_the_mirror_reads(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 16) as rx, shm.attach_lane(lane_name(), src=9) as tx:
        tx.load = 123
        tx.send(Kind.SYNC_READY, 77, 5, 200, 0, 12, 4, 1, 0, {"grads": [1, 2]})
        raw = ctypes.string_at(rx.segment.address + shm.HEADER_BYTES, 64 * 2)
        got = wire.decode([raw[:64], raw[64:]], epoch=1, pos=0, nslots=16)
        assert got == Fields(
            kind=Kind.SYNC_READY,
            id=77,
            job=5,
            priority=200,
            arg0=12,
            arg1=4,
            arg2=1,
            src=9,
            load=123,
            seq=0,
            meta={"grads": [1, 2]},
        )
        assert rx.poll() is not None
        assert rx.peer_load == 123


# ---- credit and back-pressure ----------------------------------------------------------------
def test_lane_full_raises_and_writes_nothing(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 16) as rx, shm.attach_lane(lane_name()) as tx:
        for i in range(16):
            tx.send(Kind.DISPATCH, i, timeout_us=0)
        t0 = time.monotonic()
        with pytest.raises(LaneFullError, match="full") as exc:
            tx.send(Kind.DISPATCH, 99, timeout_us=20_000)
        assert isinstance(exc.value, BufferError)
        assert time.monotonic() - t0 >= 0.02
        assert "running but not consuming" in str(exc.value)
        assert drain_ids(rx) == list(range(16))
        # credit came back: the lane goes on, and 99 was never written
        tx.send(Kind.DISPATCH, 100, timeout_us=0)
        assert drain_ids(rx) == [100]
        assert rx.stats()["gaps"] == 0


def test_sender_never_overwrites_an_unread_slot(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 16) as rx, shm.attach_lane(lane_name()) as tx:
        got: list[int] = []
        for i in range(1000):
            while True:
                try:
                    tx.send(Kind.DISPATCH, i, timeout_us=0)
                    break
                except LaneFullError:
                    # the receiver reads only some: the sender must wait for credit
                    m = rx.poll()
                    assert m is not None
                    got.append(m.id)
            assert tx.stats()["tail"] - rx.stats()["head"] <= 16
        got += drain_ids(rx)
        assert got == list(range(1000))


def test_message_must_fit_half_the_lane(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 16) as rx, shm.attach_lane(lane_name()) as tx:
        with pytest.raises(MessageTooLargeError, match="at most 8"):
            tx.send(Kind.DISPATCH, 1, meta={"b": b"x" * 600})
        assert rx.poll() is None and tx.stats()["tail"] == 0


def test_multi_slot_messages_wrap_the_ring(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 16) as rx, shm.attach_lane(lane_name()) as tx:
        for i in range(200):
            meta = {"i": i, "blob": b"y" * (i % 200)}
            tx.send(Kind.DISPATCH, i, meta=meta, timeout_us=0)
            m = rx.poll()
            assert m is not None and m.meta == meta


# ---- what is never delivered, and is counted ----------------------------------------------
def test_torn_slot_that_completes_within_grace_is_delivered(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 64, grace_us=10_000_000) as rx:
        good = slots_of(Fields(kind=Kind.DISPATCH, id=5, job=0xABCDEF, arg0=9, arg1=3), 0, 64)[0]
        torn = good[:20] + bytes(32) + good[52:]  # stamp landed, body not yet
        put(rx, 0, [torn])
        assert rx.poll() is None
        put(rx, 0, [good])
        assert rx.poll().id == 5
        assert rx.stats()["bad_crc"] == 0


@pytest.mark.parametrize("offset", [0, 9, 17, 33, 51, 52, 55])
def test_corrupt_byte_is_counted_and_skipped(rx: shm.ShmRxLane, offset: int) -> None:
    bad = bytearray(slots_of(Fields(kind=Kind.DISPATCH, id=1, seq=0), 0, 64)[0])
    bad[offset] ^= 0x40
    put(rx, 0, [bytes(bad)])
    put(rx, 1, slots_of(Fields(kind=Kind.DISPATCH, id=2, seq=1), 1, 64))
    assert drain_ids(rx) == [2]
    st = rx.stats()
    assert st["bad_crc"] == 1 and st["gaps"] == 1 and st["delivered"] == 1


def test_corrupt_stamp_is_found_by_the_scrub(rx: shm.ShmRxLane) -> None:
    bad = bytearray(slots_of(Fields(kind=Kind.DISPATCH, id=1, seq=0), 0, 64)[0])
    bad[60] ^= 0x01  # the epoch half of the stamp
    put(rx, 0, [bytes(bad)])
    assert rx.poll() is None  # looks unwritten: nothing after it yet
    assert rx.scrub() is False
    put(rx, 1, slots_of(Fields(kind=Kind.DISPATCH, id=2, seq=1), 1, 64))
    # the idle poller scrubs by itself every few thousand empty polls
    got = []
    for _ in range(10_000):
        m = rx.poll()
        if m is not None:
            got.append(m.id)
            break
    assert got == [2]
    assert rx.stats()["bad_crc"] == 1


def test_slot_of_earlier_epoch_is_stale(rx: shm.ShmRxLane) -> None:
    # A whole, checksummed slot of epoch 7 where epoch 1 is expected, then a current one.
    put(rx, 0, slots_of(Fields(kind=Kind.DISPATCH, id=1), 0, 64, epoch=7))
    put(rx, 1, slots_of(Fields(kind=Kind.DISPATCH, id=2, seq=1), 1, 64))
    assert rx.poll() is None
    assert rx.scrub() is True
    assert drain_ids(rx) == [2]
    assert rx.stats()["stale_epoch"] == 1


def test_slot_of_earlier_lap_is_stale(rx: shm.ShmRxLane) -> None:
    for i in range(64):  # lap 0 fully consumed
        put(rx, i, slots_of(Fields(kind=Kind.DISPATCH, id=i, seq=i), i, 64))
    assert drain_ids(rx) == list(range(64))
    # position 64 still holds lap 0's slot; position 65 gets a current one
    put(rx, 65, slots_of(Fields(kind=Kind.DISPATCH, id=65, seq=65), 65, 64))
    assert rx.poll() is None
    assert rx.scrub() is True
    assert drain_ids(rx) == [65]
    assert rx.stats()["stale_lap"] == 1
    assert rx.stats()["gaps"] == 1


def test_truncated_continuation_is_counted(rx: shm.ShmRxLane) -> None:
    msg = slots_of(Fields(kind=Kind.DISPATCH, id=1, meta={"b": b"z" * 120}), 0, 64)
    assert len(msg) == 4
    put(rx, 0, msg[:2])  # head and one continuation only
    nxt = slots_of(Fields(kind=Kind.DISPATCH, id=2, seq=1), 4, 64)
    put(rx, 4, nxt)
    assert drain_ids(rx) == [2]
    st = rx.stats()
    assert st["truncated"] == 1 and st["orphans"] == 0


def test_orphan_continuation_is_counted(rx: shm.ShmRxLane) -> None:
    msg = slots_of(Fields(kind=Kind.DISPATCH, id=1, meta={"b": b"z" * 60}), 0, 64)
    assert len(msg) == 3
    put(rx, 0, msg[1:])  # continuations without their head
    put(rx, 2, slots_of(Fields(kind=Kind.DISPATCH, id=2, seq=1), 2, 64))
    # position 0 holds a continuation: not a head
    assert drain_ids(rx) == [2]
    assert rx.stats()["orphans"] == 2


def test_malformed_head_is_counted(rx: shm.ShmRxLane) -> None:
    body = bytearray(slots_of(Fields(kind=Kind.DISPATCH, id=1), 0, 64)[0][:52])
    body[0] = 42  # unknown kind, checksum re-sealed
    put(rx, 0, [wire.seal(bytes(body), wire.stamp(1, 0, 64))])
    put(rx, 1, slots_of(Fields(kind=Kind.DISPATCH, id=2, seq=1), 1, 64))
    assert drain_ids(rx) == [2]
    assert rx.stats()["malformed"] == 1


def test_bad_metadata_is_counted_and_the_lane_goes_on(rx: shm.ShmRxLane) -> None:
    raw = msgpack.packb([1, 2])  # valid msgpack, not a map
    head = wire.head_body(1, ncont=1, meta_len=len(raw), id=1)
    cont = bytes([wire.CONT_KIND]) + raw.ljust(51, b"\0")
    put(rx, 0, [wire.seal(head, wire.stamp(1, 0, 64)), wire.seal(cont, wire.stamp(1, 1, 64))])
    put(rx, 2, slots_of(Fields(kind=Kind.DISPATCH, id=2, seq=1), 2, 64))
    assert drain_ids(rx) == [2]
    assert rx.stats()["bad_meta"] == 1


def test_bad_slots_are_logged(rx: shm.ShmRxLane, caplog: pytest.LogCaptureFixture) -> None:
    bad = bytearray(slots_of(Fields(kind=Kind.DISPATCH, id=1), 0, 64)[0])
    bad[20] ^= 1
    put(rx, 0, [bytes(bad)])
    with caplog.at_level("WARNING", logger="rdmasched.ring"):
        assert drain_ids(rx) == []
    assert "bad_crc" in caplog.text


# ---- batches and lane sets -----------------------------------------------------------------
def test_batch_send_and_drain(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 256) as rx, shm.attach_lane(lane_name(), src=3) as tx:
        b = Batch(100)
        for i in range(100):
            b.append(Kind.DISPATCH, i, 1, i % 7, meta={"k": i} if i % 10 == 0 else None)
        assert tx.send_batch(b) == 100
        out = Batch(64)
        seen = []
        while len(seen) < 100:
            out.clear()
            assert rx.drain(out) > 0
            seen += [(m.id, m.meta) for m in out]
        assert seen == [(i, {"k": i} if i % 10 == 0 else None) for i in range(100)]


def test_send_batch_reports_partial_progress(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 16) as rx, shm.attach_lane(lane_name()) as tx:
        b = Batch(20)
        for i in range(20):
            b.append(Kind.DISPATCH, i)
        with pytest.raises(LaneFullError, match="sent 16 of 20"):
            tx.send_batch(b, timeout_us=1000)
        assert drain_ids(rx) == list(range(16))


def test_lane_set_drains_every_lane_fairly(lane_name: Names) -> None:
    rxs = [shm.create_lane(lane_name(f"-{k}"), 256) for k in range(3)]
    txs = [shm.attach_lane(lane_name(f"-{k}"), src=k) for k in range(3)]
    try:
        ls = LaneSet()
        for r in rxs:
            ls.add(r)
        for k, t in enumerate(txs):
            for i in range(100):
                t.send(Kind.DISPATCH, k * 1000 + i)
        b = Batch(30)
        ls.drain(b, quantum=10)
        lanes = [m.lane for m in b]
        assert sorted(set(lanes)) == [0, 1, 2]  # one busy lane cannot take the batch
        assert all(lanes.count(k) == 10 for k in range(3))
        seen = [m.id for m in b]
        while True:
            b.clear()
            if not ls.drain(b):
                break
            seen += [m.id for m in b]
        for k in range(3):
            assert [x for x in seen if x // 1000 == k] == [k * 1000 + i for i in range(100)]
    finally:
        for lane in txs + rxs:
            lane.close()


def test_doorbell_wakes_a_sleeping_receiver(lane_name: Names) -> None:
    with shm.Doorbell.create(lane_name("-bell")[-20:]) as bell:
        rx = shm.create_lane(lane_name(), 64, doorbell=bell)
        tx = shm.attach_lane(lane_name())
        try:
            ls = LaneSet()
            ls.add(rx)
            ls.set_doorbell(bell, bell.address)
            b = Batch(8)

            def later() -> None:
                time.sleep(0.2)
                tx.send(Kind.PREEMPT, 5)

            t = threading.Thread(target=later)
            t0 = time.monotonic()
            t.start()
            got = ls.wait(b, timeout_us=20_000_000, spin_us=10)
            t.join()
            assert got == 1 and b[0].id == 5
            assert time.monotonic() - t0 < 10  # woken, not timed out
            assert tx.stats()["wakes"] >= 1
        finally:
            tx.close()
            rx.close()


# ---- lifecycle and misuse -------------------------------------------------------------------
def test_close_is_idempotent_and_closed_lanes_refuse(lane_name: Names) -> None:
    rx = shm.create_lane(lane_name(), 16)
    tx = shm.attach_lane(lane_name())
    tx.close()
    tx.close()
    rx.close()
    rx.close()
    with pytest.raises(LaneClosedError):
        tx.send(Kind.DISPATCH, 1)
    with pytest.raises(LaneClosedError):
        rx.poll()


def test_receiver_close_is_seen_by_sender(lane_name: Names) -> None:
    rx = shm.create_lane(lane_name(), 16)
    with shm.attach_lane(lane_name()) as tx:
        tx.send(Kind.DISPATCH, 1)
        rx.close()
        with pytest.raises(PeerDeadError, match="closed the lane"):
            tx.send(Kind.DISPATCH, 2)


def test_unclosed_lane_warns(lane_name: Names) -> None:
    rx = shm.create_lane(lane_name(), 16)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        del rx
        gc.collect()
    assert any(issubclass(x.category, ResourceWarning) for x in w)


def test_attach_to_missing_lane_is_clear(lane_name: Names) -> None:
    with pytest.raises(PeerDeadError, match="does not exist"):
        shm.attach_lane(lane_name("-nobody"))


def test_lane_names_are_checked() -> None:
    with pytest.raises(ValueError, match="lane name"):
        shm.create_lane("../etc/passwd", 16)


@pytest.mark.parametrize("nslots", [0, 8, 100, 3 << 20])
def test_lane_size_is_checked(lane_name: Names, nslots: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        shm.create_lane(lane_name(), nslots)


def test_second_receiver_is_busy(lane_name: Names) -> None:
    with (
        shm.create_lane(lane_name(), 16),
        pytest.raises(LaneBusyError, match="belongs to a running process"),
    ):
        shm.create_lane(lane_name(), 16)


def test_second_live_sender_is_busy(lane_name: Names) -> None:
    # The claim is the sender's liveness token (PROTOCOL.md section 9): a sender in another
    # live process makes attach fail (tier2); here another open file description of the
    # segment holds the token (as another process's would), with a foreign pid planted in
    # the header for the message.
    with shm.create_lane(lane_name(), 16) as rx:
        import os

        hdr = rx.segment.address + 64
        parent = os.getppid()
        ctypes.memmove(hdr + 4, struct.pack("<I", parent), 4)
        ctypes.memmove(hdr + 8, struct.pack("<Q", shm.process_start(parent)), 8)
        other = shm.Token(rx.segment)
        try:
            assert other.hold(shm.SENDER_TOKEN)
            with pytest.raises(LaneBusyError, match="already has a live sender"):
                shm.attach_lane(lane_name())
        finally:
            other.close()
        # a pid in the header without the token is no live sender
        shm.attach_lane(lane_name()).close()


def test_restarted_sender_waits_for_the_receiver_to_accept_its_epoch(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 16) as rx:
        first = shm.attach_lane(lane_name())
        first.send(Kind.DISPATCH, 1)
        first.close()
        second = shm.attach_lane(lane_name())
        with second:
            assert second.epoch == 2 and not second.acked
            with pytest.raises(EpochError, match="did not accept sender epoch 2"):
                second.send(Kind.DISPATCH, 2, timeout_us=1000)
            assert drain_ids(rx, polls=200) == [1]  # drains epoch 1, then accepts epoch 2
            assert second.acked
            second.send(Kind.DISPATCH, 3, timeout_us=0)
            assert drain_ids(rx) == [3]
            assert rx.epoch == 2


def test_a_sender_whose_epoch_was_skipped_is_told_so(lane_name: Names) -> None:
    """Issue 20 item 3: the receiver took a newer sender's epoch (the newest request wins):
    the error says so, instead of asking whether the receiver polls."""
    with shm.create_lane(lane_name(), 16) as rx:
        shm.attach_lane(lane_name()).close()
        with shm.attach_lane(lane_name()) as second:
            assert second.epoch == 2 and not second.acked
            # a third sender (another process) claims epoch 3 before the receiver looks
            ctypes.memmove(rx.segment.address + 64, struct.pack("<I", 3), 4)
            drain_ids(rx, polls=200)  # accepts epoch 3, skipping 2
            assert rx.epoch == 3
            with pytest.raises(EpochError, match="took a newer sender epoch, 3") as err:
                second.send(Kind.DISPATCH, 1, timeout_us=1000)
            assert "is it polling" not in str(err.value)
            assert "not consuming" not in str(err.value)


def test_attach_during_creation_is_retryable_not_fatal(lane_name: Names) -> None:
    # The receiver has created and sized the segment but not yet written the header.
    seg = shm.ShmSegment.create(shm.lane_segment_name(lane_name()), shm.segment_size(16))
    try:
        with pytest.raises(PeerDeadError, match="still being created"):
            shm.attach_lane(lane_name())
    finally:
        seg.close()


def test_attach_to_something_that_is_not_a_lane(lane_name: Names) -> None:
    seg = shm.ShmSegment.create(shm.lane_segment_name(lane_name()), shm.segment_size(16))
    try:
        ctypes.memmove(seg.address, b"NOTALANE", 8)
        with pytest.raises(LaneError, match="not an rdmasched lane"):
            shm.attach_lane(lane_name())
    finally:
        seg.close()


def test_a_version_1_lane_is_refused_naming_both_versions(lane_name: Names) -> None:
    """Wire v2 (issue 8 item 3): a lane made by a v1 receiver (header version 1) is refused
    before anything is written, and the error names both versions."""
    rx = shm.create_lane(lane_name(), 16)
    try:
        assert shm.read_header(rx.segment)["version"] == shm.LANE_VERSION == 2
        ctypes.memmove(rx.segment.address + 8, struct.pack("<I", 1), 4)  # a v1 receiver's
        with pytest.raises(LaneError, match=r"version 1.*version 2"):
            shm.attach_lane(lane_name())
        assert shm.read_header(rx.segment)["epoch_req"] == 0  # nothing claimed
    finally:
        rx.close()


def test_second_sender_in_the_same_process_is_refused(lane_name: Names) -> None:
    # issue 7 item 20: the second attach took a new epoch; the first kept "succeeding" and
    # its messages were never delivered
    with shm.create_lane(lane_name(), 16) as rx, shm.attach_lane(lane_name()) as first:
        with pytest.raises(LaneBusyError, match="already has a sender in this process"):
            shm.attach_lane(lane_name())
        first.send(Kind.DISPATCH, 1)
        assert drain_ids(rx) == [1]
    # once the first is closed, a new sender of this process may attach
    with shm.create_lane(lane_name("-2"), 16) as rx:
        shm.attach_lane(lane_name("-2")).close()
        with shm.attach_lane(lane_name("-2")) as again:
            again.send(Kind.DISPATCH, 2, timeout_us=0) if again.acked else None
            assert drain_ids(rx, polls=200) == []  # epoch 1 had nothing; epoch 2 accepted
            again.send(Kind.DISPATCH, 3)
            assert drain_ids(rx) == [3]


# ---- protocol points an outside writer had to guess (issue 7) -------------------------------
def test_new_lane_credit_word_and_idle_credit(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 64) as rx, shm.attach_lane(lane_name()) as tx:
        assert shm.read_header(rx.segment)["credit"] == 1 << 32  # epoch 1, head 0
        tx.send(Kind.DISPATCH, 1)
        assert rx.poll() is not None  # 1 slot: far below the S/4 rule
        assert shm.read_header(rx.segment)["credit"] == 1 << 32
        for _ in range(64):  # idle: the 64th empty poll in a row publishes it
            assert rx.poll() is None
        assert shm.read_header(rx.segment)["credit"] == (1 << 32) | 1


def test_epoch_request_that_jumped_goes_to_the_newest(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 16) as rx:
        shm.attach_lane(lane_name()).close()  # epoch 1
        second = shm.attach_lane(lane_name())  # epoch 2, never accepted
        second.close()
        with shm.attach_lane(lane_name()) as third:
            assert third.epoch == 3
            for _ in range(200):
                rx.poll()
            assert rx.epoch == 3 and third.acked
            third.send(Kind.DISPATCH, 3, timeout_us=0)
            assert drain_ids(rx) == [3]


def test_epoch_wrap_never_revives_a_slot_of_the_first_epoch_one(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 16) as rx:
        with shm.attach_lane(lane_name()) as first:  # epoch 1: positions 0 and 1
            first.send(Kind.DISPATCH, 1)
            first.send(Kind.DISPATCH, 2)
        assert drain_ids(rx) == [1, 2]
        # many restarts later: the next epoch is 2**32 - 1
        ctypes.memmove(rx.segment.address + 64, struct.pack("<I", 0xFFFFFFFE), 4)
        with shm.attach_lane(lane_name()) as late:
            assert late.epoch == 0xFFFFFFFF
            for _ in range(200):
                rx.poll()
            late.send(Kind.DISPATCH, 3, timeout_us=0)  # position 0 only
            assert drain_ids(rx) == [3]
        with shm.attach_lane(lane_name()) as wrapped:
            assert wrapped.epoch == 1  # 0 is never an epoch
            for _ in range(200):
                rx.poll()
            assert wrapped.acked
            wrapped.send(Kind.DISPATCH, 4, timeout_us=0)
            # position 1 held epoch 1's message 2 (stamp (1, lap 0)): zeroed at the wrap
            assert drain_ids(rx, polls=5000) == [4]
            assert rx.stats()["delivered"] == 4


def test_new_epoch_waits_until_a_lost_slot_of_the_old_one_is_skipped(rx: shm.ShmRxLane) -> None:
    # epoch 1 wrote messages at 0 and 1; the slot at 0 was lost. A restarted sender asks for
    # epoch 2: the receiver must still deliver 1 (behind the lost slot) before it switches.
    put(rx, 1, slots_of(Fields(kind=Kind.DISPATCH, id=11, seq=1), 1, 64))
    hdr = rx.segment.address + 64
    ctypes.memmove(hdr, struct.pack("<I", 2), 4)  # epoch_req: 2
    got = []
    for _ in range(20_000):
        m = rx.poll()
        if m is not None:
            got.append(m.id)
    assert got == [11]
    assert rx.epoch == 2
    assert rx.stats()["bad_crc"] == 1  # the never-written slot 0


@pytest.mark.parametrize("bad", [float("nan"), -1.0])
def test_a_timeout_that_is_nan_or_negative_is_refused(lane_name: Names, bad: float) -> None:
    """issue 7 item 22: poll(timeout_us=nan) returned None at once, and a send or LaneSet
    call converted nan to 0; every timeout is now checked where it is converted."""
    with shm.create_lane(lane_name(), 16) as rx, shm.attach_lane(lane_name()) as tx:
        ls = LaneSet()
        ls.add(rx)
        with pytest.raises(ValueError, match="timeout_us"):
            rx.poll(timeout_us=bad)
        with pytest.raises(ValueError, match="timeout_us"):
            ls.poll(timeout_us=bad)
        with pytest.raises(ValueError, match="timeout_us"):
            ls.wait(Batch(4), timeout_us=bad)
        for i in range(16):
            tx.send(Kind.DISPATCH, i, timeout_us=0)
        with pytest.raises(ValueError, match="timeout_us"):
            tx.send(Kind.DISPATCH, 99, timeout_us=bad)  # the full lane takes the slow path
        assert drain_ids(rx) == list(range(16))  # and 99 was never written


def test_poll_with_an_infinite_timeout_waits_for_the_message(lane_name: Names) -> None:
    """issue 7 item 22: poll(timeout_us=inf) returned None at once; it waits for ever."""
    with shm.create_lane(lane_name(), 16) as rx, shm.attach_lane(lane_name()) as tx:
        later = threading.Timer(0.05, lambda: tx.send(Kind.DISPATCH, 7, timeout_us=0))
        later.start()
        try:
            msg = rx.poll(timeout_us=float("inf"))
        finally:
            later.join()
        assert msg is not None and msg.id == 7


def test_a_bare_ring_ends_a_lane_sets_wait(lane_name: Names) -> None:
    # Loop.post from another thread rings the loop's doorbell with no message: the wait
    # must end then, not at its timeout (a one-host daemon, with no peer lanes, carried out
    # its clients' calls only at its next timer, up to a heartbeat late)
    bell = shm.Doorbell.create(lane_name().replace(".", "")[:12] + ".b")
    lanes = LaneSet()
    lanes.set_doorbell(bell, bell.address)
    rx = shm.create_lane(lane_name(), 64, doorbell=bell)
    lanes.add(rx)
    try:
        for with_lane in (True, False):
            if not with_lane:
                lanes = LaneSet()  # no lanes at all: a daemon alone in its cluster
                lanes.set_doorbell(bell, bell.address)
            done = threading.Event()

            def ring(done: threading.Event = done) -> None:
                while not done.is_set():  # until the waiter has gone to sleep and woken
                    bell.ring()
                    time.sleep(0.01)

            t = threading.Thread(target=ring)
            t.start()
            t0 = time.monotonic()
            got = lanes.wait(Batch(8), 30_000_000, 0)  # 30 s
            done.set()
            t.join()
            assert got == 0
            assert time.monotonic() - t0 < 20, "the wait ran to its timeout: the ring was lost"
    finally:
        rx.close()
        bell.close()
