"""Prometheus metrics of a node daemon, its live events and its probes (docs/TELEMETRY.md,
"Metrics"; docs/DAEMON.md, "Running in production").

Off by default: whoever starts a node serves them, ``rdmasched.launch.serve_metrics(node,
9464)`` (the server stops with the node; ``serve(node, port)`` is one not tied to it), and
``rdmasched daemon --metrics-port 9464``. It is an HTTP server on that port (0: any free
port, see ``MetricsServer.port``) that answers

* ``/metrics``: the Prometheus text format (needs ``prometheus-client``, the ``telemetry``
  extra);
* ``/events?since=SEQ``: the node's decision events numbered SEQ and after, as trace records
  (JSON lines, a header first: docs/TELEMETRY.md), for live readers;
* ``/why?task=ID`` (``&origin=N``): the ranked reasons the tasks with that id held here
  have not started (docs/SCHEDULER.md, "Why is it waiting"), as JSON, for ``rdmasched why``;
* ``/healthz``: 200 while the node's loop runs and last listened to its lanes less than
  ``HEALTH_STALE_S`` ago, else 503 and why, in one line (``health``);
* ``/readyz``: 200 once the node has joined its cluster (its loop runs and every peer it
  has a lane to was heard from, or declared dead) and serves its clients (its hub is open),
  else 503 and why, in one line (``readiness``).

Given a bearer token (``token``) the first three need it (``Authorization: Bearer <token>``,
else 401); the probes never do (a kubelet probes them), and tell nothing but the line.

Nothing is measured on the hot path for it: a scrape reads the node's counters, and the
events recorded since the previous scrape (the decision ring), on the node's loop thread.
Histograms are fed from those events; what the ring overwrote between two scrapes is counted
in ``rdmasched_events_lost_total`` and missing from the histograms.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from rdmasched.limits import COMPUTE_PRIORITY_MAX, U64_MAX
from rdmasched.scheduler import gang
from rdmasched.scheduler.events import Decision
from rdmasched.scheduler.task import SYNC_PRIORITY
from rdmasched.telemetry import http
from rdmasched.telemetry.records import anchor, header
from rdmasched.wire import Kind

if TYPE_CHECKING:
    from rdmasched.daemon.node import Node

#: upper bounds of the histogram buckets, seconds (wait time, preemption reaction)
TIME_BUCKETS = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
    1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: upper bounds of the queue depth histogram's buckets, tasks
DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
#: /healthz fails once the node's loop has not listened to its lanes for this long, s. The
#: loop listens at least every 100 ms when idle (its idle wake-up) and after every batch; a
#: loop silent for 5 s is wedged (a handler that never returns, a deadlock): ten times the
#: default dead_after_ms, past which its peers have long declared it dead, and short beside
#: a kubelet's probe period (10 s)
HEALTH_STALE_S = 5.0
#: how long /readyz waits for the node's loop to answer, s (a wedged loop: not ready)
READY_ASK_S = 2.0
#: the paths served without the bearer token: the kubelet's probes
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
#: load hints are per mille (docs/SCHEDULER.md, load_hint()); the metric is a ratio
_PER_MILLE = 1000.0


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


@functools.cache
def build_commit() -> str:
    """The git commit rdmasched runs from (12 hex digits, "-dirty" with local changes), when
    its package directory is in a git work tree; else "unknown" (an installed wheel)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        run = functools.partial(
            subprocess.run, cwd=here, capture_output=True, text=True, timeout=5, check=True
        )
        commit = run(["git", "rev-parse", "--short=12", "HEAD"]).stdout.strip()
        dirty = run(["git", "status", "--porcelain", "--untracked-files=no", "."]).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty.strip() else "") if commit else "unknown"


def health(node: Node) -> tuple[bool, str]:
    """/healthz: whether `node`'s loop is alive, and a line saying so or why not. Alive: it
    runs (a thread is in it), has not failed, and listened to its lanes within
    HEALTH_STALE_S. Read without asking the loop (a wedged loop would not answer)."""
    loop = node.loop
    if node.error is not None:
        return False, f"node {node.id}: the loop failed: {node.error!r}"
    if loop is None or not loop.running:
        return False, f"node {node.id}: the loop is not running (joining the cluster, or stopped)"
    age_s = (node.clock() - loop.listened_ns) / 1e9
    if age_s > HEALTH_STALE_S:
        return False, (
            f"node {node.id}: the loop last listened to its lanes {age_s:.1f} s ago "
            f"(bound {HEALTH_STALE_S:g} s): it is stuck"
        )
    return True, f"ok: node {node.id}'s loop listened {age_s * 1e3:.0f} ms ago"


def readiness(node: Node) -> tuple[bool, str]:
    """/readyz: whether `node` has joined its cluster and serves its clients, and a line
    saying so or why not: its loop is alive (`health`), every peer it has a lane to was
    heard from (a heartbeat of its incarnation) or is declared dead, and its client hub is
    open (`rdmasched.launch.serve`)."""
    ok, why = health(node)
    if not ok:
        return False, why

    def unheard(n: Node) -> list[int]:
        return sorted(p for p, v in n.members.views.items() if v.alive and v.inc == 0)

    try:
        waiting = node.inspect(unheard, READY_ASK_S)
    except Exception as exc:  # the loop failed or did not answer: not ready, and why
        return False, f"node {node.id}: {exc}"
    if waiting:
        shown = ", ".join(map(str, waiting[:8])) + (", ..." if len(waiting) > 8 else "")
        return False, f"node {node.id}: joining: no heartbeat yet from peers {shown}"
    if node.hub is None:
        return False, f"node {node.id}: joined, not serving clients yet (no client hub)"
    return True, f"ready: node {node.id} joined, serving clients at {node.hub.endpoint}"


class NodeCollector:
    """A prometheus-client collector for one ``Node``: every scrape reads it on its loop."""

    def __init__(self, node: Node) -> None:
        self.node = node
        from rdmasched import __version__

        self.version = __version__
        self.commit = build_commit()
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
            hub = n.hub
            owner = hub.owner if hub is not None else {}
            by_rank: Counter[int] = Counter()
            for t in sched.queued():
                queued[priority_class(t.priority)] += 1
                k = owner.get(t.id) if t.origin == n.id else None
                if k is not None:
                    by_rank[k] += 1
            ranks = None
            if hub is not None:
                ranks = {
                    "max": hub.max_clients,
                    "connected": set(hub.clients),
                    "submitted": dict(hub.submitted),
                    "completed": dict(hub.completed),
                    "queued": by_rank,
                    "held": {k: len(c.owned) for k, c in hub.clients.items()},
                }
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
                "waiting": waiting_counts(n),
                "lanes": lanes,
                "alive": sum(1 for p, v in n.members.views.items() if v.alive and p != n.id),
                "peers": sum(1 for p in n.members.views if p != n.id),
                "reactions": new,
                "reaction_count": r.count,
                "received": dict(n.core.received),
                "sent": dict(loop.sent_kinds) if loop is not None else {},
                "ranks": ranks,
                "slots": sched.nslots,
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
            n = self.node
            me = [str(n.id), n.spec.name]  # labels node (its id), node_name
            st = snap["stats"]
            sched = st["scheduler"]

            def family(kind: Any, name: str, doc: str, *labels: str) -> Any:
                return kind(name, doc, labels=["node", "node_name", *labels])

            g = family(
                GaugeMetricFamily,
                "rdmasched_build_info",
                "the rdmasched running: its version and git commit (1)",
                "version",
                "commit",
            )
            g.add_metric([*me, self.version, self.commit], 1)
            yield g

            m = family(
                CounterMetricFamily,
                "rdmasched_messages",
                "control messages by kind and direction",
                "direction",
                "kind",
            )
            for direction in ("received", "sent"):
                for kind, count in sorted(snap[direction].items()):
                    m.add_metric([*me, direction, _kind_name(kind)], count)
            yield m

            m = family(
                CounterMetricFamily,
                "rdmasched_bad_slots",
                "slots the lanes skipped, by reason (docs/PROTOCOL.md)",
                "reason",
            )
            for reason, count in sorted(st["bad_slots"].items()):
                m.add_metric([*me, reason], count)
            yield m

            m = family(
                CounterMetricFamily,
                "rdmasched_decisions",
                "decision events by decision and the rule that decided (docs/TELEMETRY.md)",
                "decision",
                "rule",
            )
            for (decision, rule), count in sorted(snap["by_rule"].items()):
                m.add_metric([*me, decision, rule], count)
            yield m

            m = family(
                CounterMetricFamily, "rdmasched_rejected", "inputs refused, by reason", "reason"
            )
            for reason, count in sorted(st["rejected"].items()):
                m.add_metric([*me, reason], count)
            yield m

            g = family(
                GaugeMetricFamily,
                "rdmasched_queue_depth",
                "tasks queued now, by priority class",
                "priority_class",
            )
            for cls, count in snap["queued"].items():
                g.add_metric([*me, cls], count)
            yield g

            g = family(
                GaugeMetricFamily,
                "rdmasched_tasks_waiting",
                "queued tasks by the reason they have not started (a task counts under each "
                "of its reasons: docs/SCHEDULER.md)",
                "reason",
            )
            for reason, count in snap["waiting"].items():
                g.add_metric([*me, reason], count)
            yield g

            g = family(GaugeMetricFamily, "rdmasched_running", "tasks running now")
            g.add_metric(me, sched["running"])
            yield g
            g = family(
                GaugeMetricFamily,
                "rdmasched_load_ratio",
                "(running + queued tasks) / execution slots: the load hint sent to peers; "
                "1 is every slot busy, above 1 work waits",
            )
            g.add_metric(me, sched["load_hint"] / _PER_MILLE)
            yield g
            g = family(
                GaugeMetricFamily,
                "rdmasched_slots_busy_ratio",
                "running tasks / execution slots (0..1)",
            )
            g.add_metric(me, min(1.0, sched["running"] / snap["slots"]) if snap["slots"] else 0.0)
            yield g

            h = family(
                HistogramMetricFamily,
                "rdmasched_queue_depth_at_decision",
                "tasks queued just after each decision",
            )
            h.add_metric(me, self.depth.buckets(), self.depth.sum)
            yield h

            h = family(
                HistogramMetricFamily,
                "rdmasched_wait_seconds",
                "time a task waited in the queue before it started, by priority class",
                "priority_class",
            )
            for cls, hist in self.wait.items():
                h.add_metric([*me, cls], hist.buckets(), hist.sum)
            yield h

            h = family(
                HistogramMetricFamily,
                "rdmasched_preempt_reaction_seconds",
                "PREEMPT trigger stamp -> preempt handler entered",
            )
            h.add_metric(me, self.reaction.buckets(), self.reaction.sum)
            yield h

            g = family(
                GaugeMetricFamily,
                "rdmasched_lane_occupancy",
                "fraction of each outbound lane written and not yet credited back",
                "peer",
                "peer_name",
            )
            for peer, occ in sorted(snap["lanes"].items()):
                g.add_metric([*me, str(peer), n.cluster.node(peer).name], occ)
            yield g

            g = family(
                GaugeMetricFamily, "rdmasched_peers_alive", "peers this node counts as alive"
            )
            g.add_metric(me, snap["alive"])
            yield g
            g = family(GaugeMetricFamily, "rdmasched_peers", "peers this node knows of")
            g.add_metric(me, snap["peers"])
            yield g

            yield from self._ranks(me, snap["ranks"], family)

            c = family(
                CounterMetricFamily, "rdmasched_events", "decision events recorded in the ring"
            )
            c.add_metric(me, sched["events_recorded"])
            yield c
            c = family(
                CounterMetricFamily,
                "rdmasched_events_dropped",
                "decision events overwritten in the ring (the ring wrapped)",
            )
            c.add_metric(me, sched["events_dropped"])
            yield c
            c = family(
                CounterMetricFamily,
                "rdmasched_events_lost",
                "events the ring overwrote before a scrape read them (missing from histograms)",
            )
            c.add_metric(me, self._lost)
            yield c

    @staticmethod
    def _ranks(me: list[str], ranks: dict[str, Any] | None, family: Any) -> Iterator[Any]:
        """The metrics per client rank (the hub's clients, by index: LOCAL_RANK), every index
        the hub serves, connected or not; none when the node serves no clients."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        if ranks is None:
            return
        indexes = range(ranks["max"])
        g = family(GaugeMetricFamily, "rdmasched_clients_connected", "client ranks connected now")
        g.add_metric(me, len(ranks["connected"]))
        yield g
        g = family(
            GaugeMetricFamily,
            "rdmasched_client_connected",
            "1 while the client rank of this index (LOCAL_RANK) is connected, else 0",
            "rank",
        )
        for k in indexes:
            g.add_metric([*me, str(k)], int(k in ranks["connected"]))
        yield g
        for kind, key, name, doc in (
            (
                CounterMetricFamily,
                "submitted",
                "rdmasched_client_tasks_submitted",
                "tasks the rank of this index submitted or dispatched here (accepted)",
            ),
            (
                CounterMetricFamily,
                "completed",
                "rdmasched_client_tasks_completed",
                "tasks the rank of this index completed (it ran them to their end)",
            ),
            (
                GaugeMetricFamily,
                "queued",
                "rdmasched_client_tasks_queued",
                "tasks of the rank of this index queued here now",
            ),
            (
                GaugeMetricFamily,
                "held",
                "rdmasched_client_tasks_held",
                "tasks the rank of this index holds here now: queued, running or placed "
                "elsewhere (bounded by --max-queued-per-client)",
            ),
        ):
            m = family(kind, name, doc, "rank")
            for k in indexes:
                m.add_metric([*me, str(k)], ranks[key].get(k, 0))
            yield m


def _kind_name(kind: int) -> str:
    try:
        return Kind(kind).name
    except ValueError:
        return str(kind)


class MetricsServer:
    """The HTTP server of one node's metrics, live events and probes; ``close()`` stops it.
    With ``token`` (bytes, ``http.read_token``) /metrics and /events need it."""

    def __init__(
        self, node: Node, port: int, addr: str = "127.0.0.1", *, token: bytes | None = None
    ) -> None:
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
                elif url.path == "/healthz":
                    server._probe(self, health(server.node))
                elif url.path == "/readyz":
                    server._probe(self, readiness(server.node))
                else:
                    self.send_error(
                        404, "try /metrics, /events?since=SEQ, /why?task=ID, /healthz or /readyz"
                    )

        self.httpd = http.Server(
            addr,
            port,
            Handler,
            "metrics",
            token=token,
            open_paths=PROBE_PATHS,
            token_option="--metrics-token-file",
        )
        self.port: int = self.httpd.port

    def _probe(self, h: BaseHTTPRequestHandler, result: tuple[bool, str]) -> None:
        ok, line = result
        body = (" ".join(line.split()) + "\n").encode()
        h.send_response(200 if ok else 503)
        h.send_header("Content-Type", "text/plain; charset=utf-8")
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Cache-Control", "no-store")
        h.end_headers()
        h.wfile.write(body)

    def _not_running(self, h: BaseHTTPRequestHandler) -> bool:
        """Answer 503 (and say so) while the node's loop is not running: before it runs
        (it is joining its cluster), a scrape would read its state beside the thread that
        builds it."""
        loop = self.node.loop
        if loop is not None and loop.running:
            return False
        h.send_error(503, f"node {self.node.id}: the loop is not running (joining, or stopped)")
        return True

    def _metrics(self, h: BaseHTTPRequestHandler) -> None:
        if self.registry is None:
            h.send_error(
                501, "prometheus-client is not installed (pip install rdmasched[telemetry])"
            )
            return
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if self._not_running(h):
            return
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
        if self._not_running(h):
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
            tasks = node.inspect(lambda n: waiting_of(n, task_id, origin))
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


def waiting_counts(node: Node) -> dict[str, int]:
    """Reason code -> tasks waiting for it on ``node``: the scheduler's queued tasks and
    the gang members held for their gangs (the ``rdmasched_tasks_waiting`` gauge)."""
    counts = node.scheduler.waiting_counts()
    for code, k in gang.waiting_counts(node.core.gangs).items():
        counts[code] = counts.get(code, 0) + k
    return counts


def waiting_of(node: Node, task_id: int, origin: int | None) -> list[dict[str, Any]]:
    """The tasks ``task_id`` (of ``origin``; None: of any origin) held by ``node``, each
    with its state and the ranked reasons it waits (``Scheduler.why``, or ``gang.why`` for
    a member held for its gang, state ``gang``): ``/why``'s answer."""
    sched = node.scheduler
    found = sched.find(task_id) if origin is None else [sched.lookup(task_id, origin)]
    out = []
    g = node.core.gangs.gang_of(task_id) if origin in (None, node.id) else None
    if g is not None and not any(t is not None for t in found):
        for m in g.members:
            if m.id == task_id:
                out.append(
                    {
                        "task_id": m.id,
                        "origin": node.id,
                        "job": m.job,
                        "priority": m.priority,
                        "state": "gang",
                        "slot": None,
                        "reasons": [r.as_dict() for r in gang.why(node.core.gangs, task_id)],
                    }
                )
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


def serve(
    node: Node, port: int, addr: str = "127.0.0.1", *, token: bytes | None = None
) -> MetricsServer:
    """Serve ``node``'s metrics, live events and probes on ``addr``:``port`` (0: a free
    port); with ``token``, /metrics and /events need it."""
    return MetricsServer(node, port, addr, token=token)
