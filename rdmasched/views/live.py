"""Reading a running node's events over its metrics port (``/events``, docs/TELEMETRY.md).

A live reader (``rdmasched trace export --live``, ``rdmasched mirror --live``, ``rdmasched top``;
``rdmasched why`` asks ``/why?task=ID`` the same way: ``why()``)
polls ``/events?since=SEQ`` with the last ``seq`` it saw + 1: it gets every event after it
still in the node's ring, and the header's ``missed`` counts what the ring overwrote first.
A node whose metrics port needs a bearer token (``--metrics-token-file``) is read with
``token=`` (the commands' ``--token-file``); without it the node answers 401, said in one
line that names the flag.

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


def _request(addr: str, path: str, token: bytes | None) -> urllib.request.Request:
    """A GET of ``path`` at ``addr`` ("host:port" or a URL), with the bearer token if given."""
    url = addr if "://" in addr else f"http://{addr}"
    headers = {} if token is None else {"Authorization": "Bearer " + token.decode("ascii")}
    return urllib.request.Request(url.rstrip("/") + path, headers=headers)


def _refused(addr: str, what: str, exc: urllib.error.HTTPError, token: bytes | None) -> TraceError:
    """A node's HTTP error answer as one line; a 401 names what to give."""
    if exc.code == 401:
        hint = "a wrong token" if token is not None else "it needs its metrics token"
        return TraceError(
            f"{addr}: its {what} answered 401 Unauthorized ({hint}: --token-file FILE)"
        )
    return TraceError(f"{addr}: its {what} answered {exc.code} {exc.reason}")


def fetch(
    addr: str, since: int = 0, timeout_s: float = 10.0, token: bytes | None = None
) -> NodeTrace:
    """The events of the node serving ``addr`` ("host:port" or a URL) from ``since`` on."""
    try:
        with urllib.request.urlopen(
            _request(addr, f"/events?since={since}", token), timeout=timeout_s
        ) as r:
            head, events = read_records(r, addr)
            if r.length:  # fewer bytes came than its Content-Length said
                raise http.client.IncompleteRead(b"", r.length)
    except TraceError:
        raise
    except http.client.IncompleteRead:
        raise TraceError(f"{addr}: its /events answer was cut short (did the node stop?)") from None
    except urllib.error.HTTPError as exc:
        raise _refused(addr, "/events", exc, token) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise TraceError(f"{addr}: no node's events there ({exc})") from None
    if not head:
        raise TraceError(f"{addr}: not a node's /events (no trace header)")
    if "node" not in head:
        raise TraceError(f"{addr}: not a node's /events (its header names no node)")
    node = int(head["node"])
    return NodeTrace(node, f"live-node{node}", head, events)


def why(
    addr: str,
    task_id: int,
    origin: int | None = None,
    timeout_s: float = 10.0,
    token: bytes | None = None,
) -> Any:
    """The node at ``addr``'s answer to ``/why?task=ID``: its tasks with that id, each with
    its state and ranked reasons (rdmasched.telemetry.metrics.waiting_of); a node that does
    not answer, or answers something else, is one ``TraceError`` naming the address."""
    path = f"/why?task={task_id}" + ("" if origin is None else f"&origin={origin}")
    try:
        with urllib.request.urlopen(_request(addr, path, token), timeout=timeout_s) as r:
            answer = json.loads(r.read(1 << 24))
    except urllib.error.HTTPError as exc:
        raise _refused(addr, "/why", exc, token) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise TraceError(f"{addr}: no node's /why there ({exc})") from None
    if (
        not isinstance(answer, dict)
        or not isinstance(answer.get("node"), int)
        or not isinstance(answer.get("tasks"), list)
    ):
        raise TraceError(f"{addr}: not a node's /why answer")
    return answer
