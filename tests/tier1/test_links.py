"""A node's lanes follow its links (issue 8 item 2): with a topology each node creates and
attaches lanes only to `topology.neighbours(me)`; a send to a node it holds no lane to is a
LaneError, never a silent drop; the loop counts what it writes by kind."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator

import pytest

from rdmasched.daemon.links import ShmLinks
from rdmasched.daemon.loop import Loop
from rdmasched.errors import LaneError
from rdmasched.topology import Topology
from rdmasched.transport import shm
from rdmasched.wire import Kind


def _open_all(name: str, peers: dict[int, list[int]]) -> dict[int, ShmLinks]:
    """ShmLinks for every node at once (each waits for its peers' lanes), on threads."""
    got: dict[int, ShmLinks] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            got[i] = ShmLinks(name, i, peers[i], nslots=16, connect_timeout_s=60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in peers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    if errors:
        for links in got.values():
            links.close()
        raise errors[0]
    return got


@pytest.fixture
def bounded() -> Iterator[tuple[str, Topology, dict[int, ShmLinks]]]:
    t = Topology.generate(9, leaf=3, pod=9)  # 3 leaves of 3: rail-mesh, 2 + 2 links
    name = f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"
    links = _open_all(name, {i: t.neighbours(i) for i in range(len(t))})
    try:
        yield name, t, links
    finally:
        for lk in links.values():
            lk.close()


def test_lanes_only_to_the_links(bounded: tuple[str, Topology, dict[int, ShmLinks]]) -> None:
    name, t, links = bounded
    segs = set(shm.list_segments())
    for i, lk in links.items():
        mine = set(t.neighbours(i))
        assert len(mine) == 4 and lk.peers == mine
        assert set(lk.outbound) == mine and set(lk.inbound_peer) == mine
        for j in range(len(t)):
            seg = shm.lane_segment_name(ShmLinks.lane_name(name, i, j))
            assert (seg in segs) == (j in mine), (i, j)
        # ring memory: its inbound lanes' segments, one per link
        assert lk.ring_bytes() == len(mine) * shm.segment_size(16)


def test_a_send_to_a_node_without_a_lane_is_an_error(
    bounded: tuple[str, Topology, dict[int, ShmLinks]],
) -> None:
    _, t, links = bounded
    loop = Loop(links[0], spin_us=0)
    far = next(j for j in range(1, len(t)) if j not in t.neighbours(0))
    with pytest.raises(LaneError, match=f"node 0 has no lane to node {far}: it is not one of"):
        loop.send(far, Kind.DISPATCH, 1)
    with pytest.raises(LaneError, match="no lane"):  # a heartbeat too (force)
        loop.send(far, Kind.HEARTBEAT, 0, force=True)
    near = t.neighbours(0)[0]
    assert loop.send(near, Kind.DISPATCH, 1) and loop.send(near, Kind.SYNC_READY, 2)
    assert loop.send(near, Kind.DISPATCH, 3)
    assert loop.sent_kinds == {int(Kind.DISPATCH): 2, int(Kind.SYNC_READY): 1}
    assert loop.msgs_out == 3 and loop.dropped == 0
