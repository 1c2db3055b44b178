"""Trace records: the decision events of one node as a JSON-lines file (docs/TELEMETRY.md).

One file per node. The first line may be a header (``{"rdmasched_trace": 1, ...}``: the
node, its slots, the clock the times are on and the anchor that ties that clock to the wall
clock, the ring's size and what it lost); every other line is one event, as
``Event.as_dict`` writes it. The demo's ``--trace DIR``, a live node's ``dump`` and the
simulator all write this format, and ``rdmasched trace`` and ``trace export`` read it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from rdmasched.errors import RdmaschedError
from rdmasched.scheduler.events import Event, from_dict


class TraceError(RdmaschedError, ValueError):
    """A trace directory or file that is not in the trace record format."""


#: the value of "rdmasched_trace" in a header this code writes (and the newest it reads)
FORMAT = 1


def anchor() -> dict[str, int]:
    """CLOCK_MONOTONIC and CLOCK_REALTIME (and CLOCK_BOOTTIME) read back to back: maps a
    node's event times (on the monotonic clock) to the wall clock other traces use."""
    mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    real = time.clock_gettime_ns(time.CLOCK_REALTIME)
    boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return {"monotonic_ns": mono, "realtime_ns": real, "boottime_ns": boot}


def header(
    node: int,
    *,
    slots: int | None = None,
    events: int | None = None,
    recorded: int | None = None,
    dropped: int = 0,
    clock: str = "monotonic",
    anchor_ns: dict[str, int] | None = None,
    source: str = "node",
) -> dict[str, Any]:
    """A trace file's first line. ``clock``: "monotonic" (a daemon: ``anchor_ns`` maps it
    to the wall clock) or "sim" (simulated time from 0; no anchor)."""
    h: dict[str, Any] = {"rdmasched_trace": FORMAT, "node": node, "clock": clock, "source": source}
    if slots is not None:
        h["slots"] = slots
    if events is not None:
        h["events"] = events
    if recorded is not None:
        h["recorded"] = recorded
    h["dropped"] = dropped
    if anchor_ns is not None:
        h["anchor"] = anchor_ns
    return h


def write(path: str, head: dict[str, Any] | None, events: Iterable[Event]) -> int:
    """Write a trace file: ``head`` (if any), then one line per event; the events written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        if head is not None:
            f.write(json.dumps(head, separators=(",", ":")) + "\n")
        for ev in events:
            f.write(json.dumps(ev.as_dict(), separators=(",", ":")) + "\n")
            n += 1
    return n


class _Ring(Protocol):
    nslots: int

    def events(self) -> list[Event]: ...

    def stats(self) -> Any: ...


def write_scheduler(
    path: str,
    node: int,
    scheduler: _Ring,
    *,
    clock: str = "monotonic",
    source: str = "node",
    anchor_ns: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Write a ``Scheduler``'s event ring to ``path`` as ``node``'s trace (its header from
    the scheduler's slots and ring counters, then every event in the ring); the header."""
    st = scheduler.stats()
    head = header(
        node,
        slots=scheduler.nslots,
        events=st.events_capacity,
        recorded=st.events_recorded,
        dropped=st.events_dropped,
        clock=clock,
        anchor_ns=anchor_ns,
        source=source,
    )
    write(path, head, scheduler.events())
    return head


class _Dumpable(Protocol):
    id: int

    def events_since(self, seq: int = 0) -> tuple[list[Event], int]: ...

    def stats(self) -> dict[str, Any]: ...


def dump(node: _Dumpable, path: str) -> dict[str, Any]:
    """Write a running (or stopped) ``Node``'s event ring to ``path``; its header."""
    evs, _ = node.events_since(0)
    st = node.stats()["scheduler"]
    head = header(
        node.id,
        slots=st["running"] + st["free_slots"],
        events=st["events_capacity"],
        recorded=st["events_recorded"],
        dropped=st["events_dropped"],
        anchor_ns=anchor(),
    )
    write(path, head, evs)
    return head


@dataclass
class NodeTrace:
    """One node's trace: its header (``{}`` if the file had none) and its events."""

    node: int
    name: str
    head: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


def _node_of(name: str, head: dict[str, Any], events: list[Event]) -> int:
    if isinstance(head.get("node"), int):
        return int(head["node"])
    for ev in events:
        if ev.node is not None:
            return ev.node
    digits = "".join(c for c in name.rsplit("node", 1)[-1] if c.isdigit())
    return int(digits) if digits else 0


def read_file(path: str) -> NodeTrace:
    """One trace file. TraceError if it is not one (a line that is not an event)."""
    head: dict[str, Any] = {}
    events: list[Event] = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                d = _line(line, path, lineno)
                if lineno == 1 and "rdmasched_trace" in d:
                    if not isinstance(d["rdmasched_trace"], int) or d["rdmasched_trace"] > FORMAT:
                        raise TraceError(
                            f"{path}: trace format {d['rdmasched_trace']!r} is newer than this "
                            f"rdmasched reads ({FORMAT})"
                        )
                    head = d
                    continue
                try:
                    events.append(from_dict(d))
                except (KeyError, ValueError, TypeError) as exc:
                    raise TraceError(
                        f"{path} line {lineno} is not a trace event "
                        f"(needs t_ns, decision, task_id, reason and beaten): {exc}"
                    ) from None
    except UnicodeDecodeError:
        raise TraceError(f"{path} is not a trace: not UTF-8 text") from None
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror}") from None
    name = os.path.basename(path).removesuffix(".jsonl")
    return NodeTrace(_node_of(name, head, events), name, head, events)


def _line(line: str, path: str, lineno: int) -> dict[str, Any]:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path} line {lineno} is not a trace event: {exc.msg}") from None
    if not isinstance(d, dict):
        raise TraceError(f"{path} line {lineno} is not a trace event (not a JSON object)")
    return d


def read_dir(directory: str, prefix: str = "") -> list[NodeTrace]:
    """Every ``*.jsonl`` trace in ``directory`` whose name starts with ``prefix``, by name."""
    try:
        names = sorted(
            n for n in os.listdir(directory) if n.endswith(".jsonl") and n.startswith(prefix)
        )
    except FileNotFoundError:
        raise TraceError(f"no directory {directory}") from None
    except NotADirectoryError:
        raise TraceError(f"{directory} is not a directory (give a trace directory)") from None
    except OSError as exc:
        raise TraceError(f"{directory}: {exc.strerror}") from None
    if not names:
        raise TraceError(
            f"no *.jsonl traces in {directory} (write them with `rdmasched demo --trace DIR`, "
            "a node's telemetry dump, or `rdmasched sim`)"
        )
    return [read_file(os.path.join(directory, n)) for n in names]


def events_of(traces: Iterable[NodeTrace]) -> Iterator[tuple[NodeTrace, Event]]:
    """Every event of ``traces``, in time order (ties: by node, then sequence)."""
    allev = [
        (ev.t_ns, tr.node, ev.seq or 0, i, tr, ev)
        for tr in traces
        for i, ev in enumerate(tr.events)
    ]
    allev.sort(key=lambda x: x[:4])
    for x in allev:
        yield x[4], x[5]
