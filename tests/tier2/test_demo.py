"""`rdmasched demo` end to end (small): both modes run, the JSON has what it promises."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = {
    "slot_idle_pct",
    "step_time_ms",
    "preempt_reaction_p50_us",
    "preempt_reaction_p99_us",
    "msgs_per_s",
    "nodes",
}


@pytest.mark.slow
def test_demo_json_and_trace(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rdmasched.cli",
            "demo",
            "--nodes",
            "3",
            "--slots",
            "2",
            "--steps",
            "8",
            "--json",
            "--trace",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    res = json.loads(out.stdout)
    assert set(res) == {"rdmasched", "central"}
    for mode in res.values():
        assert set(mode) >= KEYS
        assert len(mode["nodes"]) == 3
        for n in mode["nodes"]:
            assert n["steps"] == 8
            assert 0 <= n["slot_idle_pct"] <= 100
            assert n["step_time_ms"] > 0
        assert mode["msgs_per_s"] > 0
    assert "node-steps" in out.stderr  # the progress bar
    # the decision events of every node, merged in time order, filterable by task
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "rdmasched-node0.jsonl" in files and "central-node0.jsonl" in files
    tr = subprocess.run(
        [sys.executable, "-m", "rdmasched.cli", "trace", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    events = [json.loads(line) for line in tr.stdout.splitlines()]
    assert events and all(e["t_ns"] <= f["t_ns"] for e, f in itertools.pairwise(events))
    assert {"start", "preempt", "release"} <= {e["decision"] for e in events}
    some = next(e["task_id"] for e in events if e["decision"] == "preempt")
    one = subprocess.run(
        [sys.executable, "-m", "rdmasched.cli", "trace", str(tmp_path), "--task", str(some)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(
        json.loads(line)["task_id"] == some or some in json.loads(line)["beaten"]
        for line in one.stdout.splitlines()
    )
