"""The argument types and helpers every command shares, written once.

A type turns the text of one option into its value or raises `argparse.ArgumentTypeError`,
which argparse prints as one line (`Parser.error`) with exit 2. Bounds come from
rdmasched/limits.py where the library has them.
"""

from __future__ import annotations

import argparse
import math
import os
import urllib.parse
from collections.abc import Callable
from typing import Any, NoReturn

from rdmasched import limits

#: bounds of the values a command accepts; beyond them nothing useful happens on one host
MAX_SPIN_US = limits.MAX_SPIN_US
MAX_MS = 3_600_000.0
MAX_SECONDS = 3600.0


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line: what is wrong and where to look."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None and "default" in (action.help or ""):
            return action.help  # the help says what is taken instead of None
        text = super()._get_help_string(action)
        if text and isinstance(action.default, list):
            text = text.replace("%(default)s", " ".join(map(str, action.default)))
        return text


def add_command(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A (sub)command's parser under `sub` (an `add_subparsers` action): its help is its
    description, and every option's help shows its default."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=help, formatter_class=Help
    )
    return parser


class UserError(Exception):
    """A problem with what the user asked, found after parsing: one line, exit 1."""


def int_range(lo: int, hi: int | None = None, what: str = "an integer") -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"must be {what} in {bound}, not {text}")
        return value

    return parse


def float_range(lo: float, hi: float, *, lo_open: bool = True) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
        low_ok = value > lo if lo_open else value >= lo
        if not math.isfinite(value) or not low_ok or value > hi:
            interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise argparse.ArgumentTypeError(f"must be a finite number in {interval}, not {text}")
        return value

    return parse


def us_or_off(text: str) -> int:
    """A number of us > 0, or 'off' (0)."""
    if text.strip().lower() == "off":
        return 0
    return int_range(1, None, "a number of us > 0 or 'off'")(text)


def meta_sizes(text: str) -> tuple[int, ...]:
    """`all` or a comma-separated list of metadata sizes in bytes (0, or 5..4096)."""
    from rdmasched.bench import latency

    if text.strip() == "all":
        return latency.SIZES_ALL
    out: list[int] = []
    for part in text.split(","):
        try:
            size = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be 'all' or sizes in bytes like 0,64,4096, not {text!r}"
            ) from None
        try:
            latency.meta_of_size(size)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if size not in out:
            out.append(size)
    return tuple(out)


def node_counts(text: str) -> list[int]:
    """Cluster sizes, comma-separated: ``"1k, 10K,100000"`` -> ``[1000, 10000, 100000]``
    (a ``k`` suffix is x 1,000), each in 1..limits.MAX_NODES (`sim`, `topology`)."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        mult = 1000 if part.endswith("k") else 1
        digits = part[:-1] if mult > 1 else part
        if not digits.isdigit():
            raise argparse.ArgumentTypeError(
                f"must be node counts separated by commas (e.g. 1k,10k,100000), not {text!r}"
            )
        n = int(digits) * mult
        if not 1 <= n <= limits.MAX_NODES:
            raise argparse.ArgumentTypeError(f"{n} nodes is not in 1..{limits.MAX_NODES}")
        out.append(n)
    return out


def lane_slots(text: str) -> int:
    """A lane size in slots: the library's one rule (limits.check_lane_slots)."""
    try:
        return limits.check_lane_slots(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a power of two in {limits.LANE_SLOTS_MIN}..{limits.LANE_SLOTS_MAX}, "
            f"not {text}"
        ) from None


def jitter(text: str) -> float:
    value = float_range(0.0, 1.0, lo_open=False)(text)
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"must be a finite number in [0, 1), not {text}")
    return value


def output_file(suffix: str | None = None) -> Callable[[str], str]:
    """A file the command will write: not a directory, in a directory that exists and is
    writable, and named `*suffix` if one is given. Checked before anything runs."""

    def parse(text: str) -> str:
        if suffix is not None and not text.lower().endswith(suffix):
            raise argparse.ArgumentTypeError(
                f"must be a file name ending in {suffix}, not {text!r}"
            )
        if os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
        _writable_dir(os.path.dirname(os.path.abspath(text)))
        return text

    return parse


def output_dir(text: str) -> str:
    """A directory the command will write into: one that exists, or a new one in a directory
    that exists. Checked before anything runs."""
    if os.path.exists(text):
        if not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} is not a directory")
        _writable_dir(text)
    else:
        _writable_dir(os.path.dirname(os.path.abspath(text)))
    return text


def _writable_dir(d: str) -> None:
    if not os.path.isdir(d):
        raise argparse.ArgumentTypeError(f"no directory {d}")
    if not os.access(d, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {d} is not writable")


def host_port(text: str) -> str:
    """HOST:PORT, or a URL with both (a running daemon's metrics port); returned as given."""
    try:
        url = urllib.parse.urlsplit(text if "://" in text else f"http://{text}")
        port = url.port
    except ValueError:
        port = None
    if not url.hostname or port is None or not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT (a port in 1..65535), not {text!r}")
    return text


def check_liveness(parser: argparse.ArgumentParser, heartbeat_ms: int, dead_after_ms: int) -> None:
    """--heartbeat-ms and --dead-after-ms (`demo`, `sim`): the cluster config's rule
    (cluster.check_liveness), in the options' names."""
    from rdmasched.cluster import check_liveness as rule

    try:
        rule(heartbeat_ms, dead_after_ms)
    except ValueError:
        parser.error(
            f"--dead-after-ms ({dead_after_ms}) must be more than 2 x --heartbeat-ms "
            f"({heartbeat_ms}), as cluster.dead_after_ms and cluster.heartbeat_ms"
        )


positive = int_range(1, None, "a positive integer")
spin_us = int_range(0, MAX_SPIN_US, "a whole number of microseconds")
slice_us = int_range(limits.SLICE_US_MIN, limits.SLICE_US_MAX, "a whole number of microseconds")
exec_slots = int_range(1, limits.EXEC_SLOTS_MAX, "a number of execution slots")
ms = float_range(0.0, MAX_MS)
positive_float = float_range(0.0, MAX_SECONDS)
fraction = float_range(0.0, 1.0, lo_open=False)
#: liveness options (`demo`, `sim`): a heartbeat period and a dead-peer time, ms
heartbeat_ms = int_range(1, 60_000, "a number of ms")
dead_after_ms = int_range(3, 600_000, "a number of ms")


class _Renamed(argparse.Action):
    """An old spelling that meant different things in different commands: say what to use."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        self.new = kw.pop("new")
        super().__init__(option_strings, dest, nargs=1, help=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        parser.error(f"--slots was renamed: use {self.new}")


def add_lane_slots(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument(
        "--lane-slots",
        type=lane_slots,
        default=default,
        help="lane size, in 64-byte slots (a power of two)",
    )
    p.add_argument("--slots", action=_Renamed, new="--lane-slots (lane size, in 64-byte slots)")


def add_exec_slots(p: argparse.ArgumentParser, default: int, what: str) -> None:
    p.add_argument("--exec-slots", type=exec_slots, default=default, help=what)
    p.add_argument(
        "--slots", action=_Renamed, new="--exec-slots (execution slots, i.e. GPUs, per node)"
    )


def token_file(text: str) -> bytes:
    """A file holding a daemon's metrics bearer token (its `--metrics-token-file`), read
    now: a missing or bad file is a usage error (one line, exit 2)."""
    from rdmasched.errors import ConfigError
    from rdmasched.telemetry.http import read_token

    try:
        return read_token(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_token_file(p: argparse.ArgumentParser) -> None:
    """`--token-file`: what a reader of a live daemon's metrics port sends (docs/TELEMETRY.md)."""
    p.add_argument(
        "--token-file",
        metavar="FILE",
        type=token_file,
        default=None,
        dest="token",
        help="with --live: a file holding the daemons' metrics bearer token (their "
        "--metrics-token-file), sent as Authorization: Bearer (default none)",
    )


def json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
