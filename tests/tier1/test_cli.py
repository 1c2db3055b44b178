"""The `rdmasched` command's argument checking: bad input is refused before anything runs,
as one line on stderr and a non-zero exit, never a traceback (issue 7 items 10 and 22)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rdmasched import __version__
from rdmasched.cli import build_parser, main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {lines}"
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # lane sizes, counts, unknown names
        (["bench", "latency", "--lane-slots", "100"], "--lane-slots"),
        (["bench", "latency", "--lane-slots", "8"], "--lane-slots"),
        (["bench", "latency", "--iterations", "0"], "--iterations"),
        (["bench", "latency", "--rows", "carrier-pigeon"], "--rows"),
        (["bench", "latency", "--transport", "tcp"], "--transport"),
        (["bench", "throughput", "--batch", "-1"], "--batch"),
        (["demo", "--nodes", "0"], "--nodes"),
        (["demo", "--steps", "x"], "--steps"),
        (["nonsense"], "nonsense"),
        ([], "required"),
        # issue 7 item 10
        (["demo", "--exec-slots", "300"], "--exec-slots"),
        (["bench", "latency", "--warmup", "-5"], "--warmup"),
        (["bench", "preempt", "--spin-us", "-1"], "--spin-us"),
        (["bench", "idle", "--seconds", "-1"], "--seconds"),
        (["demo", "--nodes", "2000"], "--nodes"),
        # issue 7 item 22
        (["demo", "--compute-ms", "nan"], "--compute-ms"),
        (["demo", "--compute-ms", "inf"], "--compute-ms"),
        (["demo", "--compute-ms", "0"], "--compute-ms"),
        (["demo", "--background-ms", "nan"], "--background-ms"),
        (["demo", "--sync-ms", "-1"], "--sync-ms"),
        (["demo", "--spin-us", "-1"], "--spin-us"),
        (["demo", "--jitter", "1.5"], "--jitter"),
        (["demo", "--jitter", "nan"], "--jitter"),
        (["bench", "idle", "--seconds", "nan"], "--seconds"),
        (["bench", "idle", "--seconds", "inf"], "--seconds"),
        (["bench", "idle", "--spin-us", "-1"], "--spin-us"),
        (["bench", "latency", "--warmup", "-100"], "--warmup"),
        (["bench", "latency", "--iterations", "3", "--rounds", "5"], "--iterations"),
        (["bench", "latency", "--slow-iterations", "3", "--rounds", "5"], "--slow-iterations"),
        (["bench", "preempt", "--spin-us", str(2**64)], "--spin-us"),
        (["bench", "preempt", "--interval-us", "0"], "--interval-us"),
        (["bench", "throughput", "--messages", "100", "--batch", "256"], "--batch"),
        (["bench", "throughput", "--lane-slots", "64", "--batch", "64"], "--batch"),
        (["bench", "all"], "--json-out"),
        # issue 20 item 15: one exit code for a bad argument in every command (these were 1)
        (["daemon", "--config", "cluster.toml"], "--config and --node go together"),
        (["trace", "export", "-o", "/tmp/x.pftrace"], "give at least one DIR"),
        # issue 20 item 15: output paths are checked before anything runs (these were
        # tracebacks, the plot's only after the benchmark ran) and addresses are parsed
        (["bench", "latency", "--csv", "/nonexistent/d/x.csv"], "--csv"),
        (["bench", "latency", "--hdr-log", "/tmp"], "--hdr-log"),
        (["bench", "latency", "--plot", "/nonexistent/x.png"], "--plot"),
        (["bench", "latency", "--plot", "/tmp/x.txt"], "--plot"),
        (["sim", "--plot", "/tmp"], "--plot"),
        (["sim", "--plot", "/tmp/x.txt"], "--plot"),
        (["sim", "--plot", "/nonexistent/x.png"], "--plot"),
        (["sim", "--trace", "/proc/version"], "--trace"),
        (["sim", "--trace", "/nonexistent/d"], "--trace"),
        (["trace", "export", "--live", "127.0.0.1:abc", "-o", "/tmp/x.pftrace"], "--live"),
        (["trace", "export", "/tmp", "-o", "/nonexistent/x.pftrace"], "--output"),
        (["top", "--live", "127.0.0.1:abc"], "--live"),
        (["mirror", "--live", ":8080"], "--live"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    line = one_line(err)
    assert line.startswith("rdmasched") and "error:" in line and says in line, line
    assert out == ""


@pytest.mark.parametrize(
    ("argv", "new"),
    [
        (["demo", "--slots", "300"], "--exec-slots"),
        (["demo", "--slots", "4"], "--exec-slots"),
        (["bench", "scheduler", "--slots", "8"], "--exec-slots"),
        (["bench", "latency", "--slots", "256"], "--lane-slots"),
        (["bench", "throughput", "--slots", "1024"], "--lane-slots"),
    ],
)
def test_the_old_ambiguous_slots_says_what_to_use(
    argv: list[str], new: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(argv, capsys)
    assert code == 2
    assert f"--slots was renamed: use {new}" in one_line(err)


def test_each_slots_flag_means_one_thing() -> None:
    """--lane-slots only where lanes are sized, --exec-slots only where GPUs are counted."""
    p = build_parser()
    lane, exec_ = set(), set()
    for path, parser in _parsers(p):
        opts = {o for a in parser._actions for o in a.option_strings}
        if "--lane-slots" in opts:
            lane.add(path)
        if "--exec-slots" in opts:
            exec_.add(path)
    assert lane == {"bench latency", "bench throughput", "topology"}
    assert exec_ == {"demo", "bench scheduler", "sim"}


def test_demo_trace_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "a-file"
    f.write_text("x")
    code, _, err = run(["demo", "--trace", str(f)], capsys)
    assert code == 2 and "not a directory" in one_line(err)


def test_trace_of_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "node0.jsonl"
    f.write_text("{}\n")
    code, _, err = run(["trace", str(f)], capsys)
    assert code == 2 and "is not a directory" in one_line(err)


def test_trace_of_a_missing_directory(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["trace", "/nonexistent/rdmasched-trace"], capsys)
    assert code == 2 and "no directory" in one_line(err)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (
            b'{"t_ns": 1, "decision": "start", "task_id": 3, "reason": "free", "beaten": []}\n'
            b"not json\n",
            "line 2 is not a trace event",
        ),
        (b'{"t_ns": 1, "task_id": 3, "beaten": []}\n', "line 1 is not a trace event (needs"),
        (b"[1, 2]\n", "line 1 is not a trace event"),
        (b'{"t_ns": "x", "task_id": 3, "beaten": []}\n', "line 1 is not a trace event"),
        (b"\xff\xfe\x00garbage\n", "not UTF-8"),
    ],
)
def test_trace_of_a_bad_file(
    content: bytes, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "rdmasched-node0.jsonl").write_bytes(content)
    code, out, err = run(["trace", str(tmp_path)], capsys)
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith("rdmasched trace: error:") and says in line, line


def test_trace_of_an_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["trace", str(tmp_path)], capsys)
    assert code == 1 and "no *.jsonl traces" in one_line(err)


def test_trace_merges_in_time_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def ev(t: int, task: int, beaten: list[int]) -> str:
        e = {"t_ns": t, "decision": "start", "task_id": task, "reason": "free", "beaten": beaten}
        return json.dumps(e) + "\n"

    (tmp_path / "a.jsonl").write_text(ev(5, 1, []) + ev(9, 2, [1]))
    (tmp_path / "b.jsonl").write_text(ev(7, 3, []))
    code, out, _ = run(["trace", str(tmp_path), "--task", "1"], capsys)
    assert code == 0
    events = [json.loads(x) for x in out.splitlines()]
    assert [(e["t_ns"], e["source"]) for e in events] == [(5, "a"), (9, "a")]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"rdmasched {__version__}"


def _parsers(
    p: argparse.ArgumentParser, path: str = ""
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, p)]
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                found += _parsers(sub, f"{path} {name}".strip())
    return found


def test_help_shows_every_default() -> None:
    for path, parser in _parsers(build_parser()):
        assert issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter), path
        text = "".join(parser.format_help().split())
        for a in parser._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS:
                continue
            if isinstance(a, argparse._HelpAction | argparse._VersionAction):
                continue
            assert a.help, f"{path} {a.option_strings[0]} has no help"
            default = " ".join(a.default) if isinstance(a.default, list) else a.default
            shown = "".join(f"{a.help} (default: {default})".split())
            if default is None and "(default " in a.help:  # the help names what None means
                shown = "".join(a.help.split())
            assert shown in text, f"{path} {a.option_strings[0]}: no default in help"


def test_good_arguments_parse() -> None:
    a = build_parser().parse_args(
        [
            "bench",
            "latency",
            "--rows",
            "c-shm-floor",
            "zmq-ipc",
            "--iterations",
            "10",
            "--rounds",
            "2",
            "--warmup",
            "0",
            "--json",
        ]
    )
    assert a.rows == ["c-shm-floor", "zmq-ipc"] and a.json and a.lane_slots == 256
    d = build_parser().parse_args(["demo", "--nodes", "3", "--spin-us", "10"])
    assert (d.nodes, d.exec_slots, d.spin_us, d.steps) == (3, 4, 10, 200)


def test_verbs_latency_without_a_device_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine without RDMA (this project's own): what is missing and where to run it."""
    import os

    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        pytest.skip("this machine has an RDMA device")
    monkeypatch.delenv("RDMASCHED_DEVICE", raising=False)
    code, out, err = run(["bench", "latency", "--transport", "verbs"], capsys)
    assert code == 1 and out == ""
    assert "tests/vm/bench-verbs.sh" in one_line(err)


def test_verbs_latency_class_options(capsys: pytest.CaptureFixture[str]) -> None:
    """--service-level and --dscp: the config's [verbs] defaults and bounds (limits.py)."""
    a = build_parser().parse_args(["bench", "latency", "--transport", "verbs"])
    assert (a.service_level, a.dscp) == (6, 48)
    a = build_parser().parse_args(["bench", "latency", "--dscp", "26", "--service-level", "3"])
    assert (a.service_level, a.dscp) == (3, 26)
    for bad in (["--dscp", "64"], ["--dscp", "-1"], ["--service-level", "16"]):
        code, out, err = run(["bench", "latency", "--transport", "verbs", *bad], capsys)
        assert code == 2 and out == "" and bad[0] in one_line(err), err


def test_python_dash_m_rdmasched_is_the_command() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "rdmasched", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and p.stdout.strip() == f"rdmasched {__version__}"


def test_library_code_never_imports_the_commands() -> None:
    """The CLI is a shell over the library (issue 19): only cli.py, commands/ and
    __main__.py may import rdmasched.cli or rdmasched.commands."""
    import ast

    root = Path(__file__).resolve().parents[2] / "rdmasched"
    shell = {root / "cli.py", root / "__main__.py"}
    bad = []
    for path in root.rglob("*.py"):
        if path in shell or root / "commands" in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            shells = ("rdmasched.cli", "rdmasched.commands")
            if any(n in shells or n.startswith(tuple(f"{s}." for s in shells)) for n in names):
                bad.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not bad, bad
