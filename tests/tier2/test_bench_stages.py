"""The stage breakdown of `bench preempt --stages`, the loop options of `--jitter`, and the
instruction counts of `bench stages` under callgrind (small counts: they check the figures
exist and add up, not what they are)."""

from __future__ import annotations

import pytest

from rdmasched.bench import preempt, stages


def test_preempt_prints_each_stage_of_the_path() -> None:
    r = preempt.run(n=300, interval_us=500, spin_us=2000, stages=True)
    st = r["stages"]
    assert list(st) == [
        "written -> polled",
        "polled -> taken",
        "taken -> decided",
        "decided -> handler",
        "written -> handler",
    ]
    assert all(s["n"] >= 300 for s in st.values())
    # the parts of a PREEMPT's path add up to its whole (means are exact)
    parts = sum(st[k]["mean"] for k in list(st)[:4])
    assert parts == pytest.approx(st["written -> handler"]["mean"], rel=1e-6)


def test_jitter_compares_every_loop_option() -> None:
    r = preempt.jitter(n=200, interval_us=500, spin_us=2000, rounds=1)
    assert set(r["variants"]) == {"none", "cpu", "gc-freeze", "fifo", "all"}
    for name, v in r["variants"].items():
        assert "refused" in v or v["n"] >= 200, name


@pytest.mark.skipif(stages.available() is not None, reason=str(stages.available()))
def test_instructions_per_message_of_the_core_stage() -> None:
    r = stages.run(n=200, stages=("core",))
    core = r["stages"]["core"]
    assert core["pairs"] >= 200 and core["total"] > 0
    # NodeCore.receive for a PREEMPT in CPython: thousands of instructions, not millions
    assert 1_000 < core["instructions_per_message"] < 1_000_000
    assert r["probe_pair_instructions"] > 0
