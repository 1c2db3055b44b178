"""Every error rdmasched raises, in one place.

Each error subclasses `RdmaschedError` and, where one fits, the builtin a caller would reach
for first (a full lane is a `BufferError`, a bad config a `ValueError`), so
`except ValueError` keeps working for code that does not know rdmasched.
"""

from __future__ import annotations

import errno as _errno
import os


class RdmaschedError(Exception):
    """Base of every rdmasched error."""


# ---- wire ------------------------------------------------------------------------------------
class MessageError(RdmaschedError, ValueError):
    """A message that cannot be encoded (bad field, unknown kind). Nothing was written."""


class MessageTooLargeError(MessageError):
    """The metadata is over the size bound (or does not fit this lane). Nothing was written."""


class CorruptSlotError(RdmaschedError, ValueError):
    """Bytes that are not a valid slot at the position they were read from."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


# ---- lanes -----------------------------------------------------------------------------------
class LaneError(RdmaschedError):
    """A lane cannot be used as asked."""


class LaneFullError(LaneError, BufferError):
    """No credit for the message within the timeout. Nothing was written."""


class LaneBusyError(LaneError, FileExistsError):
    """The lane (or its sender end) is held by another live process."""


class LaneClosedError(LaneError, ValueError):
    """The lane was closed, or marked dead after its peer failed."""


class PeerDeadError(LaneError, ConnectionError):
    """The process or node on the other end of a lane is gone."""


class EpochError(LaneError, TimeoutError):
    """The receiver did not accept a new sender epoch in time."""


# ---- configuration, bootstrap ----------------------------------------------------------------
class ConfigError(RdmaschedError, ValueError):
    """A cluster config or environment that cannot be used."""


class BootstrapError(RdmaschedError, ConnectionError):
    """Exchanging lane descriptors with a peer failed (token, version, reachability)."""


# ---- workloads (rdmasched.workload) ---------------------------------------------------------
class WorkloadError(RdmaschedError, ValueError):
    """A trace that cannot be read as a workload (the message names the file), or a workload
    that is not a valid task graph."""


# ---- RDMA devices ----------------------------------------------------------------------------
class DeviceError(RdmaschedError, OSError):
    """An RDMA device problem (missing device, inactive port, a failed verbs call).

    Keeps the errno of the failed call where there is one and adds its strerror.
    """

    def __init__(self, message: str, errno: int | None = None) -> None:
        self.errno_value = errno
        if errno:
            message = f"{message}: [Errno {errno}] {os.strerror(errno)}"
        super().__init__(message)

    @property
    def is_unsupported(self) -> bool:
        return self.errno_value in (_errno.EOPNOTSUPP, _errno.ENOTSUP, _errno.ENOSYS)


# ---- the node daemon's API -------------------------------------------------------------------
class ArgumentError(RdmaschedError, ValueError):
    """A `Node` call's argument out of range (or naming nothing). Raised in the caller;
    nothing was queued for the node's loop."""


class ArgumentTypeError(ArgumentError, TypeError):
    """A `Node` call's argument of the wrong type (a float or bool where an integer is
    needed, a payload that is not a dict). Raised in the caller; nothing was queued."""


class NodeFailedError(RdmaschedError, RuntimeError):
    """The node's loop stopped on an error and the node cannot go on; `__cause__` (and
    `Node.error`) is that error. Every later call on the node raises this."""
