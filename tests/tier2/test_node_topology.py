"""Node daemons from a cluster config whose [topology] is a Slurm topology.conf (issue 8
item 2): node ids and names come from the topology, each node opens lanes only to its links,
and tasks cross those lanes."""

from __future__ import annotations

import multiprocessing as mp
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.node import Node
from rdmasched.scheduler import Task
from rdmasched.transport import shm

pytestmark = pytest.mark.tier2
ctx = mp.get_context("fork")

#: one leaf holds every host, so every node is linked to every other (no relaying needed)
SLURM = "SwitchName=leafA Nodes=h[1-3]\nSwitchName=podA Switches=leafA\n"


def _config(tmp_path: Path) -> Path:
    (tmp_path / "topology.conf").write_text(SLURM)
    name = f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"
    text = f"""
[cluster]
name = "{name}"
slots = 1

[[node]]
name = "h3"
slots = 2

[[node]]
name = "h1"

[[node]]
name = "h2"

[topology]
slurm = "topology.conf"
"""
    p = tmp_path / "cluster.toml"
    p.write_text(text)
    return p


def _node(path: str, name: str, out: Any, go: Any, stop: Any) -> None:
    node = Node.from_config(path, name, spin_us=50)
    ran: list[int] = []
    done: list[int] = []

    @node.on_dispatch
    def run(task: Task, slot: int) -> None:
        ran.append(task.id)
        node.complete(task.id)

    node.on_complete(lambda task_id, where: done.append(task_id))
    node.open()
    try:
        assert node.loop is not None
        lanes = sorted(node.loop.links.outbound)
        segs = {
            s
            for s in shm.list_segments()
            if s.startswith(shm.lane_segment_name(node.cluster.name) + f".{node.id}.from.")
        }
        go.wait(60)
        if name == "h1":
            for k in range(5):  # straight to h3 over their lane
                node.dispatch(100 + k, to="h3", cost_ns=1000)
        node.run(until=lambda: bool(stop.value) or (name == "h1" and len(done) == 5))
        out.put((name, node.id, lanes, sorted(segs), ran, done))
    finally:
        node.stop()


@pytest.mark.slow
def test_nodes_from_a_slurm_topology_open_lanes_to_their_links(tmp_path: Path) -> None:
    path = _config(tmp_path)
    c = ClusterConfig.load(path)
    t = c.topology
    assert t is not None and [n.name for n in c.nodes] == ["h1", "h2", "h3"]
    out = ctx.Queue()
    go = ctx.Barrier(3)
    stop = ctx.Value("i", 0)
    procs = [
        ctx.Process(target=_node, args=(str(path), h, out, go, stop), daemon=True)
        for h in ("h1", "h2", "h3")
    ]
    for p in procs:
        p.start()
    try:
        first = out.get(timeout=120)  # h1, once its five tasks completed on h3
        stop.value = 1
        got = {first[0]: first, **{r[0]: r for r in (out.get(timeout=60) for _ in range(2))}}
    finally:
        stop.value = 1
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    prefix = shm.lane_segment_name(c.name)
    for name, (_, nid, lanes, segs, _ran, _done) in got.items():
        assert nid == c.node(name).id and lanes == t.neighbours(nid)
        assert segs == sorted(f"{prefix}.{nid}.from.{j}" for j in t.neighbours(nid))
    assert got["h3"][4] == [100, 101, 102, 103, 104] and got["h1"][5] == got["h3"][4]
    assert got["h2"][4] == []
