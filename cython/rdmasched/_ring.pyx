# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Ring lanes: the transport-neutral hot path.

A lane is S slots (a power of two) in the receiver's memory. The sender writes message k at
positions [tail, tail + 1 + ncont); slot i of the ring holds position p when i == p mod S. The
stamp of a slot is (epoch << 32 | lap) with lap = p >> log2(S), so a slot left from an earlier
lap or an earlier sender epoch never looks current. The receiver polls the stamp at its head,
checks the CRC, delivers, and every S/4 slots (or when idle) publishes its head as the credit.
The sender never writes past head + S, so an unread slot is never overwritten.

docs/PROTOCOL.md is the contract; this file implements it.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int32_t
from libc.stdlib cimport malloc, calloc, realloc, free
from libc.string cimport memcpy, memset
from posix.time cimport nanosleep, timespec
from cpython.bytes cimport PyBytes_AS_STRING

cimport cython

from rdmasched._wire cimport (
    rs_slot, rs_cont, rs_msg, Message, message_from_c, msg_from_args, msg_route, rs_stamp,
    rs_ncont, SRC_LANE,
    rs_meta_check, META_OK,
    rs_store_slot, rs_fill_head, rs_fill_cont, rs_read_slot, rs_head_valid, rs_msg_from_head,
    rs_load_acquire_u64, rs_store_release_u32, rs_load_acquire_u32, rs_fence, rs_pause,
    rs_now_ns, rs_futex_wait, rs_futex_wake, rs_cas_u32, rs_slot_crc, rs_crc32c_init,
    SLOT_EMPTY, SLOT_OK, SLOT_BAD_CRC, SLOT_MALFORMED, CONT_PAYLOAD, MAX_CONT, KIND_CONT,
)
from rdmasched._wire import pack_meta

import logging
import warnings

from rdmasched.errors import (
    CorruptSlotError, EpochError, LaneClosedError, LaneFullError, MessageTooLargeError,
    PeerDeadError,
)
from rdmasched.limits import check_lane_slots

cdef extern from "<sched.h>" nogil:
    int sched_yield()

rs_crc32c_init()

_log = logging.getLogger("rdmasched.ring")

cdef enum:
    IDLE_EVERY = 63          # empty polls between idle work (transport hook, credit)
    SCRUB_EVERY = 4095       # empty polls between look-ahead scans (each tick once one found)
    SCRUB_BUDGET = 1024      # positions one idle scan looks at; the next resumes there
    META_ROOM = MAX_CONT * CONT_PAYLOAD
    SPIN_BEFORE_YIELD = 4096
    GIL_SPIN = 256           # polls (about 2-10 us) before `poll` releases the GIL to wait
    PAUSE_NS = 10000         # a spin's first 10 us poll with a pause only (`rs_spin_step`)

DEFAULT_TIMEOUT_US = 1_000_000
DEFAULT_GRACE_US = 100
#: how long a spin polls with a pause only before it yields the CPU between polls, ns
#: (`rs_spin_step`; the simulator's host model takes it from here)
SPIN_PAUSE_NS = PAUSE_NS


cdef uint32_t _log2(uint32_t n) noexcept nogil:
    cdef uint32_t s = 0
    while (1u << s) < n:
        s += 1
    return s


def check_nslots(nslots: int) -> int:
    """Lane sizes are powers of two from 16 to 2**20 slots (limits.check_lane_slots: the one
    rule, called when a lane is made, never per message)."""
    try:
        return check_lane_slots(nslots)
    except ValueError as exc:
        raise ValueError(f"nslots {exc}") from None


# ---- receiver ---------------------------------------------------------------------------------

cdef void rs_rx_init(rs_rx *r, rs_slot *ring, uint32_t nslots, uint32_t epoch,
                     uint64_t grace_ns) noexcept nogil:
    memset(r, 0, sizeof(rs_rx))
    r.ring = ring
    r.nslots = nslots
    r.mask = nslots - 1
    r.shift = _log2(nslots)
    r.epoch = epoch
    r.grace_ns = grace_ns


cdef int rs_rx_publish_credit(rs_rx *r) noexcept nogil:
    cdef uint64_t credit = (<uint64_t>r.epoch << 32) | (r.head & 0xFFFFFFFFu)
    cdef int rc = 0
    if r.publish != NULL:
        rc = r.publish(r, credit)
    if rc == 0:
        r.credited = r.head
        r.credits += 1
    else:
        r.dead = rc
    return rc


cdef void rs_rx_begin_epoch(rs_rx *r, uint32_t epoch) noexcept nogil:
    """Accept a new sender incarnation: positions and message numbers restart at 0."""
    r.epoch = epoch
    r.head = 0
    r.credited = 0
    r.seq_next = 0
    r.bad_since = 0
    r.idle = 0
    r.scan = 0
    r.found = 0
    rs_rx_publish_credit(r)


cdef inline void _advance(rs_rx *r, uint32_t n) noexcept nogil:
    r.head += n
    r.bad_since = 0
    if r.head - r.credited >= (r.nslots >> 2):
        rs_rx_publish_credit(r)


cdef inline bint _bad_ripe(rs_rx *r) noexcept nogil:
    """True once the slot at head has looked bad for the whole grace period."""
    cdef uint64_t now = rs_now_ns()
    if r.bad_since == 0:
        r.bad_since = now
        return r.grace_ns == 0
    return now - r.bad_since >= r.grace_ns


cdef inline bint _is_head(rs_rx *r, uint64_t q, rs_slot *tmp) noexcept nogil:
    """Position q holds a head that proves the sender wrote every position before it: current
    stamp, good checksum, valid fields, and a seq not behind the expected one (a slot left
    from a later lap, which only a faulty writer makes, would be current there otherwise)."""
    return (rs_read_slot(&r.ring[q & r.mask], rs_stamp(r.epoch, q, r.shift), tmp) == SLOT_OK
            and tmp.kind != KIND_CONT and rs_head_valid(tmp, r.nslots)
            and <int32_t>(tmp.seq - r.seq_next) >= 0)


cdef uint64_t _next_head(rs_rx *r, uint64_t start, uint64_t end) noexcept nogil:
    """The first position in [start, end) holding a current valid head; 0 if there is none."""
    cdef rs_slot tmp
    cdef uint64_t q = start
    while q < end:
        if _is_head(r, q, &tmp):
            return q
        q += 1
    return 0


cdef void _skip_run(rs_rx *r, uint64_t q) noexcept nogil:
    """Skip positions [head, q), counting each slot once by what it holds (PROTOCOL.md 7.2)."""
    cdef rs_slot tmp
    cdef uint64_t p = r.head
    while p < q:
        memcpy(&tmp, &r.ring[p & r.mask], sizeof(rs_slot))
        if rs_slot_crc(&tmp) != tmp.crc:
            r.bad_crc += 1
        elif tmp.stamp == rs_stamp(r.epoch, p, r.shift):
            if tmp.kind == KIND_CONT:
                r.orphans += 1
            else:
                r.malformed += 1
        elif <uint32_t>(tmp.stamp >> 32) != r.epoch:
            r.stale_epoch += 1
        else:
            r.stale_lap += 1                   # an earlier lap, or (a faulty writer) a later one
        p += 1
    _advance(r, <uint32_t>(q - r.head))


cdef int rs_rx_scrub(rs_rx *r, uint64_t now, uint32_t budget) noexcept nogil:
    """Find a slot at head that was lost (its stamp is not current although the sender wrote
    past it) and, after the grace period, skip to the next message. Returns 1 if it skipped.

    The sender writes positions in order, so a current valid head at a later position q means
    every position before q was written: what is not current there was lost (a damaged stamp,
    a slot of an earlier epoch or lap never overwritten). The look-ahead covers positions
    head+1 .. head+S-1, the most a sender can have written; it looks at up to `budget` of them
    per call and resumes where it stopped. Every slot in [head, q) is skipped and counted
    once by what it holds; q is re-found just before skipping, so a head that landed meanwhile
    between head and q is never skipped.
    """
    cdef uint64_t pos = r.head
    cdef uint64_t end = pos + r.nslots
    cdef uint64_t q
    cdef uint32_t k = 0
    cdef rs_slot tmp
    if r.dead or r.ring == NULL:
        return 0
    if rs_load_acquire_u64(&r.ring[pos & r.mask].stamp) == rs_stamp(r.epoch, pos, r.shift):
        return 0                                   # current: poll's business
    if r.scan_base != pos or r.scan <= pos:
        r.scan_base = pos
        r.scan = pos + 1
        r.found = 0
    while r.found == 0 and k < budget:
        if r.scan >= end:
            r.scan = pos + 1                       # a whole round found nothing: start again
            break
        if _is_head(r, r.scan, &tmp):
            r.found = r.scan
            break
        r.scan += 1
        k += 1
    if r.found == 0:
        return 0
    if r.bad_since == 0:
        r.bad_since = now
        if r.grace_ns:
            return 0
    elif now - r.bad_since < r.grace_ns:
        return 0
    q = _next_head(r, pos + 1, r.found + 1)
    if q == 0:                                     # only a faulty writer takes a head back
        r.found = 0
        return 0
    _skip_run(r, q)
    # Damage comes in runs: look again at the next idle tick, not 4096 polls from now.
    r.idle = (r.idle | SCRUB_EVERY) - IDLE_EVERY
    return 1


cdef int rs_rx_drained(rs_rx *r) noexcept nogil:
    """1 if no message of the current epoch can still be delivered: the slot at head is not
    current and no current valid head lies in the look-ahead window (a transport checks this
    before it accepts a new sender epoch)."""
    cdef uint64_t pos = r.head
    if r.ring == NULL:
        return 1
    if rs_load_acquire_u64(&r.ring[pos & r.mask].stamp) == rs_stamp(r.epoch, pos, r.shift):
        return 0
    return _next_head(r, pos + 1, pos + r.nslots) == 0


cdef inline void _idle(rs_rx *r) noexcept nogil:
    """Idle work, every IDLE_EVERY + 1 empty polls in a row (docs/PROTOCOL.md 7.3)."""
    if r.idle_hook != NULL:
        r.idle_hook(r)
    if r.head != r.credited:
        rs_rx_publish_credit(r)
    if (r.found != 0 and r.scan_base == r.head) or (r.idle & SCRUB_EVERY) == 0:
        rs_rx_scrub(r, rs_now_ns(), SCRUB_BUDGET)


cdef uint64_t _before_sleep(rs_rx *r, uint64_t now) noexcept nogil:
    """Idle work before the receiver sleeps: credit, then a scan of the whole look-ahead
    window. Returns how long it may sleep (ns): 0 if it just skipped, the rest of the grace
    period if a skip is pending, else no limit (~0)."""
    if r.dead or r.ring == NULL:
        return <uint64_t>-1
    if r.head != r.credited:
        rs_rx_publish_credit(r)
    if rs_rx_scrub(r, now, r.nslots):
        return 0
    if r.found != 0 and r.scan_base == r.head:
        if r.bad_since == 0 or now - r.bad_since >= r.grace_ns:
            return 0
        return r.grace_ns - (now - r.bad_since)
    return <uint64_t>-1


cdef inline void _take_seq(rs_rx *r, uint32_t seq) noexcept nogil:
    """Account the seq of a head with a good checksum, delivered or skipped (PROTOCOL.md 7.4):
    compared modulo 2**32, ahead by 1..2**31-1 counts a gap, further is behind."""
    cdef int32_t gap = <int32_t>(seq - r.seq_next)
    if gap > 0:
        r.gaps += <uint32_t>gap
    elif gap < 0:
        r.seq_behind += 1
    r.seq_next = seq + 1


cdef inline bint _padding_zero(const uint8_t *meta, uint32_t meta_len, uint32_t n) noexcept nogil:
    cdef uint32_t i
    for i in range(meta_len, n * CONT_PAYLOAD):
        if meta[i] != 0:
            return False
    return True


cdef int rs_rx_poll(rs_rx *r, rs_msg *out, uint8_t *meta) noexcept nogil:
    """Deliver the next message: 1 if `out` (and `meta`, META_ROOM bytes) was filled, else 0.

    Never delivers a slot whose stamp is not current or whose checksum fails; skips and
    counts what cannot become valid (see the rules in docs/PROTOCOL.md).
    """
    cdef rs_slot h, c
    cdef uint64_t pos, q
    cdef uint32_t i, n
    cdef int st
    if r.dead:
        return 0
    while True:
        pos = r.head
        st = rs_read_slot(&r.ring[pos & r.mask], rs_stamp(r.epoch, pos, r.shift), &h)
        if st == SLOT_EMPTY:
            r.idle += 1
            if (r.idle & IDLE_EVERY) == 0:
                _idle(r)
            return 0
        if st == SLOT_BAD_CRC:
            if not _bad_ripe(r):
                return 0
            # Damaged past the grace: skip it, and with it whatever follows up to the next
            # valid head (its own continuation slots, lost slots), counting each slot.
            q = _next_head(r, pos + 1, pos + r.nslots)
            if q:
                _skip_run(r, q)
            else:
                r.bad_crc += 1
                _advance(r, 1)
            continue
        if h.kind == KIND_CONT:
            r.orphans += 1
            _advance(r, 1)
            continue
        if not rs_head_valid(&h, r.nslots):
            r.malformed += 1
            _advance(r, 1)
            continue
        n = h.ncont
        i = 0
        st = SLOT_OK
        while i < n:
            st = rs_read_slot(&r.ring[(pos + 1 + i) & r.mask],
                              rs_stamp(r.epoch, pos + 1 + i, r.shift), &c)
            if st != SLOT_OK:
                break
            if c.kind != KIND_CONT:
                st = SLOT_MALFORMED
                break
            memcpy(meta + i * CONT_PAYLOAD, (<rs_cont *>&c).data, CONT_PAYLOAD)
            i += 1
        if st == SLOT_MALFORMED:
            r.malformed += 1
            _take_seq(r, h.seq)
            _advance(r, 1 + i)
            continue
        if st != SLOT_OK:
            if not _bad_ripe(r):
                return 0
            # The head passed its checksum, so its length is trusted: skip the whole message.
            r.truncated += 1
            _take_seq(r, h.seq)
            _advance(r, 1 + n)
            continue
        if n and (rs_meta_check(meta, h.meta_len) != META_OK
                  or not _padding_zero(meta, h.meta_len, n)):
            # Never delivered on any API; its head is good, so it takes its seq like the rest.
            r.bad_meta += 1
            _take_seq(r, h.seq)
            _advance(r, 1 + n)
            continue
        rs_msg_from_head(out, &h)
        out.meta_off = 0
        _take_seq(r, h.seq)
        r.peer_load = h.load
        r.delivered += 1
        r.idle = 0
        _advance(r, 1 + n)
        return 1


cdef uint32_t _drain_limited(rs_rx *r, Batch b, uint32_t lane, uint32_t limit) noexcept nogil:
    cdef uint32_t got = 0
    cdef rs_msg *m
    while got < limit and b.count < b.cap and b.arena_cap - b.arena_used >= META_ROOM:
        m = &b.msgs[b.count]
        if not rs_rx_poll(r, m, b.arena + b.arena_used):
            break
        m.meta_off = b.arena_used
        m.lane = lane
        b.arena_used += m.meta_len
        b.count += 1
        got += 1
    return got


cdef inline uint64_t _bad_total(const rs_rx *r) noexcept nogil:
    return (r.bad_crc + r.malformed + r.stale_epoch + r.stale_lap + r.truncated + r.orphans
            + r.gaps + r.bad_meta + r.seq_behind)


cdef uint64_t _us_to_ns(double us, str what) except? 0:
    """A timeout given in microseconds as nanoseconds: inf waits for ever (2**64-1 ns, which
    the `now - start >= timeout` tests never reach); nan or a negative value is an error,
    never a silent zero (docs/PROTOCOL.md's API notes; issue 7 item 22)."""
    if us != us:
        raise ValueError(f"{what} must be a number of microseconds, not nan")
    if us < 0:
        raise ValueError(f"{what} must be >= 0, not {us:g}")
    if us >= 18446744073709551.0:          # (2**64 - 1) / 1000: would overflow
        return 0xFFFFFFFFFFFFFFFFULL
    return <uint64_t>(us * 1000.0)



cdef void rs_spin_step(uint64_t spun_ns) noexcept nogil:
    """Between two polls of a spin that has lasted `spun_ns`: for its first `PAUSE_NS` a
    pause (the answer to a message just sent comes within a few us on shm), then a
    `sched_yield`, which runs any thread ready on this CPU first and returns at once when
    there is none: a spinning waiter never holds a core another thread is waiting for (a
    rank's reader woken beside a daemon that spins after a preemption)."""
    if spun_ns < PAUSE_NS:
        rs_pause()
    else:
        sched_yield()


cdef int _spin_poll(rs_rx *r, rs_msg *m, uint8_t *meta, uint64_t timeout_ns) noexcept nogil:
    """Busy-poll one lane until a message arrives (1), the timeout passes (0) or it dies (-1),
    giving way as `rs_spin_step` says."""
    cdef uint64_t start = rs_now_ns(), spun = 0
    cdef uint32_t k = 0
    while True:
        if rs_rx_poll(r, m, meta):
            return 1
        if r.dead:
            return -1
        rs_spin_step(spun)
        k += 1
        if spun >= PAUSE_NS or (k & 255) == 0:  # past the pauses a yield costs more
            spun = rs_now_ns() - start
            if spun >= timeout_ns:
                return 0


# ---- sender -----------------------------------------------------------------------------------

cdef void rs_tx_init(rs_tx *t, rs_slot *ring, uint32_t nslots, uint32_t epoch,
                     const volatile uint64_t *credit) noexcept nogil:
    memset(t, 0, sizeof(rs_tx))
    t.ring = ring
    t.nslots = nslots
    t.mask = nslots - 1
    t.shift = _log2(nslots)
    t.epoch = epoch
    t.credit = credit


cdef int rs_tx_room(rs_tx *t, uint32_t n) noexcept nogil:
    """1 if n more slots fit without overwriting an unread one (reads the credit if needed)."""
    cdef uint64_t c
    cdef uint32_t unread
    if t.tail + n - t.head <= t.nslots:
        return 1
    c = rs_load_acquire_u64(t.credit)
    if <uint32_t>(c >> 32) == t.epoch:
        unread = <uint32_t>t.tail - <uint32_t>c
        if unread <= t.nslots:
            t.head = t.tail - unread
    return t.tail + n - t.head <= t.nslots


cdef int rs_tx_put(rs_tx *t, const rs_msg *m, const uint8_t *meta) noexcept nogil:
    """Write one message at the tail if there is room; never blocks. RS_OK or RS_* < 0."""
    cdef rs_slot tmp
    cdef uint64_t pos
    cdef uint32_t ncont = rs_ncont(m.meta_len)
    cdef uint32_t i
    cdef int rc
    if t.dead:
        return RS_DEAD
    if t.closed != NULL and t.closed[0]:
        return RS_CLOSED
    if not t.acked:
        if t.ready == NULL or not t.ready(t):
            return RS_NOTREADY
        t.acked = 1
    if not rs_tx_room(t, 1 + ncont):
        return RS_NOROOM
    pos = t.tail
    # Continuation slots first, the head last: a receiver that sees the head sees them all.
    for i in range(ncont):
        rs_fill_cont(&tmp, meta, m.meta_len, i)
        rs_store_slot(&t.ring[(pos + 1 + i) & t.mask], &tmp,
                      rs_stamp(t.epoch, pos + 1 + i, t.shift))
    rs_fill_head(&tmp, m, t.seq)
    if m.src == SRC_LANE:
        tmp.src_relays = (t.src & 0xFFFFFFu) | (tmp.src_relays & 0xFF000000u)
    tmp.load = t.load
    rs_store_slot(&t.ring[pos & t.mask], &tmp, rs_stamp(t.epoch, pos, t.shift))
    t.tail = pos + 1 + ncont
    t.seq += 1
    t.sent += 1
    t.slots += 1 + ncont
    if t.commit != NULL:
        rc = t.commit(t, pos, 1 + ncont)
        if rc != 0:
            t.dead = rc
            return RS_DEAD
    return RS_OK


cdef int rs_tx_wait_room(rs_tx *t, uint32_t n, uint64_t timeout_ns) noexcept nogil:
    """Wait (spin, then yield, then sleep) until n slots fit and the epoch is accepted."""
    cdef uint64_t start = rs_now_ns()
    cdef uint64_t k = 0
    cdef timespec ts
    ts.tv_sec = 0
    ts.tv_nsec = 20000
    t.full_waits += 1
    while True:
        if t.dead:
            return RS_DEAD
        if t.closed != NULL and t.closed[0]:
            return RS_CLOSED
        if not t.acked and t.ready != NULL and t.ready(t):
            t.acked = 1
        if t.acked and rs_tx_room(t, n):
            return RS_OK
        k += 1
        if k < SPIN_BEFORE_YIELD:
            rs_pause()
            continue
        if rs_now_ns() - start >= timeout_ns:
            return RS_NOTREADY if not t.acked else RS_NOROOM
        if t.acked and t.ready != NULL:
            # Past the spin, give the transport a look at its peer while the lane stays
            # full: a hook may find it failed and set t.dead (verbs polls its send CQ).
            t.ready(t)
        if k < 4 * SPIN_BEFORE_YIELD:
            sched_yield()
        else:
            nanosleep(&ts, NULL)


# ---- Python-facing classes ---------------------------------------------------------------------

@cython.final
cdef class Batch:
    """A reusable array of decoded messages: `RxLane.drain` fills it, `TxLane.send_batch`
    sends it. Indexing builds a `Message`; the arrays themselves are plain C."""

    def __cinit__(self, uint32_t capacity=256, uint32_t meta_bytes=0):
        if capacity == 0:
            raise ValueError("capacity must be at least 1")
        self.cap = capacity
        self.arena_cap = meta_bytes if meta_bytes else max(65536, 2 * META_ROOM)
        if self.arena_cap < META_ROOM:
            raise ValueError(f"meta_bytes must be at least {META_ROOM}")
        self.msgs = <rs_msg *>calloc(capacity, sizeof(rs_msg))
        self.arena = <uint8_t *>malloc(self.arena_cap)
        if self.msgs == NULL or self.arena == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.msgs)
        free(self.arena)

    def __len__(self):
        return self.count

    @property
    def capacity(self):
        return self.cap

    def clear(self):
        self.count = 0
        self.arena_used = 0

    def __getitem__(self, Py_ssize_t i):
        if i < 0:
            i += self.count
        if i < 0 or i >= self.count:
            raise IndexError("batch index out of range")
        return message_from_c(&self.msgs[i], self.arena)

    def __iter__(self):
        cdef uint32_t i
        for i in range(self.count):
            yield message_from_c(&self.msgs[i], self.arena)

    def append(self, kind, id=0, job=0, priority=0, flags=0, arg0=0, arg1=0, arg2=0, hops=0,
               meta=None, *, dst=0, src=-1, relays=0):
        """Add a message to send; the same arguments as `TxLane.send`."""
        cdef bytes raw
        cdef rs_msg *m
        if self.count >= self.cap:
            raise BufferError(f"batch is full ({self.cap} messages)")
        m = &self.msgs[self.count]
        msg_from_args(m, kind, id, job, priority, flags, arg0, arg1, arg2, hops)
        msg_route(m, dst, src, relays)
        if meta is not None:
            raw = pack_meta(meta)
            if self.arena_used + len(raw) > self.arena_cap:
                raise BufferError("batch metadata arena is full")
            memcpy(self.arena + self.arena_used, PyBytes_AS_STRING(raw), len(raw))
            m.meta_off = self.arena_used
            m.meta_len = len(raw)
            self.arena_used += len(raw)
        self.count += 1


cdef _stats_dict(const rs_rx *r):
    return {
        "delivered": r.delivered, "bad_crc": r.bad_crc, "malformed": r.malformed,
        "stale_epoch": r.stale_epoch, "stale_lap": r.stale_lap, "truncated": r.truncated,
        "orphans": r.orphans, "gaps": r.gaps, "bad_meta": r.bad_meta,
        "seq_behind": r.seq_behind, "credits": r.credits,
        "head": r.head, "epoch": r.epoch, "peer_load": r.peer_load,
    }


cdef class Lane:
    """What both ends of a lane share: its `name`, and `close()` (safe twice), which marks
    the lane closed and then lets the transport release its part (`_close_transport`); a
    lane is a context manager that closes it."""

    @property
    def closed(self):
        return not self._open

    cdef void _stop(self):
        pass

    cdef void _close_transport(self):
        pass

    def close(self):
        """Stop using the lane and release its memory. Safe to call twice."""
        if not self._open:
            return
        self._open = False
        self._stop()
        self._close_transport()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


cdef class RxLane(Lane):
    """The receiving end of a lane. Made by a transport (e.g. `shm.create_lane`)."""

    def __cinit__(self, *args, **kwargs):
        self.scratch = <uint8_t *>malloc(META_ROOM)
        if self.scratch == NULL:
            raise MemoryError()
        self.st.dead = RS_CLOSED            # until a transport opens it

    def __dealloc__(self):
        free(self.scratch)

    def __del__(self):
        if self._open:
            warnings.warn(f"lane {self.name!r} (receiver) was not closed", ResourceWarning, 2)
            self.close()

    cdef int _check_open(self) except -1:
        if not self._open:
            raise LaneClosedError(f"lane {self.name!r} is closed")
        return 0

    cdef object _deliver(self, rs_msg *m, const uint8_t *meta):
        try:
            return message_from_c(m, meta)
        except CorruptSlotError as exc:
            # Only if msgpack refuses what the C check accepted: counted once, not delivered.
            self.st.bad_meta += 1
            self.st.delivered -= 1
            _log.warning("lane %r: skipped message seq=%d: %s", self.name, m.seq, exc)
            return None

    def _report(self):
        cdef uint64_t total = _bad_total(&self.st)
        if total != self._reported:
            _log.warning("lane %r: skipped bad slots or messages: %s", self.name,
                         {k: v for k, v in self.stats().items()
                          if k not in ("delivered", "credits", "head", "epoch", "peer_load")
                          and v})
            self._reported = total

    def poll(self, double timeout_us=0):
        """The next message, or None if none arrives within `timeout_us` (0: just look).

        Spins without the GIL while it waits. Bad slots are skipped, counted in `stats()`
        and logged; they never come out of here.
        """
        cdef rs_msg m
        cdef int r
        cdef uint32_t k
        cdef uint64_t timeout_ns
        self._check_open()
        if not timeout_us >= 0:
            raise ValueError(f"timeout_us must be >= 0 microseconds (inf: wait for ever), "
                             f"not {timeout_us:g}")
        while True:
            r = rs_rx_poll(&self.st, &m, self.scratch)
            if r == 0 and timeout_us > 0:
                # A reply is often a few hundred ns away: look a little longer before paying
                # for releasing and retaking the GIL.
                k = 0
                while r == 0 and k < GIL_SPIN:
                    rs_pause()
                    r = rs_rx_poll(&self.st, &m, self.scratch)
                    k += 1
            if r == 0 and timeout_us > 0:
                timeout_ns = _us_to_ns(timeout_us, "timeout_us")
                with nogil:
                    r = _spin_poll(&self.st, &m, self.scratch, timeout_ns)
            if r == 1:
                msg = self._deliver(&m, self.scratch)
                if msg is not None:
                    return msg
                continue
            if _bad_total(&self.st) != self._reported:
                self._report()
            if self.st.dead and self._open:
                raise PeerDeadError(self._dead_message())
            return None

    def drain(self, Batch batch not None):
        """Append every message that is ready (up to the batch's room) to `batch`; no GIL."""
        cdef uint32_t got
        self._check_open()
        with nogil:
            got = _drain_limited(&self.st, batch, 0, batch.cap)
        if _bad_total(&self.st) != self._reported:
            self._report()
        return got

    def scrub(self):
        """Run the look-ahead check for a lost slot now (the poller does it when idle)."""
        self._check_open()
        return bool(rs_rx_scrub(&self.st, rs_now_ns(), self.st.nslots))

    def stats(self):
        """Counters: delivered, and every kind of slot that was skipped (PROTOCOL.md)."""
        return _stats_dict(&self.st)

    @property
    def nslots(self):
        return self.st.nslots

    @property
    def epoch(self):
        return self.st.epoch

    @property
    def peer_load(self):
        """The load hint carried by the last message (the sender's, permille)."""
        return self.st.peer_load

    cdef object _dead_message(self):
        """Why the lane is dead, for PeerDeadError; a transport says more."""
        return f"lane {self.name!r}: transport failed ({self.st.dead})"

    cdef void _stop(self):
        self.st.dead = RS_CLOSED
        self.st.ring = NULL


cdef class TxLane(Lane):
    """The sending end of a lane. Made by a transport (e.g. `shm.attach_lane`)."""

    def __cinit__(self, *args, **kwargs):
        self.timeout_ns = DEFAULT_TIMEOUT_US * 1000
        self.st.dead = RS_CLOSED

    def __del__(self):
        if self._open:
            warnings.warn(f"lane {self.name!r} (sender) was not closed", ResourceWarning, 2)
            self.close()

    def send(self, kind, id=0, job=0, priority=0, flags=0, arg0=0, arg1=0, arg2=0, hops=0,
             meta=None, timeout_us=None, *, dst=0, src=-1, relays=0):
        """Write one message into the peer's lane; returns its message number (seq).

        `dst`: the node the message is for (docs/PROTOCOL.md section 2); `src`: the node that
        made it (< 0: this lane's own node id, `self.src`); `relays`: times relayed so far
        (a relay passes the received src and dst, and relays + 1). The load hint is the
        lane's (`load`).

        Blocks while the lane has no credit, up to `timeout_us` (default: the lane's), then
        raises LaneFullError. On any error nothing was written.
        """
        cdef rs_msg m
        cdef bytes raw
        cdef const uint8_t *mp = NULL
        cdef int rc
        cdef uint32_t n
        if not self._open:
            raise LaneClosedError(f"lane {self.name!r} is closed")
        msg_from_args(&m, kind, id, job, priority, flags, arg0, arg1, arg2, hops)
        msg_route(&m, dst, src, relays)
        if meta is not None:
            raw = pack_meta(meta)
            m.meta_len = len(raw)
            mp = <const uint8_t *>PyBytes_AS_STRING(raw)
            n = 1 + rs_ncont(m.meta_len)
            if n > self.st.nslots // 2:
                raise MessageTooLargeError(
                    f"message needs {n} slots; lane {self.name!r} of {self.st.nslots} "
                    f"takes at most {self.st.nslots // 2}")
        rc = rs_tx_put(&self.st, &m, mp)
        if rc != RS_OK:
            rc = self._send_slow(&m, mp, rc, timeout_us)
        return self.st.seq - 1

    cdef int _send_slow(self, rs_msg *m, const uint8_t *mp, int rc, timeout_us) except -1:
        cdef uint64_t timeout_ns = (self.timeout_ns if timeout_us is None
                                    else _us_to_ns(timeout_us, "timeout_us"))
        cdef uint32_t n = 1 + rs_ncont(m.meta_len)
        while rc == RS_NOROOM or rc == RS_NOTREADY:
            with nogil:
                rc = rs_tx_wait_room(&self.st, n, timeout_ns)
                if rc == RS_OK:
                    rc = rs_tx_put(&self.st, m, mp)
            if rc != RS_OK:
                return self._fail(rc, n, timeout_ns)
        if rc != RS_OK:
            return self._fail(rc, n, timeout_ns)
        return 0

    cdef int _fail(self, int rc, uint32_t n, uint64_t timeout_ns) except -1:
        if rc == RS_NOROOM:
            raise LaneFullError(
                f"lane {self.name!r} is full: no credit for {n} slot(s) within "
                f"{timeout_ns / 1e6:g} ms ({self.st.tail - self.st.head} of "
                f"{self.st.nslots} slots unread by the receiver){self._peer_note()}")
        if rc == RS_NOTREADY:
            taken = self._epoch_taken()
            if taken:  # it will never accept ours: polling has nothing to do with it
                raise EpochError(
                    f"lane {self.name!r}: the receiver skipped sender epoch {self.st.epoch} "
                    f"and took a newer sender epoch, {taken}: another sender attached to "
                    "this lane after this one (the newest wins); this one can no longer "
                    "send (attach again to send)")
            raise EpochError(
                f"lane {self.name!r}: the receiver did not accept sender epoch "
                f"{self.st.epoch} within {timeout_ns / 1e6:g} ms; is it polling?"
                f"{self._peer_note()}")
        if rc == RS_CLOSED:
            raise PeerDeadError(f"lane {self.name!r}: the receiver closed the lane")
        raise PeerDeadError(f"lane {self.name!r} is dead: transport error {self.st.dead}")

    def _peer_note(self):
        return ""

    def _epoch_taken(self):
        """The newer sender epoch the receiver accepted instead of this one, or 0."""
        return 0

    def send_batch(self, Batch batch not None, timeout_us=None):
        """Send every message of `batch` in order, without the GIL; returns how many.

        If the lane stays full past the timeout, raises LaneFullError saying how many were
        sent; the rest were not written.
        """
        cdef uint64_t timeout_ns = (self.timeout_ns if timeout_us is None
                                    else _us_to_ns(timeout_us, "timeout_us"))
        cdef uint32_t i = 0, n
        cdef int rc = RS_OK
        cdef rs_msg *m
        if not self._open:
            raise LaneClosedError(f"lane {self.name!r} is closed")
        for i in range(batch.count):
            if 1 + rs_ncont(batch.msgs[i].meta_len) > self.st.nslots // 2:
                raise MessageTooLargeError(f"batch message {i} does not fit lane {self.name!r}")
        i = 0
        with nogil:
            while i < batch.count:
                m = &batch.msgs[i]
                rc = rs_tx_put(&self.st, m, batch.arena + m.meta_off)
                if rc == RS_NOROOM or rc == RS_NOTREADY:
                    n = 1 + rs_ncont(m.meta_len)
                    rc = rs_tx_wait_room(&self.st, n, timeout_ns)
                    if rc == RS_OK:
                        continue
                if rc != RS_OK:
                    break
                i += 1
        if rc != RS_OK:
            try:
                self._fail(rc, 1 + rs_ncont(batch.msgs[i].meta_len), timeout_ns)
            except LaneFullError as exc:
                raise LaneFullError(f"{exc} (sent {i} of {batch.count})") from None
        return i

    def stats(self):
        return {"sent": self.st.sent, "slots": self.st.slots, "full_waits": self.st.full_waits,
                "wakes": self.st.wakes, "tail": self.st.tail, "head": self.st.head,
                "epoch": self.st.epoch}

    @property
    def nslots(self):
        return self.st.nslots

    @property
    def epoch(self):
        return self.st.epoch

    @property
    def src(self):
        return self.st.src

    @property
    def load(self):
        """The load hint (permille) stamped on every message this lane sends."""
        return self.st.load

    @load.setter
    def load(self, int value):
        if value < 0 or value > 0xFFFF:
            raise ValueError("load must be 0..65535")
        self.st.load = <uint16_t>value

    cdef void _stop(self):
        self.st.dead = RS_CLOSED
        self.st.ring = NULL


cdef class LaneSet:
    """Several receiving lanes polled together (a node's inbound lanes).

    `drain` visits every lane round-robin in C without the GIL, up to `quantum` messages per
    lane per pass, so one busy sender cannot starve the others. Messages carry the index of
    their lane (`Message.lane`).

    `wake` (from another thread of this process) ends the current or the next `wait`: how
    a thread hands work to the one that waits here (docs/PROTOCOL.md section 9).
    """

    def __cinit__(self):
        self._lanes = []
        self._arr = NULL
        self._n = 0
        self._next = 0
        self._bell = NULL
        self._woken = 0
        self.scratch = <uint8_t *>malloc(META_ROOM)
        if self.scratch == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self._arr)
        free(self.scratch)

    def add(self, RxLane lane not None):
        """Add a lane; returns its index."""
        cdef rs_rx **arr = <rs_rx **>realloc(self._arr, (self._n + 1) * sizeof(rs_rx *))
        if arr == NULL:
            raise MemoryError()
        self._arr = arr
        self._arr[self._n] = &lane.st
        self._lanes.append(lane)
        self._n += 1
        return self._n - 1

    def truncate(self, n):
        """Keep the first `n` lanes and let go of the rest (their owner closes them). Only
        while no thread waits on or drains this set: on the thread that does, or after it
        stopped (`Loop.disown`)."""
        if not 0 <= n <= self._n:
            raise ValueError(f"truncate({n}) of a set of {self._n} lanes")
        del self._lanes[n:]
        self._n = <uint32_t>n
        self._next = 0

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        return self._lanes[i]

    def set_doorbell(self, owner, unsigned long long address):
        """Block on the futex word at `address` (kept alive by `owner`) in `wait`; address 0
        lets go of it (before its owner unmaps it: `wake` must not touch it then)."""
        self._bell_owner = owner if address else None
        self._bell = <volatile uint32_t *><size_t>address

    def wake(self):
        """End the `wait` another thread is in, spinning or asleep, or else the next one, at
        once (it returns what it drained, maybe nothing); for a thread that hands the waiter
        work of its own (an inbox), where no lane has a message to be found.

        The flag is stored before the doorbell is looked at, and `wait` announces its sleep
        before it looks at the flag, both fenced: either `wait` sees the flag, or this sees
        it asleep and rings. A sender's ring alone (`ring_doorbell`) only wakes a sleeper.
        """
        cdef volatile uint32_t *bell = self._bell
        # the word is touched holding the GIL, so not after `set_doorbell(None, 0)` has let
        # go of it; only the system call is made without (at worst EFAULT, never a fault)
        rs_store_release_u32(&self._woken, 1)
        rs_fence()
        if bell != NULL and rs_load_acquire_u32(bell) != 0:
            rs_store_release_u32(bell, 0)
            with nogil:
                rs_futex_wake(bell, 0x7FFFFFFF)

    cdef bint _take_wake(self) noexcept nogil:
        """Whether `wake` was called since the last time (clearing it)."""
        return rs_load_acquire_u32(&self._woken) != 0 and rs_cas_u32(&self._woken, 1, 0)

    def drain(self, Batch batch not None, uint32_t quantum=64):
        cdef uint32_t got
        with nogil:
            got = self._drain(batch, quantum)
        return got

    cdef uint32_t _drain(self, Batch batch, uint32_t quantum) noexcept nogil:
        cdef uint32_t total = 0, got, i, k, start = self._next, pass_got
        cdef uint32_t room
        if self._n == 0:
            return 0
        while True:
            pass_got = 0
            for k in range(self._n):
                i = (start + k) % self._n
                room = batch.cap - batch.count
                if room == 0:
                    break
                if room > quantum:
                    room = quantum
                got = _drain_limited(self._arr[i], batch, i, room)
                pass_got += got
            total += pass_got
            if pass_got == 0 or batch.count >= batch.cap:
                break
        self._next = (start + 1) % self._n
        return total

    def wait(self, Batch batch not None, timeout_us=1000, spin_us=50, uint32_t quantum=64):
        """Drain; if nothing came, spin up to `spin_us`, then sleep on the doorbell (if any)
        until a sender rings it, `wake` is called or `timeout_us` passes. Returns how many
        were added (0 after a `wake` with nothing to drain)."""
        cdef uint64_t timeout_ns = _us_to_ns(timeout_us, "timeout_us")
        cdef uint64_t spin_ns = _us_to_ns(spin_us, "spin_us")
        cdef uint32_t got
        with nogil:
            got = self._wait(batch, timeout_ns, spin_ns, quantum)
        return got

    cdef uint32_t _wait(self, Batch batch, uint64_t timeout_ns, uint64_t spin_ns,
                        uint32_t quantum) noexcept nogil:
        cdef uint64_t start = rs_now_ns(), now, limit, nap
        cdef uint32_t got, k = 0
        cdef timespec ts
        while True:
            got = self._drain(batch, quantum)
            if got:
                return got
            if self._take_wake():
                return 0
            now = rs_now_ns()
            if now - start >= timeout_ns:
                return 0
            if now - start < spin_ns:
                rs_spin_step(now - start)
                continue
            if self._bell == NULL:
                ts.tv_sec = 0
                ts.tv_nsec = 50000
                nanosleep(&ts, NULL)
                continue
            # Doorbell: announce that we sleep, then look once more (the lanes and `wake`'s
            # flag) before sleeping, so that a sender that wrote, or a thread that woke us,
            # before seeing the announcement is not missed (both sides fence).
            rs_store_release_u32(self._bell, 1)
            rs_fence()
            got = self._drain(batch, quantum)
            if got or self._take_wake():
                rs_store_release_u32(self._bell, 0)
                return got
            # Idle work before sleeping (PROTOCOL.md 7.3): credit, the look-ahead scrub; a
            # pending skip bounds the sleep to the rest of its grace period.
            limit = timeout_ns - (now - start)
            for k in range(self._n):
                nap = _before_sleep(self._arr[k], now)
                if nap < limit:
                    limit = nap
            if limit:
                rs_futex_wait(self._bell, 1, limit)
                if rs_load_acquire_u32(self._bell) == 0:
                    # rung (the ringer cleared the flag): a message, or `wake` with
                    # none (Loop.post); either ends the wait
                    self._take_wake()
                    return self._drain(batch, quantum)
            rs_store_release_u32(self._bell, 0)

    def poll(self, double timeout_us=0):
        """The next message from any lane, or None (see `RxLane.poll`)."""
        cdef Batch b = Batch(1, META_ROOM)
        cdef uint64_t timeout_ns = _us_to_ns(timeout_us, "timeout_us")
        with nogil:
            self._wait(b, timeout_ns, timeout_ns, 1)
        return b[0] if b.count else None

    def stats(self):
        return [lane.stats() for lane in self._lanes]
