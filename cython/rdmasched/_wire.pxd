# The wire layout of one control message slot: written down here once (and in docs/PROTOCOL.md,
# which is the contract; rdmasched/wire.py mirrors it with `struct` for tests).
#
# A slot is 64 bytes, little-endian, 64-byte aligned in the lane. The last 8 bytes are the
# stamp that the receiver polls; bytes 52..55 are a CRC-32C of the rest (stamp included).

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from "rs_arch.h" nogil:
    uint64_t rs_load_acquire_u64(const volatile uint64_t *p)
    void rs_store_release_u64(volatile uint64_t *p, uint64_t v)
    uint32_t rs_load_acquire_u32(const volatile uint32_t *p)
    void rs_store_release_u32(volatile uint32_t *p, uint32_t v)
    int rs_cas_u32(volatile uint32_t *p, uint32_t expect, uint32_t desired)
    void rs_fence()
    void rs_pause()
    uint64_t rs_now_ns()
    void rs_crc32c_init()
    uint32_t rs_crc32c(const void *buf, size_t n)
    uint32_t rs_crc32c_update(uint32_t c, const void *buf, size_t n)
    uint32_t rs_slot_crc(const void *slot)
    int rs_futex_wait(volatile uint32_t *addr, uint32_t val, uint64_t timeout_ns)
    int rs_futex_wake(volatile uint32_t *addr, int n)


# ---- the slot -------------------------------------------------------------------------------
# Head slot (the first slot of every message), wire protocol version 2. Offsets are in
# docs/PROTOCOL.md. Every field sits at its natural alignment, so no packing is needed; _wire
# checks the offsets at import. The two 24-bit node ids share a little-endian u32 with the
# byte after them: src (bits 0..23) with relays (bits 24..31), dst with hops.
ctypedef struct rs_slot:
    uint8_t kind        # 0   Kind; CONT (0x7F) marks a continuation slot
    uint8_t flags       # 1   per-kind flag bits
    uint8_t priority    # 2   0..255, higher is more urgent
    uint8_t ncont       # 3   continuation slots that follow this one
    uint32_t src_relays # 4   src: the node that made the message (u24); 7: relays so far (u8)
    uint32_t dst_hops   # 8   dst: the final destination node (u24); 11: task hops (u8)
    uint32_t seq        # 12  message number in this lane and epoch: 0, 1, 2, ...
    uint16_t load       # 16  load hint of the node that wrote this slot (the last hop)
    uint16_t meta_len   # 18  msgpack metadata bytes carried in the continuation slots
    uint32_t job        # 20  job id
    uint64_t id         # 24  task id (group id for SYNC_READY)
    uint64_t arg0       # 32  kind-specific
    uint64_t arg1       # 40  kind-specific
    uint32_t arg2       # 48  kind-specific
    uint32_t crc        # 52  CRC-32C of bytes [0,52) ++ [56,64)
    uint64_t stamp      # 56  (epoch << 32) | (lap mod 2**32); lap = position >> log2(slots)

# Continuation slot: byte 0 is CONT, bytes 1..51 carry the next 51 bytes of the metadata.
ctypedef struct rs_cont:
    uint8_t kind
    uint8_t data[51]
    uint32_t crc
    uint64_t stamp

cdef enum:
    WIRE_VERSION_2 = 2       # the wire protocol version (the lane carries it, not the slot)
    NODE_NONE = 0xFFFFFF     # the reserved node id: never a src or dst
    SRC_LANE = 0xFFFFFFFF    # rs_msg.src: "the sending lane's own node id" (rs_tx_put fills it)
    SLOT_SIZE = 64
    CRC_OFFSET = 52
    CONT_PAYLOAD = 51
    MAX_META = 4096          # metadata bytes a message may carry
    MAX_CONT = 81            # ceil(MAX_META / CONT_PAYLOAD)
    META_DEPTH = 32          # containers nested in metadata, the top map included

# Why metadata bytes are not valid metadata (docs/PROTOCOL.md section 5); 0 when they are.
cdef enum:
    META_OK = 0
    META_NOT_MSGPACK = 1     # a byte that starts no msgpack object, or an object cut short
    META_NOT_MAP = 2         # the top object is not a map
    META_TRAILING = 3        # bytes after the map, within meta_len
    META_EXT = 4             # an extension type (including the timestamp)
    META_KEY = 5             # a map key that is an array or a map
    META_UTF8 = 6            # a str that is not valid UTF-8
    META_DEEP = 7            # containers nested deeper than META_DEPTH
    META_PADDING = 8         # non-zero bytes after meta_len in the last continuation slot

cdef enum:
    KIND_DISPATCH = 1
    KIND_PREEMPT = 2
    KIND_SYNC_READY = 3
    KIND_COMPLETE = 4
    KIND_HEARTBEAT = 5
    KIND_MAX = 5
    KIND_CONT = 0x7F

# Outcome of checking one slot (see docs/PROTOCOL.md, "What the receiver accepts").
cdef enum:
    SLOT_EMPTY = 0           # stamp is not the one this position expects: not written yet
    SLOT_OK = 1
    SLOT_BAD_CRC = 2         # stamp matches, checksum does not: torn (still landing) or corrupt
    SLOT_MALFORMED = 3       # checksum matches, fields break a rule (kind, reserved, lengths)

# A decoded message as the C loops pass it around (not the wire layout).
ctypedef struct rs_msg:
    uint8_t kind
    uint8_t flags
    uint8_t priority
    uint8_t hops
    uint8_t relays
    uint16_t load
    uint32_t src             # SRC_LANE: the sending lane's node id
    uint32_t dst
    uint32_t seq
    uint32_t arg2
    uint32_t job
    uint64_t id
    uint64_t arg0
    uint64_t arg1
    uint32_t meta_len
    uint32_t meta_off        # where the metadata bytes start in the batch's arena
    uint32_t lane            # index of the lane it came from, in a LaneSet


cdef inline uint64_t rs_stamp(uint32_t epoch, uint64_t pos, uint32_t shift) noexcept nogil:
    return (<uint64_t>epoch << 32) | ((pos >> shift) & 0xFFFFFFFFu)


cdef inline uint32_t rs_ncont(uint32_t meta_len) noexcept nogil:
    return (meta_len + CONT_PAYLOAD - 1) // CONT_PAYLOAD


cdef inline void rs_store_slot(rs_slot *dst, rs_slot *tmp, uint64_t stamp) noexcept nogil:
    """Seal `tmp` (checksum over its fields and `stamp`) and publish it at `dst`.

    The 56 bytes before the stamp are stored first, the stamp last with release order, so a
    receiver that reads the stamp (acquire) and finds it current reads a whole slot.
    """
    tmp.stamp = stamp
    tmp.crc = rs_slot_crc(tmp)
    memcpy(dst, tmp, 56)           # few wide stores: the line changes hands fewer times
    rs_store_release_u64(&dst.stamp, stamp)


cdef inline void rs_fill_head(rs_slot *h, const rs_msg *m, uint32_t seq) noexcept nogil:
    h.kind = m.kind
    h.flags = m.flags
    h.priority = m.priority
    h.ncont = <uint8_t>rs_ncont(m.meta_len)
    h.src_relays = (m.src & 0xFFFFFFu) | (<uint32_t>m.relays << 24)
    h.dst_hops = (m.dst & 0xFFFFFFu) | (<uint32_t>m.hops << 24)
    h.load = m.load
    h.seq = seq
    h.meta_len = <uint16_t>m.meta_len
    h.id = m.id
    h.job = m.job
    h.arg0 = m.arg0
    h.arg1 = m.arg1
    h.arg2 = m.arg2


cdef inline void rs_fill_cont(rs_slot *c, const uint8_t *meta, uint32_t meta_len,
                              uint32_t index) noexcept nogil:
    """Continuation slot `index` (0-based) carries meta[index*51 : index*51+51], zero-padded."""
    cdef rs_cont *cc = <rs_cont *>c
    cdef uint32_t off = index * CONT_PAYLOAD
    cdef uint32_t n = meta_len - off
    cdef uint32_t i
    if n > CONT_PAYLOAD:
        n = CONT_PAYLOAD
    cc.kind = KIND_CONT
    for i in range(n):
        cc.data[i] = meta[off + i]
    for i in range(n, <uint32_t>CONT_PAYLOAD):
        cc.data[i] = 0


cdef int rs_meta_check(const uint8_t *p, uint32_t n) noexcept nogil


cdef inline int rs_read_slot(const rs_slot *s, uint64_t stamp, rs_slot *out) noexcept nogil:
    """Copy the slot at `s` into `out` if its stamp is `stamp` and its checksum matches.

    The checksum is computed on the copy, so what is delivered is exactly what was checked
    even if a faulty writer changes the slot meanwhile.
    """
    if rs_load_acquire_u64(&s.stamp) != stamp:
        return SLOT_EMPTY
    memcpy(out, s, 56)
    out.stamp = stamp
    if rs_slot_crc(out) != out.crc:
        return SLOT_BAD_CRC
    return SLOT_OK


cdef inline int rs_head_valid(const rs_slot *h, uint32_t nslots) noexcept nogil:
    """The rules a head slot with a good checksum must still meet (PROTOCOL.md)."""
    if h.kind < 1 or h.kind > KIND_MAX:
        return 0
    if (h.src_relays & 0xFFFFFFu) == NODE_NONE or (h.dst_hops & 0xFFFFFFu) == NODE_NONE:
        return 0
    if h.meta_len > MAX_META:
        return 0
    if h.ncont != rs_ncont(h.meta_len):
        return 0
    if 1 + <uint32_t>h.ncont > nslots // 2:
        return 0
    return 1


cdef inline void rs_msg_from_head(rs_msg *m, const rs_slot *h) noexcept nogil:
    m.kind = h.kind
    m.flags = h.flags
    m.priority = h.priority
    m.hops = <uint8_t>(h.dst_hops >> 24)
    m.relays = <uint8_t>(h.src_relays >> 24)
    m.src = h.src_relays & 0xFFFFFFu
    m.dst = h.dst_hops & 0xFFFFFFu
    m.load = h.load
    m.seq = h.seq
    m.arg2 = h.arg2
    m.id = h.id
    m.job = h.job
    m.arg0 = h.arg0
    m.arg1 = h.arg1
    m.meta_len = h.meta_len


cdef class Message:
    """One delivered control message (read-only)."""
    cdef readonly int kind
    cdef readonly int flags
    cdef readonly int priority
    cdef readonly int hops
    cdef readonly int src
    cdef readonly int dst
    cdef readonly int relays
    cdef readonly int load
    cdef readonly unsigned int seq
    cdef readonly unsigned int arg2
    cdef readonly unsigned long long id
    cdef readonly unsigned int job
    cdef readonly unsigned long long arg0
    cdef readonly unsigned long long arg1
    cdef readonly int lane
    cdef readonly object meta


cdef Message message_from_c(const rs_msg *m, const uint8_t *meta)
cdef int msg_from_args(rs_msg *m, object kind, object id, object job, object priority,
                       object flags, object arg0, object arg1, object arg2,
                       object hops) except -1
cdef int msg_route(rs_msg *m, object dst, object src, object relays) except -1
