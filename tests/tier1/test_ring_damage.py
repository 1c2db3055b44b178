"""Damaged and lost slots against a reference model of the receiver's rules (issue 7 items 1-2).

A plain-Python writer puts random message sequences into a real lane's memory, damaging
random slots the ways a link or a faulty writer can (docs/PROTOCOL.md section 7). The model
is one sentence: a message is delivered if and only if every one of its slots arrived intact
and its metadata is valid; the good ones arrive in order, and nothing else ever comes out.
The lane must keep going: whatever was damaged, the next good messages are delivered.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmasched import Batch, Kind, LaneSet, wire
from rdmasched.transport import shm

Names = Callable[[str], str]

#: ways one slot can be damaged in transit (None: intact). A whole slot stamped for a later
#: lap is not among them: only a writer that writes ahead makes one, and where it lands it is
#: indistinguishable from a slot written there (PROTOCOL.md 7.2); it is pinned below instead.
DAMAGE = ["lost", "crc", "zero", "torn", "epoch", "earlier_lap", "stamp_bit"]
#: ways a message's metadata can be invalid although every slot is intact
BAD_META = ["not_map", "trailing", "ext", "key", "utf8", "padding"]


def meta_bytes(i: int, size: int, bad: str | None) -> tuple[bytes, int]:
    """(metadata bytes, padding byte) of message i: about `size` bytes, valid unless `bad`."""
    if bad == "not_map":
        return msgpack.packb([i, "x" * size]), 0
    if bad == "trailing":
        return msgpack.packb({"i": i, "p": "x" * size}) + b"\x00", 0
    if bad == "ext":
        return msgpack.packb({"i": i, "e": msgpack.ExtType(5, b"x" * size)}), 0
    if bad == "key":
        return b"\x81\x91" + msgpack.packb(i) + msgpack.packb("x" * size), 0
    if bad == "utf8":
        return b"\x81\xa1\xff" + msgpack.packb("x" * size), 0
    raw = msgpack.packb({"i": i, "p": "x" * size})
    if bad == "padding":
        if len(raw) % wire.CONT_PAYLOAD == 0:
            raw = msgpack.packb({"i": i, "p": "x" * (size + 1)})
        return raw, 0x5A
    return raw, 0


def message_slots(
    i: int, raw: bytes, pad: int, pos: int, nslots: int, epoch: int = 1
) -> list[bytes]:
    """The slots of DISPATCH i (seq i) carrying `raw` as metadata, written at `pos`."""
    ncont = -(-len(raw) // wire.CONT_PAYLOAD)
    head = wire.head_body(Kind.DISPATCH, ncont=ncont, src=3, seq=i, meta_len=len(raw), id=i)
    slots = [wire.seal(head, wire.stamp(epoch, pos, nslots))]
    for k in range(ncont):
        chunk = raw[k * wire.CONT_PAYLOAD : (k + 1) * wire.CONT_PAYLOAD]
        chunk = chunk.ljust(wire.CONT_PAYLOAD, bytes([pad]))
        slots.append(
            wire.seal(bytes([wire.CONT_KIND]) + chunk, wire.stamp(epoch, pos + 1 + k, nslots))
        )
    return slots


def damage(slot: bytes, how: str, pos: int, nslots: int) -> bytes | None:
    """The slot as it lands after damage `how`; None when it never lands."""
    body = slot[:52]
    lap = pos // nslots
    if how == "lost":
        return None
    if how == "crc":
        b = bytearray(slot)
        b[17] ^= 0x10
        return bytes(b)
    if how == "zero":
        return bytes(64)
    if how == "torn":  # the stamp landed, part of the body not yet (old bytes there)
        return slot[:24] + bytes(b ^ 0xFF for b in slot[24:52]) + slot[52:]
    if how == "epoch":
        return wire.seal(body, (9 << 32) | lap)
    if how == "earlier_lap":
        return wire.seal(body, (1 << 32) | ((lap - 1) & 0xFFFFFFFF))
    if how == "later_lap":
        return wire.seal(body, (1 << 32) | (lap + 1))
    if how == "stamp_bit":
        b = bytearray(slot)
        b[57] ^= 0x01
        return bytes(b)
    raise AssertionError(how)


@dataclass
class Msg:
    size: int  # metadata size hint (-1: no metadata)
    bad_meta: str | None
    damaged: dict[int, str]  # slot index in the message -> damage


class Reader:
    """Drives one receiving API until it has nothing more to give."""

    def __init__(self, rx: shm.ShmRxLane, api: str) -> None:
        self.rx = rx
        self.api = api
        self.got: list[tuple[int, int, object]] = []
        self.batch = Batch(64)
        if api == "laneset":
            self.ls = LaneSet()
            self.ls.add(rx)

    def drive(self) -> None:
        # Counted in polls, not time, so a loaded machine cannot cut it short: idle work runs
        # every 64 empty polls in a row, the look-ahead scan every 4096 (PROTOCOL.md 7.3).
        empty = 0
        head = self.rx.stats()["head"]
        while empty < 9000:  # 9000 empty polls in a row without the head moving: stuck
            if self.api == "poll":
                m = self.rx.poll()
                n = 0 if m is None else 1
                if m is not None:
                    self.got.append((m.id, m.seq, m.meta))
            else:
                self.batch.clear()
                n = self.rx.drain(self.batch) if self.api == "drain" else self.ls.drain(self.batch)
                self.got += [(m.id, m.seq, m.meta) for m in self.batch]
            empty += 1
            if n or empty % 64 == 0:
                now = self.rx.stats()["head"]
                if n or now != head:
                    empty = 0
                    head = now
        if self.api == "laneset":  # and the sleeping path (no doorbell here: it naps)
            self.batch.clear()
            if self.ls.wait(self.batch, timeout_us=1000, spin_us=0):
                self.got += [(m.id, m.seq, m.meta) for m in self.batch]


def run(rx: shm.ShmRxLane, msgs: list[Msg], api: str) -> None:
    nslots = rx.nslots
    base = rx.segment.address + shm.HEADER_BYTES
    reader = Reader(rx, api)
    expected: list[tuple[int, int, object]] = []
    written: list[tuple[int, int, bool]] = []  # (position, slots, head intact)
    bad_meta = 0
    pos = 0
    stalled_at = None
    # A last intact message: everything before it must be resolved by the time it is read.
    for i, m in enumerate([*msgs, Msg(-1, None, {})]):
        raw, pad = meta_bytes(i, m.size, m.bad_meta) if m.size >= 0 else (b"", 0)
        slots = message_slots(i, raw, pad, pos, nslots)
        assert len(slots) <= nslots // 2
        # Room (PROTOCOL.md 6.1): the receiver's head is the credit.
        if pos + len(slots) - rx.stats()["head"] > nslots:
            reader.drive()
            head = rx.stats()["head"]
            if pos + len(slots) - head > nslots:
                # Only allowed when no intact head was written beyond the receiver's head:
                # nothing tells the receiver that the slots it waits on were written.
                assert not any(p > head and ok for p, _, ok in written), (
                    f"stalled at {head} with an intact head written behind it: {written}"
                )
                stalled_at = i
                break
        for k, s in enumerate(slots):
            how = m.damaged.get(k)
            landed = s if how is None else damage(s, how, pos + k, nslots)
            if landed is not None:
                ctypes.memmove(base + ((pos + k) % nslots) * 64, landed, 64)
        written.append((pos, len(slots), 0 not in m.damaged))
        if not m.damaged and m.bad_meta is None:
            meta = msgpack.unpackb(raw, raw=False) if raw else None
            expected.append((i, i, meta))
        elif not m.damaged:
            bad_meta += 1
        pos += len(slots)
    reader.drive()
    got = reader.got
    if stalled_at is not None:
        assert got == expected[: len(got)]
        return
    assert got == expected, (got, expected, rx.stats())
    st = rx.stats()
    assert st["delivered"] == len(expected)
    assert st["bad_meta"] == bad_meta
    # a gap is a message number never seen in a good head: the messages whose head was hit
    assert st["gaps"] == sum(1 for m in msgs if 0 in m.damaged)
    skipped = sum(
        st[k] for k in ("bad_crc", "malformed", "stale_epoch", "stale_lap", "truncated", "orphans")
    )
    assert skipped + st["bad_meta"] >= len(msgs) + 1 - len(expected)
    assert st["head"] == pos


@st.composite
def messages(draw: st.DrawFn, nslots: int) -> list[Msg]:
    out = []
    max_meta = (nslots // 2 - 1) * wire.CONT_PAYLOAD - 12
    for _ in range(draw(st.integers(1, 40))):
        size = draw(st.sampled_from([-1, -1, 0, 10, 60, 150, max_meta]))
        size = min(size, max_meta)
        bad = draw(st.sampled_from([None] * 6 + BAD_META)) if size >= 0 else None
        nslots_msg = 1 + (-(-len(meta_bytes(0, size, bad)[0]) // 51) if size >= 0 else 0)
        dmg: dict[int, str] = {}
        if draw(st.booleans()):
            for k in draw(st.sets(st.integers(0, nslots_msg - 1), max_size=3)):
                dmg[k] = draw(st.sampled_from(DAMAGE))
        out.append(Msg(size, bad, dmg))
    return out


@pytest.mark.parametrize("api", ["poll", "drain", "laneset"])
@pytest.mark.parametrize("nslots", [16, 64])
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_damage_against_the_model(
    lane_name: Names, nslots: int, api: str, data: st.DataObject
) -> None:
    msgs = data.draw(messages(nslots))
    with shm.create_lane(lane_name(), nslots, grace_us=0) as rx:
        run(rx, msgs, api)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_damage_with_a_grace_period(lane_name: Names, data: st.DataObject) -> None:
    # The same with a grace period: a skip waits for it, then happens by itself. The reader
    # gives up only after 9000 empty polls at one head, far longer than 50 us on any machine.
    msgs = data.draw(messages(32))
    with shm.create_lane(lane_name(), 32, grace_us=50) as rx:
        run(rx, msgs, "poll")


# ---- the patterns that stopped a lane for good, pinned ----------------------------------------
@pytest.mark.parametrize("api", ["poll", "drain", "laneset"])
@pytest.mark.parametrize(
    "msgs",
    [
        # two lost slots in a row (a lost one-slot message, then a lost head)
        [Msg(-1, None, {0: "lost"}), Msg(-1, None, {0: "lost"}), Msg(-1, None, {})],
        # a lost head followed by a damaged continuation
        [Msg(60, None, {0: "lost", 1: "crc"}), Msg(-1, None, {})],
        # a lost head, a zeroed continuation, a torn one
        [Msg(150, None, {0: "stamp_bit", 1: "zero", 2: "torn"}), Msg(10, None, {})],
        # a damaged head, then a lost message
        [Msg(-1, None, {0: "crc"}), Msg(60, None, {0: "lost", 1: "lost"}), Msg(-1, None, {})],
        # a head from a later lap
        [Msg(-1, None, {0: "later_lap"}), Msg(-1, None, {})],
    ],
    ids=["two-lost", "lost-head-damaged-cont", "lost-head-zero-torn", "crc-then-lost", "later-lap"],
)
def test_patterns_that_stalled_the_lane(lane_name: Names, msgs: list[Msg], api: str) -> None:
    with shm.create_lane(lane_name(), 64, grace_us=0) as rx:
        run(rx, msgs, api)


@pytest.mark.parametrize("api", ["poll", "drain", "laneset"])
@pytest.mark.parametrize("bad", BAD_META)
def test_invalid_metadata_is_never_delivered_on_any_api(
    lane_name: Names, api: str, bad: str
) -> None:
    # good, bad, good: the batch APIs returned 3 and raised while iterating (item 1)
    with shm.create_lane(lane_name(), 64, grace_us=0) as rx:
        run(rx, [Msg(10, None, {}), Msg(10, bad, {}), Msg(10, None, {})], api)
        st = rx.stats()
        assert st["bad_meta"] == 1 and st["delivered"] == 3 and st["gaps"] == 0


def test_losing_the_head_of_a_three_slot_message_counts_each_slot_once(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 64, grace_us=0) as rx:
        run(rx, [Msg(60, None, {0: "epoch"}), Msg(-1, None, {})], "poll")
        st = rx.stats()
        # the lost head by what it holds, its two continuation slots as orphans
        assert (st["stale_epoch"], st["orphans"], st["stale_lap"], st["bad_crc"]) == (1, 2, 0, 0)


def test_a_head_that_lands_during_the_grace_is_not_skipped(lane_name: Names) -> None:
    # head 0 lost, head 1 missing for now, head 2 there: after the grace, 0 is skipped up to
    # the first head that is there by then, which is 1 if it landed meanwhile
    with shm.create_lane(lane_name(), 64, grace_us=200_000) as rx:
        base = rx.segment.address + shm.HEADER_BYTES
        s = [message_slots(i, b"", 0, i, 64)[0] for i in range(3)]
        ctypes.memmove(base + 2 * 64, s[2], 64)
        assert rx.scrub() is False  # found 2, the grace has begun
        ctypes.memmove(base + 1 * 64, s[1], 64)
        got = []
        while len(got) < 2:
            m = rx.poll(timeout_us=1_000_000)
            assert m is not None
            got.append(m.id)
        assert got == [1, 2]
        assert rx.stats()["bad_crc"] == 1  # the never-written (zero) slot 0


def test_sleeping_receiver_skips_a_lost_slot_after_the_grace(lane_name: Names) -> None:
    # LaneSet.wait sleeps on the doorbell; a pending skip bounds the sleep to the grace.
    with (
        shm.Doorbell.create(lane_name("-b")[-20:]) as bell,
        shm.create_lane(lane_name(), 64, grace_us=1000, doorbell=bell) as rx,
    ):
        ls = LaneSet()
        ls.add(rx)
        ls.set_doorbell(bell, bell.address)
        base = rx.segment.address + shm.HEADER_BYTES
        ctypes.memmove(base + 64, message_slots(1, b"", 0, 1, 64)[0], 64)  # 0 is lost
        b = Batch(4)
        assert ls.wait(b, timeout_us=30_000_000, spin_us=0) == 1
        assert b[0].id == 1


def test_seq_wraps_and_seq_behind_is_counted(lane_name: Names) -> None:
    with shm.create_lane(lane_name(), 64, grace_us=0) as rx:
        base = rx.segment.address + shm.HEADER_BYTES
        seqs = [0x7FFFFFFF, 0xFFFFFFFE, 0xFFFFFFFF, 0, 1, 0, 1]
        for p, seq in enumerate(seqs):
            head = wire.head_body(Kind.DISPATCH, seq=seq, id=p)
            ctypes.memmove(base + p * 64, wire.seal(head, wire.stamp(1, p, 64)), 64)
        got = [m.seq for m in iter(rx.poll, None)]
        assert got == seqs  # every one delivered
        st = rx.stats()
        # 0 -> 0x7FFFFFFF skips 2**31-1 numbers, then 0xFFFFFFFE skips 2**31-2; 0xFFFFFFFF, 0
        # and 1 follow in order across the wrap; the second 0 is behind, the 1 after it is not
        assert st["gaps"] == (2**31 - 1) + (2**31 - 2)
        assert st["seq_behind"] == 1


def test_head_that_needs_more_than_half_the_lane_is_malformed(lane_name: Names) -> None:
    # 400 bytes of metadata (under the 4096 bound) need 1 + 8 slots: more than 16 / 2
    with shm.create_lane(lane_name(), 16, grace_us=0) as rx:
        raw = msgpack.packb({"p": "x" * 390})
        slots = message_slots(0, raw, 0, 0, 16)
        assert len(slots) == 9
        base = rx.segment.address + shm.HEADER_BYTES
        for k, s in enumerate(slots + message_slots(1, b"", 0, 9, 16)):
            ctypes.memmove(base + k * 64, s, 64)
        assert [m.id for m in iter(rx.poll, None)] == [1]
        st = rx.stats()
        assert st["malformed"] == 1 and st["orphans"] == 8


def test_struct_of_model_slots_matches_the_codec() -> None:
    # the model's writer is the wire mirror's layout: its slots decode with the codec
    from rdmasched import _wire

    raw, _ = meta_bytes(7, 60, None)
    slots = message_slots(7, raw, 0, 5, 64)
    m = _wire.decode(b"".join(slots), epoch=1, pos=5, nslots=64)
    assert (m.id, m.seq, m.meta) == (7, 7, msgpack.unpackb(raw))
    assert struct.unpack_from("<I", slots[0], 12)[0] == 7  # seq, at its v2 offset
