"""The typed message vocabulary (rdmasched/messages.py) against the wire and PROTOCOL.md 4.

Each kind goes through real lane memory (an shm lane in this process) and back; the raw
slot is read with the struct mirror (rdmasched/wire.py) to check that every named field
lands in the positional field PROTOCOL.md section 4 gives it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmasched import _wire, messages, wire
from rdmasched.errors import MessageError
from rdmasched.messages import Complete, Dispatch, Heartbeat, Preempt, SyncReady
from rdmasched.transport import shm
from rdmasched.wire import Flag, Kind
from tests.codec import through_codec

Names = Callable[[str], str]

u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
u8 = st.integers(0, 255)
payloads = st.none() | st.dictionaries(
    st.text(max_size=6), st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20), max_size=6
)
incs = st.none() | st.fixed_dictionaries(
    {"inc": st.integers(1, 2**62)}, optional={"ack": st.integers(1, 2**62), "dead": u64}
)

dispatches = st.one_of(
    st.builds(
        Dispatch,
        task=u64,
        job=u32,
        priority=u8,
        cost_ns=u64,
        progress_ns=u64,
        origin=u32,
        hops=u8,
        submitted=st.booleans(),
        payload=payloads,
    ),
    st.builds(
        Dispatch,
        task=u64,
        job=u32,
        priority=u8,
        cost_ns=u64,
        progress_ns=u64,
        hops=u8,
        submitted=st.booleans(),
        slot=u32,
        payload=payloads,
    ),
)
preempts = st.builds(
    Preempt, task=u64, job=u32, trigger_ns=u64, cancel=st.booleans(), whole_job=st.booleans()
)
syncs = st.builds(SyncReady, group=u64, step=u64, member=u32, sent_ns=u64, job=u32)
completes = st.builds(
    Complete, task=u64, job=u32, runtime_ns=u64, progress_ns=u64, status=st.sampled_from([0, 1])
)
heartbeats = st.builds(Heartbeat, clock_ns=u64, queued=u64, running=u32, incarnations=incs)
any_message = dispatches | preempts | syncs | completes | heartbeats


@settings(max_examples=400, deadline=None)
@given(any_message)
def test_decode_of_encode_is_identity(x: messages.ControlMessage) -> None:
    m = through_codec(x)
    assert messages.decode(m) == x
    assert type(x).decode(m) == x


EXAMPLES: list[tuple[messages.ControlMessage, dict[str, Any]]] = [
    # (message, the positional fields PROTOCOL.md section 4 says it must fill)
    (
        Dispatch(
            7,
            job=3,
            priority=100,
            cost_ns=5000,
            progress_ns=40,
            origin=2,
            hops=1,
            submitted=True,
            payload={"x": 1},
        ),
        dict(
            kind=Kind.DISPATCH,
            id=7,
            job=3,
            priority=100,
            flags=Flag.SUBMITTED,
            arg0=5000,
            arg1=40,
            arg2=2,
            hops=1,
            meta={"x": 1},
        ),
    ),
    (
        Dispatch(7, job=3, priority=255, cost_ns=5000, slot=3),
        dict(kind=Kind.DISPATCH, id=7, job=3, priority=255, flags=Flag.START, arg0=5000, arg2=3),
    ),
    (
        Preempt(9, job=4, trigger_ns=123456, cancel=True),
        dict(kind=Kind.PREEMPT, id=9, job=4, flags=Flag.CANCEL, arg0=123456),
    ),
    (
        Preempt(0, job=4, trigger_ns=1, whole_job=True),
        dict(kind=Kind.PREEMPT, id=0, job=4, flags=Flag.JOB, arg0=1),
    ),
    (
        SyncReady(group=5, step=17, member=3, sent_ns=999, job=5),
        dict(kind=Kind.SYNC_READY, id=5, job=5, arg0=17, arg1=999, arg2=3),
    ),
    (
        Complete(11, job=2, runtime_ns=800, progress_ns=700, status=messages.YIELDED),
        dict(kind=Kind.COMPLETE, id=11, job=2, arg0=800, arg1=700, arg2=1),
    ),
    (
        Heartbeat(clock_ns=42, queued=6, running=4, incarnations={"inc": 9, "ack": 3}),
        dict(kind=Kind.HEARTBEAT, arg0=42, arg1=6, arg2=4, meta={"inc": 9, "ack": 3}),
    ),
]


@pytest.mark.parametrize(("x", "fields"), EXAMPLES, ids=lambda v: type(v).__name__)
def test_round_trip_through_lane_memory(
    lane_name: Names, x: messages.ControlMessage, fields: dict[str, Any]
) -> None:
    with shm.create_lane(lane_name(), 16) as rx, shm.attach_lane(lane_name(), src=4) as tx:
        tx.send(*x.encode())
        n = 1 + -(-len(_wire.pack_meta(fields["meta"])) // 51) if fields.get("meta") else 1
        raw = ctypes.string_at(rx.segment.address + shm.HEADER_BYTES, 64 * n)
        slots = [raw[64 * i : 64 * (i + 1)] for i in range(n)]
        # the independent mirror reads the fields where PROTOCOL.md section 4 puts them
        assert wire.decode(slots, epoch=1, pos=0, nslots=16) == wire.Fields(src=4, **fields)
        m = rx.poll()
        assert m is not None
        assert messages.decode(m) == x


def test_bad_kind_and_flags_are_refused() -> None:
    m = through_codec(Preempt(1, cancel=True))
    with pytest.raises(MessageError):
        Dispatch.decode(m)
    raw = _wire.encode(Kind.SYNC_READY, id=1, flags=int(Flag.CANCEL), nslots=64)
    with pytest.raises(MessageError):
        messages.decode(_wire.decode(raw, nslots=64))
    with pytest.raises(MessageError):
        Dispatch(1, 0, origin=2, slot=0)  # with START, arg2 is the slot: no origin


def test_a_preempt_stamped_at_sending_is_the_preempt_with_that_trigger() -> None:
    p = Preempt(3, job=1, cancel=True)
    assert p.stamped(777) == Preempt(3, job=1, trigger_ns=777, cancel=True).encode()


@settings(max_examples=100, deadline=None)
@given(any_message, st.integers(0, 0xFFFFFE), st.integers(0, 0xFFFFFE), st.integers(0, 7))
def test_a_relay_changes_nothing_but_the_relay_count(
    x: messages.ControlMessage, src: int, dst: int, relays: int
) -> None:
    m = through_codec(x, src=src, load=3, dst=dst, relays=relays)
    r = messages.relayed(m)
    assert (r.src, r.dst, r.relays) == (src, dst, relays + 1)
    assert r.fields == x.encode()
