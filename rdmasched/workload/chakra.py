"""Read a Chakra execution trace (MLCommons `mlc-chakra`, `.et`) of one rank as a `Workload`.

A Chakra ET is a file of length-delimited protobuf messages (chakra's schema,
`chakra.schema.protobuf.et_def_pb2`): one `GlobalMetadata`, then one `Node` per operation,
each with a type, a duration, control and data dependencies and attributes. It is the same
one-rank graph that `rdmasched.workload.torch_trace` builds from a profiler trace, already
explicit, so the reader maps it onto the same model (docs/WORKLOADS.md, "Chakra traces"):

- issue order: the dependency graph's topological order, ties broken by `start_time_micros`,
  then by node id (chakra's converter keeps PyTorch's ids, which count in issue order);
- steps: nodes named `ProfilerStep#N` start step N (no such node: one step, with a warning);
  phases: nodes named `forward` / `backward` / `optimizer` (the same names and torch's own
  ranges as the profiler parser), else the first autograd op after a forward mark;
- `COMP_NODE`s (in a trace with GPU nodes, only those with `is_cpu_op` false) are compute:
  consecutive ones of one phase are one `ComputeTask`, its duration the sum of theirs; a
  compute task ends at each communication node and at each phase or step change;
- `COMM_COLL_NODE` is one `SyncTask` (collective from `comm_type`, bytes from `comm_size`),
  `COMM_SEND_NODE` / `COMM_RECV_NODE` a `send` / `recv` sync;
- `ctrl_deps` and `data_deps` both become dependencies, between the tasks that hold the
  nodes; a node the workload does not keep (labels, metadata, memory nodes, CPU ops of a GPU
  trace) passes its own dependencies on to the nodes that depend on it.

Reading needs `protobuf` and chakra's schema module only (`pip install --no-deps
mlc-chakra`, or the `[chakra]` extra and scripts/setup.sh); no torch.
"""

from __future__ import annotations

import heapq
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rdmasched import files
from rdmasched.workload.model import (
    ComputeTask,
    Phase,
    Step,
    TaskBuilder,
    Workload,
    WorkloadError,
    read_bytes,
)
from rdmasched.workload.torch_trace import (
    STEP_RE,
    _builtin_phase,
    _looks_backward,
    _user_phase,
    normalise_collective,
)

INSTALL_HINT = (
    "reading a Chakra execution trace needs chakra's schema and protobuf: "
    "pip install 'rdmasched[chakra]' && pip install --no-deps 'mlc-chakra==1.0.0'"
)
#: file name endings read as Chakra ETs whatever their content looks like
SUFFIXES = (".et", ".et.gz")
_GZIP = b"\x1f\x8b"


def _schema() -> Any:
    """chakra's generated protobuf module; WorkloadError with the install line if missing."""
    try:
        from chakra.schema.protobuf import et_def_pb2
    except ImportError as exc:
        raise WorkloadError(f"{INSTALL_HINT} ({exc})") from None
    return et_def_pb2


def looks_like_chakra(path: str | Path, head: bytes | None = None) -> bool:
    """A Chakra ET by name (`.et`, `.et.gz`), else by content: not JSON text (a profiler
    trace starts with `{` or `[`, gzipped or not)."""
    name = str(path).lower()
    if name.endswith(SUFFIXES):
        return True
    if name.endswith((".json", ".json.gz")):
        return False
    if head is None:
        try:
            with files.open_regular(path) as f:
                head = f.read(4096)
        except (OSError, files.FileRefused):
            return False  # read_bytes says what it is
    if head[:2] == _GZIP:
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 64)
        except zlib.error:
            return False
    text = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    return bool(text) and text[:1] not in (b"{", b"[")


def read_messages(data: bytes, source: str) -> tuple[Any, list[Any]]:
    """(GlobalMetadata, [Node, ...]) from the bytes of an ET: each message is a varint length
    and that many bytes (chakra's `protolib.encodeMessage`). Its `decodeMessage` stops
    silently at a damaged or cut message, so the framing is checked here."""
    pb = _schema()
    from google.protobuf.message import DecodeError

    msgs: list[bytes] = []
    pos, end = 0, len(data)
    while pos < end:
        size, shift, start = 0, 0, pos
        while True:
            if pos >= end:
                raise WorkloadError(f"{source}: truncated Chakra trace (a length cut at {start})")
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 28:
                raise WorkloadError(f"{source}: not a Chakra trace (bad length at byte {start})")
        if pos + size > end:
            raise WorkloadError(
                f"{source}: truncated Chakra trace (message at byte {start} needs {size} "
                f"bytes, {end - pos} left)"
            )
        msgs.append(data[pos : pos + size])
        pos += size
    if not msgs:
        raise WorkloadError(f"{source}: empty file: not a Chakra trace")
    meta = pb.GlobalMetadata()
    nodes = []
    try:
        meta.ParseFromString(msgs[0])
        for i, m in enumerate(msgs[1:], 1):
            n = pb.Node()
            n.ParseFromString(m)
            if n.type not in pb.NodeType.values() or (n.id == 0 and not n.name and i > 1):
                raise DecodeError(f"message {i} is not a node")
            nodes.append(n)
    except DecodeError as exc:
        raise WorkloadError(f"{source}: not a Chakra trace ({exc})") from None
    if not meta.version and not meta.attr:
        raise WorkloadError(f"{source}: not a Chakra trace (no global metadata first)")
    if not nodes:
        raise WorkloadError(f"{source}: a Chakra trace without nodes: nothing to replay")
    return meta, nodes


def load(path: str | Path) -> Workload:
    """Read a Chakra ET file (gzipped or not) into a Workload."""
    p = Path(path)
    raw = read_bytes(p)
    if raw.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"{", b"["):
        raise WorkloadError(
            f"{p}: not a Chakra trace: JSON text (a torch.profiler trace is read as one when "
            "it is named .json or .json.gz)"
        )
    meta, nodes = read_messages(raw, str(p))
    return parse(meta, nodes, source=str(p))


# ---- the graph --------------------------------------------------------------------------------
def _attrs(node: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in node.attr:
        which = a.WhichOneof("value")
        if which is not None:
            v = getattr(a, which)
            out[a.name] = list(v.values) if which.endswith("_list") else v
    return out


@dataclass
class _Node:
    id: int
    name: str
    type: int
    deps: list[int]
    start_us: int
    dur_ns: int
    attrs: dict[str, Any]
    #: what the workload keeps it as: "compute", "sync", or "" (passes its deps on)
    role: str = ""
    collective: str = ""
    nbytes: int = 0
    #: task ids this node stands for, to the nodes that depend on it
    tasks: set[int] = field(default_factory=set)


def _order(nodes: dict[int, _Node], source: str) -> list[_Node]:
    """Topological order; ties by (start_time_micros, id). WorkloadError on a cycle or a
    dependency on a node that is not in the trace."""
    indeg = {i: 0 for i in nodes}
    users: dict[int, list[int]] = {i: [] for i in nodes}
    for n in nodes.values():
        for d in n.deps:
            if d not in nodes:
                raise WorkloadError(
                    f"{source}: node {n.id} ({n.name}) depends on node {d}, "
                    "which is not in the trace"
                )
            indeg[n.id] += 1
            users[d].append(n.id)
    heap = [(nodes[i].start_us, i) for i, k in indeg.items() if k == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(nodes[i])
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (nodes[u].start_us, u))
    if len(out) < len(nodes):
        stuck = sorted(i for i, k in indeg.items() if k > 0)[:5]
        raise WorkloadError(f"{source}: the dependencies have a cycle (through nodes {stuck})")
    return out


def parse(meta: Any, pb_nodes: list[Any], source: str = "<chakra>") -> Workload:
    """A Workload from chakra's GlobalMetadata and Node messages."""
    pb = _schema()
    comm_names = {v: k for k, v in pb.CollectiveCommType.items()}
    ignored: Counter[str] = Counter()
    warnings: list[str] = []
    nodes: dict[int, _Node] = {}
    for m in pb_nodes:
        if m.id in nodes:
            raise WorkloadError(f"{source}: node id {m.id} is used twice")
        deps = list(dict.fromkeys([*m.ctrl_deps, *m.data_deps]))
        if m.id in deps:
            raise WorkloadError(f"{source}: node {m.id} ({m.name}) depends on itself")
        nodes[m.id] = _Node(
            m.id, m.name, m.type, deps, m.start_time_micros, m.duration_micros * 1000, _attrs(m)
        )
    if not any(n.start_us for n in nodes.values()):  # no times: the order is the graph's
        for n in nodes.values():
            n.start_us = -1
    device = "gpu" if any(n.attrs.get("is_cpu_op") is False for n in nodes.values()) else "cpu"
    for n in nodes.values():
        if n.type == pb.COMP_NODE:
            # a step or a record_function phase range is a label; torch's own phase ops
            # (DistributedDataParallel.forward, Optimizer.step#...) mark a phase and compute
            if STEP_RE.match(n.name) or _user_phase(n.name):
                ignored["label"] += 1
            elif device == "gpu" and n.attrs.get("is_cpu_op", True):
                ignored["COMP_NODE (CPU op, GPU trace)"] += 1
            else:
                n.role = "compute"
        elif n.type == pb.COMM_COLL_NODE:
            n.role = "sync"
            ct = n.attrs.get("comm_type")
            n.collective = normalise_collective(comm_names.get(ct, str(ct)))
            n.nbytes = int(n.attrs.get("comm_size", 0) or 0)
        elif n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            n.role = "sync"
            n.collective = "send" if n.type == pb.COMM_SEND_NODE else "recv"
            n.nbytes = int(n.attrs.get("comm_size", 0) or 0)
        else:
            ignored[pb.NodeType.Name(n.type) if n.type in pb.NodeType.values() else "?"] += 1
        if n.role == "sync" and not n.nbytes:
            warnings.append(f"{n.name or 'node ' + str(n.id)}: no comm_size: a 0-byte sync")
    order = _order(nodes, source)

    # -- steps and phases, in issue order
    has_steps = any(STEP_RE.match(n.name) for n in order)
    if not has_steps:
        warnings.append("no ProfilerStep#N nodes: the whole trace is read as one step")
    b = _Builder()
    phase: Phase = "forward"
    index = -1 if has_steps else 0
    seen_backward = False
    if not has_steps:
        b.open(0, None)
    for n in order:
        m = STEP_RE.match(n.name) if n.type == pb.COMP_NODE else None
        if m:
            index += 1
            b.open(index, int(m.group(1)), n)
            phase, seen_backward = "forward", False
            continue
        if index < 0:  # before the first step (set-up): its nodes pass their deps on
            ignored["before the first step"] += 1
            b.pass_through(n)
            continue
        p = (_user_phase(n.name) or _builtin_phase(n.name)) if n.type == pb.COMP_NODE else None
        if p is not None:
            phase = p
            seen_backward = seen_backward or p == "backward"
        elif phase == "forward" and not seen_backward and _looks_backward(n.name):
            phase, seen_backward = "backward", True
        if n.role == "compute":
            b.compute(n, phase)
        elif n.role == "sync":
            b.sync(n, phase)
        else:
            b.pass_through(n)
    steps = b.close()
    for s in steps:
        if s.tasks and "backward" not in {t.phase for t in s.tasks}:
            warnings.append(f"step {s.index}: no backward phase found")
    if not any(s.syncs for s in steps):
        warnings.append("no communication nodes: a single-rank or non-distributed trace")
    if not any(s.tasks for s in steps):
        raise WorkloadError(f"{source}: no compute or communication nodes: nothing to replay")
    steps = [s for s in steps if s.tasks]
    g = _attrs(meta)

    def _int_attr(k: str) -> int | None:
        v = g.get(k)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    backend = g.get("backend")
    wl = Workload(
        source=source,
        device=device,
        backend=backend if isinstance(backend, str) and backend else None,
        rank=_int_attr("rank"),
        world_size=_int_attr("world_size"),
        steps=tuple(steps),
        ignored=dict(ignored),
        warnings=tuple(dict.fromkeys(warnings)),
    )
    wl.validate()
    return wl


class _Builder(TaskBuilder[_Node]):
    """Groups nodes, in issue order, into the model's tasks with the trace's dependencies."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[Step] = []
        self.opened = False
        self.pstep: int | None = None
        self.t0: int | None = None
        self.t1 = 0
        #: ET node id -> the task ids it stands for, to the nodes that depend on it
        self.node_tasks: dict[int, set[int]] = {}

    def open(self, index: int, pstep: int | None, label: _Node | None = None) -> None:
        self.flush()
        self._close_step()
        self.opened = True
        self.begin_step(index)
        self.pstep = pstep
        self.t0, self.t1 = None, 0
        if label is not None:
            self._time(label)
            self.pass_through(label)

    def close(self) -> list[Step]:
        self.flush()
        self._close_step()
        return self.steps

    def _close_step(self) -> None:
        if self.opened:
            busy = sum(t.duration_ns for t in self.tasks if isinstance(t, ComputeTask))
            span = (self.t1 - self.t0) * 1000 if self.t0 is not None else 0
            self.steps.append(Step(self.index, self.pstep, max(span, busy), tuple(self.tasks)))

    def _time(self, n: _Node) -> None:
        if n.start_us >= 0:
            self.t0 = n.start_us if self.t0 is None else min(self.t0, n.start_us)
            self.t1 = max(self.t1, n.start_us + n.dur_ns // 1000)

    def _offset(self, n: _Node) -> int:
        return (n.start_us - self.t0) * 1000 if n.start_us >= 0 and self.t0 is not None else 0

    def _deps(self, members: list[_Node]) -> tuple[int, ...]:
        """The tasks its nodes depend on (never itself, the task `next_id` names); a task
        that has none follows the task made before it, and the first task of a step
        follows the last of the step before."""
        deps: set[int] = set()
        for n in members:
            for d in n.deps:
                deps |= self.node_tasks.get(d, set())
        deps.discard(self.next_id)
        if self.last_id is not None and (not deps or not self.tasks):
            deps.add(self.last_id)
        return tuple(sorted(deps))

    def pass_through(self, n: _Node) -> None:
        self.node_tasks[n.id] = {t for d in n.deps for t in self.node_tasks.get(d, ())}

    def compute(self, item: _Node, phase: Phase) -> None:
        super().compute(item, phase)
        self.node_tasks[item.id] = {self.next_id}

    def sync(self, n: _Node, phase: Phase) -> None:
        self.flush()
        self._time(n)
        t = self.add_sync(
            phase,
            n.collective,
            nbytes=n.nbytes,
            nelems=0,
            dtype="",
            duration_ns=n.dur_ns,
            offset_ns=self._offset(n),
            deps=self._deps([n]),
        )
        self.node_tasks[n.id] = {t.id}

    def _group(self, phase: Phase, items: list[_Node]) -> None:
        for n in items:
            self._time(n)
        dur = sum(n.dur_ns for n in items)
        timed = [n for n in items if n.start_us >= 0]
        span = dur
        if timed:
            first = min(n.start_us for n in timed) * 1000
            span = max(dur, max(n.start_us * 1000 + n.dur_ns for n in timed) - first)
        self.add_compute(
            phase,
            duration_ns=dur,
            offset_ns=self._offset(items[0]),
            span_ns=span,
            ops=len(items),
            deps=self._deps(items),
        )
