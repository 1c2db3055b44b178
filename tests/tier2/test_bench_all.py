"""`rdmasched bench all`: one run of every benchmark writes one JSON file with the date, the
machine, the commit and every figure, and the README's tables render from it (issue 7
item 14). Made small here; the figures themselves are not checked (never timed tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdmasched.bench import suite
from rdmasched.cli import build_parser

SMALL = {
    "latency": ["--rows", "c-shm-floor", "rdmasched-shm", "--iterations", "200", "--rounds", "2",
                "--warmup", "10"],
    "throughput": ["--messages", "5000", "--batch", "64"],
    "scheduler": ["--decisions", "2000"],
    "preempt": ["--preempts", "50"],
    "idle": ["--nodes", "2", "--seconds", "0.3"],
    "demo": ["--nodes", "2", "--exec-slots", "2", "--steps", "3"],
}  # fmt: skip


@pytest.mark.slow
def test_bench_all_writes_every_figure_with_date_machine_commit(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    doc = suite.run(build_parser(), str(out), extra=SMALL)
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(doc))
    assert saved["date"] and saved["commit"]["commit"]
    m = saved["machine"]
    assert m["cpu_model"] and m["nproc"] >= 1 and m["kernel"]
    assert set(saved["figures"]) == set(suite.BENCHES)
    f = saved["figures"]
    assert [r["name"] for r in f["latency"]["rows"]] == ["c-shm-floor", "rdmasched-shm"]
    assert f["latency"]["rows"][1]["p50_us"] > 0
    assert all(r["msgs_per_s"] > 0 for r in f["throughput"]["results"])
    assert f["scheduler"]["speedup"] > 0
    assert f["preempt"]["preempts"] == 50
    assert len(f["idle"]["cpu_pct_per_node"]) == 2
    assert f["demo"]["rdmasched"]["nodes"][0]["steps"] == 3
    assert saved["arguments"]["demo"]["steps"] == 3  # what each benchmark was run with
    table = suite.markdown(saved)
    assert saved["commit"]["commit"][:12] in table and "rdmasched-shm" in table
    assert "bench preempt" in table and "slot idle %" in table
