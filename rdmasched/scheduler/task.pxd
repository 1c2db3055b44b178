# Cython declarations for task.py ("augmenting .pxd", pure-Python mode).
#
# Built by setup.py, Task becomes an extension type: its fields are C struct members, so the
# compiled scheduler core (core.pxd cimports this) reads and writes them without Python
# attribute lookup.  Every field stays a Python object (ids are u64, keys 128-bit; the core
# checks ranges and raises the project's errors), so behaviour is the same as task.py run as
# plain Python.  Keep it in step with task.py: every dataclass field is declared here.

cdef class Task:
    cdef public object id, job, priority, cost_ns, progress_ns, payload, origin, hops
    cdef public object group, step
    cdef public object state, slot, enqueued_ns, waiting_since_ns, started_ns
    cdef public object qentry, rentry
    # the event ring's copy of the task's fields (core.py _tel), C integers: no conversion
    # and no object per event
    cdef public unsigned long long tel_id, tel_origin, tel_job
    cdef public unsigned int tel_meta
    # the key its scheduler holds it under (core.py _admit)
    cdef public object held_key
