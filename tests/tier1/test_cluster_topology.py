"""The cluster config's [topology] (issue 8 item 2): the three forms, node ids and domains
from the topology, the node cap, and a clear ConfigError naming the key for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmasched.cluster import MAX_NODES, ClusterConfig, local_cluster
from rdmasched.errors import ConfigError
from rdmasched.topology import Topology

SLURM = """\
SwitchName=leaf1 Nodes=gpu[1-3]
SwitchName=leaf2 Nodes=gpu[4-5]
SwitchName=pod1 Switches=leaf[1-2]
"""


def write(tmp_path: Path, text: str, name: str = "cluster.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_generated_topology_without_node_tables(tmp_path: Path) -> None:
    c = ClusterConfig.load(
        write(tmp_path, "[cluster]\nslots = 4\n[topology]\nnodes = 40\nleaf = 8\npod = 16\n")
    )
    t = c.topology
    assert t is not None and len(t) == 40 and len(c.nodes) == 40
    assert [n.id for n in c.nodes] == list(range(40))
    assert c.nodes[9].name == t.names[9] and c.nodes[9].slots == 4
    assert c.nodes[9].domain == "pod0/leaf1" == t.domain(9)
    assert c.node(t.names[17]).id == 17


def test_slurm_path_is_relative_to_the_config(tmp_path: Path) -> None:
    write(tmp_path, SLURM, "topology.conf")
    text = """
[cluster]
slots = 2

[[node]]
name = "gpu5"
slots = 8

[[node]]
name = "gpu1"
[[node]]
name = "gpu2"
[[node]]
name = "gpu3"
[[node]]
name = "gpu4"

[topology]
slurm = "topology.conf"
"""
    c = ClusterConfig.load(write(tmp_path, text))
    assert c.topology is not None
    # ids follow the topology (pod, leaf, position), not the order of the [[node]] tables
    assert [n.name for n in c.nodes] == ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5"]
    assert [n.id for n in c.nodes] == [0, 1, 2, 3, 4]
    assert c.node("gpu5").slots == 8 and c.node("gpu1").slots == 2  # cluster.slots: default
    assert c.node("gpu4").domain == "pod1/leaf2"


def test_explicit_switch_tree(tmp_path: Path) -> None:
    text = """
[cluster]
slots = 1
[[topology.switch]]
name = "s1"
nodes = "h[1-4]"
[[topology.switch]]
name = "s2"
nodes = ["h5", "h6"]
"""
    c = ClusterConfig.load(write(tmp_path, text))
    assert c.topology is not None and [n.name for n in c.nodes][-2:] == ["h5", "h6"]
    assert c.node("h5").domain == "s2/s2"  # a leaf with no parent is its own pod


def test_without_topology_nothing_changes(tmp_path: Path) -> None:
    c = local_cluster(3, 2)
    assert c.topology is None and [n.domain for n in c.nodes] == ["rack0", "rack1", "rack0"]


def test_the_1024_node_cap_is_gone() -> None:
    c = ClusterConfig.from_dict(
        {"cluster": {"slots": 1}, "topology": {"nodes": 5000, "leaf": 32, "pod": 1024}}
    )
    assert len(c.nodes) == 5000 and c.node(4999).name == c.topology.names[4999]  # type: ignore[union-attr]
    nodes = [{"name": f"x{i}", "slots": 1} for i in range(1025)]
    assert len(ClusterConfig.from_dict({"node": nodes}).nodes) == 1025
    assert MAX_NODES < (1 << 24) - 1  # node ids fit the wire's u24


def test_above_the_cap_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=rf"topology\.nodes must be in 1\.\.{MAX_NODES}"):
        ClusterConfig.from_dict(
            {"cluster": {"slots": 1}, "topology": {"nodes": MAX_NODES + 1, "leaf": 32, "pod": 1024}}
        )
    with pytest.raises(ConfigError, match=f"WORLD_SIZE <= {MAX_NODES}"):
        ClusterConfig.from_env({"RANK": "0", "WORLD_SIZE": str(MAX_NODES + 1)})


def test_local_cluster_with_a_leaf() -> None:
    c = local_cluster(32, 4, leaf=8)
    t = c.topology
    assert t is not None and len(t.leaf_size) == 4 and len(t.pods) == 1
    assert [n.name for n in c.nodes] == list(t.names) and c.nodes[31].slots == 4
    assert sorted(t.neighbours(0)) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24]
    assert local_cluster(32, 4, leaf=8, pod=16).topology.pods == ("pod0", "pod1")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[topology]\nnodes = 8\nleaf = 4\npod = 8\n", r"cluster\.slots is missing"),
        ("[cluster]\nslots = 1\n[topology]\nnodes = 8\nleaf = 4\n", r"topology\.pod is missing"),
        ("[cluster]\nslots = 1\n[topology]\nnodes = 8\nleaf = 4\npod = 6\n", "multiple of leaf"),
        (
            "[cluster]\nslots = 1\n[topology]\nnodes = 8\nleaf = 4\npod = 8\nrack = 2\n",
            r"unknown \[topology\] key\(s\) \['rack'\]",
        ),
        (
            '[cluster]\nslots = 1\n[topology]\nnodes = "8"\nleaf = 4\npod = 8\n',
            r"topology\.nodes must be an integer",
        ),
        (
            "[cluster]\nslots = 0\n[topology]\nnodes = 8\nleaf = 4\npod = 8\n",
            r"cluster\.slots must be 1\.\.255",
        ),
        ("[cluster]\nslots = 1\ntopology = 3\n", r"unknown \[cluster\] key"),
        ("topology = 3\n", r"\[topology\] must be a table"),
        ("[cluster]\nslots = 1\n[topology]\nslurm = 7\n", r"topology\.slurm must be the path"),
        ('[cluster]\nslots = 1\n[topology]\nslurm = "nope.conf"\n', "nope.conf does not exist"),
        (
            '[cluster]\nslots = 1\n[topology]\nslurm = "t.conf"\nleaf = 4\n',
            r"cannot be combined with topology\.leaf",
        ),
        (
            "[cluster]\nslots = 1\n[topology]\nnodes = 8\nleaf = 4\npod = 8\nbudget = 2\n",
            "no link plan fits 2 lanes",
        ),
        (
            '[cluster]\ntransport = "verbs"\ntoken = "0123456789"\nslots = 1\n'
            "[topology]\nnodes = 8\nleaf = 4\npod = 8\n",
            "needs every node's address",
        ),
        (
            "[cluster]\nslots = 1\n[topology]\nnodes = 2\nleaf = 2\npod = 2\n"
            '[[node]]\nname = "n0"\n[[node]]\nname = "n7"\n',
            r"node\[1\] 'n7' is not a host",
        ),
        (
            "[cluster]\nslots = 1\n[topology]\nnodes = 3\nleaf = 3\npod = 3\n"
            '[[node]]\nname = "n0"\n[[node]]\nname = "n1"\n',
            "no \\[\\[node\\]\\] for n2",
        ),
        (
            "[cluster]\nslots = 1\n[topology]\nnodes = 2\nleaf = 2\npod = 2\n"
            '[[node]]\nname = "n0"\ndomain = "r1"\n[[node]]\nname = "n1"\n',
            r"node\[0\]\.domain is 'r1'",
        ),
    ],
)
def test_bad_topology_configs_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClusterConfig.load(write(tmp_path, text))


def test_a_slurm_file_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        ClusterConfig.load(write(tmp_path, '[cluster]\nslots = 1\n[topology]\nslurm = "d"\n'))


def test_topology_command_reads_a_slurm_key(tmp_path: Path) -> None:
    write(tmp_path, SLURM, "topology.conf")
    t = Topology.load(write(tmp_path, '[topology]\nslurm = "topology.conf"\n', "t.toml"))
    assert t.names == ("gpu1", "gpu2", "gpu3", "gpu4", "gpu5")
