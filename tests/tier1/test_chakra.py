"""Chakra execution traces as a workload (issue 9 item 3): the reader on a real trace, the
format detection, its errors, and a simulator run on it.

The fixture tests/data/traces/mlp-chakra.et was written by examples/make_chakra_trace.py
from a real 2-rank DDP (gloo, CPU) run of a 4-layer MLP (docs/WORKLOADS.md, "Chakra
traces"); mlp-chakra.meta.json is what DDP itself reported about that run. Reading needs
chakra's schema (mlc-chakra, installed with --no-deps) and protobuf: skipped without them,
except in CI (CI=true), where scripts/setup.sh installs them."""

from __future__ import annotations

import gzip
import importlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from rdmasched.cli import main
from rdmasched.demo.job import WorkloadConfig
from rdmasched.errors import WorkloadError
from rdmasched.sim import Run, SimConfig, simulate
from rdmasched.sim.trace import TRACE_GROUP_BASE
from rdmasched.workload import ComputeTask, SyncTask, chakra, load
from rdmasched.workload import __main__ as workload_cli

pytestmark = pytest.mark.tier1

if os.environ.get("CI") == "true":
    pb = importlib.import_module("chakra.schema.protobuf.et_def_pb2")
else:
    pb = pytest.importorskip(
        "chakra.schema.protobuf.et_def_pb2",
        reason="pip install 'rdmasched[chakra]' && pip install --no-deps mlc-chakra==1.0.0",
    )
from chakra.src.third_party.utils.protolib import encodeMessage  # noqa: E402

from tests.workloads import digest  # noqa: E402

TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
ET = TRACES / "mlp-chakra.et"
META = json.loads((TRACES / "mlp-chakra.meta.json").read_text())


def _raw_nodes(path: Path) -> list[Any]:
    return chakra.read_messages(path.read_bytes(), str(path))[1]


def test_reader_on_a_real_trace() -> None:
    wl = load(ET)
    wl.validate()
    assert (wl.device, wl.backend, wl.rank, wl.world_size) == ("cpu", "gloo", 0, 2)
    assert len(wl.steps) == META["active_steps"] == 2
    assert [s.profiler_step for s in wl.steps] == [2, 3]
    for s in wl.steps:
        # the gradient buckets are DDP's own, as it reported them after its rebuild
        assert [b.nbytes for b in s.buckets] == META["rebuilt_bucket_sizes"]
        assert all(b.collective == "all_reduce" and b.phase == "backward" for b in s.buckets)
        assert {t.phase for t in s.computes} == {"forward", "backward", "optimizer"}
        assert all(t.duration_ns > 0 for t in s.computes)
        tasks = {t.id: t for t in s.tasks}
        for j, b in enumerate(s.buckets):
            before = [t for t in s.tasks if t.id < b.id]
            # after the backward compute just before it (which made its gradients) ...
            assert before[-1].id in b.deps and isinstance(before[-1], ComputeTask)
            # ... and the bucket before it (one communicator runs them in order)
            if j:
                assert s.buckets[j - 1].id in b.deps
        # the compute after the last bucket (DDP's finalize) waits for every bucket; the
        # compute between buckets does not wait for the bucket before it (overlap)
        last = s.buckets[-1]
        after = next(t for t in s.tasks if t.id > last.id)
        assert isinstance(after, ComputeTask) and after.phase == "backward"
        assert {b.id for b in s.buckets} <= set(after.deps)
        between = next(t for t in s.tasks if s.buckets[0].id < t.id < s.buckets[1].id)
        assert s.buckets[0].id not in between.deps
        opt = next(t for t in s.computes if t.phase == "optimizer")
        assert after.id in opt.deps or any(
            after.id in tasks[d].deps for d in opt.deps if d in tasks
        )
    # every measured compute node is in exactly one task: the durations add up
    kept = [
        n.duration_micros * 1000
        for n in _raw_nodes(ET)
        if n.type == pb.COMP_NODE
        and not n.name.startswith("ProfilerStep#")
        and n.name not in ("forward", "backward", "optimizer")
    ]
    assert sum(t.duration_ns for t in wl.tasks() if isinstance(t, ComputeTask)) == sum(kept)
    assert sum(t.ops for t in wl.tasks() if isinstance(t, ComputeTask)) == len(kept)
    assert wl.steps[1].computes[0].deps == (wl.steps[0].tasks[-1].id,)


def test_format_detected_by_name_and_content(tmp_path: Path) -> None:
    a = load(ET)
    plain = tmp_path / "trace.bin"  # no telling name: the content is not JSON
    plain.write_bytes(ET.read_bytes())
    gz = tmp_path / "trace.et.gz"
    gz.write_bytes(gzip.compress(ET.read_bytes()))
    for p in (plain, gz):
        b = load(p)
        assert [t.__dict__ for t in b.tasks()] == [t.__dict__ for t in a.tasks()]
    # a profiler trace is still a profiler trace, with or without its extension
    j = tmp_path / "trace"
    j.write_bytes((TRACES / "mlp.json.gz").read_bytes())
    assert not chakra.looks_like_chakra(j) and load(j).steps


def _write(path: Path, msgs: list[Any]) -> Path:
    buf = io.BytesIO()
    for m in msgs:
        encodeMessage(buf, m)
    path.write_bytes(buf.getvalue())
    return path


def _node(i: int, name: str, kind: int, dur: int = 10, deps: tuple[int, ...] = ()) -> Any:
    n = pb.Node(id=i, name=name, type=kind, duration_micros=dur)
    n.data_deps.extend(deps)
    return n


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda d: d.write_bytes(b""), "empty file"),
        (lambda d: d.write_bytes(ET.read_bytes()[:-7]), "truncated Chakra trace"),
        (lambda d: d.write_text('{"traceEvents": []}'), "not a Chakra trace"),
        (lambda d: d.write_bytes(b"\xff" * 64), "not a Chakra trace"),
        (lambda d: d.write_bytes(b"\x1f\x8b\x08\x00garbage"), "gzip"),
        (
            lambda d: _write(
                d,
                [
                    pb.GlobalMetadata(version="0.0.4"),
                    _node(1, "ProfilerStep#0", pb.COMP_NODE),
                    _node(2, "aten::mm", pb.COMP_NODE, deps=(1, 9)),
                ],
            ),
            "depends on node 9, which is not in the trace",
        ),
        (
            lambda d: _write(
                d,
                [
                    pb.GlobalMetadata(version="0.0.4"),
                    _node(1, "aten::mm", pb.COMP_NODE, deps=(2,)),
                    _node(2, "aten::add", pb.COMP_NODE, deps=(1,)),
                ],
            ),
            "cycle",
        ),
        (
            lambda d: _write(d, [pb.GlobalMetadata(version="0.0.4")]),
            "without nodes",
        ),
    ],
)
def test_bad_files_are_one_clear_error(
    tmp_path: Path, make: Any, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.et"
    make(bad)
    with pytest.raises(WorkloadError, match=says) as e:
        load(bad)
    assert str(bad) in str(e.value)
    # the commands say it in one line, without a traceback
    assert workload_cli.main([str(bad)]) == 2
    assert main(["sim", "--sizes", "4", "--workload", str(bad)]) != 0
    err = capsys.readouterr().err
    assert says.split(",")[0] in err and "Traceback" not in err


def test_without_chakra_installed_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # an interpreter without the package: its import fails as it would there
    for name in [m for m in sys.modules if m == "chakra" or m.startswith("chakra.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "chakra", None)
    with pytest.raises(WorkloadError, match=r"pip install 'rdmasched\[chakra\]'"):
        load(ET)
    # a profiler trace needs no chakra
    assert load(TRACES / "mlp.json.gz").steps


def _gpu_trace() -> list[Any]:
    """A small trace in chakra's converter's GPU layout (synthetic: no GPU here)."""
    cpu = pb.AttributeProto(name="is_cpu_op", bool_val=True)
    gpu = pb.AttributeProto(name="is_cpu_op", bool_val=False)
    msgs = [pb.GlobalMetadata(version="0.0.4")]
    step = _node(1, "ProfilerStep#7", pb.COMP_NODE, 0)
    fwd = _node(2, "aten::mm", pb.COMP_NODE, 50, (1,))
    k1 = _node(3, "sm90_gemm", pb.COMP_NODE, 200, (2,))
    bwd = _node(4, "autograd::engine::evaluate_function: MmBackward0", pb.COMP_NODE, 40, (2,))
    k2 = _node(5, "sm90_gemm_bwd", pb.COMP_NODE, 300, (4, 3))
    ar = _node(6, "ncclDevKernel_AllReduce_Sum_f32", pb.COMM_COLL_NODE, 80, (5,))
    ar.attr.extend(
        [
            pb.AttributeProto(name="comm_type", int64_val=pb.ALL_REDUCE),
            pb.AttributeProto(name="comm_size", int64_val=4096),
        ]
    )
    opt = _node(7, "Optimizer.step#SGD.step", pb.COMP_NODE, 0, (4,))
    k3 = _node(8, "sgd_kernel", pb.COMP_NODE, 30, (7, 6))
    for n, a in ((step, cpu), (fwd, cpu), (k1, gpu), (bwd, cpu), (k2, gpu), (ar, gpu)):
        n.attr.append(a)
    opt.attr.append(cpu)
    k3.attr.append(gpu)
    msgs += [step, fwd, k1, bwd, k2, ar, opt, k3]
    return msgs


def test_gpu_trace_keeps_the_kernels_as_compute(tmp_path: Path) -> None:
    """A trace with GPU nodes (is_cpu_op false, chakra's converter's layout): the kernels
    are the compute, the CPU ops that launched them only order them, the NCCL collective
    is the sync."""
    wl = load(_write(tmp_path / "gpu.et", _gpu_trace()))
    assert wl.device == "gpu"
    (s,) = wl.steps
    assert s.profiler_step == 7
    assert [(t.name, t.duration_ns) for t in s.tasks] == [
        ("forward.0", 200_000),
        ("backward.0", 300_000),
        ("bucket.0", 80_000),
        ("optimizer.0", 30_000),
    ]
    b = s.buckets[0]
    assert isinstance(b, SyncTask) and b.nbytes == 4096 and b.deps == (s.tasks[1].id,)
    # the optimizer kernel waits for the all-reduce (which waited for the backward kernel);
    # the CPU op that launched it orders nothing that is kept
    assert s.tasks[3].deps == (b.id,)


def _read(path: Path) -> list[Any]:
    meta, nodes = chakra.read_messages(path.read_bytes(), str(path))
    return [meta, *nodes]


def _without_steps() -> list[Any]:
    """The fixture with its ProfilerStep#N nodes renamed: one step, labels become compute."""
    meta, *nodes = _read(ET)
    for n in nodes:
        if n.name.startswith("ProfilerStep#"):
            n.name = "step"
    return [meta, *nodes]


@pytest.mark.parametrize(
    ("case", "pinned"),
    [
        ("fixture", "7cd98e13e8e6e3d7"),
        ("without steps", "7ed06478e89fbdf2"),
        ("gpu", "b67ce2bb27555b74"),
    ],
)
def test_what_the_reader_builds_is_pinned(case: str, pinned: str) -> None:
    """Every step, task, dependency, warning and ignored count the reader builds, as a
    digest (tests/workloads.py): it fails on any change in the workload, such as one made
    by a refactor of the task builder it shares with the profiler reader."""
    make = {"fixture": lambda: _read(ET), "without steps": _without_steps, "gpu": _gpu_trace}
    meta, *nodes = make[case]()
    wl = chakra.parse(meta, nodes, source=case)  # a source that is not the checkout's path
    assert digest(wl) == pinned, wl.summary()


def test_sim_replays_a_chakra_trace(capsys: pytest.CaptureFixture[str]) -> None:
    wl = load(ET)
    c = SimConfig(
        nodes=16,
        workload=WorkloadConfig(steps=3),
        central_call_ns=2_000,
        trace=wl,
        sigma=0.05,
        leaf=8,
    )
    run = Run(c)
    r = run.run()
    assert r["finished"] and r["steps"] == 3
    led = run.ledger
    for node in range(16):
        for step in range(3):
            for j in range(len(wl.steps[step % 2].syncs)):
                assert led.releases[(node, TRACE_GROUP_BASE + j, step)] == 1
    least = min(s.compute_ns() for s in wl.steps) * min(run.rep.slowdown) / 1e6
    assert r["step_time_ms"] >= least * 0.99
    # and from the command line, the file's format found by its name
    args = ["sim", "--sizes", "16", "--steps", "2", "--schedulers", "rdmasched,fifo"]
    assert main([*args, "--workload", str(ET), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["workload"]["trace"] == str(ET)
    assert all(x["finished"] for x in doc["runs"])
    assert simulate(c)["step_time_ms"] == r["step_time_ms"]
