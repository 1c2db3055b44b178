"""Bootstrap against hostile connections, over localhost TCP (issue 7 items 18 and 19).

Item 18: unauthenticated connections (garbage, a wrong token, an idle socket, a flood) must
not stop a listener, nor delay a good peer beyond its own normal deadline. Item 19: a relay
in the path that forwards the handshake and then alters, replays or reorders a message is
detected; so is one that alters the handshake itself.
"""

from __future__ import annotations

import contextlib
import logging
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
from tests.waiting import wait_for

TOKEN = "correct horse battery"
GOOD_NODE = 1
SERVER_NODE = 2


# ---- helpers -----------------------------------------------------------------------------------
def good_peer(port: int, out: dict[str, Any], **kw: Any) -> threading.Thread:
    """A good client in a thread, with the default dial deadlines (its "normal time")."""

    def run() -> None:
        try:
            with bootstrap.dial("127.0.0.1", port, token=TOKEN, node=GOOD_NODE, **kw) as ch:
                out["peer_node"] = ch.peer_node
                ch.send({"t": "desc", "x": 7})
                out["reply"] = ch.recv("desc")["x"]
        except Exception as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def serve_good(lst: bootstrap.Listener, accept_s: float = 30) -> dict[str, Any]:
    """Accept the good peer (whatever else connects) and answer its message."""
    with lst.accept(accept_s) as ch:
        msg = ch.recv("desc")
        ch.send({"t": "desc", "x": msg["x"] + 1})
        return {"peer_node": ch.peer_node, "x": msg["x"]}


def frame(obj: Any) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


@pytest.fixture
def listener() -> Iterator[bootstrap.Listener]:
    # A long per-connection deadline: an idle attacker is not timed out before the good peer
    # needs its answer, so only concurrency can let the good peer through.
    with bootstrap.Listener("127.0.0.1", 0, token=TOKEN, node=SERVER_NODE, timeout_s=60) as lst:
        yield lst


# ---- item 18: denial of service ----------------------------------------------------------------
def check_good_peer_served(lst: bootstrap.Listener) -> None:
    out: dict[str, Any] = {}
    t = good_peer(lst.port, out)
    served = serve_good(lst)
    t.join(30)
    assert served == {"peer_node": GOOD_NODE, "x": 7}
    assert out == {"peer_node": SERVER_NODE, "reply": 8}


def test_garbage_connection_does_not_stop_the_listener(
    listener: bootstrap.Listener, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rdmasched.bootstrap")
    with socket.create_connection(("127.0.0.1", listener.port)) as bad:
        bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        check_good_peer_served(listener)
        wait_for(lambda: listener.stats().failed == 1, "the garbage handshake counted as failed")
    st = listener.stats()
    assert (st.failed, st.authenticated, st.pending) == (1, 1, 0)
    assert "bootstrap peer" in st.last_failure
    assert any("handshake" in r.getMessage() for r in caplog.records)


def test_wrong_token_connection_does_not_stop_the_listener(listener: bootstrap.Listener) -> None:
    with pytest.raises(BootstrapError, match="token"):
        bootstrap.dial("127.0.0.1", listener.port, token="not the token", node=9)
    check_good_peer_served(listener)
    wait_for(lambda: listener.stats().failed == 1, "the wrong token counted as failed")
    assert "token" in listener.stats().last_failure


def test_malformed_frames_are_each_one_failure(listener: bootstrap.Listener) -> None:
    bad = [
        struct.pack(">I", bootstrap.MAX_FRAME + 1),  # an oversized frame
        frame([1, 2, 3]),  # not a map
        frame({"t": "hello", "proto": bootstrap.PROTOCOL, "v": bootstrap.VERSION}),  # no nonce
        frame({"t": "auth", "mac": bytes(32)}),  # out of order
        struct.pack(">I", 3) + b"\xc1\xc1\xc1",  # not msgpack
    ]
    socks = [socket.create_connection(("127.0.0.1", listener.port)) for _ in bad]
    try:
        for s, data in zip(socks, bad, strict=True):
            s.sendall(data)
        wait_for(lambda: listener.stats().failed == len(bad), "every bad frame counted")
        check_good_peer_served(listener)
    finally:
        for s in socks:
            s.close()


def test_what_a_peer_sends_reaches_the_log_bounded_and_on_one_line(
    listener: bootstrap.Listener, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rdmasched.bootstrap")
    with socket.create_connection(("127.0.0.1", listener.port)) as bad:
        bad.sendall(frame({"t": "x\n" * 20_000}))
        wait_for(lambda: listener.stats().failed == 1, "counted")
    text = listener.stats().last_failure
    assert "not an rdmasched peer" in text and len(text) <= 500 and "\n" not in text
    logged = [r.getMessage() for r in caplog.records]
    assert logged and all(len(m) < 1000 and "\n" not in m for m in logged)


def test_idle_connection_does_not_delay_a_good_peer(listener: bootstrap.Listener) -> None:
    with socket.create_connection(("127.0.0.1", listener.port)):  # first in the backlog
        check_good_peer_served(listener)
        assert listener.stats().pending == 1  # still there, still harmless


def test_idle_connection_is_dropped_at_its_deadline() -> None:
    with (
        bootstrap.Listener(
            "127.0.0.1", 0, token=TOKEN, node=SERVER_NODE, handshake_timeout_s=0.3
        ) as lst,
        socket.create_connection(("127.0.0.1", lst.port)) as idle,
    ):
        idle.settimeout(30)
        assert idle.recv(1) == b""  # the listener closed it
        wait_for(lambda: lst.stats().failed == 1, "the timeout counted")
        assert "within 0.3 s" in lst.stats().last_failure
        check_good_peer_served(lst)


def test_many_connections_at_once_are_bounded() -> None:
    bound = 4
    with bootstrap.Listener(
        "127.0.0.1",
        0,
        token=TOKEN,
        node=SERVER_NODE,
        timeout_s=60,
        max_pending=bound,
        max_pending_per_host=bound,  # every connection here comes from 127.0.0.1
    ) as lst:
        idle: list[socket.socket] = []
        garbage: list[socket.socket] = []
        peak = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], lst.stats().pending)
                time.sleep(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            for i in range(40):
                s = socket.create_connection(("127.0.0.1", lst.port))
                if i % 2:
                    s.sendall(b"\xff\xff\xff\xff")  # a frame length over the limit
                    garbage.append(s)
                else:
                    idle.append(s)
            wait_for(lambda: lst.stats().connections == 40, "every connection seen")
            # The excess is closed at once (after a "busy" error), not left to its deadline.
            closed = 0
            for s in idle:
                s.settimeout(0.5)
                with contextlib.suppress(TimeoutError, ConnectionResetError):
                    data = s.recv(4096)
                    closed += 1
                    if data:
                        (n,) = struct.unpack(">I", data[:4])
                        assert msgpack.unpackb(data[4 : 4 + n])["code"] == "busy"
            assert closed >= len(idle) - bound
            check_good_peer_served(lst)
        finally:
            stop.set()
            sampler.join(5)
            for s in idle + garbage:
                s.close()
        st = lst.stats()
        assert peak[0] <= bound
        assert st.refused + st.evicted >= len(idle) - bound
        assert st.connections == st.authenticated + st.failed + st.refused + st.evicted + st.pending
        assert st.authenticated == 1


def test_a_flood_of_idle_connections_does_not_lock_out_a_good_peer() -> None:
    """Every pending slot held by a stalled connection: a newcomer evicts the stalest one."""
    bound = 3
    with bootstrap.Listener(
        "127.0.0.1",
        0,
        token=TOKEN,
        node=SERVER_NODE,
        timeout_s=60,
        max_pending=bound,
        max_pending_per_host=bound,  # every connection here comes from 127.0.0.1
    ) as lst:
        idle = [socket.create_connection(("127.0.0.1", lst.port)) for _ in range(bound)]
        try:
            wait_for(lambda: lst.stats().pending == bound, "the bound is full")
            check_good_peer_served(lst)
            assert lst.stats().evicted >= 1
        finally:
            for s in idle:
                s.close()


def test_close_stops_pending_handshakes(listener: bootstrap.Listener) -> None:
    with socket.create_connection(("127.0.0.1", listener.port)) as idle:
        wait_for(lambda: listener.stats().pending == 1, "pending")
        listener.close()
        idle.settimeout(30)
        with contextlib.suppress(ConnectionResetError):
            assert idle.recv(1) == b""
    with pytest.raises(BootstrapError, match="closed"):
        listener.accept(0.1)


# ---- item 19: a relay in the path ------------------------------------------------------------
Hook = Callable[[int, bytes], list[bytes]]


class Relay:
    """A man in the middle on loopback: forwards one connection to `port` frame by frame.
    `c2s` / `s2c` see each frame (with its length prefix) and its index in that direction
    and return the frames to forward instead (several: a replay; none: held back)."""

    def __init__(self, port: int, c2s: Hook | None = None, s2c: Hook | None = None) -> None:
        self.upstream = port
        self.hooks = (c2s or (lambda i, f: [f]), s2c or (lambda i, f: [f]))
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._run, daemon=True)]
        self.threads[0].start()

    def _run(self) -> None:
        client, _ = self.srv.accept()
        server = socket.create_connection(("127.0.0.1", self.upstream))
        self.socks += [client, server]
        for src, dst, hook in ((client, server, self.hooks[0]), (server, client, self.hooks[1])):
            t = threading.Thread(target=self._pump, args=(src, dst, hook), daemon=True)
            t.start()
            self.threads.append(t)

    @staticmethod
    def _recv(sock: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _pump(self, src: socket.socket, dst: socket.socket, hook: Hook) -> None:
        i = 0
        try:
            while True:
                head = self._recv(src, 4)
                f = head + self._recv(src, struct.unpack(">I", head)[0])
                for out in hook(i, f):
                    dst.sendall(out)
                i += 1
        except (EOFError, OSError):
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for s in [self.srv, *self.socks]:
            s.close()


# client -> server frames: 0 hello, 1 auth, 2... the messages after the handshake
# server -> client frames: 0 challenge, 1 ok, 2... the messages after the handshake
FIRST_AFTER_HANDSHAKE = 2

DESC = {"t": "desc", "desc": {"lane": {"addr": 0x7F0000001000, "rkey": 0x1234}}}
RKEY = b"\xcd\x12\x34"  # msgpack uint16 0x1234


def rewrite_rkey(i: int, f: bytes) -> list[bytes]:
    if i == FIRST_AFTER_HANDSHAKE:
        assert f.count(RKEY) == 1
        f = f.replace(RKEY, b"\xcd\x12\x35")
    return [f]


def through_relay(
    c2s: Hook | None,
    s2c: Hook | None,
    client_fn: Callable[[bootstrap.Channel], Any],
    server_fn: Callable[[bootstrap.Channel], Any],
    accept_s: float = 10,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A handshake through a relay, then client_fn and server_fn; what each side got."""
    cli: dict[str, Any] = {}
    srv: dict[str, Any] = {}
    with bootstrap.Listener("127.0.0.1", 0, token=TOKEN, node=SERVER_NODE, timeout_s=5) as lst:
        relay = Relay(lst.port, c2s, s2c)

        def serve() -> None:
            try:
                with lst.accept(accept_s) as ch:
                    srv["result"] = server_fn(ch)
            except Exception as exc:
                srv["error"] = exc
            srv["stats"] = lst.stats()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        try:
            with bootstrap.dial(
                "127.0.0.1", relay.port, token=TOKEN, node=GOOD_NODE, timeout_s=5
            ) as ch:
                cli["result"] = client_fn(ch)
        except Exception as exc:
            cli["error"] = exc
        t.join(20)
        relay.close()
    return cli, srv


def send_desc(ch: bootstrap.Channel) -> None:
    ch.send(DESC)
    ch.recv("up")


def recv_desc(ch: bootstrap.Channel) -> Any:
    d = ch.recv("desc")["desc"]
    ch.send({"t": "up"})
    return d


def test_relay_that_forwards_faithfully_changes_nothing() -> None:
    cli, srv = through_relay(None, None, send_desc, recv_desc)
    assert "error" not in cli and "error" not in srv
    assert srv["result"] == DESC["desc"]


def test_relay_rewriting_a_descriptor_is_detected() -> None:
    cli, srv = through_relay(rewrite_rkey, None, send_desc, recv_desc)
    assert "result" not in srv, f"a rewritten descriptor was accepted: {srv['result']}"
    assert isinstance(srv["error"], BootstrapError)
    assert "MAC" in str(srv["error"]) and "relay" in str(srv["error"])
    assert "your sealed message 0 fails its MAC" in str(cli["error"])  # the client is told


def test_relay_rewriting_the_servers_descriptor_is_detected() -> None:
    def client(ch: bootstrap.Channel) -> Any:
        ch.send({"t": "go"})
        return ch.recv("desc")["desc"]

    def server(ch: bootstrap.Channel) -> None:
        ch.recv("go")
        ch.send(DESC)
        with contextlib.suppress(BootstrapError):
            ch.recv("up")

    cli, _ = through_relay(None, rewrite_rkey, client, server)
    assert "result" not in cli, f"a rewritten descriptor was accepted: {cli['result']}"
    assert "MAC" in str(cli["error"])


def test_relay_replaying_a_message_is_detected() -> None:
    def twice(i: int, f: bytes) -> list[bytes]:
        return [f, f] if i == FIRST_AFTER_HANDSHAKE else [f]

    def server(ch: bootstrap.Channel) -> Any:
        first = ch.recv("desc")
        return first, ch.recv("desc")

    def client(ch: bootstrap.Channel) -> None:
        ch.send(DESC)
        time.sleep(0.5)  # the server reads both copies before this side closes

    _, srv = through_relay(twice, None, client, server)
    assert "result" not in srv, "a replayed message was accepted"
    assert "MAC" in str(srv["error"])


def test_relay_reordering_messages_is_detected() -> None:
    held: list[bytes] = []

    def swap(i: int, f: bytes) -> list[bytes]:
        if i == FIRST_AFTER_HANDSHAKE:
            held.append(f)
            return []
        if i == FIRST_AFTER_HANDSHAKE + 1:
            return [f, *held]
        return [f]

    def client(ch: bootstrap.Channel) -> None:
        ch.send({"t": "desc", "i": 1})
        ch.send({"t": "desc", "i": 2})
        time.sleep(0.5)

    def server(ch: bootstrap.Channel) -> Any:
        try:
            return [ch.recv("desc")["i"], ch.recv("desc")["i"]]
        except BootstrapError:
            # Message 1 comes next and would pass its own MAC: after a failure, nothing does.
            with pytest.raises(BootstrapError, match="MAC"):
                ch.recv("desc")
            raise

    _, srv = through_relay(swap, None, client, server)
    assert "result" not in srv, f"reordered messages were accepted: {srv.get('result')}"
    assert "MAC" in str(srv["error"])


def test_relay_dropping_a_message_is_detected() -> None:
    def drop(i: int, f: bytes) -> list[bytes]:
        return [] if i == FIRST_AFTER_HANDSHAKE else [f]

    def client(ch: bootstrap.Channel) -> None:
        ch.send({"t": "desc", "i": 1})
        ch.send({"t": "desc", "i": 2})
        time.sleep(0.5)

    def server(ch: bootstrap.Channel) -> Any:
        return ch.recv("desc")["i"]

    _, srv = through_relay(drop, None, client, server)
    assert "result" not in srv, f"message 2 was taken for message 1: {srv.get('result')}"
    assert "MAC" in str(srv["error"])


@pytest.mark.parametrize("direction", ["c2s", "s2c"])
def test_relay_rewriting_a_node_id_in_the_handshake_is_detected(direction: str) -> None:
    node = GOOD_NODE if direction == "c2s" else SERVER_NODE
    key = msgpack.packb("node") + msgpack.packb(node)

    def rewrite(i: int, f: bytes) -> list[bytes]:
        if i == 0:
            assert f.count(key) == 1
            f = f.replace(key, msgpack.packb("node") + msgpack.packb(5))
        return [f]

    hooks = (rewrite, None) if direction == "c2s" else (None, rewrite)
    cli, srv = through_relay(*hooks, lambda ch: ch.peer_node, lambda ch: ch.peer_node, 3)
    assert "result" not in cli and "result" not in srv, (cli, srv)
    assert isinstance(cli["error"], BootstrapError)
    assert "altered" in str(cli["error"]) or "token" in str(cli["error"])
    assert srv["stats"].failed == 1


def test_a_sustained_flood_from_one_host_does_not_lock_out_another() -> None:
    """One host opening connections as fast as it can holds at most its share of the bound;
    a peer from another address is served within its normal time. (Linux routes all of
    127/8 to loopback, so 127.0.0.2 is another host here.)"""
    with bootstrap.Listener(
        "0.0.0.0", 0, token=TOKEN, node=SERVER_NODE, timeout_s=60, max_pending=8
    ) as lst:
        stop = threading.Event()
        opened = [0]

        def flood() -> None:
            socks: list[socket.socket] = []
            while not stop.is_set():
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                with contextlib.suppress(OSError):
                    s.connect(("127.0.0.1", lst.port))
                    opened[0] += 1
                socks.append(s)
                if len(socks) > 200:
                    socks.pop(0).close()
            for s in socks:
                s.close()

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        try:
            wait_for(lambda: opened[0] > 50, "the flood is under way")
            check_good_peer_served(lst)
        finally:
            stop.set()
            t.join(10)
        st = lst.stats()
        assert st.refused + st.evicted > 0


@pytest.mark.parametrize(
    "kw",
    [
        {"max_pending": 0},
        {"max_pending": 8, "max_pending_per_host": 0},
        {"max_pending": 8, "max_pending_per_host": 9},
        {"handshake_timeout_s": 0},
        {"node": 70_000},
    ],
)
def test_listener_limits_are_checked(kw: dict[str, Any]) -> None:
    args: dict[str, Any] = {"token": TOKEN, "node": SERVER_NODE, **kw}
    with pytest.raises(ConfigError):
        bootstrap.Listener("127.0.0.1", 0, **args)
