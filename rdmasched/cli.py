"""The `rdmasched` command: demo, daemon, sim, bench, trace, mirror, top, why, doctor,
cleanup, topology.

This module is the shell: it builds the parser from the commands and runs the one asked for.
Each command is a module of rdmasched/commands/ that registers its own arguments
(`add_arguments(p)`), checks what one option alone cannot say (`check(parser, args)`, where
it has any) and runs (`main(args)`); the argument types they share are commands/args.py.
Argument checking happens before anything starts; the work lives in the library modules the
commands call (which never import the commands or this module). A user error is one line on
stderr and a non-zero exit (2 for a bad argument, 1 for a problem found while running), never
a traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from types import ModuleType

from rdmasched.commands import (
    bench,
    cleanup,
    daemon,
    demo,
    doctor,
    mirror,
    sim,
    top,
    topology,
    trace,
    trace_export,
    why,
)
from rdmasched.commands.args import Help, Parser, UserError, add_command
from rdmasched.errors import RdmaschedError

DESCRIPTION = (
    "The `rdmasched` command. A bad argument is one line on stderr and exit 2; a problem "
    "found while running one line and exit 1; never a traceback."
)

#: every command, in the order of `rdmasched --help`; `trace export` is a command of its own
#: that main() routes to (so that `trace DIR` keeps its meaning)
COMMANDS: dict[str, ModuleType] = {
    "demo": demo,
    "daemon": daemon,
    "sim": sim,
    "bench": bench,
    "trace": trace,
    "trace export": trace_export,
    "mirror": mirror,
    "top": top,
    "why": why,
    "doctor": doctor,
    "cleanup": cleanup,
    "topology": topology,
}


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from rdmasched import __version__

    p = Parser(prog="rdmasched", description=DESCRIPTION, formatter_class=Help)
    p.add_argument("--version", action="version", version=f"rdmasched {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {}
    for name, command in COMMANDS.items():
        parsers[name] = add_command(sub, name, command.HELP)
        command.add_arguments(parsers[name])
    return p, parsers


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (tests and `bench all` parse with it)."""
    return _build()[0]


def _demo_error() -> type[Exception]:
    from rdmasched.demo.runner import DemoError

    return DemoError


def main(argv: Sequence[str] | None = None) -> int:
    parser, parsers = _build()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["trace", "export"]:  # a sub-command of trace, beside `trace DIR`
        argv[:2] = ["trace export"]
    try:
        args = parser.parse_args(argv)
        command = COMMANDS[args.command]
        if hasattr(command, "check"):  # what one option alone cannot say
            command.check(parsers[args.command], args)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    prog = f"rdmasched {args.command}" + (f" {args.bench}" if args.command == "bench" else "")
    try:
        code: int = command.main(args)
        return code
    except BrokenPipeError:
        # The reader went away (`rdmasched trace DIR | head`): stop quietly, as Unix tools do.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP in the demo (runner.Interrupted)
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"{prog}: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    except _demo_error() as exc:  # what went wrong in the node processes, in full
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except (UserError, RdmaschedError) as exc:
        text = " ".join(str(exc).split("\n")[0].split())
        print(f"{prog}: error: {text}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
