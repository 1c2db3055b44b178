"""Tier 3: the verbs transport on a real RDMA device (Soft-RoCE inside the VM).

Options (defaults from the VM harness's environment):
  --rdma-device NAME   RDMASCHED_DEVICE      (default: the first device)
  --gid-index N        RDMASCHED_GID_INDEX   (default: the port's RoCE v2 IPv4 GID)
Without a usable device the tests skip saying how to run them (tests/vm/run-in-vm.sh); with
CI=true or RDMASCHED_REQUIRE_RDMA=1 they fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.tier3 import verbs_pairs


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rdma", "tier 3 (RDMA verbs)")
    group.addoption(
        "--rdma-device",
        default=os.environ.get("RDMASCHED_DEVICE"),
        help="RDMA device for tier 3 (env RDMASCHED_DEVICE)",
    )
    group.addoption(
        "--gid-index",
        type=int,
        default=None,
        help="GID index for tier 3 (env RDMASCHED_GID_INDEX; default: RoCE v2 IPv4)",
    )


@pytest.fixture
def device(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An open verbs.Device (skips, or fails under CI, when there is none)."""
    dev = verbs_pairs.open_device(request.config)
    try:
        yield dev
    finally:
        dev.close()


@pytest.fixture
def device_args(request: pytest.FixtureRequest) -> tuple[str | None, int | None]:
    """(device name, GID index) for code that opens its own device (child processes)."""
    dev = verbs_pairs.open_device(request.config)
    try:
        return dev.name, dev.gid.index
    finally:
        dev.close()
