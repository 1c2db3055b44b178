# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""The verbs transport's hot part: RC queue pairs, posting slot writes, credit writes.

pyverbs (rdmasched/transport/verbs.py) finds the devices and queries them (port state, GID
table). The objects the data path posts on are made here with libibverbs directly: the
device context, the protection domain, the memory regions, the completion queue and the
queue pair. rdma-core 44's pyverbs exposes none of the context, PD, CQ or QP pointers (its
`Context.context` and `PD.pd` return the pointer cast to a Python object, not an address),
and the per-message path must post and poll without the GIL and without a Python object per
message.

One `QueuePair` per peer pair carries both directions' traffic of this node: the WRITEs of
this node's outbound lane (slots into the peer's ring) and the WRITEs of the credit of this
node's inbound lane from that peer (into the peer's control block). Both lanes share the
send queue, so its accounting (posted, retired, signalled) sits under a small spin lock.

Selective signalling: only every `signal_every`-th work request asks for a completion. A
completion for request k retires every request up to k (an RC send queue completes in
order). A post of k requests (k <= 3) first makes room: while posted + k - retired would
exceed `sq_depth`, it polls the CQ. Because at most `signal_every - 1` requests in a row are
unsignalled and sq_depth >= signal_every + MAX_WR_PER_POST, a full queue always holds a
signalled request whose completion frees room: the send queue can never overflow.

Teardown order (done by verbs.py, which owns the resources): queue pair, then the memory
regions, then the completion queue, then the protection domain, then the context.
`QueuePair.destroy_qp` and `destroy_cq` are the two halves; the C state stays allocated
until the Python object goes, so a lane that still points at it finds it failed, not freed.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memset
from libc.stdlib cimport calloc, free
from posix.stdlib cimport posix_memalign
from libc.errno cimport errno
from posix.time cimport nanosleep, timespec
from posix.fcntl cimport fcntl, F_GETFL, F_SETFL, O_NONBLOCK

from rdmasched._wire cimport (
    rs_slot, rs_load_acquire_u64, rs_load_acquire_u32, rs_store_release_u32, rs_cas_u32,
    rs_store_release_u64, rs_fence, rs_pause, rs_now_ns,
)
from rdmasched._ring cimport (
    rs_rx, rs_tx, RxLane, TxLane, LaneSet, Batch, rs_rx_init, rs_tx_init, rs_rx_begin_epoch,
    rs_rx_publish_credit, rs_rx_drained, RS_NOROOM, RS_NOTREADY, RS_CLOSED, RS_DEAD,
)
from libc.stdlib cimport realloc

import os

from rdmasched.errors import DeviceError, PeerDeadError

cdef extern from "<infiniband/verbs.h>" nogil:
    struct ibv_context:
        pass
    struct ibv_pd:
        pass
    struct ibv_comp_channel:
        int fd
    struct ibv_srq:
        pass
    struct ibv_cq:
        pass

    enum ibv_qp_state:
        IBV_QPS_RESET
        IBV_QPS_INIT
        IBV_QPS_RTR
        IBV_QPS_RTS
        IBV_QPS_SQD
        IBV_QPS_SQE
        IBV_QPS_ERR
        IBV_QPS_UNKNOWN
    enum ibv_qp_type:
        IBV_QPT_RC
    enum ibv_mtu:
        IBV_MTU_256
        IBV_MTU_4096
    enum ibv_wr_opcode:
        IBV_WR_RDMA_WRITE
        IBV_WR_RDMA_WRITE_WITH_IMM
        IBV_WR_RDMA_READ
    enum:
        IBV_SEND_SIGNALED
        IBV_SEND_INLINE
    enum ibv_wc_status:
        IBV_WC_SUCCESS
        IBV_WC_WR_FLUSH_ERR
    enum:
        IBV_ACCESS_LOCAL_WRITE
        IBV_ACCESS_REMOTE_WRITE
        IBV_ACCESS_REMOTE_READ
    enum:
        IBV_QP_STATE
        IBV_QP_ACCESS_FLAGS
        IBV_QP_PKEY_INDEX
        IBV_QP_PORT
        IBV_QP_AV
        IBV_QP_PATH_MTU
        IBV_QP_TIMEOUT
        IBV_QP_RETRY_CNT
        IBV_QP_RNR_RETRY
        IBV_QP_RQ_PSN
        IBV_QP_MAX_QP_RD_ATOMIC
        IBV_QP_MIN_RNR_TIMER
        IBV_QP_SQ_PSN
        IBV_QP_MAX_DEST_RD_ATOMIC
        IBV_QP_DEST_QPN

    struct ibv_qp:
        uint32_t qp_num
        ibv_qp_state state

    struct ibv_sge:
        uint64_t addr
        uint32_t length
        uint32_t lkey

    struct ibv_send_wr:
        uint64_t wr_id
        ibv_send_wr *next
        ibv_sge *sg_list
        int num_sge
        ibv_wr_opcode opcode
        unsigned int send_flags

    struct ibv_wc:
        uint64_t wr_id
        ibv_wc_status status
        uint32_t vendor_err
        uint32_t qp_num

    struct ibv_qp_cap:
        uint32_t max_send_wr
        uint32_t max_recv_wr
        uint32_t max_send_sge
        uint32_t max_recv_sge
        uint32_t max_inline_data

    struct ibv_qp_init_attr:
        void *qp_context
        ibv_cq *send_cq
        ibv_cq *recv_cq
        ibv_srq *srq
        ibv_qp_cap cap
        ibv_qp_type qp_type
        int sq_sig_all

    struct ibv_global_route:
        uint32_t flow_label
        uint8_t sgid_index
        uint8_t hop_limit
        uint8_t traffic_class

    struct ibv_ah_attr:
        ibv_global_route grh
        uint16_t dlid
        uint8_t sl
        uint8_t src_path_bits
        uint8_t static_rate
        uint8_t is_global
        uint8_t port_num

    struct ibv_qp_attr:
        ibv_qp_state qp_state
        ibv_mtu path_mtu
        uint32_t rq_psn
        uint32_t sq_psn
        uint32_t dest_qp_num
        unsigned int qp_access_flags
        ibv_qp_cap cap
        ibv_ah_attr ah_attr
        uint16_t pkey_index
        uint8_t max_rd_atomic
        uint8_t max_dest_rd_atomic
        uint8_t min_rnr_timer
        uint8_t port_num
        uint8_t timeout
        uint8_t retry_cnt
        uint8_t rnr_retry

    struct ibv_device:
        pass
    struct ibv_mr:
        void *addr
        size_t length
        uint32_t lkey
        uint32_t rkey

    struct ibv_recv_wr:
        uint64_t wr_id
        ibv_recv_wr *next
        ibv_sge *sg_list
        int num_sge

    ibv_comp_channel *ibv_create_comp_channel(ibv_context *context)
    int ibv_destroy_comp_channel(ibv_comp_channel *channel)
    int ibv_req_notify_cq(ibv_cq *cq, int solicited_only)
    int ibv_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context)
    void ibv_ack_cq_events(ibv_cq *cq, unsigned int nevents)
    int ibv_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr)
    ibv_device **ibv_get_device_list(int *num_devices)
    void ibv_free_device_list(ibv_device **list)
    const char *ibv_get_device_name(ibv_device *device)
    ibv_context *ibv_open_device(ibv_device *device)
    int ibv_close_device(ibv_context *context)
    ibv_pd *ibv_alloc_pd(ibv_context *context)
    int ibv_dealloc_pd(ibv_pd *pd)
    ibv_mr *ibv_reg_mr(ibv_pd *pd, void *addr, size_t length, int access)
    int ibv_dereg_mr(ibv_mr *mr)
    ibv_cq *ibv_create_cq(ibv_context *context, int cqe, void *cq_context,
                          ibv_comp_channel *channel, int comp_vector)
    int ibv_destroy_cq(ibv_cq *cq)
    ibv_qp *ibv_create_qp(ibv_pd *pd, ibv_qp_init_attr *qp_init_attr)
    int ibv_destroy_qp(ibv_qp *qp)
    int ibv_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask)
    int ibv_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr)
    int ibv_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr)
    int ibv_poll_cq(ibv_cq *cq, int num_entries, ibv_wc *wc)
    const char *ibv_wc_status_str(ibv_wc_status status)

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum:
        POLLIN

cdef extern from "rs_verbs.h" nogil:
    void rs_wr_set_rdma(ibv_send_wr *wr, uint64_t remote_addr, uint32_t rkey)
    uint64_t rs_wr_remote_addr(const ibv_send_wr *wr)
    uint32_t rs_wr_rkey(const ibv_send_wr *wr)
    void rs_wr_set_imm(ibv_send_wr *wr, uint32_t imm)
    void rs_ah_set_dgid(ibv_ah_attr *ah, const uint8_t *gid)


# ---- device context, protection domain, memory regions -----------------------------------------
# rdma-core 44's pyverbs returns the ibv_context and ibv_pd pointers as `<object>ptr` (a bogus
# Python object, not an address; fixed upstream later), so the data path cannot take them from
# pyverbs objects. It opens its own context and PD here; pyverbs still does the discovery and
# the queries (device list, port state, GID table) in verbs.py.

cdef class DeviceContext:
    """An open RDMA device (ibv_context). Parent of a ProtectionDomain and of every CQ."""

    cdef ibv_context *ctx
    cdef readonly str name

    def __cinit__(self, str name):
        cdef int n = 0, i
        cdef ibv_device **devs = ibv_get_device_list(&n)
        cdef int err
        if devs == NULL:
            raise DeviceError("ibv_get_device_list failed (no RDMA devices)", errno)
        try:
            for i in range(n):
                if ibv_get_device_name(devs[i]).decode() == name:
                    self.ctx = ibv_open_device(devs[i])
                    if self.ctx == NULL:
                        err = errno
                        raise DeviceError(f"ibv_open_device({name!r}) failed", err)
                    break
            else:
                raise DeviceError(f"RDMA device {name!r} not found")
        finally:
            ibv_free_device_list(devs)
        self.name = name

    def close(self):
        """Close the device (after its protection domain). Safe to call twice."""
        cdef int rc
        if self.ctx != NULL:
            rc = ibv_close_device(self.ctx)
            if rc != 0:
                raise DeviceError(f"ibv_close_device({self.name!r}) failed", rc)
            self.ctx = NULL

    @property
    def closed(self):
        return self.ctx == NULL

    def __dealloc__(self):
        if self.ctx != NULL:
            ibv_close_device(self.ctx)
            self.ctx = NULL


cdef class ProtectionDomain:
    """An ibv_pd on a DeviceContext: parent of the QPs and MRs of one endpoint."""

    cdef ibv_pd *pd
    cdef readonly DeviceContext context

    def __cinit__(self, DeviceContext context not None):
        if context.ctx == NULL:
            raise DeviceError("the device context is closed")
        self.pd = ibv_alloc_pd(context.ctx)
        if self.pd == NULL:
            raise DeviceError(f"ibv_alloc_pd on {context.name!r} failed", errno)
        self.context = context

    def register(self, size_t length, int access):
        """Allocate `length` zeroed, page-aligned bytes and register them with `access`."""
        return MemoryRegion._create(self, length, access)

    def close(self):
        """Free the PD (after its QPs and MRs). Safe to call twice."""
        cdef int rc
        if self.pd != NULL:
            rc = ibv_dealloc_pd(self.pd)
            if rc != 0:
                raise DeviceError("ibv_dealloc_pd failed (close its queue pairs and memory "
                                  "regions first)", rc)
            self.pd = NULL

    @property
    def closed(self):
        return self.pd == NULL

    def __dealloc__(self):
        if self.pd != NULL:
            ibv_dealloc_pd(self.pd)
            self.pd = NULL


cdef class CompletionChannel:
    """An ibv_comp_channel: the file descriptor a sleeping receiver blocks on. Every
    connection's receive CQ of an endpoint reports to it. Freed after those CQs."""

    cdef ibv_comp_channel *ch
    cdef readonly DeviceContext context

    def __cinit__(self, DeviceContext context not None):
        cdef int flags
        if context.ctx == NULL:
            raise DeviceError("the device context is closed")
        self.ch = ibv_create_comp_channel(context.ctx)
        if self.ch == NULL:
            raise DeviceError("ibv_create_comp_channel failed", errno)
        flags = fcntl(self.ch.fd, F_GETFL)
        if flags < 0 or fcntl(self.ch.fd, F_SETFL, flags | O_NONBLOCK) < 0:
            err = errno
            ibv_destroy_comp_channel(self.ch)
            self.ch = NULL
            raise DeviceError("making the completion channel non-blocking failed", err)
        self.context = context

    @property
    def fd(self):
        return self.ch.fd if self.ch != NULL else -1

    def close(self):
        """After every CQ on it. Safe to call twice."""
        cdef int rc
        if self.ch != NULL:
            rc = ibv_destroy_comp_channel(self.ch)
            if rc != 0:
                raise DeviceError("ibv_destroy_comp_channel failed (a CQ still uses it)", rc)
            self.ch = NULL

    @property
    def closed(self):
        return self.ch == NULL

    def __dealloc__(self):
        if self.ch != NULL:
            ibv_destroy_comp_channel(self.ch)
            self.ch = NULL


cdef class MemoryRegion:
    """Registered memory it allocated itself; `buf`, `length`, `lkey`, `rkey` as in pyverbs."""

    cdef ibv_mr *mr
    cdef void *mem
    cdef size_t _length
    cdef ProtectionDomain _pd

    @staticmethod
    cdef MemoryRegion _create(ProtectionDomain pd, size_t length, int access):
        cdef MemoryRegion self = MemoryRegion.__new__(MemoryRegion)
        cdef int err
        if pd.pd == NULL:
            raise DeviceError("the protection domain is closed")
        if length == 0:
            raise ValueError("cannot register 0 bytes")
        err = posix_memalign(&self.mem, 4096, length)
        if err != 0:
            raise MemoryError(f"posix_memalign({length}) failed")
        memset(self.mem, 0, length)
        self.mr = ibv_reg_mr(pd.pd, self.mem, length, access)
        if self.mr == NULL:
            err = errno
            free(self.mem)
            self.mem = NULL
            raise DeviceError(f"ibv_reg_mr of {length} bytes failed", err)
        self._length = length
        self._pd = pd
        return self

    @property
    def buf(self):
        return <size_t>self.mem

    @property
    def length(self):
        return self._length

    @property
    def lkey(self):
        return self.mr.lkey if self.mr != NULL else 0

    @property
    def rkey(self):
        return self.mr.rkey if self.mr != NULL else 0

    @property
    def closed(self):
        return self.mr == NULL

    def close(self):
        """Deregister and free (after every QP that could access it). Safe to call twice."""
        if self.mr != NULL:
            ibv_dereg_mr(self.mr)
            self.mr = NULL
        if self.mem != NULL:
            free(self.mem)
            self.mem = NULL

    def __dealloc__(self):
        self.close()


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


cdef class QueuePair:
    """One RC queue pair and its send completion queue, in the protection domain `pd`.

    Keeps `pd` and the control block `ctl_mr` alive (a child holds its parent) but does not
    own them. Made by verbs.Connection, which owns it.
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

    cdef void _free(self):
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
            raise DeviceError("the queue pair was destroyed")
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
                   int mtu, int hop_limit=64):
        """Ready to receive from the peer's QP `dest_qpn`, routed by GID (RoCE needs a GRH).

        Returns 0, or the errno of the refusal (the caller says what it means)."""
        cdef ibv_qp_attr a
        self._check()
        if len(dgid) != 16:
            raise ValueError("a GID is 16 bytes")
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
        a.ah_attr.port_num = self.port
        a.ah_attr.sl = 0
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

    def destroy_qp(self):
        """First step of teardown. Safe to call twice."""
        _lock(self.c)
        _fail(self.c, VB_CLOSED)
        if self.c.qp != NULL:
            ibv_destroy_qp(self.c.qp)
            self.c.qp = NULL
        _unlock(self.c)

    def destroy_cq(self):
        """After the QP and the memory regions. Safe to call twice."""
        if self.c.qp != NULL:
            raise DeviceError("destroy the queue pair before its completion queue")
        if self.c.cq != NULL:
            ibv_destroy_cq(self.c.cq)
            self.c.cq = NULL
        if self.c.rcq != NULL:
            ibv_destroy_cq(self.c.rcq)
            self.c.rcq = NULL
        self._ctl_mr = None
        self._chan = None

    @property
    def destroyed(self):
        return self.c.qp == NULL

    def stats(self):
        c = self.c
        return {"posted": c.posted, "retired": c.retired, "signalled": c.signalled,
                "cq_polls": c.cq_polls, "sq_waits": c.sq_waits, "writes": c.writes,
                "credit_writes": c.credit_writes, "keepalives": c.keepalives,
                "sq_depth": c.sq_depth, "signal_every": c.signal_every,
                "max_inline": c.max_inline, "failed": c.failed, "wakes_sent": c.wakes_sent,
                "sleeps": c.sleeps, "wakeups": c.wakeups}


# ---- receiver ---------------------------------------------------------------------------------
cdef struct vb_rx:
    vb_conn *conn            # where the credits go
    vb_conn *next            # the next connection (a reconnected sender), with `pending`
    uint32_t pending         # epoch to begin once drained; 0: none (release-stored last)
    uint64_t last_pub_ns
    uint32_t idle_calls      # the clock and the CQ are looked at every IDLE_CHECK_EVERY calls
    uint64_t switches


cdef int _publish(rs_rx *r, uint64_t credit) noexcept nogil:
    cdef vb_rx *x = <vb_rx *>r.ctx
    cdef vb_conn *c = x.conn
    if c == NULL or c.failed or rs_load_acquire_u32(&c.ctl.gone):
        return 0             # nobody to tell; the idle hook marks the lane once it is drained
    _post_credit(c, credit)
    x.idle_calls = 0         # a credit just went out: the next keepalive can wait
    return 0


cdef int _rx_idle(rs_rx *r) noexcept nogil:
    """Runs when the lane is empty at its head (drained): switch to a reconnected sender,
    notice a closed or failed peer, and keep the credit fresh (the keepalive)."""
    cdef vb_rx *x = <vb_rx *>r.ctx
    cdef uint32_t pending = rs_load_acquire_u32(&x.pending)
    cdef vb_conn *c
    cdef uint64_t now
    if pending != 0 and pending != r.epoch:
        if not rs_rx_drained(r):
            return 0           # a message of the old epoch can still be delivered (PROTOCOL.md 8)
        x.conn = x.next
        x.switches += 1
        rs_rx_begin_epoch(r, pending)      # publishes (pending << 32 | 0): the sender may go
        return 0
    c = x.conn
    if c == NULL:
        return 0
    if rs_load_acquire_u32(&c.ctl.gone):
        r.dead = DEAD_GONE
        return 0
    if c.failed:
        r.dead = DEAD_FAILED
        return 0
    # Reading the clock can cost microseconds (a VM's HPET: about 1.6 us under qemu), and
    # this runs inside the receiver's spin: look at it, and at the CQ, only now and then.
    x.idle_calls += 1
    if (x.idle_calls & (IDLE_CHECK_EVERY - 1)) != 0:
        return 0
    now = rs_now_ns()
    if now - x.last_pub_ns >= c.keepalive_ns:
        x.last_pub_ns = now
        c.keepalives += 1
        _post_credit(c, (<uint64_t>r.epoch << 32) | (r.credited & 0xFFFFFFFFu))
    _poll_once(c)
    if c.failed:
        r.dead = DEAD_FAILED
    return 0


cdef class VerbsRxLane(RxLane):
    """Receiving end of a verbs lane: the ring is a memory region that only this lane's peer
    has the rkey of. Made by verbs.Connection; the lane owns its ring's memory region."""

    cdef vb_rx x
    cdef QueuePair _qp
    cdef QueuePair _next_qp
    cdef object _mr
    cdef public object _explain
    cdef public object _on_close

    @staticmethod
    def _create(str name, mr, uint32_t nslots, uint32_t epoch, uint64_t grace_ns):
        cdef VerbsRxLane lane = VerbsRxLane.__new__(VerbsRxLane)
        cdef rs_slot *ring = <rs_slot *><size_t>mr.buf
        if mr.length < nslots * sizeof(rs_slot):
            raise ValueError("memory region too small for the lane")
        memset(ring, 0, nslots * sizeof(rs_slot))
        lane.name = name
        lane._mr = mr
        rs_rx_init(&lane.st, ring, nslots, epoch, grace_ns)
        lane.x.last_pub_ns = rs_now_ns()
        lane.st.publish = _publish
        lane.st.idle_hook = _rx_idle
        lane.st.ctx = &lane.x
        lane._open = True
        return lane

    def attach(self, QueuePair qp not None):
        """The first connection: credits go out on `qp`."""
        self._qp = qp
        self.x.conn = qp.c

    def publish(self):
        """Publish the credit now (the first one tells a new sender its epoch is accepted)."""
        rs_rx_publish_credit(&self.st)

    def reconnect(self, QueuePair qp not None, uint32_t epoch):
        """A new incarnation of the sender connected on `qp` with `epoch`. The poller switches
        to it once the old epoch is drained (the old QP must already be in the error state,
        so nothing of the old sender lands after that)."""
        if epoch == 0 or epoch == self.st.epoch:
            raise ValueError("a reconnected sender needs a new, non-zero epoch")
        self._next_qp = qp
        self.x.next = qp.c
        rs_store_release_u32(&self.x.pending, epoch)
        if self.st.dead == DEAD_FAILED or self.st.dead == DEAD_GONE:
            self.st.dead = 0        # set by the idle hook after draining: safe to revive

    def promote(self):
        """If the poller switched to the reconnected sender, forget the old QP; return it."""
        cdef QueuePair old
        if self._next_qp is None or self.st.epoch != rs_load_acquire_u32(&self.x.pending):
            return None
        old = self._qp
        self._qp = self._next_qp
        self._next_qp = None
        return old

    @property
    def queue_pair(self):
        return self._qp

    @property
    def pending_epoch(self):
        return rs_load_acquire_u32(&self.x.pending)

    @property
    def dead_code(self):
        return self.st.dead

    @property
    def memory_region(self):
        return self._mr

    def release_memory(self):
        """Deregister the ring (the lane is closed and no QP can write into it any more)."""
        if self._mr is not None:
            self._mr.close()
            self._mr = None

    def vstats(self):
        d = self.stats()
        d["switches"] = self.x.switches
        d["pending_epoch"] = self.x.pending
        return d

    cdef object _dead_message(self):
        if self._explain is not None:
            try:
                return self._explain(self.st.dead)
            except Exception as exc:
                return f"lane {self.name!r}: dead ({self.st.dead}; {exc})"
        return f"lane {self.name!r}: the peer is gone ({self.st.dead})"

    cdef void _close_transport(self):
        self.x.conn = NULL
        self.x.next = NULL
        if self._on_close is not None:
            try:
                self._on_close(self)
            except Exception as exc:
                import logging
                logging.getLogger("rdmasched.verbs").warning(
                    "closing lane %r: %s", self.name, exc)
        else:
            self.release_memory()


# ---- sender -----------------------------------------------------------------------------------
cdef struct vb_tx:
    vb_conn *conn
    uint64_t last_probe_ns   # while it waits for credit, the sender probes the peer
    rs_slot *shadow          # the registered local copy of the ring the slots are encoded in
    uint64_t raddr           # the peer's ring
    uint32_t nslots
    ibv_send_wr wr[3]        # prepared once: opcode, rkey, lkey, sge links
    ibv_sge sge[3]


cdef inline uint32_t _add_range(vb_tx *x, uint32_t k, uint64_t pos, uint32_t n,
                                uint32_t mask) noexcept nogil:
    """Append WRITE(s) for slots [pos, pos + n) of the ring: one, or two if it wraps."""
    cdef uint32_t i = <uint32_t>(pos & mask)
    cdef uint32_t first = x.nslots - i
    if first > n:
        first = n
    _set_wr(x, k, i, first)
    k += 1
    if first < n:
        _set_wr(x, k, 0, n - first)
        k += 1
    return k


cdef inline void _set_wr(vb_tx *x, uint32_t k, uint32_t slot, uint32_t count) noexcept nogil:
    cdef uint32_t nbytes = count * <uint32_t>sizeof(rs_slot)
    x.sge[k].addr = <uint64_t><size_t>&x.shadow[slot]
    x.sge[k].length = nbytes
    rs_wr_set_rdma(&x.wr[k], x.raddr + <uint64_t>slot * sizeof(rs_slot),
                   rs_wr_rkey(&x.wr[k]))
    x.wr[k].send_flags = IBV_SEND_INLINE if nbytes <= x.conn.max_inline else 0
    x.wr[k].next = NULL
    if k > 0:
        x.wr[k - 1].next = &x.wr[k]


cdef int _commit(rs_tx *t, uint64_t pos, uint32_t n) noexcept nogil:
    """Post the message just encoded in the shadow at [pos, pos + n).

    Its continuation slots go first and its head last, as separate WRITEs: RC executes them
    in order, so a receiver that sees the head sees the whole message, as on shm (a single
    WRITE of several packets could land head first). A one-slot message is one WRITE.
    """
    cdef vb_tx *x = <vb_tx *>t.ctx
    cdef uint32_t k = 0
    cdef int rc
    if n > 1:
        k = _add_range(x, k, pos + 1, n - 1, t.mask)
    k = _add_range(x, k, pos, 1, t.mask)
    x.conn.writes += k
    rc = _post(x.conn, &x.wr[0], k)
    if rc == 0 and x.conn.rcq != NULL:
        _wake_peer_if_asleep(x.conn, t.tail)
    return rc


cdef int _tx_ready(rs_tx *t) noexcept nogil:
    """Accepted once the receiver's credit carries our epoch. Polls the send CQ, so a failed
    connection marks the lane dead during a wait."""
    cdef vb_tx *x = <vb_tx *>t.ctx
    cdef uint64_t now
    if t.acked:
        # Waiting for credit: all our writes may have completed long ago, so a peer that
        # died since would never show. Probe it now and then.
        now = rs_now_ns()
        if x.last_probe_ns == 0:
            x.last_probe_ns = now
        elif now - x.last_probe_ns >= x.conn.keepalive_ns:
            x.last_probe_ns = now
            _post_probe(x.conn)
    _poll_once(x.conn)
    if x.conn.failed:
        t.dead = x.conn.failed
        return 0
    return <uint32_t>(rs_load_acquire_u64(t.credit) >> 32) == t.epoch


cdef class VerbsTxLane(TxLane):
    """Sending end of a verbs lane: slots are encoded into a registered shadow ring and
    written into the peer's ring with RDMA WRITE. Made by verbs.Connection."""

    cdef vb_tx x
    cdef QueuePair _qp
    cdef object _mr
    cdef public object _explain
    cdef public object _on_close

    @staticmethod
    def _create(str name, QueuePair qp not None, shadow_mr, uint32_t nslots, uint32_t epoch,
                uint64_t raddr, uint32_t rkey, uint32_t src):
        cdef VerbsTxLane lane = VerbsTxLane.__new__(VerbsTxLane)
        cdef int k
        if src > 0xFFFF:
            raise ValueError("src must be 0..65535")
        if shadow_mr.length < nslots * sizeof(rs_slot):
            raise ValueError("shadow memory region too small for the lane")
        if epoch == 0:
            raise ValueError("epoch 0 is never valid")
        lane.name = name
        lane._qp = qp
        lane._mr = shadow_mr
        lane.x.conn = qp.c
        lane.x.shadow = <rs_slot *><size_t>shadow_mr.buf
        lane.x.raddr = raddr
        lane.x.nslots = nslots
        memset(lane.x.shadow, 0, nslots * sizeof(rs_slot))
        for k in range(MAX_WR_PER_POST):
            lane.x.wr[k].opcode = IBV_WR_RDMA_WRITE
            lane.x.wr[k].sg_list = &lane.x.sge[k]
            lane.x.wr[k].num_sge = 1
            lane.x.sge[k].lkey = shadow_mr.lkey
            rs_wr_set_rdma(&lane.x.wr[k], raddr, rkey)
        rs_tx_init(&lane.st, lane.x.shadow, nslots, epoch, &qp.c.ctl.credit)
        lane.st.src = <uint16_t>src
        lane.st.closed = &qp.c.ctl.rx_closed
        lane.st.commit = _commit
        lane.st.ready = _tx_ready
        lane.st.ctx = &lane.x
        # As on shm, a new lane's first epoch is accepted in advance: the bootstrap handed us
        # the ring of a receiver whose head is 0, so there is nothing to wait for. Only a
        # reconnecting sender (epoch >= 2) waits for the credit carrying its epoch, sent once
        # the receiver has drained the previous one.
        lane.st.acked = 1 if epoch == 1 else 0
        lane._open = True
        return lane

    @property
    def acked(self):
        """Whether the receiver has accepted this sender's epoch yet."""
        if not self.st.acked and self._open and _tx_ready(&self.st):
            self.st.acked = 1
        return bool(self.st.acked)

    @property
    def queue_pair(self):
        return self._qp

    @property
    def dead_code(self):
        return self.st.dead

    def kill(self, int code=VB_CLOSED):
        """Mark the lane dead from the control plane (its peer is gone or replaced)."""
        if self.st.dead == 0:
            self.st.dead = code

    def vstats(self):
        d = self.stats()
        d.update(self._qp.stats())
        return d

    cdef int _fail(self, int rc, uint32_t n, uint64_t timeout_ns) except -1:
        if (rc == RS_DEAD or rc == RS_CLOSED) and self._explain is not None:
            raise PeerDeadError(self._explain(rc))
        return TxLane._fail(self, rc, n, timeout_ns)

    def _peer_note(self):
        if self._explain is not None and (self._qp.failure() is not None
                                          or self._qp.peer_closed):
            return "; " + self._explain(RS_DEAD)
        return ""

    cdef void _close_transport(self):
        if self._on_close is not None:
            try:
                self._on_close(self)
            except Exception as exc:
                import logging
                logging.getLogger("rdmasched.verbs").warning(
                    "closing lane %r: %s", self.name, exc)


# ---- adaptive blocking ------------------------------------------------------------------------
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
    """

    cdef list _chans
    cdef pollfd *_fds
    cdef ibv_comp_channel **_chs
    cdef uint32_t _nfds
    cdef readonly uint64_t sleeps
    cdef readonly uint64_t wakeups
    cdef readonly uint64_t sleeps_refused

    def __cinit__(self):
        self._chans = []
        self._fds = NULL
        self._chs = NULL
        self._nfds = 0

    def __dealloc__(self):
        free(self._fds)
        free(self._chs)

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
            fds = <pollfd *>realloc(self._fds, (self._nfds + 1) * sizeof(pollfd))
            if fds == NULL:
                raise MemoryError()
            self._fds = fds
            chs = <ibv_comp_channel **>realloc(self._chs,
                                               (self._nfds + 1) * sizeof(ibv_comp_channel *))
            if chs == NULL:
                raise MemoryError()
            self._chs = chs
            self._chs[self._nfds] = ch.ch
            self._fds[self._nfds].fd = ch.ch.fd
            self._fds[self._nfds].events = POLLIN
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
            now = rs_now_ns()
            if now - start >= timeout_ns:
                return 0
            if now - start < spin_ns or self._nfds == 0:
                rs_pause()
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
        cdef uint64_t spent
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
        got = self._drain(batch, quantum)
        if got or busy:
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
        n = poll(self._fds, self._nfds, ms)
        if n > 0:
            self.wakeups += 1
            for k in range(self._nfds):
                if self._fds[k].revents:
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
