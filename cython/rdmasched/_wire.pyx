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
from cpython.number cimport PyNumber_Index

cimport cython

import msgpack

from rdmasched.errors import CorruptSlotError, MessageError, MessageTooLargeError

rs_crc32c_init()


# Byte offsets of the head slot's fields: docs/PROTOCOL.md's table, checked against the struct.
SLOT_OFFSETS = {"kind": 0, "flags": 1, "priority": 2, "ncont": 3, "src": 4, "relays": 7,
                "dst": 8, "hops": 11, "seq": 12, "load": 16, "meta_len": 18, "job": 20,
                "id": 24, "arg0": 32, "arg1": 40, "arg2": 48, "crc": 52, "stamp": 56}


cdef int _check_layout() except -1:
    cdef rs_slot s
    cdef rs_cont c
    cdef char *b = <char *>&s
    # src and relays share a little-endian u32 (src in its low three bytes), as do dst and
    # hops: the byte after each node id is the u32's top byte
    offsets = {
        "kind": <char *>&s.kind - b, "flags": <char *>&s.flags - b,
        "priority": <char *>&s.priority - b, "ncont": <char *>&s.ncont - b,
        "src": <char *>&s.src_relays - b, "relays": <char *>&s.src_relays - b + 3,
        "dst": <char *>&s.dst_hops - b, "hops": <char *>&s.dst_hops - b + 3,
        "seq": <char *>&s.seq - b, "load": <char *>&s.load - b,
        "meta_len": <char *>&s.meta_len - b, "job": <char *>&s.job - b, "id": <char *>&s.id - b,
        "arg0": <char *>&s.arg0 - b, "arg1": <char *>&s.arg1 - b, "arg2": <char *>&s.arg2 - b,
        "crc": <char *>&s.crc - b, "stamp": <char *>&s.stamp - b,
    }
    if offsets != SLOT_OFFSETS or sizeof(rs_slot) != SLOT_SIZE or sizeof(rs_cont) != SLOT_SIZE:
        raise ImportError(f"rdmasched: slot layout differs from PROTOCOL.md: {offsets}")
    if <char *>&c.data - <char *>&c != 1 or <char *>&c.crc - <char *>&c != CRC_OFFSET:
        raise ImportError("rdmasched: continuation slot layout differs from PROTOCOL.md")
    return 0


_check_layout()

#: the wire protocol version this codec speaks (docs/PROTOCOL.md); lanes carry it
WIRE_VERSION = WIRE_VERSION_2
#: the largest node id (0xFFFFFF is reserved)
NODE_MAX = NODE_NONE - 1
JOB_MAX = 0xFFFFFFFF
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
                f"src={self.src}, dst={self.dst}, relays={self.relays}, seq={self.seq}, "
                f"arg0={self.arg0}, arg1={self.arg1}, arg2={self.arg2}, flags={self.flags}, "
                f"hops={self.hops}, load={self.load}, meta={self.meta!r})")

    def __eq__(self, other):
        if not isinstance(other, Message):
            return NotImplemented
        return self.astuple() == (<Message>other).astuple()

    def __hash__(self):
        return hash(self.astuple())

    def astuple(self):
        return (self.kind, self.flags, self.priority, self.hops, self.src, self.load, self.seq,
                self.id, self.job, self.arg0, self.arg1, self.arg2, self.meta, self.dst,
                self.relays)

    def asdict(self):
        return {"kind": self.kind, "flags": self.flags, "priority": self.priority,
                "hops": self.hops, "src": self.src, "load": self.load, "seq": self.seq,
                "id": self.id, "job": self.job, "arg0": self.arg0, "arg1": self.arg1,
                "arg2": self.arg2, "meta": self.meta, "dst": self.dst, "relays": self.relays}


cdef Message message_from_c(const rs_msg *m, const uint8_t *meta):
    """Build the Python message; raises CorruptSlotError if the metadata is not msgpack."""
    cdef Message out = Message.__new__(Message)
    out.kind = m.kind
    out.flags = m.flags
    out.priority = m.priority
    out.hops = m.hops
    out.src = m.src
    out.dst = m.dst
    out.relays = m.relays
    out.load = m.load
    out.seq = m.seq
    out.arg2 = m.arg2
    out.id = m.id
    out.job = m.job
    out.arg0 = m.arg0
    out.arg1 = m.arg1
    out.lane = m.lane
    if m.meta_len:
        # The receiver checked the bytes (rs_meta_check) before it let the message through.
        raw = PyBytes_FromStringAndSize(<const char *>meta + m.meta_off, m.meta_len)
        try:
            out.meta = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:
            raise CorruptSlotError("bad-meta", f"metadata is not msgpack ({exc})") from None
    else:
        out.meta = None
    return out


META_PROBLEMS = {
    META_NOT_MSGPACK: "not msgpack (a byte that starts no object, or an object cut short)",
    META_NOT_MAP: "not a msgpack map",
    META_TRAILING: "bytes follow the map",
    META_EXT: "an extension type",
    META_KEY: "a map key that is an array or a map",
    META_UTF8: "a str that is not valid UTF-8",
    META_DEEP: f"containers nested deeper than {META_DEPTH}",
    META_PADDING: "non-zero padding after the metadata",
}
META_NESTING = META_DEPTH


cdef inline uint32_t _be(const uint8_t *p, uint32_t k) noexcept nogil:
    cdef uint32_t v = 0, j
    for j in range(k):
        v = (v << 8) | p[j]
    return v


cdef int _utf8_ok(const uint8_t *s, uint32_t n) noexcept nogil:
    """Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF)."""
    cdef uint32_t i = 0, k, j
    cdef uint8_t c, lo, hi
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        lo = 0x80
        hi = 0xBF
        if c < 0xC2:
            return 0
        elif c < 0xE0:
            k = 1
        elif c < 0xF0:
            k = 2
            if c == 0xE0:
                lo = 0xA0
            elif c == 0xED:
                hi = 0x9F
        elif c < 0xF5:
            k = 3
            if c == 0xF0:
                lo = 0x90
            elif c == 0xF4:
                hi = 0x8F
        else:
            return 0
        if n - i - 1 < k:
            return 0
        if s[i + 1] < lo or s[i + 1] > hi:
            return 0
        for j in range(2, k + 1):
            if s[i + j] < 0x80 or s[i + j] > 0xBF:
                return 0
        i += k + 1
    return 1


cdef int rs_meta_check(const uint8_t *p, uint32_t n) noexcept nogil:
    """META_OK if p[0:n] is valid metadata (docs/PROTOCOL.md section 5), else why not.

    Valid: exactly one msgpack map filling all n bytes; keys are scalars (nil, bool, int,
    float, str, bin); no extension types; every str valid UTF-8; containers nested at most
    META_DEPTH deep (the top map is 1, an empty container counts). One pass, no
    allocation, no GIL.
    """
    cdef uint64_t left[META_DEPTH]     # items still to read in each open container
    cdef uint8_t inmap[META_DEPTH]
    cdef uint32_t depth = 0, i = 0, k, blen
    cdef uint64_t cnt
    cdef uint8_t b
    cdef int container            # 0 scalar, 1 array, 2 map
    cdef bint key, top = True
    while True:
        key = (not top and inmap[depth - 1] and (left[depth - 1] & 1) == 0)
        if i >= n:
            return META_NOT_MSGPACK
        b = p[i]
        i += 1
        container = 0
        cnt = 0
        k = 0                     # fixed-size payload bytes after the type byte
        blen = 0                  # str/bin length bytes (big-endian) after the type byte
        if b <= 0x7F or b >= 0xE0 or b == 0xC0 or b == 0xC2 or b == 0xC3:
            pass
        elif b <= 0x8F:
            container = 2
            cnt = b & 0x0F
        elif b <= 0x9F:
            container = 1
            cnt = b & 0x0F
        elif b <= 0xBF:
            if n - i < <uint32_t>(b & 0x1F):
                return META_NOT_MSGPACK
            if not _utf8_ok(p + i, b & 0x1F):
                return META_UTF8
            i += b & 0x1F
        elif b == 0xC1:
            return META_NOT_MSGPACK
        elif b >= 0xC4 and b <= 0xC6:
            blen = 1u << (b - 0xC4)
        elif (b >= 0xC7 and b <= 0xC9) or (b >= 0xD4 and b <= 0xD8):
            return META_EXT
        elif b == 0xCA:
            k = 4
        elif b == 0xCB:
            k = 8
        elif b >= 0xCC and b <= 0xCF:
            k = 1u << (b - 0xCC)
        elif b >= 0xD0 and b <= 0xD3:
            k = 1u << (b - 0xD0)
        elif b >= 0xD9 and b <= 0xDB:
            blen = 1u << (b - 0xD9)
        else:                     # 0xDC..0xDF: array16/32, map16/32
            k = 2 if (b == 0xDC or b == 0xDE) else 4
            if n - i < k:
                return META_NOT_MSGPACK
            cnt = _be(p + i, k)
            i += k
            k = 0
            container = 1 if b <= 0xDD else 2
        if blen:
            if n - i < blen:
                return META_NOT_MSGPACK
            k = _be(p + i, blen)
            i += blen
            if n - i < k:
                return META_NOT_MSGPACK
            if b >= 0xD9 and not _utf8_ok(p + i, k):
                return META_UTF8
        if n - i < k:
            return META_NOT_MSGPACK
        i += k
        if top and container != 2:
            return META_NOT_MAP
        if key and container:
            return META_KEY
        if not top:
            left[depth - 1] -= 1
        top = False
        if container:
            if container == 2:
                cnt *= 2
            if cnt > n - i:       # every item takes at least one byte
                return META_NOT_MSGPACK
            if depth == META_DEPTH:   # a container counts, empty or not
                return META_DEEP
            if cnt:
                left[depth] = cnt
                inmap[depth] = container == 2
                depth += 1
        while depth and left[depth - 1] == 0:
            depth -= 1
        if depth == 0:
            break
    return META_OK if i == n else META_TRAILING


def check_meta(raw) -> str | None:
    """Why `raw` is not valid metadata (docs/PROTOCOL.md section 5), or None if it is.

    The same check the receiver applies, in C; `pack_meta` applies it to what it encodes.
    """
    cdef const uint8_t[::1] view = raw
    cdef int rc
    if view.shape[0] == 0 or view.shape[0] > MAX_META:
        return "empty" if view.shape[0] == 0 else f"more than {MAX_META} bytes"
    rc = rs_meta_check(&view[0], <uint32_t>view.shape[0])
    return META_PROBLEMS[rc] if rc else None


def unpack_meta(bytes raw):
    """Decode a message's metadata: a msgpack map, or CorruptSlotError."""
    problem = check_meta(raw)
    if problem is not None:
        raise CorruptSlotError("bad-meta", f"metadata is {problem}")
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise CorruptSlotError("bad-meta", f"metadata is not msgpack ({exc})") from None
    if not isinstance(value, dict):
        raise CorruptSlotError("bad-meta", f"metadata is a {type(value).__name__}, not a map")
    return value


def pack_meta(meta):
    """Encode metadata (a dict) with msgpack, enforcing the rules the receiver checks
    (size bound, scalar keys, no extension types, nesting). Nothing is written."""
    cdef bytes raw
    if not isinstance(meta, dict):
        raise MessageError(f"meta must be a dict, not {type(meta).__name__}")
    try:
        raw = msgpack.packb(meta, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise MessageError(f"meta cannot be encoded with msgpack: {exc}") from None
    if len(raw) > MAX_META:
        raise MessageTooLargeError(
            f"meta is {len(raw)} bytes encoded; the bound is {MAX_META} bytes")
    cdef int rc = rs_meta_check(<const uint8_t *>(<char *>raw), <uint32_t>len(raw))
    if rc:
        raise MessageError(f"meta is not valid rdmasched metadata: it has {META_PROBLEMS[rc]} "
                           "(docs/PROTOCOL.md section 5)")
    return raw


cdef inline object _int(str name, object v):
    """`v` if it is an int (an int subclass or integer type: its value), else MessageError:
    never a float (it would be truncated) nor a bool."""
    if type(v) is int:
        return v
    if not isinstance(v, (bool, float)) and type(v).__name__ != "bool_":
        try:
            return PyNumber_Index(v)
        except TypeError:
            pass
    raise MessageError(f"{name} must be an integer, not {type(v).__name__} {v!r}")


#: the int 0 (one object in CPython): the default of most fields, taken without a conversion
cdef object _ZERO = 0


cdef long long _slow_ll(str name, object v) except? -1:
    """`v`, not an exact int: an integer type by its index (`_int`), as a C long long."""
    return _int(name, v)


cdef unsigned long long _slow_u64(str name, object v) except? 0xFFFFFFFFFFFFFFFF:
    """`v`, not an exact int: an integer type by its index (`_int`), as a u64."""
    return _int(name, v)


cdef int msg_from_args(rs_msg *m, object kind, object id, object job, object priority,
                       object flags, object arg0, object arg1, object arg2,
                       object hops) except -1:
    """The header fields of a message to send, each checked (an integer, in its field's
    range): the one check of every encoder (`TxLane.send`, `Batch.append`, `encode`).

    An exact int, the common case, goes straight to its C type (OverflowError past it, as a
    C-typed argument gives), and no argument is rebound (no reference counting on the way);
    anything else goes through `_int` (an integer type by its index, never a float or a
    bool). The range checks are in C."""
    cdef long long k, p, f, h, j
    cdef unsigned long long i, a0, a1
    cdef unsigned int a2
    if kind is _ZERO:  # a default: no conversion
        k = 0
    elif type(kind) is int:
        k = kind
    else:
        k = _slow_ll("kind", kind)
    if priority is _ZERO:  # a default: no conversion
        p = 0
    elif type(priority) is int:
        p = priority
    else:
        p = _slow_ll("priority", priority)
    if flags is _ZERO:  # a default: no conversion
        f = 0
    elif type(flags) is int:
        f = flags
    else:
        f = _slow_ll("flags", flags)
    if hops is _ZERO:  # a default: no conversion
        h = 0
    elif type(hops) is int:
        h = hops
    else:
        h = _slow_ll("hops", hops)
    if job is _ZERO:  # a default: no conversion
        j = 0
    elif type(job) is int:
        j = job
    else:
        j = _slow_ll("job", job)
    if id is _ZERO:  # a default: no conversion
        i = 0
    elif type(id) is int:
        i = id
    else:
        i = _slow_u64("id", id)
    if arg0 is _ZERO:  # a default: no conversion
        a0 = 0
    elif type(arg0) is int:
        a0 = arg0
    else:
        a0 = _slow_u64("arg0", arg0)
    if arg1 is _ZERO:  # a default: no conversion
        a1 = 0
    elif type(arg1) is int:
        a1 = arg1
    else:
        a1 = _slow_u64("arg1", arg1)
    if arg2 is _ZERO:  # a default: no conversion
        a2 = 0
    elif type(arg2) is int:
        a2 = arg2
    else:
        a2 = <unsigned int>_slow_u64("arg2", arg2)
    if k < 1 or k > KIND_MAX:
        raise MessageError(f"unknown message kind {k}; known: {sorted(KIND_NAMES)}")
    if p < 0 or p > 255:
        raise MessageError(f"priority must be 0..255, not {p}")
    if f < 0 or f > 255:
        raise MessageError(f"flags must be 0..255, not {f}")
    if h < 0 or h > 255:
        raise MessageError(f"hops must be 0..255, not {h}")
    if j < 0 or j > 0xFFFFFFFF:
        raise MessageError(f"job must be 0..2**32-1 (a u32 since wire version 2), not {j}")
    m.id = i
    m.arg0 = a0
    m.arg1 = a1
    m.arg2 = a2
    m.kind = <uint8_t>k
    m.flags = <uint8_t>f
    m.priority = <uint8_t>p
    m.hops = <uint8_t>h
    m.relays = 0
    m.src = SRC_LANE
    m.dst = 0
    m.job = <uint32_t>j
    m.meta_len = 0
    m.meta_off = 0
    m.lane = 0
    return 0


cdef int msg_route(rs_msg *m, object dst, object src, object relays) except -1:
    """The routing fields: final destination `dst`, origin `src` (< 0: the sending lane's
    own node id) and `relays` so far. Node ids are 0..NODE_MAX."""
    cdef long long d, s, r
    if dst is _ZERO:  # a default: no conversion
        d = 0
    elif type(dst) is int:
        d = dst
    else:
        d = _slow_ll("dst", dst)
    if src is _ZERO:  # a default: no conversion
        s = 0
    elif type(src) is int:
        s = src
    else:
        s = _slow_ll("src", src)
    if relays is _ZERO:  # a default: no conversion
        r = 0
    elif type(relays) is int:
        r = relays
    else:
        r = _slow_ll("relays", relays)
    if d < 0 or d >= NODE_NONE:
        raise MessageError(f"dst must be a node id 0..{NODE_NONE - 1}, not {d}")
    if s >= NODE_NONE:
        raise MessageError(f"src must be a node id 0..{NODE_NONE - 1}, not {s}")
    if r < 0 or r > 255:
        raise MessageError(f"relays must be 0..255, not {r}")
    m.dst = <uint32_t>d
    m.src = SRC_LANE if s < 0 else <uint32_t>s
    m.relays = <uint8_t>r
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


def encode(kind, id=0, job=0, priority=0, flags=0, arg0=0, arg1=0, arg2=0, hops=0, src=0,
           int load=0, unsigned int seq=0, meta=None, unsigned int epoch=1,
           unsigned long long pos=0, unsigned int nslots=256, dst=0, relays=0) -> bytes:
    """The bytes of one message as it sits in a lane of `nslots` at position `pos`.

    `meta` is a dict (msgpack-encoded here) or, for tests, bytes used as they are. `src` is
    the node that made the message, `dst` its final destination, `relays` the times it was
    relayed so far (docs/PROTOCOL.md section 2); `load` the writer's load hint.

    Returns (1 + continuation slots) * 64 bytes: the head slot first, then the continuation
    slots in position order (in a ring they may wrap; each slot's stamp uses its own position).
    """
    cdef rs_msg m
    cdef rs_slot tmp
    cdef uint32_t shift = _shift_of(nslots)
    cdef uint32_t ncont, i
    cdef bytes raw = b""
    msg_from_args(&m, kind, id, job, priority, flags, arg0, arg1, arg2, hops)
    msg_route(&m, dst, src, relays)
    if src < 0:  # a written message names its node (a lane's sender fills it in)
        raise MessageError(f"src must be a node id 0..{NODE_NONE - 1}, not {src}")
    if load < 0 or load > 0xFFFF:
        raise MessageError(f"load must be 0..65535, not {load}")
    if epoch == 0:
        raise MessageError("epoch 0 is never valid (fresh memory is zero)")
    m.load = <uint16_t>load
    if meta is not None:
        raw = bytes(meta) if isinstance(meta, (bytes, bytearray)) else pack_meta(meta)
        m.meta_len = len(raw)
    ncont = rs_ncont(m.meta_len)
    if 1 + ncont > nslots // 2:
        raise MessageTooLargeError(f"message needs {1 + ncont} slots; a lane of {nslots} "
                                   f"takes at most {nslots // 2}")
    out = PyBytes_FromStringAndSize(NULL, (1 + ncont) * SLOT_SIZE)
    cdef rs_slot *slots = <rs_slot *>PyBytes_AS_STRING(out)
    memset(&tmp, 0, sizeof(tmp))
    rs_fill_head(&tmp, &m, seq)
    rs_store_slot(&slots[0], &tmp, rs_stamp(epoch, pos, shift))
    for i in range(ncont):
        memset(&tmp, 0, sizeof(tmp))
        rs_fill_cont(&tmp, <const uint8_t *>(<char *>raw), m.meta_len, i)
        rs_store_slot(&slots[1 + i], &tmp, rs_stamp(epoch, pos + 1 + i, shift))
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
    cdef int problem = META_OK
    if m.meta_len:
        problem = rs_meta_check(<const uint8_t *>(<char *>meta_bytes), m.meta_len)
        if problem == META_OK and meta_bytes[m.meta_len:].strip(b"\0"):
            problem = META_PADDING
    if problem != META_OK:
        raise CorruptSlotError("bad-meta", f"metadata is {META_PROBLEMS[problem]}")
    return message_from_c(&m, <const uint8_t *>(<char *>meta_bytes))


cdef int _raise_for(int st, str what) except -1:
    if st == SLOT_EMPTY:
        raise CorruptSlotError("empty", f"{what}: stamp is not the one this position expects "
                               "(earlier lap or epoch, or never written)")
    if st == SLOT_BAD_CRC:
        raise CorruptSlotError("bad-crc", f"{what}: checksum does not match")
    return 0
