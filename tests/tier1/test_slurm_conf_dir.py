"""Slurm reads topology.conf from the directory of its slurm.conf: /etc/slurm, or that of
SLURM_CONF when it is set (a cluster configured elsewhere, as scripts/test-slurm.sh's). The
launcher's default topology is the one Slurm itself uses (docs/SLURM.md, "Topology")."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmasched import launch
from tests.tier1.test_launch import TOPOLOGY_CONF, slurm

pytestmark = pytest.mark.tier1


def test_topology_conf_beside_slurm_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    monkeypatch.setattr(launch, "SLURM_TOPOLOGY_CONF", str(etc / "topology.conf"))
    (etc / "topology.conf").write_text(TOPOLOGY_CONF)
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    env = slurm(SLURM_CONF=str(conf_dir / "slurm.conf"))
    # SLURM_CONF names another directory, with no topology.conf: no topology, as Slurm's
    assert launch.host_cluster(env)[0].topology is None
    (conf_dir / "topology.conf").write_text("SwitchName=only Nodes=gpu[01-03]\n")
    t = launch.host_cluster(env)[0].topology
    assert t is not None and len({t.domain(i) for i in range(3)}) == 1  # one leaf: "only"
    assert "only" in t.domain(0)
    # RDMASCHED_TOPOLOGY still comes first
    env["RDMASCHED_TOPOLOGY"] = str(etc / "topology.conf")
    t = launch.host_cluster(env)[0].topology
    assert t is not None and {t.domain(i) for i in range(3)} == {"spine/leafA", "spine/leafB"}
