"""rdmasched: control messages as one-sided writes into per-node ring buffers.

The public namespace is two layers, both importable from here:

- **Scheduling** (docs/DAEMON.md, docs/CLIENT.md): `Node`, a host's daemon
  (rdmasched.daemon.node); `Client`, a training rank's handle on it (rdmasched.client),
  with the same API (rdmasched.api); `LATER`, what a sync handler returns to keep its slot.
  These load on first use (a module `__getattr__`), so that importing the lanes below does
  not pull in the daemon.
- **Lanes** (docs/PROTOCOL.md): `TxLane`, `RxLane`, `LaneSet`, `Batch` (rdmasched._ring),
  `Message` and `Kind` (the wire), and the errors (rdmasched.errors).

Everything else is reached through its module: `rdmasched.launch` (starting a host's
daemon from the launcher's environment), `rdmasched.cluster`, `rdmasched.transport`,
`rdmasched.telemetry`, `rdmasched.integrations.torch`. A module or name with a leading
underscore is private.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rdmasched._ring import Batch, LaneSet, RxLane, TxLane
from rdmasched._wire import Message
from rdmasched.errors import (
    ConfigError,
    CorruptSlotError,
    LaneBusyError,
    LaneClosedError,
    LaneFullError,
    MessageError,
    MessageTooLargeError,
    PeerDeadError,
    RdmaschedError,
)
from rdmasched.wire import Kind

if TYPE_CHECKING:
    from rdmasched.api import LATER
    from rdmasched.client import Client
    from rdmasched.daemon.node import Node

__version__ = "0.1.0"

__all__ = [
    "LATER",
    "Batch",
    "Client",
    "ConfigError",
    "CorruptSlotError",
    "Kind",
    "LaneBusyError",
    "LaneClosedError",
    "LaneFullError",
    "LaneSet",
    "Message",
    "MessageError",
    "MessageTooLargeError",
    "Node",
    "PeerDeadError",
    "RdmaschedError",
    "RxLane",
    "TxLane",
]

#: the names loaded on first use (in `__getattr__`)
_LAZY = frozenset(("Node", "Client", "LATER"))


def __getattr__(name: str) -> Any:
    # The one import up the layers (docs/ARCHITECTURE.md): the API's names are imported
    # when a user first asks for one, after this package has loaded, so that the lanes and
    # the wire do not pull in the daemon.
    value: Any
    if name == "Node":
        from rdmasched.daemon.node import Node

        value = Node
    elif name == "Client":
        from rdmasched.client import Client

        value = Client
    elif name == "LATER":
        from rdmasched.api import LATER

        value = LATER
    else:
        raise AttributeError(f"module 'rdmasched' has no attribute {name!r}")
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
