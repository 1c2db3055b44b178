"""docs/CONFIG.md is the contract of the cluster config (issue 7 item 9): its examples load
as they are, and its tables name exactly the keys the code accepts."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from rdmasched.cluster import CLUSTER_KEYS, NODE_KEYS, VERBS_KEYS, ClusterConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(title)
    end = text.find("\n#", start + len(title))
    return text[start : end if end >= 0 else None]


def table_keys(title: str) -> set[str]:
    return set(re.findall(r"^\| `([a-z_]+)` \|", section(title), re.M))


def test_the_full_example_loads(tmp_path: Path) -> None:
    full, small, *more = blocks("toml")
    path = tmp_path / "cluster.toml"
    path.write_text(full)
    c = ClusterConfig.load(path)
    assert c.transport == "verbs" and [n.name for n in c.nodes] == ["gpu-a", "gpu-b", "gpu-c"]
    assert c.node("gpu-c").slots == 4 and c.node(1).domain == "rack1/sw1"
    assert (c.service_level, c.dscp) == (6, 48)
    # the full example sets every key but token_file (it gives the token inline)
    assert set(re.findall(r"^(\w+) =", full.split("[[node]]")[0], re.M)) == CLUSTER_KEYS - {
        "token_file"
    }
    assert set(re.findall(r"^(\w+) =", full.split("[[node]]")[1], re.M)) == NODE_KEYS
    path.write_text(small)
    c = ClusterConfig.load(path)
    assert (c.name, c.transport, c.slots_per_lane, c.heartbeat_ms, c.dead_after_ms) == (
        "rdmasched",
        "shm",
        256,
        50,
        500,
    )
    for text in more:  # the [topology] example
        path.write_text(text)
        assert ClusterConfig.load(path).topology is not None


def test_the_tables_name_every_key() -> None:
    assert table_keys("### `[cluster]`") == CLUSTER_KEYS
    assert table_keys("### `[[node]]`") == NODE_KEYS
    assert table_keys("### `[verbs]`") == VERBS_KEYS


def test_the_environment_example_prints_what_it_says() -> None:
    (code,) = blocks("python")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {})
    expected = [line[2:] for line in code.splitlines() if line.startswith("# ")]
    assert out.getvalue().splitlines() == expected
