"""The demo's task-id encoding, in one place: the synthetic job (demo/job.py, the simulator's
trace replay) makes its ids with it and the trace viewer (views/mirror.py) reads them back.

A leaf module: it imports nothing of rdmasched.

Layout: kind (2 bits) | node (24 bits) | sequence (37 bits); sync tasks are >= 2**63. The node
field holds every node id (the wire's u24 `src`; a cluster has at most limits.MAX_NODES). It
held 14 bits until 2026-12-01: from node 16,384 on, the node overflowed into the kind, and
from 65,536 on into the sync tasks' range, so at 100,000 nodes the first step never completed
(docs/SIM.md, "Speed").
"""

from __future__ import annotations

KIND_COMPUTE, KIND_BACKGROUND = 1, 2
NODE_SHIFT = 37
NODE_MASK = (1 << 24) - 1
SEQ_MASK = (1 << NODE_SHIFT) - 1


def task_id(kind: int, node: int, seq: int) -> int:
    if not (0 <= node <= NODE_MASK and 0 <= seq <= SEQ_MASK):
        raise ValueError(f"task id: node {node} or sequence {seq} out of range")
    return (kind << 61) | (node << NODE_SHIFT) | seq


def task_kind(tid: int) -> int:
    return (tid >> 61) & 0x3


def task_node(tid: int) -> int:
    return (tid >> NODE_SHIFT) & NODE_MASK


def task_seq(tid: int) -> int:
    return tid & SEQ_MASK
