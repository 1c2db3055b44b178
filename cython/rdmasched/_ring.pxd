# The ring layer: one single-producer/single-consumer lane of 64-byte slots in the receiver's
# memory, and the credit word in the sender's memory. Transport-neutral: a transport fills in
# the hooks (how a sender's slots reach the receiver's ring, how the receiver's credit reaches
# the sender) and owns the memory.
#
# The state lives in C structs so that a loop over many lanes runs without the GIL; the cdef
# classes own one struct each and are what Python sees.

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from rdmasched._wire cimport rs_slot, rs_msg

cdef struct rs_rx:
    rs_slot *ring
    uint32_t nslots
    uint32_t mask
    uint32_t shift
    uint32_t epoch              # the sender incarnation this lane accepts now (never 0)
    uint64_t head               # next position to read
    uint64_t credited           # head as last published to the sender
    uint32_t seq_next           # message number expected next
    uint32_t idle               # consecutive empty polls
    uint16_t peer_load          # load hint of the last message
    int dead                    # errno-style code once the transport failed; 0 while alive
    uint64_t bad_since          # when the slot at `head` was first seen bad (ns), 0 if not
    uint64_t grace_ns           # how long a bad slot may still be landing before it is skipped
    uint64_t last_ns            # when the last message was delivered
    # counters (docs/PROTOCOL.md, "What the receiver accepts")
    uint64_t delivered
    uint64_t bad_crc            # slots skipped: stamp current, checksum wrong past the grace
    uint64_t malformed          # slots skipped: checksum right, a field rule broken
    uint64_t stale_epoch        # slots skipped: a whole slot from an earlier sender epoch
    uint64_t stale_lap          # slots skipped: a whole slot from an earlier lap
    uint64_t truncated          # messages skipped: continuation slots never arrived
    uint64_t orphans            # continuation slots found without their head
    uint64_t gaps               # message numbers never delivered (seq jumped)
    uint64_t credits            # credit words published
    uint64_t bad_meta           # messages whose metadata was not valid (PROTOCOL.md section 5)
    uint64_t seq_behind         # delivered messages whose seq was behind the expected one
    # look-ahead scrub state (rare path): valid only while scan_base == head
    uint64_t scan_base          # the head the scan below belongs to
    uint64_t scan               # next position to look at
    uint64_t found              # first current valid head seen beyond head, 0 if none yet
    int (*publish)(rs_rx *r, uint64_t credit) noexcept nogil
    int (*idle_hook)(rs_rx *r) noexcept nogil
    void *ctx                   # the transport's own state

cdef struct rs_tx:
    rs_slot *ring               # where slots are encoded: the ring itself (shm) or a shadow
    uint32_t nslots
    uint32_t mask
    uint32_t shift
    uint32_t epoch
    uint64_t tail               # next position to write
    uint64_t head               # receiver's head as last read from the credit word
    const volatile uint64_t *credit
    const volatile uint32_t *closed   # non-zero once the receiver closed its end (shm)
    volatile uint32_t *bell     # receiver's doorbell futex word (shm), or NULL
    uint32_t seq
    uint32_t src                # this sender's node id: the src of what it makes (u24)
    uint16_t load
    int acked                   # the receiver accepted `epoch`
    int dead
    uint64_t sent
    uint64_t slots
    uint64_t full_waits
    uint64_t wakes
    int (*commit)(rs_tx *t, uint64_t pos, uint32_t n) noexcept nogil
    # 1 once the receiver accepted `epoch`. rs_tx_wait_room also calls it while the lane is
    # full (past the spin), so a transport can find a failed peer there and set `dead`.
    int (*ready)(rs_tx *t) noexcept nogil
    void *ctx

# rs_tx_put / rs_rx_poll results
cdef enum:
    RS_OK = 0
    RS_NOROOM = -1
    RS_NOTREADY = -2
    RS_CLOSED = -3
    RS_DEAD = -4

cdef void rs_rx_init(rs_rx *r, rs_slot *ring, uint32_t nslots, uint32_t epoch,
                     uint64_t grace_ns) noexcept nogil
cdef int rs_rx_poll(rs_rx *r, rs_msg *out, uint8_t *meta) noexcept nogil
cdef void rs_rx_begin_epoch(rs_rx *r, uint32_t epoch) noexcept nogil
cdef int rs_rx_publish_credit(rs_rx *r) noexcept nogil
cdef int rs_rx_scrub(rs_rx *r, uint64_t now, uint32_t budget) noexcept nogil
cdef int rs_rx_drained(rs_rx *r) noexcept nogil

cdef void rs_tx_init(rs_tx *t, rs_slot *ring, uint32_t nslots, uint32_t epoch,
                     const volatile uint64_t *credit) noexcept nogil
cdef int rs_tx_room(rs_tx *t, uint32_t n) noexcept nogil
cdef int rs_tx_put(rs_tx *t, const rs_msg *m, const uint8_t *meta) noexcept nogil
cdef int rs_tx_wait_room(rs_tx *t, uint32_t n, uint64_t timeout_ns) noexcept nogil

# between two polls of a spin (every transport's receive wait): pause, then give way
cdef void rs_spin_step(uint64_t spun_ns) noexcept nogil


cdef class Batch:
    cdef rs_msg *msgs
    cdef uint8_t *arena
    cdef uint32_t cap
    cdef uint32_t count
    cdef uint32_t arena_cap
    cdef uint32_t arena_used


# What both ends share: the name, and close() (safe twice) with the context manager.
cdef class Lane:
    cdef readonly object name
    cdef bint _open
    cdef object __weakref__
    cdef void _stop(self)                 # the ring state's part of closing (RxLane, TxLane)
    cdef void _close_transport(self)      # the transport's part (its subclasses)


cdef class RxLane(Lane):
    cdef rs_rx st
    cdef uint8_t *scratch
    cdef uint64_t _reported
    cdef int _check_open(self) except -1
    cdef object _deliver(self, rs_msg *m, const uint8_t *meta)
    cdef object _dead_message(self)


cdef class TxLane(Lane):
    cdef rs_tx st
    cdef public uint64_t timeout_ns
    cdef int _send_slow(self, rs_msg *m, const uint8_t *mp, int rc, object timeout_us) except -1
    cdef int _fail(self, int rc, uint32_t n, uint64_t timeout_ns) except -1


cdef class LaneSet:
    cdef list _lanes
    cdef rs_rx **_arr
    cdef uint32_t _n
    cdef uint32_t _next
    cdef volatile uint32_t *_bell
    cdef object _bell_owner
    cdef volatile uint32_t _woken   # set by `wake` (another thread), taken by `_wait`
    cdef uint8_t *scratch
    cdef uint32_t _drain(self, Batch batch, uint32_t quantum) noexcept nogil
    cdef bint _take_wake(self) noexcept nogil
    cdef uint32_t _wait(self, Batch batch, uint64_t timeout_ns, uint64_t spin_ns,
                        uint32_t quantum) noexcept nogil
