"""Fixtures shared by every tier.

Tiers are folders: tier1 (no RDMA, one process), tier2 (shm, several processes), tier3 (real
RDMA verbs on Soft-RoCE; inside the VM, see tests/vm/). Each test is marked with its tier.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rdmasched.transport import shm


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in ("tier1", "tier2", "tier3"):
            item.add_marker(getattr(pytest.mark, tier))
        elif tier == "conformance":
            # one process on shm; the verbs parameter already carries the tier3 mark
            callspec = getattr(item, "callspec", None)
            if callspec is None or callspec.params.get("pairs") == "shm":
                item.add_marker(pytest.mark.tier1)


@pytest.fixture
def lane_name() -> Callable[[str], str]:
    """Unique lane names, so tests never meet another run's segments."""
    tag = f"t{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return lambda suffix="": f"{tag}{suffix}"


@pytest.fixture(autouse=True)
def _no_leaked_segments() -> Iterator[None]:
    """Every test closes what it creates: no shm segment of this process outlives it."""
    before = set(shm.list_segments())
    yield
    leaked = [s for s in set(shm.list_segments()) - before if f"t{os.getpid()}-" in s]
    for s in leaked:
        shm.ShmSegment.unlink_name(s)
    assert not leaked, f"test left shared-memory segments behind: {leaked}"


# ---- transport conformance: the same tests on every transport ---------------------------------
class ShmPairs:
    """Makes connected (sender, receiver) lane pairs on the shm transport."""

    name = "shm"

    def __init__(self, lane_name: Callable[[str], str]) -> None:
        self._name = lane_name
        self._open: list[Any] = []
        self._count = 0

    def pair(self, nslots: int = 64, **kw: Any) -> tuple[Any, Any]:
        self._count += 1
        name = self._name(f"-p{self._count}")
        rx = shm.create_lane(name, nslots, **kw)
        tx = shm.attach_lane(name, src=7)
        self._open += [tx, rx]
        return tx, rx

    def close(self) -> None:
        for lane in self._open:
            lane.close()


def _transports() -> list[Any]:
    params: list[Any] = ["shm"]
    try:
        from tests.tier3 import verbs_pairs  # noqa: F401
    except ImportError:
        pass
    else:
        params.append(pytest.param("verbs", marks=pytest.mark.tier3))
    return params


@pytest.fixture(params=_transports())
def pairs(request: pytest.FixtureRequest, lane_name: Callable[[str], str]) -> Iterator[Any]:
    """Lane-pair factory for the transport conformance suite, one param per transport."""
    if request.param == "shm":
        factory: Any = ShmPairs(lane_name)
    else:
        from tests.tier3 import verbs_pairs

        factory = verbs_pairs.make_factory(request)
    try:
        yield factory
    finally:
        factory.close()
