"""Reading the files a user names (a cluster config, a topology file, a Slurm topology.conf,
a token file): one bounded read, one TOML parse, and one mapping of every way they fail to a
`ConfigError` that names the file and what it was meant to be.

Imports only the errors and the limits, so the cluster config and the topology both use it.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from rdmasched.errors import ConfigError
from rdmasched.limits import FILE_BYTES_MAX


def read_text(path: str | os.PathLike[str], what: str, expected: str = "a text file") -> str:
    """The UTF-8 text of the file at `path`, its newlines read as Python's text mode reads
    them; every way it can fail is a ConfigError that names `what` and the path (missing, a
    directory (not `expected`), unreadable, larger than FILE_BYTES_MAX, not UTF-8)."""
    return _read(Path(path), what, expected, "")


def read_toml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """The TOML file at `path` as a dict; every way it can fail is a ConfigError that names
    `what` and the path (as `read_text`, or not TOML)."""
    p = Path(path)
    text = _read(p, what, "a TOML file", "; TOML is UTF-8")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {p} is not valid TOML: {exc}") from None


def _read(p: Path, what: str, expected: str, utf8_note: str) -> str:
    try:
        with p.open("rb") as f:
            data = f.read(FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        raise ConfigError(f"{what} {p} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {p} is a directory, not {expected}") from None
    except OSError as exc:
        raise ConfigError(f"{what} {p}: {exc.strerror or exc}") from None
    if len(data) > FILE_BYTES_MAX:
        raise ConfigError(f"{what} {p} is larger than {FILE_BYTES_MAX >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {p} is not UTF-8 text (byte {exc.start}){utf8_note}") from None
    # universal newlines, as Path.read_text reads them
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
