# _verbs_lanes.pxi (included by _verbs.pyx): the two ends of a verbs lane, the ring core's
# RxLane and TxLane with the verbs hooks (publish and idle; commit and ready).

from libc.stdint cimport uint16_t, uint32_t, uint64_t
from libc.string cimport memset

from rdmasched._wire cimport (
    rs_slot, rs_load_acquire_u64, rs_load_acquire_u32, rs_store_release_u32, rs_now_ns,
)
from rdmasched._ring cimport (
    rs_rx, rs_tx, RxLane, TxLane, rs_rx_init, rs_tx_init, rs_rx_begin_epoch,
    rs_rx_publish_credit, rs_rx_drained, RS_CLOSED, RS_DEAD,
)
from rdmasched.libibverbs cimport (
    ibv_send_wr, ibv_sge, rs_wr_set_rdma, rs_wr_rkey, IBV_WR_RDMA_WRITE, IBV_SEND_INLINE,
)

from rdmasched.errors import PeerDeadError

# A lane's close tells its connection (`_on_close`, set by verbs.Connection), which decides
# what else goes: the peer is told, and once both lanes are closed the connection closes.
cdef void _tell_connection(lane, on_close):
    try:
        on_close(lane)
    except Exception as exc:
        import logging
        logging.getLogger("rdmasched.verbs").warning("closing lane %r: %s", lane.name, exc)


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
            _tell_connection(self, self._on_close)
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
            _tell_connection(self, self._on_close)
