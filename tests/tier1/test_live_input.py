"""Live readers against a node that answers badly (issue 20 item 10): a truncated
``/events`` body (a daemon killed mid-answer), not JSON, a field of the wrong type,
``Infinity`` in ``t_ns``. ``live.fetch`` says so in one TraceError; the mirror's poll thread
shows the error on that node, keeps polling and recovers when the node answers again;
``top --live``, ``trace export --live`` and ``mirror --live`` print one line, no traceback.
A fake node (an HTTP server in this process) gives the answers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rdmasched.cli import main
from rdmasched.telemetry.records import TraceError
from rdmasched.views import live, mirror
from tests.waiting import wait_for

HEAD = {"rdmasched_trace": 1, "node": 3, "clock": "monotonic", "slots": 2, "missed": 0}
HEAD["anchor"] = {"monotonic_ns": 10, "realtime_ns": 10**18}


def ev(seq: int, **kw: Any) -> dict[str, Any]:
    d = {"t_ns": 1000 + seq, "decision": "queue", "task_id": 100 + seq, "reason": "no slot"}
    return d | {"beaten": [], "seq": seq, "node": 3, "priority": 5} | kw


def body(*lines: Any) -> bytes:
    return ("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n").encode()


#: (name, the body, what Content-Length says beyond it): answers no reader may take
BAD: list[tuple[str, bytes, int]] = [
    ("truncated", body(HEAD, ev(0)), 500),
    ("not JSON", b"<html>502 Bad Gateway</html>\n", 0),
    ("not UTF-8", b"\xff\xfe\x00\n", 0),
    ("empty", b"", 0),
    ("no header", body(ev(0)), 0),
    ("header a list", body([1, 2]), 0),
    ("header node a string", body(HEAD | {"node": "3"}), 0),
    ("header anchor a string", body(HEAD | {"anchor": "x"}), 0),
    ("header missed a float", body(HEAD | {"missed": 1.5}), 0),
    ("t_ns Infinity", body(HEAD, json.dumps(ev(0)).replace("1000", "Infinity")), 0),
    ("t_ns a string", body(HEAD, ev(0, t_ns="1000")), 0),
    ("seq a list", body(HEAD, ev(0) | {"seq": [0]}), 0),
    ("slot 10**11", body(HEAD, ev(0, slot=10**11)), 0),
    ("decision unknown", body(HEAD, ev(0, decision="explode")), 0),
    ("beaten a dict", body(HEAD, ev(0, beaten={})), 0),
    ("an event a number", body(HEAD, "7"), 0),
    ("nested deep", body(HEAD, "[" * 100_000 + "]" * 100_000), 0),
    ("task_id missing", body(HEAD, {k: v for k, v in ev(0).items() if k != "task_id"}), 0),
]


class FakeNode:
    """An HTTP server that answers ``/events`` with whatever ``answer`` holds."""

    def __init__(self) -> None:
        self.answer: tuple[bytes, int] = (body(HEAD), 0)
        self.sinces: list[int] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.sinces.append(int(self.path.partition("since=")[2] or 0))
                data, extra = fake.answer
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Content-Length", str(len(data) + extra))
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.addr = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def node() -> Iterator[FakeNode]:
    n = FakeNode()
    try:
        yield n
    finally:
        n.close()


@pytest.mark.parametrize(("name", "data", "extra"), BAD, ids=[b[0] for b in BAD])
def test_fetch_refuses_a_bad_answer_in_one_trace_error(
    name: str, data: bytes, extra: int, node: FakeNode
) -> None:
    node.answer = (data, extra)
    with pytest.raises(TraceError) as exc:
        live.fetch(node.addr, timeout_s=5)
    assert node.addr in str(exc.value) and "\n" not in str(exc.value)


def test_a_good_answer_is_read(node: FakeNode) -> None:
    node.answer = (body(HEAD, ev(0), ev(1, slot=1, decision="start")), 0)
    tr = live.fetch(node.addr, timeout_s=5)
    assert tr.node == 3 and [e.seq for e in tr.events] == [0, 1] and tr.events[1].slot == 1


def test_the_mirror_shows_a_bad_answer_keeps_polling_and_recovers(node: FakeNode) -> None:
    node.answer = (body(HEAD, ev(0)), 0)
    src = mirror.LiveSource([node.addr], interval_s=0.02)
    try:
        assert src.state()["events"] == 1
        for _, data, extra in BAD:
            node.answer = (data, extra)
            n = len(node.sinces)
            wait_for(lambda n=n: len(node.sinces) >= n + 2)  # type: ignore[misc]
            s = src.state()
            assert s["nodes"][0]["error"], s["nodes"][0]
            assert src._thread.is_alive()
        assert set(node.sinces[1:]) == {1}  # nothing from a bad answer moved the next seq
        node.answer = (body(HEAD, ev(1), ev(2)), 0)
        wait_for(lambda: src.state()["events"] >= 3)  # (it answers them again)
        assert src.state()["nodes"][0]["error"] is None
        wait_for(lambda: node.sinces[-1] == 3)
    finally:
        src.close()


def test_a_node_that_answers_badly_first_is_shown_then_mirrored(node: FakeNode) -> None:
    good = FakeNode()
    try:
        good.answer = (body(HEAD | {"node": 4}, ev(0, node=4)), 0)
        node.answer = (b"not json\n", 0)
        src = mirror.LiveSource([good.addr, node.addr], interval_s=0.02)
        try:
            s = src.state()
            assert [n["node"] for n in s["nodes"]] == [4]
            assert node.addr in s["errors"]
            node.answer = (body(HEAD, ev(0)), 0)
            wait_for(lambda: len(src.state()["nodes"]) == 2)
            assert src.state()["errors"] == {}
        finally:
            src.close()
    finally:
        good.close()


@pytest.mark.parametrize(("name", "data", "extra"), BAD[:1] + BAD[9:10] + BAD[12:13])
def test_the_commands_say_a_bad_answer_in_one_line(
    name: str, data: bytes, extra: int, node: FakeNode, tmp_path: Any, capsys: Any
) -> None:
    node.answer = (data, extra)
    for argv in (
        ["top", "--live", node.addr, "--once"],
        ["trace", "export", "--live", node.addr, "-o", str(tmp_path / "o.pftrace")],
        ["mirror", "--live", node.addr, "--port", "0"],
    ):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1 and node.addr in err, err
