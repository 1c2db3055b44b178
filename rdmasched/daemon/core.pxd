# Cython declarations for core.py ("augmenting .pxd", pure-Python mode), like the scheduler's
# (rdmasched/scheduler/core.pxd).
#
# core.py stays the one source of the node's decisions and runs as plain Python. Built by
# setup.py, this file turns NodeCore into an extension type: its state becomes typed C fields,
# the received `Message` (rdmasched._wire) is read as C struct members, the scheduler's typed
# (cpdef) methods are C calls, and the internal methods below are C calls. Keep it in step with
# core.py: every attribute NodeCore sets must be declared here, and the signatures must match.
# Attributes other code reads or sets (the driver, the simulator, tests) are `public`.

cimport cython

from rdmasched._wire cimport Message
from rdmasched.scheduler.core cimport Scheduler

# the wire's kinds and flags, and _next_hop's "off the route", as C constants
cdef int _DISPATCH, _PREEMPT, _SYNC_READY, _COMPLETE, _HEARTBEAT, _CANCEL, _JOB, _SUBMITTED
cdef int _RESENT, _GANG, _COMMIT
cdef unsigned int _HELD
cdef long long _OFF_ROUTE
cdef unsigned long long _SYNC_BASE

@cython.locals(g=cython.ulonglong, s=cython.ulonglong)
cpdef object sync_task_id(group, step)


cdef class NodeCore:
    cdef public long long me
    cdef public object topology
    cdef public int max_relays
    cdef public object relayed, rerouted, stale_msgs, sync_early_kept
    cdef public dict relay_dropped
    cdef dict _routes
    cdef dict _arounds
    cdef public object resent_tasks, dup_dispatches, dup_completes, ran_twice
    cdef dict _done
    cdef object _my_key
    cdef set _unanswered
    cdef public object resend_after_ns
    cdef object _sweep_at
    cdef object _sync_every
    cdef public frozenset links
    cdef public object now
    cdef public object heartbeat_ns, sync_cost_ns, dead_after_ns
    cdef public object peers
    cdef bint _far
    cdef public object members
    cdef public dict summaries
    cdef object _sum_next
    cdef object _sum_order
    cdef list _sum_heap
    cdef dict _sum_kept
    cdef long long _sum_count
    cdef long long _leaf
    cdef list _leaf_peers
    cdef public set _cut
    cdef dict _pending_far
    cdef public Scheduler scheduler
    cdef public object gangs
    cdef set _shunned
    cdef set _unacked
    cdef unsigned long long[::1] _recv
    cdef public dict rejected
    cdef public long long rejections
    cdef public str last_rejection
    cdef public dict groups
    cdef public set beside
    cdef public object sync
    cdef dict _early_sync
    cdef Py_ssize_t _early_sync_n
    cdef unsigned long long _trigger_ns
    cdef long long _load
    cdef long long _fx_load0, _fx_load1
    cdef object _fx0, _fx1
    cdef bint _opened
    cdef bint _no_thrash
    cdef object _wake_armed
    # a bound method the hot path calls (made once, not per message)
    cdef object _seen

    # src: one int object, made once (it goes to Python code several times: a C int would be
    # converted each time, a new object for node ids above 256)
    @cython.locals(kind=int, src=object, far=bint, out=list, sched=Scheduler, shunned=set,
                   sent=cython.ulonglong, flags=int, cancel=bint, origin=object, tid=object,
                   fell=bint)
    cpdef list receive(self, Message m, peer, now)
    @cython.locals(nxt=cython.longlong)
    cdef list _relay(self, Message m, peer)
    cdef list _drop_relay(self, Message m, peer, str why)
    cdef long long _detour(self, dst, back=*) except? -3
    cdef long long _next_hop(self, src, dst) except? -3
    @cython.locals(got=cython.longlong)
    cdef long long _around(self, src, dst, back, long long nxt) except? -3
    cpdef _send(self, dst, message)
    cdef _dispatch_msg(self, task, bint submitted, bint resent=*)
    @cython.locals(t=object, i=Py_ssize_t, fx=list)
    cdef list _act(self, list actions, list out=*)
    cdef object _effect(self, a)
    @cython.locals(load=cython.longlong)
    cdef list _load_changed(self, list out)
    cdef _reject(self, str reason, str detail)
    cdef list _sync_msg(self, group, flags, step, sent, node)
    cdef list _sync(self, list outs)
    cdef _place(self, peer, m, list out)
    cdef _summary_names(self, peer, list out)
    cdef long long _summaries_since(self, long long now)
    cdef _notice(self, peer)
    cdef bint _dedup(self, origin, tid, list out) except -1
    @cython.locals(sched=Scheduler)
    cpdef object resolve(self, task_id, origin, prefer=*)
