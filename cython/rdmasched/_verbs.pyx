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

Teardown order is the handles' own (VerbsObject, in _verbs_device.pxi): a parent closes its
children first, so the queue pairs (each with its CQs) go before the memory regions, those
before the protection domain, the completion channel before the context. verbs.py, which
owns the handles, decides when. A closed QueuePair's C state stays allocated until the
Python object goes, so a lane that still points at it finds it failed, not freed.

One extension module in four parts, included in this order (the C declarations they share
are in libibverbs.pxd). They stay one module so that the per-message calls between them
(a lane's commit posts through the queue pair's accounting) are C calls the compiler can
inline, not calls through another module's function table:

- _verbs_device.pxi: DeviceContext, ProtectionDomain, CompletionChannel, MemoryRegion
- _verbs_qp.pxi: the control block, a connection's C state and its posting, QueuePair
- _verbs_lanes.pxi: VerbsRxLane and VerbsTxLane (the ring core's lanes with verbs hooks)
- _verbs_blocking.pxi: VerbsLaneSet, which sleeps on the completion channels when idle
"""

include "_verbs_device.pxi"
include "_verbs_qp.pxi"
include "_verbs_lanes.pxi"
include "_verbs_blocking.pxi"
