"""`bench preempt` ends cleanly: no node declares its peer dead on a normal run (issue 7
item 13)."""

from __future__ import annotations

import pytest

from rdmasched.bench import preempt


def test_a_normal_run_declares_no_peer_dead(capfd: pytest.CaptureFixture[str]) -> None:
    r = preempt.run_daemons(n=300, interval_us=200, spin_us=5_000, slots=2)
    err = capfd.readouterr().err  # both node processes write their warnings here
    assert "is dead" not in err, err
    assert r["dead_peers"] == {"victim": [], "preemptor": []}
    assert r["dropped"] == {"victim": 0, "preemptor": 0}
    assert len(r["samples"]) >= 300


def test_telemetry_cost_path_drives_both_settings_through_the_same_preempts() -> None:
    from rdmasched.bench import stages

    out = stages.telemetry_cost(n=600, turn=100, rounds=2, events=64)
    on, off = out["events_on"], out["events_off"]
    # the same PREEMPTs on both sides, in turns; only the ring-on side records events
    assert out["preempts"] == 2 * 600 and out["turns"] == 2 * 6
    assert on["events_recorded"] > out["preempts"] and off["events_recorded"] == 0
    assert on["cpu_ns_per_preempt"] > 0 and off["cpu_ns_per_preempt"] > 0
    assert on["gap_p99_us"] >= on["gap_p50_us"] > 0
    assert out["ratio"] > 0 and out["pair_ratio_p50"] > 0 and out["gap_p99_ratio"] > 0


def test_telemetry_cost_cli_prints_both_measurements(capsys: pytest.CaptureFixture[str]) -> None:
    from rdmasched.cli import main

    argv = [
        "bench",
        "preempt",
        "--telemetry-cost",
        "--rounds",
        "1",
        "--preempts",
        "300",
        "--events",
    ]
    assert main([*argv, "64"]) == 0
    out = capsys.readouterr().out
    assert "telemetry on / off: p50" in out and "the PREEMPT path in one process" in out
    assert "CPU-ns per PREEMPT" in out
