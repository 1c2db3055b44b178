"""The verbs lane-pair factory for the transport conformance suite (tests/conformance/).

Both ends live in this process on the one RDMA device (Soft-RoCE over loopback in the VM):
two endpoints, nodes 7 and 8, meet through the real TCP bootstrap (the listener side in a
thread) and each `pair()` is one connection: node 7's `tx`, node 8's `rx`.

Where there is no usable RDMA device the tests skip with a message saying how to run them;
with CI=true or RDMASCHED_REQUIRE_RDMA=1 they fail instead.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

TOKEN = "tier3-conformance-token"


def rdma_required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("RDMASCHED_REQUIRE_RDMA") == "1"


def device_options(config: pytest.Config | None = None) -> tuple[str | None, int | None]:
    """(device, GID index): the tier-3 options, else RDMASCHED_DEVICE / RDMASCHED_GID_INDEX."""
    dev = os.environ.get("RDMASCHED_DEVICE") or None
    gid = os.environ.get("RDMASCHED_GID_INDEX")
    if config is not None:
        dev = config.getoption("--rdma-device", default=None) or dev
        opt = config.getoption("--gid-index", default=None)
        gid = str(opt) if opt is not None else gid
    return dev, int(gid) if gid not in (None, "") else None


def open_device(config: pytest.Config | None = None) -> Any:
    """An open verbs.Device, or skip (fail under CI) saying why there is none."""
    from rdmasched.errors import RdmaschedError
    from rdmasched.transport import verbs

    dev, gid = device_options(config)
    try:
        return verbs.Device(dev, gid_index=gid)
    except RdmaschedError as exc:
        why = str(exc).split("; ")[0]
        msg = (
            f"{why}. Tier 3 runs in the Soft-RoCE VM: tests/vm/run-in-vm.sh -- python3 -m "
            "pytest tests/tier3 tests/conformance (or soft-roce-setup.sh up on a kernel "
            "with rdma_rxe)"
        )
        if rdma_required():
            pytest.fail(msg + " [RDMA required here: CI=true or RDMASCHED_REQUIRE_RDMA=1]")
        pytest.skip(msg)


def connect_pair(
    a: Any, b: Any, *, nslots: int | None = None, timeout_s: float = 20.0
) -> tuple[Any, Any]:
    """Connect endpoint `a` to endpoint `b` (b accepts in a thread); (a's, b's) connection."""
    lst = b.listen("127.0.0.1", 0)
    out: dict[str, Any] = {}

    def accept() -> None:
        try:
            out["conn"] = b.accept(timeout_s, nslots=nslots)
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        ca = a.connect("127.0.0.1", lst.port, nslots=nslots, timeout_s=timeout_s)
    finally:
        t.join(timeout_s + 5)
    if "error" in out:
        raise out["error"]
    return ca, out["conn"]


class VerbsPairs:
    """Makes connected (sender, receiver) lane pairs on the verbs transport."""

    name = "verbs"

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.device = open_device(request.config)
        self._endpoints: list[Any] = []

    def pair(self, nslots: int = 64, **kw: Any) -> tuple[Any, Any]:
        from rdmasched.transport import verbs

        grace = kw.pop("grace_us", verbs.DEFAULT_GRACE_US)
        if kw:
            raise TypeError(f"verbs pairs take nslots and grace_us, not {sorted(kw)}")
        a = verbs.Endpoint(self.device, 7, token=TOKEN, nslots=nslots, grace_us=grace)
        self._endpoints.append(a)
        b = verbs.Endpoint(self.device, 8, token=TOKEN, nslots=nslots, grace_us=grace)
        self._endpoints.append(b)
        ca, cb = connect_pair(a, b, nslots=nslots)
        return ca.tx, cb.rx

    def close(self) -> None:
        for ep in self._endpoints:
            ep.close()
        self._endpoints = []
        self.device.close()


def make_factory(request: pytest.FixtureRequest) -> VerbsPairs:
    return VerbsPairs(request)
