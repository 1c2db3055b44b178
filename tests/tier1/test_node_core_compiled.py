"""The node core compiled (rdmasched/daemon/core.py + core.pxd, issue 12 item 2) decides
exactly as the same file run as plain Python, and a stale or half build cannot shadow it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

from rdmasched import messages as msg
from rdmasched.daemon import core
from rdmasched.scheduler import core as sched_core
from rdmasched.topology import Topology
from tests.corenet import DEAD_AFTER_NS, HEARTBEAT_NS, Cluster, task

compiled = pytest.mark.skipif(core.IMPLEMENTATION != "compiled", reason="node core not built")


def _pure_core() -> ModuleType:
    """daemon/core.py loaded as plain Python, whether or not the compiled module is built."""
    assert core.__file__ is not None
    src = os.path.join(os.path.dirname(core.__file__), "core.py")
    spec = importlib.util.spec_from_file_location("rdmasched_daemon_core_pure", src)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _log(c: Cluster) -> dict[str, Any]:
    """Everything a run decided: what the handlers saw, every message made and delivered,
    and each core's counters and scheduler events."""
    cores = {
        i: (
            [e.as_dict() for e in x.scheduler.events()],
            x.scheduler.stats().as_dict(),
            dict(x.rejected),
            dict(x.received),
            x.stale_msgs,
            x.relayed,
            dict(x.relay_dropped),
        )
        for i, x in c.cores.items()
    }
    arrived = {
        n: [(s, m.kind, m.id, m.job, m.flags, m.arg0, m.arg1, m.arg2, m.hops) for s, m in ms]
        for n, ms in c.arrived.items()
    }
    return {"seen": c.seen, "sent": dict(c.sent), "arrived": arrived, "cores": cores}


def mesh_run(mod: ModuleType) -> dict[str, Any]:
    """The four common kinds and their errors on a full mesh: DISPATCH (placed and sent),
    PREEMPT (of a running task, with cancel, of a whole job, of an unknown task), SYNC_READY
    (a group's steps, one kept before its group is defined), COMPLETE; then a node dies."""
    c = Cluster(3, slots=1, core=mod)
    c.deliver()
    c.do(1, c.cores[1].dispatch(task(5, origin=1), c.now))
    c.do(1, c.cores[1].dispatch(task(6, origin=1, priority=20), c.now))  # preempts 5
    c.wire.append((0, 1, msg.Preempt(6, 1, trigger_ns=c.now - 3000)))
    c.wire.append((0, 1, msg.Preempt(99, 1)))  # unknown: rejected
    c.deliver()
    c.wire.append((2, 1, msg.Preempt(5, 1, cancel=True)))
    c.wire.append((2, 1, msg.Preempt(0, 1, whole_job=True)))
    c.deliver()
    for i in (0, 1, 2):
        c.do(0, c.cores[0].dispatch_to(1 + i % 2, task(10 + i, origin=0), c.now))
    c.deliver()
    c.do(2, c.cores[2].sync_ready(4, 0, c.now))  # group 4 not defined there yet: refused
    for i in c.cores:
        c.do(i, c.cores[i].define_group(4, frozenset(c.cores), c.now))
    c.deliver()
    for step in (0, 1):
        for i in c.cores:
            c.do(i, c.cores[i].sync_ready(4, step, c.now))
        c.deliver()
    for i in (1, 2):
        for t in c.cores[i].scheduler.running():
            c.do(i, c.cores[i].complete(t.id, t.origin, 1000, c.now))
    c.deliver()
    c.wire.append((0, 2, msg.Complete(77, 1)))  # a COMPLETE for a task it never sent
    c.deliver()
    c.down.add(2)
    c.advance(2 * DEAD_AFTER_NS)
    return _log(c)


def relay_run(mod: ModuleType) -> dict[str, Any]:
    """Relays on a topology: a far DISPATCH behind its notice, its COMPLETE back."""
    t = Topology.generate(nodes=24, leaf=4, pod=8, budget=5)
    c = Cluster(24, topology=t, core=mod)
    c.advance(2 * HEARTBEAT_NS)
    s, d = 0, 23
    c.do(s, c.cores[s].dispatch_to(d, task(5, s), c.now))
    c.deliver()
    c.do(d, c.cores[d].complete(5, s, 1000, c.now))
    c.deliver()
    return _log(c)


@compiled
@pytest.mark.parametrize("run", [mesh_run, relay_run])
def test_compiled_and_pure_python_node_cores_decide_alike(run: Any) -> None:
    pure = _pure_core()
    assert pure.IMPLEMENTATION == "python"
    assert type(pure.NodeCore) is type and pure.NodeCore is not core.NodeCore
    got, want = run(core), run(pure)
    assert got["seen"] == want["seen"]
    assert got["sent"] == want["sent"]
    assert got["arrived"] == want["arrived"]
    assert got["cores"] == want["cores"]
    # the run did exercise what it is about: refusals (mesh), relays (topology)
    assert any(rejected or relayed for _, _, rejected, _, _, relayed, _ in got["cores"].values())


@compiled
def test_compiled_node_core_is_not_older_than_its_source() -> None:
    """A stale build shadows core.py on import: every test would run the old code."""
    assert core.__file__ is not None
    here = os.path.dirname(core.__file__)
    built = os.path.getmtime(core.__file__)
    for src in ("core.py", "core.pxd"):
        assert os.path.getmtime(os.path.join(here, src)) <= built, (
            f"{src} changed after {os.path.basename(core.__file__)} was built: "
            "rebuild it (python setup.py build_ext --inplace) or delete it"
        )


@compiled
def test_the_compiled_node_core_refuses_a_plain_python_scheduler() -> None:
    """The compiled core calls the scheduler's typed methods at C offsets: next to a
    plain-Python scheduler (a half build) it refuses to load instead of misreading it."""
    assert sched_core.IMPLEMENTATION == "compiled"
    code = (
        "import importlib.util, os, sys\n"
        "import rdmasched.scheduler as pkg\n"
        "src = os.path.join(os.path.dirname(pkg.__file__), 'core.py')\n"
        "spec = importlib.util.spec_from_file_location('rdmasched.scheduler.core', src)\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "sys.modules['rdmasched.scheduler.core'] = mod\n"
        "spec.loader.exec_module(mod)\n"
        "assert mod.IMPLEMENTATION == 'python'\n"
        "import rdmasched.daemon.core\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "rdmasched.scheduler.core.Scheduler" in r.stderr, r.stderr[-2000:]


@compiled
def test_the_compiled_node_core_is_an_extension_type() -> None:
    c = Cluster(1, core=core).cores[0]
    with pytest.raises(AttributeError):
        c.not_an_attribute = 1  # type: ignore[attr-defined]  # typed fields, no __dict__


@pytest.mark.parametrize(
    ("group", "step"),
    [(0, 0), (4, 7), (0x7FFFFFFF, 0xFFFFFFFF), (1 << 31, 1 << 32), (-1, 3), (5, (1 << 70) + 9)],
)
def test_sync_task_ids_keep_the_group_and_step_bits(group: int, step: int) -> None:
    # a sync task's id: bit 63, then the group's low 31 bits, then the step's low 32 (core.py
    # computes it in C when compiled; the same for any int as the plain-Python module)
    want = (1 << 63) | ((group & 0x7FFFFFFF) << 32) | (step & 0xFFFFFFFF)
    assert core.sync_task_id(group, step) == want
    assert _pure_core().sync_task_id(group, step) == want
