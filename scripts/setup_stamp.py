"""The stamp of what scripts/setup.sh installs and builds from, so a second run with nothing
changed skips pip and the ~1.5-minute Cython build.

    python scripts/setup_stamp.py check STAMP   exit 0 if STAMP matches this checkout
    python scripts/setup_stamp.py write STAMP   record this checkout's stamp in STAMP

The inputs: scripts/setup.sh itself (its Debian package list and pip steps), setup.py,
pyproject.toml (dependencies, build requirements), every file under cython/ (the hot path's
.pyx/.pxd/.h), the scheduler source Cython compiles (rdmasched/scheduler/core.py,
core.pxd, task.py and task.pxd; the node core rdmasched/daemon/core.py and core.pxd), and
the Python that runs this (the venv's interpreter and its version). Any change to one of
them, or a missing stamp, means a full set-up. Standard library only: it runs before
anything is installed.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = (
    "scripts/setup.sh",
    "setup.py",
    "pyproject.toml",
    "rdmasched/scheduler/core.py",
    "rdmasched/scheduler/core.pxd",
    "rdmasched/scheduler/task.py",
    "rdmasched/scheduler/task.pxd",
    "rdmasched/daemon/core.py",
    "rdmasched/daemon/core.pxd",
)
TREES = ("cython",)
#: build outputs and caches under the trees, never inputs
SKIP_SUFFIXES = (".c", ".so", ".o", ".html", ".pyc")


def inputs(root: Path = ROOT) -> list[Path]:
    """The files the set-up depends on, in a stable order."""
    found = [root / f for f in FILES if (root / f).is_file()]
    for tree in TREES:
        base = root / tree
        if base.is_dir():
            found += sorted(
                p
                for p in base.rglob("*")
                if p.is_file()
                and not p.name.endswith(SKIP_SUFFIXES)
                and "__pycache__" not in p.parts
            )
    return found


def stamp(root: Path = ROOT, python: str | None = None) -> str:
    """A digest of every input's path and content, and of the interpreter."""
    h = hashlib.sha256()
    h.update(f"python {python or sys.executable} {sys.version}\n".encode())
    for p in inputs(root):
        h.update(f"{p.relative_to(root)}\n".encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def main(argv: list[str], root: Path = ROOT) -> int:
    if len(argv) != 2 or argv[0] not in ("check", "write"):
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[1])
    now = stamp(root)
    if argv[0] == "write":
        path.write_text(now + "\n")
        return 0
    try:
        return 0 if path.read_text().strip() == now else 1
    except OSError:
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
