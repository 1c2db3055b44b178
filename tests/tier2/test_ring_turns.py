"""scripts/ring_turns.py, the measurement behind the host model's cold turn (docs/SIM.md,
"Calibration"): a ring of real loops passes one token; it prints a turn's CPU and wall time
per hop for each size, and refuses bad arguments in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ring_turns.py"


def test_a_short_ring_reports_each_size() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "2,3", "--hops", "300", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["hops"] == 300 and [r["processes"] for r in doc["rings"]] == [2, 3]
    for r in doc["rings"]:
        # every hop is a wake-up and a handler: CPU and wall time, neither zero
        assert r["cpu_us_per_hop"] > 0 and r["wall_us_per_hop"] > 0


@pytest.mark.parametrize("sizes", ["1", "4,x", ""])
def test_bad_sizes_are_one_line(sizes: str) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", sizes], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "sizes >= 2" in out.stderr.strip().splitlines()[-1]
