"""torch.profiler traces as workloads (issue 9 item 3): parser, model, replication, CLI.

The traces under tests/data/traces/ are real: recorded by examples/make_trace.py (torchrun, 2
ranks, DDP over gloo on the CPU), rank 0's Chrome trace gzipped, with a sidecar .meta.json in
which the generator wrote what DDP itself reports (its rebuilt gradient bucket sizes, the
model's parameter bytes, the profiler schedule). No torch is needed here.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from rdmasched.errors import ArgumentError, RdmaschedError
from rdmasched.workload import (
    ComputeTask,
    SyncTask,
    Workload,
    WorkloadError,
    load,
    parse,
    replicate,
)
from rdmasched.workload.__main__ import main as cli_main
from tests.workloads import digest

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
TRACES = ["lm", "mlp"]


def meta(name: str) -> dict[str, Any]:
    m: dict[str, Any] = json.loads((DATA / f"{name}.meta.json").read_text())
    return m


def doc(name: str) -> Any:
    return json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))


@pytest.fixture(scope="module", params=TRACES)
def traced(request: pytest.FixtureRequest) -> tuple[str, Workload]:
    return request.param, load(DATA / f"{request.param}.json.gz")


# ---- what DDP did is what the parser finds ---------------------------------------------------
def test_steps_are_the_profiled_steps(traced: tuple[str, Workload]) -> None:
    name, wl = traced
    m = meta(name)
    assert len(wl.steps) == m["schedule"]["active"]
    first = m["schedule"]["wait"] + m["schedule"]["warmup"]
    assert [s.profiler_step for s in wl.steps] == list(range(first, first + len(wl.steps)))
    assert wl.device == "cpu" and wl.backend == m["backend"]
    assert wl.rank == 0 and wl.world_size == m["world_size"]
    assert not wl.warnings


def test_buckets_are_ddps_gradient_buckets(traced: tuple[str, Workload]) -> None:
    name, wl = traced
    m = meta(name)
    assert len(m["rebuilt_bucket_sizes"]) > 1  # the traces were made with several buckets
    for s in wl.steps:
        assert [b.nbytes for b in s.buckets] == m["rebuilt_bucket_sizes"]
        assert sum(b.nbytes for b in s.buckets) == m["param_bytes"]
        assert {b.dtype.lower() for b in s.buckets} == {m["dtype"].lower()}
        assert all(b.nelems * 4 == b.nbytes for b in s.buckets)
        # bucket syncs ran on gloo's worker threads: a measured duration each
        assert all(b.duration_ns > 0 for b in s.buckets)


def test_other_syncs_are_ddps_buffer_broadcasts(traced: tuple[str, Workload]) -> None:
    # DDP broadcasts the model's buffers (the lm's causal mask; the mlp has none) in forward
    name, wl = traced
    buffers = meta(name)["buffer_bytes"]
    for s in wl.steps:
        others = [x for x in s.syncs if not x.is_bucket]
        if buffers:
            assert [(x.collective, x.phase, x.nbytes) for x in others] == [
                ("broadcast", "forward", buffers)
            ]
        else:
            assert others == []


def test_phases_in_order_with_compute(traced: tuple[str, Workload]) -> None:
    _, wl = traced
    order = {"forward": 0, "backward": 1, "optimizer": 2}
    for s in wl.steps:
        for p in order:
            assert s.compute_ns(p) > 0, (s.index, p)
        phases = [order[t.phase] for t in s.tasks]
        assert phases == sorted(phases)
        # compute tasks: busy time within their span, ops counted
        for t in s.computes:
            assert 0 < t.duration_ns <= t.span_ns and t.ops > 0
        assert s.compute_ns() < s.duration_ns
        # buckets are cut out of the backward: one backward task before each bucket
        assert len([t for t in s.computes if t.phase == "backward"]) >= len(s.buckets)


def test_dependencies_acyclic_and_complete(traced: tuple[str, Workload]) -> None:
    _, wl = traced
    wl.validate()
    tasks = {t.id: t for t in wl.tasks()}
    # Kahn: every task is reachable in a topological order (no cycle, no dangling dep)
    indeg = {i: len(t.deps) for i, t in tasks.items()}
    users: dict[int, list[int]] = {i: [] for i in tasks}
    for t in tasks.values():
        for d in t.deps:
            users[d].append(t.id)
    ready = [i for i, n in indeg.items() if n == 0]
    assert len(ready) == 1  # only the very first task waits for nothing
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    assert seen == len(tasks)
    prev_last: int | None = None
    for s in wl.steps:
        buckets = {x.id for x in s.buckets}
        for b in s.buckets:  # each bucket after the backward compute that produced it
            producer = tasks[b.deps[0]]
            assert isinstance(producer, ComputeTask) and producer.phase == "backward"
            assert producer.offset_ns < b.offset_ns
        opt = next(t for t in s.tasks if t.phase == "optimizer")
        # DDP's finalize: the optimizer waits for DDP's own buckets (issue 21: not for
        # every sync, which made TorchRec's input-dist and embedding work wait for them)
        assert buckets <= set(opt.deps)
        if prev_last is not None:  # the next step's forward after the optimizer
            assert s.tasks[0].phase == "forward" and prev_last in s.tasks[0].deps
        last = s.tasks[-1]
        assert isinstance(last, ComputeTask) and last.phase == "optimizer"
        prev_last = last.id


def test_validate_refuses_a_bad_graph() -> None:
    wl = load(DATA / "mlp.json.gz")
    s0 = wl.steps[0]
    t0 = s0.tasks[0]
    assert isinstance(t0, ComputeTask)
    cyclic = type(t0)(**{**t0.__dict__, "deps": (s0.tasks[-1].id,)})
    bad = Workload(
        wl.source,
        wl.device,
        wl.backend,
        wl.rank,
        wl.world_size,
        (type(s0)(0, 2, 1, (cyclic, *s0.tasks[1:])),),
    )
    with pytest.raises(WorkloadError, match="not earlier"):
        bad.validate()
    orphan = type(s0)(0, 2, 1, (t0, type(t0)(**{**s0.tasks[1].__dict__, "deps": ()})))
    with pytest.raises(WorkloadError, match="depends on nothing"):
        Workload("x", "cpu", None, None, None, (orphan,)).validate()


# ---- file forms and robustness ---------------------------------------------------------------
def test_plain_json_and_gzip_give_the_same_workload(tmp_path: Path) -> None:
    plain = tmp_path / "lm.json"
    plain.write_bytes(gzip.decompress((DATA / "lm.json.gz").read_bytes()))
    a, b = load(DATA / "lm.json.gz").to_dict(), load(plain).to_dict()
    assert a.pop("source") != b.pop("source")
    assert a == b


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "truncated JSON"),
        (b"not json at all", "not valid JSON"),
        (b'{"traceEvents": [{"ph": "X"', "truncated JSON"),
        (b'{"schemaVersion": 1}', "no traceEvents"),
        (b'"a string"', "not a Chrome trace"),
        (b'{"traceEvents": []}', "nothing to replay"),
        (b"\x80\x81 binary", "not UTF-8"),
    ],
)
def test_bad_files_get_one_clear_error_naming_the_file(
    tmp_path: Path, content: bytes, match: str
) -> None:
    f = tmp_path / "bad.json"
    f.write_bytes(content)
    with pytest.raises(WorkloadError, match=match) as e:
        load(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, RdmaschedError) and isinstance(e.value, ValueError)


def test_ops_inside_a_collective_run_do_not_make_its_thread_a_compute_thread() -> None:
    d = doc("mlp")
    base = parse(copy.deepcopy(d), "x")
    runs = [e for e in d["traceEvents"] if e.get("name") == "gloo:all_reduce"]
    assert runs
    for r in runs:  # as if gloo ran an operator while reducing (e.g. a division)
        d["traceEvents"].append(
            {**r, "cat": "cpu_op", "name": "aten::div_", "ts": r["ts"] + 1, "dur": 1, "args": {}}
        )
    wl = parse(d, "x")
    assert [[(b.nbytes, b.duration_ns) for b in s.buckets] for s in wl.steps] == [
        [(b.nbytes, b.duration_ns) for b in s.buckets] for s in base.steps
    ]
    assert [s.compute_ns() for s in wl.steps] == [s.compute_ns() for s in base.steps]


def test_a_trace_recorded_without_shapes_warns_that_sizes_are_unknown() -> None:
    d = doc("mlp")
    for e in d["traceEvents"]:
        e.get("args", {}).pop("Input Dims", None)
    wl = parse(d, "noshapes")
    assert all(b.nbytes == 0 for s in wl.steps for b in s.buckets)
    assert [len(s.buckets) for s in wl.steps] == [
        len(s.buckets) for s in load(DATA / "mlp.json.gz").steps
    ]
    assert any("record_shapes=True" in w for w in wl.warnings)


def test_truncated_gzip_and_missing_file(tmp_path: Path) -> None:
    raw = (DATA / "mlp.json.gz").read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(WorkloadError, match=r"cut\.json\.gz: truncated or damaged gzip"):
        load(cut)
    # a whole gzip of a JSON cut short
    half = gzip.decompress(raw)
    cut.write_bytes(gzip.compress(half[: len(half) // 2]))
    with pytest.raises(WorkloadError, match="truncated JSON"):
        load(cut)
    with pytest.raises(WorkloadError, match=r"nope\.json: cannot read"):
        load(tmp_path / "nope.json")


def test_a_trace_without_steps_is_one_step_with_a_warning() -> None:
    d = doc("lm")
    d["traceEvents"] = [
        e for e in d["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    wl = parse(d, "nosteps")
    assert len(wl.steps) == 1 and wl.steps[0].profiler_step is None
    assert any("no ProfilerStep" in w for w in wl.warnings)
    steps = meta("lm")["schedule"]["active"]
    assert len(wl.steps[0].buckets) >= steps * len(meta("lm")["rebuilt_bucket_sizes"])
    wl.validate()
    # the iterations inside the one step keep their structure: each optimizer waits for the
    # buckets of its own iteration (DDP's finalize); no backward compute waits for a bucket
    # (issue 21: the finalize rule made the compute after the last bucket wait for all)
    tasks = wl.steps[0].tasks
    buckets = {t.id for t in tasks if isinstance(t, SyncTask) and t.is_bucket}
    computes = [t for t in tasks if isinstance(t, ComputeTask)]
    opts = [t for t in computes if t.phase == "optimizer" and set(t.deps) & buckets]
    finals = [t for t in computes if t.phase == "backward" and set(t.deps) & buckets]
    assert len(opts) >= steps and not finals
    n = len(meta("lm")["rebuilt_bucket_sizes"])
    for f in opts[-steps:]:
        assert len([d for d in f.deps if d in buckets]) == n


def test_unknown_events_are_ignored_and_counted() -> None:
    d = doc("mlp")
    base = parse(copy.deepcopy(d), "x")
    d["traceEvents"] += [
        {"ph": "X", "cat": "brand_new", "name": "thing", "ts": 1.0, "dur": 1.0, "pid": 1, "tid": 1},
        {"ph": "Q", "name": "what"},
        {"ph": "Q", "name": "what"},
        "not an event",
        {"ph": "X", "cat": "cpu_op", "name": "no ts"},
    ]
    wl = parse(d, "x")
    assert wl.ignored["X/brand_new"] == 1 and wl.ignored["Q"] == 2
    assert wl.ignored["malformed"] == 2
    assert wl.summary()["steps"] == base.summary()["steps"]
    assert [t.__dict__ for t in wl.tasks()] == [t.__dict__ for t in base.tasks()]


# ---- GPU (NCCL) traces ---------------------------------------------------------------------
def gpu_trace(kernel_args: bool, name: str) -> dict[str, Any]:
    """A GPU trace in kineto's layout (synthetic; there is no GPU here): two profiler steps;
    on the main thread (tid 1) the forward and optimizer, on the autograd thread (tid 2) the
    backward, cpu_ops launching kernels (cudaLaunchKernel, `correlation`), the DDP all-reduce
    as c10d::allreduce_ > record_param_comms > nccl:all_reduce; on the GPU compute kernels on
    stream 7 and NCCL kernels on stream 20, with the NCCL args kineto adds (or,
    `kernel_args=False`, none: the size then comes from the record_param_comms), and the
    gpu_user_annotation copies of the step and phase ranges kineto puts on the GPU rows."""
    ev: list[dict[str, Any]] = []
    corr = [0]
    tid = [1]

    def cpu(n: str, ts: float, dur: float, cat: str = "cpu_op", **args: Any) -> None:
        ev.append(
            {"ph": "X", "cat": cat, "name": n, "pid": 1, "tid": tid[0], "ts": ts, "dur": dur,
             "args": args}
        )  # fmt: skip
        if cat == "user_annotation":  # kineto's copy on the GPU row, shifted to GPU time
            ev.append(
                {"ph": "X", "cat": "gpu_user_annotation", "name": n, "pid": 0, "tid": 7,
                 "ts": ts + 150, "dur": dur, "args": {}}
            )  # fmt: skip

    def launch(ts: float, kname: str, kts: float, kdur: float, stream: int, **args: Any) -> None:
        corr[0] += 1
        ev.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
             "tid": tid[0], "ts": ts, "dur": 2.0, "args": {"correlation": corr[0]}}
        )  # fmt: skip
        ev.append(
            {"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": stream, "ts": kts,
             "dur": kdur, "args": {"correlation": corr[0], "stream": stream, **args}}
        )  # fmt: skip
        ev.append({"ph": "s", "cat": "ac2g", "id": corr[0], "pid": 1, "tid": tid[0], "ts": ts})

    for step, t in enumerate((1000.0, 2000.0)):
        cpu(f"ProfilerStep#{step + 5}", t, 900.0, "user_annotation")
        cpu("forward", t + 10, 200, "user_annotation")
        cpu("aten::mm", t + 20, 10)
        launch(t + 22, "ampere_sgemm_128x64_nn", t + 30, 100.0, 7)
        cpu("backward", t + 300, 400, "user_annotation")
        tid[0] = 2  # the autograd engine's thread runs the backward
        for b, (nel, kt) in enumerate(((1000, 400.0), (500, 560.0))):
            cpu("aten::mm", t + 310 + 100 * b, 10)
            launch(t + 312 + 100 * b, "sm80_xmma_gemm", t + 330 + 120 * b, 60.0, 7)
            cpu("c10d::allreduce_", t + 330 + 100 * b, 30)
            meta = {"Collective name": "allreduce", "In msg nelems": nel, "Out msg nelems": nel}
            meta |= {"dtype": "BFloat16", "Group size": 8}
            cpu("record_param_comms", t + 332 + 100 * b, 20, **meta)
            cpu("nccl:all_reduce", t + 334 + 100 * b, 10, "user_annotation")
            launch(t + 336 + 100 * b, name, t + kt, 50.0, 20, **(meta if kernel_args else {}))
        tid[0] = 1
        cpu("optimizer", t + 720, 100, "user_annotation")
        cpu("aten::add_", t + 730, 10)
        launch(t + 732, "vectorized_elementwise_kernel", t + 740, 20.0, 7)
    return {"traceEvents": ev, "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8}}


@pytest.mark.parametrize(
    ("kernel_args", "name"),
    [
        (True, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
        (False, "ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclWorkElem)"),
    ],
)
def test_gpu_trace_nccl_kernels_become_bucket_syncs(kernel_args: bool, name: str) -> None:
    d = gpu_trace(kernel_args, name)
    wl = parse(d, "gpu")
    assert wl.device == "gpu" and wl.backend == "nccl" and wl.world_size == 8
    copies = [e for e in d["traceEvents"] if e.get("cat") == "gpu_user_annotation"]
    assert wl.ignored["X/gpu_user_annotation"] == len(copies) and not wl.warnings
    assert [s.profiler_step for s in wl.steps] == [5, 6]
    for s in wl.steps:
        assert [(b.nbytes, b.dtype) for b in s.buckets] == [(2000, "BFloat16"), (1000, "BFloat16")]
        assert [b.duration_ns for b in s.buckets] == [50_000, 50_000]
        # compute is GPU kernel time, split by launch order at each NCCL launch
        assert [(t.phase, t.duration_ns) for t in s.computes] == [
            ("forward", 100_000),
            ("backward", 60_000),
            ("backward", 60_000),
            ("optimizer", 20_000),
        ]
        bwd = [t for t in s.computes if t.phase == "backward"]
        assert [b.deps[0] for b in s.buckets] == [t.id for t in bwd]
        assert {b.id for b in s.buckets} <= set(s.computes[-1].deps)
    wl.validate()


# ---- the whole output, pinned -------------------------------------------------------------
def _without_steps(name: str) -> Any:
    d = doc(name)
    d["traceEvents"] = [
        e for e in d["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    return d


@pytest.mark.parametrize(
    ("case", "pinned"),
    [
        ("lm", "4634d79cdb38673b"),
        ("mlp", "e34e2b4217d36fbf"),
        ("lm without steps", "5cb54fca64794fc2"),
        ("gpu", "cd9ed93ebdab108b"),
    ],
)
def test_what_the_parser_builds_is_pinned(case: str, pinned: str) -> None:
    """Every step, task, dependency, warning and ignored count the parser builds, as a digest
    (tests/workloads.py): it fails on any change in the workload, such as one made by a
    refactor of the task builder it shares with the Chakra reader."""
    if case == "gpu":
        d = gpu_trace(
            True, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
        )
    else:
        d = _without_steps("lm") if case == "lm without steps" else doc(case)
    wl = parse(d, case)
    assert digest(wl) == pinned, wl.summary()


# ---- replication -------------------------------------------------------------------------------
def test_replication_is_deterministic_for_a_seed() -> None:
    wl = load(DATA / "mlp.json.gz")
    a = replicate(wl, 50, sigma=0.1, stragglers=0.1, seed=7)
    b = replicate(wl, 50, sigma=0.1, stragglers=0.1, seed=7)
    c = replicate(wl, 50, sigma=0.1, stragglers=0.1, seed=8)
    assert a.slowdown == b.slowdown and a.stragglers == b.stragglers
    assert a.slowdown != c.slowdown
    assert a.node_tasks(3) == b.node_tasks(3)
    flat = replicate(wl, 5, sigma=0.0)
    assert flat.slowdown == (1.0,) * 5 and flat.node_tasks(4) == wl.tasks()


def test_replication_jitter_statistics() -> None:
    wl = load(DATA / "mlp.json.gz")
    n, sigma = 20_000, 0.2
    r = replicate(wl, n, sigma=sigma, seed=1)
    logs = [math.log(f) for f in r.slowdown]
    # log-slowdowns ~ N(0, sigma): mean within 5 standard errors, sd within 5%
    assert abs(statistics.fmean(logs)) < 5 * sigma / math.sqrt(n)
    assert abs(statistics.stdev(logs) / sigma - 1) < 0.05
    assert not r.stragglers
    s = replicate(wl, 1000, sigma=0.0, stragglers=0.05, straggler_slowdown=3.0, seed=2)
    assert len(s.stragglers) == 50
    assert {s.slowdown[i] for i in s.stragglers} == {3.0}
    assert sum(1 for f in s.slowdown if f == 1.0) == 950


def test_replicated_durations_scale_compute_not_syncs() -> None:
    wl = load(DATA / "lm.json.gz")
    r = replicate(wl, 4, sigma=0.3, seed=3)
    for node in range(4):
        mine = r.node_tasks(node)
        for t, base in zip(mine, wl.tasks(), strict=True):
            assert t.id == base.id and t.deps == base.deps
            if isinstance(base, SyncTask):
                assert t.duration_ns == base.duration_ns
            else:
                assert t.duration_ns == round(base.duration_ns * r.slowdown[node])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"nodes": 0},
        {"nodes": True},
        {"nodes": 2, "sigma": -1.0},
        {"nodes": 2, "sigma": math.nan},
        {"nodes": 2, "stragglers": 1.5},
        {"nodes": 2, "straggler_slowdown": 0.5},
    ],
)
def test_replication_refuses_bad_arguments(kwargs: dict[str, Any]) -> None:
    wl = load(DATA / "mlp.json.gz")
    n = kwargs.pop("nodes")
    with pytest.raises(ArgumentError):
        replicate(wl, n, **kwargs)


# ---- python -m rdmasched.workload ------------------------------------------------------------
def test_cli_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    f = str(DATA / "lm.json.gz")
    assert cli_main([f]) == 0
    out = capsys.readouterr().out
    n = len(meta("lm")["rebuilt_bucket_sizes"])
    assert f"{n} gradient buckets" in out and "ProfilerStep#2" in out
    assert cli_main([f, "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert [b["bytes"] for b in js["steps"][0]["buckets"]] == meta("lm")["rebuilt_bucket_sizes"]
    assert cli_main([f, "--json", "--graph"]) == 0
    graph = json.loads(capsys.readouterr().out)["graph"]
    assert len(graph) == len(load(f).tasks()) and graph[1]["deps"] == [0]


def test_cli_bad_input_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "t.json"
    bad.write_text("{")
    assert cli_main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "truncated JSON" in err
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    assert "default" in capsys.readouterr().out
