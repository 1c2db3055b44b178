"""The spin windows as settings (docs/DAEMON.md and docs/CLIENT.md, "Spinning"): a real
`rdmasched daemon --spin-us 0` whose loop and client reader spin 0 us serves a client whose
reader spins 0 us (RDMASCHED_SPIN_US, through `Client.from_env`); bad values are one line.
And the slice (DAEMON.md and CLIENT.md, "The slice"): `--slice-us` reaches the loop thread,
RDMASCHED_SLICE_US a client's reader."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmasched import launch
from rdmasched.client import CLIENT_SPIN_US, Client
from rdmasched.errors import ArgumentError, ConfigError
from rdmasched.limits import MAX_SPIN_US
from rdmasched.scheduler import Task

ROOT = Path(__file__).resolve().parents[2]
CMD = "import sys; from rdmasched.cli import main; sys.exit(main(sys.argv[1:]))"


@contextlib.contextmanager
def _daemon(tmp_path: Path, *options: str) -> Iterator[tuple[str, str]]:
    """`rdmasched daemon --config ... OPTIONS --log-level info` of a new one-host cluster of
    2 slots: (the cluster's name, its log up to "serving clients"); stopped by SIGTERM after
    the body, which must exit 0."""
    name = f"s{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(f'[cluster]\nname = "{name}"\n\n[[node]]\nname = "h0"\nslots = 2\n')
    argv = ["daemon", "--config", str(cfg), "--node", "h0", *options]
    d = subprocess.Popen(
        [sys.executable, "-c", CMD, *argv, "--log-level", "info"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert d.stdout is not None and d.stderr is not None
        line = d.stdout.readline()
        assert f"at {name}.h0" in line, line
        log = ""
        while "serving clients" not in log:
            more = d.stderr.readline()
            assert more, log
            log += more
        yield name, log
        d.send_signal(signal.SIGTERM)
        assert d.wait(60) == 0
    finally:
        if d.poll() is None:
            d.kill()
            d.wait()


def test_a_daemon_started_with_spin_0_spins_0_and_serves_a_client_spinning_0(
    tmp_path: Path,
) -> None:
    with _daemon(tmp_path, "--spin-us", "0") as (name, log):
        # the option reached the loop, which reads the clients' lanes too (shm links)
        assert "the loop spins 0 us, the clients' reader is the loop" in log, log
        env = {"RDMASCHED_CLUSTER": name, "RDMASCHED_HOST": "h0", "LOCAL_RANK": "1"}
        env["RDMASCHED_SPIN_US"] = "0"
        c = Client.from_env(env, connect_timeout_s=30)
        assert c.spin_us == 0  # the variable reached the client's reader
        started: list[int] = []
        cv = threading.Condition()

        @c.on_dispatch
        def run(task: Task, slot: int) -> None:
            with cv:
                started.append(task.id)
                cv.notify_all()
            c.complete(task.id)

        with c:
            for tid in (7, 8, 9):  # 3 tasks on 2 slots: the third waits for a completion
                c.submit(tid, priority=5)
            with cv:
                assert cv.wait_for(lambda: len(started) == 3, 30), started
            c.flush()
            assert sorted(started) == [7, 8, 9]
            assert c.rejected == {} and c.handler_errors == {}


def test_the_defaults_are_unchanged_and_the_variable_is_checked() -> None:
    assert launch.client_spin_us({}) is None
    assert launch.client_spin_us({"RDMASCHED_SPIN_US": "0"}) == 0
    assert Client("x.h0", 0).spin_us == CLIENT_SPIN_US == 50
    for bad in ("-1", "ten", str(MAX_SPIN_US + 1)):
        with pytest.raises(ConfigError, match=r"^RDMASCHED_SPIN_US=.* must be an integer in 0\.\."):
            launch.client_spin_us({"RDMASCHED_SPIN_US": bad})
        env = {"RDMASCHED_CLUSTER": "x", "RDMASCHED_HOST": "h0", "RDMASCHED_SPIN_US": bad}
        with pytest.raises(ConfigError, match="RDMASCHED_SPIN_US"):
            Client.from_env(env)
    with pytest.raises(ArgumentError, match="spin_us"):
        Client("x.h0", 0, spin_us=-1)


@pytest.mark.parametrize("bad", ["-1", "1.5", "x", str(MAX_SPIN_US + 1)])
def test_a_bad_spin_us_is_one_line_and_exit_2(bad: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CMD, "daemon", "--spin-us", bad],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--spin-us" in out.stderr, out.stderr


def test_a_daemon_and_its_client_ask_for_their_slice(tmp_path: Path) -> None:
    # `--slice-us` reaches the node's loop thread (which reads the clients' lanes too, on
    # shm); RDMASCHED_SLICE_US the client's reader (docs/DAEMON.md and CLIENT.md, "The slice")
    from rdmasched.daemon.tuning import get_slice

    with _daemon(tmp_path, "--slice-us", "200") as (name, log):
        supported = get_slice() is not None
        if supported:
            assert "loop thread EEVDF slice 200 us" in log, log
        else:  # an older kernel: one line, and the daemon serves on
            assert "loop thread no EEVDF slice: " in log, log
        env = {"RDMASCHED_CLUSTER": name, "RDMASCHED_HOST": "h0", "LOCAL_RANK": "0"}
        c = Client.from_env({**env, "RDMASCHED_SLICE_US": "300"}, connect_timeout_s=30)
        assert c.slice_us == 300
        with c:
            assert c._thread is not None and c._thread.native_id is not None
            assert get_slice(c._thread.native_id) == (300 if supported else None)
            assert get_slice() != 300  # the caller's thread is not the reader
