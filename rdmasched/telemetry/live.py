"""Reading a running node's events over its metrics port (``/events``, docs/TELEMETRY.md).

A live reader (``rdmasched trace export --live``, ``rdmasched mirror --live`` and ``rdmasched top``)
polls ``/events?since=SEQ`` with the last ``seq`` it saw + 1: it gets every event after it
still in the node's ring, and the header's ``missed`` counts what the ring overwrote first.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from rdmasched.scheduler.events import from_dict
from rdmasched.telemetry.records import NodeTrace, TraceError


def fetch(addr: str, since: int = 0, timeout_s: float = 10.0) -> NodeTrace:
    """The events of the node serving ``addr`` ("host:port" or a URL) from ``since`` on."""
    url = addr if "://" in addr else f"http://{addr}"
    url = url.rstrip("/") + f"/events?since={since}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise TraceError(f"{addr}: no node's events there ({exc})") from None
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    if not lines or "rdmasched_trace" not in lines[0]:
        raise TraceError(f"{addr}: not a node's /events (no trace header)")
    head = lines[0]
    events = [from_dict(d) for d in lines[1:]]
    return NodeTrace(int(head["node"]), f"live-node{head['node']}", head, events)
