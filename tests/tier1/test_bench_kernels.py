"""The benchmark kernels in C (rdmasched/_bench.pyx) send well-formed messages: what the
hot-path pinger puts on a lane is what msg_from_args would make of its fields (the sending
lane's node as src, dst 0, no relays), never whatever its stack held."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rdmasched import Kind, _bench
from rdmasched.errors import PeerDeadError
from rdmasched.transport import shm


def test_hot_ping_sends_the_lanes_node_as_src_and_no_route(
    lane_name: Callable[[str], str],
) -> None:
    with (
        shm.create_lane(lane_name("-to"), 16) as inbox,
        shm.attach_lane(lane_name("-to"), src=9) as tx,
        shm.create_lane(lane_name("-back"), 16) as back,
    ):
        for i in range(3):  # nobody echoes: each ping sends one message, then gives up
            with pytest.raises(PeerDeadError, match=r"after 0 of 1: nothing arrived for 0\.01 s"):
                _bench.ping(back, tx, 1, 0.01)
            m = inbox.poll(0)
            assert m is not None
            assert (m.kind, m.id, m.job, m.priority) == (Kind.DISPATCH, 0, 7, 1), i
            assert (m.src, m.dst, m.relays, m.hops) == (9, 0, 0, 0), i
            assert m.seq == i
