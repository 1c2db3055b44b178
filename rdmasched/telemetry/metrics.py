"""Prometheus metrics of a node daemon (docs/TELEMETRY.md, "Metrics").

Off by default: whoever starts a node serves them, ``rdmasched.launch.serve_metrics(node,
9464)`` (the server stops with the node; ``serve(node, port)`` is one not tied to it). It is
an HTTP server on that port (0: any free port, see ``MetricsServer.port``) that answers

* ``/metrics``: the Prometheus text format (needs ``prometheus-client``, the ``telemetry``
  extra);
* ``/events?since=SEQ``: the node's decision events numbered SEQ and after, as trace records
  (JSON lines, a header first: docs/TELEMETRY.md), for live readers;
* ``/why?task=ID`` (``&origin=N``): the ranked reasons the tasks with that id held here
  have not started (docs/SCHEDULER.md, "Why is it waiting"), as JSON, for ``rdmasched why``.

Nothing is measured on the hot path for it: a scrape reads the node's counters, and the
events recorded since the previous scrape (the decision ring), on the node's loop thread.
Histograms are fed from those events; what the ring overwrote between two scrapes is counted
in ``rdmasched_events_lost_total`` and missing from the histograms.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from rdmasched.limits import COMPUTE_PRIORITY_MAX, U64_MAX
from rdmasched.scheduler.events import Decision
from rdmasched.scheduler.task import SYNC_PRIORITY
from rdmasched.telemetry import http
from rdmasched.telemetry.records import anchor, header
from rdmasched.wire import Kind

if TYPE_CHECKING:
    from rdmasched.daemon.node import Node
    from rdmasched.scheduler.core import Scheduler

#: upper bounds of the histogram buckets, seconds (wait time, preemption reaction)
TIME_BUCKETS = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
    1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: upper bounds of the queue depth histogram's buckets, tasks
DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


def priority_class(priority: int) -> str:
    """The label of a priority class: "sync" (255), else a band of 32 levels ("96-127")."""
    if priority == SYNC_PRIORITY:
        return "sync"
    lo = priority // 32 * 32
    return f"{lo}-{min(lo + 31, COMPUTE_PRIORITY_MAX)}"


CLASSES = tuple(dict.fromkeys(priority_class(p) for p in range(256)))


class _Hist:
    """A cumulative histogram kept between scrapes (sum and counts per bucket)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.bounds):
            if v <= b:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += v

    def buckets(self) -> list[tuple[str, float]]:
        out = []
        acc = 0
        for b, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((repr(float(b)), float(acc)))
        out.append(("+Inf", float(acc + self.counts[-1])))
        return out


class NodeCollector:
    """A prometheus-client collector for one ``Node``: every scrape reads it on its loop."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._lock = threading.Lock()
        self._seq = 0
        self._lost = 0
        self._reactions = 0
        self.wait = {c: _Hist(TIME_BUCKETS) for c in CLASSES}
        self.depth = _Hist(DEPTH_BUCKETS)
        self.reaction = _Hist(TIME_BUCKETS)

    def _snapshot(self) -> dict[str, Any]:
        """What a scrape reports, read on the node's loop (so consistent with its calls)."""
        node = self.node

        def read(n: Node) -> dict[str, Any]:
            sched = n.scheduler
            evs, missed = sched.events_since(self._seq)
            queued: dict[str, int] = dict.fromkeys(CLASSES, 0)
            for t in sched.queued():
                queued[priority_class(t.priority)] += 1
            loop = n.loop
            lanes: dict[int, float] = {}
            if loop is not None:
                for peer, lane in getattr(loop.links, "outbound", {}).items():
                    st = lane.stats()
                    lanes[peer] = (st["tail"] - st["head"]) / lane.nslots
            r = n.reactions
            new = r.samples[self._reactions : r.count] if r.count <= r.keep else []
            return {
                "stats": n.stats(),
                "by_rule": sched.decisions_by_rule(),
                "events": evs,
                "missed": missed,
                "queued": queued,
                "waiting": sched.waiting_counts(),
                "lanes": lanes,
                "alive": sum(1 for p, v in n.members.views.items() if v.alive and p != n.id),
                "peers": sum(1 for p in n.members.views if p != n.id),
                "reactions": new,
                "reaction_count": r.count,
                "received": dict(n.core.received),
                "sent": dict(loop.sent_kinds) if loop is not None else {},
            }

        return node.inspect(read)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        with self._lock:  # scrapes in turn: the histograms are fed once per event
            snap = self._snapshot()
            for ev in snap["events"]:
                if ev.queued is not None:
                    self.depth.observe(ev.queued)
                if ev.decision is Decision.START and ev.wait_ns is not None:
                    self.wait[priority_class(ev.priority or 0)].observe(ev.wait_ns / 1e9)
            if snap["events"]:
                self._seq = (snap["events"][-1].seq or 0) + 1
            self._lost += snap["missed"]
            for ns in snap["reactions"]:
                self.reaction.observe(ns / 1e9)
            self._reactions = snap["reaction_count"]
            node = str(self.node.id)
            st = snap["stats"]
            sched = st["scheduler"]

            m = CounterMetricFamily(
                "rdmasched_messages",
                "control messages by kind and direction",
                labels=["node", "direction", "kind"],
            )
            for direction in ("received", "sent"):
                for kind, n in sorted(snap[direction].items()):
                    m.add_metric([node, direction, _kind_name(kind)], n)
            yield m

            m = CounterMetricFamily(
                "rdmasched_bad_slots",
                "slots the lanes skipped, by reason (docs/PROTOCOL.md)",
                labels=["node", "reason"],
            )
            for reason, n in sorted(st["bad_slots"].items()):
                m.add_metric([node, reason], n)
            yield m

            m = CounterMetricFamily(
                "rdmasched_decisions",
                "decision events by decision and the rule that decided (docs/TELEMETRY.md)",
                labels=["node", "decision", "rule"],
            )
            for (decision, rule), n in sorted(snap["by_rule"].items()):
                m.add_metric([node, decision, rule], n)
            yield m

            m = CounterMetricFamily(
                "rdmasched_rejected", "inputs refused, by reason", labels=["node", "reason"]
            )
            for reason, n in sorted(st["rejected"].items()):
                m.add_metric([node, reason], n)
            yield m

            g = GaugeMetricFamily(
                "rdmasched_queue_depth",
                "tasks queued now, by priority class",
                labels=["node", "priority_class"],
            )
            for cls, n in snap["queued"].items():
                g.add_metric([node, cls], n)
            yield g

            g = GaugeMetricFamily(
                "rdmasched_tasks_waiting",
                "queued tasks by the reason they have not started (a task counts under each "
                "of its reasons: docs/SCHEDULER.md)",
                labels=["node", "reason"],
            )
            for reason, n in snap["waiting"].items():
                g.add_metric([node, reason], n)
            yield g

            g = GaugeMetricFamily("rdmasched_running", "tasks running now", labels=["node"])
            g.add_metric([node], sched["running"])
            yield g
            g = GaugeMetricFamily(
                "rdmasched_load_hint", "the load hint sent to peers (permille)", labels=["node"]
            )
            g.add_metric([node], sched["load_hint"])
            yield g

            h = HistogramMetricFamily(
                "rdmasched_queue_depth_at_decision",
                "tasks queued just after each decision",
                labels=["node"],
            )
            h.add_metric([node], self.depth.buckets(), self.depth.sum)
            yield h

            h = HistogramMetricFamily(
                "rdmasched_wait_seconds",
                "time a task waited in the queue before it started, by priority class",
                labels=["node", "priority_class"],
            )
            for cls, hist in self.wait.items():
                h.add_metric([node, cls], hist.buckets(), hist.sum)
            yield h

            h = HistogramMetricFamily(
                "rdmasched_preempt_reaction_seconds",
                "PREEMPT trigger stamp -> preempt handler entered",
                labels=["node"],
            )
            h.add_metric([node], self.reaction.buckets(), self.reaction.sum)
            yield h

            g = GaugeMetricFamily(
                "rdmasched_lane_occupancy",
                "fraction of each outbound lane written and not yet credited back",
                labels=["node", "peer"],
            )
            for peer, occ in sorted(snap["lanes"].items()):
                g.add_metric([node, str(peer)], occ)
            yield g

            g = GaugeMetricFamily(
                "rdmasched_peers_alive", "peers this node counts as alive", labels=["node"]
            )
            g.add_metric([node], snap["alive"])
            yield g
            g = GaugeMetricFamily("rdmasched_peers", "peers this node knows of", labels=["node"])
            g.add_metric([node], snap["peers"])
            yield g

            c = CounterMetricFamily(
                "rdmasched_events",
                "decision events recorded in the ring",
                labels=["node"],
            )
            c.add_metric([node], sched["events_recorded"])
            yield c
            c = CounterMetricFamily(
                "rdmasched_events_dropped",
                "decision events overwritten in the ring (the ring wrapped)",
                labels=["node"],
            )
            c.add_metric([node], sched["events_dropped"])
            yield c
            c = CounterMetricFamily(
                "rdmasched_events_lost",
                "events the ring overwrote before a scrape read them (missing from histograms)",
                labels=["node"],
            )
            c.add_metric([node], self._lost)
            yield c


def _kind_name(kind: int) -> str:
    try:
        return Kind(kind).name
    except ValueError:
        return str(kind)


class MetricsServer:
    """The HTTP server of one node's metrics and live events; ``close()`` stops it."""

    def __init__(self, node: Node, port: int, addr: str = "127.0.0.1") -> None:
        self.node = node
        self.collector = NodeCollector(node)
        registry = None
        try:
            from prometheus_client import CollectorRegistry

            registry = CollectorRegistry(auto_describe=False)
            registry.register(self.collector)
        except ImportError:  # /events still works; /metrics says what is missing
            pass
        self.registry = registry
        server = self

        class Handler(http.Handler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/metrics":
                    server._metrics(self)
                elif url.path == "/events":
                    server._events(self, parse_qs(url.query))
                elif url.path == "/why":
                    server._why(self, parse_qs(url.query))
                else:
                    self.send_error(404, "try /metrics, /events?since=SEQ or /why?task=ID")

        self.httpd = http.Server(addr, port, Handler, "metrics")
        self.port: int = self.httpd.port

    def _metrics(self, h: BaseHTTPRequestHandler) -> None:
        if self.registry is None:
            h.send_error(
                501, "prometheus-client is not installed (pip install rdmasched[telemetry])"
            )
            return
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        try:
            body = generate_latest(self.registry)
        except Exception as exc:  # the node stopped, or failed: say so, do not hang
            h.send_error(503, f"node {self.node.id}: {exc}")
            return
        h.send_response(200)
        h.send_header("Content-Type", CONTENT_TYPE_LATEST)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _events(self, h: BaseHTTPRequestHandler, q: dict[str, list[str]]) -> None:
        try:
            since = int(q.get("since", ["0"])[0])
        except ValueError:
            h.send_error(400, "since must be an integer (an event seq)")
            return
        node = self.node
        try:
            evs, missed, st = node.inspect(
                lambda n: (*n.scheduler.events_since(since), n.scheduler.stats())
            )
        except Exception as exc:
            h.send_error(503, f"node {node.id}: {exc}")
            return
        head = header(
            node.id,
            slots=node.scheduler.nslots,
            events=st.events_capacity,
            recorded=st.events_recorded,
            dropped=st.events_dropped,
            anchor_ns=anchor(),
        )
        head["missed"] = missed
        lines = [json.dumps(head)] + [json.dumps(e.as_dict()) for e in evs]
        body = ("\n".join(lines) + "\n").encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/x-ndjson")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _why(self, h: BaseHTTPRequestHandler, q: dict[str, list[str]]) -> None:
        try:
            task_id = int(q["task"][0])
            origin = int(q["origin"][0]) if "origin" in q else None
            if not 0 <= task_id <= U64_MAX or (origin is not None and origin < 0):
                raise ValueError
        except (KeyError, ValueError):
            h.send_error(400, "task must be a task id (a u64), origin a node id")
            return
        node = self.node
        try:
            tasks = node.inspect(lambda n: waiting_of(n.scheduler, task_id, origin))
        except Exception as exc:
            h.send_error(503, f"node {node.id}: {exc}")
            return
        body = (json.dumps({"node": node.id, "task_id": task_id, "tasks": tasks}) + "\n").encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def close(self) -> None:
        self.httpd.close()


def waiting_of(sched: Scheduler, task_id: int, origin: int | None) -> list[dict[str, Any]]:
    """The tasks ``task_id`` (of ``origin``; None: of any origin) held by ``sched``, each
    with its state and the ranked reasons it waits (``Scheduler.why``): ``/why``'s answer."""
    found = sched.find(task_id) if origin is None else [sched.lookup(task_id, origin)]
    out = []
    for t in found:
        if t is None:
            continue
        out.append(
            {
                "task_id": t.id,
                "origin": t.origin,
                "job": t.job,
                "priority": t.priority,
                "state": t.state.name.lower(),
                "slot": t.slot,
                "reasons": [r.as_dict() for r in sched.why(t.id, t.origin)],
            }
        )
    return out


def serve(node: Node, port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve ``node``'s metrics and live events on ``addr``:``port`` (0: a free port)."""
    return MetricsServer(node, port, addr)
