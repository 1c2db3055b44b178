"""Topology: nested domains (host -> leaf -> pod -> cluster), the links a node holds, routes.

One in-memory model, `Topology`, built three ways:

- generated: ``Topology.generate(nodes=100_000, leaf=32, pod=1024)``;
- from TOML: a ``[topology]`` table (generated keys, or ``[[topology.switch]]`` entries);
- from Slurm's ``topology.conf`` (tree plugin): ``SwitchName=... Switches=... Nodes=...``,
  parsed into `Switch` entries by rdmasched/slurm.py.

Node ids are dense, ``0 .. N-1``, ordered by pod, then leaf, then position in the leaf, so the
nodes of a leaf are contiguous and a node's *rail* is its position in its leaf.

Which peers a node holds a lane (and one RC queue pair) to is the *link plan*, chosen by
`plan()` within a budget of lanes per node (docs/SCALE.md has the designs and the proofs):

- ``rail-mesh``: the leaf, plus the node's rail peers in every other leaf of its plane group
  (groups of leaves inside a pod). One group holds every leaf: 2 hops.
- ``leaf-dragonfly``: the leaf, plus rail-aligned gateway links so that every pair of leaves
  is joined by one link (two where the budget allows, on different nodes): 3 hops.
- ``rail-mesh`` with several groups: inside each rail plane, groups of leaves are meshed and
  every pair of groups is joined by one link (a dragonfly per rail plane): 4 hops.

`Topology.path()` is the deterministic route of a message; `route()` its next hop.
`verify()` computes lanes, QPs and ring memory per node and checks the hop bound.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import re
from array import array
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from rdmasched.errors import ConfigError
from rdmasched.files import read_text, read_toml
from rdmasched.limits import LANE_SLOTS_DEFAULT, MAX_NODES
from rdmasched.slurm import Switch, make_switch, parse_slurm

_T = TypeVar("_T")

#: Targets of issue 8 at 100,000 nodes.
TARGET_LANES = 64
TARGET_QPS = 64
TARGET_RING_BYTES = 8 << 20
TARGET_HOPS = 3

SLOT_BYTES = 64
#: Per inbound lane, beside its slots: the shm lane header (docs/PROTOCOL.md section 9). On
#: verbs the lane's control block is 64 bytes, so this is the larger of the two.
LANE_HEADER_BYTES = 256
#: Slots per lane: the cluster config's default (`cluster.slots_per_lane`).
DEFAULT_SLOTS_PER_LANE: int = LANE_SLOTS_DEFAULT
DEFAULT_BUDGET = TARGET_LANES


# ---- the model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """How links are chosen: the scheme, its parameters and its structural hop bound."""

    scheme: str  # "rail-mesh" or "leaf-dragonfly"
    hops: int  # structural bound on path length, every pair
    degree_bound: int  # lanes per node, at most (from the construction)
    copies: int = 1  # leaf-dragonfly: links per pair of leaves
    group_leaves: int = 0  # rail-mesh: most leaves in a plane group


def check_leaf_pod(leaf: int, pod: int, where: str = "generated topology") -> None:
    """The one rule of a generated topology's switches (`topology`, `demo`, `sim`, the
    [topology] table): leaf and pod >= 1, a pod holding whole leaves. Raises ConfigError."""
    if leaf < 1 or pod < 1:
        raise ConfigError(f"{where}: leaf and pod must be >= 1 (got {leaf}, {pod})")
    if pod % leaf:
        raise ConfigError(
            f"{where}: pod ({pod}) must be a multiple of leaf ({leaf}): a pod holds whole leaves"
        )


class Topology:
    """Nodes in leaves in pods; which node holds lanes to which; how messages travel."""

    def __init__(
        self,
        names: Sequence[str],
        leaves: Sequence[tuple[str, int, int]],
        pods: Sequence[str],
        *,
        budget: int = DEFAULT_BUDGET,
        source: str = "topology",
        plan: Plan | None = None,
    ) -> None:
        """`leaves` lists (name, pod index, size) in node order; `names` are the hosts."""
        if not leaves:
            raise ConfigError(f"{source}: the topology has no nodes")
        if len(names) > MAX_NODES:
            raise ConfigError(f"{source}: at most {MAX_NODES} nodes, not {len(names)}")
        if budget < 1:
            raise ConfigError(f"{source}: the lane budget must be >= 1, not {budget}")
        self.names = tuple(names)
        self.pods = tuple(pods)
        self.leaf_names = tuple(lf[0] for lf in leaves)
        self.leaf_pod = tuple(lf[1] for lf in leaves)
        self.leaf_size = tuple(lf[2] for lf in leaves)
        self.source = source
        self.budget = budget
        starts = []
        total = 0
        for s in self.leaf_size:
            starts.append(total)
            total += s
        if total != len(self.names):
            raise AssertionError("leaf sizes do not add up to the nodes")
        self.leaf_start = tuple(starts)
        node_leaf = array("i")
        for x, s in enumerate(self.leaf_size):
            node_leaf.extend([x] * s)
        self.node_leaf = node_leaf
        self.rails = max(self.leaf_size)
        # leaf-level round robin (circle method)
        g = len(self.leaf_size)
        self._m_leaf = g - 1 if g % 2 == 0 else g
        # plane groups are set by the plan
        self._groups: list[tuple[int, int]] = []
        self._group_of: array[int] = array("i")
        self._m_group = 0
        self.plan = plan if plan is not None else choose_plan(self)
        self._apply(self.plan)
        #: values that are pure functions of this topology and a key (`shared`)
        self._shared: dict[Hashable, Any] = {}

    # ---- constructors --------------------------------------------------------------------
    @classmethod
    def generate(
        cls,
        nodes: int,
        leaf: int = 32,
        pod: int = 1024,
        *,
        budget: int = DEFAULT_BUDGET,
        prefix: str = "n",
    ) -> Topology:
        """`nodes` hosts, `leaf` to a leaf switch, `pod` to a pod (the last ones partial)."""
        where = "generated topology"
        if not 1 <= nodes <= MAX_NODES:
            raise ConfigError(f"{where}: nodes must be in 1..{MAX_NODES}, not {nodes}")
        check_leaf_pod(leaf, pod, where)
        if not re.match(r"^[A-Za-z][A-Za-z0-9_.-]{0,30}$", prefix):
            raise ConfigError(f"{where}: host name prefix {prefix!r} is not valid")
        width = len(str(nodes - 1))
        names = [f"{prefix}{i:0{width}d}" for i in range(nodes)]
        per_pod = pod // leaf
        nleaves = -(-nodes // leaf)
        leaves = [(f"leaf{x}", x // per_pod, min(leaf, nodes - x * leaf)) for x in range(nleaves)]
        pods = [f"pod{p}" for p in range(-(-nleaves // per_pod))]
        return cls(names, leaves, pods, budget=budget, source=where)

    @classmethod
    def from_switches(
        cls, switches: Sequence[Switch], *, budget: int = DEFAULT_BUDGET, source: str = "topology"
    ) -> Topology:
        """Leaves are the switches with nodes; a leaf's pod is its parent switch (a leaf with
        no parent is its own pod). Rejects what Slurm rejects (a switch defined twice, an
        unknown or self child, a cycle, nodes and switches on one switch) and also a node under
        two leaves or a switch under two parents, which Slurm only warns about: here every
        node needs exactly one leaf and one pod."""
        if not switches:
            raise ConfigError(f"{source}: no switches configured")
        by_name: dict[str, Switch] = {}
        for sw in switches:
            if sw.name in by_name:
                raise ConfigError(f"{sw.where or source}: switch {sw.name} is defined twice")
            by_name[sw.name] = sw
        parent: dict[str, str] = {}
        for sw in switches:
            for child in sw.switches:
                if child not in by_name or child == sw.name:
                    raise ConfigError(
                        f"{sw.where or source}: switch {sw.name} has an invalid child "
                        f"({child}): {'itself' if child == sw.name else 'no such switch'}"
                    )
                if child in parent:
                    raise ConfigError(
                        f"{sw.where or source}: switch {child} is under both "
                        f"{parent[child]} and {sw.name}"
                    )
                parent[child] = sw.name
        for sw in switches:  # a cycle: walking up from a switch comes back to it
            seen = {sw.name}
            up = parent.get(sw.name)
            while up is not None:
                if up in seen:
                    raise ConfigError(
                        f"{source}: switch configuration is not a tree: {sw.name} is its own "
                        "ancestor"
                    )
                seen.add(up)
                up = parent.get(up)
        leaf_of: dict[str, str] = {}
        for sw in switches:
            for n in sw.nodes:
                if leaf_of.get(n) == sw.name:
                    raise ConfigError(f"{sw.where or source}: switch {sw.name} lists {n} twice")
                if n in leaf_of:
                    raise ConfigError(
                        f"{sw.where or source}: node {n} is under two leaf switches "
                        f"({leaf_of[n]} and {sw.name})"
                    )
                leaf_of[n] = sw.name
        leaf_switches = [sw for sw in switches if sw.nodes]
        if not leaf_switches:
            raise ConfigError(f"{source}: no switch lists any Nodes")
        pod_names: list[str] = []
        pod_index: dict[str, int] = {}
        order: list[tuple[int, int, Switch]] = []
        for i, sw in enumerate(leaf_switches):
            pod = parent.get(sw.name, sw.name)
            if pod not in pod_index:
                pod_index[pod] = len(pod_names)
                pod_names.append(pod)
            order.append((pod_index[pod], i, sw))
        order.sort(key=lambda t: (t[0], t[1]))
        names: list[str] = []
        leaves: list[tuple[str, int, int]] = []
        for p, _, sw in order:
            names.extend(sw.nodes)
            leaves.append((sw.name, p, len(sw.nodes)))
        return cls(names, leaves, pod_names, budget=budget, source=source)

    @classmethod
    def from_slurm(
        cls, text: str, *, budget: int = DEFAULT_BUDGET, source: str = "topology.conf"
    ) -> Topology:
        return cls.from_switches(parse_slurm(text, source), budget=budget, source=source)

    @classmethod
    def from_toml(
        cls,
        data: Mapping[str, Any],
        *,
        budget: int | None = None,
        source: str = "config",
        base: str | os.PathLike[str] | None = None,
    ) -> Topology:
        """From a parsed TOML document with a ``[topology]`` table (docs/SCALE.md): the
        generated keys, ``[[topology.switch]]`` entries, or ``slurm = "topology.conf"`` (a
        relative path is taken from `base`, the directory of the TOML file)."""
        t = data.get("topology")
        if not isinstance(t, Mapping):
            raise ConfigError(f"{source}: no [topology] table")
        known = {"nodes", "leaf", "pod", "prefix", "budget", "switch", "slurm"}
        if set(t) - known:
            raise ConfigError(f"{source}: unknown [topology] key(s) {sorted(set(t) - known)}")
        b = t.get("budget", DEFAULT_BUDGET) if budget is None else budget
        if not isinstance(b, int) or isinstance(b, bool):
            raise ConfigError(f"{source}: topology.budget must be an integer, not {b!r}")
        generated = {"nodes", "leaf", "pod", "prefix"} & set(t)
        if "slurm" in t:
            others = sorted(set(t) - {"slurm", "budget"})
            if others:
                raise ConfigError(
                    f"{source}: topology.slurm names the whole switch tree; it cannot be "
                    f"combined with topology.{others[0]}"
                )
            path = t["slurm"]
            if not isinstance(path, str) or not path:
                raise ConfigError(
                    f"{source}: topology.slurm must be the path of a topology.conf, not {path!r}"
                )
            p = Path(path)
            if base is not None and not p.is_absolute():
                p = Path(base) / p
            return cls.load_slurm(p, budget=b)
        if "switch" in t:
            if generated:
                raise ConfigError(
                    f"{source}: give [[topology.switch]] entries or generated keys "
                    f"({', '.join(sorted(generated))}), not both"
                )
            raw = t["switch"]
            if not isinstance(raw, list) or not raw:
                raise ConfigError(f"{source}: topology.switch must be a non-empty array of tables")
            switches = []
            for i, s in enumerate(raw):
                where = f"{source}: topology.switch[{i}]"
                if not isinstance(s, Mapping):
                    raise ConfigError(f"{where} must be a table")
                if set(s) - {"name", "nodes", "switches"}:
                    raise ConfigError(
                        f"{where}: unknown key(s) {sorted(set(s) - {'name', 'nodes', 'switches'})}"
                    )
                name = s.get("name")
                if not isinstance(name, str):
                    raise ConfigError(f"{where}.name must be a string")
                lists: list[str | None] = []
                for key in ("nodes", "switches"):
                    v = s.get(key)
                    if v is None:
                        lists.append(None)
                    elif isinstance(v, str):
                        lists.append(v)
                    elif isinstance(v, list) and all(isinstance(e, str) for e in v):
                        lists.append(",".join(v))
                    else:
                        raise ConfigError(
                            f"{where}.{key} must be a hostlist string or a list of strings"
                        )
                switches.append(make_switch(name, lists[0], lists[1], where))
            return cls.from_switches(switches, budget=b, source=source)
        for key in ("nodes", "leaf", "pod"):
            if key not in t:
                raise ConfigError(
                    f"{source}: topology.{key} is missing (give nodes, leaf and pod, "
                    "or [[topology.switch]] entries)"
                )
            v = t[key]
            if not isinstance(v, int) or isinstance(v, bool):
                raise ConfigError(f"{source}: topology.{key} must be an integer, not {v!r}")
            top = MAX_NODES if key == "nodes" else 1 << 24
            if not 1 <= v <= top:
                raise ConfigError(f"{source}: topology.{key} must be in 1..{top}, not {v}")
        prefix = t.get("prefix", "n")
        if not isinstance(prefix, str):
            raise ConfigError(f"{source}: topology.prefix must be a string")
        return cls.generate(t["nodes"], t["leaf"], t["pod"], budget=b, prefix=prefix)

    @classmethod
    def load(cls, path: str | Path, *, budget: int | None = None) -> Topology:
        """A TOML file with a [topology] table."""
        p = Path(path)
        data = read_toml(p, "topology file")
        return cls.from_toml(data, budget=budget, source=str(p), base=p.parent)

    @classmethod
    def load_slurm(cls, path: str | Path, *, budget: int = DEFAULT_BUDGET) -> Topology:
        p = Path(path)
        text = read_text(p, "topology file", "a topology.conf")
        return cls.from_slurm(text, budget=budget, source=str(p))

    # ---- shape -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.names)

    def leaf(self, node: int) -> int:
        return self.node_leaf[node]

    def pod(self, node: int) -> int:
        return self.leaf_pod[self.node_leaf[node]]

    def rail(self, node: int) -> int:
        return node - self.leaf_start[self.node_leaf[node]]

    def domain(self, node: int) -> str:
        """``pod/leaf`` of a node, as the cluster config's `domain` names it (one string per
        leaf, shared by every caller: a core holds one per link)."""
        names = self._shared.get("domains")
        if names is None:
            names = self._shared["domains"] = tuple(
                f"{self.pods[p]}/{leaf}"
                for leaf, p in zip(self.leaf_names, self.leaf_pod, strict=True)
            )
        return cast(str, names[self.node_leaf[node]])

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise ConfigError(f"{self.source}: no node {name!r}") from None

    def shared(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """The value for `key`, made by `make()` on first use and kept with the topology.
        For what is a pure function of the topology and `key` (a sync group's tree layout,
        rdmasched/daemon/sync.py): every node core of a process that holds this topology
        gets the same object, so a simulator of N cores builds it once, not N times."""
        try:
            return cast(_T, self._shared[key])
        except KeyError:
            got = self._shared[key] = make()
            return got

    # ---- the plan's arithmetic ----------------------------------------------------------
    def _apply(self, plan: Plan) -> None:
        self._groups = []
        self._group_min: list[int] = []
        self._present_cache: dict[tuple[int, int], list[int]] = {}
        self._group_of = array("i", [0] * len(self.leaf_size))
        if plan.scheme != "rail-mesh":
            return
        x = 0
        for size in _rail_mesh_groups(self, plan.group_leaves):
            for y in range(x, x + size):
                self._group_of[y] = len(self._groups)
            self._groups.append((x, size))
            self._group_min.append(min(self.leaf_size[x : x + size]))
            x += size
        ng = len(self._groups)
        self._m_group = ng - 1 if ng % 2 == 0 else ng

    def _present(self, u: int, r: int) -> Sequence[int]:
        """The leaves of plane group u that have a node on rail r (so are in plane r)."""
        start, size = self._groups[u]
        if r < self._group_min[u]:
            return range(start, start + size)
        key = (u, r)
        got = self._present_cache.get(key)
        if got is None:
            got = [y for y in range(start, start + size) if self.leaf_size[y] > r]
            self._present_cache[key] = got
        return got

    @staticmethod
    def _partner(x: int, k: int, m: int) -> int:
        """Round k of a round robin over m+1 players (m odd): x's opponent (m may be a bye)."""
        if x == m:
            return k
        if x == k:
            return m
        return (2 * k - x) % m

    @staticmethod
    def _round(x: int, y: int, m: int) -> int:
        if x == m:
            return y
        if y == m:
            return x
        return (x + y) * ((m + 1) // 2) % m

    # ---- a node's neighbours: the peers it is linked to ---------------------------------
    def neighbours(self, node: int) -> list[int]:
        """The peers this node holds a lane and an RC QP to (its links' other ends), sorted;
        symmetric: v is u's neighbour iff u is v's."""
        x = self.node_leaf[node]
        start, n = self.leaf_start[x], self.leaf_size[x]
        p = node - start
        out = set(range(start, start + n))
        if self.plan.scheme == "leaf-dragonfly":
            m = self._m_leaf
            g = len(self.leaf_size)
            for c in range(self.plan.copies):
                off = c * (n // 2)
                k = (p - off) % n
                while k < m:
                    y = self._partner(x, k, m)
                    if y < g:
                        out.add(
                            self.leaf_start[y]
                            + (k + c * (self.leaf_size[y] // 2)) % self.leaf_size[y]
                        )
                    k += n
        else:
            # rail plane p: my rail peers in the leaves of my plane group, and the plane's
            # links to other groups that fall on my leaf
            u = self._group_of[x]
            mine = self._present(u, p)
            for y in mine:
                out.add(self.leaf_start[y] + p)
            m = self._m_group
            ng = len(self._groups)
            size = len(mine)
            k = (mine.index(x) - p) % size
            while k < m:
                v = self._partner(u, k, m)
                if v < ng:
                    theirs = self._present(v, p)
                    if theirs:
                        out.add(self.leaf_start[theirs[(k + p) % len(theirs)]] + p)
                k += size
        out.discard(node)
        return sorted(out)

    # ---- routes --------------------------------------------------------------------------
    def _plane_path(self, x: int, y: int, r: int) -> list[int]:
        """Leaves x -> y inside rail plane r, as nodes (rail-mesh plans)."""
        u, v = self._group_of[x], self._group_of[y]
        if u == v:
            return [self.leaf_start[x] + r, self.leaf_start[y] + r]
        k = self._round(u, v, self._m_group)
        pu, pv = self._present(u, r), self._present(v, r)
        gx, gy = pu[(k + r) % len(pu)], pv[(k + r) % len(pv)]
        return [self.leaf_start[z] + r for z in (x, gx, gy, y)]

    def candidates(self, src: int, dst: int) -> Iterator[list[int]]:
        """Paths src -> dst, in the order a sender prefers them; the first is `path()`."""
        if src == dst:
            yield [src]
            return
        x, y = self.node_leaf[src], self.node_leaf[dst]
        if x == y:
            yield [src, dst]
            return
        if self.plan.scheme == "leaf-dragonfly":
            m = self._m_leaf
            xs, xn = self.leaf_start[x], self.leaf_size[x]
            ys, yn = self.leaf_start[y], self.leaf_size[y]
            k = self._round(x, y, m)
            for c in range(self.plan.copies):
                gx = xs + (k + c * (xn // 2)) % xn
                gy = ys + (k + c * (yn // 2)) % yn
                yield _join([src, gx, gy, dst])
            g = len(self.leaf_size)
            for j in range(1, g):  # through a third leaf, nearest index first
                z = (x + j) % g
                if z == y:
                    continue
                k1, k2 = self._round(x, z, m), self._round(z, y, m)
                zs, zn = self.leaf_start[z], self.leaf_size[z]
                yield _join([src, xs + k1 % xn, zs + k1 % zn, zs + k2 % zn, ys + k2 % yn, dst])
            return
        # plane p if the destination's leaf has rail p, plane q if mine has rail q: one of
        # the two always holds (p < n_x, q < n_y; p >= n_y and q >= n_x would need
        # n_y <= p < n_x <= q < n_y). Then the other planes both leaves share.
        p, q = src - self.leaf_start[x], dst - self.leaf_start[y]
        both = min(self.leaf_size[x], self.leaf_size[y])
        planes = [r for r in (p, q) if r < both]
        if p == q:
            planes = planes[:1]
        planes += [r for r in range(both) if r not in (p, q)]
        for r in planes:
            yield _join([src, *self._plane_path(x, y, r), dst])

    def path(self, src: int, dst: int, dead: Iterable[int] = ()) -> list[int]:
        """The route of a message src -> dst: the first candidate with no dead relay."""
        dead = frozenset(dead)
        if not dead:
            return next(self.candidates(src, dst))
        for c in self.candidates(src, dst):
            if not dead.intersection(c[1:-1]):
                return c
        raise ConfigError(f"no route from node {src} to node {dst} avoiding {sorted(dead)}")

    def route(self, src: int, dst: int) -> int:
        """The next node for a message from src to dst (deterministic: order per pair)."""
        return self.path(src, dst)[1] if src != dst else dst

    def next_hop(self, at: int, src: int, dst: int, choice: int = 0) -> int:
        """At relay `at`, the next node of candidate path `choice` from src to dst."""
        for i, c in enumerate(self.candidates(src, dst)):
            if i == choice:
                j = c.index(at)
                return c[j + 1]
        raise ConfigError(f"no candidate path {choice} from {src} to {dst}")


def _join(nodes: list[int]) -> list[int]:
    out = [nodes[0]]
    for v in nodes[1:]:
        if v != out[-1]:
            out.append(v)
    return out


# ---- choosing a plan -------------------------------------------------------------------------
def _dragonfly_bound(topo: Topology, copies: int) -> int:
    g = len(topo.leaf_size)
    if g == 1:
        return topo.leaf_size[0] - 1
    m = g - 1 if g % 2 == 0 else g
    return max(n - 1 + copies * -(-m // n) for n in set(topo.leaf_size))


def _rail_mesh_groups(topo: Topology, s: int) -> list[int]:
    """Sizes of the plane groups for at most s leaves a group, in leaf order."""
    sizes: list[int] = []
    g = len(topo.leaf_size)
    x = 0
    while x < g:
        p = topo.leaf_pod[x]
        end = x
        while end < g and topo.leaf_pod[end] == p:
            end += 1
        n = end - x
        k = -(-n // s)
        q, rem = divmod(n, k)
        sizes.extend(q + (1 if j < rem else 0) for j in range(k))
        x = end
    return sizes


def _rail_mesh_bound(topo: Topology, s: int) -> tuple[int, int]:
    """(degree bound, number of groups) of a rail-mesh plan with groups of <= s leaves."""
    sizes = _rail_mesh_groups(topo, s)
    ng = len(sizes)
    m = 0 if ng == 1 else (ng - 1 if ng % 2 == 0 else ng)
    worst = 0
    x = 0
    for size in sizes:
        leaves = sorted(topo.leaf_size[x : x + size])
        # plane r holds the leaves with more than r nodes; they share the group's m links
        for r in range(leaves[-1]):
            present = sum(1 for n in leaves if n > r)
            worst = max(worst, leaves[-1] - 1 + present - 1 + -(-m // present))
        x += size
    return worst, ng


def choose_plan(topo: Topology) -> Plan:
    """The plan with the fewest hops whose lanes per node fit the budget.

    Among equal hops: two links per pair of leaves before one (a dead gateway then costs no
    extra hop), then the fewest lanes."""
    options: list[tuple[int, int, int, Plan]] = []
    most_leaves = max(Counter(topo.leaf_pod).values())
    for s in range(1, most_leaves + 1):
        bound, ng = _rail_mesh_bound(topo, s)
        hops = 2 if ng == 1 else 4
        if len(topo.leaf_size) == 1:
            hops = 1
        biggest = max(_rail_mesh_groups(topo, s))
        options.append((hops, 1, bound, Plan("rail-mesh", hops, bound, group_leaves=biggest)))
    for copies in (2, 1):
        bound = _dragonfly_bound(topo, copies)
        hops = 3 if len(topo.leaf_size) > 1 else 1
        options.append((hops, -copies, bound, Plan("leaf-dragonfly", hops, bound, copies=copies)))
    fits = [o for o in options if o[2] <= topo.budget]
    if not fits:
        least = min(options, key=lambda o: o[2])
        raise ConfigError(
            f"{topo.source}: no link plan fits {topo.budget} lanes per node; the smallest needs "
            f"{least[2]} ({least[3].scheme}; largest leaf {topo.rails} nodes)"
        )
    fits.sort(key=lambda o: (o[0], o[1], o[2], -o[3].group_leaves))
    return fits[0][3]


# ---- verification ----------------------------------------------------------------------------
@dataclass
class Report:
    nodes: int
    leaves: int
    pods: int
    largest_leaf: int
    scheme: str
    copies: int
    group_leaves: int
    budget: int
    slots_per_lane: int
    lane_bytes: int
    max_lanes: int
    mean_lanes: float
    min_lanes: int
    max_qps: int
    mean_qps: float
    max_ring_bytes: int
    mean_ring_bytes: float
    hop_bound: int
    max_hops: int
    max_hops_one_dead: int
    no_alternative: int
    paths_checked: int
    path_check: str
    bfs_sources: int
    bfs_max_distance: int
    symmetric_checked: int

    def targets(self) -> dict[str, bool]:
        return {
            f"lanes <= {TARGET_LANES}": self.max_lanes <= TARGET_LANES,
            f"QPs <= {TARGET_QPS}": self.max_qps <= TARGET_QPS,
            f"ring memory <= {TARGET_RING_BYTES >> 20} MiB": self.max_ring_bytes
            <= TARGET_RING_BYTES,
            f"hops <= {TARGET_HOPS}": max(self.max_hops, self.bfs_max_distance) <= TARGET_HOPS,
        }

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["targets"] = self.targets()
        return d


def verify(
    topo: Topology,
    *,
    slots_per_lane: int = DEFAULT_SLOTS_PER_LANE,
    exhaustive_limit: int = 2048,
    sources: int = 4,
    bfs_sources: int = 2,
    seed: int = 1,
) -> Report:
    """Lanes, QPs and ring memory per node from `neighbours()`; the hop bound checked on routes.

    Up to `exhaustive_limit` nodes every (src, dst) path is followed and every one of its hops
    checked to be a link; above it, every destination from `sources` sampled sources. BFS over
    the links from `bfs_sources` sampled sources confirms the graph distance. Raises
    AssertionError when a link is not symmetric or a path breaks the structural bound."""
    n = len(topo)
    adj: list[array[int]] = []
    total = 0
    lo, hi = n, 0
    for u in range(n):
        row = array("i", topo.neighbours(u))
        adj.append(row)
        total += len(row)
        lo, hi = min(lo, len(row)), max(hi, len(row))
    rng = random.Random(seed)
    # symmetry: every node up to the limit, else a sample; sets for the membership tests
    sym_nodes = range(n) if n <= 4 * exhaustive_limit else rng.sample(range(n), 2000)
    checked = 0
    for u in sym_nodes:
        for v in adj[u]:
            if u not in adj[v]:
                raise AssertionError(f"link {u} -> {v} has no link {v} -> {u}")
        checked += 1
    if n <= exhaustive_limit:
        srcs: Sequence[int] = range(n)
        mode = "all pairs"
    else:
        srcs = sorted(rng.sample(range(n), min(sources, n)))
        mode = f"{len(srcs)} sampled sources x all destinations"
    max_hops = 0
    max_dead = 0
    no_alternative = 0
    paths = 0
    linkset = [frozenset(a) for a in adj] if n <= exhaustive_limit else None
    for s in srcs:
        for d in range(n):
            p = topo.path(s, d)
            hops = len(p) - 1
            for a, b in itertools.pairwise(p):
                if b not in (linkset[a] if linkset is not None else adj[a]):
                    raise AssertionError(f"path {p} from {s} to {d}: {a} holds no lane to {b}")
            if hops > topo.plan.hops:
                raise AssertionError(f"path {p} has {hops} hops, over the bound {topo.plan.hops}")
            max_hops = max(max_hops, hops)
            paths += 1
            if hops >= 2 and (d - s) % 7 == 0:  # one dead relay, on a sample of the pairs
                try:
                    alt = topo.path(s, d, dead=(p[1],))
                except ConfigError:
                    no_alternative += 1
                    continue
                for a, b in itertools.pairwise(alt):
                    if b not in adj[a]:
                        raise AssertionError(f"alternative path {alt}: {a} holds no lane to {b}")
                max_dead = max(max_dead, len(alt) - 1)
    bfs_max = 0
    bsrcs = rng.sample(range(n), min(bfs_sources, n))
    for s in bsrcs:
        bfs_max = max(bfs_max, _eccentricity(adj, s))
    lane_bytes = slots_per_lane * SLOT_BYTES + LANE_HEADER_BYTES
    return Report(
        nodes=n,
        leaves=len(topo.leaf_size),
        pods=len(topo.pods),
        largest_leaf=topo.rails,
        scheme=topo.plan.scheme,
        copies=topo.plan.copies,
        group_leaves=topo.plan.group_leaves,
        budget=topo.budget,
        slots_per_lane=slots_per_lane,
        lane_bytes=lane_bytes,
        max_lanes=hi,
        mean_lanes=total / n,
        min_lanes=lo,
        max_qps=hi,
        mean_qps=total / n,
        max_ring_bytes=hi * lane_bytes,
        mean_ring_bytes=total / n * lane_bytes,
        hop_bound=topo.plan.hops,
        max_hops=max_hops,
        max_hops_one_dead=max_dead,
        no_alternative=no_alternative,
        paths_checked=paths,
        path_check=mode,
        bfs_sources=len(bsrcs),
        bfs_max_distance=bfs_max,
        symmetric_checked=checked,
    )


def _eccentricity(adj: Sequence[array[int]], src: int) -> int:
    """Largest BFS distance from src (raises if some node is unreachable)."""
    n = len(adj)
    seen = bytearray(n)
    seen[src] = 1
    frontier = [src]
    depth = 0
    reached = 1
    while frontier:
        nxt = []
        for u in frontier:
            for v in adj[u]:
                if not seen[v]:
                    seen[v] = 1
                    nxt.append(v)
        if not nxt:
            break
        reached += len(nxt)
        depth += 1
        frontier = nxt
    if reached != n:
        raise AssertionError(f"BFS from {src} reaches {reached} of {n} nodes")
    return depth
