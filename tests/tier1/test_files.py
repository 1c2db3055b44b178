"""Reading the files a user names (rdmasched/files.py): one mapping of every failure to a
ConfigError naming the file; a bound on the size; newlines read as text mode reads them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdmasched import files
from rdmasched.errors import ConfigError


def test_every_failure_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^the thing {tmp_path}/nope does not exist$"):
        files.read_text(tmp_path / "nope", "the thing")
    with pytest.raises(ConfigError, match=f"^the thing {tmp_path} is a directory, not a conf$"):
        files.read_text(tmp_path, "the thing", "a conf")
    (tmp_path / "bin").write_bytes(b"ok\xff")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 2\)$"):
        files.read_text(tmp_path / "bin", "the thing")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 2\); TOML is UTF-8$"):
        files.read_toml(tmp_path / "bin", "the thing")
    (tmp_path / "bad.toml").write_text("a = \n")
    with pytest.raises(ConfigError, match=r"the thing .*bad\.toml is not valid TOML"):
        files.read_toml(tmp_path / "bad.toml", "the thing")


def test_a_file_past_the_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "FILE_BYTES_MAX", 1 << 20)
    (tmp_path / "big").write_bytes(b"x" * ((1 << 20) + 1))
    with pytest.raises(ConfigError, match="big is larger than 1 MiB"):
        files.read_text(tmp_path / "big", "the thing")
    (tmp_path / "fits").write_bytes(b"x" * (1 << 20))
    assert len(files.read_text(tmp_path / "fits", "the thing")) == 1 << 20


def test_newlines_read_as_text_mode_reads_them(tmp_path: Path) -> None:
    (tmp_path / "t.toml").write_bytes(b"a = 1\r\nb = 2\rc = 3\n")
    assert files.read_text(tmp_path / "t.toml", "x") == "a = 1\nb = 2\nc = 3\n"
    assert files.read_toml(tmp_path / "t.toml", "x") == {"a": 1, "b": 2, "c": 3}


def test_a_device_or_fifo_is_refused_without_reading_it(tmp_path: Path) -> None:
    """`daemon --config /dev/zero` (issue 20 item 14): refused at once, never read into
    memory; a FIFO is refused without waiting for a writer."""
    with pytest.raises(ConfigError, match="cluster config /dev/zero is a character device"):
        files.read_toml("/dev/zero", "cluster config")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is a FIFO"):
        files.read_toml(fifo, "cluster config")
