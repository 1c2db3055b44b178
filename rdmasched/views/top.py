"""``rdmasched top``: the mirror in a terminal (plain text, redrawn with ANSI escapes).

It draws the same ``state()`` the web mirror serves (rdmasched.views.mirror): per node
its slots and queue, the sync groups' last step released, the latest decisions with their
rule, the task they went ahead of and the message that caused them.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any, TextIO

from rdmasched.views.mirror import Source, TraceSource

CLEAR = "\x1b[H\x1b[2J"


def _task(t: dict[str, Any] | None) -> str:
    if t is None:
        return "idle"
    return f"{t['label']} p{t['priority'] if t['priority'] is not None else '?'}"


def _cause(e: dict[str, Any]) -> str:
    if not e.get("cause"):
        return "local"
    return f"{e['cause']}<-n{e['cause_src']}"


def _queue(queue: list[dict[str, Any]], width: int) -> str:
    """``  queue: A, B +N``: as many names as fit in ``width``, then how many more."""
    text = "  queue: " + ("-" if not queue else "")
    for i, t in enumerate(queue):
        more = len(queue) - i - 1
        item = ("" if i == 0 else ", ") + t["label"]
        if len(text) + len(item) + (len(f" +{more}") if more else 0) > width:
            return text + f" +{len(queue) - i}"
        text += item
    return text


def frame(s: dict[str, Any], width: int = 120, decisions: int = 12) -> str:
    """One screen of text for the state ``s`` (``ClusterModel.state`` with its source's keys)."""
    out = []
    if s["source"] == "trace":
        out.append(
            f"rdmasched top: replay at {s['t_ms']:.3f} of {s['span_ms']:.3f} ms "
            f"({s['events']}/{s['total']} events)"
        )
    else:
        out.append(f"rdmasched top: live {' '.join(s['addrs'])} ({s['events']} events)")
    col = 30
    per_row = max(1, width // col)
    nodes = s["nodes"]
    for i in range(0, len(nodes), per_row):
        row = nodes[i : i + per_row]
        lines: list[list[str]] = []
        for n in row:
            cell = [f"node {n['node']}  run {n['running']} q {n['queued']}"]
            if n["error"]:
                cell.append("  no good answer (below)")
            cell += [f"  {k}: {_task(t)}" for k, t in enumerate(n["slots"])]
            cell.append(_queue(n["queue"], col - 1))
            lines.append(cell)
        height = max(len(c) for c in lines)
        out.append("")
        for j in range(height):
            out.append(
                "".join((c[j] if j < len(c) else "")[: col - 1].ljust(col) for c in lines).rstrip()
            )
    errors = [f"node {n['node']}: {n['error']}" for n in nodes if n["error"]]
    errors += [f"{addr}: {e.removeprefix(addr + ': ')}" for addr, e in s.get("errors", {}).items()]
    if errors:
        out.append("")
        out += errors
    if s["groups"]:
        out.append("")
        out.append(
            "sync groups: " + "  ".join(f"group {g['group']} step {g['step']}" for g in s["groups"])
        )
    out.append("")
    out.append(
        f"{'ms':>10} {'node':>4} {'decision':<9} {'task':<16} {'rule':<14} {'ahead of':<16} cause"
    )
    for e in s["decisions"][:decisions]:
        out.append(
            f"{e['t_ms']:>10.3f} {e['node']:>4} {e['decision']:<9} {e.get('label', '-'):<16} "
            f"{e.get('rule') or '':<14} {e.get('beaten_label', ''):<16} {_cause(e)}"
        )
    return "\n".join(line[:width] for line in out) + "\n"


def run(
    source: Source,
    *,
    once: bool,
    at: float | None,
    interval_s: float = 0.5,
    speed: float = 0.01,
    out: TextIO = sys.stdout,
) -> int:
    """Draw frames until interrupted (``once``: one frame, no escapes). A trace replays
    from ``at`` (default: from the start; ``once``: the end) at ``speed`` x real time."""
    width = shutil.get_terminal_size((120, 40)).columns
    if once:
        out.write(frame(source.state(at), width))
        return 0
    pos = at if at is not None else 0.0
    while True:
        s = source.state(pos if isinstance(source, TraceSource) else None)
        out.write(CLEAR + frame(s, width))
        out.flush()
        time.sleep(interval_s)
        if isinstance(source, TraceSource) and source.t1 > source.t0:
            pos = min(1.0, pos + interval_s * 1e9 * speed / (source.t1 - source.t0))
