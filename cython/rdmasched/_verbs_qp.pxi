# _verbs_qp.pxi (included by _verbs.pyx): the control block, a connection's C state (vb_conn)
# with the send-queue accounting every post goes through, and QueuePair, which owns both.

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memset
from libc.stdlib cimport calloc, free
from libc.errno cimport errno
from posix.time cimport nanosleep, timespec

from rdmasched._wire cimport (
    rs_store_release_u32, rs_store_release_u64, rs_load_acquire_u32, rs_cas_u32, rs_fence,
    rs_pause, rs_now_ns,
)
from rdmasched.libibverbs cimport (
    ibv_context, ibv_pd, ibv_cq, ibv_qp, ibv_sge, ibv_send_wr, ibv_recv_wr, ibv_wc, ibv_wc_status,
    ibv_wr_opcode, ibv_mtu, ibv_qp_attr, ibv_qp_init_attr, ibv_create_cq, ibv_destroy_cq,
    ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, ibv_query_qp, ibv_post_send, ibv_post_recv,
    ibv_poll_cq, ibv_wc_status_str, rs_wr_set_rdma, rs_wr_remote_addr, rs_wr_rkey, rs_wr_set_imm,
    rs_ah_set_dgid,
    IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE,
    IBV_QPS_ERR, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ,
    IBV_SEND_SIGNALED, IBV_SEND_INLINE, IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR,
    IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ,
    IBV_QP_STATE, IBV_QP_ACCESS_FLAGS, IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_AV,
    IBV_QP_PATH_MTU, IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN,
    IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC,
    IBV_QP_DEST_QPN,
)

import os

from rdmasched.errors import DeviceError

# ---- the control block ------------------------------------------------------------------------
# 64 bytes of registered memory per connection and side, writable by the peer (its own rkey).
cdef struct vb_ctl:
    uint64_t credit          # 0   my outbound lane's credit, written by the peer's receiver
    uint32_t rx_closed       # 8   1: the peer's receiving end closed; stop sending
    uint32_t gone            # 12  1: the peer closed the whole connection
    uint64_t src_credit      # 16  local: source of credit writes where inline is unavailable
    uint32_t src_one         # 24  local: the value 1, source of the closing writes
    uint32_t probe           # 28  written by the peer's idle sender to find out if we live
    uint32_t sleep_flag      # 32  the peer's receiver: its sleep generation while it blocks
                             #     (wake it with a WRITE_WITH_IMM), 0 while it polls
    uint32_t src_flag        # 36  local: source of my own sleep-flag writes
    uint64_t tail_pub        # 40  my outbound lane's tail, stored after every post; the
                             #     peer's receiver READs it before it sleeps
    uint64_t peer_tail       # 48  local: where that READ of the peer's tail lands
    uint8_t pad[8]

CTL_BYTES = sizeof(vb_ctl)
CTL_CREDIT = 0
CTL_RX_CLOSED = 8
CTL_GONE = 12
CTL_PROBE = 28
CTL_SLEEP_FLAG = 32
CTL_TAIL_PUB = 40
assert CTL_BYTES == 64

cdef enum:
    RECV_DEPTH = 32          # receive WRs kept posted for wake-up WRITE_WITH_IMMs
    IDLE_CHECK_EVERY = 64    # receiver idle-hook calls (each is 64 empty polls) per look
    MAX_WR_PER_POST = 3      # a message: its continuation slots (wrapped: 2 WRITEs), its head
    REAP_BATCH = 16

# Why a connection failed (vb_conn.failed); 0 while it works.
cdef enum:
    VB_WC_ERROR = 1          # a work request completed with an error (wc_status says which)
    VB_POST_ERROR = 2        # ibv_post_send refused (post_errno)
    VB_POLL_ERROR = 3        # ibv_poll_cq failed
    VB_SQ_TIMEOUT = 4        # the send queue stayed full past cq_timeout_ns: no completions
    VB_CLOSED = 5            # closed or replaced here (the peer reconnected)

# rs_rx.dead values set by the idle hook, after the lane was drained
cdef enum:
    DEAD_FAILED = 1          # the connection failed (vb_conn.failed says how)
    DEAD_GONE = 2            # the peer closed the connection

FAIL_WC_ERROR = VB_WC_ERROR
FAIL_POST_ERROR = VB_POST_ERROR
FAIL_POLL_ERROR = VB_POLL_ERROR
FAIL_SQ_TIMEOUT = VB_SQ_TIMEOUT
FAIL_CLOSED = VB_CLOSED
RX_DEAD_FAILED = DEAD_FAILED
RX_DEAD_GONE = DEAD_GONE

cdef struct vb_conn:
    ibv_qp *qp
    ibv_cq *cq
    uint32_t lock
    uint32_t sq_depth        # work requests that may be outstanding
    uint32_t signal_every    # one in this many asks for a completion
    uint32_t max_inline      # bytes the device copies at post time
    uint64_t posted          # work requests posted; wr_id of the last one
    uint64_t retired         # work requests known complete
    uint64_t last_signal     # wr_id of the last signalled one
    int failed               # 0, or VB_*
    int wc_status            # the first error completion's status
    int post_errno
    uint64_t cq_timeout_ns
    uint64_t keepalive_ns    # an idle side writes to the peer this often (finds a dead peer)
    vb_ctl *ctl              # my control block
    uint32_t ctl_lkey
    ibv_send_wr cwr          # the credit WRITE, prepared once
    ibv_sge csge
    ibv_send_wr pwr          # the probe WRITE (4 bytes into the peer's control block)
    ibv_sge psge
    # adaptive blocking (see VerbsLaneSet): NULL rcq when the endpoint has no channel
    ibv_cq *rcq              # receive CQ on the endpoint's completion channel
    uint32_t recv_posted     # receive WRs outstanding
    uint32_t woken_gen       # sender: the peer's sleep generation already woken
    uint32_t sleep_gen       # receiver: my current sleep generation (never 0)
    ibv_send_wr iwr          # wake: WRITE_WITH_IMM of 4 bytes into the peer's probe word
    ibv_sge isge
    ibv_send_wr fwr          # my sleep flag into the peer's control block ...
    ibv_sge fsge
    ibv_send_wr rwr          # ... then READ of the peer's published tail (after the flag)
    ibv_sge rsge
    uint64_t wakes_sent
    uint64_t sleeps
    uint64_t wakeups
    # counters
    uint64_t signalled
    uint64_t cq_polls
    uint64_t sq_waits
    uint64_t writes
    uint64_t credit_writes
    uint64_t keepalives


cdef inline void _lock(vb_conn *c) noexcept nogil:
    while not rs_cas_u32(&c.lock, 0, 1):
        rs_pause()


cdef inline void _unlock(vb_conn *c) noexcept nogil:
    rs_store_release_u32(&c.lock, 0)


cdef void _fail(vb_conn *c, int why) noexcept nogil:
    if c.failed == 0:
        c.failed = why
    c.retired = c.posted       # nothing outstanding will complete normally any more


cdef int _reap(vb_conn *c) noexcept nogil:
    """Poll the send CQ once (lock held): retire completed requests, record errors."""
    cdef ibv_wc wc[REAP_BATCH]
    cdef int n, i
    if c.cq == NULL:
        return 0
    n = ibv_poll_cq(c.cq, REAP_BATCH, wc)
    c.cq_polls += 1
    if n < 0:
        _fail(c, VB_POLL_ERROR)
        return 0
    for i in range(n):
        if wc[i].status == IBV_WC_SUCCESS:
            if wc[i].wr_id > c.retired:
                c.retired = wc[i].wr_id
        else:
            # The first real error names the cause; the flushes that follow it do not.
            if c.failed == 0 or (c.failed == VB_WC_ERROR
                                 and c.wc_status == IBV_WC_WR_FLUSH_ERR
                                 and wc[i].status != IBV_WC_WR_FLUSH_ERR):
                c.wc_status = wc[i].status
            _fail(c, VB_WC_ERROR)
    return n


cdef int _post(vb_conn *c, ibv_send_wr *first, uint32_t k, bint force=False) noexcept nogil:
    """Post the chain `first` of k requests (k <= MAX_WR_PER_POST): 0, or the failure.
    `force`: the last one asks for a completion whatever the count says."""
    cdef ibv_send_wr *wr
    cdef ibv_send_wr *bad = NULL
    cdef uint64_t start = 0
    cdef int rc
    cdef timespec ts
    _lock(c)
    if c.failed:
        rc = c.failed
        _unlock(c)
        return rc
    if c.posted + k - c.retired > (c.sq_depth >> 1):
        _reap(c)
    while c.posted + k - c.retired > c.sq_depth and not c.failed:
        # Full: the oldest outstanding signalled request has not completed yet.
        if start == 0:
            start = rs_now_ns()
            c.sq_waits += 1
        elif rs_now_ns() - start > c.cq_timeout_ns:
            _fail(c, VB_SQ_TIMEOUT)
            break
        _unlock(c)
        ts.tv_sec = 0
        ts.tv_nsec = 1000
        nanosleep(&ts, NULL)
        _lock(c)
        _reap(c)
    if c.failed:
        rc = c.failed
        _unlock(c)
        return rc
    wr = first
    while wr != NULL:
        c.posted += 1
        wr.wr_id = c.posted
        if c.posted - c.last_signal >= c.signal_every or (force and wr.next == NULL):
            wr.send_flags |= IBV_SEND_SIGNALED
            c.last_signal = c.posted
            c.signalled += 1
        else:
            wr.send_flags &= ~(<unsigned int>IBV_SEND_SIGNALED)
        wr = wr.next
    rc = ibv_post_send(c.qp, first, &bad)
    if rc != 0:
        c.post_errno = rc
        _fail(c, VB_POST_ERROR)
        rc = c.failed
    _unlock(c)
    return rc


cdef int _post_credit(vb_conn *c, uint64_t credit) noexcept nogil:
    """WRITE an 8-byte credit word into the peer's control block."""
    if c.max_inline >= 8:
        c.csge.addr = <uint64_t><size_t>&credit     # copied by the post itself
        c.cwr.send_flags = IBV_SEND_INLINE
    else:
        c.ctl.src_credit = credit   # a newer credit overwriting it before the DMA is harmless
        c.csge.addr = <uint64_t><size_t>&c.ctl.src_credit
        c.cwr.send_flags = 0
    c.cwr.next = NULL
    c.credit_writes += 1
    return _post(c, &c.cwr, 1)


cdef int _post_probe(vb_conn *c) noexcept nogil:
    """WRITE 4 bytes into the peer's probe word: if the peer is gone, this fails the QP
    (retries exhausted) and the error completion says so."""
    c.psge.addr = <uint64_t><size_t>&c.ctl.src_one
    c.pwr.send_flags = IBV_SEND_INLINE if c.max_inline >= 4 else 0
    c.pwr.next = NULL
    c.keepalives += 1
    return _post(c, &c.pwr, 1)


cdef void _prep(ibv_send_wr *wr, ibv_sge *sge, ibv_wr_opcode op, void *src, uint32_t length,
                uint32_t lkey) noexcept nogil:
    memset(wr, 0, sizeof(ibv_send_wr))
    wr.opcode = op
    wr.sg_list = sge
    wr.num_sge = 1
    sge.addr = <uint64_t><size_t>src
    sge.length = length
    sge.lkey = lkey


cdef int _post_recvs(vb_conn *c, uint32_t n) noexcept nogil:
    """Post n empty receive WRs (each takes one wake-up WRITE_WITH_IMM)."""
    cdef ibv_recv_wr wr
    cdef ibv_recv_wr *bad = NULL
    cdef uint32_t i
    cdef int rc
    memset(&wr, 0, sizeof(wr))
    for i in range(n):
        rc = ibv_post_recv(c.qp, &wr, &bad)
        if rc:
            return rc
        c.recv_posted += 1
    return 0


cdef uint32_t _drain_rcq(vb_conn *c) noexcept nogil:
    """Take the wake-ups that arrived (receive CQ) and post their receive WRs again."""
    cdef ibv_wc wc[REAP_BATCH]
    cdef int n, i
    cdef uint32_t got = 0
    if c.rcq == NULL or c.qp == NULL:
        return 0
    while True:
        n = ibv_poll_cq(c.rcq, REAP_BATCH, wc)
        if n <= 0:
            break
        for i in range(n):
            c.recv_posted -= 1
            if wc[i].status != IBV_WC_SUCCESS and wc[i].status != IBV_WC_WR_FLUSH_ERR:
                _lock(c)
                if c.failed == 0:
                    c.wc_status = wc[i].status
                _fail(c, VB_WC_ERROR)
                _unlock(c)
        got += <uint32_t>n
    if not c.failed and c.recv_posted < RECV_DEPTH:
        _post_recvs(c, RECV_DEPTH - c.recv_posted)
    return got


cdef void _wake_peer_if_asleep(vb_conn *c, uint64_t tail) noexcept nogil:
    """Sender, after a post: publish the tail; if the peer's receiver sleeps (and this
    sleep was not woken yet) send it a WRITE_WITH_IMM. The fence orders the tail store
    before the flag load; the receiver READs the tail after its flag landed here, so one
    of the two sides always sees the other (VerbsLaneSet)."""
    cdef uint32_t f
    rs_store_release_u64(&c.ctl.tail_pub, tail)
    rs_fence()
    f = rs_load_acquire_u32(&c.ctl.sleep_flag)
    if f != 0 and f != c.woken_gen:
        c.woken_gen = f
        c.wakes_sent += 1
        _post(c, &c.iwr, 1)


cdef void _poll_once(vb_conn *c) noexcept nogil:
    _lock(c)
    _reap(c)
    _unlock(c)


cdef class QueuePair(VerbsObject):
    """One RC queue pair and its completion queues (send; receive on `channel` if given), in
    the protection domain `pd`.

    A child of `pd` and of `channel`: it keeps them (and the control block `ctl_mr`) alive,
    and either closes it before itself. `close()` destroys the QP, then its CQs; the C state
    stays allocated until the object goes, so a lane that still points at it finds it failed,
    not freed. Made by verbs.Connection, which owns it.
    """

    cdef vb_conn *c
    cdef ProtectionDomain _pd
    cdef MemoryRegion _ctl_mr
    cdef CompletionChannel _chan
    cdef readonly int port

    def __cinit__(self, ProtectionDomain pd not None, MemoryRegion ctl_mr not None, int port,
                  uint32_t sq_depth=512, uint32_t signal_every=64, uint32_t max_inline=256,
                  uint64_t cq_timeout_ns=10_000_000_000, uint64_t keepalive_ns=100_000_000,
                  CompletionChannel channel=None):
        cdef ibv_qp_init_attr ia
        cdef ibv_context *ctx
        cdef ibv_pd *p = pd.pd
        cdef uint32_t inline_try
        cdef int err = 0
        if signal_every < 1 or sq_depth < signal_every + MAX_WR_PER_POST:
            raise ValueError(f"sq_depth ({sq_depth}) must be at least signal_every "
                             f"({signal_every}) + {MAX_WR_PER_POST}")
        if ctl_mr.length < CTL_BYTES:
            raise ValueError(f"control block needs {CTL_BYTES} bytes")
        if p == NULL or pd.context.ctx == NULL:
            raise DeviceError("the protection domain or its device is closed")
        ctx = pd.context.ctx
        self.c = <vb_conn *>calloc(1, sizeof(vb_conn))
        if self.c == NULL:
            raise MemoryError()
        self._pd = pd
        self._ctl_mr = ctl_mr
        self.port = port
        self.c.sq_depth = sq_depth
        self.c.signal_every = signal_every
        self.c.cq_timeout_ns = cq_timeout_ns
        self.c.ctl = <vb_ctl *><size_t>ctl_mr.buf
        self.c.ctl_lkey = ctl_mr.lkey
        memset(self.c.ctl, 0, sizeof(vb_ctl))
        self.c.ctl.src_one = 1
        # Send and flush completions: at most sq_depth outstanding, one CQE each at worst.
        self.c.cq = ibv_create_cq(ctx, <int>(sq_depth + 16), NULL, NULL, 0)
        if self.c.cq == NULL:
            err = errno
            self._free()
            raise DeviceError("ibv_create_cq failed", err)
        if channel is not None:
            if channel.ch == NULL:
                self._free()
                raise DeviceError("the completion channel is closed")
            # Receive CQ: only the peer's wake-up WRITE_WITH_IMMs land here.
            self.c.rcq = ibv_create_cq(ctx, RECV_DEPTH + 4, NULL, channel.ch, 0)
            if self.c.rcq == NULL:
                err = errno
                self._free()
                raise DeviceError("ibv_create_cq (receive, on the channel) failed", err)
            self._chan = channel
        # Ask for inline room for a few slots; fall back to less where the device refuses.
        for inline_try in (max_inline, 64, 0):
            if inline_try > max_inline:
                continue
            memset(&ia, 0, sizeof(ia))
            ia.send_cq = self.c.cq
            ia.recv_cq = self.c.rcq if self.c.rcq != NULL else self.c.cq
            ia.qp_type = IBV_QPT_RC
            ia.sq_sig_all = 0
            ia.cap.max_send_wr = sq_depth
            ia.cap.max_recv_wr = RECV_DEPTH
            ia.cap.max_send_sge = 1
            ia.cap.max_recv_sge = 1
            ia.cap.max_inline_data = inline_try
            self.c.qp = ibv_create_qp(p, &ia)
            if self.c.qp != NULL:
                self.c.max_inline = ia.cap.max_inline_data
                break
            err = errno
        if self.c.qp == NULL:
            self._free()
            raise DeviceError(f"ibv_create_qp (RC, {sq_depth} send WRs) failed", err)
        self.c.cwr.opcode = IBV_WR_RDMA_WRITE
        self.c.cwr.sg_list = &self.c.csge
        self.c.cwr.num_sge = 1
        self.c.csge.length = 8
        self.c.csge.lkey = self.c.ctl_lkey
        self.c.pwr.opcode = IBV_WR_RDMA_WRITE
        self.c.pwr.sg_list = &self.c.psge
        self.c.pwr.num_sge = 1
        self.c.psge.length = 4
        self.c.psge.lkey = self.c.ctl_lkey
        self.c.keepalive_ns = keepalive_ns
        _prep(&self.c.iwr, &self.c.isge, IBV_WR_RDMA_WRITE_WITH_IMM, &self.c.ctl.src_one, 4,
              self.c.ctl_lkey)
        rs_wr_set_imm(&self.c.iwr, 1)
        _prep(&self.c.fwr, &self.c.fsge, IBV_WR_RDMA_WRITE, &self.c.ctl.src_flag, 4,
              self.c.ctl_lkey)
        _prep(&self.c.rwr, &self.c.rsge, IBV_WR_RDMA_READ, &self.c.ctl.peer_tail, 8,
              self.c.ctl_lkey)
        pd._adopt(PD_QPS, self)
        if channel is not None:
            channel._adopt(CHANNEL_QPS, self)

    cdef void _free(self):
        """Destroy the QP, then its CQs (what exists of them)."""
        if self.c == NULL:
            return
        if self.c.qp != NULL:
            ibv_destroy_qp(self.c.qp)
            self.c.qp = NULL
        if self.c.cq != NULL:
            ibv_destroy_cq(self.c.cq)
            self.c.cq = NULL
        if self.c.rcq != NULL:
            ibv_destroy_cq(self.c.rcq)
            self.c.rcq = NULL

    def __dealloc__(self):
        if self.c != NULL:
            self._free()
            free(self.c)
            self.c = NULL

    # ---- control plane (GIL held) ----------------------------------------------------------
    @property
    def qpn(self):
        self._check()
        return self.c.qp.qp_num

    @property
    def max_inline(self):
        return self.c.max_inline

    @property
    def sq_depth(self):
        return self.c.sq_depth

    @property
    def signal_every(self):
        return self.c.signal_every

    cdef int _check(self) except -1:
        if self.c.qp == NULL:
            raise DeviceError("the queue pair is closed")
        return 0

    def modify_init(self):
        cdef ibv_qp_attr a
        cdef int rc
        self._check()
        memset(&a, 0, sizeof(a))
        a.qp_state = IBV_QPS_INIT
        a.pkey_index = 0
        a.port_num = self.port
        a.qp_access_flags = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
                             | IBV_ACCESS_REMOTE_READ)
        rc = ibv_modify_qp(self.c.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT
                           | IBV_QP_ACCESS_FLAGS)
        if rc:
            raise DeviceError("ibv_modify_qp to INIT failed", rc)
        if self.c.rcq != NULL:
            rc = _post_recvs(self.c, RECV_DEPTH)
            if rc:
                raise DeviceError("ibv_post_recv failed", rc)

    def modify_rtr(self, uint32_t dest_qpn, uint32_t rq_psn, bytes dgid, int sgid_index,
                   int mtu, int hop_limit=64, int service_level=0, int traffic_class=0):
        """Ready to receive from the peer's QP `dest_qpn`, routed by GID (RoCE needs a GRH).

        The path's class, for every packet this QP sends (its requests and its ACKs):
        `service_level` (0..15, the InfiniBand SL; RoCE: the VLAN priority where tagged) and
        `traffic_class` (0..255, the GRH's byte; RoCE v2: the IP header's TOS, DSCP in its
        upper 6 bits). Returns 0, or the errno of the refusal (the caller says what it
        means)."""
        cdef ibv_qp_attr a
        self._check()
        if len(dgid) != 16:
            raise ValueError("a GID is 16 bytes")
        if not 0 <= service_level <= 15 or not 0 <= traffic_class <= 255:
            raise ValueError(f"service_level must be 0..15 and traffic_class 0..255, not "
                             f"{service_level} and {traffic_class}")
        memset(&a, 0, sizeof(a))
        a.qp_state = IBV_QPS_RTR
        a.path_mtu = <ibv_mtu>mtu
        a.dest_qp_num = dest_qpn
        a.rq_psn = rq_psn & 0xFFFFFF
        a.max_dest_rd_atomic = 1
        a.min_rnr_timer = 12
        a.ah_attr.is_global = 1
        rs_ah_set_dgid(&a.ah_attr, <const uint8_t *>dgid)
        a.ah_attr.grh.sgid_index = <uint8_t>sgid_index
        a.ah_attr.grh.hop_limit = <uint8_t>hop_limit
        a.ah_attr.grh.traffic_class = <uint8_t>traffic_class
        a.ah_attr.port_num = self.port
        a.ah_attr.sl = <uint8_t>service_level
        return ibv_modify_qp(self.c.qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU
                             | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC
                             | IBV_QP_MIN_RNR_TIMER)

    def modify_rts(self, uint32_t sq_psn, int timeout=14, int retry_cnt=6):
        """Ready to send. A WRITE that is not acknowledged within about
        4.096 us * 2**timeout is resent, retry_cnt times, then fails the QP.

        retry_cnt 7 is refused: rdma_rxe treats it as "retry for ever", so a dead peer would
        never surface."""
        cdef ibv_qp_attr a
        cdef int rc
        self._check()
        if not 0 <= retry_cnt <= 6 or not 1 <= timeout <= 31:
            raise ValueError("retry_cnt must be 0..6 and timeout 1..31")
        memset(&a, 0, sizeof(a))
        a.qp_state = IBV_QPS_RTS
        a.sq_psn = sq_psn & 0xFFFFFF
        a.timeout = <uint8_t>timeout
        a.retry_cnt = <uint8_t>retry_cnt
        a.rnr_retry = 7
        a.max_rd_atomic = 1
        rc = ibv_modify_qp(self.c.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT
                           | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)
        if rc:
            raise DeviceError("ibv_modify_qp to RTS failed", rc)

    def modify_error(self):
        """Move to the error state: incoming writes are dropped from now on, posts fail."""
        cdef ibv_qp_attr a
        if self.c.qp == NULL:
            return
        memset(&a, 0, sizeof(a))
        a.qp_state = IBV_QPS_ERR
        ibv_modify_qp(self.c.qp, &a, IBV_QP_STATE)

    def query_state(self):
        """The QP state as libibverbs names it (RESET, INIT, RTR, RTS, SQD, SQE, ERR)."""
        cdef ibv_qp_attr a
        cdef ibv_qp_init_attr ia
        if self.c.qp == NULL:
            return "DESTROYED"
        if ibv_query_qp(self.c.qp, &a, IBV_QP_STATE, &ia):
            return "UNKNOWN"
        return {IBV_QPS_RESET: "RESET", IBV_QPS_INIT: "INIT", IBV_QPS_RTR: "RTR",
                IBV_QPS_RTS: "RTS", IBV_QPS_SQD: "SQD", IBV_QPS_SQE: "SQE",
                IBV_QPS_ERR: "ERR"}.get(a.qp_state, "UNKNOWN")

    def set_peer_ctl(self, uint64_t addr, uint32_t rkey):
        """Where the peer's control block is: credits and closing flags go there."""
        rs_wr_set_rdma(&self.c.cwr, addr + CTL_CREDIT, rkey)
        rs_wr_set_rdma(&self.c.pwr, addr + CTL_PROBE, rkey)
        rs_wr_set_rdma(&self.c.iwr, addr + CTL_PROBE, rkey)
        rs_wr_set_rdma(&self.c.fwr, addr + CTL_SLEEP_FLAG, rkey)
        rs_wr_set_rdma(&self.c.rwr, addr + CTL_TAIL_PUB, rkey)

    def poll(self):
        """Poll the send CQ once; returns the completions seen."""
        cdef int n
        _lock(self.c)
        n = _reap(self.c)
        _unlock(self.c)
        return n

    def notify(self, int offset, double timeout_s=0.2):
        """WRITE 1 into the peer's control block at `offset` (CTL_RX_CLOSED, CTL_GONE) and
        wait up to `timeout_s` for it to complete. True if it did. Never raises."""
        cdef ibv_send_wr wr
        cdef ibv_sge sge
        cdef uint32_t one = 1
        cdef uint64_t id, start, limit = <uint64_t>(timeout_s * 1e9)
        cdef int rc
        if self.c.qp == NULL or self.c.failed:
            return False
        memset(&wr, 0, sizeof(wr))
        wr.opcode = IBV_WR_RDMA_WRITE
        wr.sg_list = &sge
        wr.num_sge = 1
        sge.length = 4
        sge.lkey = self.c.ctl_lkey
        if self.c.max_inline >= 4:
            sge.addr = <uint64_t><size_t>&one
            wr.send_flags = IBV_SEND_INLINE
        else:
            sge.addr = <uint64_t><size_t>&self.c.ctl.src_one
        rs_wr_set_rdma(&wr, rs_wr_remote_addr(&self.c.cwr) - CTL_CREDIT + offset,
                       rs_wr_rkey(&self.c.cwr))
        with nogil:
            rc = _post(self.c, &wr, 1, True)
            _lock(self.c)
            id = self.c.posted
            _unlock(self.c)
            start = rs_now_ns()
            while rc == 0:
                _lock(self.c)
                _reap(self.c)
                if self.c.failed:
                    rc = -1
                elif self.c.retired >= id:
                    _unlock(self.c)
                    break
                _unlock(self.c)
                if rs_now_ns() - start > limit:
                    rc = -1
                    break
                rs_pause()
        return rc == 0

    def failure(self):
        """None while the QP works; else a dict saying how it failed."""
        if self.c.failed == 0:
            return None
        d = {"kind": self.c.failed, "wc_status": None, "errno": None}
        if self.c.failed == VB_WC_ERROR:
            d["wc_status"] = self.c.wc_status
            d["wc_status_str"] = ibv_wc_status_str(<ibv_wc_status>self.c.wc_status).decode()
        elif self.c.failed == VB_POST_ERROR:
            d["errno"] = self.c.post_errno
            d["strerror"] = os.strerror(self.c.post_errno)
        return d

    @property
    def peer_closed(self):
        """1 if the peer wrote that it closed the connection."""
        return rs_load_acquire_u32(&self.c.ctl.gone)

    def mark_closed(self):
        """Fail the connection here (closed locally, or the peer reconnected)."""
        _lock(self.c)
        _fail(self.c, VB_CLOSED)
        _unlock(self.c)

    cdef bint _is_open(self):
        return self.c != NULL and (self.c.qp != NULL or self.c.cq != NULL
                                   or self.c.rcq != NULL)

    cdef int _destroy(self) except -1:
        """The QP, then its completion queues, under the lock and marking the connection
        closed: a lane's next post fails instead of posting."""
        _lock(self.c)
        _fail(self.c, VB_CLOSED)
        self._free()
        _unlock(self.c)
        self._ctl_mr = None
        self._chan = None
        return 0

    def stats(self):
        c = self.c
        return {"posted": c.posted, "retired": c.retired, "signalled": c.signalled,
                "cq_polls": c.cq_polls, "sq_waits": c.sq_waits, "writes": c.writes,
                "credit_writes": c.credit_writes, "keepalives": c.keepalives,
                "sq_depth": c.sq_depth, "signal_every": c.signal_every,
                "max_inline": c.max_inline, "failed": c.failed, "wakes_sent": c.wakes_sent,
                "sleeps": c.sleeps, "wakeups": c.wakeups}
