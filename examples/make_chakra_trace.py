"""Record a DDP rank on the CPU (gloo) and write it as a Chakra execution trace (`.et`).

    torchrun --nproc-per-node 2 examples/make_chakra_trace.py --model mlp --d-model 128 \
        --bucket-cap-mb 0.05 --seed 1 --out tests/data/traces/mlp-chakra

trains the model of examples/make_trace.py (the job in examples/ddp_job.py) under
torch.profiler with PyTorch's ExecutionTraceObserver attached, so rank 0 records both
PyTorch's execution trace (every operator, its parent, its inputs' shapes and types) and the
profiler's timings of the same operators (matched by record-function id). It writes
`OUT.et`, a Chakra ET made with chakra's own schema and writer
(`chakra.schema.protobuf.et_def_pb2`, `chakra.src.third_party.utils.protolib.encodeMessage`),
and `OUT.meta.json` with what DDP itself reports (its gradient bucket sizes, the parameter
bytes).

Why not chakra's converter (`chakra_converter PyTorch`)? It makes communication nodes only
from NCCL kernels on a GPU (`ncclKernel_*`, `ncclDevKernel_*`), and it takes durations from
`chakra_trace_link`, which needs HolisticTraceAnalysis. A CPU run with gloo has neither, so
this script does the converter's work for the CPU, node by node, from the real run:

- one `COMP_NODE` per operator of a step that runs no collective, with its measured
  (inclusive) duration; an operator that contains a collective is split into its own time
  (a node before its children) and its children;
- each `c10d::allreduce_` (a DDP bucket) is a `COMM_COLL_NODE`, `comm_type` ALL_REDUCE,
  `comm_size` its tensors' bytes (shapes and types from the execution trace); any other c10d
  collective likewise;
- the `ProfilerStep#N`, `forward`, `backward` and `optimizer` ranges are `COMP_NODE` labels;
- `ctrl_deps`: the parent (the converter's call-stack dependency); `data_deps`: the operator
  issued before it on the thread (the converter's CPU chain), for a collective also the
  collective before it (one communicator runs them in order); the first operator after a
  backward's last bucket depends on every bucket of that backward (DDP's finalize,
  `copy_bucket_to_grad`, waits for the reduced buckets).

Needs torch (`pip install torch==2.13.0`, the CPU build) and chakra's schema
(`pip install --no-deps mlc-chakra==1.0.0` and protobuf). Run without torchrun, it is a world
of one rank (gloo still, so the all-reduces are real collectives).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from chakra.schema.protobuf import et_def_pb2 as pb
from chakra.src.third_party.utils.protolib import encodeMessage
from torch.profiler import ExecutionTraceObserver

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_job import Job, add_job_args  # the same job as the profiler traces

LABELS = ("forward", "backward", "optimizer")
ELEM_BYTES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "long": 8, "int": 4}
COLLECTIVES = {
    "c10d::allreduce_": pb.ALL_REDUCE,
    "c10d::broadcast_": pb.BROADCAST,
    "c10d::allgather_": pb.ALL_GATHER,
    "c10d::reduce_scatter_": pb.REDUCE_SCATTER,
    "c10d::alltoall_": pb.ALL_TO_ALL,
    "c10d::barrier": pb.BARRIER,
}


def _attr(n: dict[str, Any], key: str) -> Any:
    return next((a["value"] for a in n.get("attrs", []) if a["name"] == key), None)


def _tensor_bytes(shapes: Any, types: Any) -> int:
    """Bytes of an op's first input (a tensor or a list of tensors), from the ET's shapes."""
    if not shapes:
        return 0
    shape, typ = shapes[0], str(types[0]) if types else ""
    dtype = typ[typ.rfind("(") + 1 : typ.find(")")].lower() if "(" in typ else "float"
    size = ELEM_BYTES.get(dtype, 4)

    def elems(s: Any) -> int:
        if isinstance(s, list) and s and all(isinstance(x, list) for x in s):
            return sum(elems(x) for x in s)
        k = 1
        for x in s if isinstance(s, list) else []:
            k *= int(x)
        return k

    return elems(shape) * size


def _is_gloo(n: dict[str, Any]) -> bool:
    return str(n["name"]).startswith("gloo:")


def _descendants(i: int, kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], list(kids.get(i, []))
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(kids.get(c, []))
    return out


def to_chakra(et: dict[str, Any], kineto: dict[str, Any], meta_attrs: dict[str, Any]) -> list[Any]:
    """Chakra messages (GlobalMetadata, then Nodes) for the profiled steps of a PyTorch ET."""
    nodes = {n["id"]: n for n in et["nodes"]}
    kids: dict[int, list[int]] = {}
    for n in et["nodes"]:
        if n["ctrl_deps"] != n["id"]:
            kids.setdefault(n["ctrl_deps"], []).append(n["id"])
    timing = {}  # record-function id -> (ts us, dur us), from the profiler
    for e in kineto["traceEvents"]:
        rf = (e.get("args") or {}).get("Record function id")
        if e.get("ph") == "X" and rf is not None:
            timing[rf] = (float(e["ts"]), float(e.get("dur", 0)))
    t_base = min(t for t, _ in timing.values())

    def when(i: int) -> tuple[int, int]:
        ts, dur = timing.get(_attr(nodes[i], "rf_id"), (t_base, 0.0))
        return round(ts - t_base), round(dur)

    def has_comm(i: int) -> bool:
        return any(nodes[c]["name"] in COLLECTIVES for c in [i, *_descendants(i, kids)])

    def ordered(ids: list[int]) -> list[int]:
        return sorted(ids, key=lambda i: (when(i)[0], _attr(nodes[i], "rf_id")))

    out: list[Any] = []
    g = pb.GlobalMetadata(version="0.0.4")
    for k, v in meta_attrs.items():
        a = pb.AttributeProto(name=k)
        if isinstance(v, int):
            a.int64_val = v
        else:
            a.string_val = str(v)
        g.attr.append(a)
    out.append(g)
    state: dict[str, Any] = {"prev": None, "prev_comm": None, "bwd_comms": [], "phase": ""}

    def node(i: int, kind: int, name: str, dur: int, parent: int | None) -> Any:
        ts, _ = when(i)
        n = pb.Node(id=i, name=name, type=kind, start_time_micros=ts, duration_micros=dur)
        if parent is not None:
            n.ctrl_deps.append(parent)
        n.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=True))
        out.append(n)
        return n

    def chain(n: Any, comm: bool) -> None:
        if state["prev"] is not None:
            n.data_deps.append(state["prev"])
        if comm:
            if state["prev_comm"] is not None and state["prev_comm"] != state["prev"]:
                n.data_deps.append(state["prev_comm"])
            state["prev_comm"] = n.id
            if state["phase"] == "backward":
                state["bwd_comms"].append(n.id)
            return  # the thread goes on: an async collective does not hold it
        if state["bwd_comms"] and not state["pending_bwd"]:
            n.data_deps.extend(d for d in state["bwd_comms"] if d not in n.data_deps)
            state["bwd_comms"] = []
        state["prev"] = n.id

    def emit(i: int, parent: int) -> None:
        name = nodes[i]["name"]
        dur = when(i)[1]
        if name.startswith("ProfilerStep#"):
            return
        if name.startswith("gloo:"):
            # a gloo op is the collective's run on gloo's worker thread: communication, not
            # compute. The observer may file it under any op of the thread, and the thread's
            # next ops under it: those are emitted in its place
            for c in ordered(kids.get(i, [])):
                emit(c, parent)
            return
        if name in COLLECTIVES:
            n = node(i, pb.COMM_COLL_NODE, name, dur, parent)
            ins = nodes[i]["inputs"]
            n.attr.append(pb.AttributeProto(name="comm_type", int64_val=COLLECTIVES[name]))
            n.attr.append(
                pb.AttributeProto(
                    name="comm_size", int64_val=_tensor_bytes(ins["shapes"], ins["types"])
                )
            )
            chain(n, comm=True)
            state["pending_bwd"] = state["phase"] == "backward" and i != state["last_bwd_comm"]
            return
        if name in LABELS:
            state["phase"] = name
            chain(node(i, pb.COMP_NODE, name, 0, parent), comm=False)
            for c in ordered(kids.get(i, [])):
                emit(c, i)
            return
        if not has_comm(i):
            chain(node(i, pb.COMP_NODE, name, dur, parent), comm=False)
            return
        children = ordered(kids.get(i, []))
        own = max(0, dur - sum(when(c)[1] for c in children if not _is_gloo(nodes[c])))
        chain(node(i, pb.COMP_NODE, name, own, parent), comm=False)
        for c in children:
            emit(c, i)

    # the steps' windows come from the profiler (the observer's nesting of the ops at a step
    # boundary is not reliable): an op belongs to the step its start falls in
    steps = ordered([i for i, n in nodes.items() if n["name"].startswith("ProfilerStep#")])
    windows = [(when(s)[0], sum(when(s)), s) for s in steps]
    tops = [
        i
        for i, n in nodes.items()
        if nodes.get(n["ctrl_deps"], {}).get("name", "").startswith(("ProfilerStep#", "[pytorch"))
        and not n["name"].startswith(("ProfilerStep#", "[pytorch"))
        and _attr(n, "rf_id") in timing  # not the set-up before the profiler (no timing)
    ]
    for t0, t1, s in windows:
        mine = ordered([i for i in tops if t0 <= when(i)[0] < t1])
        comms = [i for i in mine if nodes[i]["name"] == "backward"]
        bwd_comms = [
            c for b in comms for c in _descendants(b, kids) if nodes[c]["name"] in COLLECTIVES
        ]
        state["last_bwd_comm"] = max(bwd_comms, key=lambda i: when(i)[0]) if bwd_comms else None
        state["pending_bwd"] = False
        state["bwd_comms"] = []
        state["phase"] = "forward"
        chain(node(s, pb.COMP_NODE, nodes[s]["name"], 0, None), comm=False)
        for c in mine:
            emit(c, s)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_job_args(p, model="mlp", active=2)
    args = p.parse_args(argv)

    job = Job.start(args, port=29518)
    et_path, kin_path = job.tmp / "et.json", job.tmp / "kineto.json"
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    job.profile(kin_path, wait=1, warmup=1, active=args.active, execution_trace_observer=observer)
    observer.unregister_callback()

    if job.rank == 0:
        et = json.loads(et_path.read_text())
        kineto = json.loads(kin_path.read_text())
        attrs = {"rank": job.rank, "world_size": job.world, "backend": "gloo"}
        msgs = to_chakra(et, kineto, {**attrs, "schema": et["schema"]})
        with open(f"{job.out()}.et", "wb") as f:
            for m in msgs:
                encodeMessage(f, m)
        fields = {
            "param_bytes": job.param_bytes(),
            **job.buckets(),
            "active_steps": args.active,
            "nodes": len(msgs) - 1,
        }
        job.write_meta(".et", fields)
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
