"""The demo with a [topology] (issue 8 items 2 and 8): each node process opens lanes only to
its links, and the demo reports the control plane's cost beside the central baseline."""

from __future__ import annotations

import io

import pytest

from rdmasched.cluster import local_cluster
from rdmasched.demo.job import WorkloadConfig
from rdmasched.demo.runner import DemoConfig, print_report, run, run_mode
from rdmasched.transport import shm

pytestmark = pytest.mark.tier2


def _check_lanes(cfg: DemoConfig, res: dict[str, object]) -> None:
    t = local_cluster(cfg.nodes, cfg.slots, leaf=cfg.leaf, pod=cfg.pod).topology
    assert t is not None
    nodes = res["nodes"]
    assert isinstance(nodes, list) and len(nodes) == cfg.nodes
    for n in nodes:
        links = t.neighbours(n["node"])
        assert n["lanes_to"] == links and n["lanes"] == len(links)
        # ring memory: one inbound lane segment per link, as big as the lanes are
        assert n["ring_bytes"] == len(links) * shm.segment_size(256)
    assert res["lanes_max"] == max(len(t.neighbours(i)) for i in range(cfg.nodes))


@pytest.mark.slow
def test_demo_nodes_open_lanes_only_to_their_links() -> None:
    """A topology whose one leaf holds every node: each node is linked to every other, so
    the run needs no relaying; the lanes are the topology's (created by the daemon from
    core.links), and both modes report lanes, ring memory, messages by kind and release."""
    cfg = DemoConfig(nodes=4, slots=2, leaf=4, workload=WorkloadConfig(steps=6))
    res = run(cfg, progress=False)
    a, c = res["rdmasched"], res["central"]
    _check_lanes(cfg, a)
    # the sync tree (docs/SCALE.md section 9): one readiness up and one release down per
    # member but the combiner, each step: 2 (N - 1) for N nodes
    assert a["msgs_per_node_step_by_kind"]["SYNC_READY"] == pytest.approx(
        2 * (cfg.nodes - 1) / cfg.nodes
    )
    assert c["msgs_per_node_step_by_kind"]["SYNC_READY"] == 1  # to the coordinator
    # the coordinator holds a lane to every node; an executor one, to the coordinator
    assert c["lanes_max"] == cfg.nodes and c["lanes_mean"] == 2 * cfg.nodes / (cfg.nodes + 1)
    for mode in (a, c):
        assert mode["sync_release_p50_us"] is not None
        assert 0 <= mode["sync_release_p50_us"] <= mode["sync_release_p99_us"]
        assert mode["msgs_per_node_step"] == pytest.approx(
            sum(mode["msgs_per_node_step_by_kind"].values())
        )
    out = io.StringIO()
    print_report(cfg, res, file=out)
    text = out.getvalue()
    for row in ("lanes per node, max", "ring KiB per node, max", "msgs per node per step"):
        assert row in text
    assert "sync release p99 us" in text and "a topology of leaves of 4" in text


@pytest.mark.slow
def test_demo_32_nodes_in_leaves_of_8() -> None:
    """`rdmasched demo --nodes 32 --leaf 8`: each node holds 10 lanes (its leaf of 8 and its
    rail peers in the 3 other leaves), not 31; every step completes through relays."""
    cfg = DemoConfig(
        nodes=32,
        slots=2,
        leaf=8,
        heartbeat_ms=100,
        dead_after_ms=5000,
        stall_s=120,
        workload=WorkloadConfig(steps=5),
    )
    res = run_mode("rdmasched", cfg, None)
    _check_lanes(cfg, res)
    assert res["lanes_max"] == 10
    assert all(n["steps"] == 5 for n in res["nodes"])
    # the tree, not the all-to-all: under 2 SYNC_READYs per node per step (31 before),
    # relays included (a node's loop counts every message it writes)
    assert res["msgs_per_node_step_by_kind"]["SYNC_READY"] < 2
