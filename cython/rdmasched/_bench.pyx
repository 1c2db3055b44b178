# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Benchmark kernels that must run in C: the machine's floor, and the hot-path sides.

Used by `rdmasched bench`; not part of the API.
"""

from libc.stdint cimport uint64_t, uint32_t
from libc.string cimport memset

from rdmasched._wire cimport rs_msg, rs_now_ns, rs_pause, SRC_LANE
from rdmasched._ring cimport RxLane, TxLane, rs_rx_poll, rs_tx_put, rs_tx_wait_room, RS_OK

import array

from rdmasched.errors import PeerDeadError

cdef extern from "rs_floor.h" nogil:
    int rs_floor_run(volatile uint64_t *ping, volatile uint64_t *pong, int pinger,
                     uint64_t iters, uint64_t *samples, uint64_t timeout_ns)


def floor_pingpong(size_t address, bint pinger, uint64_t iters, double timeout_s=10.0):
    """Plain C ping-pong on two lines at `address` (128 zeroed bytes of shared memory).

    The pinger returns an array('Q') of round trips in ns; the echo side returns None.
    """
    cdef volatile uint64_t *ping = <volatile uint64_t *>address
    cdef volatile uint64_t *pong = <volatile uint64_t *>(address + 64)
    samples = array.array("Q", bytes(8 * iters)) if pinger else array.array("Q", [0])
    cdef uint64_t[::1] view = samples
    cdef int rc
    cdef uint64_t timeout_ns = <uint64_t>(timeout_s * 1e9)
    with nogil:
        rc = rs_floor_run(ping, pong, pinger, iters, &view[0], timeout_ns)
    if rc != 0:
        raise TimeoutError("floor ping-pong: the peer stopped answering")
    return samples if pinger else None


cdef int _recv(RxLane rx, rs_msg *m, uint64_t timeout_ns) noexcept nogil:
    """0: a message; -1: nothing for timeout_ns; -3: the lane is dead (its transport
    failed: a verbs QP's retries exhausted, the peer gone)."""
    cdef uint64_t start = 0, now
    cdef uint32_t k = 0
    while not rs_rx_poll(&rx.st, m, rx.scratch):
        if rx.st.dead:
            return -3
        rs_pause()
        k += 1
        if (k & 1023) == 0:
            now = rs_now_ns()
            if start == 0:
                start = now
            elif now - start > timeout_ns:
                return -1
    return 0


cdef int _send(TxLane tx, rs_msg *m, uint64_t timeout_ns) noexcept nogil:
    cdef int rc = rs_tx_put(&tx.st, m, NULL)
    while rc != RS_OK:
        rc = rs_tx_wait_room(&tx.st, 1, timeout_ns)
        if rc != RS_OK:
            return rc
        rc = rs_tx_put(&tx.st, m, NULL)
    return 0


def echo(RxLane rx not None, TxLane tx not None, uint64_t count, double timeout_s=10.0):
    """Hot-path echo, as a daemon's poll loop runs: receive a message, send it straight back.

    Messages without metadata only. Returns the number echoed.
    """
    cdef rs_msg m
    cdef uint64_t i = 0
    cdef uint64_t timeout_ns = <uint64_t>(timeout_s * 1e9)
    cdef int rc = 0
    with nogil:
        while i < count:
            rc = _recv(rx, &m, timeout_ns)
            if rc != 0:
                break
            m.meta_len = 0
            if _send(tx, &m, timeout_ns) != 0:
                rc = -2
                break
            i += 1
    if rc:
        raise PeerDeadError(f"hot echo stopped after {i} of {count}: {_why(rc, timeout_s)}")
    return i


def _why(int rc, double timeout_s):
    return {-1: f"nothing arrived for {timeout_s:g} s",
            -2: "could not send (the lane is dead or stayed full)",
            -3: "the lane is dead (its transport failed)"}.get(rc, f"error {rc}")


def ping(RxLane rx not None, TxLane tx not None, uint64_t iters, double timeout_s=10.0):
    """Hot-path pinger: send a DISPATCH, wait for the echo; array('Q') of round trips (ns)."""
    samples = array.array("Q", bytes(8 * iters))
    cdef uint64_t[::1] view = samples
    cdef rs_msg m, r
    cdef uint64_t i = 0, t_prev, t
    cdef uint64_t timeout_ns = <uint64_t>(timeout_s * 1e9)
    cdef int rc = 0
    # Every field, as msg_from_args and msg_route make them: the routing fields (src, dst,
    # relays, load) are not left to whatever the stack held.
    memset(&m, 0, sizeof(m))
    m.kind = 1
    m.priority = 1
    m.job = 7
    m.src = SRC_LANE    # the sending lane's node (rs_tx_put stamps it); dst 0, no relays
    with nogil:
        t_prev = rs_now_ns()
        while i < iters:
            m.id = i
            if _send(tx, &m, timeout_ns) != 0:
                rc = -2
                break
            rc = _recv(rx, &r, timeout_ns)
            if rc != 0:
                break
            t = rs_now_ns()
            view[i] = t - t_prev
            t_prev = t
            i += 1
    if rc:
        raise PeerDeadError(f"hot ping stopped after {i} of {iters}: {_why(rc, timeout_s)}")
    return samples


# ---- allocations on the hot path (tests/test_alloc.py, docs/PERFORMANCE.md) -----------------
cdef extern from "Python.h":
    ctypedef enum PyMemAllocatorDomain:
        PYMEM_DOMAIN_RAW
        PYMEM_DOMAIN_MEM
        PYMEM_DOMAIN_OBJ
    ctypedef struct PyMemAllocatorEx:
        void *ctx
        void *(*malloc)(void *ctx, size_t size) noexcept nogil
        void *(*calloc)(void *ctx, size_t nelem, size_t elsize) noexcept nogil
        void *(*realloc)(void *ctx, void *ptr, size_t new_size) noexcept nogil
        void (*free)(void *ctx, void *ptr) noexcept nogil
    void PyMem_GetAllocator(PyMemAllocatorDomain domain, PyMemAllocatorEx *allocator)
    void PyMem_SetAllocator(PyMemAllocatorDomain domain, PyMemAllocatorEx *allocator)

# the allocators wrapped (MEM, OBJ), and the count of new blocks asked of them
cdef PyMemAllocatorEx _alloc_orig[2]
cdef bint _alloc_on = False
cdef uint64_t _alloc_n = 0
# alloc_mark's attribution: blocks per stage (by the point it starts at), the current point
cdef uint64_t _alloc_stage[8]
cdef int _alloc_point = -1
cdef uint64_t _alloc_at = 0


cdef void *_count_malloc(void *ctx, size_t size) noexcept nogil:
    global _alloc_n
    _alloc_n += 1
    cdef PyMemAllocatorEx *a = <PyMemAllocatorEx *>ctx
    return a.malloc(a.ctx, size)


cdef void *_count_calloc(void *ctx, size_t nelem, size_t elsize) noexcept nogil:
    global _alloc_n
    _alloc_n += 1
    cdef PyMemAllocatorEx *a = <PyMemAllocatorEx *>ctx
    return a.calloc(a.ctx, nelem, elsize)


cdef void *_count_realloc(void *ctx, void *ptr, size_t new_size) noexcept nogil:
    global _alloc_n
    if ptr == NULL:
        _alloc_n += 1
    cdef PyMemAllocatorEx *a = <PyMemAllocatorEx *>ctx
    return a.realloc(a.ctx, ptr, new_size)


cdef void _count_free(void *ctx, void *ptr) noexcept nogil:
    cdef PyMemAllocatorEx *a = <PyMemAllocatorEx *>ctx
    a.free(a.ctx, ptr)


def alloc_count_start():
    """Count, from now on, the blocks CPython's object and memory allocators hand out
    (every object not taken from a free list, and every item array of a list or dict).
    `alloc_count()` reads the count; `alloc_count_stop()` puts the allocators back."""
    global _alloc_on, _alloc_n
    if _alloc_on:
        return
    cdef PyMemAllocatorEx mine
    cdef int i
    cdef PyMemAllocatorDomain domains[2]
    domains[0] = PYMEM_DOMAIN_MEM
    domains[1] = PYMEM_DOMAIN_OBJ
    for i in range(2):
        PyMem_GetAllocator(domains[i], &_alloc_orig[i])
        mine.ctx = &_alloc_orig[i]
        mine.malloc = _count_malloc
        mine.calloc = _count_calloc
        mine.realloc = _count_realloc
        mine.free = _count_free
        PyMem_SetAllocator(domains[i], &mine)
    _alloc_n = 0
    _alloc_on = True


def alloc_count():
    """Blocks allocated since `alloc_count_start()` (0 when not counting)."""
    return _alloc_n


def alloc_mark(int point, int only_after=-1):
    """The path reached `point` (0..7): the blocks allocated since the last mark go to the
    stage that started there. With `only_after` >= 0: only if the last mark was that one.
    Counted in C, so the marks allocate nothing themselves (no int made per call)."""
    global _alloc_point, _alloc_at
    if only_after >= 0 and _alloc_point != only_after:
        return
    if not 0 <= point < 8:
        raise ValueError(f"point {point} is not 0..7")
    if _alloc_point >= 0:
        _alloc_stage[_alloc_point] += _alloc_n - _alloc_at
    _alloc_point = point
    _alloc_at = _alloc_n


def alloc_stages(bint reset=False):
    """The blocks counted per stage by `alloc_mark` (a list of 8); `reset`: start again."""
    global _alloc_point
    out = [_alloc_stage[i] for i in range(8)]
    if reset:
        for i in range(8):
            _alloc_stage[i] = 0
        _alloc_point = -1
    return out


def alloc_count_stop():
    """Stop counting: the allocators wrapped by `alloc_count_start()` are put back."""
    global _alloc_on
    if not _alloc_on:
        return
    PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &_alloc_orig[0])
    PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &_alloc_orig[1])
    _alloc_on = False
