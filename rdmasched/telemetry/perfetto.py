"""Trace records -> a Perfetto trace (docs/TELEMETRY.md, "Perfetto").

``export(traces, path)`` writes the protobuf trace format with the ``perfetto`` package's
``TraceProtoBuilder`` (the ``telemetry`` extra). Per node: a process track ("node N") with

* one track per execution slot ("slot K"): a slice per task from its start to its complete
  or preempt;
* "decisions": an instant per decision that is not a start (queue, preempt, release, ...);
* "sent": an instant per message another node's event names as its cause (its send time);
* counter tracks "queued", "running" and "load" (permille of the slots).

Flow arrows follow the messages: DISPATCH -> the start (or queue) it caused (from the
sender's forward decision), SYNC_READY -> the release, PREEMPT -> the preemption (the
handler call). Every slice and instant carries the event's fields as debug annotations.

Times: a daemon's events are on its CLOCK_MONOTONIC; when every trace has an anchor they are
written on CLOCK_REALTIME (each node's own anchor), with a clock snapshot, so the trace
lines up with PyTorch profiler and NCCL traces. Without anchors (the simulator), as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rdmasched.limits import U64_MAX
from rdmasched.scheduler.events import Decision, Event
from rdmasched.telemetry.records import NodeTrace, TraceError

#: Perfetto's builtin clock ids (perfetto/trace/clock_snapshot.proto)
CLOCK_REALTIME = 1
CLOCK_MONOTONIC = 3
CLOCK_BOOTTIME = 6
_SEQ = 1  # trusted_packet_sequence_id of every packet


@dataclass
class _Out:
    """What export builds, before it is written: (ts, order, kind, args) per track event."""

    events: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)
    tracks: list[dict[str, Any]] = field(default_factory=list)
    n: int = 0

    def add(self, ts: int, **ev: Any) -> None:
        self.n += 1
        self.events.append((ts, self.n, ev))


def _name(ev: Event) -> str:
    if ev.group is not None:
        return f"sync {ev.group} step {ev.step}"
    who = f"task {ev.task_id}"
    return who if ev.origin is None or ev.origin == ev.node else f"{who}@{ev.origin}"


def _annotations(ev: Event) -> dict[str, Any]:
    return {k: v for k, v in ev.as_dict().items() if k not in ("t_ns",)}


Tracks = list[dict[str, Any]]
TrackEvents = list[tuple[int, int, dict[str, Any]]]


def build(traces: list[NodeTrace]) -> tuple[Tracks, TrackEvents, dict[str, int] | None]:
    """The tracks and track events of ``traces`` (the model ``export`` writes; tests may
    read it too). Returns (tracks, events sorted by time, the clock anchor used or None)."""
    if not traces:
        raise TraceError("no traces to export")
    anchored = all("anchor" in tr.head for tr in traces)
    out = _Out()
    uuid = iter(range(1, 1 << 62))
    shift: dict[int, int] = {}
    by_node: dict[int, dict[str, int]] = {}
    for tr in traces:
        a = tr.head.get("anchor") if anchored else None
        shift[tr.node] = int(a["realtime_ns"]) - int(a["monotonic_ns"]) if a else 0
        slots = int(tr.head.get("slots") or 0)
        slots = max([slots] + [(ev.slot or 0) + 1 for ev in tr.events if ev.slot is not None])
        proc = next(uuid)
        out.tracks.append({"uuid": proc, "pid": tr.node + 1, "name": f"node {tr.node}"})
        t = {"proc": proc}
        for k in range(slots):
            t[f"slot{k}"] = next(uuid)
            out.tracks.append({"uuid": t[f"slot{k}"], "parent": proc, "name": f"slot {k}"})
        for name in ("decisions", "sent"):
            t[name] = next(uuid)
            out.tracks.append({"uuid": t[name], "parent": proc, "name": name})
        for name in ("queued", "running", "load"):
            t[name] = next(uuid)
            out.tracks.append({"uuid": t[name], "parent": proc, "name": name, "counter": True})
        t["slots"] = slots
        by_node[tr.node] = t

    def ts(node: int, t_ns: int) -> int:
        return t_ns + shift.get(node, 0)

    # the forward decisions, to start DISPATCH flows from: (node, origin, task) -> events
    forwards: dict[tuple[int, int, int], list[Event]] = {}
    for tr in traces:
        for ev in tr.events:
            if ev.decision is Decision.FORWARD and ev.peer is not None:
                key = (tr.node, ev.origin if ev.origin is not None else tr.node, ev.task_id)
                forwards.setdefault(key, []).append(ev)
    flow_id = iter(range(1, 1 << 62))
    fwd_flow: dict[int, int] = {}  # id(forward event) -> the flow it starts
    recv_flow: dict[int, int] = {}  # id(start or queue event) -> the flow it ends
    for tr in traces:
        for ev in tr.events:
            if (
                ev.cause != "DISPATCH"
                or ev.cause_src is None
                or ev.decision not in (Decision.START, Decision.QUEUE)
            ):
                continue
            key = (ev.cause_src, ev.origin if ev.origin is not None else -1, ev.task_id)
            now = ts(tr.node, ev.t_ns)
            cands = [
                f
                for f in forwards.get(key, [])
                if f.peer == tr.node and ts(ev.cause_src, f.t_ns) <= now
            ]
            if cands and id(cands[-1]) not in fwd_flow:
                fid = fwd_flow[id(cands[-1])] = next(flow_id)
                recv_flow[id(ev)] = fid
    last_t = max((ev.t_ns + shift.get(tr.node, 0) for tr in traces for ev in tr.events), default=0)

    for tr in traces:
        t = by_node[tr.node]
        node = tr.node
        open_on: dict[int, Event] = {}  # slot -> the start whose slice is open
        slots = t["slots"]
        for ev in tr.events:
            now = ts(node, ev.t_ns)
            flows: list[int] = []
            c = ev.cause
            if id(ev) in recv_flow:
                flows.append(recv_flow[id(ev)])
            elif (
                ev.cause_sent_ns
                and ev.cause_src is not None
                and (
                    (c == "SYNC_READY" and ev.decision is Decision.RELEASE)
                    or (c == "PREEMPT" and ev.decision in (Decision.PREEMPT, Decision.CANCEL))
                )
            ):
                fid = next(flow_id)
                flows.append(fid)
                src = by_node.get(ev.cause_src)
                # the send, on the sender's track (or this node's, if it is not traced)
                out.add(
                    ts(ev.cause_src, ev.cause_sent_ns) if src else ev.cause_sent_ns,
                    track=(src or t)["sent"],
                    type="instant",
                    name=f"{c} -> node {node}",
                    flow=[fid],
                    args={"seq": ev.cause_seq, "to": node, "from": ev.cause_src},
                )
            if ev.decision is Decision.START and ev.slot is not None and ev.slot < slots:
                prev = open_on.pop(ev.slot, None)
                if prev is not None:  # its end fell out of the ring: close it here
                    out.add(now, track=t[f"slot{ev.slot}"], type="end")
                open_on[ev.slot] = ev
                out.add(
                    now,
                    track=t[f"slot{ev.slot}"],
                    type="begin",
                    name=_name(ev),
                    args=_annotations(ev),
                    end_flow=flows,
                )
            else:
                if ev.slot is not None and ev.decision in (
                    Decision.COMPLETE,
                    Decision.PREEMPT,
                ):
                    s = open_on.get(ev.slot)
                    if s is not None and s.task_id == ev.task_id and s.origin == ev.origin:
                        del open_on[ev.slot]
                        out.add(now, track=t[f"slot{ev.slot}"], type="end")
                if ev.decision is not Decision.COMPLETE or flows:
                    f_out = fwd_flow.get(id(ev)) if ev.decision is Decision.FORWARD else None
                    out.add(
                        now,
                        track=t["decisions"],
                        type="instant",
                        name=f"{ev.decision} {_name(ev)}",
                        args=_annotations(ev),
                        end_flow=flows,
                        flow=[f_out] if f_out else [],
                    )
            if ev.queued is not None and ev.running is not None:
                out.add(now, track=t["queued"], type="counter", value=ev.queued)
                out.add(now, track=t["running"], type="counter", value=ev.running)
                if slots:
                    load = (ev.queued + ev.running) * 1000 // slots
                    out.add(now, track=t["load"], type="counter", value=load)
        for slot in sorted(open_on):
            out.add(max(last_t, ts(node, open_on[slot].t_ns)), track=t[f"slot{slot}"], type="end")
    out.events.sort(key=lambda x: (x[0], x[1]))
    first = traces[0].head.get("anchor") if anchored else None
    return out.tracks, out.events, first


def _fill_args(te: Any, args: dict[str, Any]) -> None:
    for k, v in args.items():
        if v is None:
            continue
        a = te.debug_annotations.add()
        a.name = k
        if isinstance(v, bool):
            a.bool_value = v
        elif isinstance(v, int):
            if -(1 << 63) <= v < (1 << 63):
                a.int_value = v
            else:
                a.string_value = str(v)
        elif isinstance(v, float):
            a.double_value = v
        else:
            a.string_value = str(v) if not isinstance(v, list) else ",".join(map(str, v))


def export(traces: list[NodeTrace], path: str) -> dict[str, int]:
    """Write ``traces`` as a Perfetto protobuf trace to ``path``; counts of what it wrote."""
    try:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
        from perfetto.trace_builder.proto_builder import TraceProtoBuilder
    except ImportError:
        raise TraceError(
            "the perfetto package is needed to write a Perfetto trace: "
            "pip install 'rdmasched[telemetry]'"
        ) from None
    tracks, events, anchor = build(traces)
    b = TraceProtoBuilder()
    if anchor is not None:
        p = b.add_packet()
        p.trusted_packet_sequence_id = _SEQ
        for cid, key in (
            (CLOCK_BOOTTIME, "boottime_ns"),
            (CLOCK_REALTIME, "realtime_ns"),
            (CLOCK_MONOTONIC, "monotonic_ns"),
        ):
            if key in anchor:
                clk = p.clock_snapshot.clocks.add()
                clk.clock_id = cid
                clk.timestamp = int(anchor[key])
    for tk in tracks:
        p = b.add_packet()
        p.trusted_packet_sequence_id = _SEQ
        d = p.track_descriptor
        d.uuid = tk["uuid"]
        if "pid" in tk:
            d.process.pid = tk["pid"]
            d.process.process_name = tk["name"]
        else:
            d.parent_uuid = tk["parent"]
            d.name = tk["name"]
            if tk.get("counter"):
                d.counter.SetInParent()
    counts = {"tracks": len(tracks), "slices": 0, "instants": 0, "counters": 0, "flows": 0}
    kinds = {
        "begin": TrackEvent.TYPE_SLICE_BEGIN,
        "end": TrackEvent.TYPE_SLICE_END,
        "instant": TrackEvent.TYPE_INSTANT,
        "counter": TrackEvent.TYPE_COUNTER,
    }
    for t_ns, _, ev in events:
        p = b.add_packet()
        p.trusted_packet_sequence_id = _SEQ
        p.timestamp = min(max(0, t_ns), U64_MAX)  # a trace's times moved by its anchor
        if anchor is not None:
            p.timestamp_clock_id = CLOCK_REALTIME
        te = p.track_event
        te.type = kinds[ev["type"]]
        te.track_uuid = ev["track"]
        if ev["type"] == "counter":
            te.counter_value = int(ev["value"])
            counts["counters"] += 1
            continue
        if ev["type"] in ("begin", "instant"):
            te.name = ev["name"]
            _fill_args(te, ev.get("args", {}))
            counts["slices" if ev["type"] == "begin" else "instants"] += 1
        for f in ev.get("flow", []):
            te.flow_ids.append(f)
            counts["flows"] += 1
        for f in ev.get("end_flow", []):
            te.terminating_flow_ids.append(f)
    with open(path, "wb") as fh:
        fh.write(b.serialize())
    return counts


def export_dir(directories: Iterable[str], path: str, prefix: str = "") -> dict[str, int]:
    """``export`` of every trace file in ``directories``."""
    from rdmasched.telemetry.records import read_dir

    traces: list[NodeTrace] = []
    for d in directories:
        traces += read_dir(d, prefix)
    return export(traces, path)
