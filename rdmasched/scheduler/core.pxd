# Cython declarations for core.py ("augmenting .pxd", pure-Python mode).
#
# core.py stays the one source of the policy and runs as plain Python.  Built with
# Cython (``cythonize -i rdmasched/scheduler/core.py``, or by setup.py), this file
# turns Scheduler into an extension type: its state becomes typed C fields and the
# internal methods below become C calls.  Keep it in step with core.py: every
# attribute the class sets must be declared here, and the signatures must match.

cimport cython

from rdmasched.scheduler.task cimport Task

# the event layout's constants (events.py's, set at import): the record's size and words
cdef Py_ssize_t _WORDS
cdef Py_ssize_t _W_T, _W_META, _W_ID, _W_ORIGIN, _W_JOB, _W_STEP, _W_GROUP, _W_BEATEN
cdef Py_ssize_t _W_BEATEN2, _W_PEER, _W_LOADS, _W_CAUSE, _W_CAUSE_NS, _W_WAIT, _W_DEPTH
cdef unsigned int _F_TASK, _F_TASK_JOB, _F_BEATEN, _F_STEP, _F_CAUSE, _F_PEER, _SYNC_P
# the cause and placement words' masks (cause(), _peer_note())
cdef unsigned long long _LOW32, _WORD_MAX, _NO_PEER
cdef tuple _NEG


cdef class Scheduler:
    cdef readonly Py_ssize_t nslots
    cdef public object node_id
    cdef readonly object starvation_ns
    cdef readonly object aging_ns
    cdef object _clock
    cdef tuple _offset
    cdef list _slots
    cdef list _free
    cdef list _heap
    cdef object _fifo
    cdef list _run
    cdef dict _tasks
    cdef set _outranked
    cdef set _requeued
    cdef Py_ssize_t _nqueued
    cdef long long _seq
    cdef unsigned long long[::1] _ev
    cdef Py_ssize_t _ev_cap
    cdef long long _ev_n
    cdef Py_ssize_t _ev_b, _ev_end
    cdef dict _ev_text
    cdef unsigned long long[::1] _by_rule
    cdef int _cause_kind
    cdef unsigned long long _cause_w
    cdef unsigned long long _cause_ns
    cdef dict _groups
    cdef object _peers
    cdef str _domain
    cdef Py_ssize_t _max_hops
    cdef object _rng
    cdef dict _rejected
    cdef object _starve_at
    cdef Py_ssize_t _run_cap
    # no thrash (the run quantum, the preemption budgets) and the reasons' state
    cdef bint _guarded
    cdef int _critical
    cdef unsigned int _blocked
    cdef object _quantum_ns, _task_budget, _job_budget, _job_window_ns, _wake_ns
    cdef dict _npreempt, _job_preempts, _returned
    cdef readonly long long _n_starts, _n_queued, _n_preemptions, _n_peer_preemptions
    cdef readonly long long _n_requeues, _n_cancels, _n_keeps, _n_completions
    cdef readonly long long _n_sync_releases, _n_sync_reports, _n_forwards
    cdef readonly long long _n_redispatches, _n_drops, _n_starved_starts

    @cython.locals(free=list, slot=Py_ssize_t)
    cpdef list dispatch(self, task)
    @cython.locals(slot=Py_ssize_t, out=list, task=Task)
    cpdef list complete(self, task_id, origin=*)
    @cython.locals(slot=Py_ssize_t, out=list, task=Task, outranked=bint, victim=tuple)
    cpdef list yielded(self, task_id, progress_ns, origin=*)
    # the node core's typed entry points (rdmasched/daemon/core.pxd calls them as C calls)
    cpdef object lookup(self, task_id, origin=*)
    cpdef list preempt_task(self, Task task, cancel=*)
    cpdef long long load_hint(self) except? -1
    @cython.locals(busy=cython.longlong)
    cdef long long _load(self, Py_ssize_t extra) except? -1
    @cython.locals(out=list, first=Py_ssize_t, freed=list, t=Task)
    cdef list _stop(self, tuple targets, cancel, rule, why, now, drop=*)
    cdef list _complete_other(self, task_id, key, task, now)
    cdef _admit(self, Task task, now, bint sync)
    @cython.locals(slot=Py_ssize_t)
    cdef list _place(self, Task task, now, key)
    @cython.locals(run=list, victim=tuple, vt=Task)
    cdef list _place_busy(self, Task task, now, key)
    @cython.locals(victim=Task, slot=Py_ssize_t)
    cdef list _preempt_for(self, Task task, tuple victim_entry, now)
    @cython.locals(seq=cython.longlong, e=tuple, run=list)
    cdef _run_on(self, Task task, Py_ssize_t slot, now)
    cdef _off_slot(self, Task task, Py_ssize_t slot)
    @cython.locals(e=tuple, heap=list, nq=Py_ssize_t)
    cdef tuple _enqueue(self, Task task, now, key)
    @cython.locals(nq=Py_ssize_t)
    cdef _unqueue(self, Task task)
    cdef _compact_fifo(self)
    cdef _head(self)
    @cython.locals(e=tuple)
    cdef _oldest_starved(self, now)
    cdef bint _heads_queue(self, Task task, now, key)
    @cython.locals(heap=list, head=tuple, pick=tuple, nxt=tuple, nq=Py_ssize_t, reason=cython.uint,
                   task=Task, beaten=Task, ht=Task)
    cdef _fill(self, Py_ssize_t slot, now, list out)
    cpdef cause(self, int kind, unsigned long long src, unsigned long long seq,
                unsigned long long sent_ns)
    @cython.locals(b=Py_ssize_t, nb=Py_ssize_t, p=cython.uint, flags=cython.uint, meta=cython.uint,
                   depth=cython.ulonglong, m=cython.ulonglong, since=cython.ulonglong)
    cdef int _rec(self, unsigned long long now, unsigned int decision, unsigned int rule, Task task,
              Py_ssize_t slot, Task beaten, unsigned long long nbeaten, bint queued) except -1
    cdef unsigned int _rec_step(self, Task task, Py_ssize_t b) except? 0xFFFFFFFF
    @cython.locals(flags=cython.uint, p=cython.uint)
    cdef _tel(self, Task task)
    @cython.locals(b=Py_ssize_t, nb=Py_ssize_t)
    cdef Py_ssize_t _next_rec(self)
    @cython.locals(b=Py_ssize_t)
    cdef Py_ssize_t _last_rec(self)
    @cython.locals(b=Py_ssize_t, n=cython.longlong, cap=Py_ssize_t, flags=cython.uint)
    cdef _note(self, now, unsigned int decision, unsigned int rule, Task task, task_id, text,
               Py_ssize_t slot=*)
    @cython.locals(b=Py_ssize_t)
    cdef _peer_note(self, long long peer, long long lost, long long peer_load,
                    long long lost_load, long long mine)
