"""`rdmasched daemon` in production (issue 22 item 1; docs/DAEMON.md, "Running in
production"): real daemon processes on shm, their endpoints read with curl. The probes
(/healthz, /readyz: 503 while the node joins, 200 once it has), the bearer token (/metrics
and /events need it, the probes do not), the one warning line of an unauthenticated
non-loopback address, JSON log lines, and the metrics per client rank with a real rank."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdmasched.client import Client
from rdmasched.cluster import local_cluster
from rdmasched.daemon.node import Node
from rdmasched.scheduler import Task
from rdmasched.telemetry import metrics
from tests.telemetry_deps import need
from tests.tools import need_tool
from tests.waiting import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "s3cret-metrics-token-0123456789"


def curl_bin() -> str:
    return need_tool("curl", "scripts/setup.sh installs it")


def curl(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    """GET http://127.0.0.1:PORT/PATH with curl: (status, body); status 0: no answer."""
    cmd = [curl_bin(), "--noproxy", "*", "-sS", "-m", "10", "-w", "\n%{http_code}"]
    if token is not None:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    r = subprocess.run([*cmd, f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True)
    body, _, code = r.stdout.rpartition("\n")
    return int(code or 0), body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def config(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    name = f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(
        f'[cluster]\nname = "{name}"\n\n'
        '[[node]]\nname = "h0"\nslots = 2\n\n[[node]]\nname = "h1"\nslots = 1\n'
    )
    yield cfg, name


class Daemon:
    """A `rdmasched daemon` process; its stderr in a file, its stdout's banner read."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.err_path = tmp / f"err-{uuid.uuid4().hex[:6]}"
        self.err = self.err_path.open("w")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "rdmasched", "daemon", *args],
            stdout=subprocess.PIPE, stderr=self.err, stdin=subprocess.DEVNULL, text=True,
            cwd=ROOT, env=os.environ | {"PYTHONPATH": ROOT},
        )  # fmt: skip
        self.banner = ""

    def wait_banner(self) -> str:
        assert self.p.stdout is not None
        self.banner = self.p.stdout.readline()
        assert "rdmasched daemon: node" in self.banner, (self.banner, self.stderr())
        return self.banner

    def metrics_port(self) -> int:
        return int(self.wait_banner().rsplit(":", 1)[1].split("/")[0])

    def stderr(self) -> str:
        return self.err_path.read_text()  # the child writes it; this side never does

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        code = self.p.wait(30)
        if self.p.stdout is not None:
            self.p.stdout.close()
        self.err.close()
        return code


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Any]:
    started: list[Daemon] = []

    def start(*args: str) -> Daemon:
        d = Daemon(tmp_path, *args)
        started.append(d)
        return d

    yield start
    for d in started:
        try:
            d.stop()
        except subprocess.TimeoutExpired:
            d.p.kill()
            d.p.wait()


def test_readyz_is_503_while_the_node_joins_and_200_once_it_has(
    config: tuple[Path, str], daemons: Any
) -> None:
    cfg, _ = config
    port = free_port()
    h0 = daemons("--config", str(cfg), "--node", "h0", "--metrics-port", str(port))
    wait_for(lambda: curl(port, "/readyz")[0] != 0, "h0's metrics server answers")
    code, body = curl(port, "/readyz")  # h1 has not started: h0 waits for its lanes
    assert code == 503 and "joining" in body and len(body.splitlines()) == 1, (code, body)
    code, body = curl(port, "/healthz")
    assert code == 503 and "not running" in body, (code, body)
    assert curl(port, "/metrics")[0] == 503  # nothing to read beside the thread building it
    daemons("--config", str(cfg), "--node", "h1")
    h0.wait_banner()
    wait_for(lambda: curl(port, "/readyz")[0] == 200, "h0 ready once h1 joined")
    code, body = curl(port, "/readyz")
    assert body.startswith("ready: node 0 joined, serving clients at "), body
    code, body = curl(port, "/healthz")
    assert code == 200 and body.startswith("ok: "), (code, body)
    assert h0.stop() == 0
    assert "Traceback" not in h0.stderr(), h0.stderr()


def test_a_signal_while_the_node_joins_stops_it_at_once(
    config: tuple[Path, str], daemons: Any
) -> None:
    """SIGTERM (systemctl stop, a pod deleted) while the daemon waits for its peers' lanes
    stops it then, not after the connect timeout (30 s), and leaves no segment behind."""
    cfg, _ = config
    port = free_port()
    h0 = daemons("--config", str(cfg), "--node", "h0", "--metrics-port", str(port))
    wait_for(lambda: curl(port, "/readyz")[0] == 503, "h0 joining")
    h0.p.send_signal(signal.SIGTERM)
    assert h0.p.wait(10) == 128 + signal.SIGTERM
    assert h0.stderr() == "rdmasched daemon: stopped by SIGTERM\n", h0.stderr()
    assert curl(port, "/healthz")[0] == 0  # the server is gone with it


def test_a_token_guards_metrics_and_events_not_the_probes(
    config: tuple[Path, str], daemons: Any, tmp_path: Path
) -> None:
    cfg, _ = config
    tok = tmp_path / "metrics.token"
    tok.write_text(TOKEN + "\n")
    args = ["--metrics-port", "0", "--metrics-addr", "0.0.0.0", "--metrics-token-file", str(tok)]
    h1 = daemons("--config", str(cfg), "--node", "h1")
    h0 = daemons("--config", str(cfg), "--node", "h0", *args)
    port = h0.metrics_port()
    h1.wait_banner()
    wait_for(lambda: curl(port, "/readyz")[0] == 200, "h0 ready")
    assert curl(port, "/healthz")[0] == 200  # no token: the kubelet's probe
    for path in ("/metrics", "/events?since=0"):
        assert curl(port, path)[0] == 401, path
        assert curl(port, path, token="wrong-" + TOKEN)[0] == 401, path
        assert curl(port, path, token=TOKEN[:-1])[0] == 401, path
    code, events = curl(port, "/events?since=0", token=TOKEN)
    assert code == 200 and json.loads(events.splitlines()[0])["node"] == 0
    code, text = curl(port, "/metrics", token=TOKEN)
    assert code == 200
    assert (
        f'rdmasched_build_info{{commit="{metrics.build_commit()}",node="0",node_name="h0",' in text
    )
    assert 'rdmasched_load_ratio{node="0",node_name="h0"} 0.0' in text
    assert 'rdmasched_lane_occupancy{node="0",node_name="h0",peer="1",peer_name="h1"}' in text
    assert "rdmasched_load_hint" not in text  # renamed: a ratio, not per mille
    err = h0.stderr()
    assert "unauthenticated" not in err, err  # protected: no warning


def rdmasched(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmasched", *argv], capture_output=True, text=True, timeout=60,
        cwd=ROOT, env=os.environ | {"PYTHONPATH": ROOT},
    )  # fmt: skip


def test_the_live_readers_send_the_token_and_say_when_one_is_needed(
    config: tuple[Path, str], daemons: Any, tmp_path: Path
) -> None:
    """`top --live`, `mirror --live`, `trace export --live` and `why --live` read a daemon
    whose metrics port needs a token with `--token-file`; without it, one line that names the
    401 and the flag (they sent no token before, so they could not read a protected node)."""
    cfg, _ = config
    tok = tmp_path / "metrics.token"
    tok.write_text(TOKEN + "\n")
    h1 = daemons("--config", str(cfg), "--node", "h1")
    h0 = daemons("--config", str(cfg), "--node", "h0", "--metrics-port", "0",
                 "--metrics-token-file", str(tok))  # fmt: skip
    port = h0.metrics_port()
    h1.wait_banner()
    wait_for(lambda: curl(port, "/readyz")[0] == 200, "h0 ready")
    addr = f"127.0.0.1:{port}"
    out = str(tmp_path / "o.pftrace")
    readers = [
        ["top", "--live", addr, "--once"],
        ["trace", "export", "--live", addr, "-o", out],
        ["why", "12345", "--live", addr],
    ]
    for argv in readers:
        r = rdmasched(*argv)
        assert r.returncode == 1, (argv, r.returncode, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (argv, r.stderr)
        assert "401" in r.stderr and "--token-file" in r.stderr, (argv, r.stderr)
    r = rdmasched("top", "--live", addr, "--once", "--token-file", str(tok))
    assert r.returncode == 0 and "node 0" in r.stdout, (r.returncode, r.stdout, r.stderr)
    r = rdmasched("trace", "export", "--live", addr, "-o", out, "--token-file", str(tok))
    assert r.returncode == 0 and os.path.getsize(out) > 0, (r.returncode, r.stderr)
    r = rdmasched("why", "12345", "--live", addr, "--token-file", str(tok))
    assert r.returncode == 2 and "no task 12345" in r.stderr, (r.returncode, r.stderr)
    r = rdmasched("top", "--live", addr, "--once", "--token-file", str(tmp_path / "none"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.returncode, r.stderr)
    from rdmasched.views import mirror

    src = mirror.open_source([], [addr], token=TOKEN.encode())  # the mirror's page, same source
    try:
        assert [n["node"] for n in src.state()["nodes"]] == [0]
    finally:
        src.close()


def test_an_unauthenticated_address_is_said_in_one_warning_line_and_logs_are_json(
    config: tuple[Path, str], daemons: Any
) -> None:
    cfg, _ = config
    h1 = daemons("--config", str(cfg), "--node", "h1")
    h0 = daemons(
        "--config", str(cfg), "--node", "h0", "--metrics-port", "0",
        "--metrics-addr", "0.0.0.0", "--log-format", "json", "--log-level", "info",
    )  # fmt: skip
    port = h0.metrics_port()
    h1.wait_banner()
    assert curl(port, "/metrics")[0] == 200  # no token asked for: served
    assert h0.stop() == 0
    lines = [json.loads(line) for line in h0.stderr().splitlines()]
    assert lines, "info logs expected"
    for rec in lines:
        assert set(rec) >= {"ts", "level", "logger", "msg", "node"}, rec
        assert rec["ts"].endswith("Z") and rec["node"] == "h0", rec
    warnings = [r for r in lines if r["level"] == "warning"]
    assert len(warnings) == 1, warnings
    msg = warnings[0]["msg"]
    assert "unauthenticated" in msg and "every interface" in msg, msg
    assert "NetworkPolicy" in msg and "firewall" in msg and "--metrics-token-file" in msg, msg
    assert any(r["level"] == "info" and r["logger"] == "rdmasched.clients" for r in lines)


def test_a_loopback_daemon_warns_nothing_at_the_default_level(
    config: tuple[Path, str], daemons: Any
) -> None:
    cfg, _ = config
    h1 = daemons("--config", str(cfg), "--node", "h1")
    h0 = daemons("--config", str(cfg), "--node", "h0", "--metrics-port", "0")
    port = h0.metrics_port()
    h1.wait_banner()
    assert curl(port, "/metrics")[0] == 200
    assert h0.stop() == 0
    assert h0.stderr() == ""


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    parser = need("prometheus_client.parser")
    code, text = curl(port, "/metrics")
    assert code == 200, (code, text)
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in parser.text_string_to_metric_families(text + "\n"):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def rank_value(m: dict[str, Any], name: str, rank: int) -> float | None:
    for labels, v in m.get(name, {}).items():
        if dict(labels).get("rank") == str(rank):
            assert dict(labels)["node_name"] == "h0"
            return float(v)
    return None


def test_metrics_per_client_rank(config: tuple[Path, str], daemons: Any) -> None:
    cfg, name = config
    cfg.write_text(f'[cluster]\nname = "{name}"\n\n[[node]]\nname = "h0"\nslots = 2\n')
    h0 = daemons("--config", str(cfg), "--node", "h0", "--metrics-port", "0")
    port = h0.metrics_port()
    m = scrape(port)
    assert rank_value(m, "rdmasched_client_connected", 0) == 0.0
    assert rank_value(m, "rdmasched_client_connected", 1) == 0.0
    started: list[int] = []
    rank = Client(f"{name}.h0", 0)
    rank.on_dispatch(lambda task, slot: started.append(task.id))
    with rank:
        for t in range(1, 6):  # one host of 2 slots: 2 start, 3 queue
            rank.submit(t, priority=10)
        rank.flush()
        assert rank.wait_for(lambda: len(started) == 2)
        rank.complete(started[0])  # one done: a queued one takes its slot
        rank.flush()
        assert rank.wait_for(lambda: len(started) == 3)

        def counted() -> bool:
            m = scrape(port)
            return rank_value(m, "rdmasched_client_tasks_completed_total", 0) == 1.0

        wait_for(counted, "rank 0's completion counted")
        m = scrape(port)
        assert m["rdmasched_clients_connected"] == {(("node", "0"), ("node_name", "h0")): 1.0}
        assert rank_value(m, "rdmasched_client_connected", 0) == 1.0
        assert rank_value(m, "rdmasched_client_connected", 1) == 0.0
        assert rank_value(m, "rdmasched_client_tasks_submitted_total", 0) == 5.0
        assert rank_value(m, "rdmasched_client_tasks_submitted_total", 1) == 0.0
        assert rank_value(m, "rdmasched_client_tasks_queued", 0) == 2.0
        assert rank_value(m, "rdmasched_client_tasks_held", 0) == 4.0  # 5, 1 completed
        load = m["rdmasched_load_ratio"][(("node", "0"), ("node_name", "h0"))]
        assert load == 2.0  # (2 running + 2 queued) / 2 slots: work waits
        busy = m["rdmasched_slots_busy_ratio"][(("node", "0"), ("node_name", "h0"))]
        assert busy == 1.0
    wait_for(
        lambda: rank_value(scrape(port), "rdmasched_client_connected", 0) == 0.0, "rank 0 left"
    )


def test_healthz_fails_while_the_loop_is_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop wedged in a handler: /healthz (and /readyz) answer 503 with why, then 200 once
    it runs again. In process (the bound shortened); the daemon's own is HEALTH_STALE_S."""
    monkeypatch.setattr(metrics, "HEALTH_STALE_S", 0.3)
    node = Node(local_cluster(1, 1, name=f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"), 0)
    release = threading.Event()

    def stuck(task: Task, slot: int) -> None:
        release.wait(60)

    node.on_dispatch(stuck)
    server = metrics.serve(node, 0)
    try:
        node.start()
        from rdmasched import launch

        launch.serve(node)
        port = server.port
        wait_for(lambda: curl(port, "/readyz")[0] == 200, "ready")
        node.submit(1, priority=1)
        wait_for(lambda: curl(port, "/healthz")[0] == 503, "/healthz fails")
        body = curl(port, "/healthz")[1]
        assert "stuck" in body and len(body.splitlines()) == 1, body
        assert curl(port, "/readyz")[0] == 503
        release.set()
        wait_for(lambda: curl(port, "/healthz")[0] == 200, "/healthz passes again")
    finally:
        release.set()
        server.close()
        node.stop()
