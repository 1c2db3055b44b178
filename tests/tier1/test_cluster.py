"""Cluster config (TOML and launcher environment): every bad input is a clear ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmasched.cluster import ClusterConfig, local_cluster
from rdmasched.errors import ConfigError

GOOD = """
[cluster]
name = "train7"
transport = "shm"
slots_per_lane = 128
heartbeat_ms = 20
dead_after_ms = 200

[[node]]
name = "gpu-a"
slots = 8
domain = "rack1"

[[node]]
name = "gpu-b"
slots = 4
domain = "rack2"
address = "10.0.0.2:7400"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cluster.toml"
    p.write_text(text)
    return p


def test_good_config(tmp_path: Path) -> None:
    c = ClusterConfig.load(write(tmp_path, GOOD))
    assert c.name == "train7" and c.slots_per_lane == 128 and c.heartbeat_ms == 20
    assert [(n.id, n.name, n.slots, n.domain) for n in c.nodes] == [
        (0, "gpu-a", 8, "rack1"),
        (1, "gpu-b", 4, "rack2"),
    ]
    assert c.node("gpu-b").id == 1 and c.node(0).name == "gpu-a"
    assert c.domains == {0: "rack1", 1: "rack2"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('transport = "shm"', 'transport = "carrier-pigeon"'), "transport must be one of"),
        (("slots_per_lane = 128", "slots_per_lane = 100"), "power of two"),
        (("slots = 8", "slots = 0"), r"slots must be 1\.\.255"),
        (("slots = 8", 'slots = "eight"'), "must be an integer"),
        (('name = "gpu-b"', 'name = "gpu-a"'), "appears twice"),
        (('name = "train7"', 'name = "no spaces"'), "must match"),
        (("dead_after_ms = 200", "dead_after_ms = 30"), "dead_after_ms > 2"),
        (("heartbeat_ms = 20", "heartbeat_ms = 20\nbogus = 1"), "unknown \\[cluster\\] key"),
        (('domain = "rack1"', 'domain = "rack1"\ngpus = 3'), "unknown key"),
    ],
)
def test_bad_configs_are_clear(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClusterConfig.load(write(tmp_path, GOOD.replace(*change, 1)))


def test_not_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        ClusterConfig.load(write(tmp_path, "[cluster\nname="))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        ClusterConfig.load(tmp_path / "nope.toml")


def test_no_nodes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least one"):
        ClusterConfig.load(write(tmp_path, '[cluster]\nname = "x"\n'))


def test_verbs_needs_token_and_addresses(tmp_path: Path) -> None:
    text = GOOD.replace('transport = "shm"', 'transport = "verbs"')
    with pytest.raises(ConfigError, match=r"needs cluster\.token"):
        ClusterConfig.load(write(tmp_path, text))
    text = text.replace('name = "train7"', 'name = "train7"\ntoken = "t0k3n-of-16bytes"')
    with pytest.raises(ConfigError, match="host:port"):
        ClusterConfig.load(write(tmp_path, text))
    text = text.replace('domain = "rack1"', 'domain = "rack1"\naddress = "10.0.0.1:7400"')
    assert ClusterConfig.load(write(tmp_path, text)).token == "t0k3n-of-16bytes"


def test_token_file(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("abcdefgh\n")
    text = GOOD.replace('name = "train7"', f'name = "train7"\ntoken_file = "{tmp_path}/tok"')
    assert ClusterConfig.load(write(tmp_path, text)).token == "abcdefgh"


def test_unknown_node() -> None:
    with pytest.raises(ConfigError, match="has no node 'gpu-z'"):
        local_cluster(2, 2).node("gpu-z")


def test_from_env_torchrun() -> None:
    env = {
        "RANK": "2",
        "WORLD_SIZE": "4",
        "MASTER_ADDR": "10.1.1.1",
        "MASTER_PORT": "29500",
        "LOCAL_WORLD_SIZE": "8",
        "RDMASCHED_CLUSTER": "job42",
    }
    c, rank = ClusterConfig.from_env(env)
    assert rank == 2 and len(c.nodes) == 4 and c.name == "job42"
    assert all(n.slots == 8 for n in c.nodes)


def test_from_env_slurm() -> None:
    c, rank = ClusterConfig.from_env(
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77"}
    )
    assert rank == 0 and c.name == "job77" and len(c.nodes) == 2


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "names no rank"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "must be integers"),
        ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK < WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}, "MASTER_PORT"),
        ({"RANK": "0", "WORLD_SIZE": "2", "RDMASCHED_SLOTS": "many"}, "RDMASCHED_SLOTS"),
    ],
)
def test_from_env_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClusterConfig.from_env(env)


# ---- issue 7 item 22 ----------------------------------------------------------------------
def test_a_config_that_is_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "cluster.toml"
    p.write_bytes(GOOD.encode().replace(b"gpu-a", b"gpu-\xe9"))
    with pytest.raises(ConfigError, match=f"cluster config {p} is not UTF-8"):
        ClusterConfig.load(p)


def test_a_directory_as_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"cluster config {tmp_path} is a directory"):
        ClusterConfig.load(tmp_path)


def test_an_unreadable_token_file(tmp_path: Path) -> None:
    (tmp_path / "tok").write_bytes(b"\xff\xfe-not-text-at-all")
    text = GOOD.replace('name = "train7"', f'name = "train7"\ntoken_file = "{tmp_path}/tok"')
    with pytest.raises(ConfigError, match=r"token_file .* is not UTF-8"):
        ClusterConfig.load(write(tmp_path, text))


@pytest.mark.parametrize("token", ["s3cret", "1234567", "é" * 3])
def test_a_token_under_8_bytes(tmp_path: Path, token: str) -> None:
    text = GOOD.replace('name = "train7"', f'name = "train7"\ntoken = "{token}"')
    with pytest.raises(ConfigError, match="at least 8 bytes"):
        ClusterConfig.load(write(tmp_path, text))
    env = {"RANK": "0", "WORLD_SIZE": "2", "RDMASCHED_TOKEN": token}
    with pytest.raises(ConfigError, match="at least 8 bytes"):
        ClusterConfig.from_env(env)


def test_a_short_token_file(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("abc\n")
    text = GOOD.replace('name = "train7"', f'name = "train7"\ntoken_file = "{tmp_path}/tok"')
    with pytest.raises(ConfigError, match="at least 8 bytes"):
        ClusterConfig.load(write(tmp_path, text))


@pytest.mark.parametrize(
    "second", ["10.0.0.1:7400", "[10.0.0.1]:7400", "HOST.example:7400", "host.example:7400"]
)
def test_two_verbs_nodes_at_one_address(tmp_path: Path, second: str) -> None:
    first = "host.example:7400" if "host" in second.lower() else "10.0.0.1:7400"
    text = (
        GOOD.replace('transport = "shm"', 'transport = "verbs"\ntoken = "0123456789abcdef"')
        .replace('domain = "rack1"', f'domain = "rack1"\naddress = "{first}"')
        .replace('address = "10.0.0.2:7400"', f'address = "{second}"')
    )
    with pytest.raises(ConfigError, match=r"node\[1\]\.address .* is also node\[0\]'s"):
        ClusterConfig.load(write(tmp_path, text))


def test_shm_nodes_may_share_an_address(tmp_path: Path) -> None:
    """On shm the address is not used: no need to make it unique."""
    text = GOOD.replace('domain = "rack1"', 'domain = "rack1"\naddress = "10.0.0.2:7400"')
    assert len(ClusterConfig.load(write(tmp_path, text)).nodes) == 2


def test_verbs_class_defaults_and_bounds(tmp_path: Path) -> None:
    """[verbs]: one class for every verbs lane; high by default (SL 6, DSCP 48 = CS6), each
    key bounded, a bad value one clear line naming the key."""
    from rdmasched.limits import DSCP_DEFAULT, SERVICE_LEVEL_DEFAULT

    c = ClusterConfig.load(write(tmp_path, GOOD))
    assert (c.service_level, c.dscp) == (SERVICE_LEVEL_DEFAULT, DSCP_DEFAULT) == (6, 48)
    c = ClusterConfig.load(write(tmp_path, GOOD + "\n[verbs]\nservice_level = 0\ndscp = 26\n"))
    assert (c.service_level, c.dscp) == (0, 26)
    for table, message in [
        ("dscp = 64", r"verbs\.dscp must be an integer in 0\.\.63, not 64"),
        ("dscp = -1", r"verbs\.dscp must be an integer in 0\.\.63, not -1"),
        ("dscp = 4.0", r"verbs\.dscp must be an integer in 0\.\.63, not 4\.0"),
        ("dscp = true", r"verbs\.dscp must be an integer in 0\.\.63, not True"),
        ("service_level = 16", r"verbs\.service_level must be an integer in 0\.\.15, not 16"),
        ("tos = 184", r"unknown \[verbs\] key\(s\) \['tos'\]"),
    ]:
        with pytest.raises(ConfigError, match=message) as exc:
            ClusterConfig.load(write(tmp_path, GOOD + f"\n[verbs]\n{table}\n"))
        assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match=r"\[verbs\] must be a table"):
        ClusterConfig.load(write(tmp_path, "verbs = 5\n" + GOOD))
