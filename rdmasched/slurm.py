"""Slurm's formats: hostlist expressions (``node[001-003,7]``) and the tree plugin's
``topology.conf`` (``SwitchName=... Switches=... Nodes=...``), parsed into `Switch` entries.

The topology (rdmasched/topology.py) builds its model from the switches; the launcher
(rdmasched/launch.py) expands a job's node list and cuts a topology.conf down to its hosts.
Both parse in time linear in the text (a topology.conf of a million host names takes
seconds, not hours).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rdmasched.errors import ConfigError

MAX_HOSTLIST = 1 << 20

_SWITCH_NAME = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


# ---- Slurm hostlist expressions -------------------------------------------------------------
def expand_hostlist(expr: str) -> list[str]:
    """``"node[001-003,7],gpu1"`` -> ``["node001", "node002", "node003", "node007", "gpu1"]``.

    Slurm's syntax: names separated by commas outside brackets; each bracket holds a comma
    list of numbers and ranges ``lo-hi``, zero-padded to the width of ``lo`` when ``lo`` has a
    leading zero; several brackets in one name expand as a product (``r[1-2]n[1-2]``).
    """
    names: list[str] = []
    for item in _split_top(expr):
        names.extend(_expand_one(item, expr))
        if len(names) > MAX_HOSTLIST:
            raise ConfigError(f"hostlist {expr!r} names more than {MAX_HOSTLIST} hosts")
    return names


def _split_top(expr: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in expr.strip():
        if ch == "[":
            if depth:
                raise ConfigError(f"hostlist {expr!r}: nested '['")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ConfigError(f"hostlist {expr!r}: ']' without '['")
            depth = 0
        elif ch == "," and not depth:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if depth:
        raise ConfigError(f"hostlist {expr!r}: '[' is never closed")
    parts.append("".join(cur))
    for p in parts:
        if not p.strip():
            raise ConfigError(f"hostlist {expr!r} has an empty name")
    return [p.strip() for p in parts]


def _expand_one(item: str, expr: str) -> list[str]:
    out = [""]
    pos = 0
    while pos < len(item):
        lb = item.find("[", pos)
        if lb < 0:
            text, pos = item[pos:], len(item)
            out = [o + text for o in out]
            continue
        rb = item.index("]", lb)
        text = item[pos:lb]
        values = _expand_range(item[lb + 1 : rb], expr)
        out = [o + text + v for o in out for v in values]
        if len(out) > MAX_HOSTLIST:
            raise ConfigError(f"hostlist {expr!r} names more than {MAX_HOSTLIST} hosts")
        pos = rb + 1
    for name in out:
        if not _HOST_NAME.match(name):
            raise ConfigError(f"hostlist {expr!r}: {name!r} is not a valid host name")
    return out


def _expand_range(body: str, expr: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        part = part.strip()
        lo_s, dash, hi_s = part.partition("-")
        if not lo_s.isdigit() or (dash and not hi_s.isdigit()):
            raise ConfigError(f"hostlist {expr!r}: bad range {part!r} in [{body}]")
        lo = int(lo_s)
        hi = int(hi_s) if dash else lo
        if hi < lo:
            raise ConfigError(f"hostlist {expr!r}: range {part!r} runs backwards")
        if hi - lo >= MAX_HOSTLIST:
            raise ConfigError(f"hostlist {expr!r}: range {part!r} is too long")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        values.extend(f"{i:0{width}d}" for i in range(lo, hi + 1))
    return values


# ---- topology.conf ---------------------------------------------------------------------------
# one piece of a line: an unquoted run, a '...' or "..." string (a backslash pairs with the
# character after it), a backslash and the character it escapes, or a run of blanks
_PIECE = re.compile(r"""[^ \t\r\n'"\\]+|'[^']*'|"(?:[^"\\]|\\.)*"|\\.|[ \t\r\n]+""", re.S)
_OPEN_DQ = re.compile(r'"(?:[^"\\]|\\.)*', re.S)
_DQ_ESCAPE = re.compile(r'\\(["\\])')


def split_words(line: str) -> list[str]:
    """`line` split into words as ``shlex.split(line)`` (POSIX mode) splits it, in time
    linear in its length (shlex grows each word a character at a time: quadratic, minutes for
    a line of a million host names). Words are separated by blanks; '...' keeps its text as
    is; inside "..." a backslash escapes only ``"`` and ``\\``; outside quotes it escapes any
    character. ValueError "No closing quotation" or "No escaped character", as shlex's."""
    words: list[str] = []
    word: list[str] = []
    quoted = False  # the word has a quoted part (so '' is a word)
    pos, end = 0, len(line)
    while pos < end:
        m = _PIECE.match(line, pos)
        if m is None:  # an open quote, or a backslash at the end (inside "..." or not)
            if line[pos] == '"':
                inner = _OPEN_DQ.match(line, pos)
                if inner is not None and inner.end() < end:
                    raise ValueError("No escaped character")
                raise ValueError("No closing quotation")
            raise ValueError("No closing quotation" if line[pos] == "'" else "No escaped character")
        piece = m.group()
        pos = m.end()
        c = piece[0]
        if c in " \t\r\n":
            if word or quoted:
                words.append("".join(word))
                word, quoted = [], False
        elif c == "'":
            word.append(piece[1:-1])
            quoted = True
        elif c == '"':
            word.append(_DQ_ESCAPE.sub(r"\1", piece[1:-1]))
            quoted = True
        elif c == "\\":
            word.append(piece[1])
        else:
            word.append(piece)
    if word or quoted:
        words.append("".join(word))
    return words


# ---- the switch tree (Slurm's and the TOML explicit form) ------------------------------------
@dataclass(frozen=True)
class Switch:
    """One ``SwitchName`` line: a leaf (``nodes``) or an inner switch (``switches``)."""

    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()
    where: str = ""


def parse_slurm(text: str, source: str = "topology.conf") -> list[Switch]:
    """The switches of a Slurm ``topology.conf`` (tree plugin)."""
    switches: list[Switch] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno = i + 1
        parts = [lines[i].split("#", 1)[0].rstrip()]
        i += 1
        while parts[-1].endswith("\\") and i < len(lines):  # joined once: linear
            parts[-1] = parts[-1][:-1]
            parts.append(lines[i].split("#", 1)[0].rstrip())
            i += 1
        line = " ".join(parts)
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            tokens = split_words(line)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        fields: dict[str, str] = {}
        for tok in tokens:
            key, eq, value = tok.partition("=")
            k = key.lower()
            if not eq:
                raise ConfigError(f"{where}: expected key=value, not {tok!r}")
            if k not in ("switchname", "switches", "nodes", "linkspeed"):
                raise ConfigError(
                    f"{where}: unknown key {key!r}; the tree plugin's lines have "
                    "SwitchName, Switches, Nodes, LinkSpeed"
                )
            if k in fields:
                raise ConfigError(f"{where}: {key} given twice")
            fields[k] = value
        if "switchname" not in fields or next(iter(fields)) != "switchname":
            raise ConfigError(f"{where}: a line must start with SwitchName=")
        if "linkspeed" in fields and not fields["linkspeed"].isdigit():
            raise ConfigError(f"{where}: LinkSpeed must be an integer")
        switches.append(
            make_switch(
                fields["switchname"],
                fields.get("nodes"),
                fields.get("switches"),
                where,
            )
        )
    return switches


def make_switch(name: str, nodes: str | None, children: str | None, where: str) -> Switch:
    if not _SWITCH_NAME.match(name):
        raise ConfigError(f"{where}: switch name {name!r} is not valid")
    if nodes is not None and children is not None:
        raise ConfigError(f"{where}: switch {name} has both child switches and nodes")
    return Switch(
        name,
        tuple(expand_hostlist(nodes)) if nodes else (),
        tuple(expand_hostlist(children)) if children else (),
        where,
    )
