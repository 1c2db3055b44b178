# _verbs_device.pxi (included by _verbs.pyx): VerbsObject, the base of every handle, and the
# device context, the protection domain, the completion channel and the memory regions: the
# handles a connection is built from.

from libc.string cimport memset
from libc.stdlib cimport free
from posix.stdlib cimport posix_memalign
from libc.errno cimport errno
from posix.fcntl cimport fcntl, F_GETFL, F_SETFL, O_NONBLOCK

from rdmasched.libibverbs cimport (
    ibv_context, ibv_pd, ibv_comp_channel, ibv_mr, ibv_device, ibv_get_device_list,
    ibv_free_device_list, ibv_get_device_name, ibv_open_device, ibv_close_device, ibv_alloc_pd,
    ibv_dealloc_pd, ibv_create_comp_channel, ibv_destroy_comp_channel, ibv_reg_mr, ibv_dereg_mr,
)

import weakref

from rdmasched.errors import DeviceError

# ---- ownership --------------------------------------------------------------------------------
# The teardown order is kept by the handles themselves, as pyverbs' close_weakrefs keeps it: a
# parent keeps its children in weak sets, one per kind, and its `close()` closes them first, set
# by set; a child keeps a strong reference to its parent, so that the collector cannot free a
# parent before its children either. The tree, each parent's sets in the order they close:
#
#   DeviceContext       protection domains, completion channels
#   ProtectionDomain    queue pairs, memory regions
#   CompletionChannel   queue pairs (their receive CQ reports to the channel)
#   QueuePair           its QP, then its completion queues (one object: _verbs_qp.pxi)
#
# so closing the context closes every QP (then its CQs), every MR, the PD, the completion
# channel, then the context. A handle collected while open frees its C object in
# `__dealloc__` and does not warn (its owner in verbs.py does); its children are gone by then,
# since they held it.

cdef enum:
    CONTEXT_PDS = 0
    CONTEXT_CHANNELS = 1
    PD_QPS = 0
    PD_MRS = 1
    CHANNEL_QPS = 0


cdef class VerbsObject:
    """The base of every verbs handle: `close()` closes the handle's children, in dependency
    order, then frees the handle, and is safe to call twice; `closed`; `with` closes it."""

    cdef object __weakref__
    cdef tuple _children        # weak sets of children, in the order close() closes them

    cdef int _adopt(self, int kind, VerbsObject child) except -1:
        """Record `child` (which holds a strong reference to this handle) in set `kind`."""
        self._children[kind].add(child)
        return 0

    cdef bint _is_open(self):
        return False

    cdef int _destroy(self) except -1:
        """Free this handle's C object (its children are closed)."""
        return 0

    def close(self):
        """Close the children, in dependency order, then this handle. Safe to call twice."""
        if not self._is_open():
            return
        if self._children is not None:
            for kind in self._children:
                for child in list(kind):
                    child.close()
        self._destroy()

    @property
    def closed(self):
        return not self._is_open()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- device context, protection domain, completion channel, memory regions ---------------------
# rdma-core 44's pyverbs returns the ibv_context and ibv_pd pointers as `<object>ptr` (a bogus
# Python object, not an address; fixed upstream later), so the data path cannot take them from
# pyverbs objects. It opens its own context and PD here; pyverbs still does the discovery and
# the queries (device list, port state, GID table) in verbs.py.

cdef class DeviceContext(VerbsObject):
    """An open RDMA device (ibv_context): the root; parent of the protection domains and the
    completion channels (which it closes first, in that order)."""

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
        self._children = (weakref.WeakSet(), weakref.WeakSet())   # CONTEXT_PDS, _CHANNELS

    cdef bint _is_open(self):
        return self.ctx != NULL

    cdef int _destroy(self) except -1:
        cdef int rc = ibv_close_device(self.ctx)
        if rc != 0:
            raise DeviceError(f"ibv_close_device({self.name!r}) failed", rc)
        self.ctx = NULL
        return 0

    def __dealloc__(self):
        if self.ctx != NULL:
            ibv_close_device(self.ctx)
            self.ctx = NULL


cdef class ProtectionDomain(VerbsObject):
    """An ibv_pd on a DeviceContext: parent of the QPs and MRs of one endpoint (it closes
    them first, the QPs before the MRs)."""

    cdef ibv_pd *pd
    cdef readonly DeviceContext context

    def __cinit__(self, DeviceContext context not None):
        if context.ctx == NULL:
            raise DeviceError("the device context is closed")
        self.pd = ibv_alloc_pd(context.ctx)
        if self.pd == NULL:
            raise DeviceError(f"ibv_alloc_pd on {context.name!r} failed", errno)
        self.context = context
        self._children = (weakref.WeakSet(), weakref.WeakSet())   # PD_QPS, PD_MRS
        context._adopt(CONTEXT_PDS, self)

    def register(self, size_t length, int access):
        """Allocate `length` zeroed, page-aligned bytes and register them with `access`."""
        return MemoryRegion._create(self, length, access)

    cdef bint _is_open(self):
        return self.pd != NULL

    cdef int _destroy(self) except -1:
        cdef int rc = ibv_dealloc_pd(self.pd)
        if rc != 0:
            raise DeviceError("ibv_dealloc_pd failed", rc)
        self.pd = NULL
        return 0

    def __dealloc__(self):
        if self.pd != NULL:
            ibv_dealloc_pd(self.pd)
            self.pd = NULL


cdef class CompletionChannel(VerbsObject):
    """An ibv_comp_channel: the file descriptor a sleeping receiver blocks on. Every
    connection's receive CQ of an endpoint reports to it: parent of those queue pairs."""

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
        self._children = (weakref.WeakSet(),)                       # CHANNEL_QPS
        context._adopt(CONTEXT_CHANNELS, self)

    @property
    def fd(self):
        return self.ch.fd if self.ch != NULL else -1

    cdef bint _is_open(self):
        return self.ch != NULL

    cdef int _destroy(self) except -1:
        cdef int rc = ibv_destroy_comp_channel(self.ch)
        if rc != 0:
            raise DeviceError("ibv_destroy_comp_channel failed", rc)
        self.ch = NULL
        return 0

    def __dealloc__(self):
        if self.ch != NULL:
            ibv_destroy_comp_channel(self.ch)
            self.ch = NULL


cdef class MemoryRegion(VerbsObject):
    """Registered memory it allocated itself; `buf`, `length`, `lkey`, `rkey` as in pyverbs.
    A child of its protection domain."""

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
        pd._adopt(PD_MRS, self)
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

    cdef bint _is_open(self):
        return self.mr != NULL or self.mem != NULL

    cdef int _destroy(self) except -1:
        """Deregister and free (close() does it after every QP of the PD)."""
        if self.mr != NULL:
            ibv_dereg_mr(self.mr)
            self.mr = NULL
        if self.mem != NULL:
            free(self.mem)
            self.mem = NULL
        return 0

    def __dealloc__(self):
        self._destroy()
