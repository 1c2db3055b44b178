"""A typed control message through the real Cython codec, as a lane would carry it."""

from __future__ import annotations

from rdmasched import _wire
from rdmasched import messages as msg


def through_codec(
    x: msg.ControlMessage, src: int = 0, load: int = 0, dst: int = 0, relays: int = 0
) -> _wire.Message:
    """`x` encoded into one slot (and its continuations) by the Cython codec, decoded back."""
    kind, id_, job, prio, flags, a0, a1, a2, hops, meta = x.encode()
    raw = _wire.encode(
        kind,
        id=id_,
        job=job,
        priority=prio,
        flags=flags,
        arg0=a0,
        arg1=a1,
        arg2=a2,
        hops=hops,
        meta=meta,
        src=src,
        load=load,
        dst=dst,
        relays=relays,
        nslots=64,
    )
    return _wire.decode(raw, nslots=64)


def relayed_through_codec(m: _wire.Message, load: int = 0) -> _wire.Message:
    """A received message as a relay writes it on (docs/PROTOCOL.md section 10,
    `rdmasched.messages.relayed`), with the relay's own `load`, decoded back."""
    r = msg.relayed(m)
    kind, id_, job, prio, flags, a0, a1, a2, hops, meta = r.fields
    raw = _wire.encode(
        kind, id=id_, job=job, priority=prio, flags=flags, arg0=a0, arg1=a1, arg2=a2,
        hops=hops, meta=meta, src=r.src, load=load, dst=r.dst, relays=r.relays, nslots=64,
    )  # fmt: skip
    return _wire.decode(raw, nslots=64)
