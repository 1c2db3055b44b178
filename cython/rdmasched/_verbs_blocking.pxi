# _verbs_blocking.pxi (included by _verbs.pyx): VerbsLaneSet, a LaneSet of verbs lanes that
# sleeps on the endpoints' completion channels when idle (adaptive blocking).

from libc.stdint cimport uint32_t, uint64_t
from libc.errno cimport errno
from libc.stdlib cimport realloc, free

from posix.unistd cimport close, read, write

from rdmasched._wire cimport (
    rs_fence, rs_load_acquire_u32, rs_load_acquire_u64, rs_now_ns,
    rs_store_release_u32,
)
from rdmasched._ring cimport rs_rx, LaneSet, Batch, rs_spin_step
from rdmasched.libibverbs cimport (
    ibv_comp_channel, ibv_cq, ibv_req_notify_cq, ibv_get_cq_event, ibv_ack_cq_events,
    IBV_SEND_INLINE,
)

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum:
        POLLIN

cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initval, int flags)
    enum:
        EFD_NONBLOCK
        EFD_CLOEXEC

cdef class VerbsLaneSet(LaneSet):
    """A LaneSet of verbs lanes whose `wait` sleeps when idle instead of spinning.

    `wait(batch, timeout_us, spin_us)` drains, spins up to `spin_us`, then sleeps on the
    endpoints' completion channels until a sender wakes it or the timeout passes. Going to
    sleep, per connection: arm the receive CQ; WRITE my sleep generation into the sender's
    control block, then READ the sender's published tail (RC runs the READ after the WRITE).
    A sender stores its tail after every post, fences, and reads that flag; if set, it sends
    one WRITE_WITH_IMM, which lands on the armed receive CQ and wakes the channel. Either the
    sender saw the flag (and wakes us), or it read the flag before the flag landed, so its
    tail store came before our READ, which then shows a message we have not consumed (and we
    do not sleep): no wake-up is lost. Awake again, the receiver writes 0 as its flag.

    `wake` (another thread of this process handing the waiter work) ends a spin at once (the
    spin looks at its flag) and a sleep through an eventfd that `poll()` watches beside the
    channels: the waiter announces its sleep and then looks at the flag, `wake` stores the
    flag and then looks at the announcement, both fenced, so either the waiter sees the
    flag or `wake` sees it asleep and writes the eventfd (as the shm doorbell, PROTOCOL.md
    section 9).
    """

    cdef list _chans
    #: poll set: [0] the eventfd `wake` writes, [1 + k] channel k (`_chs[k]`)
    cdef pollfd *_fds
    cdef ibv_comp_channel **_chs
    cdef uint32_t _nfds
    cdef int _efd
    cdef volatile uint32_t _asleep
    cdef readonly uint64_t sleeps
    cdef readonly uint64_t wakeups
    cdef readonly uint64_t sleeps_refused

    def __cinit__(self):
        self._chans = []
        self._chs = NULL
        self._nfds = 0
        self._asleep = 0
        self._fds = <pollfd *>realloc(NULL, sizeof(pollfd))
        if self._fds == NULL:
            raise MemoryError()
        self._efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self._efd < 0:
            raise OSError(errno, "eventfd for the verbs LaneSet's wake-up failed")
        self._fds[0].fd = self._efd
        self._fds[0].events = POLLIN

    def __dealloc__(self):
        if self._efd >= 0:
            close(self._efd)
        free(self._fds)
        free(self._chs)

    def wake(self):
        """End the `wait` another thread is in, spinning or asleep in `poll()`, or else the
        next one, at once (see the class)."""
        cdef uint64_t one = 1
        rs_store_release_u32(&self._woken, 1)
        rs_fence()
        if rs_load_acquire_u32(&self._asleep) != 0:
            with nogil:
                write(self._efd, &one, sizeof(one))

    def add(self, VerbsRxLane lane not None):
        """Add a verbs lane (its endpoint must have a completion channel); its index."""
        cdef QueuePair qp = lane._qp
        cdef CompletionChannel ch
        cdef pollfd *fds
        cdef ibv_comp_channel **chs
        if qp is None or qp._chan is None:
            raise ValueError(f"lane {lane.name!r} has no completion channel to sleep on")
        ch = qp._chan
        idx = LaneSet.add(self, lane)
        if ch not in self._chans:
            fds = <pollfd *>realloc(self._fds, (self._nfds + 2) * sizeof(pollfd))
            if fds == NULL:
                raise MemoryError()
            self._fds = fds
            chs = <ibv_comp_channel **>realloc(self._chs,
                                               (self._nfds + 1) * sizeof(ibv_comp_channel *))
            if chs == NULL:
                raise MemoryError()
            self._chs = chs
            self._chs[self._nfds] = ch.ch
            self._fds[self._nfds + 1].fd = ch.ch.fd
            self._fds[self._nfds + 1].events = POLLIN
            self._nfds += 1
            self._chans.append(ch)
        return idx

    cdef uint32_t _wait(self, Batch batch, uint64_t timeout_ns, uint64_t spin_ns,
                        uint32_t quantum) noexcept nogil:
        cdef uint64_t start = rs_now_ns(), now
        cdef uint32_t got
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
            got = self._sleep(batch, quantum, timeout_ns - (now - start))
            if got:
                return got

    cdef uint32_t _sleep(self, Batch batch, uint32_t quantum, uint64_t left_ns) noexcept nogil:
        cdef uint32_t i, k, got
        cdef rs_rx *r
        cdef vb_rx *x
        cdef vb_conn *c
        cdef bint busy = False
        cdef uint64_t start = rs_now_ns(), limit
        cdef int ms, n
        cdef ibv_cq *ev_cq
        cdef void *ev_ctx
        cdef uint64_t spent, count
        # 1. arm every receive CQ (wake-ups that already came are taken first)
        for i in range(self._n):
            r = self._arr[i]
            x = <vb_rx *>r.ctx
            c = x.conn
            if r.dead or c == NULL or c.rcq == NULL or c.failed:
                continue
            if x.pending != 0 and x.pending != r.epoch:
                return 0                    # a reconnected sender waits for the poller
            _drain_rcq(c)
            ibv_req_notify_cq(c.rcq, 0)
        # 2. tell every sender we sleep, then read its tail
        for i in range(self._n):
            r = self._arr[i]
            c = (<vb_rx *>r.ctx).conn
            if r.dead or c == NULL or c.rcq == NULL or c.failed:
                continue
            c.sleep_gen += 1
            if c.sleep_gen == 0:
                c.sleep_gen = 1
            c.ctl.src_flag = c.sleep_gen
            c.fwr.send_flags = IBV_SEND_INLINE if c.max_inline >= 4 else 0
            c.fwr.next = &c.rwr
            c.rwr.next = NULL
            c.rwr.send_flags = 0
            if _post(c, &c.fwr, 2, True) != 0:
                busy = True
        # 3. wait for the READs (bounded), then look: anything landed or on its way?
        limit = left_ns
        if limit > 100000000:
            limit = 100000000
        for i in range(self._n):
            r = self._arr[i]
            c = (<vb_rx *>r.ctx).conn
            if r.dead or c == NULL or c.rcq == NULL:
                continue
            while not c.failed and c.retired < c.rwr.wr_id:
                _poll_once(c)
                if rs_now_ns() - start > limit:
                    busy = True
                    break
            if c.failed:
                busy = True                 # let the poller find out and report it
            elif rs_load_acquire_u64(&c.ctl.peer_tail) > r.head:
                busy = True                 # a message is posted that we have not seen
        # ... and tell `wake` we sleep, then look at its flag (it stays set for `_wait`)
        rs_store_release_u32(&self._asleep, 1)
        rs_fence()
        if rs_load_acquire_u32(&self._woken) != 0:
            busy = True
        got = self._drain(batch, quantum)
        if got or busy:
            rs_store_release_u32(&self._asleep, 0)
            self.sleeps_refused += 1
            self._awake()
            return got
        # 4. sleep until a wake-up (or the timeout)
        self.sleeps += 1
        spent = rs_now_ns() - start
        if spent < left_ns:
            left_ns -= spent
        else:
            left_ns = 0
        if left_ns > <uint64_t>1000000000000:
            left_ns = <uint64_t>1000000000000
        ms = <int>((left_ns + 999999) // 1000000)
        n = poll(self._fds, self._nfds + 1, ms)
        rs_store_release_u32(&self._asleep, 0)
        if n > 0:
            self.wakeups += 1
            if self._fds[0].revents:
                read(self._efd, &count, sizeof(count))  # (nonblocking: resets the count)
            for k in range(self._nfds):
                if self._fds[k + 1].revents:
                    while ibv_get_cq_event(self._chs[k], &ev_cq, &ev_ctx) == 0:
                        ibv_ack_cq_events(ev_cq, 1)
        self._awake()
        return self._drain(batch, quantum)

    cdef void _awake(self) noexcept nogil:
        """Write 0 as my flag in every sender (it stops sending wake-ups); take the ones
        that came."""
        cdef uint32_t i
        cdef rs_rx *r
        cdef vb_conn *c
        for i in range(self._n):
            r = self._arr[i]
            c = (<vb_rx *>r.ctx).conn
            if r.dead or c == NULL or c.rcq == NULL or c.failed:
                continue
            c.ctl.src_flag = 0
            c.fwr.send_flags = IBV_SEND_INLINE if c.max_inline >= 4 else 0
            c.fwr.next = NULL
            _post(c, &c.fwr, 1)
            _drain_rcq(c)

    def sleep_stats(self):
        return {"sleeps": self.sleeps, "wakeups": self.wakeups,
                "sleeps_refused": self.sleeps_refused}
