# _verbs_device.pxi (included by _verbs.pyx): the device context, the protection domain, the
# completion channel and the memory regions: the handles a connection is built from.

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

from rdmasched.errors import DeviceError

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
