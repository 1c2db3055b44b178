"""Odd entries in /dev/shm (issue 20 items 11 and 12). /dev/shm is writable by every local
user and rdmasched's names are predictable: a directory, a symlink, random bytes, an empty
file or a FIFO named ``rdmasched.*`` must neither stop ``rdmasched cleanup`` (it skips and
reports them and removes the rest) nor make a daemon's start-up die with a traceback (it
refuses in one line naming the entry and its owner, and never follows a symlink)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rdmasched.cli import main
from rdmasched.errors import LaneBusyError
from rdmasched.transport import shm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cluster() -> Iterator[str]:
    name = f"sq{os.getpid()}-{uuid.uuid4().hex[:6]}"
    yield name
    for e in os.listdir(shm.SHM_DIR):
        if e.startswith(f"rdmasched.{name}."):
            p = os.path.join(shm.SHM_DIR, e)
            if os.path.isdir(p) and not os.path.islink(p):
                os.rmdir(p)
            else:
                os.unlink(p)


def stale_lane(name: str) -> None:
    """A lane whose receiver is gone: made by a child that exits without closing it."""
    code = f"from rdmasched.transport import shm; rx = shm.create_lane({name!r}, 16)"
    code += "; import os; os._exit(0)"
    env = os.environ | {"PYTHONPATH": ROOT}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env)


def squat(cluster: str, tmp_path: Any) -> dict[str, str]:
    """Every kind of odd entry under the cluster's names; name -> what it is."""
    d = shm.SHM_DIR + "/rdmasched." + cluster
    target = tmp_path / "target"
    target.write_bytes(b"keep me")
    os.mkdir(d + ".dir")
    os.symlink(target, d + ".link")
    with open(d + ".random", "wb") as f:
        f.write(os.urandom(4096))
    with open(d + ".small", "wb") as f:
        f.write(os.urandom(100))
    open(d + ".empty", "wb").close()
    os.mkfifo(d + ".fifo")
    return {
        d + ".dir": "a directory",
        d + ".link": "a symlink",
        d + ".random": "not an rdmasched segment",
        d + ".small": "not an rdmasched segment",
        d + ".empty": "empty",
        d + ".fifo": "a FIFO",
    }


def test_cleanup_skips_odd_entries_and_removes_the_stale_ones(cluster: str, tmp_path: Any) -> None:
    odd = squat(cluster, tmp_path)
    stale_lane(f"{cluster}.a")
    stale_lane(f"{cluster}.z")  # sorted after every odd entry: cleanup goes on past them
    live = shm.create_lane(f"{cluster}.live", 16)
    try:
        dry = shm.cleanup(cluster=cluster, dry_run=True)
        assert dry.removed == [f"/rdmasched.{cluster}.a", f"/rdmasched.{cluster}.z"]
        assert os.path.exists(f"{shm.SHM_DIR}/rdmasched.{cluster}.a")  # a dry run removes nothing
        rep = shm.cleanup(cluster=cluster)
        assert rep.removed == dry.removed and not rep.dry_run
        assert not os.path.exists(f"{shm.SHM_DIR}/rdmasched.{cluster}.z")
        assert rep.live == [f"/rdmasched.{cluster}.live"]
        skipped = dict(rep.skipped)
        for path, what in odd.items():
            assert what in skipped["/" + os.path.basename(path)], skipped
            assert os.path.lexists(path)  # skipped, not removed
        assert (tmp_path / "target").read_bytes() == b"keep me"
        other = shm.cleanup(cluster=cluster + "x", dry_run=True)  # another cluster: none of it
        assert other.removed == other.skipped == other.live == []
    finally:
        live.close()


def test_the_cleanup_command_reports_and_exits_0(
    cluster: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    squat(cluster, tmp_path)
    stale_lane(f"{cluster}.a")
    assert main(["cleanup", "--cluster", cluster, "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert f"would remove {shm.SHM_DIR}/rdmasched.{cluster}.a" in out.out
    assert f"skipped {shm.SHM_DIR}/rdmasched.{cluster}.dir: a directory" in out.out
    assert main(["cleanup", "--cluster", cluster]) == 0
    assert f"removed {shm.SHM_DIR}/rdmasched.{cluster}.a" in capsys.readouterr().out
    assert main(["cleanup", "--cluster", "bad/name"]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run cleanup as another user")
def test_cleanup_as_another_user_skips_roots_live_segment(cluster: str, tmp_path: Any) -> None:
    live = shm.create_lane(f"{cluster}.live", 16)
    try:
        r = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
             sys.executable, "-m", "rdmasched", "cleanup", "--cluster", cluster],
            capture_output=True, text=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": ROOT},
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        assert f"skipped {shm.SHM_DIR}/rdmasched.{cluster}.live: belongs to user root" in r.stdout
        assert os.path.exists(f"{shm.SHM_DIR}/rdmasched.{cluster}.live")
    finally:
        live.close()


@pytest.mark.parametrize("kind", ["dir", "link", "random", "small", "empty", "fifo"])
def test_a_squatter_on_a_lane_name_is_refused_in_one_line(
    kind: str, cluster: str, tmp_path: Any
) -> None:
    odd = squat(cluster, tmp_path)
    path = f"{shm.SHM_DIR}/rdmasched.{cluster}.{kind}"
    with pytest.raises(LaneBusyError) as exc:
        shm.create_lane(f"{cluster}.{kind}", 16)
    text = str(exc.value)
    assert path in text and odd[path] in text and "owned by user root" in text, text
    assert "\n" not in text
    assert os.path.lexists(path)
    assert (tmp_path / "target").read_bytes() == b"keep me"  # the link was not followed


def test_a_stale_lane_is_still_replaced(cluster: str) -> None:
    stale_lane(f"{cluster}.a")
    with shm.create_lane(f"{cluster}.a", 16) as rx:
        assert rx.segment.size == shm.segment_size(16)


def test_the_daemon_refuses_a_squatted_lane_in_one_line(cluster: str, tmp_path: Any) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[cluster]\nname = "{cluster}"\n\n[[node]]\nname = "h0"\nslots = 1\n')
    os.mkdir(f"{shm.SHM_DIR}/rdmasched.{cluster}.h0.c0.up")
    r = subprocess.run(
        [sys.executable, "-m", "rdmasched", "daemon", "--config", str(cfg), "--node", "0"],
        capture_output=True, text=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": ROOT},
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 1, r
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert f"rdmasched.{cluster}.h0.c0.up" in r.stderr and "a directory" in r.stderr
