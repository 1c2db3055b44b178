"""`rdmasched cleanup`: stale shared-memory segments removed (transport/shm.py)."""

from __future__ import annotations

import argparse
import json

HELP = (
    "remove rdmasched shared-memory segments (/dev/shm/rdmasched.*) whose creating "
    "process is gone, e.g. after a node was killed with SIGKILL"
)


def add_arguments(clean: argparse.ArgumentParser) -> None:
    clean.add_argument("--json", action="store_true", help="print the removed names as JSON")


def main(args: argparse.Namespace) -> int:
    from rdmasched.transport import shm

    removed = shm.remove_stale()
    if args.json:
        print(json.dumps({"removed": removed}))
    elif removed:
        for name in removed:
            print(f"removed {shm.SHM_DIR}{name}")
    else:
        print("no stale rdmasched segments")
    return 0
