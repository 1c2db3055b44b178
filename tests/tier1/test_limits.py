"""The lane-size rule is written once (limits.check_lane_slots): the cluster config, the ring
and the verbs lane descriptor accept exactly the sizes it accepts, each with its own error."""

from __future__ import annotations

from typing import Any

import pytest

from rdmasched import limits
from rdmasched._ring import check_nslots
from rdmasched.cluster import ClusterConfig
from rdmasched.errors import BootstrapError, ConfigError
from rdmasched.transport.verbs import Descriptor

SIZES = [0, 8, 15, 16, 17, 100, 256, 1 << 19, (1 << 20) - 1, 1 << 20, 1 << 21]


def _ok(check: Any, n: int, error: type[Exception]) -> bool:
    try:
        check(n)
    except error as exc:
        assert "power of two in 16..1048576" in str(exc)
        return False
    return True


def _cluster(n: int) -> None:
    ClusterConfig.from_dict({"cluster": {"slots_per_lane": n}, "node": [{"name": "a", "slots": 1}]})


def _descriptor(n: int) -> None:
    lane = {"addr": 4096, "rkey": 1, "nslots": n, "epoch": 1}
    d = {"wire": 2, "node": 0, "gid": bytes(16), "gid_index": 0, "qpn": 1, "psn": 0, "mtu": 3}
    try:
        Descriptor.from_wire({**d, "lane": lane, "ctl": {"addr": 4096, "rkey": 1}}, "peer:1")
    except BootstrapError as exc:
        if "nslots" in str(exc):
            raise


@pytest.mark.parametrize("n", SIZES)
def test_every_layer_accepts_the_sizes_the_rule_accepts(n: int) -> None:
    want = _ok(limits.check_lane_slots, n, ValueError)
    assert want == (n in (16, 256, 1 << 19, 1 << 20))
    assert _ok(check_nslots, n, ValueError) == want
    assert _ok(_cluster, n, ConfigError) == want
    assert _ok(_descriptor, n, BootstrapError) == want
