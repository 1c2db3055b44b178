"""Reading the files a user names: one bounded read, regular files only.

A reader of a user's file (a cluster config, a topology file, a Slurm topology.conf, a token
file, a trace, a workload) must not block on a FIFO, read ``/dev/zero`` until memory runs out,
or inflate a gzip bomb: ``open_regular`` opens a path only if it is a regular file (without
blocking on a FIFO), and ``read_bytes`` reads at most ``limit`` bytes of it, gunzipped (if
asked) to at most ``limit`` bytes too. ``FileRefused`` (a ValueError naming the path) is a
file it will not read; ``OSError`` goes through; each caller turns both into its own error
type (TraceError, WorkloadError, ConfigError), naming the file.

For the config files (``read_text``, ``read_toml``) that mapping is here too: one TOML parse
and every way they fail as a `ConfigError` that names the file and what it was meant to be.

Imports only the errors and the limits, so any layer may use it.
"""

from __future__ import annotations

import os
import stat
import tomllib
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from rdmasched.errors import ConfigError
from rdmasched.limits import FILE_BYTES_MAX

GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


class FileRefused(ValueError):
    """A file this module will not read: not a regular file, larger than allowed, or a
    damaged gzip. The message names the path."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading (binary), if it is a regular file (a symlink to one is
    fine); FileRefused if it is not (a directory, a FIFO, a device: ``/dev/zero``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO: no wait for a writer
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = _kind(mode)
            what = what if what == "not a regular file" else f"{what}, not a regular file"
            raise FileRefused(f"{os.fspath(path)} is {what}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], limit: int, *, gunzip: bool = False) -> bytes:
    """At most ``limit`` bytes of the regular file ``path`` (FileRefused if it holds more);
    with ``gunzip``, a gzipped file (by its magic) is inflated, to at most ``limit`` bytes."""
    with open_regular(path) as f:
        raw = f.read(limit + 1)
    name = os.fspath(path)
    if len(raw) > limit:
        raise FileRefused(f"{name} is larger than {_size(limit)}: not read")
    if gunzip and raw[:2] == GZIP_MAGIC:
        return _gunzip(raw, limit, name)
    return raw


def _gunzip(raw: bytes, limit: int, name: str) -> bytes:
    """``raw`` (every gzip member in it) inflated to at most ``limit`` bytes."""
    out: list[bytes] = []
    total = 0
    data = raw
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        buf = data
        try:
            while True:
                chunk = d.decompress(buf, _CHUNK)
                total += len(chunk)
                if total > limit:
                    raise FileRefused(f"{name} inflates to more than {_size(limit)}: not read")
                out.append(chunk)
                buf = d.unconsumed_tail
                if d.eof or not (buf or chunk):
                    break
        except zlib.error as exc:
            raise FileRefused(f"{name}: truncated or damaged gzip ({exc})") from None
        if not d.eof:
            raise FileRefused(f"{name}: truncated or damaged gzip (it ends inside a member)")
        data = d.unused_data.lstrip(b"\0")  # another member, or the padding some tools add
    return b"".join(out)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


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
        with open_regular(p) as f:
            data = f.read(FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        raise ConfigError(f"{what} {p} does not exist") from None
    except (IsADirectoryError, FileRefused) as exc:
        if p.is_dir():
            raise ConfigError(f"{what} {p} is a directory, not {expected}") from None
        raise ConfigError(f"{what} {exc}") from None
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
