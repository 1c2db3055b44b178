"""Hostile trace files (issue 20 item 14): every reader of trace records (`trace`, `top`,
`trace export`, `mirror`) refuses a bad field or a line it cannot bound in one line, never
with a traceback, an OverflowError, a RecursionError or a MemoryError."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from rdmasched.cli import main
from rdmasched.telemetry import records
from rdmasched.telemetry.records import TraceError
from rdmasched.views import mirror

HEAD = {"rdmasched_trace": 1, "node": 0, "clock": "sim", "source": "sim", "slots": 2}
EVENT = {"t_ns": 5, "decision": "start", "task_id": 7, "reason": "free slot", "beaten": []}

#: (name, the file's text): each one field or line no reader may take
BAD: list[tuple[str, str]] = [
    ("t_ns Infinity", json.dumps(HEAD) + "\n" + json.dumps(EVENT).replace("5", "Infinity", 1)),
    ("t_ns NaN", json.dumps(HEAD) + "\n" + json.dumps(EVENT).replace("5", "NaN", 1)),
    ("t_ns a float", json.dumps(HEAD) + "\n" + json.dumps(EVENT | {"t_ns": 1e300})),
    ("t_ns a string", json.dumps(HEAD) + "\n" + json.dumps(EVENT | {"t_ns": "5"})),
    ("nested 200,000 deep", json.dumps(HEAD) + "\n" + "[" * 200_000 + "]" * 200_000),
    ("slot 10**11", json.dumps(HEAD) + "\n" + json.dumps(EVENT | {"slot": 10**11})),
    ("slot negative", json.dumps(HEAD) + "\n" + json.dumps(EVENT | {"slot": -3})),
    ("priority a bool", json.dumps(HEAD) + "\n" + json.dumps(EVENT | {"priority": True})),
    ("beaten not a list", json.dumps(HEAD) + "\n" + json.dumps(EVENT | {"beaten": 3})),
    ("queued past u32", json.dumps(HEAD) + "\n" + json.dumps(EVENT | {"queued": 1 << 40})),
    ("header slots a string", json.dumps(HEAD | {"slots": "two"}) + "\n" + json.dumps(EVENT)),
    ("header slots 10**11", json.dumps(HEAD | {"slots": 10**11}) + "\n" + json.dumps(EVENT)),
    ("header node a list", json.dumps(HEAD | {"node": [1]}) + "\n" + json.dumps(EVENT)),
    ("header dropped a dict", json.dumps(HEAD | {"dropped": {}}) + "\n" + json.dumps(EVENT)),
    ("header anchor a number", json.dumps(HEAD | {"anchor": 3}) + "\n" + json.dumps(EVENT)),
    (
        "header anchor without realtime",
        json.dumps(HEAD | {"anchor": {"monotonic_ns": 1}}) + "\n" + json.dumps(EVENT),
    ),
    ("a line of 2 MiB", json.dumps(HEAD) + "\n" + json.dumps(EVENT | {"reason": "x" * (2 << 20)})),
]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert "error:" in err
    return err


@pytest.mark.parametrize(("name", "text"), BAD, ids=[b[0] for b in BAD])
def test_every_trace_reader_refuses_a_bad_field_in_one_line(
    name: str, text: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "rdmasched-node0.jsonl").write_text(text)
    d = str(tmp_path)
    with pytest.raises(TraceError):
        records.read_file(os.path.join(d, "rdmasched-node0.jsonl"))
    assert main(["trace", d]) == 1
    one_line_error(capsys)
    assert main(["trace", "export", d, "-o", str(tmp_path / "out.pftrace")]) == 1
    one_line_error(capsys)
    assert main(["top", "--trace", d, "--once"]) == 1
    one_line_error(capsys)
    with pytest.raises(TraceError):
        mirror.TraceSource([d])


def test_a_trace_of_dev_zero_is_refused_without_reading_it_all(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    os.symlink("/dev/zero", tmp_path / "rdmasched-node0.jsonl")
    assert main(["trace", str(tmp_path)]) == 1
    assert "not a regular file" in one_line_error(capsys)


def test_good_fields_still_read(tmp_path: Any) -> None:
    p = tmp_path / "rdmasched-node0.jsonl"
    ev = EVENT | {"slot": 1, "priority": 255, "queued": 3, "running": 2, "beaten": [9]}
    anchor = {"monotonic_ns": 1, "realtime_ns": 5 * 10**18}
    p.write_text(json.dumps(HEAD | {"anchor": anchor}) + "\n" + json.dumps(ev) + "\n")
    tr = records.read_file(str(p))
    assert tr.node == 0 and tr.head["slots"] == 2
    assert tr.events[0].slot == 1 and tr.events[0].beaten == (9,)


def test_export_of_the_largest_times_an_anchor_moves_past_u64(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    anchor = {"monotonic_ns": 0, "realtime_ns": 18 * 10**18}
    ev = EVENT | {"t_ns": 2**64 - 1, "slot": 0, "queued": 2**32 - 1, "running": 2**32 - 1}
    (tmp_path / "rdmasched-node0.jsonl").write_text(
        json.dumps(HEAD | {"anchor": anchor, "clock": "monotonic"}) + "\n" + json.dumps(ev)
    )
    out = str(tmp_path / "out.pftrace")
    assert main(["trace", "export", str(tmp_path), "-o", out]) == 0, capsys.readouterr().err
