"""A node's lanes: one inbound lane from every linked peer, one outbound lane to it.

`Links` is what the daemon's loop needs from a transport: a `LaneSet` of inbound lanes (with
a way to sleep until a sender rings), the outbound lanes by peer id, and `close()`. The shm
implementation is here; the verbs transport provides the same shape.

Which peers a node holds lanes to is the caller's choice: the daemon gives its core's
`links` (every other node without a [topology]; with one, the node's leaf and its links out
of it, docs/SCALE.md section 8). Links are symmetric, so both ends agree on every lane.

Naming on shm: the lane from node j to node i is `<cluster>.<i>.from.<j>`, created by i;
node i's doorbell is `<cluster hash>.bell.<i>`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable
from typing import Any, Protocol

from rdmasched._ring import LaneSet, RxLane, TxLane
from rdmasched._shm import ShmRxLane, ShmTxLane, read_header
from rdmasched.cluster import ClusterConfig
from rdmasched.errors import ConfigError, LaneError, PeerDeadError
from rdmasched.transport import shm

_log = logging.getLogger("rdmasched.daemon")


class Links(Protocol):
    me: int
    #: the peers this node holds lanes to; a send to any other node is an error (LaneError)
    peers: frozenset[int]
    inbound: LaneSet
    #: inbound lane index in `inbound` -> the peer it comes from
    inbound_peer: list[int]
    outbound: dict[int, TxLane]

    def wake(self) -> None:
        """End this node's loop's wait, spinning or asleep, or else its next one (from
        another thread, after handing it work: `Loop.post`)."""

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
        self.peers = frozenset(peers) - {me}
        self.inbound = LaneSet()
        self.inbound_peer: list[int] = []
        self.outbound: dict[int, TxLane] = {}
        self._rx: list[RxLane] = []
        self.doorbell = shm.Doorbell.create(self.bell_name(cluster, me))
        try:
            self.inbound.set_doorbell(self.doorbell, self.doorbell.address)
            for p in sorted(self.peers):
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
        pending = sorted(self.peers)
        while pending:
            for p in list(pending):
                try:
                    self.outbound[p] = shm.attach_lane(
                        self.lane_name(self.cluster, p, self.me), src=self.me
                    )
                    pending.remove(p)
                except PeerDeadError:
                    pass  # not created yet, still being created (or a stale one): retry
            if pending:
                if time.monotonic() > deadline:
                    raise PeerDeadError(
                        f"node {self.me}: peers {pending} did not come up within {timeout_s:g} s"
                    )
                time.sleep(0.002)

    def wake(self) -> None:
        self.inbound.wake()

    def ring_bytes(self) -> int:
        """The memory of this node's inbound lanes: their shm segments, headers included."""
        return sum(rx.segment.size for rx in self._rx if isinstance(rx, ShmRxLane))

    def _receiver(self, peer: int) -> tuple[int, int] | None:
        """(pid, start time) of the process that created our lane to `peer` now."""
        name = shm.lane_segment_name(self.lane_name(self.cluster, peer, self.me))
        try:
            seg = shm.ShmSegment.open(name)
        except FileNotFoundError:
            return None
        with seg:
            if seg.size < shm.HEADER_BYTES:
                return None
            hdr = read_header(seg)
        return hdr["receiver_pid"], hdr["receiver_start"]

    def release_gone(self, peer: int) -> None:
        """`peer` was declared dead: if its process is gone, unmap our lane to it (and its
        doorbell), so that a restarted `peer` can create them afresh. A peer that is only
        stalled keeps its lane: it must still hear that it was declared dead."""
        tx = self.outbound.get(peer)
        if not isinstance(tx, ShmTxLane) or tx.closed:
            return
        if not shm.peer_alive(tx):  # its liveness token (docs/PROTOCOL.md section 9)
            tx.close()
            del self.outbound[peer]

    def reconnect(self, peer: int) -> bool:
        """A new incarnation of `peer` was heard: if it is a new process, attach to the
        lane it created (the old one is gone with the old process). True if it is."""
        now = self._receiver(peer)
        tx = self.outbound.get(peer)
        if isinstance(tx, ShmTxLane) and not tx.closed:
            hdr = read_header(tx.segment)
            if now is None or now == (hdr["receiver_pid"], hdr["receiver_start"]):
                return False  # the same process (it was stalled, not restarted)
            tx.close()
            del self.outbound[peer]
        try:
            self.outbound[peer] = shm.attach_lane(
                self.lane_name(self.cluster, peer, self.me), src=self.me
            )
        except LaneError as exc:
            _log.warning("node %d: cannot attach to restarted node %d: %s", self.me, peer, exc)
        return True

    def close(self) -> None:
        for tx in self.outbound.values():
            tx.close()
        for rx in self._rx:
            rx.close()
        self.inbound.set_doorbell(None, 0)  # `wake` after this finds no doorbell to ring
        self.doorbell.close()


def close_quietly(links: Links | None) -> None:
    if links is None:
        return
    try:
        links.close()
    except LaneError as exc:  # closing must not hide the error that got us here
        _log.warning("closing links: %s", exc)


class VerbsLinks:
    """Lanes over RDMA verbs: one RC connection per linked peer (`peers`, default every other
    node), set up through the TCP bootstrap at each node's configured address
    (docs/VERBS.md). A node dials the peers with higher ids and accepts the lower ones,
    accepting on a thread so start-up order cannot deadlock.

    The inbound `LaneSet` sleeps on the endpoint's completion channel when idle and senders
    wake it with a write-with-immediate; a call from another thread of this process wakes it
    through the eventfd it also sleeps on (`wake`), so the loop sleeps until woken.
    """

    def __init__(
        self,
        cluster: ClusterConfig,
        me: int,
        *,
        device: str | None = None,
        gid_index: int | None = None,
        connect_timeout_s: float = 60.0,
        peers: Iterable[int] | None = None,
    ) -> None:
        import threading

        from rdmasched.cluster import parse_address
        from rdmasched.transport import verbs

        self.me = me
        everyone = frozenset(n.id for n in cluster.nodes)
        self.peers = (everyone if peers is None else everyone & frozenset(peers)) - {me}
        self.outbound: dict[int, TxLane] = {}
        self.inbound_peer: list[int] = []
        device = device or os.environ.get("RDMASCHED_DEVICE") or None
        if gid_index is None and os.environ.get("RDMASCHED_GID_INDEX"):
            gid_index = int(os.environ["RDMASCHED_GID_INDEX"])
        self.endpoint = verbs.Endpoint(
            device,
            me,
            token=cluster.token,
            nslots=cluster.slots_per_lane,
            gid_index=gid_index,
            service_level=cluster.service_level,
            dscp=cluster.dscp,
            # the QP gives up on a silent peer no sooner than the liveness rule does
            qp_timeout=verbs.qp_timeout_for(cluster.dead_after_ms),
        )
        self.inbound = verbs.LaneSet()
        self._conns: dict[int, Any] = {}
        try:
            me_spec = cluster.node(me)
            host, port = parse_address(me_spec.address, f"node {me_spec.name} address")
            self.endpoint.listen(host, port)
            lower = [p for p in sorted(self.peers) if p < me]
            errors: list[BaseException] = []

            def accept_all() -> None:
                try:
                    for _ in lower:
                        c = self.endpoint.accept(timeout_s=connect_timeout_s)
                        self._conns[c.peer_node] = c
                except BaseException as exc:  # reported by the constructor below
                    errors.append(exc)

            t = threading.Thread(target=accept_all, name=f"rdmasched-accept{me}", daemon=True)
            t.start()
            for n in cluster.nodes:
                if n.id > me and n.id in self.peers:
                    h, p = parse_address(n.address, f"node {n.name} address")
                    c = self.endpoint.connect(
                        h, p, timeout_s=connect_timeout_s, attempts=max(5, int(connect_timeout_s))
                    )
                    self._conns[n.id] = c
            t.join(connect_timeout_s)
            if errors:
                raise errors[0]
            missing = sorted(set(lower) - set(self._conns))
            stray = sorted(set(self._conns) - self.peers)
            if stray:  # a peer that holds a link to us we do not hold to it
                raise PeerDeadError(
                    f"node {me}: nodes {stray} connected, but they are not among this node's "
                    "links; every node must be given the same [topology]"
                )
            if missing:
                raise PeerDeadError(
                    f"node {me}: peers {missing} did not connect within {connect_timeout_s:g} s"
                )
            for peer in sorted(self._conns):
                c = self._conns[peer]
                self.outbound[peer] = c.tx
                self.inbound.add(c.rx)
                self.inbound_peer.append(peer)
        except BaseException:
            self.close()
            raise

    def wake(self) -> None:
        self.inbound.wake()

    def close(self) -> None:
        self.endpoint.close()
