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

from rdmasched import limits
from rdmasched.errors import RdmaschedError
from rdmasched.files import FileRefused, open_regular
from rdmasched.scheduler.events import Decision, Event, from_dict


class TraceError(RdmaschedError, ValueError):
    """A trace directory or file that is not in the trace record format."""


#: the value of "rdmasched_trace" in a header this code writes (and the newest it reads)
FORMAT = 1

#: the longest line a reader takes: an event is a few hundred bytes, its reason text short
MAX_LINE_BYTES = 1 << 20
#: the largest trace file a reader takes (one node's ring: millions of events)
MAX_FILE_BYTES = 1 << 30

_U64 = (0, limits.U64_MAX)
_U32 = (0, 0xFFFFFFFF)
_U16 = (0, 0xFFFF)
_NODE = (0, limits.NODE_MAX)
#: each integer field of an event and its range (the ring's word layout, rdmasched.limits)
EVENT_INTS: dict[str, tuple[int, int]] = {
    "t_ns": _U64,
    "task_id": (-1, limits.U64_MAX),  # -1: NO_TASK
    "seq": _U64,
    "node": _NODE,
    "slot": (0, limits.EXEC_SLOTS_MAX - 1),
    "origin": _NODE,
    "job": _U64,
    "priority": (0, limits.PRIORITY_MAX),
    "group": _U64,
    "step": _U64,
    "n_beaten": _U32,
    "beaten_origin": _NODE,
    "peer": _NODE,
    "lost_peer": _NODE,
    "peer_load": _U16,
    "lost_load": _U16,
    "my_load": _U16,
    "cause_src": _NODE,
    "cause_seq": _U32,
    "cause_sent_ns": _U64,
    "wait_ns": _U64,
    "queued": _U32,
    "running": _U32,
}
EVENT_STRS = ("reason", "rule", "cause")
_REQUIRED = ("t_ns", "decision", "task_id", "reason", "beaten")
#: an event names at most one task it went ahead of (``n_beaten`` counts them all)
MAX_BEATEN = 1
#: each integer field of a header and its range
HEADER_INTS: dict[str, tuple[int, int]] = {
    "rdmasched_trace": (1, FORMAT),
    "node": _NODE,
    "slots": (0, limits.EXEC_SLOTS_MAX),
    "events": _U64,
    "recorded": _U64,
    "dropped": _U64,
    "missed": _U64,
}
HEADER_STRS = ("clock", "source")
ANCHOR_KEYS = ("monotonic_ns", "realtime_ns", "boottime_ns")


def _int(d: dict[str, Any], key: str, lo: int, hi: int) -> str | None:
    """What is wrong with ``d[key]`` as an integer in lo..hi (None: nothing, or absent)."""
    v = d.get(key)
    if v is None:
        return None
    if type(v) is not int:
        return f"{key} must be an integer, not {_show(v)}"
    if not lo <= v <= hi:
        return f"{key} {v} is outside {lo}..{hi}"
    return None


def _show(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, float) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def event(d: dict[str, Any]) -> Event:
    """The event a decoded trace line holds, every field checked (its type, its range);
    ValueError saying which field is wrong."""
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    for key, (lo, hi) in EVENT_INTS.items():
        if (why := _int(d, key, lo, hi)) is not None:
            raise ValueError(why)
    for key in EVENT_STRS:
        if d.get(key) is not None and not isinstance(d[key], str):
            raise ValueError(f"{key} must be a string, not {_show(d[key])}")
    if d["decision"] not in tuple(Decision):
        raise ValueError(f"decision {_show(d['decision'])} is none of {', '.join(Decision)}")
    b = d["beaten"]
    if not isinstance(b, list) or len(b) > MAX_BEATEN:
        raise ValueError(f"beaten must be a list of at most {MAX_BEATEN} task id, not {_show(b)}")
    if any(type(x) is not int or not 0 <= x <= limits.U64_MAX for x in b):
        raise ValueError(f"beaten must hold task ids (u64), not {_show(b)}")
    return from_dict(d)


def check_header(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` if it is a good trace header (its fields' types and ranges); else ValueError
    saying which field is wrong (a format newer than this rdmasched reads among them)."""
    fmt = d.get("rdmasched_trace")
    if type(fmt) is int and fmt > FORMAT:
        raise ValueError(f"trace format {fmt} is newer than this rdmasched reads ({FORMAT})")
    for key, (lo, hi) in HEADER_INTS.items():
        if (why := _int(d, key, lo, hi)) is not None:
            raise ValueError(f"header: {why}")
    for key in HEADER_STRS:
        if d.get(key) is not None and not isinstance(d[key], str):
            raise ValueError(f"header: {key} must be a string, not {_show(d[key])}")
    a = d.get("anchor")
    if a is not None:
        if not isinstance(a, dict) or not {"monotonic_ns", "realtime_ns"} <= a.keys():
            raise ValueError(
                f"header: anchor must hold monotonic_ns and realtime_ns, not {_show(a)}"
            )
        for key in ANCHOR_KEYS:
            if (why := _int(a, key, *_U64)) is not None:
                raise ValueError(f"header: anchor {why}")
    return d


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a trace holds")


def parse_line(line: str | bytes) -> dict[str, Any]:
    """One JSON-lines record as a dict; ValueError if it is not one (not JSON, Infinity or
    NaN, nested too deep, not an object)."""
    try:
        d = json.loads(
            line.decode("utf-8") if isinstance(line, bytes) else line,
            parse_constant=_reject_constant,
        )
    except RecursionError:
        raise ValueError("nested too deep") from None
    except json.JSONDecodeError as exc:
        raise ValueError(exc.msg) from None
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    return d


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


class _Lines(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


def read_records(f: _Lines, where: str) -> tuple[dict[str, Any], list[Event]]:
    """The header (``{}`` if none) and the events of the trace records ``f`` holds (a file,
    an HTTP answer), every line and field checked; TraceError naming ``where`` and the line
    (a line that is not an event, a field of the wrong type or out of its range, a line or
    the whole longer than MAX_LINE_BYTES or MAX_FILE_BYTES)."""
    head: dict[str, Any] = {}
    events: list[Event] = []
    size = 0
    for lineno, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
        size += len(line)
        if len(line) > MAX_LINE_BYTES:
            raise TraceError(f"{where} line {lineno} is longer than {MAX_LINE_BYTES} bytes")
        if size > MAX_FILE_BYTES:
            raise TraceError(f"{where} holds more than {MAX_FILE_BYTES} bytes: not read")
        if not line.strip():
            continue
        try:
            d = parse_line(line)
        except ValueError as exc:
            raise TraceError(f"{where} line {lineno} is not a trace event: {exc}") from None
        if lineno == 1 and "rdmasched_trace" in d:
            try:
                head = check_header(d)
            except ValueError as exc:
                raise TraceError(f"{where}: {exc}") from None
            continue
        try:
            events.append(event(d))
        except ValueError as exc:
            raise TraceError(
                f"{where} line {lineno} is not a trace event "
                f"(needs t_ns, decision, task_id, reason and beaten): {exc}"
            ) from None
    return head, events


def read_file(path: str) -> NodeTrace:
    """One trace file (``read_records``); TraceError if it is not one, or not a regular file."""
    try:
        with open_regular(path) as f:
            head, events = read_records(f, path)
    except FileRefused as exc:
        raise TraceError(f"{exc}: not a trace") from None
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror}") from None
    name = os.path.basename(path).removesuffix(".jsonl")
    return NodeTrace(_node_of(name, head, events), name, head, events)


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
