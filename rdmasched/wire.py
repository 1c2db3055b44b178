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

SLOT_SIZE = 64
CONT_PAYLOAD = 51
MAX_META = 4096
MAX_CONT = -(-MAX_META // CONT_PAYLOAD)

#: Head slot: kind flags priority ncont src load seq meta_len hops reserved id job arg0 arg1
#: arg2 crc stamp, little-endian, no padding (offsets in docs/PROTOCOL.md).
HEAD = struct.Struct("<BBBBHHIHBBQQQQIIQ")
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


def encode(f: Fields, *, epoch: int, pos: int, nslots: int) -> list[bytes]:
    """The slots of message `f` written at lane position `pos`: head first, then its
    continuation slots (at pos+1, pos+2, ...)."""
    raw = msgpack.packb(f.meta, use_bin_type=True) if f.meta is not None else b""
    if len(raw) > MAX_META:
        raise ValueError(f"metadata is {len(raw)} bytes; the bound is {MAX_META}")
    ncont = -(-len(raw) // CONT_PAYLOAD)
    head = HEAD.pack(
        f.kind,
        f.flags,
        f.priority,
        ncont,
        f.src,
        f.load,
        f.seq,
        len(raw),
        f.hops,
        0,
        f.id,
        f.job,
        f.arg0,
        f.arg1,
        f.arg2,
        0,
        0,
    )[:52]
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
        src,
        load,
        seq,
        meta_len,
        hops,
        reserved,
        id_,
        job,
        arg0,
        arg1,
        arg2,
        _crc,
        _stamp,
    ) = HEAD.unpack(slots[0])
    if (
        kind not in Kind.__members__.values()
        or reserved != 0
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
    )
