"""The cluster config: which nodes exist, where, with how many execution slots, in which
topology domain, over which transport.

From a TOML file (every key, its type, default and meaning: docs/CONFIG.md)::

    [cluster]
    name = "train7"          # names this cluster's lanes; letters, digits, '_', '.', '-'
    transport = "shm"        # or "verbs"
    slots_per_lane = 256     # lane size, a power of two
    token = "s3cret-t0ken"   # shared secret for the bootstrap (verbs), >= 8 bytes; or token_file
    heartbeat_ms = 50        # how often a node tells its peers it is alive
    dead_after_ms = 500      # a peer silent this long is declared dead

    [[node]]
    name = "gpu-a"
    address = "10.0.0.1:7400"   # bootstrap address (verbs), one per node; ignored on shm
    slots = 8                   # execution slots (GPUs)
    domain = "rack1/sw1"        # topology: rack/switch, used to prefer near peers

    [topology]                  # optional: which nodes hold lanes to which (docs/SCALE.md)
    slurm = "topology.conf"     # or nodes/leaf/pod (generated), or [[topology.switch]]

    [verbs]                     # optional: the class of every verbs lane (docs/VERBS.md)
    service_level = 6           # InfiniBand SL 0..15 (RoCE: the VLAN priority)
    dscp = 48                   # RoCE v2: DSCP 0..63 of every packet (48: CS6)

or from the launcher's environment (torchrun, Slurm): RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT (or SLURM_PROCID / SLURM_NTASKS), plus RDMASCHED_SLOTS, RDMASCHED_CLUSTER,
RDMASCHED_TRANSPORT, RDMASCHED_TOKEN and RDMASCHED_DOMAIN. Every problem is a ConfigError
that says which key (or file) and why.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rdmasched.errors import ConfigError
from rdmasched.files import read_text, read_toml
from rdmasched.limits import (
    DSCP_DEFAULT,
    EXEC_SLOTS_MAX,
    LANE_SLOTS_DEFAULT,
    MAX_SPIN_US,
    SERVICE_LEVEL_DEFAULT,
    SLICE_US_MAX,
    SLICE_US_MIN,
    check_lane_slots,
    check_preemption,
    check_traffic_class,
)
from rdmasched.limits import MAX_NODES as MAX_NODES  # (named here too: older callers)
from rdmasched.topology import Topology

TRANSPORTS = ("shm", "verbs")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
MIN_TOKEN_BYTES = 8
#: the keys a config may have (docs/CONFIG.md describes each)
CLUSTER_KEYS = frozenset(
    (
        "name",
        "transport",
        "slots_per_lane",
        "token",
        "token_file",
        "heartbeat_ms",
        "dead_after_ms",
        "slots",
    )
)
NODE_KEYS = frozenset(("name", "address", "slots", "domain"))
#: the [preemption] table's keys: the scheduler's no-thrash settings (docs/PREEMPTION.md)
PREEMPTION_KEYS = frozenset(
    ("quantum_us", "task_budget", "job_budget", "job_window_us", "critical_priority")
)
#: the `[verbs]` keys: the class of service of every verbs lane (docs/VERBS.md)
VERBS_KEYS = frozenset(("service_level", "dscp"))


@dataclass(frozen=True)
class NodeSpec:
    id: int
    name: str
    slots: int
    domain: str = ""
    address: str = ""


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    nodes: tuple[NodeSpec, ...]
    transport: str = "shm"
    slots_per_lane: int = LANE_SLOTS_DEFAULT
    token: str = ""
    heartbeat_ms: int = 50
    dead_after_ms: int = 500
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: the `[topology]`: which nodes hold lanes to which, and the routes between the others.
    #: None: every node holds a lane to every other (a full mesh, for small clusters)
    topology: Topology | None = None
    #: the `[preemption]` table: the keys it gives (PREEMPTION_KEYS), for the scheduler
    preemption: Mapping[str, Any] = field(default_factory=dict)
    #: `[verbs]`: every verbs lane's QP sends with this InfiniBand service level and, on
    #: RoCE v2, this DSCP (one class for all of rdmasched's lanes; ignored on shm)
    service_level: int = SERVICE_LEVEL_DEFAULT
    dscp: int = DSCP_DEFAULT

    def node(self, key: int | str) -> NodeSpec:
        """A node by id or by name."""
        if isinstance(key, int) and 0 <= key < len(self.nodes) and self.nodes[key].id == key:
            return self.nodes[key]  # ids are positions in `nodes` (as loaded)
        got = self._by_name.get(key) if isinstance(key, str) else None
        if got is None and not isinstance(key, str):  # a NodeSpec list built by hand
            got = next((n for n in self.nodes if n.id == key), None)
        if got is not None:
            return got
        shown = ", ".join(n.name for n in self.nodes[:8])
        more = f" and {len(self.nodes) - 8} more" if len(self.nodes) > 8 else ""
        raise ConfigError(f"cluster {self.name!r} has no node {key!r}; nodes: {shown}{more}")

    @functools.cached_property
    def _by_name(self) -> dict[str, NodeSpec]:
        return {n.name: n for n in self.nodes}

    @property
    def domains(self) -> dict[int, str]:
        return {n.id: n.domain for n in self.nodes}

    # ---- loading ------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ClusterConfig:
        p = Path(path)
        data = read_toml(p, "cluster config")
        return cls.from_dict(data, source=str(p), base=p.parent)

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        source: str = "config",
        base: str | os.PathLike[str] | None = None,
    ) -> ClusterConfig:
        """`base`: the directory a relative `topology.slurm` path is taken from (the config
        file's; None: the working directory)."""
        unknown = set(data) - {"cluster", "node", "topology", "preemption", "verbs"}
        if unknown:
            raise ConfigError(
                f"{source}: unknown top-level key(s) {sorted(unknown)}; "
                "expected [cluster], [[node]], [topology], [preemption] and [verbs]"
            )
        preemption = _preemption(data.get("preemption", {}), source)
        c = data.get("cluster", {})
        if not isinstance(c, Mapping):
            raise ConfigError(f"{source}: [cluster] must be a table")
        if set(c) - CLUSTER_KEYS:
            raise ConfigError(f"{source}: unknown [cluster] key(s) {sorted(set(c) - CLUSTER_KEYS)}")
        name = _str(c, "name", source, "cluster.name", default="rdmasched")
        if not _NAME.match(name):
            raise ConfigError(f"{source}: cluster.name {name!r} must match {_NAME.pattern}")
        transport = _str(c, "transport", source, "cluster.transport", default="shm")
        if transport not in TRANSPORTS:
            raise ConfigError(
                f"{source}: cluster.transport must be one of {TRANSPORTS}, not {transport!r}"
            )
        lane = _int(
            c, "slots_per_lane", source, "cluster.slots_per_lane", default=LANE_SLOTS_DEFAULT
        )
        try:
            check_lane_slots(lane)
        except ValueError as exc:
            raise ConfigError(f"{source}: cluster.slots_per_lane {exc}") from None
        token = _str(c, "token", source, "cluster.token", default="")
        if "token_file" in c:
            if token:
                raise ConfigError(f"{source}: give cluster.token or cluster.token_file, not both")
            tf = Path(_str(c, "token_file", source, "cluster.token_file"))
            token = read_text(tf, f"{source}: cluster.token_file", "a token file").strip()
        if token and len(token.encode()) < MIN_TOKEN_BYTES:
            raise ConfigError(
                f"{source}: the cluster token must be at least {MIN_TOKEN_BYTES} bytes, not "
                f"{len(token.encode())}: it is the only secret between the nodes"
            )
        if transport == "verbs" and not token:
            raise ConfigError(
                f"{source}: the verbs transport needs cluster.token (or "
                "token_file): the bootstrap authenticates peers with it"
            )
        hb = _int(c, "heartbeat_ms", source, "cluster.heartbeat_ms", default=50)
        dead = _int(c, "dead_after_ms", source, "cluster.dead_after_ms", default=500)
        try:
            check_liveness(hb, dead)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None

        topology = None
        if "topology" in data:
            if not isinstance(data["topology"], Mapping):
                raise ConfigError(f"{source}: [topology] must be a table")
            topology = Topology.from_toml(data, source=source, base=base)
        node_slots: int | None = None
        if "slots" in c:
            node_slots = _int(c, "slots", source, "cluster.slots")
            if not 1 <= node_slots <= EXEC_SLOTS_MAX:
                raise ConfigError(
                    f"{source}: cluster.slots must be 1..{EXEC_SLOTS_MAX}, not {node_slots}"
                )
        raw_nodes = data.get("node")
        if raw_nodes is None and topology is not None:
            if transport == "verbs":
                raise ConfigError(
                    f"{source}: the verbs transport needs every node's address: list the "
                    "nodes as [[node]] tables (name, address, slots)"
                )
            if "slots" not in c:
                raise ConfigError(
                    f"{source}: cluster.slots is missing: with a [topology] and no [[node]] "
                    "tables every host of the topology is a node with cluster.slots slots"
                )
            raw_nodes = [{"name": name, "slots": c["slots"]} for name in topology.names]
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise ConfigError(f"{source}: at least one [[node]] is needed")
        if len(raw_nodes) > MAX_NODES:
            raise ConfigError(f"{source}: at most {MAX_NODES} nodes, not {len(raw_nodes)}")
        nodes = []
        seen: set[str] = set()
        addresses: dict[tuple[str, int], str] = {}
        for i, n in enumerate(raw_nodes):
            where = f"node[{i}]"
            if not isinstance(n, Mapping):
                raise ConfigError(f"{source}: {where} must be a table")
            extra = set(n) - NODE_KEYS
            if extra:
                raise ConfigError(f"{source}: {where}: unknown key(s) {sorted(extra)}")
            nname = _str(n, "name", source, f"{where}.name")
            if not _NAME.match(nname):
                raise ConfigError(f"{source}: {where}.name {nname!r} must match {_NAME.pattern}")
            if nname in seen:
                raise ConfigError(f"{source}: node name {nname!r} appears twice")
            seen.add(nname)
            slots = _int(n, "slots", source, f"{where}.slots", default=node_slots)
            if not 1 <= slots <= EXEC_SLOTS_MAX:
                raise ConfigError(
                    f"{source}: {where}.slots must be 1..{EXEC_SLOTS_MAX}, not {slots}"
                )
            address = _str(n, "address", source, f"{where}.address", default="")
            if transport == "verbs":
                host, port = parse_address(address, f"{source}: {where}.address")
                other = addresses.setdefault((host.lower(), port), where)
                if other != where:
                    raise ConfigError(
                        f"{source}: {where}.address {address!r} is also {other}'s: every "
                        "verbs node listens at its own host:port"
                    )
            domain = _str(n, "domain", source, f"{where}.domain", default="")
            nodes.append(NodeSpec(i, nname, slots, domain, address))
        if topology is not None:
            nodes = _topology_order(nodes, topology, source)
        sl, dscp = _verbs_class(data.get("verbs", {}), source)
        return cls(
            name,
            tuple(nodes),
            transport,
            lane,
            token,
            hb,
            dead,
            topology=topology,
            preemption=preemption,
            service_level=sl,
            dscp=dscp,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> tuple[ClusterConfig, int]:
        """The cluster and this node's id from a launcher's variables (torchrun, Slurm)."""
        env = os.environ if env is None else env
        rank_s = env.get("RANK", env.get("SLURM_PROCID"))
        world_s = env.get("WORLD_SIZE", env.get("SLURM_NTASKS"))
        if rank_s is None or world_s is None:
            raise ConfigError(
                "the environment names no rank: set RANK and WORLD_SIZE "
                "(torchrun) or SLURM_PROCID and SLURM_NTASKS (srun)"
            )
        try:
            rank, world = int(rank_s), int(world_s)
        except ValueError:
            raise ConfigError(
                f"RANK={rank_s!r} and WORLD_SIZE={world_s!r} must be integers"
            ) from None
        if not (0 <= rank < world <= MAX_NODES):
            raise ConfigError(
                f"need 0 <= RANK < WORLD_SIZE <= {MAX_NODES} (RANK={rank}, WORLD_SIZE={world})"
            )
        master = env.get("MASTER_ADDR", "127.0.0.1")
        port = env_int(env, "MASTER_PORT", 29500) + 100
        slots = (
            env_int(env, "RDMASCHED_SLOTS")
            if env.get("RDMASCHED_SLOTS")
            else env_int(env, "LOCAL_WORLD_SIZE", 1)
        )
        transport = env.get("RDMASCHED_TRANSPORT", "shm")
        data: dict[str, Any] = {
            "cluster": {
                "name": env.get("RDMASCHED_CLUSTER", f"job{env.get('SLURM_JOB_ID', 'local')}"),
                "transport": transport,
                "token": env_token(env, transport, "environment"),
            },
            "node": [
                {
                    "name": f"rank{r}",
                    "slots": slots,
                    "domain": env.get("RDMASCHED_DOMAIN", ""),
                    # Only the master's address is known to every rank; other ranks register
                    # theirs through it (verbs bootstrap).
                    "address": f"{master}:{port + r}",
                }
                for r in range(world)
            ],
        }
        return cls.from_dict(data, source="environment"), rank


def _topology_order(nodes: list[NodeSpec], topology: Topology, source: str) -> list[NodeSpec]:
    """The nodes renumbered as the topology numbers its hosts (pod, leaf, position in the
    leaf), each in its topology domain ``pod/leaf``. The [[node]] tables and the topology
    must name the same hosts."""
    index = {h: i for i, h in enumerate(topology.names)}
    extra = [n for n in nodes if n.name not in index]
    if extra:
        raise ConfigError(
            f"{source}: node[{extra[0].id}] {extra[0].name!r} is not a host of the [topology] "
            f"({topology.source}); every [[node]] must be one of its hosts"
        )
    if len(nodes) != len(topology):
        have = {n.name for n in nodes}
        missing = [h for h in topology.names if h not in have]
        raise ConfigError(
            f"{source}: the [topology] has {len(topology)} hosts and there are {len(nodes)} "
            f"[[node]] tables; no [[node]] for {', '.join(missing[:3])}"
            + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        )
    by_name = {n.name: n for n in nodes}
    out = []
    for i, host in enumerate(topology.names):
        n = by_name[host]  # the same number of distinct names, none outside the topology
        domain = topology.domain(i)
        if n.domain and n.domain != domain:
            raise ConfigError(
                f"{source}: node[{n.id}].domain is {n.domain!r}, but the [topology] puts "
                f"{host} in {domain!r}; leave domain out when a [topology] is given"
            )
        out.append(NodeSpec(i, n.name, n.slots, domain, n.address))
    return out


def _verbs_class(v: object, source: str) -> tuple[int, int]:
    """The `[verbs]` table: (service_level, dscp), each checked (limits.check_traffic_class)."""
    if not isinstance(v, Mapping):
        raise ConfigError(f"{source}: [verbs] must be a table")
    if set(v) - VERBS_KEYS:
        raise ConfigError(
            f"{source}: unknown [verbs] key(s) {sorted(set(v) - VERBS_KEYS)}; "
            f"expected {sorted(VERBS_KEYS)}"
        )
    sl = v.get("service_level", SERVICE_LEVEL_DEFAULT)
    dscp = v.get("dscp", DSCP_DEFAULT)
    try:
        check_traffic_class(sl, dscp)
    except ValueError as exc:
        raise ConfigError(f"{source}: verbs.{exc}") from None
    return sl, dscp


def check_liveness(heartbeat_ms: int, dead_after_ms: int) -> None:
    """The one liveness rule ([cluster], `demo`, `sim`): a heartbeat period > 0 and a peer
    declared dead only after more than two periods of silence. Raises ValueError."""
    if heartbeat_ms <= 0 or dead_after_ms <= 2 * heartbeat_ms:
        raise ValueError(
            "need heartbeat_ms > 0 and dead_after_ms > 2 * heartbeat_ms "
            f"(got {heartbeat_ms} and {dead_after_ms})"
        )


def env_token(env: Mapping[str, str], transport: str, source: str) -> str:
    """RDMASCHED_TOKEN, the cluster token of a cluster made from the environment; the verbs
    transport needs one, and the error names the variable (not cluster.token)."""
    token = env.get("RDMASCHED_TOKEN", "")
    if transport == "verbs" and not token:
        raise ConfigError(
            f"{source}: the verbs transport needs RDMASCHED_TOKEN (the cluster token, at "
            f"least {MIN_TOKEN_BYTES} bytes): the bootstrap authenticates peers with it"
        )
    return token


#: the launcher's integer variables (torchrun, Slurm, RDMASCHED_*) and their bounds, lo..hi
#: (None: no upper bound); launch.py and ClusterConfig.from_env read them through `env_int`
ENV_BOUNDS: dict[str, tuple[int, int | None]] = {
    "GROUP_RANK": (0, MAX_NODES - 1),
    "NODE_RANK": (0, MAX_NODES - 1),
    "GROUP_WORLD_SIZE": (1, MAX_NODES),
    "WORLD_SIZE": (1, None),
    "LOCAL_WORLD_SIZE": (1, EXEC_SLOTS_MAX),
    "LOCAL_RANK": (0, None),
    "MASTER_PORT": (1, 65535),
    "SLURM_NODEID": (0, MAX_NODES - 1),
    "SLURM_LOCALID": (0, None),
    "RDMASCHED_SLOTS": (1, EXEC_SLOTS_MAX),
    "RDMASCHED_PORT": (1, 65535),
    "RDMASCHED_HEARTBEAT_MS": (1, None),
    "RDMASCHED_DEAD_AFTER_MS": (1, None),
    "RDMASCHED_STORE_TIMEOUT_S": (1, 86_400),
    "RDMASCHED_SPIN_US": (0, MAX_SPIN_US),
    "RDMASCHED_SLICE_US": (SLICE_US_MIN, SLICE_US_MAX),
}


def env_int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    """The integer variable `key` of `env`, in its ENV_BOUNDS (`default` when unset or
    empty; None: required); anything else is one line naming the variable."""
    value = env.get(key, "")
    if value == "":
        if default is None:
            raise ConfigError(f"{key} is not set")
        return default
    lo, hi = ENV_BOUNDS.get(key, (0, None))
    try:
        n: int | None = int(value)
    except ValueError:
        n = None
    if n is None or n < lo or (hi is not None and n > hi):
        bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{key}={value!r} must be an integer {bound}")
    return n


def parse_address(address: str, where: str) -> tuple[str, int]:
    host, sep, port_s = address.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{where} must be host:port, not {address!r}")
    try:
        port = int(port_s)
    except ValueError:
        raise ConfigError(f"{where}: port {port_s!r} is not a number") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{where}: port {port} is out of range")
    return host.strip("[]"), port


def _str(
    d: Mapping[str, Any], key: str, source: str, label: str, default: str | None = None
) -> str:
    if key not in d:
        if default is None:
            raise ConfigError(f"{source}: {label} is missing")
        return default
    v = d[key]
    if not isinstance(v, str):
        raise ConfigError(f"{source}: {label} must be a string, not {type(v).__name__}")
    return v


def _preemption(p: object, source: str) -> dict[str, int]:
    """The [preemption] table, checked by the scheduler's one rule (limits.check_preemption)."""
    if not isinstance(p, Mapping):
        raise ConfigError(f"{source}: [preemption] must be a table")
    if set(p) - PREEMPTION_KEYS:
        raise ConfigError(
            f"{source}: unknown [preemption] key(s) {sorted(set(p) - PREEMPTION_KEYS)}"
        )
    got = {k: _int(p, k, source, f"preemption.{k}") for k in sorted(p)}
    try:
        check_preemption(**got)
    except ValueError as exc:
        raise ConfigError(f"{source}: preemption.{exc}") from None
    return got


def _int(
    d: Mapping[str, Any], key: str, source: str, label: str, default: int | None = None
) -> int:
    if key not in d:
        if default is None:
            raise ConfigError(f"{source}: {label} is missing")
        return default
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise ConfigError(f"{source}: {label} must be an integer, not {v!r}")
    return v


def local_cluster(
    n: int,
    slots: int,
    name: str = "demo",
    domains: int = 2,
    *,
    leaf: int | None = None,
    pod: int | None = None,
    heartbeat_ms: int = 50,
    dead_after_ms: int = 500,
) -> ClusterConfig:
    """N nodes on this host over shm, split over `domains` racks (for demos and tests).

    With `leaf` (and `pod`, default: one pod of every leaf): a generated [topology] of
    `leaf` nodes per leaf, so each node holds lanes only to its links; its nodes are named
    as the topology names them (``n00``, ``n01``, ...) and their domains are its leaves.
    `heartbeat_ms` and `dead_after_ms` as in [cluster]."""
    if n < 1:
        raise ConfigError("a cluster needs at least one node")
    if leaf is not None:
        if pod is None:
            pod = max(1, -(-n // leaf)) * leaf
        return ClusterConfig.from_dict(
            {
                "cluster": {
                    "name": name,
                    "transport": "shm",
                    "slots": slots,
                    "heartbeat_ms": heartbeat_ms,
                    "dead_after_ms": dead_after_ms,
                },
                "topology": {"nodes": n, "leaf": leaf, "pod": pod},
            },
            source="local cluster",
        )
    if pod is not None:
        raise ConfigError("a local cluster's pod size needs a leaf size")
    return ClusterConfig.from_dict(
        {
            "cluster": {
                "name": name,
                "transport": "shm",
                "heartbeat_ms": heartbeat_ms,
                "dead_after_ms": dead_after_ms,
            },
            "node": [
                {"name": f"n{i}", "slots": slots, "domain": f"rack{i % max(1, domains)}"}
                for i in range(n)
            ],
        },
        source="local cluster",
    )
