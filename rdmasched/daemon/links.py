"""A node's lanes: one inbound lane from every peer, one outbound lane to every peer.

`Links` is what the daemon's loop needs from a transport: a `LaneSet` of inbound lanes (with
a way to sleep until a sender rings), the outbound lanes by peer id, and `close()`. The shm
implementation is here; the verbs transport provides the same shape.

Naming on shm: the lane from node j to node i is `<cluster>.<i>.from.<j>`, created by i;
node i's doorbell is `<cluster hash>.bell.<i>`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable
from typing import Protocol

from rdmasched._ring import LaneSet, RxLane, TxLane
from rdmasched.errors import ConfigError, LaneError, PeerDeadError
from rdmasched.transport import shm

_log = logging.getLogger("rdmasched.daemon")


class Links(Protocol):
    me: int
    inbound: LaneSet
    #: inbound lane index in `inbound` -> the peer it comes from
    inbound_peer: list[int]
    outbound: dict[int, TxLane]

    def wake(self) -> None:
        """Wake this node's loop if it sleeps (from another thread)."""

    def close(self) -> None: ...


class ShmLinks:
    """Lanes in shared memory between node processes on one host."""

    def __init__(
        self,
        cluster: str,
        me: int,
        peers: Iterable[int],
        *,
        nslots: int = 256,
        connect_timeout_s: float = 30.0,
    ) -> None:
        self.me = me
        self.cluster = cluster
        self.peers = sorted(set(peers) - {me})
        self.inbound = LaneSet()
        self.inbound_peer: list[int] = []
        self.outbound: dict[int, TxLane] = {}
        self._rx: list[RxLane] = []
        self.doorbell = shm.Doorbell.create(self.bell_name(cluster, me))
        try:
            self.inbound.set_doorbell(self.doorbell, self.doorbell.address)
            for p in self.peers:
                rx = shm.create_lane(self.lane_name(cluster, me, p), nslots, doorbell=self.doorbell)
                self._rx.append(rx)
                self.inbound.add(rx)
                self.inbound_peer.append(p)
            self._connect(connect_timeout_s)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def lane_name(cluster: str, dst: int, src: int) -> str:
        return f"{cluster}.{dst}.from.{src}"

    @staticmethod
    def bell_name(cluster: str, node: int) -> str:
        tag = hashlib.blake2s(cluster.encode(), digest_size=4).hexdigest()
        name = f"{tag}.bell.{node}"
        if len(name) > 20:
            raise ConfigError(f"node id {node} is too large for a doorbell name")
        return name

    def _connect(self, timeout_s: float) -> None:
        """Attach to every peer's inbound lane for us, waiting for peers still starting."""
        deadline = time.monotonic() + timeout_s
        pending = list(self.peers)
        while pending:
            for p in list(pending):
                try:
                    self.outbound[p] = shm.attach_lane(
                        self.lane_name(self.cluster, p, self.me), src=self.me
                    )
                    pending.remove(p)
                except PeerDeadError:
                    pass  # not created yet (or a stale one): retry
            if pending:
                if time.monotonic() > deadline:
                    raise PeerDeadError(
                        f"node {self.me}: peers {pending} did not come up within {timeout_s:g} s"
                    )
                time.sleep(0.002)

    def wake(self) -> None:
        self.doorbell.ring()

    def close(self) -> None:
        for tx in self.outbound.values():
            tx.close()
        for rx in self._rx:
            rx.close()
        self.doorbell.close()


def close_quietly(links: Links | None) -> None:
    if links is None:
        return
    try:
        links.close()
    except LaneError as exc:  # closing must not hide the error that got us here
        _log.warning("closing links: %s", exc)
