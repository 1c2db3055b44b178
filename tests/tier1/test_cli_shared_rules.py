"""One rule each, shared by the commands that take the value (issue 20 item 15): `sim` refuses
what `demo`, `topology` or the cluster config refuse, the calibration's real runs stop at the
demo's cap, the launcher's variables are checked one line each naming the variable, and
`bench latency --duration` says what it adds up to."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from rdmasched import launch
from rdmasched.cli import main
from rdmasched.cluster import ClusterConfig
from rdmasched.demo.defaults import DEMO_MAX_NODES
from rdmasched.errors import ConfigError


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_calibration_past_the_demos_cap_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["sim", "--calibrate", "--calibrate-sizes", "8,1000"], capsys)
    assert "--calibrate-sizes" in line and str(DEMO_MAX_NODES) in line, line
    # the simulator alone runs any size
    assert main(["sim", "--sizes", "1000", "--steps", "1", "--schedulers", "rdmasched"]) == 0


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--compute-ms", "0"], "--compute-ms"),
        (["--pod", "12"], "multiple of leaf"),  # --leaf 32 by default
        (["--leaf", "8", "--pod", "12"], "multiple of leaf"),
        (["--dead-after-ms", "60"], "more than 2 x --heartbeat-ms"),
        (["--exec-slots", "256"], "--exec-slots"),
        (["--job-nodes", "9", "--sizes", "8"], "--job-nodes"),
        (["--job-nodes", "9", "--sizes", "16,8"], "--job-nodes"),
        (["--heartbeat-ms", "0"], "--heartbeat-ms"),
    ],
)
def test_sim_refuses_what_demo_topology_and_config_refuse(
    extra: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(["sim", "--steps", "1", *extra], capsys)
    assert says in line, line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["demo", "--compute-ms", "0"], "--compute-ms"),
        (["demo", "--dead-after-ms", "60"], "more than 2 x --heartbeat-ms"),
        (["demo", "--exec-slots", "256"], "--exec-slots"),
        (["topology", "--leaf", "32", "--pod", "12"], "multiple of leaf"),
    ],
)
def test_the_same_rules_in_demo_and_topology(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(argv, capsys)
    assert says in line, line


def test_the_config_says_the_same_liveness_rule() -> None:
    doc: dict[str, Any] = {
        "cluster": {"name": "c", "heartbeat_ms": 50, "dead_after_ms": 60},
        "node": [{"name": "a", "slots": 1}],
    }
    with pytest.raises(ConfigError, match=r"dead_after_ms > 2 \* heartbeat_ms"):
        ClusterConfig.from_dict(doc, source="x.toml")


# ---- the launcher's variables --------------------------------------------------------------
TOKEN = "a-long-enough-token"


def slurm(**extra: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "gpu[01-03]",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS_PER_NODE": "4",
        "RDMASCHED_TOKEN": TOKEN,
    }
    env.update(extra)
    return env


@pytest.mark.parametrize("value", ["abc", "0", "-2", "4x"])
def test_a_bad_ntasks_per_node_is_named(value: str) -> None:
    with pytest.raises(ConfigError, match=rf"^SLURM_NTASKS_PER_NODE={value!r}"):
        launch.host_cluster(slurm(SLURM_NTASKS_PER_NODE=value))


@pytest.mark.parametrize("value", ["4", "4(x3)", "4,2"])
def test_slurm_ntasks_per_node_forms(value: str) -> None:
    assert launch.host_cluster(slurm(SLURM_NTASKS_PER_NODE=value))[0].nodes[0].slots == 4


def test_the_missing_token_names_the_variable() -> None:
    env = slurm()
    del env["RDMASCHED_TOKEN"]
    with pytest.raises(ConfigError) as info:
        launch.host_cluster(env)
    assert "RDMASCHED_TOKEN" in str(info.value) and "cluster.token" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        ClusterConfig.from_env({"RANK": "0", "WORLD_SIZE": "2", "RDMASCHED_TRANSPORT": "verbs"})
    assert "RDMASCHED_TOKEN" in str(info.value) and "cluster.token" not in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("RDMASCHED_STORE_TIMEOUT_S", "-1"),
        ("RDMASCHED_STORE_TIMEOUT_S", "0"),
        ("RDMASCHED_PORT", "70000"),
        ("MASTER_PORT", "0"),
        ("RDMASCHED_SLOTS", "0"),
        ("LOCAL_WORLD_SIZE", "0"),
    ],
)
def test_torchrun_variables_out_of_range_are_named(key: str, value: str) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "GROUP_RANK": "0", "WORLD_SIZE": "2"}
    env |= {"LOCAL_WORLD_SIZE": "1", "RDMASCHED_STORE_TIMEOUT_S": "1"}  # no store here
    env[key] = value
    with pytest.raises(ConfigError, match=rf"^{key}={value!r}"):
        launch.host_cluster(env)


# ---- bench latency --duration ------------------------------------------------------------
def test_latency_duration_help_says_it_is_per_row_and_round(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with contextlib.suppress(SystemExit):
        main(["bench", "latency", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "per row and per round" in text and "total" in text


def test_latency_duration_says_the_total_first(capsys: pytest.CaptureFixture[str]) -> None:
    from rdmasched.commands.bench import latency_total_line

    line = latency_total_line(duration=1.0, rows=6, rounds=5)
    assert line.startswith("bench latency: --duration 1 s per row and round")
    assert "30 s" in line
