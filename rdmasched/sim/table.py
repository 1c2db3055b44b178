"""The simulator's text tables (`rdmasched sim` without --json): a row's cell by a dotted
key, and the columns right-aligned to their widest cell, with a note after a row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def cell(row: dict[str, Any], key: str, fmt: str) -> str:
    """`row`'s value at `key` ("a.b" looks inside the dict at "a") in `fmt`; "-" if none."""
    v: Any = row
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return "-" if v is None else fmt.format(v)


def text_table(head: Sequence[str], body: Sequence[Sequence[str]], notes: Sequence[str]) -> str:
    """`head` and the rows of `body`, each column right-aligned to its widest cell, each row
    followed by its note in `notes` ("" for none)."""
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)
    ]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    for b, note in zip(body, notes, strict=True):
        lines.append("  ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) + note)
    return "\n".join(lines)


def stopped_note(row: dict[str, Any]) -> str:
    """The note after a run that did not finish: why it stopped."""
    return "" if row.get("finished", True) else f"  ({row.get('stopped')})"
