"""rdmasched.integrations.torch refuses bad use with a clear error, before any process or
lane exists (issue 10 item 1). Needs torch; with CI=true a missing torch fails."""

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
    assert not dist.is_initialized()
    node = rt.rank_node(0, 1, "unused-never-opened")
    with pytest.raises(ArgumentError, match=r"torch\.distributed initialised first"):
        rt.RankScheduler(node)


def test_errors_are_rdmasched_errors_and_the_builtins_they_mean() -> None:
    assert issubclass(rt.TorchSyncError, RdmaschedError)
    assert issubclass(rt.TorchSyncError, RuntimeError)
    assert issubclass(rt.SchedulerGoneError, rt.TorchSyncError)
    assert issubclass(rt.RankLostError, ConnectionError)
    assert issubclass(rt.SyncTimeoutError, TimeoutError)


def test_rank_node_runs_strict_priorities_by_default() -> None:
    node = rt.rank_node(1, 2, "unused-never-opened")
    assert node.id == 1 and node.spec.slots == 1 and node.spec.name == "rank1"
    assert node.cluster.dead_after_ms == 3000
    # no aging, no effective starvation cap: co-located work never takes the step's slot
    assert node.scheduler.aging_ns is None
    assert node.scheduler.starvation_ns >= rt.STRICT_STARVATION_US * 1000


def test_the_hook_has_the_annotations_ddp_checks() -> None:
    import inspect

    import torch

    sig = inspect.signature(rt.RankScheduler.hook)
    assert sig.parameters["bucket"].annotation is dist.GradBucket
    assert sig.return_annotation == torch.futures.Future[torch.Tensor]
