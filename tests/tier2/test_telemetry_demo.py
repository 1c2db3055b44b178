"""`rdmasched trace export` of a demo run's trace directory (issue 11 item 3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.telemetry_deps import need

pb2 = need("perfetto.protos.perfetto.trace.perfetto_trace_pb2")


@pytest.mark.slow
def test_a_demo_run_exports_to_perfetto(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "rdmasched.cli"]
    subprocess.run(
        [
            *cli,
            "demo",
            "--nodes",
            "2",
            "--exec-slots",
            "2",
            "--steps",
            "4",
            "--json",
            "--trace",
            str(tmp_path / "tr"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = tmp_path / "demo.pftrace"
    r = subprocess.run(
        [*cli, "trace", "export", str(tmp_path / "tr"), "--prefix", "rdmasched-", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "2 nodes" in r.stdout
    trace = pb2.Trace()
    trace.ParseFromString(out.read_bytes())
    tracks = {
        p.track_descriptor.uuid: p.track_descriptor
        for p in trace.packet
        if p.HasField("track_descriptor")
    }
    procs = sorted(d.process.process_name for d in tracks.values() if d.HasField("process"))
    assert procs == ["node 0", "node 1"]
    slot_tracks = {u for u, d in tracks.items() if d.name.startswith("slot ")}
    assert len(slot_tracks) == 4
    te = pb2.TrackEvent
    evs = [p.track_event for p in trace.packet if p.HasField("track_event")]
    slices = [e for e in evs if e.type == te.TYPE_SLICE_BEGIN and e.track_uuid in slot_tracks]
    assert any(e.name.startswith("sync ") for e in slices)
    assert any(e.name.startswith("task ") for e in slices)
    # every step's release on a node was caused by the other node's SYNC_READY (or its own)
    released = [e for e in evs if e.name.startswith("release ")]
    assert released and any(list(e.terminating_flow_ids) for e in released)
    starts = {f for e in evs for f in e.flow_ids}
    assert starts and starts == {f for e in evs for f in e.terminating_flow_ids}
