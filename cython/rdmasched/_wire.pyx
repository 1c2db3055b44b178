# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, freethreading_compatible=False
"""Slot encode/decode (the codec the ring uses), exposed to Python for tests and tools.

The hot loops in `_ring` call the inline functions of `_wire.pxd` directly; this module adds
the `Message` type, argument checking, and byte-level `encode`/`decode` that tests compare
with the `struct` mirror in `rdmasched/wire.py`.
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memset
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING

cimport cython

import msgpack

from rdmasched.errors import CorruptSlotError, MessageError, MessageTooLargeError

rs_crc32c_init()


# Byte offsets of the head slot's fields: docs/PROTOCOL.md's table, checked against the struct.
SLOT_OFFSETS = {"kind": 0, "flags": 1, "priority": 2, "ncont": 3, "src": 4, "load": 6,
                "seq": 8, "meta_len": 12, "hops": 14, "reserved": 15, "id": 16, "job": 24,
                "arg0": 32, "arg1": 40, "arg2": 48, "crc": 52, "stamp": 56}


cdef int _check_layout() except -1:
    cdef rs_slot s
    cdef rs_cont c
    cdef char *b = <char *>&s
    offsets = {
        "kind": <char *>&s.kind - b, "flags": <char *>&s.flags - b,
        "priority": <char *>&s.priority - b, "ncont": <char *>&s.ncont - b,
        "src": <char *>&s.src - b, "load": <char *>&s.load - b, "seq": <char *>&s.seq - b,
        "meta_len": <char *>&s.meta_len - b, "hops": <char *>&s.hops - b,
        "reserved": <char *>&s.reserved - b, "id": <char *>&s.id - b, "job": <char *>&s.job - b,
        "arg0": <char *>&s.arg0 - b, "arg1": <char *>&s.arg1 - b, "arg2": <char *>&s.arg2 - b,
        "crc": <char *>&s.crc - b, "stamp": <char *>&s.stamp - b,
    }
    if offsets != SLOT_OFFSETS or sizeof(rs_slot) != SLOT_SIZE or sizeof(rs_cont) != SLOT_SIZE:
        raise ImportError(f"rdmasched: slot layout differs from PROTOCOL.md: {offsets}")
    if <char *>&c.data - <char *>&c != 1 or <char *>&c.crc - <char *>&c != CRC_OFFSET:
        raise ImportError("rdmasched: continuation slot layout differs from PROTOCOL.md")
    return 0


_check_layout()

SLOT_BYTES = SLOT_SIZE
CONT_BYTES = CONT_PAYLOAD
META_MAX = MAX_META
KIND_NAMES = {
    KIND_DISPATCH: "DISPATCH",
    KIND_PREEMPT: "PREEMPT",
    KIND_SYNC_READY: "SYNC_READY",
    KIND_COMPLETE: "COMPLETE",
    KIND_HEARTBEAT: "HEARTBEAT",
}


@cython.freelist(256)
@cython.final
cdef class Message:
    """One delivered control message. Fields are the slot's (docs/PROTOCOL.md)."""

    def __repr__(self):
        name = KIND_NAMES.get(self.kind, str(self.kind))
        return (f"Message({name}, id={self.id}, job={self.job}, priority={self.priority}, "
                f"src={self.src}, seq={self.seq}, arg0={self.arg0}, arg1={self.arg1}, "
                f"arg2={self.arg2}, flags={self.flags}, hops={self.hops}, load={self.load}, "
                f"meta={self.meta!r})")

    def __eq__(self, other):
        if not isinstance(other, Message):
            return NotImplemented
        return self.astuple() == (<Message>other).astuple()

    def __hash__(self):
        return hash(self.astuple())

    def astuple(self):
        return (self.kind, self.flags, self.priority, self.hops, self.src, self.load, self.seq,
                self.id, self.job, self.arg0, self.arg1, self.arg2, self.meta)

    def asdict(self):
        return {"kind": self.kind, "flags": self.flags, "priority": self.priority,
                "hops": self.hops, "src": self.src, "load": self.load, "seq": self.seq,
                "id": self.id, "job": self.job, "arg0": self.arg0, "arg1": self.arg1,
                "arg2": self.arg2, "meta": self.meta}


cdef Message message_from_c(const rs_msg *m, const uint8_t *meta):
    """Build the Python message; raises CorruptSlotError if the metadata is not msgpack."""
    cdef Message out = Message.__new__(Message)
    out.kind = m.kind
    out.flags = m.flags
    out.priority = m.priority
    out.hops = m.hops
    out.src = m.src
    out.load = m.load
    out.seq = m.seq
    out.arg2 = m.arg2
    out.id = m.id
    out.job = m.job
    out.arg0 = m.arg0
    out.arg1 = m.arg1
    out.lane = m.lane
    if m.meta_len:
        raw = PyBytes_FromStringAndSize(<const char *>meta + m.meta_off, m.meta_len)
        out.meta = unpack_meta(raw)
    else:
        out.meta = None
    return out


def unpack_meta(bytes raw):
    """Decode a message's metadata: a msgpack map, or CorruptSlotError."""
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise CorruptSlotError("bad-meta", f"metadata is not msgpack ({exc})") from None
    if not isinstance(value, dict):
        raise CorruptSlotError("bad-meta", f"metadata is a {type(value).__name__}, not a map")
    return value


def pack_meta(meta):
    """Encode metadata (a dict) with msgpack, enforcing the size bound. Nothing is written."""
    if not isinstance(meta, dict):
        raise MessageError(f"meta must be a dict, not {type(meta).__name__}")
    try:
        raw = msgpack.packb(meta, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise MessageError(f"meta cannot be encoded with msgpack: {exc}") from None
    if len(raw) > MAX_META:
        raise MessageTooLargeError(
            f"meta is {len(raw)} bytes encoded; the bound is {MAX_META} bytes")
    return raw


cdef int msg_from_args(rs_msg *m, int kind, unsigned long long id, unsigned long long job,
                       int priority, int flags, unsigned long long arg0,
                       unsigned long long arg1, unsigned int arg2, int hops) except -1:
    if kind < 1 or kind > KIND_MAX:
        raise MessageError(f"unknown message kind {kind}; known: {sorted(KIND_NAMES)}")
    if priority < 0 or priority > 255:
        raise MessageError(f"priority must be 0..255, not {priority}")
    if flags < 0 or flags > 255:
        raise MessageError(f"flags must be 0..255, not {flags}")
    if hops < 0 or hops > 255:
        raise MessageError(f"hops must be 0..255, not {hops}")
    m.kind = <uint8_t>kind
    m.flags = <uint8_t>flags
    m.priority = <uint8_t>priority
    m.hops = <uint8_t>hops
    m.id = id
    m.job = job
    m.arg0 = arg0
    m.arg1 = arg1
    m.arg2 = arg2
    m.meta_len = 0
    m.meta_off = 0
    m.lane = 0
    return 0


cdef uint32_t _shift_of(uint32_t nslots) except? 0:
    if nslots < 16 or nslots > (1 << 20) or (nslots & (nslots - 1)) != 0:
        raise ValueError(f"nslots must be a power of two in 16..{1 << 20}, not {nslots}")
    cdef uint32_t shift = 0
    while (1u << shift) < nslots:
        shift += 1
    return shift


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of a bytes-like object, as the slot checksum uses it."""
    cdef const uint8_t[::1] view = data
    if view.shape[0] == 0:
        return 0
    return rs_crc32c(&view[0], view.shape[0])


def encode(int kind, unsigned long long id=0, unsigned long long job=0, int priority=0,
           int flags=0, unsigned long long arg0=0, unsigned long long arg1=0,
           unsigned int arg2=0, int hops=0, int src=0, int load=0, unsigned int seq=0,
           meta=None, unsigned int epoch=1, unsigned long long pos=0,
           unsigned int nslots=256) -> bytes:
    """The bytes of one message as it sits in a lane of `nslots` at position `pos`.

    `meta` is a dict (msgpack-encoded here) or, for tests, bytes used as they are.

    Returns (1 + continuation slots) * 64 bytes: the head slot first, then the continuation
    slots in position order (in a ring they may wrap; each slot's stamp uses its own position).
    """
    cdef rs_msg m
    cdef rs_slot tmp
    cdef uint32_t shift = _shift_of(nslots)
    cdef uint32_t ncont, i
    cdef bytes raw = b""
    if src < 0 or src > 0xFFFF or load < 0 or load > 0xFFFF:
        raise MessageError("src and load must be 0..65535")
    if epoch == 0:
        raise MessageError("epoch 0 is never valid (fresh memory is zero)")
    msg_from_args(&m, kind, id, job, priority, flags, arg0, arg1, arg2, hops)
    m.src = <uint16_t>src
    m.load = <uint16_t>load
    if meta is not None:
        raw = bytes(meta) if isinstance(meta, (bytes, bytearray)) else pack_meta(meta)
        m.meta_len = len(raw)
    ncont = rs_ncont(m.meta_len)
    if 1 + ncont > nslots // 2:
        raise MessageTooLargeError(f"message needs {1 + ncont} slots; a lane of {nslots} "
                                   f"takes at most {nslots // 2}")
    out = PyBytes_FromStringAndSize(NULL, (1 + ncont) * SLOT_SIZE)
    cdef rs_slot *dst = <rs_slot *>PyBytes_AS_STRING(out)
    memset(&tmp, 0, sizeof(tmp))
    rs_fill_head(&tmp, &m, seq)
    rs_store_slot(&dst[0], &tmp, rs_stamp(epoch, pos, shift))
    for i in range(ncont):
        memset(&tmp, 0, sizeof(tmp))
        rs_fill_cont(&tmp, <const uint8_t *>(<char *>raw), m.meta_len, i)
        rs_store_slot(&dst[1 + i], &tmp, rs_stamp(epoch, pos + 1 + i, shift))
    return out


def decode(data, unsigned int epoch=1, unsigned long long pos=0,
           unsigned int nslots=256) -> Message:
    """Decode the bytes `encode` produced (head then continuation slots) at `pos`.

    Applies every rule the receiver applies and raises CorruptSlotError(reason) where one
    fails: 'empty' (stamp is not this position's), 'bad-crc', 'malformed', 'truncated',
    'bad-meta'.
    """
    cdef const uint8_t[::1] view = data
    cdef uint32_t shift = _shift_of(nslots)
    cdef rs_slot head, cont
    cdef rs_msg m
    cdef uint32_t i, n
    cdef int st
    if view.shape[0] < SLOT_SIZE or view.shape[0] % SLOT_SIZE:
        raise CorruptSlotError("truncated", f"{view.shape[0]} bytes is not a whole number of slots")
    cdef const rs_slot *s = <const rs_slot *>&view[0]
    st = rs_read_slot(&s[0], rs_stamp(epoch, pos, shift), &head)
    _raise_for(st, "head slot")
    if head.kind == KIND_CONT or not rs_head_valid(&head, nslots):
        raise CorruptSlotError("malformed", "head slot breaks a field rule")
    n = head.ncont
    if <Py_ssize_t>(1 + n) * SLOT_SIZE > view.shape[0]:
        raise CorruptSlotError("truncated", f"head announces {n} continuation slots, "
                               f"{view.shape[0] // SLOT_SIZE - 1} present")
    meta = bytearray(n * CONT_PAYLOAD)
    for i in range(n):
        st = rs_read_slot(&s[1 + i], rs_stamp(epoch, pos + 1 + i, shift), &cont)
        _raise_for(st, f"continuation slot {i}")
        if cont.kind != KIND_CONT:
            raise CorruptSlotError("malformed", f"continuation slot {i} is not marked CONT")
        meta[i * CONT_PAYLOAD:(i + 1) * CONT_PAYLOAD] = (<rs_cont *>&cont).data[:CONT_PAYLOAD]
    rs_msg_from_head(&m, &head)
    m.meta_off = 0
    m.lane = 0
    cdef bytes meta_bytes = bytes(meta)
    return message_from_c(&m, <const uint8_t *>(<char *>meta_bytes))


cdef int _raise_for(int st, str what) except -1:
    if st == SLOT_EMPTY:
        raise CorruptSlotError("empty", f"{what}: stamp is not the one this position expects "
                               "(earlier lap or epoch, or never written)")
    if st == SLOT_BAD_CRC:
        raise CorruptSlotError("bad-crc", f"{what}: checksum does not match")
    return 0
