"""The verbs transport through a hostile bootstrap (tier 3, issue 7 items 18 and 19).

Two endpoints on one device: hostile connections to the listener do not stop it, and a relay
that alters a descriptor after a good handshake leaves no connection behind on either side.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from rdmasched import Kind
from rdmasched.errors import BootstrapError
from rdmasched.transport import verbs
from tests.tier1.test_bootstrap_hostile import FIRST_AFTER_HANDSHAKE, Relay, wait_for
from tests.tier3.verbs_pairs import TOKEN


def _accept(ep: verbs.Endpoint, out: dict[str, Any], timeout_s: float = 30) -> threading.Thread:
    def run() -> None:
        try:
            out["conn"] = ep.accept(timeout_s)
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _exchange(a: Any, b: Any) -> None:
    b.tx.send(Kind.DISPATCH, 41)
    a.tx.send(Kind.DISPATCH, 42)
    ma = a.rx.poll(timeout_us=10_000_000)
    mb = b.rx.poll(timeout_us=10_000_000)
    assert ma is not None and ma.id == 41
    assert mb is not None and mb.id == 42


def test_hostile_connections_do_not_stop_a_verbs_listener(device: Any) -> None:
    with (
        verbs.Endpoint(device, 1, token=TOKEN, nslots=256) as a,
        verbs.Endpoint(device, 2, token=TOKEN, nslots=256) as b,
    ):
        lst = a.listen("127.0.0.1", 0)
        idle = socket.create_connection(("127.0.0.1", lst.port))
        garbage = socket.create_connection(("127.0.0.1", lst.port))
        garbage.sendall(b"\x00\x00\x00\x04junk")
        with (
            verbs.Endpoint(device, 3, token="another token", nslots=256) as c,
            pytest.raises(BootstrapError, match="token"),
        ):
            c.connect("127.0.0.1", lst.port)
        out: dict[str, Any] = {}
        t = _accept(a, out)
        cb = b.connect("127.0.0.1", lst.port, timeout_s=20)
        t.join(40)
        assert "error" not in out, out
        _exchange(out["conn"], cb)
        wait_for(lambda: lst.stats().failed == 2, "both bad handshakes counted")
        st = lst.stats()
        assert st.authenticated == 1 and st.pending == 1, st
        idle.close()
        garbage.close()


def test_relay_altering_a_verbs_descriptor_leaves_no_connection(device: Any) -> None:
    def flip_rkey(i: int, f: bytes) -> list[bytes]:
        if i == FIRST_AFTER_HANDSHAKE:
            buf = bytearray(f)
            at = buf.index(b"\xa4rkey") + 5
            buf[at if buf[at] < 0x80 else at + 1] ^= 1  # one byte of the lane's rkey
            f = bytes(buf)
        return [f]

    with (
        verbs.Endpoint(device, 1, token=TOKEN, nslots=256) as a,
        verbs.Endpoint(device, 2, token=TOKEN, nslots=256) as b,
    ):
        lst = a.listen("127.0.0.1", 0)
        relay = Relay(lst.port, flip_rkey)
        out: dict[str, Any] = {}
        t = _accept(a, out, 20)
        try:
            with pytest.raises(BootstrapError, match="fails its MAC"):
                b.connect("127.0.0.1", relay.port, timeout_s=20)
            t.join(40)
        finally:
            relay.close()
        assert "fails its MAC" in str(out.get("error")), out
        assert a.connections() == [] and b.connections() == []
        # The good path still works between the same endpoints.
        t = _accept(a, out)
        cb = b.connect("127.0.0.1", lst.port, timeout_s=20)
        t.join(40)
        _exchange(out["conn"], cb)
