"""The live mirror: the whole cluster as its decision events tell it (docs/TELEMETRY.md).

``ClusterModel`` folds decision events, in time order, into what a person watching the
cluster wants: per node the task on each slot and the queue, the sync groups' progress (the
last step released), the latest decisions with their reasons, and for any task its story:
every event that names it, on every node, in time order ("why A before B").

Two sources feed it: ``TraceSource`` replays trace files (``rdmasched demo --trace DIR``, a
node's ``dump``) at any point of the run; ``LiveSource`` polls running daemons'
``/events?since=SEQ`` (their metrics port). ``MirrorServer`` serves the page
(``mirror_static/``) and the JSON it polls: ``/state``, ``/task?origin=&id=``,
``/why?a=ORIGIN:ID&b=ORIGIN:ID``. ``rdmasched top`` renders the same ``/state`` as text.

Task ids go out as strings in the JSON: the demo's ids use the top bits of 64 and a
JavaScript number would round them.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlparse

from rdmasched.demo.taskid import KIND_BACKGROUND, KIND_COMPUTE, task_kind, task_node, task_seq
from rdmasched.errors import ConfigError
from rdmasched.scheduler.events import NO_TASK, Decision, Event
from rdmasched.scheduler.reasons import RULE_CODES
from rdmasched.telemetry import http
from rdmasched.telemetry.records import NodeTrace, TraceError, read_dir
from rdmasched.views import live

_log = logging.getLogger("rdmasched.mirror")

#: a task's identity: (origin node, task id)
Key = tuple[int, int]

#: decisions kept for the "latest decisions" list
LATEST = 40
#: events kept (all nodes) for the stories of live tasks; a trace keeps all of its own
KEEP = 200_000

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/mirror.js": ("mirror.js", "text/javascript; charset=utf-8"),
    "/mirror.css": ("mirror.css", "text/css; charset=utf-8"),
}


def label(task_id: int, group: int | None = None, step: int | None = None) -> str:
    """A short name for a task: ``sync G step S`` for a sync task; the demo's compute and
    background ids (rdmasched.demo.taskid.task_id) as ``compute N.SEQ``/``bg N.SEQ``;
    else the id."""
    if group is not None and step is not None:
        return f"sync {group} step {step}"
    kind = task_kind(task_id)
    if kind in (KIND_COMPUTE, KIND_BACKGROUND) and task_id < 1 << 63:
        name = "compute" if kind == KIND_COMPUTE else "bg"
        return f"{name} {task_node(task_id)}.{task_seq(task_id)}"
    return str(task_id)


def key_of(node: int, ev: Event) -> Key | None:
    """The identity of the task an event is about (None: about no task)."""
    if ev.task_id == NO_TASK:
        return None
    return (ev.origin if ev.origin is not None else node, ev.task_id)


def beaten_key(node: int, ev: Event) -> Key | None:
    """The identity of the task ``ev`` went ahead of (None: none)."""
    if not ev.beaten:
        return None
    return (ev.beaten_origin if ev.beaten_origin is not None else node, ev.beaten[0])


def parse_key(text: str) -> Key:
    """``ORIGIN:ID`` as a Key; ValueError if it is not one."""
    origin, sep, tid = text.partition(":")
    if not sep:
        raise ValueError(f"{text!r} is not ORIGIN:ID")
    return int(origin), int(tid)


def event_json(node: int, ev: Event, t0: int) -> dict[str, Any]:
    """An event as the page shows it: its fields, ids as strings, labels, ms since t0."""
    d = ev.as_dict()
    d["node"] = node
    d["t_ms"] = round((ev.t_ns - t0) / 1e6, 3)
    k = key_of(node, ev)
    d["task_id"] = str(ev.task_id)
    if k is not None:
        d["key"] = f"{k[0]}:{k[1]}"
        d["label"] = label(ev.task_id, ev.group, ev.step)
    d["beaten"] = [str(b) for b in ev.beaten]
    b = beaten_key(node, ev)
    if b is not None:
        d["beaten_key"] = f"{b[0]}:{b[1]}"
        d["beaten_label"] = label(b[1])
    return d


class NodeView:
    """One node as its events tell it: the task on each slot, the queue."""

    def __init__(self, node: int, name: str, slots: int, head: dict[str, Any]) -> None:
        self.node = node
        self.name = name
        self.slots = slots
        self.head = head
        self.running: dict[int, dict[str, Any]] = {}  # slot -> task
        self.queue: dict[Key, dict[str, Any]] = {}  # in the order they entered
        self.queued = 0  # the counts the last event recorded
        self.running_n = 0
        self.events = 0
        self.last_seq: int | None = None
        self.last_t: int | None = None
        self.error: str | None = None

    def task(self, k: Key, ev: Event) -> dict[str, Any]:
        return {
            "key": f"{k[0]}:{k[1]}",
            "origin": k[0],
            "task_id": str(k[1]),
            "label": label(k[1], ev.group, ev.step),
            "priority": ev.priority,
            "job": ev.job,
            "since_ns": ev.t_ns,
        }

    def _unslot(self, k: Key, slot: int | None) -> None:
        if slot is not None and slot in self.running and self.running[slot]["key"] == _s(k):
            del self.running[slot]
            return
        for s, t in list(self.running.items()):
            if t["key"] == _s(k):
                del self.running[s]

    def apply(self, ev: Event) -> None:
        self.events += 1
        self.last_seq = ev.seq
        self.last_t = ev.t_ns
        if ev.queued is not None:
            self.queued = ev.queued
        if ev.running is not None:
            self.running_n = ev.running
            if ev.decision is Decision.COMPLETE and ev.slot is not None and ev.running:
                self.running_n -= 1  # a complete's counts are recorded before its slot is freed
        k = key_of(self.node, ev)
        if k is None:
            return
        d = ev.decision
        if d is Decision.START:
            self.queue.pop(k, None)
            self._unslot(k, None)
            if ev.slot is not None:
                self.running[ev.slot] = self.task(k, ev)
                if ev.slot >= self.slots:
                    self.slots = ev.slot + 1
        elif d in (Decision.QUEUE, Decision.REQUEUE):
            self._unslot(k, ev.slot)
            t = self.task(k, ev)
            # why it waits, as its queue event said (reasons.py; `rdmasched why` says it now)
            code = RULE_CODES.get(ev.rule or "")
            t["reason"] = str(code) if code is not None else None
            t["reason_text"] = ev.reason if d is Decision.QUEUE else "requeued after a preemption"
            self.queue[k] = t
        elif d in (Decision.PREEMPT, Decision.CANCEL, Decision.COMPLETE):
            if ev.rule != "done_on_peer":
                self._unslot(k, ev.slot)
            if d is Decision.CANCEL:
                self.queue.pop(k, None)
        elif d in (Decision.FORWARD, Decision.REDISPATCH):
            self.queue.pop(k, None)

    def as_json(self) -> dict[str, Any]:
        q = sorted(self.queue.values(), key=lambda t: (-(t["priority"] or 0), t["since_ns"]))
        return {
            "node": self.node,
            "name": self.name,
            "slots": [self.running.get(s) for s in range(self.slots)],
            "queue": q,
            "queued": self.queued,
            "running": self.running_n,
            "events": self.events,
            "last_seq": self.last_seq,
            "dropped": int(self.head.get("dropped") or 0),
            "missed": int(self.head.get("missed") or 0),
            "error": self.error,
        }


def _s(k: Key) -> str:
    return f"{k[0]}:{k[1]}"


class ClusterModel:
    """Every node's view, the sync groups, the latest decisions and the events kept for
    the tasks' stories; fed events in time order with ``apply``."""

    def __init__(self, keep: int | None = KEEP) -> None:
        self.nodes: dict[int, NodeView] = {}
        self.groups: dict[int, dict[str, Any]] = {}
        self.latest: deque[tuple[int, Event]] = deque(maxlen=LATEST)
        self.kept: deque[tuple[int, Event]] = deque(maxlen=keep)
        self.t0: int | None = None
        self.t: int | None = None
        self.applied = 0

    def add_node(self, tr: NodeTrace) -> NodeView:
        v = self.nodes.get(tr.node)
        # a header names the slots; a file without one (an older demo's): the highest slot used
        slots = max(
            [int(tr.head.get("slots") or 0)] + [e.slot + 1 for e in tr.events if e.slot is not None]
        )
        if v is None:
            v = self.nodes[tr.node] = NodeView(tr.node, tr.name, slots, dict(tr.head))
        else:
            v.head.update(tr.head)
            v.slots = max(v.slots, slots)
        return v

    def apply(self, node: int, ev: Event) -> None:
        if self.t0 is None:
            self.t0 = ev.t_ns
        self.t = ev.t_ns if self.t is None else max(self.t, ev.t_ns)
        self.applied += 1
        v = self.nodes.get(node)
        if v is None:
            v = self.nodes[node] = NodeView(node, f"node{node}", 0, {})
        v.apply(ev)
        self.kept.append((node, ev))
        if ev.decision is Decision.RELEASE and ev.group is not None and ev.step is not None:
            g = self.groups.setdefault(ev.group, {"group": ev.group, "step": -1, "nodes": {}})
            g["step"] = max(g["step"], ev.step)
            g["nodes"][str(node)] = max(g["nodes"].get(str(node), -1), ev.step)
            g["t_ns"] = ev.t_ns
        if ev.decision is not Decision.COMPLETE:
            self.latest.append((node, ev))

    def state(self) -> dict[str, Any]:
        t0 = self.t0 or 0
        return {
            "t_ms": round(((self.t or t0) - t0) / 1e6, 3),
            "events": self.applied,
            "nodes": [self.nodes[n].as_json() for n in sorted(self.nodes)],
            "groups": [self.groups[g] for g in sorted(self.groups)],
            "decisions": [event_json(n, e, t0) for n, e in reversed(self.latest)],
        }

    def story(
        self, k: Key, events: Iterable[tuple[int, Event]] | None = None
    ) -> list[dict[str, Any]]:
        """Every event naming task ``k``, as its subject or as the task it went ahead of
        (``role``: "subject" or "beaten"), in time order."""
        t0 = self.t0 or 0
        out = []
        for node, ev in self.kept if events is None else events:
            role = (
                "subject"
                if key_of(node, ev) == k
                else "beaten"
                if beaten_key(node, ev) == k
                else None
            )
            if role is not None:
                d = event_json(node, ev, t0)
                d["role"] = role
                out.append(d)
        return out

    def why(
        self, a: Key, b: Key, events: Iterable[tuple[int, Event]] | None = None
    ) -> list[dict[str, Any]]:
        """The events where one of ``a``, ``b`` went ahead of the other, in time order."""
        t0 = self.t0 or 0
        out = []
        for node, ev in self.kept if events is None else events:
            s, bt = key_of(node, ev), beaten_key(node, ev)
            if (s, bt) in ((a, b), (b, a)):
                out.append(event_json(node, ev, t0))
        return out


def _shifts(traces: list[NodeTrace]) -> dict[int, int]:
    """Per node, what moves its times to CLOCK_REALTIME: only when every trace has an
    anchor (as the Perfetto export); else 0 (one host's monotonic clock, or sim time)."""
    if not traces or not all("anchor" in t.head for t in traces):
        return {t.node: 0 for t in traces}
    return {
        t.node: int(t.head["anchor"]["realtime_ns"]) - int(t.head["anchor"]["monotonic_ns"])
        for t in traces
    }


def _shifted(ev: Event, by: int) -> Event:
    return ev if not by else ev._replace(t_ns=ev.t_ns + by)


def check_nodes(traces: list[NodeTrace]) -> None:
    seen: dict[int, str] = {}
    for t in traces:
        if t.node in seen:
            raise TraceError(
                f"two traces of node {t.node} ({seen[t.node]}, {t.name}): pick one with "
                "--prefix (the demo writes rdmasched-node* and central-node*)"
            )
        seen[t.node] = t.name


class TraceSource:
    """A replay of trace files: the cluster at any moment of the run."""

    kind = "trace"

    def __init__(self, dirs: list[str], prefix: str = "") -> None:
        traces = [t for d in dirs for t in read_dir(d, prefix)]
        check_nodes(traces)
        self.traces = traces
        shift = _shifts(traces)
        merged = sorted(
            ((_shifted(ev, shift[t.node]), t.node) for t in traces for ev in t.events),
            key=lambda x: (x[0].t_ns, x[1], x[0].seq or 0),
        )
        if not merged:
            raise TraceError(f"no events in the traces of {', '.join(dirs)}")
        self.events = merged
        self.times = [ev.t_ns for ev, _ in merged]
        self.t0, self.t1 = self.times[0], self.times[-1]
        self._lock = threading.Lock()
        self._model = self._fresh()

    def _fresh(self) -> ClusterModel:
        m = ClusterModel(keep=None)
        for t in self.traces:
            m.add_node(t)
        m.t0 = self.t0
        return m

    def at_ns(self, at: float | None) -> int:
        """The trace time at fraction ``at`` of the run (None: the end)."""
        if at is None:
            return self.t1
        return self.t0 + round(min(max(at, 0.0), 1.0) * (self.t1 - self.t0))

    def model_at(self, t_ns: int) -> ClusterModel:
        """The model with every event up to ``t_ns`` applied (call with the lock held)."""
        n = bisect.bisect_right(self.times, t_ns)
        if n < self._model.applied:
            self._model = self._fresh()
        for ev, node in self.events[self._model.applied : n]:
            self._model.apply(node, ev)
        return self._model

    def state(self, at: float | None = None) -> dict[str, Any]:
        t = self.at_ns(at)
        with self._lock:
            s = self.model_at(t).state()
        s["source"] = "trace"
        s["t_ms"] = round((t - self.t0) / 1e6, 3)
        s["span_ms"] = round((self.t1 - self.t0) / 1e6, 3)
        s["at"] = (t - self.t0) / (self.t1 - self.t0) if self.t1 > self.t0 else 1.0
        s["total"] = len(self.events)
        return s

    def _all(self) -> list[tuple[int, Event]]:
        return [(node, ev) for ev, node in self.events]

    def story(self, k: Key) -> list[dict[str, Any]]:
        with self._lock:
            return self._model.story(k, self._all())

    def why(self, a: Key, b: Key) -> list[dict[str, Any]]:
        with self._lock:
            return self._model.why(a, b, self._all())

    def close(self) -> None:
        pass


class LiveSource:
    """Running daemons, polled every ``interval_s`` at their metrics port's ``/events``."""

    kind = "live"

    def __init__(
        self,
        addrs: list[str],
        interval_s: float = 0.5,
        keep: int = KEEP,
        token: bytes | None = None,
    ) -> None:
        """``token``: the daemons' metrics bearer token, if their ports need one."""
        if not addrs:
            raise ConfigError("give at least one --live HOST:PORT")
        self.addrs = list(addrs)
        self.interval_s = interval_s
        self.token = token
        self.model = ClusterModel(keep=keep)
        self._since = dict.fromkeys(self.addrs, 0)
        self._node_of: dict[str, int] = {}
        self._shift: dict[str, int] = {}
        #: the last error of each daemon not yet heard from (a known node's is on its view)
        self.errors: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        errors = self.poll()
        if len(errors) == len(self.addrs):
            raise TraceError("; ".join(errors))
        self._thread = threading.Thread(target=self._run, name="rdmasched-mirror", daemon=True)
        self._thread.start()

    def poll(self) -> list[str]:
        """Read every daemon's new events and apply them, in time order; the errors."""
        batch: list[tuple[int, int, int, Event]] = []
        errors = []
        for addr in self.addrs:
            try:
                tr = live.fetch(
                    addr,
                    self._since[addr],
                    timeout_s=max(2.0, self.interval_s * 4),
                    token=self.token,
                )
            except TraceError as exc:
                errors.append(str(exc))
                n = self._node_of.get(addr)
                with self._lock:
                    if n is not None:
                        self.model.nodes[n].error = str(exc)
                    else:
                        self.errors[addr] = str(exc)
                continue
            if addr not in self._shift:  # one anchor per daemon, read once: its clock's offset
                a = tr.head.get("anchor")
                self._shift[addr] = int(a["realtime_ns"]) - int(a["monotonic_ns"]) if a else 0
            self._node_of[addr] = tr.node
            with self._lock:  # `missed` adds up over the polls
                self.errors.pop(addr, None)
                old = self.model.nodes.get(tr.node)
                missed = int(old.head.get("missed") or 0) if old is not None else 0
                v = self.model.add_node(tr)
                v.error = None
                v.head["missed"] = missed + int(tr.head.get("missed") or 0)
            if tr.events:
                self._since[addr] = (tr.events[-1].seq or 0) + 1
            sh = self._shift[addr]
            batch += [(ev.t_ns + sh, tr.node, ev.seq or 0, _shifted(ev, sh)) for ev in tr.events]
        batch.sort(key=lambda x: x[:3])
        with self._lock:
            for _, node, _, ev in batch:
                self.model.apply(node, ev)
        return errors

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception as exc:  # a bug here must not freeze the page: say it, go on
                _log.warning("rdmasched mirror: a poll failed: %s: %s", type(exc).__name__, exc)

    def state(self, at: float | None = None) -> dict[str, Any]:
        with self._lock:
            s = self.model.state()
        s["source"] = "live"
        s["addrs"] = self.addrs
        with self._lock:
            s["errors"] = dict(self.errors)
        return s

    def story(self, k: Key) -> list[dict[str, Any]]:
        with self._lock:
            return self.model.story(k)

    def why(self, a: Key, b: Key) -> list[dict[str, Any]]:
        with self._lock:
            return self.model.why(a, b)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


Source = TraceSource | LiveSource


def static(name: str) -> bytes:
    """One of the page's files (package data under mirror_static/)."""
    return resources.files("rdmasched.views").joinpath("mirror_static", name).read_bytes()


class MirrorServer:
    """The mirror's HTTP server (a thread); ``close()`` stops it and its source."""

    def __init__(self, source: Source, port: int = 0, addr: str = "127.0.0.1") -> None:
        self.source = source
        server = self

        class Handler(http.Handler):
            def do_GET(self) -> None:
                server._get(self)

        self.httpd = http.Server(addr, port, Handler, "mirror")
        self.port: int = self.httpd.port
        self.url = f"http://{addr or '0.0.0.0'}:{self.port}/"

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path in _STATIC:
            name, ctype = _STATIC[url.path]
            self._send(h, 200, static(name), ctype)
            return
        try:
            if url.path == "/state":
                at = float(q["at"]) if "at" in q else None
                body: Any = self.source.state(at)
            elif url.path == "/task":
                k = (int(q["origin"]), int(q["id"]))
                events = self.source.story(k)
                if not events:
                    self._json(h, 404, {"error": f"no event names task {k[1]} of origin {k[0]}"})
                    return
                body = {"key": _s(k), "label": label(k[1]), "events": events}
                sub = [e for e in events if e["role"] == "subject" and "label" in e]
                if sub:
                    body["label"] = sub[0]["label"]
            elif url.path == "/why":
                a, b = parse_key(q["a"]), parse_key(q["b"])
                body = {"a": _s(a), "b": _s(b), "events": self.source.why(a, b)}
            else:
                self._json(h, 404, {"error": "try /, /state, /task?origin=&id=, /why?a=&b="})
                return
        except (KeyError, ValueError) as exc:
            self._json(h, 400, {"error": f"bad query {url.query!r}: {exc}"})
            return
        self._json(h, 200, body)

    def _json(self, h: BaseHTTPRequestHandler, code: int, body: Any) -> None:
        self._send(h, code, json.dumps(body).encode(), "application/json")

    def _send(self, h: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str) -> None:
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Cache-Control", "no-store")
        h.end_headers()
        h.wfile.write(body)

    def close(self) -> None:
        self.httpd.close()
        self.source.close()


def open_source(
    trace: list[str],
    live_addrs: list[str],
    prefix: str = "",
    interval_s: float = 0.5,
    token: bytes | None = None,
) -> Source:
    """The source the command line names: trace directories or live daemons (not both);
    ``token``: the daemons' metrics bearer token (``--token-file``)."""
    if bool(trace) == bool(live_addrs):
        raise ConfigError("give either --trace DIR or --live HOST:PORT (one kind of source)")
    if trace:
        return TraceSource(trace, prefix)
    return LiveSource(live_addrs, interval_s, token=token)


def serve_forever(source: Source, port: int, addr: str, at: float | None = None) -> None:
    """``rdmasched mirror``: serve until interrupted (Ctrl-C, SIGTERM)."""
    srv = MirrorServer(source, port, addr)
    page = srv.url + (f"?at={at}" if at is not None else "")
    print(f"rdmasched mirror: {source.kind} of {_what(source)} at {page}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        srv.close()


def _what(source: Source) -> str:
    if isinstance(source, TraceSource):
        return f"{len(source.traces)} nodes, {len(source.events)} events"
    return f"{len(source.addrs)} daemons"
