"""`rdmasched cleanup`: stale shared-memory segments removed (transport/shm.py, `cleanup`)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from rdmasched.commands.args import UserError

HELP = (
    "remove rdmasched shared-memory segments (/dev/shm/rdmasched.*) whose creating "
    "process is gone, e.g. after a node was killed with SIGKILL; entries that are not "
    "rdmasched segments (a directory, a symlink, another user's file) are skipped and reported"
)


def add_arguments(clean: argparse.ArgumentParser) -> None:
    clean.add_argument(
        "--json", action="store_true", help="print what was removed, live and skipped as JSON"
    )
    clean.add_argument(
        "--cluster", metavar="NAME", help="only this cluster's segments (default all)"
    )
    clean.add_argument(
        "--dry-run", action="store_true", help="say what would be removed; remove nothing"
    )


def main(args: argparse.Namespace) -> int:
    from rdmasched.transport import shm

    try:
        rep = shm.cleanup(args.cluster, dry_run=args.dry_run)
    except ValueError as exc:
        raise UserError(f"--cluster {args.cluster!r}: {exc}") from None
    if args.json:
        print(json.dumps(dataclasses.asdict(rep)))
        return 0
    verb = "would remove" if rep.dry_run else "removed"
    for name in rep.removed:
        print(f"{verb} {shm.SHM_DIR}{name}")
    for name, why in rep.skipped:
        print(f"skipped {shm.SHM_DIR}{name}: {why}")
    if not rep.removed:
        print("no stale rdmasched segments")
    return 0
