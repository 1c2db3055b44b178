"""`rdmasched topology --sizes`: one verified topology per size, as table rows computed by the
real topology code (issue 8 figures); and the demo's topology options."""

from __future__ import annotations

import json

import pytest

from rdmasched.cli import main
from rdmasched.commands.args import node_counts
from rdmasched.commands.topology import table_row
from rdmasched.topology import Topology, verify


def test_sizes_rows_are_verify_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "--sizes", "100,300", "--leaf", "8", "--pod", "64"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| N | plan | lanes max / mean | RC QPs max | ring memory max")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[0] for r in rows] == ["100", "300"]
    for n, row in zip((100, 300), rows, strict=True):
        rep = verify(Topology.generate(n, leaf=8, pod=64))
        assert row[1:-1] == table_row(rep)
        missed = [k for k, ok in rep.targets().items() if not ok]
        assert row[-1] == (", ".join(missed) or "none")


def test_sizes_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "--sizes", "64", "--json"]) == 0
    (rep,) = json.loads(capsys.readouterr().out)
    assert (
        rep["nodes"] == 64 and rep["max_lanes"] == 31 + 1
    )  # its leaf of 32 and its rail peer and rep["targets"]["lanes <= 64"]


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--sizes", "1k,x"], "node counts separated by commas"),
        (["--sizes", "0"], "not in 1.."),
        (["--sizes", "1k", "--nodes", "5"], "cannot be combined with --nodes"),
    ],
)
def test_sizes_errors_are_one_line(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topology", *argv]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err, err


def test_node_counts() -> None:
    assert node_counts("1k, 10K,100000") == [1000, 10_000, 100_000]


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--pod", "8"], "--pod needs --leaf"),
        (["--nodes", "65"], "in 1..64"),
        (["--heartbeat-ms", "100", "--dead-after-ms", "150"], "more than 2 x --heartbeat-ms"),
    ],
)
def test_demo_topology_options(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *argv]) == 2
    assert why in capsys.readouterr().err


def test_demo_bad_topology_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--nodes", "8", "--leaf", "4", "--pod", "6"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "multiple of leaf" in err, err
