"""The mirror's and a node's metrics HTTP servers against other local users and web pages
(issue 20 item 13): idle connections are bounded in number and time, an aborted client is
one log line at most (no traceback), a Host header that is not this host's is refused on a
loopback bind (DNS rebinding), and listening on every interface is said. Threads only."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rdmasched.telemetry import metrics
from rdmasched.views import mirror
from tests.waiting import wait_for

HEAD = {"rdmasched_trace": 1, "node": 0, "clock": "sim", "source": "sim", "slots": 1}
EVENT = {"t_ns": 5, "decision": "start", "task_id": 7, "reason": "free slot", "beaten": []}


class FakeNode:
    id = 0
    loop = None  # not running: the probes answer 503
    error = None


def _mirror(tmp_path: Any, addr: str = "127.0.0.1") -> Any:
    (tmp_path / "rdmasched-node0.jsonl").write_text(json.dumps(HEAD) + "\n" + json.dumps(EVENT))
    return mirror.MirrorServer(mirror.TraceSource([str(tmp_path)]), 0, addr)


@pytest.fixture(params=["mirror", "metrics"])
def server(request: Any, tmp_path: Any) -> Iterator[tuple[Any, str]]:
    if request.param == "mirror":
        srv = _mirror(tmp_path)
        path = "/state"
    else:
        srv = metrics.MetricsServer(FakeNode(), 0)  # type: ignore[arg-type]
        path = "/nowhere"  # a 404 from the handler: the fake node answers nothing else
    try:
        yield srv, path
    finally:
        srv.close()


def get(port: int, path: str, host: str | None = None) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.putrequest("GET", path, skip_host=host is not None)
        if host is not None:
            c.putheader("Host", host)
        c.endheaders()
        return c.getresponse().status
    finally:
        c.close()


def test_idle_connections_are_bounded_in_number_and_time(server: tuple[Any, str]) -> None:
    srv, path = server
    port = srv.port
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= srv.httpd.max_connections + 2
        assert get(port, path) in (200, 404, 503)  # answered at once, not after the idle ones
    finally:
        for s in idle:
            s.close()
    wait_for(lambda: threading.active_count() - before <= 2, "the idle connections' threads end")
    assert get(port, path) in (200, 404)


def test_an_idle_connection_is_closed_after_the_idle_time(server: tuple[Any, str]) -> None:
    srv, _ = server
    assert srv.httpd.idle_s <= 30
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.settimeout(srv.httpd.idle_s + 30)
    try:
        assert s.recv(1) == b""  # the server hung up on a client that said nothing
    finally:
        s.close()


def test_aborted_clients_print_no_traceback(
    server: tuple[Any, str], capfd: pytest.CaptureFixture[str]
) -> None:
    srv, path = server
    for _ in range(100):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())  # never finished
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # a reset
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # gone before the answer
    assert get(srv.port, path) in (200, 404)
    time.sleep(0.5)
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.count("\n") <= 1, err


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8765", "10.0.0.1", "127.0.0.1.evil.example"]
)
def test_a_foreign_host_header_is_refused_on_a_loopback_bind(
    server: tuple[Any, str], host: str
) -> None:
    srv, path = server
    assert get(srv.port, path, host) == 403


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}"]
)
def test_this_hosts_names_are_served(server: tuple[Any, str], host: str) -> None:
    srv, path = server
    assert get(srv.port, path, host.format(port=srv.port)) in (200, 404)


def test_listening_on_every_interface_is_said(tmp_path: Any, caplog: Any) -> None:
    with caplog.at_level(logging.WARNING):
        srv = _mirror(tmp_path, addr="")
    try:
        assert any("every interface" in r.getMessage() for r in caplog.records), caplog.text
        assert get(srv.port, "/state", "some.host.name") == 200  # no Host check off loopback
    finally:
        srv.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        m = metrics.MetricsServer(FakeNode(), 0, "0.0.0.0")  # type: ignore[arg-type]
    m.close()
    assert any("every interface" in r.getMessage() for r in caplog.records), caplog.text


SERVE_WITH_FEW_FDS = """
import resource, sys, time
from rdmasched.telemetry import metrics
class N:
    id = 0
resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))
m = metrics.MetricsServer(N(), 0)
print(m.port, flush=True)
sys.stdin.readline()
"""


def test_out_of_file_descriptors_the_server_waits_instead_of_spinning() -> None:
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.Popen(
        [sys.executable, "-c", SERVE_WITH_FEW_FDS],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=root, env=os.environ | {"PYTHONPATH": root},
    )  # fmt: skip
    held: list[socket.socket] = []
    try:
        assert p.stdout is not None and p.stdin is not None
        port = int(p.stdout.readline())
        for _ in range(60):  # more than its descriptors: the rest wait in the backlog
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:  # the backlog is full
                break
        assert len(held) > 40
        time.sleep(1.0)

        def cpu() -> float:
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        c0 = cpu()
        time.sleep(2.0)
        assert cpu() - c0 < 0.2  # a spinning accept loop: 0.4 s and more here
    finally:
        for s in held:
            s.close()
        if p.stdin is not None:
            p.stdin.close()
        p.wait(30)
        err = p.stderr.read() if p.stderr is not None else ""
        assert "Traceback" not in err, err


# ---- the bearer token (issue 22 item 1) ------------------------------------------------------
TOKEN = b"0123456789abcdef-token"


def get_auth(port: int, path: str, auth: str | None) -> tuple[int, dict[str, str]]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers={} if auth is None else {"Authorization": auth})
        r = c.getresponse()
        r.read()
        return r.status, dict(r.getheaders())
    finally:
        c.close()


def test_a_token_is_required_on_every_path_but_the_probes() -> None:
    m = metrics.MetricsServer(FakeNode(), 0, token=TOKEN)  # type: ignore[arg-type]
    try:
        for path in ("/metrics", "/events?since=0", "/nowhere", "/healthz/../metrics"):
            for auth in (None, "", "Bearer", f"Bearer {TOKEN.decode()}x", f"Basic {TOKEN.decode()}",
                         f"Bearer {TOKEN.decode()[:-1]}", f"Bearer {TOKEN.decode().upper()}",
                         f"Bearer{TOKEN.decode()}", TOKEN.decode()):  # fmt: skip
                status, headers = get_auth(m.port, path, auth)
                assert status == 401, (path, auth, status)
                assert headers["WWW-Authenticate"].startswith("Bearer"), headers
        for auth in (f"Bearer {TOKEN.decode()}", f"bearer {TOKEN.decode()}"):  # let through
            assert get_auth(m.port, "/nowhere", auth)[0] == 404, auth
        for probe in ("/healthz", "/readyz", "/readyz?x=1"):  # no token; the fake node: 503
            assert get_auth(m.port, probe, None)[0] == 503, probe
    finally:
        m.close()


def test_the_warning_names_what_must_protect_an_unauthenticated_address(caplog: Any) -> None:
    with caplog.at_level(logging.INFO):
        m = metrics.MetricsServer(FakeNode(), 0, "0.0.0.0")  # type: ignore[arg-type]
    m.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "\n" not in warned[0], warned
    for word in ("unauthenticated", "NetworkPolicy", "firewall", "--metrics-token-file"):
        assert word in warned[0], warned
    caplog.clear()
    with caplog.at_level(logging.INFO):
        m = metrics.MetricsServer(FakeNode(), 0, "0.0.0.0", token=TOKEN)  # type: ignore[arg-type]
    m.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert any("needs the bearer token" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "does not exist"),
        (b"short\n", "at least 16 characters"),
        (b"has a space in it, 16+ characters", "printable ASCII"),
        (b"x" * 5000, "larger than"),
        ("dir", "a directory"),
        ("fifo", "a FIFO"),
    ],
)
def test_a_bad_token_file_is_one_clear_error(tmp_path: Any, content: Any, error: str) -> None:
    import os

    from rdmasched.errors import ConfigError
    from rdmasched.telemetry.http import read_token

    path = tmp_path / "token"
    if content == "dir":
        path.mkdir()
    elif content == "fifo":
        os.mkfifo(path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as exc:
        read_token(str(path))
    assert error in str(exc.value) and str(path) in str(exc.value), exc.value


def test_a_token_file_is_read_without_its_newline(tmp_path: Any) -> None:
    from rdmasched.telemetry.http import read_token

    (tmp_path / "t").write_bytes(b"  " + TOKEN + b"\n")
    assert read_token(str(tmp_path / "t")) == TOKEN


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--metrics-port", "9464", "--metrics-token-file", "/nonexistent"], "does not exist"),
        (["--metrics-token-file", "tok"], "need --metrics-port"),
        (["--metrics-addr", "0.0.0.0"], "need --metrics-port"),
        (["--metrics-port", "9464", "--metrics-addr", "my host"], "not an IP address"),
        (["--metrics-port", "70000"], "a port"),
        (["--log-level", "loud"], "invalid choice"),
        (["--log-format", "xml"], "invalid choice"),
    ],
)
def test_bad_daemon_metrics_and_log_flags_are_one_line_and_exit_2(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from rdmasched.cli import main

    assert main(["daemon", *argv]) == 2
    err = capsys.readouterr().err
    assert error in err and "Traceback" not in err, err


def test_json_log_lines_carry_ts_level_logger_msg_node() -> None:
    import json

    from rdmasched.commands.daemon import JsonFormatter

    rec = logging.LogRecord("rdmasched.x", logging.WARNING, __file__, 1, "a %s", ("b",), None)
    rec.node = "h0"
    got = json.loads(JsonFormatter().format(rec))
    assert got["level"] == "warning" and got["logger"] == "rdmasched.x" and got["msg"] == "a b"
    assert got["node"] == "h0" and got["ts"].endswith("Z") and "T" in got["ts"]
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec.exc_info = sys.exc_info()
    line = JsonFormatter().format(rec)
    assert "\n" not in line and "boom" in json.loads(line)["exc"]
