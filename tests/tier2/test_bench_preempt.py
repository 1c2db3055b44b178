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
