"""The wire format: the Cython codec against the struct mirror written from PROTOCOL.md."""

from __future__ import annotations

import os
import struct
import uuid

import msgpack
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rdmasched import _ring, _wire, wire
from rdmasched.errors import CorruptSlotError, MessageError, MessageTooLargeError
from rdmasched.transport import shm
from rdmasched.wire import Fields, Kind, Reject

u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
u16 = st.integers(0, 2**16 - 1)
u8 = st.integers(0, 255)
node_ids = st.integers(0, wire.NODE_MAX)
metas = st.none() | st.dictionaries(
    st.text(max_size=8),
    st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=40)
    | st.binary(max_size=60)
    | st.lists(st.integers(0, 1000), max_size=20),
    max_size=12,
)
nslots_st = st.sampled_from([16, 64, 256, 4096])


@st.composite
def messages(draw: st.DrawFn) -> Fields:
    return Fields(
        kind=draw(st.sampled_from(list(Kind))),
        id=draw(u64),
        job=draw(u32),
        priority=draw(u8),
        flags=draw(u8),
        arg0=draw(u64),
        arg1=draw(u64),
        arg2=draw(u32),
        hops=draw(u8),
        src=draw(node_ids),
        load=draw(u16),
        seq=draw(u32),
        meta=draw(metas),
        dst=draw(node_ids),
        relays=draw(u8),
    )


def cy_encode(f: Fields, epoch: int, pos: int, nslots: int) -> bytes:
    return _wire.encode(
        int(f.kind),
        f.id,
        f.job,
        f.priority,
        f.flags,
        f.arg0,
        f.arg1,
        f.arg2,
        f.hops,
        f.src,
        f.load,
        f.seq,
        f.meta,
        epoch,
        pos,
        nslots,
        dst=f.dst,
        relays=f.relays,
    )


def fits(f: Fields, nslots: int) -> bool:
    raw = msgpack.packb(f.meta, use_bin_type=True) if f.meta is not None else b""
    return len(raw) <= wire.MAX_META and 1 + -(-len(raw) // 51) <= nslots // 2


def as_fields(m: _wire.Message) -> Fields:
    return Fields(
        kind=m.kind,
        id=m.id,
        job=m.job,
        priority=m.priority,
        flags=m.flags,
        arg0=m.arg0,
        arg1=m.arg1,
        arg2=m.arg2,
        hops=m.hops,
        src=m.src,
        load=m.load,
        seq=m.seq,
        meta=m.meta,
        dst=m.dst,
        relays=m.relays,
    )


# ---- the contract ------------------------------------------------------------------------
def test_layout_matches_protocol_table() -> None:
    assert _wire.SLOT_OFFSETS == {
        "kind": 0,
        "flags": 1,
        "priority": 2,
        "ncont": 3,
        "src": 4,
        "relays": 7,
        "dst": 8,
        "hops": 11,
        "seq": 12,
        "load": 16,
        "meta_len": 18,
        "job": 20,
        "id": 24,
        "arg0": 32,
        "arg1": 40,
        "arg2": 48,
        "crc": 52,
        "stamp": 56,
    }
    assert wire.HEAD.size == _wire.SLOT_BYTES == 64
    assert wire.HEAD.format == "<BBBB3sB3sBIHHIQQQIIQ"
    assert _wire.WIRE_VERSION == wire.VERSION == 2


def test_v2_fields_sit_where_the_table_says() -> None:
    """Each field read at its PROTOCOL.md offset, straight from the Cython codec's bytes."""
    raw = _wire.encode(
        1,
        id=0x1122334455667788,
        job=0xA1B2C3D4,
        priority=7,
        flags=4,
        arg0=9,
        arg1=10,
        arg2=11,
        hops=3,
        src=0xABCDEF,
        load=999,
        seq=0x01020304,
        dst=0x123456,
        relays=5,
    )
    assert raw[4:7] == (0xABCDEF).to_bytes(3, "little") and raw[7] == 5
    assert raw[8:11] == (0x123456).to_bytes(3, "little") and raw[11] == 3
    assert struct.unpack_from("<IHHIQ", raw, 12) == (
        0x01020304,
        999,
        0,
        0xA1B2C3D4,
        0x1122334455667788,
    )


def test_crc32c_check_value() -> None:
    # The standard check value of CRC-32C (iSCSI), for both implementations.
    assert wire.crc32c(b"123456789") == 0xE3069283
    assert _wire.crc32c(b"123456789") == 0xE3069283


@given(st.binary(max_size=300))
def test_crc_implementations_agree(data: bytes) -> None:
    assert _wire.crc32c(data) == wire.crc32c(data)


@settings(max_examples=300)
@given(messages(), st.integers(1, 2**32 - 1), st.integers(0, 2**40), nslots_st)
def test_cython_encode_is_byte_identical_to_mirror(
    f: Fields, epoch: int, pos: int, nslots: int
) -> None:
    assume(fits(f, nslots))
    assert cy_encode(f, epoch, pos, nslots) == b"".join(
        wire.encode(f, epoch=epoch, pos=pos, nslots=nslots)
    )


@settings(max_examples=300)
@given(messages(), st.integers(1, 2**32 - 1), st.integers(0, 2**40), nslots_st)
def test_round_trip(f: Fields, epoch: int, pos: int, nslots: int) -> None:
    assume(fits(f, nslots))
    data = cy_encode(f, epoch, pos, nslots)
    assert as_fields(_wire.decode(data, epoch, pos, nslots)) == f
    slots = [data[i : i + 64] for i in range(0, len(data), 64)]
    assert wire.decode(slots, epoch=epoch, pos=pos, nslots=nslots) == f


# ---- what must never be delivered --------------------------------------------------------
@settings(max_examples=300)
@given(messages(), st.integers(1, 2**32 - 1), st.integers(0, 2**40), st.data())
def test_any_flipped_byte_is_rejected(f: Fields, epoch: int, pos: int, data: st.DataObject) -> None:
    nslots = 256
    assume(fits(f, nslots))
    raw = bytearray(cy_encode(f, epoch, pos, nslots))
    i = data.draw(st.integers(0, len(raw) - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    raw[i] ^= 1 << bit
    with pytest.raises(CorruptSlotError) as exc:
        _wire.decode(bytes(raw), epoch, pos, nslots)
    # a flipped stamp makes the slot look unwritten; anything else fails the checksum
    assert exc.value.reason in ("empty", "bad-crc")
    slots = [bytes(raw[k : k + 64]) for k in range(0, len(raw), 64)]
    with pytest.raises(Reject):
        wire.decode(slots, epoch=epoch, pos=pos, nslots=nslots)


@given(messages(), st.integers(2, 2**32 - 1), st.integers(0, 2**30))
def test_wrong_epoch_is_rejected(f: Fields, epoch: int, pos: int) -> None:
    assume(fits(f, 256))
    data = cy_encode(f, epoch - 1, pos, 256)
    with pytest.raises(CorruptSlotError, match="empty"):
        _wire.decode(data, epoch, pos, 256)


@given(messages(), st.integers(1, 2**32 - 1), st.integers(256, 2**30))
def test_earlier_lap_is_rejected(f: Fields, epoch: int, pos: int) -> None:
    assume(fits(f, 256))
    data = cy_encode(f, epoch, pos - 256, 256)  # same slot index, one lap earlier
    with pytest.raises(CorruptSlotError, match="empty"):
        _wire.decode(data, epoch, pos, 256)


@given(
    st.dictionaries(
        st.text(max_size=5), st.binary(min_size=60, max_size=200), min_size=1, max_size=5
    ),
    st.data(),
)
def test_truncated_continuation_is_rejected(meta: dict[str, bytes], data: st.DataObject) -> None:
    f = Fields(kind=Kind.DISPATCH, id=1, meta=meta)
    raw = cy_encode(f, 3, 10, 256)
    nslots_in_msg = len(raw) // 64
    keep = data.draw(st.integers(1, nslots_in_msg - 1))
    with pytest.raises(CorruptSlotError, match="truncated"):
        _wire.decode(raw[: 64 * keep], 3, 10, 256)


def test_stamp_encodes_epoch_and_lap() -> None:
    raw = _wire.encode(1, 5, epoch=9, pos=3 * 64 + 5, nslots=64)
    (stamp,) = struct.unpack_from("<Q", raw, 56)
    assert stamp == (9 << 32) | 3
    assert wire.stamp(9, 3 * 64 + 5, 64) == stamp


def test_malformed_fields_with_good_checksum_are_rejected() -> None:
    good = wire.encode(Fields(kind=Kind.DISPATCH, id=1), epoch=1, pos=0, nslots=64)[0]
    # kind 0, kind 99, ncont, src 0xFFFFFF, dst 0xFFFFFF (the reserved node id)
    for offset, value in [(0, 0), (0, 99), (3, 2), (4, b"\xff\xff\xff"), (8, b"\xff\xff\xff")]:
        body = bytearray(good[:52])
        if isinstance(value, bytes):
            body[offset : offset + 3] = value
        else:
            body[offset] = value
        slot = wire.seal(bytes(body), wire.stamp(1, 0, 64))
        with pytest.raises(CorruptSlotError, match=r"malformed|truncated"):
            _wire.decode(slot, 1, 0, 64)
        with pytest.raises(Reject, match=r"malformed|truncated"):
            wire.decode([slot], epoch=1, pos=0, nslots=64)


def test_metadata_that_is_not_a_map_is_rejected() -> None:
    raw = msgpack.packb([1, 2, 3])
    with pytest.raises(CorruptSlotError, match="bad-meta"):
        _wire.decode(_wire.encode(1, 1, meta=raw), 1, 0, 256)


# ---- encoding errors: clear, and nothing produced ----------------------------------------
def test_meta_over_the_bound_is_refused() -> None:
    meta = {"blob": b"x" * wire.MAX_META}
    with pytest.raises(MessageTooLargeError, match="bound is 4096"):
        _wire.encode(1, 1, meta=meta)


def test_meta_bound_exactly() -> None:
    # map header (1) + key "b" (2) + bin16 header (3): exactly at the bound, then one over
    meta = {"b": b"x" * (wire.MAX_META - 6)}
    assert len(msgpack.packb(meta)) == wire.MAX_META
    data = _wire.encode(1, 1, meta=meta, nslots=256)
    assert _wire.decode(data, 1, 0, 256).meta == meta
    with pytest.raises(MessageTooLargeError):
        _wire.encode(1, 1, meta={"b": b"x" * (wire.MAX_META - 5)}, nslots=256)


@pytest.mark.parametrize(
    ("kwargs", "err"),
    [
        ({"kind": 0}, "unknown message kind"),
        ({"kind": 6}, "unknown message kind"),
        ({"kind": 1, "priority": 256}, "priority"),
        ({"kind": 1, "flags": -1}, "flags"),
        ({"kind": 1, "hops": 300}, "hops"),
        ({"kind": 1, "meta": ["not", "a", "dict"]}, "meta must be a dict"),
        ({"kind": 1, "meta": {"x": object()}}, "cannot be encoded"),
        ({"kind": 1, "epoch": 0}, "epoch 0"),
        ({"kind": 1, "job": 2**32}, "job must be 0..2\\*\\*32-1"),
        ({"kind": 1, "src": 0xFFFFFF}, "src must be a node id 0..16777214"),
        ({"kind": 1, "dst": 0xFFFFFF}, "dst must be a node id 0..16777214"),
        ({"kind": 1, "dst": -1}, "dst must be a node id"),
        ({"kind": 1, "relays": 256}, "relays must be 0..255"),
    ],
)
def test_bad_fields_are_clear_errors(kwargs: dict[str, object], err: str) -> None:
    with pytest.raises(MessageError, match=err):
        _wire.encode(**kwargs)  # type: ignore[arg-type]


def test_message_too_large_for_small_lane() -> None:
    with pytest.raises(MessageTooLargeError, match="takes at most 8"):
        _wire.encode(1, 1, meta={"b": b"x" * 500}, nslots=16)


def test_negative_id_is_refused() -> None:
    with pytest.raises(OverflowError):
        _wire.encode(1, -1)


# ---- metadata rules (issue 7: PROTOCOL.md section 5) -------------------------------------------
BAD_METAS = {
    "not a map": msgpack.packb([1, 2]),
    "trailing": msgpack.packb({"a": 1}) + b"\x00",
    "cut short": msgpack.packb({"a": "xyz"})[:-1],
    "ext": msgpack.packb({"a": msgpack.ExtType(3, b"zz")}),
    "timestamp": msgpack.packb({"a": msgpack.Timestamp(1, 0)}),
    "array key": b"\x81\x91\x01\x02",
    "map key": b"\x81\x81\x01\x02\x03",
    "bad utf-8": b"\x81\xa1\xff\x01",
    "surrogate": b"\x81\xa3\xed\xa0\x80\x01",
    "0xc1": b"\x81\xc1\x01",
    "too deep": b"\x81\x01" + b"\x91" * 32 + b"\x01",
    "too deep, empty innermost": b"\x81\x00" * 32 + b"\x80",  # issue 20 item 2
}


@pytest.mark.parametrize("name", sorted(BAD_METAS))
def test_invalid_metadata_is_refused_by_both_codecs(name: str) -> None:
    raw = BAD_METAS[name]
    assert _wire.check_meta(raw) is not None
    ncont = -(-len(raw) // 51)
    head = wire.head_body(1, ncont=ncont, meta_len=len(raw), id=1)
    slots = [wire.seal(head, wire.stamp(1, 0, 256))]
    for i in range(ncont):
        body = bytes([wire.CONT_KIND]) + raw[i * 51 : (i + 1) * 51].ljust(51, b"\0")
        slots.append(wire.seal(body, wire.stamp(1, 1 + i, 256)))
    with pytest.raises(wire.Reject, match="bad-meta"):
        wire.decode(slots, epoch=1, pos=0, nslots=256)
    with pytest.raises(CorruptSlotError, match="bad-meta"):
        _wire.decode(b"".join(slots), epoch=1, pos=0, nslots=256)


def test_valid_metadata_at_the_limits() -> None:
    deep: dict = {"a": 1}
    for _ in range(30):
        deep = {"d": deep}
    assert _wire.check_meta(msgpack.packb(deep)) is None  # 31 maps deep
    keys = {None: 1, True: 2, 3: 3, 1.5: 4, "s": 5, b"b": 6}
    assert _wire.check_meta(msgpack.packb(keys, use_bin_type=True)) is None
    with pytest.raises(MessageError, match="extension"):
        _wire.pack_meta({"t": msgpack.Timestamp(1, 0)})
    with pytest.raises(MessageError, match="nested deeper"):
        nested: list = [1]
        for _ in range(32):
            nested = [nested]
        _wire.pack_meta({"d": nested})


@pytest.mark.parametrize("innermost", [b"", b"\x01", b"\x80", b"\x90"])
@settings(max_examples=20)
@given(st.integers(0, 2**40 - 1))
def test_nesting_is_counted_the_same_whether_the_innermost_container_is_empty(
    innermost: bytes, pattern: int
) -> None:
    """The rule (docs/PROTOCOL.md section 5): at most META_DEPTH containers deep, the top map
    counting as 1, every container counted, empty or not; the C check and the mirror agree.

    At every depth up to 40: a top map, then containers (bit i of `pattern`: a map, else an
    array), each holding the next; the last holds `innermost`: nothing, a scalar, an empty
    map or an empty array."""
    for levels in range(41):
        kinds = [True] + [bool(pattern >> i & 1) for i in range(levels)]
        raw = b""
        for i, is_map in enumerate(kinds):
            n = 1 if i < len(kinds) - 1 or innermost else 0
            raw += bytes([(0x80 if is_map else 0x90) | n]) + (b"\x00" if is_map and n else b"")
        raw += innermost
        depth = len(kinds) + (1 if innermost in (b"\x80", b"\x90") else 0)
        ok = depth <= wire.META_DEPTH
        assert (_wire.check_meta(raw) is None) == ok, (depth, raw)
        assert _mirror_accepts(raw) == ok, (depth, raw)


def test_an_empty_container_one_level_too_deep_is_refused() -> None:
    assert _wire.check_meta(b"\x81\x00" * 31 + b"\x80") is None  # 32 deep
    assert _wire.check_meta(b"\x81\x00" * 32 + b"\x80") is not None  # 33 deep
    assert _wire.check_meta(b"\x81\x00" * 31 + b"\x90") is None
    assert _wire.check_meta(b"\x81\x00" * 32 + b"\x90") is not None


@given(st.binary(max_size=300))
def test_what_the_check_accepts_msgpack_decodes_to_a_map(raw: bytes) -> None:
    if raw and _wire.check_meta(raw) is None:
        assert isinstance(msgpack.unpackb(raw, raw=False, strict_map_key=False), dict)


@given(
    st.dictionaries(
        st.one_of(st.text(max_size=8), st.integers(-(2**63), 2**64 - 1), st.binary(max_size=8)),
        st.recursive(
            st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=20), st.binary()),
            lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=4),
            max_leaves=20,
        ),
        max_size=6,
    )
)
def test_what_a_sender_packs_the_check_accepts(meta: dict) -> None:
    raw = msgpack.packb(meta, use_bin_type=True)
    assert _wire.check_meta(raw) is None


def _mirror_accepts(raw: bytes) -> bool:
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception:
        return False
    return isinstance(value, dict) and wire.meta_ok(value)


@settings(max_examples=300)
@given(
    st.dictionaries(
        st.text(max_size=6),
        st.recursive(
            st.one_of(
                st.none(),
                st.integers(-(2**63), 2**64 - 1),
                st.floats(),
                st.text(max_size=10),
                st.binary(),
            ),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
            max_leaves=12,
        ),
        max_size=4,
    ),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    st.integers(-2, 2),
)
def test_c_check_and_mirror_agree_on_mutated_metadata(
    meta: dict, flips: list[tuple[int, int]], cut: int
) -> None:
    raw = bytearray(msgpack.packb(meta, use_bin_type=True))
    for at, byte in flips:
        raw[at % len(raw)] = byte
    if cut < 0:
        raw = raw[:cut] or raw
    elif cut > 0:
        raw += bytes(cut)
    assert (_wire.check_meta(bytes(raw)) is None) == _mirror_accepts(bytes(raw))


# ---- range checks of the pure-Python encoder (issue 8 item 3) ---------------------------------
@pytest.mark.parametrize(
    ("change", "err"),
    [
        ({"job": 2**32}, "job"),
        ({"src": 0xFFFFFF}, "src"),
        ({"dst": 2**24}, "dst"),
        ({"relays": 256}, "relays"),
    ],
)
def test_mirror_refuses_out_of_range_fields(change: dict[str, int], err: str) -> None:
    with pytest.raises(ValueError, match=err):
        wire.encode(Fields(kind=Kind.DISPATCH, **change), epoch=1, pos=0, nslots=64)


def test_a_v1_slot_is_not_a_v2_slot() -> None:
    """A v1 head (v1 struct layout, checksum right) does not decode as the message it was: a
    slot carries no version, which is why the lane does (shm header, verbs descriptor)."""
    v1 = struct.Struct("<BBBBHHIHBBQQQQIIQ")
    body = v1.pack(1, 0, 5, 0, 3, 100, 7, 0, 1, 0, 42, 9, 1, 2, 3, 0, 0)[:52]
    slot = wire.seal(body, wire.stamp(1, 0, 64))
    m = _wire.decode(slot, 1, 0, 64)
    assert (m.src, m.id, m.job) != (3, 42, 9)


# ---- the one argument check of every encoder takes integers only (issue 20 item 3) ----------
_FIELDS = ["kind", "id", "job", "priority", "flags", "arg0", "arg1", "arg2", "hops"]


@pytest.mark.parametrize("bad", [1.5, 1.0, True], ids=["float", "whole-float", "bool"])
@pytest.mark.parametrize("field", [*_FIELDS, "dst", "src", "relays"])
def test_every_encoder_refuses_a_field_that_is_not_an_integer(field: str, bad: object) -> None:
    args: dict[str, object] = {f: 0 for f in _FIELDS} | {"kind": Kind.DISPATCH, "src": 1}
    args[field] = bad
    pos = [args.pop(f) for f in _FIELDS]
    with pytest.raises(MessageError, match=f"{field} must be an integer"):
        _wire.encode(*pos, **args)
    with pytest.raises(MessageError, match=f"{field} must be an integer"):
        _ring.Batch(1).append(*pos, **args)
    name = f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"
    with shm.create_lane(name, 16) as rx, shm.attach_lane(name) as tx:
        with pytest.raises(MessageError, match=f"{field} must be an integer"):
            tx.send(*pos, timeout_us=0, **args)
        assert tx.stats()["sent"] == 0 and rx.poll() is None  # nothing was written


def test_an_int_enum_is_an_integer() -> None:
    b = _ring.Batch(1)
    b.append(Kind.DISPATCH, 7, flags=Kind.PREEMPT)
    assert (b[0].kind, b[0].id, b[0].flags) == (Kind.DISPATCH, 7, int(Kind.PREEMPT))
