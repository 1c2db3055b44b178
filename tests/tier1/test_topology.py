"""Topology: the three input formats, the link plans and their bounds, routes, the CLI."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from rdmasched import topology as tp
from rdmasched.cli import main
from rdmasched.errors import ConfigError
from rdmasched.slurm import Switch, expand_hostlist, parse_slurm
from rdmasched.topology import Topology, verify

DATA = Path(__file__).resolve().parents[1] / "data" / "topology"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "SCALE.md"


# ---- hostlists -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("node[001-003,040]", ["node001", "node002", "node003", "node040"]),
        ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("a1,b[2],c", ["a1", "b2", "c"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("x[0]-y", ["x0-y"]),
        (" tux[0-1] ", ["tux0", "tux1"]),
        ("node[7]", ["node7"]),
    ],
)
def test_hostlist_expands_like_slurm(expr: str, names: list[str]) -> None:
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("node[5-3]", "backwards"),
        ("node[1-4", "never closed"),
        ("node1-4]", "without"),
        ("node[[1-2]]", "nested"),
        ("node[]", "bad range"),
        ("node[a-b]", "bad range"),
        ("node[1-]", "bad range"),
        ("a,,b", "empty name"),
        ("", "empty name"),
        ("no de[1-2]", "not a valid host name"),
    ],
)
def test_bad_hostlists_are_refused(expr: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        expand_hostlist(expr)


# ---- Slurm topology.conf ---------------------------------------------------------------------
def test_slurm_tree_file() -> None:
    t = Topology.load_slurm(DATA / "tree.conf")
    assert t.leaf_names == ("leaf1", "leaf2", "leaf3", "leaf4")
    assert t.pods == ("pod1", "pod2")
    assert t.leaf_size == (4, 4, 4, 4)
    assert t.names[:8] == (
        "gpu001",
        "gpu002",
        "gpu003",
        "gpu004",
        "gpu005",
        "gpu006",
        "gpu010",
        "gpu7",
    )
    assert t.domain(t.index("gpu014")) == "pod2/leaf3"
    assert t.rail(t.index("gpu010")) == 2
    # the continuation line was joined
    assert t.index("gpu018") == 15


def test_toml_switches_and_slurm_build_the_same_model() -> None:
    a = Topology.load_slurm(DATA / "tree.conf")
    b = Topology.load(DATA / "tree.toml")
    assert (a.names, a.leaf_names, a.leaf_size, a.leaf_pod, a.pods) == (
        b.names,
        b.leaf_names,
        b.leaf_size,
        b.leaf_pod,
        b.pods,
    )
    assert a.plan == b.plan
    assert [a.neighbours(u) for u in range(len(a))] == [b.neighbours(u) for u in range(len(b))]
    assert all(a.path(s, d) == b.path(s, d) for s in range(len(a)) for d in range(len(a)))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s1 Nodes=n3", "defined twice"),
        ("SwitchName=s1 Nodes=n1 Switches=s2\nSwitchName=s2 Nodes=n2", "both child switches"),
        ("SwitchName=s1 Nodes=n1\nSwitchName=top Switches=s1,s7", r"invalid child \(s7\)"),
        ("SwitchName=s1 Nodes=n1\nSwitchName=top Switches=top,s1", r"invalid child \(top\)"),
        ("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[2-3]", "node n2 is under two leaf"),
        (
            "SwitchName=s1 Nodes=n1\nSwitchName=a Switches=s1\nSwitchName=b Switches=s1",
            "under both a and b",
        ),
        ("SwitchName=s1 Nodes=n1 Speed=5", "unknown key 'Speed'"),
        ("Nodes=n1 SwitchName=s1", "must start with SwitchName"),
        ("BlockName=b1 Nodes=n1", "unknown key 'BlockName'"),
        ("SwitchName=s1 Nodes", "expected key=value"),
        ("SwitchName=s1 Nodes=n1 LinkSpeed=fast", "LinkSpeed must be an integer"),
        ("SwitchName=top Switches=a\nSwitchName=a", "no switch lists any Nodes"),
        ("# nothing\n\n", "no switches configured"),
        ("SwitchName=s1 Nodes=n[3-1]", "backwards"),
        ("SwitchName=s1 Nodes=n[1-3],n2", "lists n2 twice"),
    ],
)
def test_slurm_errors(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        Topology.from_slurm(text)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("cycle.conf", "not a tree"),
        ("two_leaves.conf", "n04 is under two leaf switches"),
        ("unknown_switch.conf", r"invalid child \(leaf9\)"),
    ],
)
def test_slurm_error_files_name_the_line(name: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as exc:
        Topology.load_slurm(DATA / name)
    assert name in str(exc.value)


def test_slurm_error_names_file_and_line() -> None:
    with pytest.raises(ConfigError, match=r"t\.conf:3: unknown key"):
        parse_slurm("# c\nSwitchName=a Nodes=n1\nSwitchName=b Nodse=n2\n", "t.conf")


def test_leaves_without_parent_are_their_own_pods() -> None:
    t = Topology.from_slurm("SwitchName=a Nodes=n[1-3]\nSwitchName=b Nodes=m[1-3]\n")
    assert t.pods == ("a", "b")
    assert verify(t).max_hops <= t.plan.hops


# ---- TOML ------------------------------------------------------------------------------------
def test_toml_generated() -> None:
    t = Topology.from_toml({"topology": {"nodes": 100, "leaf": 8, "pod": 32, "prefix": "h"}})
    assert len(t) == 100 and t.leaf_size[-1] == 4 and len(t.pods) == 4
    assert t.names[0] == "h00" and t.names[-1] == "h99"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({}, r"no \[topology\] table"),
        ({"topology": {"nodes": 10, "leaf": 2}}, "topology.pod is missing"),
        ({"topology": {"nodes": "10", "leaf": 2, "pod": 4}}, "must be an integer"),
        ({"topology": {"nodes": 10, "leaf": 2, "pod": 4, "racks": 1}}, "unknown"),
        (
            {"topology": {"nodes": 4, "switch": [{"name": "a", "nodes": "n1"}]}},
            "not both",
        ),
        ({"topology": {"switch": []}}, "non-empty array"),
        ({"topology": {"switch": [{"name": "a", "nodes": 3}]}}, "hostlist string"),
        ({"topology": {"switch": [{"nodes": "n1"}]}}, "name must be a string"),
        ({"topology": {"switch": [{"name": "a", "nodes": "n1", "up": "b"}]}}, "unknown key"),
        ({"topology": {"nodes": 10, "leaf": 2, "pod": 4, "budget": "64"}}, "budget"),
    ],
)
def test_toml_errors(data: dict[str, Any], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        Topology.from_toml(data)


def test_toml_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Topology.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[topology\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Topology.load(bad)


# ---- generated -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"nodes": 0}, "nodes must be"),
        ({"nodes": 100, "leaf": 32, "pod": 1000}, "multiple of leaf"),
        ({"nodes": 100, "leaf": 0}, ">= 1"),
        ({"nodes": 100, "budget": 0}, "budget"),
        ({"nodes": 1000, "leaf": 80, "pod": 800}, "no link plan fits 64"),
        ({"nodes": 100, "prefix": "9x"}, "prefix"),
    ],
)
def test_generate_errors(kw: dict[str, Any], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        Topology.generate(**kw)


def test_generated_shape() -> None:
    t = Topology.generate(3000, leaf=32, pod=1024)
    assert len(t.leaf_size) == 94 and t.leaf_size[-1] == 3000 - 93 * 32
    assert len(t.pods) == 3 and t.pod(2999) == 2 and t.pod(1023) == 0 and t.pod(1024) == 1
    assert t.rail(33) == 1 and t.leaf(33) == 1


# ---- links: symmetry and budget --------------------------------------------------------------
SHAPES = [
    ("rail-mesh, one pod", lambda: Topology.generate(256, leaf=16, pod=256)),
    ("leaf-dragonfly", lambda: Topology.generate(300, leaf=8, pod=32)),
    ("leaf-dragonfly, one link", lambda: Topology.generate(300, leaf=8, pod=32, budget=20)),
    ("rail-mesh, groups", lambda: Topology.generate(400, leaf=4, pod=16, budget=16)),
    ("rail-mesh, 1-node leaf", lambda: Topology.generate(413, leaf=4, pod=16, budget=18)),
    ("slurm tree", lambda: Topology.load_slurm(DATA / "tree.conf")),
    (
        "uneven leaves",
        lambda: Topology.from_switches(
            [
                Switch(f"l{i}", tuple(f"h{i}x{j}" for j in range(1 + (7 * i) % 13)))
                for i in range(40)
            ]
            + [Switch("p0", switches=tuple(f"l{i}" for i in range(25)))]
            + [Switch("p1", switches=tuple(f"l{i}" for i in range(25, 40)))]
        ),
    ),
]


@pytest.mark.parametrize("make", [s[1] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_links_are_symmetric_within_budget_and_routes_hold_the_bound(make: Any) -> None:
    t = make()
    links = [set(t.neighbours(u)) for u in range(len(t))]
    for u, peers in enumerate(links):
        assert u not in peers
        assert (
            set(range(t.leaf_start[t.leaf(u)], t.leaf_start[t.leaf(u)] + t.leaf_size[t.leaf(u)]))
            - {u}
            <= peers
        )
        for v in peers:
            assert u in links[v], (u, v)
        assert len(peers) <= t.budget
        assert len(peers) <= t.plan.degree_bound
    rep = verify(t, exhaustive_limit=len(t))
    assert rep.path_check == "all pairs" and rep.paths_checked == len(t) ** 2
    assert rep.max_hops <= t.plan.hops and rep.bfs_max_distance <= t.plan.hops


def test_verify_catches_a_broken_plan() -> None:
    """verify() is not a rubber stamp: a link dropped on one side is found."""

    class OneSided(Topology):
        def neighbours(self, node: int) -> list[int]:
            out = super().neighbours(node)
            return [v for v in out if not (node == 0 and v == out[-1])]

    with pytest.raises(AssertionError, match="has no link"):
        verify(OneSided([f"n{i}" for i in range(8)], [("a", 0, 4), ("b", 0, 4)], ["p"]))


# ---- the bounds at 1k (exhaustive) and 100k (sampled) ----------------------------------------
@pytest.fixture(scope="module")
def report_1k() -> tp.Report:
    return verify(Topology.generate(1000, leaf=32, pod=1024))


def test_1k_every_pair(report_1k: tp.Report) -> None:
    rep = report_1k
    assert rep.path_check == "all pairs" and rep.paths_checked == 1_000_000
    assert rep.max_lanes <= 64 and rep.max_qps <= 64
    assert rep.max_ring_bytes <= 8 << 20
    assert rep.max_hops <= 3 and rep.bfs_max_distance <= 3
    assert all(rep.targets().values())


@pytest.fixture(scope="module")
def report_100k() -> tp.Report:
    # the parameters of `rdmasched topology --nodes 100000` (docs/SCALE.md)
    return verify(Topology.generate(100_000, leaf=32, pod=1024))


@pytest.mark.slow
def test_100k_sampled(report_100k: tp.Report) -> None:
    rep = report_100k
    assert rep.path_check == "4 sampled sources x all destinations"
    assert rep.paths_checked == 400_000 and rep.bfs_sources == 2
    assert rep.max_lanes <= 64 and rep.max_qps <= 64 and rep.max_ring_bytes <= 8 << 20
    # 3 hops do not fit 64 lanes at 100,000 nodes with these plans (docs/SCALE.md): the
    # structural bound is 4 and the checked routes and the BFS meet it exactly
    assert rep.hop_bound == 4 and rep.max_hops == 4 and rep.bfs_max_distance == 4
    assert rep.targets() == {
        "lanes <= 64": True,
        "QPs <= 64": True,
        "ring memory <= 8 MiB": True,
        "hops <= 3": False,
    }


def test_3_hops_up_to_the_dragonfly_limit() -> None:
    t = Topology.generate(33_792, leaf=32, pod=1024)
    assert t.plan.scheme == "leaf-dragonfly" and t.plan.hops == 3
    rep = verify(t, sources=1, bfs_sources=1)
    assert rep.max_lanes == 64 and rep.max_hops == 3 and rep.bfs_max_distance == 3


def test_plan_choice() -> None:
    assert Topology.generate(10_000).plan.scheme == "leaf-dragonfly"
    assert Topology.generate(10_000).plan.copies == 2
    assert Topology.generate(1024).plan.hops == 2
    assert Topology.generate(100_000).plan.scheme == "rail-mesh"
    assert Topology.generate(100_000, budget=129).plan.hops == 3
    assert Topology.generate(32).plan.hops == 1


# ---- routes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1000, 10_000, 100_000])
def test_route_is_deterministic_and_relays_agree(n: int) -> None:
    a, b = Topology.generate(n), Topology.generate(n)
    pairs = [(s, (s * 7919 + 13) % n) for s in range(0, n, max(1, n // 300))]
    for s, d in pairs:
        p = a.path(s, d)
        assert p == b.path(s, d)
        assert a.route(s, d) == b.route(s, d) == (p[1] if s != d else d)
        assert len(p) - 1 <= a.plan.hops
        assert p[0] == s and p[-1] == d and len(set(p)) == len(p)
        # every relay, knowing only (src, dst), sends to the same next node
        for i, at in enumerate(p[:-1]):
            assert a.next_hop(at, s, d) == p[i + 1]


@pytest.mark.parametrize("n", [1000, 10_000, 100_000])
def test_a_dead_relay_is_avoided(n: int) -> None:
    t = Topology.generate(n)
    for s in range(0, n, n // 50):
        d = (s * 31 + n // 3) % n
        p = t.path(s, d)
        if len(p) < 3:
            continue
        for dead in p[1:-1]:
            alt = t.path(s, d, dead=[dead])
            assert dead not in alt and alt[0] == s and alt[-1] == d
            assert len(alt) - 1 <= t.plan.hops + 1
            for u, v in itertools.pairwise(alt):
                assert v in t.neighbours(u)


# ---- the CLI ---------------------------------------------------------------------------------
def test_cli_text_matches_verify(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "--nodes", "400", "--leaf", "4", "--pod", "16", "--budget", "16"]) == 0
    out = capsys.readouterr().out
    rep = verify(Topology.generate(400, leaf=4, pod=16, budget=16))
    assert f"max {rep.max_lanes}, mean {rep.mean_lanes:.1f}" in out
    assert f"hops: bound {rep.hop_bound}; max {rep.max_hops} over {rep.paths_checked}" in out
    assert f"{rep.max_ring_bytes / (1 << 20):.2f} MiB" in out
    assert "256 slots x 64 B" in out


def test_cli_json_sources(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "--slurm", str(DATA / "tree.conf"), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert (
        main(["topology", "--config", str(DATA / "tree.toml"), "--json", "--lane-slots", "1024"])
        == 0
    )
    b = json.loads(capsys.readouterr().out)
    assert a["nodes"] == b["nodes"] == 16 and a["max_lanes"] == b["max_lanes"]
    assert b["max_ring_bytes"] == b["max_lanes"] * (1024 * 64 + 256)
    assert a["slots_per_lane"] == tp.DEFAULT_SLOTS_PER_LANE == 256


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--nodes", "0"], r"--nodes: must be an integer in 1\.\."),
        (["--nodes", "x"], "--nodes: must be an integer, not 'x'"),
        (["--pod", "1000"], "multiple of leaf"),
        (["--lane-slots", "100"], "power of two"),
        (["--budget", "8"], "no link plan fits 8"),
        (["--slurm", "/nonexistent/topology.conf"], "does not exist"),
        (["--slurm", str(DATA / "cycle.conf")], "not a tree"),
        (["--config", str(DATA / "tree.toml"), "--nodes", "5"], "cannot be combined"),
    ],
)
def test_cli_errors_are_one_line(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topology", *argv]) != 0
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and re.search(why, err), err
    assert err.startswith("rdmasched topology: error: ")


@pytest.mark.parametrize(
    "argv",
    [
        ["--budget", "x"],
        ["--budget", "0"],
        ["--lane-slots", "100"],
        ["--lane-slots", "x"],
        ["--sizes", "1k,x"],
        ["--sizes", "0"],
        ["--nodes", "x"],
        ["--nodes", "0"],
        ["--leaf", "0"],
        ["--pod", "-1"],
        ["--exhaustive", "-1"],
        ["--sources", "0"],
        ["--bfs", "x"],
    ],
)
def test_cli_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """As every command's: argparse refuses them, exit 2, one line naming the option."""
    assert main(["topology", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"rdmasched topology: error: argument {argv[0]}: "), err


def test_cli_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for default in ("default 1024", "default 32", "default 64", "default 256", "default 2048"):
        assert default in out


# ---- docs/SCALE.md: its examples run and its figures are the command's -----------------------
def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOCS.read_text(), re.S)


def test_docs_toml_examples_load(tmp_path: Path) -> None:
    blocks = _blocks("toml")
    assert len(blocks) >= 2
    (tmp_path / "topology.conf").write_text(_blocks("slurm")[0])  # for `slurm = "..."`
    for i, text in enumerate(blocks):
        f = tmp_path / f"ex{i}.toml"
        f.write_text(text)
        t = Topology.load(f)
        assert verify(t, sources=1, bfs_sources=1).max_hops <= t.plan.hops


def test_docs_slurm_examples_load() -> None:
    blocks = _blocks("slurm")
    assert blocks
    for text in blocks:
        t = Topology.from_slurm(text)
        assert len(t) > 0


def test_docs_python_examples_run() -> None:
    for text in _blocks("python"):
        exec(compile(text, str(DOCS), "exec"), {})


@pytest.mark.slow
def test_docs_figures_are_the_commands(report_1k: tp.Report, report_100k: tp.Report) -> None:
    rows = re.findall(r"^\| (\d[\d,]*) \| (.+) \|$", DOCS.read_text(), re.M)
    table = {int(n.replace(",", "")): [c.strip() for c in rest.split("|")] for n, rest in rows}
    assert {1000, 10_000, 100_000} <= set(table)
    for n, cells in table.items():
        known = {1000: report_1k, 100_000: report_100k}
        rep = known[n] if n in known else verify(Topology.generate(n, leaf=32, pod=1024))
        assert cells == _row(rep), n


def _row(r: tp.Report) -> list[str]:
    return [
        r.scheme,
        f"{r.max_lanes} / {r.mean_lanes:.1f}",
        str(r.max_qps),
        f"{r.max_ring_bytes / (1 << 20):.2f} MiB",
        str(r.hop_bound),
        str(max(r.max_hops, r.bfs_max_distance)),
        str(r.max_hops_one_dead),
    ]


def test_a_one_node_leaf_costs_no_extra_lanes() -> None:
    """33,825 nodes: 1,057 full leaves and one of a single node. That node stands only in
    rail plane 0, so it needs no more lanes than the others and every route stays in 4."""
    t = Topology.generate(33_825, leaf=32, pod=1024)
    last = len(t) - 1
    assert t.leaf_size[-1] == 1 and t.plan.scheme == "rail-mesh"
    assert len(t.neighbours(last)) <= 64
    for s in range(0, len(t), 997):
        for a, b in ((s, last), (last, s)):
            p = t.path(a, b)
            assert len(p) - 1 <= 4
            for u, v in itertools.pairwise(p):
                assert v in t.neighbours(u) and u in t.neighbours(v)
