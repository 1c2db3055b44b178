"""`rdmasched bench preempt --quantum-us` (issue 22 item 6): the urgent DISPATCH reaction
with quantum 0 and with Q in one run, ordinary and critical apart; the command prints both.
(The figures themselves are the benchmark's, docs/PERFORMANCE.md: no timing is asserted.)"""

from __future__ import annotations

import pytest

from rdmasched.bench import preempt
from rdmasched.cli import main


def test_both_quanta_and_both_kinds_are_measured_in_one_run() -> None:
    r = preempt.quantum(n=200, interval_us=300, quantum_us=2000, slots=2)
    assert r["quantum_us"] == 2000 and set(r["runs"]) == {"0", "2000"}
    for row in r["runs"].values():
        assert set(row) == {"ordinary", "critical"}
        for x in row.values():
            assert x["n"] == 200 and 0 < x["p50"] <= x["p99"] <= x["max"]
    assert set(r["ratio"]) == {"ordinary", "critical"}


def test_the_command_prints_both_runs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "preempt", "--quantum-us", "1500", "--preempts", "200"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "quantum       0 us  ordinary" in out and "quantum    1500 us  critical" in out
    assert "quantum 1500 us / quantum 0, ordinary: p50" in out
