"""The client-lane protocol: how a host's daemon and its ranks talk (docs/CLIENT.md).

Everything both ends must agree on lives in this module, which both import: the daemon's
side (`rdmasched.daemon.clients.ClientHub`) and the rank's (`rdmasched.client.Client`).
Nothing here runs a lane; it names them and says what travels in them.

**Lanes and doorbells.** A daemon is found by its endpoint `<cluster>.<host>`
(`endpoint_name`); client k (the rank's LOCAL_RANK) has two shm lanes, `up_lane` (client ->
daemon, created by the daemon when it opens) and `down_lane` (daemon -> client, created by
the client). A client waits on a doorbell of its own (`bell_name`); the daemon's up lanes
name the node's doorbell on shm links (the node's loop reads them) and one of the hub's own
("d") on verbs links (docs/CLIENT.md).

**Messages.** A client lane carries the ring's ordinary messages (rdmasched.wire: kind, id,
job, priority, flags, arg0..arg2, meta); what a message means is its **op**, which travels
in its `hops` byte (a client lane is local: nothing is relayed on it). Each op below says
its kind and the fields it uses; NONE in a node field means "no node" / "this host".

**Preempt flags.** PREEMPT's flags are the wire's own (`Flag.CANCEL`, `Flag.JOB`), on the
client lane as between nodes: `preempt_flags` and `preempt_from_flags`.

**Errors.** A refusal, or a failed request, carries `{"err": [type name, text]}` in its
meta (`error_meta`); the client raises it as the same rdmasched error class
(`error_from`). A refusal whose meta also says `"raise": 1` (`error_meta(exc, raises=True)`:
a full queue, `QueueFullError`, or a refused `sync_ready`) is raised in the rank by its next
call, besides being counted.

**Sessions.** A client's HELLO names its session (`{"session": ...}`: the launcher's run,
`rdmasched.launch.session_name`); the daemon keys sync groups by (session, group), as the
wire group `session_group` (docs/CLIENT.md, "Sessions").
"""

from __future__ import annotations

import hashlib
from typing import Any

from rdmasched import errors as _errors
from rdmasched.errors import ArgumentError, ConfigError, RdmaschedError
from rdmasched.limits import GROUP_MAX
from rdmasched.transport import shm
from rdmasched.wire import Flag

__all__ = [
    "NONE",
    "QueueFullError",
    "bell_name",
    "down_lane",
    "endpoint_name",
    "error_from",
    "error_meta",
    "preempt_flags",
    "preempt_from_flags",
    "session_group",
    "up_lane",
]

#: "no node" / "this node" in a u64 field
NONE = (1 << 64) - 1

# ---- ops (in the `hops` byte) ----------------------------------------------------------------
# client -> daemon
OP_HELLO = 1  # HEARTBEAT meta {"pid", "rank", "session"}
OP_BYE = 2  # HEARTBEAT
OP_SUBMIT = 3  # DISPATCH id job priority arg0=cost arg1=gang count (0: none) meta=payload
OP_DISPATCH = 4  # DISPATCH ... arg1=to node (NONE: here)
OP_PREEMPT = 5  # PREEMPT id job flags (preempt_flags) arg1=node (NONE: here)
OP_READY = 6  # SYNC_READY id=group arg0=step
OP_COMPLETE = 7  # COMPLETE id arg0=runtime arg1=origin (NONE: unnamed)
OP_YIELDED = 8  # PREEMPT id arg0=progress arg2=origin: a preempt handler's answer
OP_SYNC_DONE = 9  # SYNC_READY id=sync task id: this participant's on_sync is done
OP_REQUEST = 10  # HEARTBEAT arg0=request id meta {"q": name, "a": [args]}
# daemon -> client
OP_WELCOME = 32  # HEARTBEAT meta {node, name, slots, cluster, client, clients}
OP_START = 33  # DISPATCH id job priority flags=slot arg0=cost arg1=progress arg2=origin meta
OP_STOP = 34  # PREEMPT id job flags=slot arg0=progress arg1=cancel arg2=origin
OP_SYNC = 35  # SYNC_READY id=sync task id job flags=slot arg0=group arg2=origin meta=payload
OP_DONE = 36  # COMPLETE id=task arg0=node: a task this client submitted completed there
OP_REPLY = 37  # HEARTBEAT arg0=request id meta {"ok": value} or error_meta
OP_ERROR = 38  # HEARTBEAT meta error_meta: a request of this client was refused
OP_PEER = 39  # HEARTBEAT arg0=node arg1=1 declared dead / 0 alive again, meta {"why"}


class QueueFullError(RdmaschedError, BufferError):
    """A rank holds as many tasks on its daemon as the daemon allows (`max_queued`)."""


# ---- sessions --------------------------------------------------------------------------------
def session_group(session: str, group: int) -> int:
    """The wire group (the node's) of `group` in `session`: `group` itself for the session
    "" (no launcher), else a hash of both in 0..GROUP_MAX, the same on every host."""
    if not session:
        return group
    h = hashlib.blake2s(f"{session}\0{group}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") & GROUP_MAX


# ---- lanes and doorbells ---------------------------------------------------------------------
def endpoint_name(cluster: str, host: str) -> str:
    """The name a host's daemon is found by: `<cluster>.<host>` (cluster name, node name)."""
    name = f"{cluster}.{host}"
    try:
        shm.lane_segment_name(up_lane(name, 0))
    except ValueError:
        raise ConfigError(
            f"cluster {cluster!r} / host {host!r} do not make a daemon name: letters, digits, "
            "'_', '.', '-' only"
        ) from None
    return name


def up_lane(endpoint: str, k: int) -> str:
    """Client k's lane to the daemon (the daemon creates it)."""
    return f"{endpoint}.c{k}.up"


def down_lane(endpoint: str, k: int) -> str:
    """The daemon's lane to client k (the client creates it)."""
    return f"{endpoint}.c{k}.down"


def bell_name(endpoint: str, who: str) -> str:
    """A doorbell name (at most 21 characters) for `who` ("d" daemon, "c<k>" client k)."""
    tag = hashlib.blake2s(endpoint.encode(), digest_size=4).hexdigest()
    return f"{tag}.{who}"[:21]


# ---- PREEMPT's flags -------------------------------------------------------------------------
def preempt_flags(cancel: bool, by_job: bool) -> int:
    """OP_PREEMPT's flags: cancel instead of requeue; the target is every task of `job`."""
    return (int(Flag.CANCEL) if cancel else 0) | (int(Flag.JOB) if by_job else 0)


def preempt_from_flags(flags: int) -> tuple[bool, bool]:
    """(cancel, by_job) from OP_PREEMPT's flags."""
    return bool(flags & Flag.CANCEL), bool(flags & Flag.JOB)


# ---- error frames ----------------------------------------------------------------------------
def error_meta(exc: BaseException, *, raises: bool = False) -> dict[str, Any]:
    """The meta of a refusal (OP_ERROR) or a failed request (OP_REPLY): the error's class
    name and text; `raises`: the rank raises it (OP_ERROR), not only counts it."""
    meta: dict[str, Any] = {"err": [type(exc).__name__, str(exc)]}
    if raises:
        meta["raise"] = 1
    return meta


def error_from(kind: str, text: str) -> RdmaschedError:
    """The error a daemon reported (the pair in `error_meta`), as the same class when
    rdmasched has it."""
    cls = QueueFullError if kind == "QueueFullError" else getattr(_errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, RdmaschedError):
        return cls(text)
    if kind == "DuplicateTaskError" or kind.endswith("Error"):
        return ArgumentError(f"{kind}: {text}")
    return RdmaschedError(f"{kind}: {text}")
