"""The bootstrap wire, version 2, as docs/VERBS.md states it: an independent implementation.

Everything below the imports is written from the document alone (hashlib, hmac, msgpack,
sockets; nothing from rdmasched.bootstrap but the objects under test), checked against the
document's test vector, and then made to talk to the real `Listener` and `dial`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import msgpack
import pytest

from rdmasched import bootstrap
from rdmasched.errors import BootstrapError

DOC = Path(__file__).resolve().parents[2] / "docs" / "VERBS.md"
TOKEN = b"correct horse battery"


def h(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def transcript(v: int, c: int, s: int, cnonce: bytes, snonce: bytes) -> bytes:
    return b"rdmasched-bootstrap" + struct.pack(">IHH", v, c, s) + cnonce + snonce


def keys(token: bytes, cnonce: bytes, snonce: bytes, t: bytes) -> tuple[bytes, bytes]:
    prk = h(cnonce + snonce, token)
    return h(prk, b"rdmasched c2s" + t + b"\x01"), h(prk, b"rdmasched s2c" + t + b"\x01")


class Wire:
    """One side of a connection: plain frames, then sealed ones."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(10)
        self.tx_key = self.rx_key = b""
        self.tx_seq = self.rx_seq = 0

    def send(self, msg: dict[str, Any]) -> None:
        m = msgpack.packb(msg, use_bin_type=True)
        if self.tx_key:
            m += h(self.tx_key, struct.pack(">Q", self.tx_seq) + m)
            self.tx_seq += 1
        self.sock.sendall(struct.pack(">I", len(m)) + m)

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "peer closed"
            buf += chunk
        return buf

    def recv(self) -> dict[str, Any]:
        (n,) = struct.unpack(">I", self._exact(4))
        assert n <= 65536
        body = self._exact(n)
        if self.rx_key:
            m, tag = body[:-32], body[-32:]
            assert hmac.compare_digest(tag, h(self.rx_key, struct.pack(">Q", self.rx_seq) + m))
            self.rx_seq += 1
            body = m
        msg = msgpack.unpackb(body, raw=False)
        assert isinstance(msg, dict) and isinstance(msg["t"], str)
        return msg


def doc_vector() -> dict[str, str]:
    text = DOC.read_text()
    section = text[text.index("**Test vector.**") :]
    rows = re.findall(r"^\| ([^|]+?) \| (`[0-9a-f` ]+`) \|$", section, re.M)
    return {name: code.replace("`", "").replace(" ", "") for name, code in rows}


def test_the_documents_vector() -> None:
    vec = doc_vector()
    cnonce, snonce = bytes(range(16)), bytes(range(16, 32))
    t = transcript(2, 1, 2, cnonce, snonce)
    c2s, s2c = keys(TOKEN, cnonce, snonce, t)
    ok = msgpack.packb({"t": "ok"})
    ok_body = ok + h(s2c, struct.pack(">Q", 0) + ok)
    assert len(t) == 59
    assert vec == {
        "T": t.hex(),
        "server mac": h(TOKEN, b"rdmasched-server" + t).hex(),
        "client mac": h(TOKEN, b"rdmasched-client" + t).hex(),
        "K_c2s": c2s.hex(),
        "K_s2c": s2c.hex(),
        'frame 4, `{"t":"ok"}`': (struct.pack(">I", len(ok_body)) + ok_body).hex(),
    }
    assert bootstrap.VERSION == 2


def test_independent_client_against_the_listener() -> None:
    with bootstrap.Listener("127.0.0.1", 0, token=TOKEN, node=2, timeout_s=10) as lst:
        out: dict[str, Any] = {}

        def serve() -> None:
            with lst.accept(10) as ch:
                out["desc"] = ch.recv("desc")
                ch.send({"t": "desc", "desc": {"n": 2}})
                out["up"] = ch.recv("up")
                ch.send({"t": "up"})
                out["peer_node"] = ch.peer_node

        th = threading.Thread(target=serve, daemon=True)
        th.start()
        w = Wire(socket.create_connection(("127.0.0.1", lst.port)))
        cnonce = os.urandom(16)
        w.send({"t": "hello", "proto": "rdmasched-bootstrap", "v": 2, "node": 1, "nonce": cnonce})
        ch = w.recv()
        assert ch["t"] == "challenge" and ch["v"] == 2 and ch["node"] == 2
        t = transcript(2, 1, 2, cnonce, ch["nonce"])
        assert hmac.compare_digest(ch["mac"], h(TOKEN, b"rdmasched-server" + t))
        w.send({"t": "auth", "mac": h(TOKEN, b"rdmasched-client" + t)})
        w.tx_key, w.rx_key = keys(TOKEN, cnonce, ch["nonce"], t)
        assert w.recv() == {"t": "ok"}
        w.send({"t": "desc", "desc": {"n": 1}})
        assert w.recv() == {"t": "desc", "desc": {"n": 2}}
        w.send({"t": "up"})
        assert w.recv() == {"t": "up"}
        w.sock.close()
        th.join(10)
        assert out == {"desc": {"t": "desc", "desc": {"n": 1}}, "up": {"t": "up"}, "peer_node": 1}


def independent_server(srv: socket.socket, out: dict[str, Any], token: bytes) -> None:
    conn, _ = srv.accept()
    w = Wire(conn)
    hello = w.recv()
    out["hello"] = {k: v for k, v in hello.items() if k != "nonce"}
    snonce = os.urandom(16)
    t = transcript(2, hello["node"], 2, hello["nonce"], snonce)
    w.send(
        {
            "t": "challenge",
            "v": 2,
            "node": 2,
            "nonce": snonce,
            "mac": h(token, b"rdmasched-server" + t),
        }
    )
    auth = w.recv()
    if not hmac.compare_digest(auth["mac"], h(token, b"rdmasched-client" + t)):
        w.send({"t": "error", "code": "auth", "msg": "wrong token"})
        conn.close()
        return
    c2s, s2c = keys(token, hello["nonce"], snonce, t)
    w.tx_key, w.rx_key = s2c, c2s
    w.send({"t": "ok"})
    out["msg"] = w.recv()
    w.send({"t": "desc", "echo": out["msg"]["x"]})
    conn.close()


def test_dial_against_an_independent_server() -> None:
    out: dict[str, Any] = {}
    with socket.create_server(("127.0.0.1", 0)) as srv:
        th = threading.Thread(target=independent_server, args=(srv, out, TOKEN), daemon=True)
        th.start()
        port = srv.getsockname()[1]
        with bootstrap.dial("127.0.0.1", port, token=TOKEN, node=1) as ch:
            assert ch.peer_node == 2
            ch.send({"t": "desc", "x": [1, b"\x00"]})
            assert ch.recv("desc")["echo"] == [1, b"\x00"]
        th.join(10)
    assert out["hello"] == {"t": "hello", "proto": "rdmasched-bootstrap", "v": 2, "node": 1}
    assert out["msg"] == {"t": "desc", "x": [1, b"\x00"]}


def test_plain_refusal_of_the_clients_proof_is_reported() -> None:
    """Step 4 may be a plain error where "ok" is due: the server refused the client's
    proof. The client reports the server's text."""
    out: dict[str, Any] = {}
    with socket.create_server(("127.0.0.1", 0)) as srv:

        def serve() -> None:
            conn, _ = srv.accept()
            w = Wire(conn)
            hello = w.recv()
            snonce = os.urandom(16)
            t = transcript(2, hello["node"], 2, hello["nonce"], snonce)
            mac = h(TOKEN, b"rdmasched-server" + t)
            w.send({"t": "challenge", "v": 2, "node": 2, "nonce": snonce, "mac": mac})
            out["auth"] = w.recv()
            w.send({"t": "error", "code": "auth", "msg": "wrong token"})
            conn.close()

        th = threading.Thread(target=serve, daemon=True)
        th.start()
        with pytest.raises(BootstrapError, match="refused: wrong token"):
            bootstrap.dial("127.0.0.1", srv.getsockname()[1], token=TOKEN, node=1)
        th.join(10)
    assert out["auth"]["t"] == "auth"
