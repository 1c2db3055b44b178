"""The wire format in plain Python: message kinds, flags, and a `struct` mirror of the slot.

The hot path encodes and decodes in Cython (`rdmasched._wire`, layout in
`cython/rdmasched/_wire.pxd`). This module is the same contract written independently from
docs/PROTOCOL.md, byte for byte, so tests can check one against the other and tools can read
slots without the extension. It is deliberately simple, not fast.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any

import msgpack

# node ids are 24-bit, 0xFFFFFF reserved (a head naming it as src or dst is malformed); `job`
# is a u32 in version 2: limits.py's bounds, named here too
from rdmasched.limits import JOB_MAX as JOB_MAX
from rdmasched.limits import NODE_MAX as NODE_MAX

#: The wire protocol version (docs/PROTOCOL.md): the lane carries it (the shm lane header,
#: the verbs lane descriptor), never the slot.
VERSION = 2
SLOT_SIZE = 64
CONT_PAYLOAD = 51
MAX_META = 4096
MAX_CONT = -(-MAX_META // CONT_PAYLOAD)

#: Head slot: kind flags priority ncont src(u24 as 3 bytes) relays dst(u24 as 3 bytes) hops
#: seq load meta_len job id arg0 arg1 arg2 crc stamp, little-endian, no padding (offsets in
#: docs/PROTOCOL.md section 2).
HEAD = struct.Struct("<BBBB3sB3sBIHHIQQQIIQ")
#: Continuation slot: kind (CONT), 51 bytes of metadata, crc, stamp.
CONT = struct.Struct("<B51sIQ")
assert HEAD.size == CONT.size == SLOT_SIZE


class Kind(IntEnum):
    """What a control message asks for."""

    # The fields of each kind, as docs/PROTOCOL.md section 4 (and 4.2) defines them; named
    # in code by rdmasched/messages.py.
    DISPATCH = 1  # run a task: id=task, job, priority, arg0=cost_ns, arg1=progress_ns,
    #               arg2=origin node (with START: the slot); hops; metadata=payload
    PREEMPT = 2  # stop a task (or every task of a job): id=task (0 with JOB), job,
    #              arg0=trigger time ns; flags CANCEL, JOB
    SYNC_READY = 3  # a member reached a step: id=group, job, arg0=step,
    #                 arg1=sender's clock ns, arg2=member node
    COMPLETE = 4  # a task finished (sent to its origin): id=task, job, arg0=runtime_ns,
    #               arg1=progress_ns, arg2=status (0 done, 1 yielded: central baseline only)
    HEARTBEAT = 5  # liveness: arg0=sender's clock ns, arg1=queued tasks, arg2=running
    #                tasks, metadata=incarnation map {"inc", "ack", "dead"}; load in the header


CONT_KIND = 0x7F


class Flag(IntFlag):
    """Per-kind flag bits (byte 1)."""

    NONE = 0
    CANCEL = 0x01  # PREEMPT: cancel the task instead of requeueing it
    JOB = 0x02  # PREEMPT: the target is every task of `job`, not task `id`
    SUBMITTED = 0x04  # DISPATCH: placed by submit(); a busy receiver may hand it back to its
    #                   origin, which places it again (hops counts placements, bounded)
    START = 0x08  # DISPATCH: run now on slot arg2 (the central baseline's coordinator only)
    RESENT = 0x10  # DISPATCH: sent again by its origin (a relay on its route died, or no
    #                answer): the target runs it only if it neither holds nor completed it
    GANG = 0x20  # DISPATCH: a gang member's reservation (hold a free slot, do not start);
    #              with COMMIT: start the member held. PREEMPT (with JOB, CANCEL): abort the
    #              sender's gang `job` here (docs/PROTOCOL.md section 12)
    COMMIT = 0x40  # DISPATCH with GANG: start the member whose slot is held


# ---- CRC-32C, bit by bit from its definition ----------------------------------------------------
def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF."""
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def slot_crc(slot: bytes) -> int:
    """The checksum a slot carries at bytes 52..55: CRC-32C of bytes [0,52) ++ [56,64)."""
    return crc32c(slot[:52] + slot[56:64])


def stamp(epoch: int, pos: int, nslots: int) -> int:
    """The stamp of the slot at lane position `pos`: (epoch << 32) | (lap mod 2**32)."""
    lap = pos // nslots
    return (epoch << 32) | (lap & 0xFFFFFFFF)


def seal(body: bytes, stamp_value: int) -> bytes:
    """Complete a slot from its first 52 bytes: add the checksum and the stamp."""
    assert len(body) == 52
    tail = struct.pack("<Q", stamp_value)
    return body + struct.pack("<I", crc32c(body + tail)) + tail


@dataclass(frozen=True)
class Fields:
    """A message's fields as they are on the wire (docs/PROTOCOL.md)."""

    kind: int
    id: int = 0
    job: int = 0
    priority: int = 0
    flags: int = 0
    arg0: int = 0
    arg1: int = 0
    arg2: int = 0
    hops: int = 0
    src: int = 0
    load: int = 0
    seq: int = 0
    meta: dict[Any, Any] | None = field(default=None, compare=True)
    dst: int = 0
    relays: int = 0


def head_body(
    kind: int,
    *,
    flags: int = 0,
    priority: int = 0,
    ncont: int = 0,
    src: int = 0,
    relays: int = 0,
    dst: int = 0,
    hops: int = 0,
    seq: int = 0,
    load: int = 0,
    meta_len: int = 0,
    job: int = 0,
    id: int = 0,
    arg0: int = 0,
    arg1: int = 0,
    arg2: int = 0,
) -> bytes:
    """Bytes 0..51 of a head slot with these field values as they are (no rule checked:
    tests build damaged heads with it); `seal` completes the slot."""
    return HEAD.pack(
        kind,
        flags,
        priority,
        ncont,
        src.to_bytes(3, "little"),
        relays,
        dst.to_bytes(3, "little"),
        hops,
        seq,
        load,
        meta_len,
        job,
        id,
        arg0,
        arg1,
        arg2,
        0,
        0,
    )[:52]


def _check_range(f: Fields) -> None:
    for name, value, hi in (("src", f.src, NODE_MAX), ("dst", f.dst, NODE_MAX)):
        if not 0 <= value <= hi:
            raise ValueError(f"{name} must be a node id 0..{hi}, not {value}")
    if not 0 <= f.job <= JOB_MAX:
        raise ValueError(f"job must be 0..2**32-1, not {f.job}")
    if not 0 <= f.relays <= 255:
        raise ValueError(f"relays must be 0..255, not {f.relays}")


def encode(f: Fields, *, epoch: int, pos: int, nslots: int) -> list[bytes]:
    """The slots of message `f` written at lane position `pos`: head first, then its
    continuation slots (at pos+1, pos+2, ...)."""
    _check_range(f)
    raw = msgpack.packb(f.meta, use_bin_type=True) if f.meta is not None else b""
    if len(raw) > MAX_META:
        raise ValueError(f"metadata is {len(raw)} bytes; the bound is {MAX_META}")
    ncont = -(-len(raw) // CONT_PAYLOAD)
    head = head_body(
        f.kind,
        flags=f.flags,
        priority=f.priority,
        ncont=ncont,
        src=f.src,
        relays=f.relays,
        dst=f.dst,
        hops=f.hops,
        seq=f.seq,
        load=f.load,
        meta_len=len(raw),
        job=f.job,
        id=f.id,
        arg0=f.arg0,
        arg1=f.arg1,
        arg2=f.arg2,
    )
    slots = [seal(head, stamp(epoch, pos, nslots))]
    for i in range(ncont):
        chunk = raw[i * CONT_PAYLOAD : (i + 1) * CONT_PAYLOAD].ljust(CONT_PAYLOAD, b"\0")
        body = bytes([CONT_KIND]) + chunk
        slots.append(seal(body, stamp(epoch, pos + 1 + i, nslots)))
    return slots


META_DEPTH = 32
_SCALAR_KEYS = (type(None), bool, int, float, str, bytes)


def meta_ok(value: Any, depth: int = 1) -> bool:
    """The metadata rules msgpack itself does not check (docs/PROTOCOL.md section 5):
    scalar map keys, no extension types, containers nested at most META_DEPTH deep."""
    if isinstance(value, (msgpack.ExtType, msgpack.Timestamp)):
        return False
    if isinstance(value, (list, dict)):
        if depth > META_DEPTH:
            return False
        if isinstance(value, dict):
            if not all(isinstance(k, _SCALAR_KEYS) for k in value):
                return False
            items: Any = value.values()
        else:
            items = value
        return all(meta_ok(v, depth + 1) for v in items)
    return True


class Reject(ValueError):
    """Why `decode` refused a message (the receiver's reasons, docs/PROTOCOL.md)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def check_slot(slot: bytes, *, epoch: int, pos: int, nslots: int) -> None:
    """Raise Reject unless `slot` is current at `pos` (stamp) and whole (checksum)."""
    if len(slot) != SLOT_SIZE:
        raise Reject("truncated")
    (got,) = struct.unpack_from("<Q", slot, 56)
    if got != stamp(epoch, pos, nslots):
        raise Reject("empty")
    (crc,) = struct.unpack_from("<I", slot, 52)
    if crc != slot_crc(slot):
        raise Reject("bad-crc")


def decode(slots: list[bytes], *, epoch: int, pos: int, nslots: int) -> Fields:
    """Apply the receiver's rules to the slots at pos, pos+1, ...; Reject(reason) if any fails."""
    if not slots:
        raise Reject("truncated")
    check_slot(slots[0], epoch=epoch, pos=pos, nslots=nslots)
    (
        kind,
        flags,
        prio,
        ncont,
        src3,
        relays,
        dst3,
        hops,
        seq,
        load,
        meta_len,
        job,
        id_,
        arg0,
        arg1,
        arg2,
        _crc,
        _stamp,
    ) = HEAD.unpack(slots[0])
    src = int.from_bytes(src3, "little")
    dst = int.from_bytes(dst3, "little")
    if (
        kind not in Kind.__members__.values()
        or src > NODE_MAX
        or dst > NODE_MAX
        or meta_len > MAX_META
        or ncont != -(-meta_len // CONT_PAYLOAD)
        or 1 + ncont > nslots // 2
    ):
        raise Reject("malformed")
    if len(slots) < 1 + ncont:
        raise Reject("truncated")
    raw = b""
    for i in range(ncont):
        c = slots[1 + i]
        check_slot(c, epoch=epoch, pos=pos + 1 + i, nslots=nslots)
        if c[0] != CONT_KIND:
            raise Reject("malformed")
        raw += c[1:52]
    meta = None
    if meta_len:
        if raw[meta_len:].strip(b"\0"):
            raise Reject("bad-meta")  # non-zero padding
        try:
            meta = msgpack.unpackb(raw[:meta_len], raw=False, strict_map_key=False)
        except Exception:  # not msgpack, cut short, trailing bytes, bad UTF-8, unhashable key
            raise Reject("bad-meta") from None
        if not isinstance(meta, dict) or not meta_ok(meta):
            raise Reject("bad-meta")
    return Fields(
        kind=kind,
        id=id_,
        job=job,
        priority=prio,
        flags=flags,
        arg0=arg0,
        arg1=arg1,
        arg2=arg2,
        hops=hops,
        src=src,
        load=load,
        seq=seq,
        meta=meta,
        dst=dst,
        relays=relays,
    )
