"""The scheduler benchmark runs and reports a consistent mix (no timing is asserted)."""

from __future__ import annotations

import json

import pytest

from rdmasched.bench import scheduler as bench


@pytest.mark.parametrize("impl", ["auto", "python"])
def test_bench_runs_the_promised_mix(impl: str) -> None:
    out = bench.run(5000, 4, impl=impl, quiet=True)
    assert out["decisions"] >= 5000 and out["calls"] > 0
    assert out["decisions_per_s"] > 0 and out["cpu_decisions_per_s"] > 0
    mix = out["mix"]
    # every kind of decision the docstring promises occurs
    assert mix["starts"] > 0 and mix["queued"] > 0 and mix["completions"] > 0
    assert mix["preemptions"] > 0 and mix["preemptions"] == mix["requeues"]
    assert mix["sync_releases"] > 0
    if impl == "python":
        assert out["implementation"] == "python"


def test_bench_cli_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--n", "3000", "--nslots", "2", "--repeat", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nslots"] == 2 and out["decisions"] >= 3000


def test_bench_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        bench.main(["--n", "0"])
    with pytest.raises(ValueError):
        bench.run(10, 1, impl="fast")


def test_telemetry_cost_drives_both_schedulers_through_the_same_work() -> None:
    out = bench.telemetry_cost(6000, 4, rounds=2, events=64)
    # turns of the same operations on both: the same decisions (checked inside too)
    assert out["decisions"] >= 2 * 6000 and out["turns"] >= 2
    assert out["events_on"]["cpu_decisions_per_s"] > 0
    assert out["events_off"]["cpu_decisions_per_s"] > 0
    assert out["ratio"] > 0 and out["pair_ratio_p50"] > 0
    assert out["implementation"] in ("compiled", "python")
