"""The host-daemon model from the launcher's variables (rdmasched/launch.py, docs/CLIENT.md):
Slurm's node list and node id, the one-host default, client endpoints, and the errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmasched import launch
from rdmasched.clientproto import endpoint_name
from rdmasched.errors import ConfigError

TOKEN = "a-long-enough-token"


def slurm(**extra: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "gpu[01-03]",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_LOCALID": "3",
        "RDMASCHED_TOKEN": TOKEN,
    }
    env.update(extra)
    return env


def test_slurm_hosts_are_the_nodes() -> None:
    cluster, me = launch.host_cluster(slurm())
    assert me == 1
    assert cluster.name == "job77" and cluster.transport == "verbs"
    assert [n.name for n in cluster.nodes] == ["gpu01", "gpu02", "gpu03"]
    assert [n.slots for n in cluster.nodes] == [4, 4, 4]
    assert [n.address for n in cluster.nodes] == [f"gpu0{i}:29650" for i in (1, 2, 3)]
    assert launch.host_name(slurm()) == "gpu02"
    assert launch.client_endpoint(slurm()) == ("job77.gpu02", 3)


def test_slurm_variants() -> None:
    cluster, me = launch.host_cluster(
        slurm(
            SLURM_JOB_NODELIST="10.0.0.[1-2]",
            SLURM_NODEID="0",
            SLURM_NTASKS_PER_NODE="2(x2)",
            RDMASCHED_PORT="7000",
            RDMASCHED_ADDR="10.0.0.1",
            RDMASCHED_CLUSTER="train",
        )
    )
    assert me == 0 and cluster.name == "train"
    assert [(n.name, n.slots, n.address) for n in cluster.nodes] == [
        ("10.0.0.1", 2, "10.0.0.1:7000"),
        ("10.0.0.2", 2, "10.0.0.2:7000"),
    ]
    cluster, _ = launch.host_cluster(slurm(RDMASCHED_SLOTS="8", RDMASCHED_TRANSPORT="shm"))
    assert cluster.transport == "shm" and cluster.node(0).slots == 8


@pytest.mark.parametrize(
    ("extra", "drop", "match"),
    [
        ({}, "SLURM_NODEID", "SLURM_NODEID is not"),
        ({"SLURM_NODEID": "3"}, None, "not an index of SLURM_JOB_NODELIST"),
        ({"SLURM_NODEID": "x"}, None, "must be an integer"),
        ({"SLURM_JOB_NODELIST": "a,b,a"}, None, "names a host twice"),
        ({"SLURM_JOB_NODELIST": "a[1-"}, None, "never closed"),
        ({}, "RDMASCHED_TOKEN", "token"),
    ],
)
def test_slurm_errors(extra: dict[str, str], drop: str | None, match: str) -> None:
    env = slurm(**extra)
    if drop:
        del env[drop]
    with pytest.raises(ConfigError, match=match):
        launch.host_cluster(env)


def test_one_host_without_a_launcher() -> None:
    cluster, me = launch.host_cluster({"RDMASCHED_HOST": "box", "LOCAL_WORLD_SIZE": "2"})
    assert me == 0 and cluster.name == "joblocal" and cluster.transport == "shm"
    assert [(n.name, n.slots) for n in cluster.nodes] == [("box", 2)]
    env = {"RDMASCHED_HOST": "box", "TORCHELASTIC_RUN_ID": "a/b c", "LOCAL_RANK": "1"}
    assert launch.client_endpoint(env) == ("joba-b-c.box", 1)


def test_torchrun_errors_before_the_store() -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "GROUP_RANK": "0", "WORLD_SIZE": "3"}
    with pytest.raises(ConfigError, match="not a multiple of LOCAL_WORLD_SIZE"):
        launch.host_cluster({**env, "LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="GROUP_RANK < hosts"):
        launch.host_cluster({**env, "GROUP_RANK": "2", "GROUP_WORLD_SIZE": "2"})


def test_bad_local_rank_and_names() -> None:
    with pytest.raises(ConfigError, match="LOCAL_RANK='x' must be an integer"):
        launch.client_endpoint({"LOCAL_RANK": "x", "RDMASCHED_HOST": "h"})
    with pytest.raises(ConfigError, match=r"0\.\.254"):
        launch.client_endpoint({"LOCAL_RANK": "300", "RDMASCHED_HOST": "h"})
    with pytest.raises(ConfigError, match="daemon name"):
        endpoint_name("job", "bad host")


def test_host_node_is_the_host_daemon() -> None:
    # under Slurm, every rank of gpu02 names the same node (the host), not a node per rank
    node = launch.host_node(slurm())
    assert (node.id, node.spec.name, node.spec.slots) == (1, "gpu02", 4)
    assert [n.name for n in node.cluster.nodes] == ["gpu01", "gpu02", "gpu03"]


def test_daemon_command_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rdmasched.cli import main

    assert main(["daemon", "--config", "cluster.toml"]) == 2  # a bad argument, as everywhere
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("rdmasched daemon: error: --config and --node go together")
    assert main(["daemon", "--config", f"{tmp_path}/none.toml", "--node", "a"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]
    assert main(["daemon", "--max-clients", "0"]) == 2


TOPOLOGY_CONF = """\
SwitchName=leafA Nodes=gpu[01-02],spare1
SwitchName=leafB Nodes=gpu03,spare[2-3]
SwitchName=leafC Nodes=spare[4-5]
SwitchName=spine Switches=leafA,leafB,leafC
"""


def test_slurm_topology_is_cut_down_to_the_job(tmp_path: Path) -> None:
    """Under Slurm a topology.conf makes the cluster's [topology]: the job's hosts in their
    leaves (leafC, with none of them, is gone), so each host holds lanes to its links only;
    this host's id is its position in the topology."""
    conf = tmp_path / "topology.conf"
    conf.write_text(TOPOLOGY_CONF)
    cluster, me = launch.host_cluster(slurm(RDMASCHED_TOPOLOGY=str(conf)))
    t = cluster.topology
    assert t is not None and len(t) == 3
    assert {t.domain(i) for i in range(3)} == {"spine/leafA", "spine/leafB"}
    assert cluster.node(me).name == "gpu02"


def test_slurm_default_topology_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without RDMASCHED_TOPOLOGY, Slurm's own /etc/slurm/topology.conf if it exists; with
    none, no topology (a full mesh)."""
    conf = tmp_path / "topology.conf"
    monkeypatch.setattr(launch, "SLURM_TOPOLOGY_CONF", str(conf))
    assert launch.host_cluster(slurm())[0].topology is None
    conf.write_text(TOPOLOGY_CONF)
    assert launch.host_cluster(slurm())[0].topology is not None


def test_slurm_topology_errors(tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leafA Nodes=gpu[01-02]\n")
    with pytest.raises(ConfigError, match=r"no leaf switch lists the job's host\(s\) \['gpu03'\]"):
        launch.host_cluster(slurm(RDMASCHED_TOPOLOGY=str(conf)))
    with pytest.raises(ConfigError, match=r"RDMASCHED_TOPOLOGY .*missing\.conf"):
        launch.host_cluster(slurm(RDMASCHED_TOPOLOGY=str(tmp_path / "missing.conf")))
