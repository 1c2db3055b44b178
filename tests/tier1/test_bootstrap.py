"""Bootstrap over localhost TCP: authentication, versions, reachability, framing (no RDMA)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest

from rdmasched import bootstrap
from rdmasched.errors import BootstrapError, ConfigError
from rdmasched.transport.verbs import Descriptor

TOKEN = "correct horse battery"


def serve_in_thread(
    listener: bootstrap.Listener, fn: Callable[[bootstrap.Channel], Any] | None = None
) -> tuple[threading.Thread, dict[str, Any]]:
    """Accept one client in a thread; the result (or the error) lands in the dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            ch = listener.accept(5)
            out["peer_node"] = ch.peer_node
            if fn is not None:
                out["result"] = fn(ch)
            ch.close()
        except Exception as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.fixture
def listener() -> Iterator[bootstrap.Listener]:
    with bootstrap.Listener("127.0.0.1", 0, token=TOKEN, node=2, timeout_s=3) as lst:
        yield lst


def test_handshake_then_messages_both_ways(listener: bootstrap.Listener) -> None:
    def echo(ch: bootstrap.Channel) -> Any:
        msg = ch.recv("desc")
        ch.send({"t": "desc", "echo": msg["x"]})
        return msg["x"]

    t, out = serve_in_thread(listener, echo)
    with bootstrap.dial("127.0.0.1", listener.port, token=TOKEN, node=1) as ch:
        assert ch.peer_node == 2
        ch.send({"t": "desc", "x": [1, b"\x00\xff", "z"]})
        assert ch.recv("desc")["echo"] == [1, b"\x00\xff", "z"]
    t.join(5)
    assert out == {"peer_node": 1, "result": [1, b"\x00\xff", "z"]}


def test_wrong_token_fails_on_both_sides_and_says_so(listener: bootstrap.Listener) -> None:
    with pytest.raises(BootstrapError, match="token"):
        bootstrap.dial("127.0.0.1", listener.port, token="another token!", node=1)
    # The listener goes on: the failure is logged and counted, and named if nobody good comes.
    with pytest.raises(BootstrapError, match=r"1 failed handshake.*token"):
        listener.accept(0.5)
    st = listener.stats()
    assert (st.failed, st.authenticated) == (1, 0)
    assert "token" in st.last_failure


def test_server_with_the_wrong_token_is_not_trusted() -> None:
    """The client checks the server's proof before it sends anything that grants access."""
    with bootstrap.Listener("127.0.0.1", 0, token="server token", node=2, timeout_s=3) as lst:
        with pytest.raises(BootstrapError, match="does not hold our token"):
            bootstrap.dial("127.0.0.1", lst.port, token=TOKEN, node=1)
        with pytest.raises(BootstrapError, match="no bootstrap client"):
            lst.accept(0.5)
        assert lst.stats().failed == 1


def test_protocol_version_mismatch_is_named(listener: bootstrap.Listener) -> None:
    other = bootstrap.VERSION + 1
    with pytest.raises(
        BootstrapError, match=rf"version mismatch: client {other}, server {bootstrap.VERSION}"
    ):
        bootstrap.dial("127.0.0.1", listener.port, token=TOKEN, node=1, version=other)
    with pytest.raises(BootstrapError, match="version mismatch"):
        listener.accept(0.5)


def test_a_version_1_peer_is_told_to_upgrade(listener: bootstrap.Listener) -> None:
    """Version 1 (no MACs after the handshake) is refused with the versions named."""
    with pytest.raises(BootstrapError, match=r"version mismatch: client 1, server 2"):
        bootstrap.dial("127.0.0.1", listener.port, token=TOKEN, node=1, version=1)


def test_unreachable_peer_names_the_address_and_is_bounded() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens on this port now
    t0 = time.monotonic()
    with pytest.raises(BootstrapError) as ei:
        bootstrap.dial(
            "127.0.0.1",
            port,
            token=TOKEN,
            node=1,
            attempts=3,
            retry_delay_s=0.05,
            connect_timeout_s=0.5,
        )
    assert time.monotonic() - t0 < 5
    text = str(ei.value)
    assert f"127.0.0.1:{port}" in text and "unreachable" in text and "3 attempt" in text


def test_silent_peer_times_out() -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(BootstrapError, match=r"within 0\.3 s"):
            bootstrap.dial("127.0.0.1", port, token=TOKEN, node=1, timeout_s=0.3)
        assert time.monotonic() - t0 < 3


def test_not_a_bootstrap_peer() -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]

        def babble() -> None:
            c, _ = srv.accept()
            c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            time.sleep(0.5)
            c.close()

        t = threading.Thread(target=babble, daemon=True)
        t.start()
        with pytest.raises(BootstrapError, match="not an rdmasched bootstrap peer"):
            bootstrap.dial("127.0.0.1", port, token=TOKEN, node=1, timeout_s=2)
        t.join(5)


def test_garbage_client_is_refused(listener: bootstrap.Listener) -> None:
    with socket.create_connection(("127.0.0.1", listener.port)) as c:
        body = msgpack.packb({"t": "hello", "proto": "something-else", "v": 1})
        c.sendall(struct.pack(">I", len(body)) + body)
        c.settimeout(5)
        (n,) = struct.unpack(">I", c.recv(4))
        assert msgpack.unpackb(c.recv(n))["code"] == "proto"  # told why, then closed
    with pytest.raises(BootstrapError, match="not an rdmasched peer"):
        listener.accept(0.5)


def test_accept_times_out(listener: bootstrap.Listener) -> None:
    with pytest.raises(BootstrapError, match="no bootstrap client"):
        listener.accept(0.2)


def test_short_token_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="at least 8 bytes"):
        bootstrap.Listener("127.0.0.1", 0, token="short", node=1)


def test_address_parsing() -> None:
    assert bootstrap.parse_address("192.0.2.1:7000") == ("192.0.2.1", 7000)
    assert bootstrap.parse_address("[::1]:7000") == ("::1", 7000)
    assert bootstrap.parse_address("host", 18600) == ("host", 18600)
    for bad in ("host", "host:x", "host:0", ":80"):
        with pytest.raises(ConfigError):
            bootstrap.parse_address(bad)


def _desc() -> dict[str, Any]:
    return Descriptor(
        node=3,
        gid=bytes(10) + b"\xff\xff" + bytes([192, 0, 2, 1]),
        gid_index=1,
        qpn=17,
        psn=0xABCDE,
        mtu=3,
        lane_addr=0x7F0000001000,
        lane_rkey=0x1234,
        nslots=256,
        epoch=1,
        ctl_addr=0x7F0000002000,
        ctl_rkey=0x5678,
    ).to_wire()


def test_descriptor_round_trip_through_msgpack() -> None:
    wire = msgpack.unpackb(msgpack.packb(_desc(), use_bin_type=True), raw=False)
    d = Descriptor.from_wire(wire)
    assert d.to_wire() == _desc()


@pytest.mark.parametrize(
    "path,value",
    [
        (("gid",), b"short"),
        (("qpn",), 0),
        (("psn",), 1 << 24),
        (("mtu",), 9),
        (("lane", "nslots"), 100),
        (("lane", "epoch"), 0),
        (("lane", "rkey"), -1),
        (("ctl", "addr"), "0x10"),
        (("node",), True),
    ],
)
def test_bad_descriptor_field_is_named(path: tuple[str, ...], value: Any) -> None:
    d = _desc()
    target = d
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    with pytest.raises(BootstrapError, match=path[-1]):
        Descriptor.from_wire(d, "peer:1")


@pytest.mark.parametrize("version", [None, 1, 3])
def test_a_descriptor_of_another_wire_version_is_refused(version: int | None) -> None:
    """Wire v2 (issue 8 item 3): the lane descriptor carries the wire protocol version; a v1
    peer (whose descriptor has no "wire" key) or any other version is refused, naming both."""
    d = _desc()
    assert d["wire"] == 2
    if version is None:
        del d["wire"]
    else:
        d["wire"] = version
    with pytest.raises(BootstrapError, match=rf"wire protocol version {version or 1}.*version 2"):
        Descriptor.from_wire(d, "peer:1")


def test_a_version_1_peers_descriptor_is_answered_with_a_version_error(
    listener: bootstrap.Listener,
) -> None:
    """Over a real bootstrap channel: the server reads a v1 descriptor (no "wire" key),
    refuses it, and the v1 client reads why: an error `version` naming both versions."""
    from rdmasched.transport.verbs import _their_descriptor

    t, out = serve_in_thread(listener, _their_descriptor)
    v1 = _desc()
    del v1["wire"]
    with bootstrap.dial("127.0.0.1", listener.port, token=TOKEN, node=1) as ch:
        ch.send({"t": "desc", "desc": v1})
        with pytest.raises(BootstrapError, match=r"wire protocol version 1, this node version 2"):
            ch.recv("desc")
    t.join(5)
    assert isinstance(out["error"], BootstrapError)
    assert "wire protocol version 1" in str(out["error"])
