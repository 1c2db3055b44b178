"""rdmasched.integrations.torch refuses bad use with a clear error, before any process or
lane exists, and the daemon it starts runs strict priorities (issue 10 item 1). Needs torch;
with CI=true a missing torch fails."""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("torch") is None:
    if os.environ.get("CI") == "true":
        pytest.fail("torch is not installed: CI must test the PyTorch integration", pytrace=False)
    pytest.skip("torch is not installed (pip install -e '.[torch]')", allow_module_level=True)

import torch.distributed as dist

from rdmasched.errors import ArgumentError, RdmaschedError
from rdmasched.integrations import torch as rt

pytestmark = pytest.mark.torch


def test_rank_scheduler_needs_an_initialised_process_group() -> None:
    from rdmasched.client import Client

    assert not dist.is_initialized()
    client = Client("unused.never-opened", 0)
    with pytest.raises(ArgumentError, match=r"torch\.distributed initialised first"):
        rt.RankScheduler(client)


def test_errors_are_rdmasched_errors_and_the_builtins_they_mean() -> None:
    assert issubclass(rt.TorchSyncError, RdmaschedError)
    assert issubclass(rt.TorchSyncError, RuntimeError)
    assert issubclass(rt.SchedulerGoneError, rt.TorchSyncError)
    assert issubclass(rt.RankLostError, ConnectionError)
    assert issubclass(rt.SyncTimeoutError, TimeoutError)


@pytest.mark.parametrize(
    ("argv", "env", "starvation_us", "aging_us"),
    [
        ([], {}, 1_000_000, 100_000),  # Node's defaults
        ([], {"RDMASCHED_STARVATION_US": "off", "RDMASCHED_AGING_US": "off"}, None, None),
        (["--starvation-us", "off", "--aging-us", "off"], {}, None, None),
        (["--starvation-us", "5000"], {"RDMASCHED_STARVATION_US": "off"}, 5000, 100_000),
    ],
)
def test_the_daemon_runs_strict_priorities_when_told(
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    env: dict[str, str],
    starvation_us: int | None,
    aging_us: int | None,
) -> None:
    # host_client() starts the daemon with RDMASCHED_STARVATION_US=off and
    # RDMASCHED_AGING_US=off; a user's `rdmasched daemon` takes the options
    from rdmasched import launch
    from rdmasched.cli import build_parser
    from rdmasched.commands.daemon import daemon_policy

    for var in ("RDMASCHED_STARVATION_US", "RDMASCHED_AGING_US"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args = build_parser().parse_args(["daemon", *argv])
    node = launch.host_node({"RDMASCHED_CLUSTER": "unused-never-opened"}, **daemon_policy(args))
    if starvation_us is None:  # off: no cap any task reaches
        assert node.scheduler.starvation_ns >= (1 << 40) * 1000
    else:
        assert node.scheduler.starvation_ns == starvation_us * 1000
    assert node.scheduler.aging_ns == (None if aging_us is None else aging_us * 1000)


def test_a_bad_policy_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from rdmasched.cli import build_parser
    from rdmasched.commands.args import UserError
    from rdmasched.commands.daemon import daemon_policy

    monkeypatch.setenv("RDMASCHED_STARVATION_US", "forever")
    with pytest.raises(UserError, match="RDMASCHED_STARVATION_US='forever'"):
        daemon_policy(build_parser().parse_args(["daemon"]))


def test_the_hook_has_the_annotations_ddp_checks() -> None:
    import inspect

    import torch

    sig = inspect.signature(rt.RankScheduler.hook)
    assert sig.parameters["bucket"].annotation is dist.GradBucket
    assert sig.return_annotation == torch.futures.Future[torch.Tensor]


@pytest.mark.parametrize(
    ("what", "argv", "env", "want"),
    [
        ("spin", [], {}, None),  # the defaults (the loop 200 us, the reader 50 us)
        ("spin", [], {"RDMASCHED_SPIN_US": "0"}, 0),  # a daemon a rank started: the ranks'
        ("spin", ["--spin-us", "30"], {"RDMASCHED_SPIN_US": "0"}, 30),  # the option wins
        ("slice", [], {}, None),  # the kernel's default slice
        ("slice", [], {"RDMASCHED_SLICE_US": "100"}, 100),
        ("slice", ["--slice-us", "300"], {"RDMASCHED_SLICE_US": "100"}, 300),
    ],
)
def test_a_daemon_started_by_a_rank_takes_the_ranks_spin_and_slice(
    monkeypatch: pytest.MonkeyPatch,
    what: str,
    argv: list[str],
    env: dict[str, str],
    want: int | None,
) -> None:
    # host_client() starts the daemon with the ranks' environment; RDMASCHED_SPIN_US=0 (no
    # spare CPU) must reach the daemon's loop and reader too, not the ranks' readers only,
    # and RDMASCHED_SLICE_US the loop thread
    from rdmasched.cli import build_parser
    from rdmasched.commands import daemon

    monkeypatch.delenv("RDMASCHED_SPIN_US", raising=False)
    monkeypatch.delenv("RDMASCHED_SLICE_US", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    read = daemon.daemon_spin_us if what == "spin" else daemon.daemon_slice_us
    assert read(build_parser().parse_args(["daemon", *argv])) == want


def test_a_bad_spin_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from rdmasched.cli import build_parser
    from rdmasched.commands.args import UserError
    from rdmasched.commands.daemon import daemon_spin_us

    monkeypatch.setenv("RDMASCHED_SPIN_US", "-3")
    with pytest.raises(UserError, match="RDMASCHED_SPIN_US='-3'"):
        daemon_spin_us(build_parser().parse_args(["daemon"]))


@pytest.mark.parametrize("spare", [True, False])
def test_host_client_does_not_spin_when_every_cpu_runs_a_rank(spare: bool) -> None:
    # a rank's reader and the daemon spinning after every message took their CPU from the
    # ranks on a host with no spare CPU (the DDP example: 2 ranks, 2 CPUs)
    from rdmasched.client import CLIENT_SPIN_US

    cpus = len(os.sched_getaffinity(0))
    if spare and cpus < 2:
        pytest.skip("one CPU: every host of one rank has no spare CPU")
    env = {
        "RDMASCHED_CLUSTER": "unused-never-opened",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": str(cpus - 1 if spare else cpus),
    }
    client = rt.host_client(start_daemon=False, env=env)
    assert client.spin_us == (CLIENT_SPIN_US if spare else 0)
    # the user's own setting wins
    client = rt.host_client(start_daemon=False, env={**env, "RDMASCHED_SPIN_US": "20"})
    assert client.spin_us == 20


@pytest.mark.parametrize("bad", ["50", "100001", "x", "-1"])
def test_a_bad_slice_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    from rdmasched import launch
    from rdmasched.cli import build_parser
    from rdmasched.commands.args import UserError
    from rdmasched.commands.daemon import daemon_slice_us
    from rdmasched.errors import ConfigError

    monkeypatch.setenv("RDMASCHED_SLICE_US", bad)
    with pytest.raises(UserError, match=f"RDMASCHED_SLICE_US={bad!r}"):
        daemon_slice_us(build_parser().parse_args(["daemon"]))
    with pytest.raises(ConfigError, match=r"^RDMASCHED_SLICE_US=.* must be an integer in 100\.\."):
        launch.client_slice_us({"RDMASCHED_SLICE_US": bad})


def test_host_client_passes_the_slice_variable_on_and_sets_none_itself() -> None:
    # the slice is the user's (no step gain measured here: docs/TORCH.md, "The slice"); the
    # variable reaches the client, which the RankScheduler reads for the rank's threads
    cpus = len(os.sched_getaffinity(0))
    env = {
        "RDMASCHED_CLUSTER": "unused-never-opened",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": str(cpus),  # no spare CPU: the spin is set, the slice is not
    }
    client = rt.host_client(start_daemon=False, env=env)
    assert client.slice_us is None and client.spin_us == 0
    client = rt.host_client(start_daemon=False, env={**env, "RDMASCHED_SLICE_US": "400"})
    assert client.slice_us == 400


def test_a_client_slice_is_checked() -> None:
    from rdmasched.client import Client

    for bad in (50, 100_001):
        with pytest.raises(ArgumentError, match="slice_us"):
            Client("x.h0", 0, slice_us=bad)
    assert Client("x.h0", 0).slice_us is None
