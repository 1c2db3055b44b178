"""Trace records and the Perfetto export (issue 11 items 1 and 3), on cores with no I/O."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from rdmasched import messages as msg
from rdmasched.cli import main
from rdmasched.scheduler import Decision, FakeClock, Scheduler
from rdmasched.telemetry import records
from rdmasched.telemetry.records import TraceError
from tests.corenet import MS, Cluster, task
from tests.telemetry_deps import need

perfetto_pb2 = need("perfetto.protos.perfetto.trace.perfetto_trace_pb2")


PREEMPT_SENT = 10_002 * MS - 1000  # the trigger stamp of the PREEMPT 2 -> 1


def run_cluster() -> Cluster:
    """Three cores: a DISPATCH 0 -> 1, a PREEMPT 2 -> 1, and a sync step of all three."""
    c = Cluster(3, slots=2)
    c.do(0, c.cores[0].dispatch_to(1, task(7, 0, priority=10), c.now))
    c.deliver()  # node 1 starts task 7 (of node 0)
    c.now += 1 * MS
    c.do(1, c.cores[1].dispatch(task(8, 1, priority=20), c.now))
    c.now += 1 * MS
    assert c.now - 1000 == PREEMPT_SENT
    c.wire.append((2, 1, msg.Preempt(8, 1, trigger_ns=PREEMPT_SENT)))
    c.deliver()  # node 1 preempts its task 8 (and requeues it: slot free, it starts again)
    for n in range(3):
        c.do(n, c.cores[n].define_group(5, frozenset(range(3)), c.now))
    for n in range(3):
        c.now += 1 * MS
        c.do(n, c.cores[n].sync_ready(5, 0, c.now))
    c.deliver()  # every node releases step 0
    c.now += 1 * MS
    c.do(1, c.cores[1].complete(7, 0, 1000, c.now))
    c.deliver()
    return c


def write_traces(c: Cluster, directory: str, anchored: bool = False) -> None:
    for n, core in c.cores.items():
        s = core.scheduler
        head = records.header(
            n,
            slots=s.nslots,
            events=s.stats().events_capacity,
            recorded=s.stats().events_recorded,
            dropped=s.stats().events_dropped,
            clock="monotonic" if anchored else "sim",
            anchor_ns={"monotonic_ns": 0, "realtime_ns": 5 * 10**18} if anchored else None,
        )
        records.write(os.path.join(directory, f"rdmasched-node{n}.jsonl"), head, s.events())


def decode(path: str) -> Any:
    trace = perfetto_pb2.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    return trace


def tracks_of(trace: Any) -> dict[int, tuple[str, int]]:
    """uuid -> (name, parent uuid) of every track; a process track by its process name."""
    out = {}
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            name = d.process.process_name if d.HasField("process") else d.name
            out[d.uuid] = (name, d.parent_uuid)
    return out


def test_decisions_from_messages_record_the_message() -> None:
    c = run_cluster()
    start7 = next(e for e in c.cores[1].scheduler.events() if e.task_id == 7)
    assert start7.decision is Decision.START and start7.origin == 0
    assert (start7.cause, start7.cause_src) == ("DISPATCH", 0)
    pre = next(e for e in c.cores[1].scheduler.events() if e.decision is Decision.PREEMPT)
    assert (pre.cause, pre.cause_src, pre.task_id, pre.rule) == ("PREEMPT", 2, 8, "peer")
    assert pre.cause_sent_ns == PREEMPT_SENT and pre.slot is not None
    rel = [e for e in c.cores[0].scheduler.events() if e.decision is Decision.RELEASE]
    assert len(rel) == 1 and rel[0].cause == "SYNC_READY" and rel[0].step == 0
    assert rel[0].cause_sent_ns > 0 and rel[0].cause_src in (1, 2)
    # a local call after a message records no cause
    done = c.cores[1].scheduler.events()[-1]
    assert done.decision is Decision.COMPLETE and done.cause is None


def test_trace_records_round_trip(tmp_path: Any) -> None:
    c = run_cluster()
    write_traces(c, str(tmp_path))
    traces = records.read_dir(str(tmp_path))
    assert [t.node for t in traces] == [0, 1, 2]
    assert traces[1].events == c.cores[1].scheduler.events()
    assert traces[1].head["slots"] == 2 and traces[1].head["clock"] == "sim"


def test_export_has_slot_tracks_slices_counters_and_flows(tmp_path: Any) -> None:
    c = run_cluster()
    write_traces(c, str(tmp_path))
    out = str(tmp_path / "t.pftrace")
    assert main(["trace", "export", str(tmp_path), "-o", out]) == 0
    trace = decode(out)
    tracks = tracks_of(trace)
    procs = {u: name for u, (name, parent) in tracks.items() if not parent}
    assert sorted(procs.values()) == ["node 0", "node 1", "node 2"]
    node1 = next(u for u, n in procs.items() if n == "node 1")
    children = {name: u for u, (name, parent) in tracks.items() if parent == node1}
    assert {"slot 0", "slot 1", "decisions", "sent", "queued", "running", "load"} <= set(children)
    evs = [p for p in trace.packet if p.HasField("track_event")]
    te = perfetto_pb2.TrackEvent
    begins = [p.track_event for p in evs if p.track_event.type == te.TYPE_SLICE_BEGIN]
    ends = [p.track_event for p in evs if p.track_event.type == te.TYPE_SLICE_END]
    slot_tracks = {children["slot 0"], children["slot 1"]}
    on_node1 = [b.name for b in begins if b.track_uuid in slot_tracks]
    # task 7 (of node 0) twice (the sync task preempted it), task 8 twice (the PREEMPT),
    # the sync task
    assert on_node1.count("task 7@0") == 2 and on_node1.count("task 8") == 2
    assert "sync 5 step 0" in on_node1
    assert len(ends) == len(begins)  # every slice is closed
    counters = [p.track_event for p in evs if p.track_event.type == te.TYPE_COUNTER]
    assert any(x.track_uuid == children["queued"] for x in counters)
    assert any(x.track_uuid == children["load"] for x in counters)
    # flows: DISPATCH (forward on node 0 -> start on node 1), PREEMPT, SYNC_READY x3
    starts = {f for p in evs for f in p.track_event.flow_ids}
    ends_f = {f for p in evs for f in p.track_event.terminating_flow_ids}
    assert starts == ends_f and len(starts) == 5
    by_flow = {}
    for p in evs:
        for f in p.track_event.terminating_flow_ids:
            by_flow[f] = p.track_event.name
    names = sorted(by_flow.values())
    assert names.count("release sync 5 step 0") == 3
    assert "task 7@0" in names and "preempt task 8" in names
    # the DISPATCH flow starts at node 0's forward decision
    fwd = [p.track_event for p in evs if p.track_event.name == "forward task 7"]
    assert len(fwd) == 1 and list(fwd[0].flow_ids)
    assert by_flow[fwd[0].flow_ids[0]] == "task 7@0"


def test_anchored_traces_are_written_on_the_realtime_clock(tmp_path: Any) -> None:
    c = run_cluster()
    write_traces(c, str(tmp_path), anchored=True)
    out = str(tmp_path / "t.pftrace")
    assert main(["trace", "export", str(tmp_path), "-o", out]) == 0
    trace = decode(out)
    snap = [p.clock_snapshot for p in trace.packet if p.HasField("clock_snapshot")]
    assert len(snap) == 1
    assert {(x.clock_id, x.timestamp) for x in snap[0].clocks} == {(1, 5 * 10**18), (3, 0)}
    evs = [p for p in trace.packet if p.HasField("track_event")]
    assert all(p.timestamp_clock_id == 1 and p.timestamp >= 5 * 10**18 for p in evs)


def test_export_shows_what_wrapped_rings_lost(tmp_path: Any, capsys: Any) -> None:
    s = Scheduler(1, clock=FakeClock(0), starvation_us=10, events=4)
    for i in range(1, 8):
        s.dispatch(task(i, 0))
    st = s.stats()
    assert st.events_dropped == 3
    head = records.header(
        0, slots=1, events=4, recorded=st.events_recorded, dropped=st.events_dropped
    )
    records.write(str(tmp_path / "rdmasched-node0.jsonl"), head, s.events())
    assert main(["trace", "export", str(tmp_path), "-o", str(tmp_path / "t.pftrace")]) == 0
    assert "events lost to a wrapped ring" in capsys.readouterr().out


def test_export_reads_old_demo_traces_without_a_header(tmp_path: Any) -> None:
    lines = [
        {"t_ns": 10, "decision": "start", "task_id": 1, "reason": "free slot", "beaten": []},
        {"t_ns": 30, "decision": "complete", "task_id": 1, "reason": "completed", "beaten": []},
    ]
    (tmp_path / "rdmasched-node3.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = str(tmp_path / "t.pftrace")
    assert main(["trace", "export", str(tmp_path), "-o", out]) == 0
    procs = [n for n, parent in tracks_of(decode(out)).values() if not parent]
    assert procs == ["node 3"]


def test_export_refuses_what_is_not_a_trace(tmp_path: Any, capsys: Any) -> None:
    (tmp_path / "x.jsonl").write_text('{"t_ns": 1}\n')
    assert main(["trace", "export", str(tmp_path), "-o", str(tmp_path / "o")]) == 1
    assert "not a trace event" in capsys.readouterr().err
    with pytest.raises(TraceError):
        records.read_dir(str(tmp_path / "nowhere"))
    (tmp_path / "x.jsonl").unlink()
    (tmp_path / "central-node0.jsonl").write_text("")
    (tmp_path / "rdmasched-node0.jsonl").write_text("")
    assert main(["trace", "export", str(tmp_path), "-o", str(tmp_path / "o")]) == 1
    assert "--prefix" in capsys.readouterr().err
    assert main(["trace", "export", str(tmp_path), "--prefix", "rdmasched-", "-o",
                 str(tmp_path / "o")]) == 0  # fmt: skip


def test_trace_prints_files_with_a_header(tmp_path: Any, capsys: Any) -> None:
    c = run_cluster()
    write_traces(c, str(tmp_path))
    assert main(["trace", str(tmp_path), "--task", "7"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines and all(x["task_id"] == 7 or 7 in x["beaten"] for x in lines)
    assert {x["source"] for x in lines} >= {"rdmasched-node0", "rdmasched-node1"}


def test_a_simulation_writes_traces_that_trace_export_and_mirror_open(
    tmp_path: Any, capsys: Any
) -> None:
    from rdmasched.views import mirror

    d = str(tmp_path / "sim")
    argv = ["sim", "--sizes", "4", "--schedulers", "rdmasched", "--steps", "3"]
    assert main([*argv, "--exec-slots", "2", "--trace", d]) == 0
    assert f"trace: {d} (rdmasched at 4 nodes)" in capsys.readouterr().out
    traces = records.read_dir(d)
    assert [t.node for t in traces] == [0, 1, 2, 3]
    for t in traces:
        assert (t.head["clock"], t.head["source"], t.head["slots"]) == ("sim", "sim", 2)
        assert t.head["dropped"] == 0 and len(t.events) == t.head["recorded"] > 0
        assert [e.seq for e in t.events] == list(range(len(t.events)))
        assert all(e.node == t.node for e in t.events)
    # every node released every step of the job's sync group: on a SYNC_READY, or (the node
    # that counts the readiness) on its own report
    rel = [(t.node, e) for t in traces for e in t.events if e.decision is Decision.RELEASE]
    assert sorted((n, e.step) for n, e in rel) == [(n, s) for n in range(4) for s in range(3)]
    assert {e.cause for _, e in rel} == {"SYNC_READY", None}
    assert sum(e.cause == "SYNC_READY" and e.cause_sent_ns > 0 for _, e in rel) >= 3
    # `rdmasched trace DIR` prints them, merged
    assert main(["trace", d]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == sum(len(t.events) for t in traces)
    # Perfetto: a process per node, its slot tracks, and the SYNC_READY flows to the releases
    out = str(tmp_path / "sim.pftrace")
    assert main(["trace", "export", d, "-o", out]) == 0
    trace = decode(out)
    tracks = tracks_of(trace)
    procs = {u: name for u, (name, parent) in tracks.items() if not parent}
    assert sorted(procs.values()) == [f"node {n}" for n in range(4)]
    for u in procs:
        kids = {name for name, parent in tracks.values() if parent == u}
        assert {"slot 0", "slot 1", "decisions", "queued", "running", "load"} <= kids
    evs = [p.track_event for p in trace.packet if p.HasField("track_event")]
    starts = {f for e in evs for f in e.flow_ids}
    ends = {f for e in evs for f in e.terminating_flow_ids}
    assert starts and starts == ends
    released = [e.name for e in evs if e.terminating_flow_ids]
    assert sum(name.startswith("release sync 1 step") for name in released) >= 4
    # the mirror replays it: its state and a task's story, as its endpoints serve them
    src = mirror.TraceSource([d])
    end = src.state(None)
    assert [n["node"] for n in end["nodes"]] == [0, 1, 2, 3]
    assert end["groups"][0]["step"] == 2
    assert end["groups"][0]["nodes"] == {str(n): 2 for n in range(4)}
    assert end["events"] == end["total"] == sum(len(t.events) for t in traces)
    for at in (0.25, 0.5, 0.75):
        for n in src.state(at)["nodes"]:
            assert sum(x is not None for x in n["slots"]) == n["running"]
            assert len(n["queue"]) == n["queued"]
    srv = mirror.MirrorServer(src, 0)
    try:
        import urllib.request

        with urllib.request.urlopen(srv.url + "state?at=0.5", timeout=30) as r:
            state = json.loads(r.read())
        assert state["source"] == "trace" and len(state["nodes"]) == 4 and state["decisions"]
    finally:
        srv.close()


def test_sim_trace_refuses_rings_that_would_not_fit(tmp_path: Any, capsys: Any) -> None:
    argv = ["sim", "--sizes", "100000", "--schedulers", "rdmasched", "--trace", str(tmp_path)]
    assert main(argv) == 1  # an ArgumentError: one line, no traceback
    err = capsys.readouterr().err
    assert "100000 nodes x 4096 events" in err and "--trace-events 178" in err
    assert os.listdir(tmp_path) == []  # nothing run, nothing written
