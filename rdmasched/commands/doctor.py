"""`rdmasched doctor`: RDMA devices, ports, GIDs; is Soft-RoCE usable here (doctor.py)."""

from __future__ import annotations

import argparse

from rdmasched.commands.args import json_flag

HELP = "RDMA devices, ports, GIDs; is Soft-RoCE usable here"


def add_arguments(p: argparse.ArgumentParser) -> None:
    json_flag(p)


def main(args: argparse.Namespace) -> int:
    from rdmasched import doctor

    return doctor.main(args.json)
