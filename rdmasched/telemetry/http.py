"""The small HTTP server of rdmasched's read-only endpoints: the live mirror
(rdmasched.views.mirror) and a node's metrics and events (rdmasched.telemetry.metrics).

Both serve other local users and, through a browser, web pages; so every rule here holds
for both (docs/TELEMETRY.md, "Serving"):

* at most ``max_connections`` connections are served at once (a thread each); one more is
  answered 503 and closed at once, so idle clients cannot pile up threads or descriptors;
* a connection that sends nothing for ``idle_s`` seconds is closed;
* when the process is out of file descriptors the accept loop waits instead of spinning;
* a client that goes away mid-request is not an error: nothing is printed; any other
  failure of a request is one log line, never a traceback;
* bound to a loopback address, a request whose Host header names another host is refused
  (403): a web page that rebinds its own name to 127.0.0.1 (DNS rebinding) cannot read the
  cluster's state;
* given a bearer token (``token``, read from a file with ``read_token``), every request but
  those for ``open_paths`` (a daemon's probes) must carry ``Authorization: Bearer <token>``,
  compared in constant time, or is answered 401;
* bound to any address that is not loopback with no token it says so, once, in one warning
  line naming what must protect it (what the deployment puts around it, or the token).
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import logging
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from rdmasched.errors import ConfigError
from rdmasched.files import FileRefused, read_bytes
from rdmasched.limits import HTTP_TOKEN_BYTES_MAX, HTTP_TOKEN_BYTES_MIN

__all__ = ["IDLE_S", "MAX_CONNECTIONS", "Handler", "Server", "read_token"]

_log = logging.getLogger("rdmasched.http")

#: connections served at once (each a thread); a scrape or a page's poll takes one briefly
MAX_CONNECTIONS = 32
#: seconds a connection may stay silent (before a request, or inside one) before it is closed
IDLE_S = 10.0
#: how long the accept loop waits when the process is out of file descriptors
_EMFILE_PAUSE_S = 0.1
_ALL = ("", "0.0.0.0", "::")
_GONE = (ConnectionError, TimeoutError, socket.timeout)


def read_token(path: str) -> bytes:
    """The bearer token in the file at ``path`` (surrounding whitespace dropped): one bounded
    read of a regular file (rdmasched/files.py); ConfigError, naming the file, for a file that
    is missing, unreadable, not a regular file, too long, or whose token is shorter than
    HTTP_TOKEN_BYTES_MIN or not printable ASCII without spaces (it travels in a header)."""
    what = f"token file {path}"
    try:
        raw = read_bytes(path, HTTP_TOKEN_BYTES_MAX)
    except FileNotFoundError:
        raise ConfigError(f"{what} does not exist") from None
    except FileRefused as exc:
        raise ConfigError(f"token file {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{what}: {exc.strerror or exc}") from None
    token = raw.strip()
    if not all(0x21 <= b <= 0x7E for b in token):
        raise ConfigError(f"{what}: the token must be printable ASCII without spaces")
    if len(token) < HTTP_TOKEN_BYTES_MIN:
        raise ConfigError(
            f"{what}: the token must be at least {HTTP_TOKEN_BYTES_MIN} characters, not "
            f"{len(token)} (e.g. `openssl rand -hex 32 > {path}`)"
        )
    return token


def is_loopback(addr: str) -> bool:
    """``addr`` (a bind address) is this host only: localhost, 127.0.0.0/8, ::1."""
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def host_is_local(host: str) -> bool:
    """A Host header's value names this host by a loopback name (any port)."""
    h = host.strip().lower()
    if h.startswith("["):  # [::1]:port
        name = h[1 : h.find("]")] if "]" in h else h
    else:
        name = h.rsplit(":", 1)[0] if h.count(":") == 1 else h
    return name == "localhost" or is_loopback(name)


class Handler(BaseHTTPRequestHandler):
    """The base of the servers' request handlers: quiet, with an idle timeout and the Host
    check; subclasses write ``do_GET``."""

    server: Server
    protocol_version = "HTTP/1.0"  # one request per connection: none stays open idle

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle_s)

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        server = self.server
        host = self.headers.get("Host")
        if server.loopback and host is not None and not host_is_local(host):
            self.send_error(403, "this server answers requests for localhost only")
            return False
        if server.token is not None and urlsplit(self.path).path not in server.open_paths:
            got = self.headers.get("Authorization", "").encode("latin-1", "replace")
            scheme, _, credentials = got.strip().partition(b" ")
            # the scheme's name is case-insensitive (RFC 9110 11.1), the token is not
            if not (
                hmac.compare_digest(credentials.strip(), server.token)
                and scheme.lower() == b"bearer"
            ):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Bearer realm="rdmasched"')
                body = b"401 Unauthorized: send Authorization: Bearer <token>\n"
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return False
        return True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no line per request on stderr


class Server(ThreadingHTTPServer):
    """A ThreadingHTTPServer bounded as the module says, serving in its own thread;
    ``what`` names it in errors and logs ("mirror", "metrics"). With ``token`` every path
    but ``open_paths`` needs it; ``token_option`` is how its user gives one (named in the
    warning of a server that is not loopback and has none)."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64

    def __init__(
        self,
        addr: str,
        port: int,
        handler: type[Handler],
        what: str,
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_s: float = IDLE_S,
        token: bytes | None = None,
        open_paths: frozenset[str] = frozenset(),
        token_option: str | None = None,
    ) -> None:
        self.what = what
        self.token = token
        self.open_paths = open_paths
        self.max_connections = max_connections
        self.idle_s = idle_s
        self.loopback = is_loopback(addr)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._out_of_fds = False
        try:
            super().__init__((addr, port), handler)
        except OSError as exc:
            raise ConfigError(f"{what} port {port} on {addr}: {exc.strerror}") from None
        except OverflowError:
            raise ConfigError(f"{what} port {port} is not a port (0..65535)") from None
        self.port: int = self.server_address[1]
        if not self.loopback and token is None:
            where = "every interface" if addr in _ALL else addr
            way = f"or by {token_option}" if token_option else "or bind a loopback address"
            _log.warning(
                "rdmasched %s: listening on %s, port %d, unauthenticated: anyone who can reach "
                "it can read what it serves; it must be protected by what the deployment puts "
                "around it (a Kubernetes NetworkPolicy, a host firewall) %s",
                what,
                where,
                self.port,
                way,
            )
        elif not self.loopback:
            _log.info(
                "rdmasched %s: listening on %s, port %d; every path but %s needs the bearer token",
                what,
                "every interface" if addr in _ALL else addr,
                self.port,
                ", ".join(sorted(open_paths)) or "none",
            )
        self._thread = threading.Thread(
            target=self.serve_forever, name=f"rdmasched-{what}-http", daemon=True
        )
        self._thread.start()

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            got = super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                if not self._out_of_fds:
                    _log.warning("rdmasched %s: out of file descriptors: waiting", self.what)
                    self._out_of_fds = True
                time.sleep(_EMFILE_PAUSE_S)  # the connection waits in the backlog
            raise
        self._out_of_fds = False
        return got

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(0)
                request.send(
                    b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n"
                    b"Connection: close\r\n\r\n"
                )
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, _GONE):
            return  # the client went away: not this server's error
        _log.warning(
            "rdmasched %s: a request from %s failed: %s: %s",
            self.what,
            client_address[0] if client_address else "?",
            type(exc).__name__,
            exc,
        )

    def close(self) -> None:
        """Stop serving and close the socket (the connections in flight end on their own)."""
        self.shutdown()
        self.server_close()
        self._thread.join(5)
