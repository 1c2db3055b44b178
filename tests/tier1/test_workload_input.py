"""Hostile workload and config files (issue 20 item 14): `sim --workload` reads at most so
many bytes of a regular file (/dev/zero, a FIFO, a gzip bomb are one line, not exhausted
memory or a wait forever); a trace nested too deep or holding Infinity is a WorkloadError,
not a RecursionError or an OverflowError. rdmasched.files is the one bounded read."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import resource
import subprocess
import sys
import zlib
from typing import Any

import pytest

from rdmasched import files
from rdmasched.errors import WorkloadError
from rdmasched.workload import load, model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "tests", "data", "traces", "mlp.json.gz")


def _small_memory() -> None:  # a reader that would read /dev/zero whole fails fast
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def sim(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmasched", "sim", "--sizes", "4", "--workload", path],
        capture_output=True, text=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": ROOT},
        timeout=120, preexec_fn=_small_memory,
    )  # fmt: skip


@pytest.mark.parametrize("what", ["/dev/zero", "fifo"])
def test_sim_workload_of_a_device_or_a_fifo_is_one_line(what: str, tmp_path: Any) -> None:
    path = what
    if what == "fifo":
        path = str(tmp_path / "w.json")
        os.mkfifo(path)
    r = sim(path)
    assert r.returncode == 1, r
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "not a regular file" in r.stderr


def test_a_gzip_bomb_is_refused_past_the_bound(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(model, "MAX_TRACE_BYTES", 1 << 20)
    p = tmp_path / "bomb.json.gz"
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(p, "wb") as f:
        f.write(c.compress(b"["))
        for _ in range(16):
            f.write(c.compress(b" " * (1 << 20)))
        f.write(c.compress(b"]") + c.flush())
    assert p.stat().st_size < 64 << 10
    with pytest.raises(WorkloadError, match="inflates to more than 1 MiB"):
        load(p)


def test_a_trace_nested_too_deep_is_a_workload_error(tmp_path: Any) -> None:
    p = tmp_path / "deep.json"
    p.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(WorkloadError, match="nested too deep"):
        load(p)


@pytest.mark.parametrize("field", ["ts", "dur", "nelems"])
def test_infinity_in_a_trace_is_no_overflow(field: str, tmp_path: Any) -> None:
    with open(MLP, "rb") as f:
        doc = json.loads(gzip.decompress(f.read()))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    for ev in events:
        if ev.get("ph") == "X":
            if field == "nelems":
                ev.setdefault("args", {})["In msg nelems"] = float("inf")
            else:
                ev[field] = float("inf")
    p = tmp_path / "inf.json"
    p.write_text(json.dumps(doc))  # json writes Infinity
    with contextlib.suppress(WorkloadError):  # refused in one error, or read without them
        load(p)


def test_bounded_read_refuses_what_it_must(tmp_path: Any) -> None:
    with pytest.raises(files.FileRefused, match="a character device"):
        files.read_bytes("/dev/zero", 1 << 20)
    with pytest.raises(files.FileRefused, match="a directory"):
        files.read_bytes(tmp_path, 1 << 20)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1025)
    with pytest.raises(files.FileRefused, match="larger than 1 KiB"):
        files.read_bytes(big, 1024)
    assert files.read_bytes(big, 1025) == b"x" * 1025
    gz = tmp_path / "two.gz"
    gz.write_bytes(gzip.compress(b"ab") + gzip.compress(b"cd"))
    assert files.read_bytes(gz, 100, gunzip=True) == b"abcd"
    gz.write_bytes(gzip.compress(b"abcd" * 100)[:-12])
    with pytest.raises(files.FileRefused, match="truncated or damaged gzip"):
        files.read_bytes(gz, 1000, gunzip=True)
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b"\0" * 100_000))
    with pytest.raises(files.FileRefused, match="inflates to more than 1000 bytes"):
        files.read_bytes(bomb, 1000, gunzip=True)
