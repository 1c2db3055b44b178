"""The public namespace, the API Node and Client share, and the client-lane protocol module
(issue 19: rdmasched/__init__.py, rdmasched/api.py, rdmasched/clientproto.py)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import rdmasched
from rdmasched import api, clientproto
from rdmasched.wire import Flag


def test_the_public_names_are_at_the_top() -> None:
    from rdmasched import LATER, Client, Node
    from rdmasched.client import Client as ClientItself
    from rdmasched.daemon.node import LATER as NodeLater
    from rdmasched.daemon.node import Node as NodeItself

    assert (Node, Client) == (NodeItself, ClientItself)
    assert LATER is NodeLater is api.LATER
    assert {"Node", "Client", "LATER"} <= set(dir(rdmasched)) & set(rdmasched.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        rdmasched.Nope  # noqa: B018


@pytest.mark.parametrize("module", ["rdmasched", "rdmasched.wire", "rdmasched.transport.shm"])
def test_the_lane_layer_does_not_load_the_daemon(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "print(sorted(m for m in sys.modules if m.startswith(('rdmasched.daemon', "
        "'rdmasched.client', 'rdmasched.api', 'rdmasched.launch'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_node_and_client_offer_the_same_api() -> None:
    from rdmasched import Client, Node

    for name, member in inspect.getmembers(api.NodeAPI):
        if name.startswith("_") or name == "id":
            continue
        want = inspect.signature(member.fget if isinstance(member, property) else member)
        for cls in (Node, Client):
            got = getattr(cls, name)
            if isinstance(member, property):
                assert isinstance(got, property), (cls, name)
                continue
            params = list(inspect.signature(got).parameters.values())
            for p in want.parameters.values():  # every parameter, of the same kind and default
                q = next((q for q in params if q.name == p.name), None)
                assert q is not None, (cls, name, p.name)
                assert (q.kind, q.default) == (p.kind, p.default), (cls, name, p.name)


def test_preempt_flags_are_the_wires() -> None:
    assert clientproto.preempt_flags(True, False) == Flag.CANCEL
    assert clientproto.preempt_flags(False, True) == Flag.JOB
    for cancel in (False, True):
        for by_job in (False, True):
            flags = clientproto.preempt_flags(cancel, by_job)
            assert clientproto.preempt_from_flags(flags) == (cancel, by_job)


def test_error_frames_round_trip() -> None:
    from rdmasched.errors import ArgumentError, ConfigError, RdmaschedError

    for exc in (ConfigError("no node 'x'"), ArgumentError("job must be 0..2**32-1")):
        kind, text = clientproto.error_meta(exc)["err"]
        back = clientproto.error_from(kind, text)
        assert (type(back), str(back)) == (type(exc), str(exc))
    assert type(clientproto.error_from("KeyError", "'q'")) is ArgumentError
    assert type(clientproto.error_from("weird", "?")) is RdmaschedError


def test_lane_names() -> None:
    ep = clientproto.endpoint_name("job7", "gpu02")
    assert ep == "job7.gpu02"
    assert clientproto.up_lane(ep, 3) == "job7.gpu02.c3.up"
    assert clientproto.down_lane(ep, 3) == "job7.gpu02.c3.down"
    assert len(clientproto.bell_name(ep, "c254")) <= 21
