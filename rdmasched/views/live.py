"""Reading a running node's events over its metrics port (``/events``, docs/TELEMETRY.md).

A live reader (``rdmasched trace export --live``, ``rdmasched mirror --live``, ``rdmasched top``;
``rdmasched why`` asks ``/why?task=ID`` the same way: ``why()``)
polls ``/events?since=SEQ`` with the last ``seq`` it saw + 1: it gets every event after it
still in the node's ring, and the header's ``missed`` counts what the ring overwrote first.

An answer is trace records, read and checked as a trace file is (``records.read_records``):
one that is cut short (the node died mid-answer), not JSON, or holds a field of the wrong
type or range is one ``TraceError`` naming the node's address, like no answer at all.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from rdmasched.telemetry.records import NodeTrace, TraceError, read_records


def fetch(addr: str, since: int = 0, timeout_s: float = 10.0) -> NodeTrace:
    """The events of the node serving ``addr`` ("host:port" or a URL) from ``since`` on."""
    url = addr if "://" in addr else f"http://{addr}"
    url = url.rstrip("/") + f"/events?since={since}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            head, events = read_records(r, addr)
            if r.length:  # fewer bytes came than its Content-Length said
                raise http.client.IncompleteRead(b"", r.length)
    except TraceError:
        raise
    except http.client.IncompleteRead:
        raise TraceError(f"{addr}: its /events answer was cut short (did the node stop?)") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise TraceError(f"{addr}: no node's events there ({exc})") from None
    if not head:
        raise TraceError(f"{addr}: not a node's /events (no trace header)")
    if "node" not in head:
        raise TraceError(f"{addr}: not a node's /events (its header names no node)")
    node = int(head["node"])
    return NodeTrace(node, f"live-node{node}", head, events)


def why(addr: str, task_id: int, origin: int | None = None, timeout_s: float = 10.0) -> Any:
    """The node at ``addr``'s answer to ``/why?task=ID``: its tasks with that id, each with
    its state and ranked reasons (rdmasched.telemetry.metrics.waiting_of); a node that does
    not answer, or answers something else, is one ``TraceError`` naming the address."""
    url = addr if "://" in addr else f"http://{addr}"
    url = url.rstrip("/") + f"/why?task={task_id}" + ("" if origin is None else f"&origin={origin}")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            answer = json.loads(r.read(1 << 24))
    except urllib.error.HTTPError as exc:
        raise TraceError(f"{addr}: its /why answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise TraceError(f"{addr}: no node's /why there ({exc})") from None
    if (
        not isinstance(answer, dict)
        or not isinstance(answer.get("node"), int)
        or not isinstance(answer.get("tasks"), list)
    ):
        raise TraceError(f"{addr}: not a node's /why answer")
    return answer
