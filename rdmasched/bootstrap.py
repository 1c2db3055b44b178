"""Bootstrap: two nodes meet over TCP, prove they share a token, and swap lane descriptors.

Transport-neutral: the verbs transport sends its descriptors (GID, QP number, PSN, ring
address and rkey, ...) through a `Channel`; nothing here needs RDMA, so every failure path
is tested on any host over localhost.

Wire (docs/VERBS.md, "Bootstrap protocol"): every message is a frame, a 4-byte big-endian
length then that many bytes of msgpack (a map with a string "t" naming the message), at most
MAX_FRAME bytes. The client dials; the exchange is

    client -> server  {"t": "hello", "proto": "rdmasched-bootstrap", "v": 1, "node": N,
                       "nonce": 16 random bytes}
    server -> client  {"t": "challenge", "v": 1, "node": M, "nonce": 16 random bytes,
                       "mac": HMAC-SHA256(token, "rdmasched-server" ++ cnonce ++ snonce)}
                      or {"t": "error", "code": "version", "v": 1, "msg": ...}
    client -> server  {"t": "auth", "mac": HMAC-SHA256(token, "rdmasched-client" ++ cnonce
                       ++ snonce)}     (only once the server's mac proved it has the token)
    server -> client  {"t": "ok"}  or {"t": "error", "code": "auth", "msg": ...}

after which both sides own an authenticated `Channel` and the transport exchanges its own
messages ("desc", "up", ...). Both MACs are compared with hmac.compare_digest. The token
itself never crosses the wire, and nothing that grants access (an rkey) is sent before both
sides have proved they hold it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import socket
import struct
import time
from typing import Any

import msgpack

from rdmasched.errors import BootstrapError, ConfigError

__all__ = [
    "MAX_FRAME",
    "PROTOCOL",
    "VERSION",
    "Channel",
    "Listener",
    "dial",
    "parse_address",
]

PROTOCOL = "rdmasched-bootstrap"
VERSION = 1
MAX_FRAME = 64 * 1024
NONCE_BYTES = 16
_LEN = struct.Struct(">I")
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 2.0


def _mac(token: bytes, role: bytes, cnonce: bytes, snonce: bytes) -> bytes:
    return hmac.new(token, role + cnonce + snonce, hashlib.sha256).digest()


def _token_bytes(token: str | bytes) -> bytes:
    raw = token.encode() if isinstance(token, str) else bytes(token)
    if len(raw) < 8:
        raise ConfigError(
            "the bootstrap token must be at least 8 bytes (set it in the cluster "
            "config or RDMASCHED_TOKEN)"
        )
    return raw


def parse_address(text: str, default_port: int | None = None) -> tuple[str, int]:
    """'host:port' (or '[v6]:port') -> (host, port); ConfigError if it is not one."""
    host, sep, port = text.rpartition(":")
    if not sep:
        if default_port is None:
            raise ConfigError(f"bootstrap address {text!r} has no port (host:port)")
        host, port = text, str(default_port)
    host = host.strip("[]")
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"bootstrap address {text!r}: port {port!r} is not a number") from None
    if not host or not 0 < p < 65536:
        raise ConfigError(f"bootstrap address {text!r} is not host:port")
    return host, p


class Channel:
    """An authenticated bootstrap connection: send and receive msgpack maps in frames.

    Every receive has a deadline (`timeout_s` from the call), so a silent peer never hangs
    the caller.
    """

    def __init__(self, sock: socket.socket, peer: str, timeout_s: float) -> None:
        self.sock = sock
        self.peer = peer  # "host:port", for messages
        self.peer_node = -1
        self.timeout_s = timeout_s

    # ---- frames ----------------------------------------------------------------------------
    def send(self, msg: dict[str, Any]) -> None:
        body = msgpack.packb(msg, use_bin_type=True)
        if len(body) > MAX_FRAME:
            raise BootstrapError(
                f"bootstrap message {msg.get('t')!r} is {len(body)} bytes, "
                f"over the {MAX_FRAME}-byte frame limit"
            )
        try:
            self.sock.settimeout(self.timeout_s)
            self.sock.sendall(_LEN.pack(len(body)) + body)
        except OSError as exc:
            raise BootstrapError(f"bootstrap peer {self.peer}: send failed: {exc}") from exc

    def _recv_exact(self, n: int, deadline: float, what: str) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BootstrapError(
                    f"bootstrap peer {self.peer} sent no {what} within {self.timeout_s:g} s"
                )
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(n - len(buf))
            except TimeoutError:
                continue
            except OSError as exc:
                raise BootstrapError(f"bootstrap peer {self.peer}: {exc}") from exc
            if not chunk:
                raise BootstrapError(
                    f"bootstrap peer {self.peer} closed the connection (waiting for {what})"
                )
            buf += chunk
        return bytes(buf)

    def recv(self, expect: str | None = None) -> dict[str, Any]:
        """The next message; an {"t": "error"} from the peer becomes BootstrapError, and so
        does a message of another type than `expect`."""
        deadline = time.monotonic() + self.timeout_s
        what = f"{expect!r} message" if expect else "message"
        (n,) = _LEN.unpack(self._recv_exact(4, deadline, what))
        if n > MAX_FRAME:
            raise BootstrapError(
                f"bootstrap peer {self.peer} sent a {n}-byte frame (limit "
                f"{MAX_FRAME}): not an rdmasched bootstrap peer?"
            )
        body = self._recv_exact(n, deadline, what)
        try:
            msg = msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception as exc:
            raise BootstrapError(
                f"bootstrap peer {self.peer} sent a frame that is not "
                f"msgpack ({exc}): not an rdmasched bootstrap peer?"
            ) from None
        if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
            raise BootstrapError(f"bootstrap peer {self.peer} sent a malformed message")
        if msg["t"] == "error":
            raise BootstrapError(
                f"bootstrap peer {self.peer} refused: {msg.get('msg') or msg.get('code')}"
            )
        if expect is not None and msg["t"] != expect:
            raise BootstrapError(
                f"bootstrap peer {self.peer} sent {msg['t']!r} where {expect!r} was due"
            )
        return msg

    def fail(self, code: str, text: str) -> None:
        """Tell the peer why we stop (best effort), then close."""
        with contextlib.suppress(BootstrapError):
            self.send({"t": "error", "code": code, "msg": text})
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the handshake ---------------------------------------------------------------------
    def _client_handshake(self, token: bytes, node: int, version: int) -> None:
        cnonce = os.urandom(NONCE_BYTES)
        self.send({"t": "hello", "proto": PROTOCOL, "v": version, "node": node, "nonce": cnonce})
        msg = self.recv()
        if msg["t"] != "challenge":
            raise BootstrapError(
                f"bootstrap peer {self.peer} sent {msg['t']!r} instead of a "
                "challenge: not an rdmasched bootstrap peer?"
            )
        if msg.get("v") != version:
            raise BootstrapError(
                f"bootstrap peer {self.peer} speaks protocol version "
                f"{msg.get('v')}, this node {version}: run the same rdmasched "
                "version on both nodes"
            )
        snonce, mac = msg.get("nonce"), msg.get("mac")
        if not (
            isinstance(snonce, bytes)
            and len(snonce) == NONCE_BYTES
            and isinstance(mac, bytes)
            and isinstance(msg.get("node"), int)
        ):
            raise BootstrapError(f"bootstrap peer {self.peer} sent a malformed challenge")
        if not hmac.compare_digest(mac, _mac(token, b"rdmasched-server", cnonce, snonce)):
            self.fail("auth", "the server's proof does not match our token")
            raise BootstrapError(
                f"bootstrap peer {self.peer} does not hold our token: wrong "
                "token on one side (the cluster config's token must match)"
            )
        self.send({"t": "auth", "mac": _mac(token, b"rdmasched-client", cnonce, snonce)})
        self.recv("ok")
        self.peer_node = int(msg["node"])

    def _server_handshake(self, token: bytes, node: int, version: int) -> None:
        msg = self.recv()
        if msg["t"] != "hello" or msg.get("proto") != PROTOCOL:
            self.fail("proto", f"expected a {PROTOCOL} hello")
            raise BootstrapError(
                f"bootstrap client {self.peer} is not an rdmasched peer (sent {msg['t']!r})"
            )
        if msg.get("v") != version:
            text = (
                f"protocol version mismatch: client {msg.get('v')}, server {version}; run "
                "the same rdmasched version on both nodes"
            )
            try:
                self.send({"t": "error", "code": "version", "v": version, "msg": text})
            finally:
                self.close()
            raise BootstrapError(f"bootstrap client {self.peer}: {text}")
        cnonce = msg.get("nonce")
        if not (
            isinstance(cnonce, bytes)
            and len(cnonce) == NONCE_BYTES
            and isinstance(msg.get("node"), int)
        ):
            self.fail("proto", "malformed hello")
            raise BootstrapError(f"bootstrap client {self.peer} sent a malformed hello")
        snonce = os.urandom(NONCE_BYTES)
        self.send(
            {
                "t": "challenge",
                "v": version,
                "node": node,
                "nonce": snonce,
                "mac": _mac(token, b"rdmasched-server", cnonce, snonce),
            }
        )
        auth = self.recv("auth")
        mac = auth.get("mac")
        if not isinstance(mac, bytes) or not hmac.compare_digest(
            mac, _mac(token, b"rdmasched-client", cnonce, snonce)
        ):
            self.fail(
                "auth",
                "wrong token: the client's proof does not match the server's "
                "token (the cluster config's token must match)",
            )
            raise BootstrapError(
                f"bootstrap client {self.peer} does not hold our token: wrong token on one side"
            )
        self.send({"t": "ok"})
        self.peer_node = int(msg["node"])


def dial(
    host: str,
    port: int,
    *,
    token: str | bytes,
    node: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    attempts: int = 5,
    retry_delay_s: float = 0.2,
    version: int = VERSION,
) -> Channel:
    """Connect to a bootstrap server and authenticate; an open `Channel`.

    A peer that refuses or does not answer is retried `attempts` times, each connect
    bounded by `connect_timeout_s`; then BootstrapError names the address and the last error.
    """
    key = _token_bytes(token)
    if attempts < 1:
        raise ConfigError("attempts must be >= 1")
    where = f"{host}:{port}"
    last: OSError | None = None
    sock: socket.socket | None = None
    for i in range(attempts):
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout_s)
            break
        except OSError as exc:
            last = exc
            if isinstance(exc, socket.gaierror):
                raise BootstrapError(
                    f"bootstrap peer {where}: cannot resolve {host!r}: {exc}"
                ) from exc
            if i + 1 < attempts:
                time.sleep(retry_delay_s)
    if sock is None:
        reason = (
            "timed out"
            if isinstance(last, TimeoutError)
            else os.strerror(last.errno)
            if last is not None and last.errno
            else str(last)
        )
        raise BootstrapError(
            f"bootstrap peer {where} is unreachable: {reason} ({attempts} attempt(s), "
            f"{connect_timeout_s:g} s each); is its node running and listening there?"
        ) from last
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ch = Channel(sock, where, timeout_s)
    try:
        ch._client_handshake(key, node, version)
    except BaseException:
        ch.close()
        raise
    return ch


class Listener:
    """A bootstrap server socket. `accept()` returns one authenticated `Channel`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | bytes,
        node: int,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        version: int = VERSION,
    ) -> None:
        self._token = _token_bytes(token)
        self.node = node
        self.timeout_s = timeout_s
        self.version = version
        try:
            self.sock = socket.create_server((host, port), reuse_port=False)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise BootstrapError(f"bootstrap address {host}:{port} is in use") from exc
            raise BootstrapError(f"cannot listen on {host}:{port}: {exc}") from exc
        self.host, self.port = self.sock.getsockname()[:2]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def accept(self, timeout_s: float | None = None) -> Channel:
        """Wait up to `timeout_s` (default: the listener's) for a client and authenticate it.
        BootstrapError on timeout or a failed handshake (the client is told why)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        self.sock.settimeout(limit)
        try:
            sock, addr = self.sock.accept()
        except TimeoutError:
            raise BootstrapError(
                f"no bootstrap client connected to {self.address} within {limit:g} s"
            ) from None
        except OSError as exc:
            raise BootstrapError(f"bootstrap listener {self.address}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ch = Channel(sock, f"{addr[0]}:{addr[1]}", self.timeout_s)
        try:
            ch._server_handshake(self._token, self.node, self.version)
        except BaseException:
            ch.close()
            raise
        return ch

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
