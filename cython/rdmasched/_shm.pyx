# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The shm transport's hot part: POSIX shared-memory segments and the lane header.

A lane segment is a 256-byte header (four cache lines, each written by one side only) and
then the slots. The sender maps the receiver's segment and stores slots straight into it:
the receiver's CPU does nothing for a write. Segment naming, stale-segment clean-up and
liveness checks are policy and live in rdmasched/transport/shm.py.

Header (little-endian; offsets in bytes):
  line 0, written once by the receiver before `magic`:
    0 u64 magic  8 u32 version  12 u32 nslots  16 u32 slot_size  20 u32 receiver_pid
    24 u64 receiver_start (process start time, /proc/PID/stat field 22)
    32 char[32] doorbell segment name, NUL-terminated ("" when the receiver never sleeps)
  line 1, written by the sender:
    64 u32 epoch_req  68 u32 sender_pid  72 u64 sender_start
  line 2, written by the receiver:
    128 u64 credit ((epoch << 32) | head mod 2**32)  136 u32 epoch_ack
  line 3, written by the receiver once, when it closes (apart from the credit line, so the
  sender's check of it stays a cache hit):
    192 u32 closed

A doorbell segment (rdmasched/transport/shm.py) is 64 bytes: u32 futex word at 0, magic
"RSBELL01" at 8, creator pid at 16 and start time at 24. docs/PROTOCOL.md section 9.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memset, strncpy
from libc.errno cimport errno, EEXIST, ENOENT
from posix.mman cimport mmap, munmap, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_FAILED
from posix.fcntl cimport O_CREAT, O_EXCL, O_NONBLOCK, O_RDWR
from posix.unistd cimport ftruncate, close as c_close
from posix.stat cimport struct_stat, fstat, S_ISREG
from posix.types cimport mode_t

from rdmasched._wire cimport (
    rs_slot, rs_load_acquire_u32, rs_load_acquire_u64, rs_store_release_u32,
    rs_store_release_u64, rs_cas_u32, rs_fence, rs_futex_wake, SLOT_SIZE,
)
from rdmasched._ring cimport (
    rs_rx, rs_tx, RxLane, TxLane, rs_rx_init, rs_tx_init, rs_rx_begin_epoch, rs_rx_drained,
)

import os
import warnings

from rdmasched.errors import LaneError

cdef extern from "<fcntl.h>" nogil:
    int O_NOFOLLOW

cdef extern from "<sys/mman.h>" nogil:
    int shm_open(const char *name, int oflag, mode_t mode)
    int shm_unlink(const char *name)
    int MAP_POPULATE

cdef struct shm_hdr:
    uint64_t magic
    uint32_t version
    uint32_t nslots
    uint32_t slot_size
    uint32_t receiver_pid
    uint64_t receiver_start
    char bell[32]
    uint32_t epoch_req
    uint32_t sender_pid
    uint64_t sender_start
    uint8_t pad1[48]
    uint64_t credit
    uint32_t epoch_ack
    uint8_t pad2[52]
    uint32_t closed
    uint8_t pad3[60]

cdef enum:
    HDR_SIZE = 256
    VERSION = 2              # the wire protocol version (docs/PROTOCOL.md); slots carry none

MAGIC = 0x3130454E414C5352          # b"RSLANE01" little-endian
HEADER_BYTES = HDR_SIZE
LANE_VERSION = VERSION
assert sizeof(shm_hdr) == HDR_SIZE


def segment_size(uint32_t nslots):
    return HDR_SIZE + nslots * SLOT_SIZE


cdef class ShmSegment:
    """One POSIX shared-memory segment, mapped. The creator owns its name and unlinks it."""

    cdef void *addr
    cdef size_t _size
    cdef readonly str name
    cdef readonly bint owner

    def __cinit__(self):
        self.addr = NULL

    @staticmethod
    def create(str name, size_t size):
        """Create `name` (mode 0600); FileExistsError if anything holds the name (a file,
        a directory, a symlink: O_EXCL with O_NOFOLLOW follows no link)."""
        cdef ShmSegment seg = ShmSegment.__new__(ShmSegment)
        cdef bytes bname = name.encode()
        cdef int fd = shm_open(bname, O_CREAT | O_EXCL | O_NOFOLLOW | O_RDWR, 0o600)
        if fd < 0:
            raise OSError(errno, f"shm_open({name!r}): {os.strerror(errno)}", name)
        if ftruncate(fd, size) != 0:
            err = errno
            c_close(fd)
            shm_unlink(bname)
            raise OSError(err, f"ftruncate({name!r}, {size}): {os.strerror(err)}")
        seg._map(fd, size, name)
        seg.owner = True
        return seg

    @staticmethod
    def open(str name):
        """Map an existing segment; FileNotFoundError if there is none. It follows no
        symlink (OSError ELOOP) and maps only a regular file (LaneError for a FIFO, ...)."""
        cdef ShmSegment seg = ShmSegment.__new__(ShmSegment)
        cdef bytes bname = name.encode()
        cdef struct_stat sb
        cdef int fd = shm_open(bname, O_RDWR | O_NOFOLLOW | O_NONBLOCK, 0)
        if fd < 0:
            raise OSError(errno, f"shm_open({name!r}): {os.strerror(errno)}", name)
        if fstat(fd, &sb) != 0:
            err = errno
            c_close(fd)
            raise OSError(err, os.strerror(err))
        if not S_ISREG(sb.st_mode):
            c_close(fd)
            raise LaneError(f"shared-memory segment {name!r} is not a regular file")
        seg._map(fd, sb.st_size, name)
        seg.owner = False
        return seg

    cdef _map(self, int fd, size_t size, str name):
        cdef void *p
        if size == 0:
            c_close(fd)
            raise LaneError(f"shared-memory segment {name!r} is empty")
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0)
        err = errno
        c_close(fd)
        if p == MAP_FAILED:
            raise OSError(err, f"mmap({name!r}): {os.strerror(err)}")
        self.addr = p
        self._size = size
        self.name = name

    @staticmethod
    def unlink_name(str name):
        """Remove a segment's name; True if it existed."""
        if shm_unlink(name.encode()) == 0:
            return True
        if errno == ENOENT:
            return False
        raise OSError(errno, f"shm_unlink({name!r}): {os.strerror(errno)}")

    @property
    def address(self):
        if self.addr == NULL:
            raise LaneError(f"segment {self.name!r} is closed")
        return <size_t>self.addr

    @property
    def size(self):
        return self._size

    @property
    def closed(self):
        return self.addr == NULL

    def close(self):
        """Unmap; the creator also unlinks the name. Safe to call twice."""
        if self.addr == NULL:
            return
        munmap(self.addr, self._size)
        self.addr = NULL
        if self.owner:
            shm_unlink(self.name.encode())

    def __del__(self):
        if self.addr != NULL:
            warnings.warn(f"shm segment {self.name!r} was not closed", ResourceWarning, 2)
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_header(ShmSegment seg):
    """The lane header of a mapped segment, as a dict (for checks and tools)."""
    cdef shm_hdr *h
    if seg.addr == NULL or seg._size < HDR_SIZE:
        raise LaneError(f"segment {seg.name!r} is too small to be a lane")
    h = <shm_hdr *>seg.addr
    return {
        "magic": rs_load_acquire_u64(&h.magic), "version": h.version, "nslots": h.nslots,
        "slot_size": h.slot_size, "receiver_pid": h.receiver_pid,
        "receiver_start": h.receiver_start, "bell": h.bell[:31].split(b"\0", 1)[0].decode(errors="replace"),
        "epoch_req": rs_load_acquire_u32(&h.epoch_req), "sender_pid": h.sender_pid,
        "sender_start": h.sender_start, "credit": rs_load_acquire_u64(&h.credit),
        "epoch_ack": rs_load_acquire_u32(&h.epoch_ack), "closed": h.closed,
        "size": seg._size,
    }


# ---- hooks ----------------------------------------------------------------------------------

cdef int _publish(rs_rx *r, uint64_t credit) noexcept nogil:
    rs_store_release_u64(&(<shm_hdr *>r.ctx).credit, credit)
    return 0


cdef int _idle(rs_rx *r) noexcept nogil:
    """A restarted sender asks for a new epoch in the header; accept it once drained.

    The newest request wins: if epoch_req moved on by more than one (senders that attached
    and went before being accepted), the receiver goes straight to the last one. When the
    epoch wraps (2**32 - 1 -> 1) the ring is zeroed before the acknowledgement, so no slot
    left from the first use of that epoch number can look current again.
    """
    cdef shm_hdr *h = <shm_hdr *>r.ctx
    cdef uint32_t req = rs_load_acquire_u32(&h.epoch_req)
    if req != 0 and req != r.epoch:
        if not rs_rx_drained(r):
            return 0                 # a message of the old epoch can still be delivered
        if req < r.epoch:
            memset(r.ring, 0, <size_t>r.nslots * SLOT_SIZE)
        rs_rx_begin_epoch(r, req)
        rs_store_release_u32(&h.epoch_ack, req)
    return 0


cdef int _ready(rs_tx *t) noexcept nogil:
    return rs_load_acquire_u32(&(<shm_hdr *>t.ctx).epoch_ack) == t.epoch


cdef int _ring_bell(rs_tx *t, uint64_t pos, uint32_t n) noexcept nogil:
    # Store (the slot) then load (the bell): needs a full fence; the receiver fences too.
    rs_fence()
    if rs_load_acquire_u32(t.bell) != 0:
        rs_store_release_u32(t.bell, 0)
        rs_futex_wake(t.bell, 0x7FFFFFFF)
        t.wakes += 1
    return 0


def ring_doorbell(size_t address):
    """Wake a receiver sleeping on the doorbell word at `address`, if it sleeps.

    A receiver that is not asleep is left alone: right for a sender, whose message the
    receiver looks for after announcing its sleep, but not a way to hand a waiting thread
    anything else (the ring would be lost if it came while that thread spins): that is
    `LaneSet.wake`."""
    cdef volatile uint32_t *w = <volatile uint32_t *>address
    rs_fence()
    if rs_load_acquire_u32(w) != 0:
        rs_store_release_u32(w, 0)
        rs_futex_wake(w, 0x7FFFFFFF)
        return True
    return False


cdef class ShmRxLane(RxLane):
    """Receiving end of an shm lane; owns the segment (unlinked on close)."""

    cdef ShmSegment seg
    cdef shm_hdr *hdr

    @staticmethod
    def _create(ShmSegment seg not None, str name, uint32_t nslots, uint64_t grace_ns,
                uint32_t pid, uint64_t start, str bell_name=""):
        cdef ShmRxLane lane = ShmRxLane.__new__(ShmRxLane)
        cdef shm_hdr *h = <shm_hdr *><size_t>seg.address
        cdef bytes bb = bell_name.encode()
        if seg._size != <size_t>segment_size(nslots):
            raise LaneError(f"segment {seg.name!r} has the wrong size for {nslots} slots")
        if len(bb) > 31:
            raise ValueError(f"doorbell name {bell_name!r} is longer than 31 bytes")
        memset(h, 0, HDR_SIZE)
        h.version = VERSION
        h.nslots = nslots
        h.slot_size = SLOT_SIZE
        h.receiver_pid = pid
        h.receiver_start = start
        strncpy(h.bell, bb, 31)
        # The first sender's epoch (1) is accepted in advance; later ones ask (epoch_req).
        h.epoch_ack = 1
        rs_store_release_u64(&h.credit, (<uint64_t>1) << 32)
        rs_store_release_u64(&h.magic, MAGIC)
        lane.seg = seg
        lane.hdr = h
        lane.name = name
        rs_rx_init(&lane.st, <rs_slot *>(<char *>h + HDR_SIZE), nslots, 1, grace_ns)
        lane.st.publish = _publish
        lane.st.idle_hook = _idle
        lane.st.ctx = h
        lane._open = True
        return lane

    @property
    def segment(self):
        return self.seg

    cdef void _close_transport(self):
        if self.hdr != NULL:
            rs_store_release_u32(&self.hdr.closed, 1)
            self.hdr = NULL
        self.seg.close()


cdef class ShmTxLane(TxLane):
    """Sending end of an shm lane: maps the receiver's segment and writes slots into it."""

    cdef ShmSegment seg
    cdef shm_hdr *hdr
    cdef object bell_seg
    cdef uint32_t pid

    @staticmethod
    def _attach(ShmSegment seg not None, str name, uint32_t src, uint32_t pid, uint64_t start,
                ShmSegment bell_seg=None):
        """Claim the next sender epoch of the lane in `seg` (the caller checked the header)."""
        cdef ShmTxLane lane = ShmTxLane.__new__(ShmTxLane)
        cdef shm_hdr *h = <shm_hdr *><size_t>seg.address
        cdef uint32_t req, new
        if src >= 0xFFFFFF:
            raise ValueError(f"src must be a node id 0..{0xFFFFFF - 1}, not {src}")
        while True:
            req = rs_load_acquire_u32(&h.epoch_req)
            new = req + 1 if req != 0xFFFFFFFFu else 1
            if rs_cas_u32(&h.epoch_req, req, new):
                break
        h.sender_pid = pid
        h.sender_start = start
        lane.seg = seg
        lane.hdr = h
        lane.name = name
        lane.pid = pid
        rs_tx_init(&lane.st, <rs_slot *>(<char *>h + HDR_SIZE), h.nslots, new, &h.credit)
        lane.st.src = src
        lane.st.closed = &h.closed
        lane.st.ready = _ready
        lane.st.ctx = h
        lane.st.acked = _ready(&lane.st)
        if bell_seg is not None:
            lane.bell_seg = bell_seg
            lane.st.bell = <volatile uint32_t *><size_t>bell_seg.address
            lane.st.commit = _ring_bell
        lane._open = True
        return lane

    @property
    def segment(self):
        return self.seg

    @property
    def acked(self):
        """Whether the receiver has accepted this sender's epoch yet."""
        if self.st.acked or (self.hdr != NULL and _ready(&self.st)):
            self.st.acked = 1
        return bool(self.st.acked)

    def _peer_note(self):
        from rdmasched.transport.shm import describe_receiver
        return describe_receiver(read_header(self.seg))

    def _epoch_taken(self):
        cdef uint32_t ack
        if self.hdr == NULL:
            return 0
        ack = rs_load_acquire_u32(&self.hdr.epoch_ack)
        # newer, modulo the wrap (2**32 - 1 -> 1): the receiver moved past this epoch
        if ack != 0 and ack != self.st.epoch and <uint32_t>(ack - self.st.epoch) < 0x80000000u:
            return ack
        return 0

    cdef void _close_transport(self):
        if self.hdr != NULL:
            # Release the sender claim so a successor can attach without waiting for us.
            if self.hdr.sender_pid == self.pid:
                self.hdr.sender_pid = 0
                self.hdr.sender_start = 0
            self.hdr = NULL
        self.seg.close()
        if self.bell_seg is not None:
            self.bell_seg.close()
