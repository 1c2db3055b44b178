"""The `rdmasched` command's argument checking: bad input is refused before anything runs."""

from __future__ import annotations

import pytest

from rdmasched.cli import build_parser, main


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "latency", "--slots", "100"],
        ["bench", "latency", "--slots", "8"],
        ["bench", "latency", "--iterations", "0"],
        ["bench", "latency", "--rows", "carrier-pigeon"],
        ["bench", "latency", "--transport", "tcp"],
        ["bench", "throughput", "--batch", "-1"],
        ["demo", "--nodes", "0"],
        ["demo", "--steps", "x"],
        ["nonsense"],
        [],
    ],
)
def test_bad_arguments_exit_with_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--jitter", "1.5"], "--jitter"),
        (["demo", "--compute-ms", "0"], "--compute-ms must be > 0"),
    ],
)
def test_demo_values_are_checked(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        main(argv)


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
            "--json",
        ]
    )
    assert a.rows == ["c-shm-floor", "zmq-ipc"] and a.json and a.slots == 256
    d = build_parser().parse_args(["demo", "--nodes", "3", "--spin-us", "10"])
    assert (d.nodes, d.slots, d.spin_us, d.steps) == (3, 4, 10, 200)


def test_trace_of_a_missing_directory(tmp_path: object) -> None:
    with pytest.raises(SystemExit, match="no directory"):
        main(["trace", "/nonexistent/rdmasched-trace"])
