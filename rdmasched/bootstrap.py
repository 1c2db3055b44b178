"""Bootstrap: two nodes meet over TCP, prove they share a token, and swap lane descriptors.

Transport-neutral: the verbs transport sends its descriptors (GID, QP number, PSN, ring
address and rkey, ...) through a `Channel`; nothing here needs RDMA, so every failure path
is tested on any host over localhost.

Wire, version 2 (docs/VERBS.md, "Bootstrap protocol", is the contract): every message is a
frame, a 4-byte big-endian length then that many bytes, at most MAX_FRAME. The client dials;
with T = b"rdmasched-bootstrap" ++ u32(v) ++ u16(client node) ++ u16(server node) ++ cnonce
++ snonce (big-endian) the exchange is

    client -> server  {"t": "hello", "proto": "rdmasched-bootstrap", "v": 2, "node": C,
                       "nonce": 16 random bytes}
    server -> client  {"t": "challenge", "v": 2, "node": S, "nonce": 16 random bytes,
                       "mac": HMAC-SHA256(token, "rdmasched-server" ++ T)}
                      or {"t": "error", "code": "version" | "busy" | ..., "msg": ...}
    client -> server  {"t": "auth", "mac": HMAC-SHA256(token, "rdmasched-client" ++ T)}
                      (only once the server's mac proved it has the token)
    server -> client  {"t": "ok"} (sealed)  or {"t": "error", "code": "auth", "msg": ...}

Those four are plain msgpack maps (the proofs cover what matters in them: T). Every later
frame, "ok" included, is sealed: msgpack body ++ HMAC-SHA256(key, u64(seq) ++ body), with
one key per direction derived by HKDF-SHA256 from the token, both nonces and T, and `seq`
counting that direction's sealed frames from 0. A frame altered, replayed, reordered or
dropped by anything in the path fails its MAC. The token itself never crosses the wire, and
nothing that grants access (an rkey) is sent before both sides have proved they hold it.

The listener accepts concurrently: each unauthenticated connection gets its own thread and
one overall deadline; at most `max_pending` are open at once, a quarter of them from one
address (a newcomer evicts the stalest one if it has stalled STALL_S, or is refused with
"busy" at once). A failed handshake is
logged and counted (`Listener.stats()`), never an error of `accept()`.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import hmac
import logging
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from rdmasched.errors import BootstrapError, ConfigError

__all__ = [
    "MAX_FRAME",
    "PROTOCOL",
    "VERSION",
    "Channel",
    "Listener",
    "ListenerStats",
    "dial",
    "parse_address",
]

PROTOCOL = "rdmasched-bootstrap"
VERSION = 2
MAX_FRAME = 64 * 1024
NONCE_BYTES = 16
MAC_BYTES = 32
_LEN = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
_IDS = struct.Struct(">IHH")
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 2.0
DEFAULT_MAX_PENDING = 64
# A pending (unauthenticated) connection that completed no frame for this long may be closed
# to make room for a newcomer once `max_pending` are open. A real peer sends each of its two
# handshake frames as soon as it can, so it is never that stalled.
STALL_S = 1.0
_LOG_EVERY_S = 1.0

_log = logging.getLogger("rdmasched.bootstrap")


# ---- the handshake's cryptography (docs/VERBS.md, "Keys and MACs") ----------------------------
def _transcript(version: int, cnode: int, snode: int, cnonce: bytes, snonce: bytes) -> bytes:
    return PROTOCOL.encode() + _IDS.pack(version, cnode, snode) + cnonce + snonce


def _proof(token: bytes, role: bytes, transcript: bytes) -> bytes:
    return hmac.new(token, role + transcript, hashlib.sha256).digest()


def _session_keys(
    token: bytes, cnonce: bytes, snonce: bytes, transcript: bytes
) -> tuple[bytes, bytes]:
    """(client->server key, server->client key): HKDF-SHA256 (RFC 5869), salt the two
    nonces, input the token, info a direction label then the transcript, 32 bytes each."""
    prk = hmac.new(cnonce + snonce, token, hashlib.sha256).digest()

    def expand(label: bytes) -> bytes:
        return hmac.new(prk, label + transcript + b"\x01", hashlib.sha256).digest()

    return expand(b"rdmasched c2s"), expand(b"rdmasched s2c")


def _seal_mac(key: bytes, seq: int, body: bytes) -> bytes:
    return hmac.new(key, _SEQ.pack(seq) + body, hashlib.sha256).digest()


def _token_bytes(token: str | bytes) -> bytes:
    raw = token.encode() if isinstance(token, str) else bytes(token)
    if len(raw) < 8:
        raise ConfigError(
            "the bootstrap token must be at least 8 bytes (set it in the cluster "
            "config or RDMASCHED_TOKEN)"
        )
    return raw


def _show(v: object, limit: int = 80) -> str:
    """A value the peer chose, for a message or the log: printable, one line, bounded."""
    text = v if isinstance(v, str) else repr(v)
    text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_node(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 0xFFFF


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


class _Retry(BootstrapError):
    """The server turned the handshake away (busy): dial again."""


class _Closed(BootstrapError):
    """The peer closed or reset the connection."""


class Channel:
    """A bootstrap connection: send and receive msgpack maps in frames.

    After the handshake every frame is sealed with this direction's key and sequence number
    (see the module docstring). Every receive has a deadline (`timeout_s` from the call, and
    never past `deadline` if one is set), so a silent peer never hangs the caller.
    """

    def __init__(self, sock: socket.socket, peer: str, timeout_s: float) -> None:
        self.sock = sock
        self.peer = peer  # "host:port", for messages
        self.peer_node = -1
        self.timeout_s = timeout_s
        self.deadline: float | None = None  # monotonic; bounds the whole handshake (server)
        self.deadline_s = timeout_s  # what `deadline` allowed, for messages
        self.host = peer.rpartition(":")[0]  # the peer's address, for per-host limits
        self.last_progress = time.monotonic()  # when the last whole frame arrived
        self._tx_key: bytes | None = None
        self._rx_key: bytes | None = None
        self._tx_seq = 0
        self._rx_seq = 0
        self._broken = ""  # set when a sealed frame failed: nothing more is trusted

    @property
    def sealed(self) -> bool:
        """True once the handshake derived the keys: every frame now carries a MAC."""
        return self._rx_key is not None

    # ---- frames ----------------------------------------------------------------------------
    def send(self, msg: dict[str, Any]) -> None:
        body = msgpack.packb(msg, use_bin_type=True)
        if self._tx_key is not None:
            body += _seal_mac(self._tx_key, self._tx_seq, body)
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
        if self._tx_key is not None:
            self._tx_seq += 1

    def _recv_exact(self, n: int, deadline: float, limit_s: float, what: str) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BootstrapError(
                    f"bootstrap peer {self.peer} sent no {what} within {limit_s:g} s"
                )
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(n - len(buf))
            except TimeoutError:
                continue
            except ConnectionResetError as exc:
                raise _Closed(f"bootstrap peer {self.peer} reset the connection") from exc
            except OSError as exc:
                raise BootstrapError(f"bootstrap peer {self.peer}: {exc}") from exc
            if not chunk:
                raise _Closed(
                    f"bootstrap peer {self.peer} closed the connection (waiting for {what})"
                )
            buf += chunk
        return bytes(buf)

    def _decode(self, body: bytes) -> dict[str, Any]:
        try:
            msg = msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception as exc:
            raise BootstrapError(
                f"bootstrap peer {self.peer} sent a frame that is not "
                f"msgpack ({_show(str(exc))}): not an rdmasched bootstrap peer?"
            ) from None
        if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
            raise BootstrapError(
                f"bootstrap peer {self.peer} sent a malformed message: not an rdmasched "
                "bootstrap peer?"
            )
        return msg

    def _unseal(self, body: bytes) -> dict[str, Any]:
        assert self._rx_key is not None
        data, tag = body[:-MAC_BYTES], body[-MAC_BYTES:]
        if len(body) < MAC_BYTES or not hmac.compare_digest(
            tag, _seal_mac(self._rx_key, self._rx_seq, data)
        ):
            if self._rx_seq == 0:
                # The peer may have refused our proof before it derived the keys: its error
                # is plain. Shown as the peer's word; it is an error either way.
                plain: dict[str, Any] = {}
                with contextlib.suppress(BootstrapError):
                    plain = self._decode(body)
                if plain.get("t") == "error":
                    raise BootstrapError(
                        f"bootstrap peer {self.peer} refused: "
                        f"{_show(plain.get('msg') or plain.get('code'), 300)} "
                        "(unauthenticated reply)"
                    )
            text = (
                "fails its MAC: altered, replayed, reordered or dropped in transit (a "
                "relay in the path?); the connection is not trusted"
            )
            with contextlib.suppress(BootstrapError):  # sealed, so the peer can trust it
                self.send(
                    {
                        "t": "error",
                        "code": "mac",
                        "msg": f"your sealed message {self._rx_seq} {text}",
                    }
                )
            self._broken = f"sealed message {self._rx_seq} from bootstrap peer {self.peer} {text}"
            raise BootstrapError(self._broken)
        self._rx_seq += 1
        return self._decode(data)

    def recv(self, expect: str | None = None) -> dict[str, Any]:
        """The next message; an {"t": "error"} from the peer becomes BootstrapError, and so
        does a message of another type than `expect`, or a sealed frame whose MAC fails."""
        if self._broken:
            raise BootstrapError(self._broken)
        limit = self.timeout_s
        deadline = time.monotonic() + limit
        if self.deadline is not None and self.deadline < deadline:
            deadline, limit = self.deadline, self.deadline_s
        what = f"{expect!r} message" if expect else "message"
        (n,) = _LEN.unpack(self._recv_exact(4, deadline, limit, what))
        if n > MAX_FRAME:
            raise BootstrapError(
                f"bootstrap peer {self.peer} sent a {n}-byte frame (limit "
                f"{MAX_FRAME}): not an rdmasched bootstrap peer?"
            )
        body = self._recv_exact(n, deadline, limit, what)
        self.last_progress = time.monotonic()
        msg = self._unseal(body) if self._rx_key is not None else self._decode(body)
        if msg["t"] == "error":
            code = msg.get("code")
            text = f"bootstrap peer {self.peer} refused: {_show(msg.get('msg') or code, 300)}"
            if code == "busy" and not self.sealed:
                raise _Retry(text)
            raise BootstrapError(text)
        if expect is not None and msg["t"] != expect:
            raise BootstrapError(
                f"bootstrap peer {self.peer} sent {_show(msg['t'])!r} where {expect!r} was due"
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

    def _abort(self) -> None:
        """Wake a thread blocked on this socket (it sees the connection closed)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

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
                f"bootstrap peer {self.peer} sent {_show(msg['t'])!r} instead of a "
                "challenge: not an rdmasched bootstrap peer?"
            )
        if msg.get("v") != version:
            raise BootstrapError(
                f"bootstrap peer {self.peer} speaks protocol version "
                f"{_show(msg.get('v'))}, this node {version}: run the same rdmasched "
                "version on both nodes"
            )
        snonce, mac, snode = msg.get("nonce"), msg.get("mac"), msg.get("node")
        if not (
            isinstance(snonce, bytes)
            and len(snonce) == NONCE_BYTES
            and isinstance(mac, bytes)
            and _is_node(snode)
        ):
            raise BootstrapError(f"bootstrap peer {self.peer} sent a malformed challenge")
        assert isinstance(snode, int)
        transcript = _transcript(version, node, snode, cnonce, snonce)
        if not hmac.compare_digest(mac, _proof(token, b"rdmasched-server", transcript)):
            self.fail("auth", "the server's proof does not match our token and handshake")
            raise BootstrapError(
                f"bootstrap peer {self.peer} does not hold our token, or the handshake was "
                "altered in transit: wrong token on one side (the cluster config's token "
                "must match) or a relay in the path"
            )
        self.send({"t": "auth", "mac": _proof(token, b"rdmasched-client", transcript)})
        self._tx_key, self._rx_key = _session_keys(token, cnonce, snonce, transcript)
        self.recv("ok")
        self.peer_node = snode

    def _server_handshake(self, token: bytes, node: int, version: int) -> None:
        msg = self.recv()
        if msg["t"] != "hello" or msg.get("proto") != PROTOCOL:
            self.fail("proto", f"expected a {PROTOCOL} hello")
            raise BootstrapError(
                f"bootstrap client {self.peer} is not an rdmasched peer (sent {_show(msg['t'])!r})"
            )
        if msg.get("v") != version:
            text = (
                f"protocol version mismatch: client {_show(msg.get('v'))}, server {version}; run "
                "the same rdmasched version on both nodes"
            )
            try:
                self.send({"t": "error", "code": "version", "v": version, "msg": text})
            finally:
                self.close()
            raise BootstrapError(f"bootstrap client {self.peer}: {text}")
        cnonce, cnode = msg.get("nonce"), msg.get("node")
        if not (isinstance(cnonce, bytes) and len(cnonce) == NONCE_BYTES and _is_node(cnode)):
            self.fail("proto", "malformed hello")
            raise BootstrapError(f"bootstrap client {self.peer} sent a malformed hello")
        assert isinstance(cnode, int)
        snonce = os.urandom(NONCE_BYTES)
        transcript = _transcript(version, cnode, node, cnonce, snonce)
        self.send(
            {
                "t": "challenge",
                "v": version,
                "node": node,
                "nonce": snonce,
                "mac": _proof(token, b"rdmasched-server", transcript),
            }
        )
        auth = self.recv("auth")
        mac = auth.get("mac")
        if not isinstance(mac, bytes) or not hmac.compare_digest(
            mac, _proof(token, b"rdmasched-client", transcript)
        ):
            self.fail(
                "auth",
                "wrong token: the client's proof does not match the server's "
                "token (the cluster config's token must match)",
            )
            raise BootstrapError(
                f"bootstrap client {self.peer} does not hold our token, or the handshake was "
                "altered in transit: wrong token on one side"
            )
        c2s, s2c = _session_keys(token, cnonce, snonce, transcript)
        self._tx_key, self._rx_key = s2c, c2s
        self.send({"t": "ok"})
        self.peer_node = cnode


def _connect(
    host: str, port: int, attempts: int, connect_timeout_s: float, retry_delay_s: float
) -> socket.socket:
    where = f"{host}:{port}"
    last: OSError | None = None
    for i in range(attempts):
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as exc:
            last = exc
            if isinstance(exc, socket.gaierror):
                raise BootstrapError(
                    f"bootstrap peer {where}: cannot resolve {host!r}: {exc}"
                ) from exc
            if i + 1 < attempts:
                time.sleep(retry_delay_s)
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
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
    A server that turns the handshake away (busy with other connections) or closes it
    without a word is dialled again every `retry_delay_s` for up to `timeout_s`.
    """
    key = _token_bytes(token)
    if attempts < 1:
        raise ConfigError("attempts must be >= 1")
    if not _is_node(node):
        raise ConfigError(f"node id must be 0..65535, not {node!r}")
    where = f"{host}:{port}"
    give_up = time.monotonic() + timeout_s
    while True:
        sock = _connect(host, port, attempts, connect_timeout_s, retry_delay_s)
        ch = Channel(sock, where, timeout_s)
        try:
            ch._client_handshake(key, node, version)
            return ch
        except (_Retry, _Closed) as exc:
            # Turned away ("busy"), or closed without a word: a listener at its bound of
            # unauthenticated connections may close a stalled one. A refusal says why.
            ch.close()
            if time.monotonic() + retry_delay_s >= give_up:
                raise BootstrapError(
                    f"bootstrap peer {where} kept turning the connection away for "
                    f"{timeout_s:g} s ({exc}): too many other connections to it?"
                ) from None
            time.sleep(retry_delay_s)
        except BaseException:
            ch.close()
            raise


@dataclass(frozen=True)
class ListenerStats:
    """What a `Listener` did with the connections it was offered. Every connection is
    counted once: connections == authenticated + failed + refused + evicted + pending."""

    connections: int  # TCP connections accepted
    authenticated: int  # handshakes that succeeded (channels for accept())
    failed: int  # handshakes that failed: not a peer, malformed, wrong token, version, deadline
    refused: int  # closed at once ("busy"): the bound (or the host's share of it) was full
    evicted: int  # closed for a newcomer while at the bound, after stalling STALL_S
    pending: int  # handshakes under way now
    last_failure: str  # why the last handshake failed ("" if none did)


class Listener:
    """A bootstrap server socket. `accept()` returns one authenticated `Channel`.

    Connections are accepted and authenticated on background threads from the start, one
    thread per connection, each handshake bounded by `handshake_timeout_s` (default
    `timeout_s`) as a whole; at most `max_pending` handshakes run at once, at most
    `max_pending_per_host` (default a quarter) from one address. A connection that
    fails (garbage, wrong token, another version, too slow) is logged, counted in `stats()`
    and closed: it never makes `accept()` fail, nor delays another client.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | bytes,
        node: int,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        version: int = VERSION,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_per_host: int | None = None,
        handshake_timeout_s: float | None = None,
    ) -> None:
        self._token = _token_bytes(token)
        if not _is_node(node):
            raise ConfigError(f"node id must be 0..65535, not {node!r}")
        if max_pending < 1:
            raise ConfigError(f"max_pending must be >= 1, not {max_pending}")
        self.node = node
        self.timeout_s = timeout_s
        self.handshake_timeout_s = timeout_s if handshake_timeout_s is None else handshake_timeout_s
        if not self.handshake_timeout_s > 0:
            raise ConfigError(f"handshake_timeout_s must be > 0, not {self.handshake_timeout_s}")
        self.version = version
        self.max_pending = max_pending
        self.max_pending_per_host = (
            max(1, max_pending // 4) if max_pending_per_host is None else max_pending_per_host
        )
        if not 1 <= self.max_pending_per_host <= max_pending:
            raise ConfigError(
                f"max_pending_per_host must be 1..max_pending ({max_pending}), "
                f"not {self.max_pending_per_host}"
            )
        try:
            self.sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise BootstrapError(f"bootstrap address {host}:{port} is in use") from exc
            raise BootstrapError(f"cannot listen on {host}:{port}: {exc}") from exc
        self.host, self.port = self.sock.getsockname()[:2]
        self.sock.setblocking(False)
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue: collections.deque[Channel] = collections.deque()
        self._pending: dict[Channel, threading.Thread] = {}
        self._closed = False
        self._n = {"connections": 0, "authenticated": 0, "failed": 0, "refused": 0, "evicted": 0}
        self._last_failure = ""
        self._last_log = 0.0
        self._unlogged = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"rdmasched-bootstrap-{self.port}", daemon=True
        )
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stats(self) -> ListenerStats:
        with self._lock:
            return ListenerStats(
                pending=len(self._pending), last_failure=self._last_failure, **self._n
            )

    def accept(self, timeout_s: float | None = None) -> Channel:
        """Wait up to `timeout_s` (default: the listener's) for an authenticated client.
        BootstrapError on timeout (naming the failed handshakes, if any) or once closed."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        with self._ready:
            while not self._queue:
                if self._closed:
                    raise BootstrapError(f"bootstrap listener {self.address} is closed")
                left = deadline - time.monotonic()
                if left <= 0:
                    failed = self._n["failed"]
                    note = (
                        f" ({failed} failed handshake(s) so far, the last: {self._last_failure})"
                        if failed
                        else ""
                    )
                    raise BootstrapError(
                        f"no bootstrap client connected to {self.address} within {limit:g} s" + note
                    )
                self._ready.wait(left)
            return self._queue.popleft()

    # ---- the background side ---------------------------------------------------------------
    def _accept_loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._closed:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    self._accept_ready()
        except Exception:  # never expected; the listener must say so, not die silently
            _log.exception("bootstrap listener %s: the accept loop failed", self.address)
            with self._ready:
                self._last_failure = "the accept loop failed (see the log)"
                self._closed = True
                self._ready.notify_all()
        finally:
            sel.close()

    def _accept_ready(self) -> None:
        while not self._closed:
            try:
                sock, addr = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: out of resources for now
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                self._note(f"accept failed: {exc}", count=None)
                time.sleep(0.1)
                return
            self._admit(sock, str(addr[0]), f"{addr[0]}:{addr[1]}")

    def _admit(self, sock: socket.socket, host: str, peer: str) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ch = Channel(sock, peer, self.timeout_s)
        ch.host = host
        ch.deadline = time.monotonic() + self.handshake_timeout_s
        ch.deadline_s = self.handshake_timeout_s
        t = threading.Thread(
            target=self._handshake, args=(ch,), name="rdmasched-bootstrap-hs", daemon=True
        )
        victim: Channel | None = None
        admitted = True
        with self._lock:
            self._n["connections"] += 1
            # One host gets at most its share of the bound, so a flood from one address
            # cannot lock the others out; past either limit, the newcomer may replace the
            # stalest connection of the same pool, or is refused.
            pool = [c for c in self._pending if c.host == host]
            full = len(pool) >= self.max_pending_per_host
            if not full and len(self._pending) >= self.max_pending:
                pool, full = list(self._pending), True
            if full:
                stalest = min(pool, key=lambda c: c.last_progress)
                if time.monotonic() - stalest.last_progress >= STALL_S:
                    victim = stalest
                    del self._pending[victim]
                    self._n["evicted"] += 1
                else:
                    self._n["refused"] += 1
                    admitted = False
            if admitted:
                self._pending[ch] = t
        if victim is not None:
            victim._abort()
            self._note(
                f"unauthenticated connections at the bound ({self.max_pending}, "
                f"{self.max_pending_per_host} per host): closed the stalest, "
                f"{victim.peer}, for {peer}",
                count=None,
            )
        if not admitted:
            self._refuse(sock, peer)
            return
        try:
            t.start()
        except RuntimeError as exc:  # no more threads: as good as over the bound
            with self._lock:
                self._pending.pop(ch, None)
                self._n["refused"] += 1
            self._refuse(sock, peer)
            self._note(f"cannot start a handshake thread: {exc}", count=None)

    def _refuse(self, sock: socket.socket, peer: str) -> None:
        body = msgpack.packb(
            {
                "t": "error",
                "code": "busy",
                "msg": (
                    f"unauthenticated connections at the bound ({self.max_pending}, "
                    f"{self.max_pending_per_host} per host); try again"
                ),
            },
            use_bin_type=True,
        )
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(_LEN.pack(len(body)) + body)
        with contextlib.suppress(OSError):
            sock.close()
        self._note(
            f"unauthenticated connections at the bound ({self.max_pending}, "
            f"{self.max_pending_per_host} per host): refused {peer}",
            count=None,
        )

    def _handshake(self, ch: Channel) -> None:
        try:
            ch._server_handshake(self._token, self.node, self.version)
        except Exception as exc:
            ch.close()
            with self._lock:
                mine = self._pending.pop(ch, None) is not None
            if mine:  # not evicted, not closed under it
                if not isinstance(exc, BootstrapError):
                    _log.error("bootstrap handshake with %s", ch.peer, exc_info=exc)
                self._note(str(exc), count="failed")
            return
        ch.deadline = None
        with self._ready:
            if self._pending.pop(ch, None) is None or self._closed:
                ch.close()
                return
            self._n["authenticated"] += 1
            self._queue.append(ch)
            self._ready.notify()

    def _note(self, text: str, count: str | None) -> None:
        """Count a failure and log it, at most one warning per second (an attacker must not
        flood the log)."""
        text = _show(text, 500)
        now = time.monotonic()
        with self._lock:
            if count is not None:
                self._n[count] += 1
                self._last_failure = text
            loud = now - self._last_log >= _LOG_EVERY_S
            if loud:
                self._last_log = now
                skipped, self._unlogged = self._unlogged, 0
            else:
                self._unlogged += 1
            n = dict(self._n)
        if loud:
            more = f"; {skipped} similar not logged" if skipped else ""
            _log.warning(
                "bootstrap listener %s: handshake failed or refused: %s (so far: %d failed, "
                "%d refused, %d evicted%s)",
                self.address,
                text,
                n["failed"],
                n["refused"],
                n["evicted"],
                more,
            )
        else:
            _log.debug("bootstrap listener %s: %s", self.address, text)

    def close(self) -> None:
        """Stop accepting; close every pending handshake and every channel not yet taken
        by accept(). Safe to call twice."""
        with self._ready:
            if self._closed and not self._acceptor.is_alive() and self.sock.fileno() < 0:
                return
            self._closed = True
            pending = list(self._pending.items())
            self._pending.clear()
            queued = list(self._queue)
            self._queue.clear()
            self._ready.notify_all()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._acceptor is not threading.current_thread():
            self._acceptor.join(5)
        for ch, _ in pending:
            ch._abort()
        for ch, t in pending:
            t.join(1)
            ch.close()
        for ch in queued:
            ch.close()
        for s in (self.sock, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
