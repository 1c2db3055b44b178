"""rdmasched: control messages as one-sided writes into per-node ring buffers."""

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

__version__ = "0.1.0"

__all__ = [
    "Batch",
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
    "PeerDeadError",
    "RdmaschedError",
    "RxLane",
    "TxLane",
]
