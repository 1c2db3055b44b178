"""Launch through what clusters run: one daemon per host, found through the launcher.

A node is a host (docs/CLIENT.md). Its daemon learns the cluster (every host, its slots and
bootstrap address) and its own node id from the launcher, with no registry of our own:

- **Slurm** (SLURM_JOB_NODELIST and SLURM_NODEID set): the hosts are the job's node list,
  expanded (`rdmasched.slurm.expand_hostlist`), in order; this host is node SLURM_NODEID.
  Each host's bootstrap address is `<host>:<RDMASCHED_PORT>` (default 29650).
- **torchrun** (MASTER_ADDR, MASTER_PORT and GROUP_RANK, or NODE_RANK, set; torch present):
  each host's daemon writes its name, address and slots into the launcher's own rendezvous
  store (the c10d TCPStore at MASTER_ADDR:MASTER_PORT, as a client of it) under
  `rdmasched/<cluster>/host/<group rank>`, then reads every host's entry (waiting for hosts
  still starting, up to RDMASCHED_STORE_TIMEOUT_S, default 300). This host is node GROUP_RANK.
  The number of hosts is GROUP_WORLD_SIZE, else WORLD_SIZE / LOCAL_WORLD_SIZE.
- **one host** otherwise: a cluster of one node, this host.

Variables (every one optional): RDMASCHED_CLUSTER (the cluster name; default
`job<SLURM_JOB_ID>`, else `job<TORCHELASTIC_RUN_ID>`, else `joblocal`), RDMASCHED_HOST (this
host's node name; default the Slurm node name, else the short host name), RDMASCHED_SLOTS
(execution slots of this host; default LOCAL_WORLD_SIZE, else SLURM_NTASKS_PER_NODE, else
1), RDMASCHED_TRANSPORT (`shm` with one host, else `verbs`), RDMASCHED_TOKEN (required on
verbs), RDMASCHED_ADDR (the address other hosts reach this one at; default the host name's
address), RDMASCHED_PORT (this host's bootstrap port; torchrun default MASTER_PORT + 100 + its
group rank), RDMASCHED_DOMAIN (topology domain), RDMASCHED_HEARTBEAT_MS and
RDMASCHED_DEAD_AFTER_MS (docs/CONFIG.md's heartbeat_ms and dead_after_ms), RDMASCHED_TOPOLOGY
(under Slurm: a topology.conf, default the one beside slurm.conf, in SLURM_CONF's directory
or /etc/slurm, if it exists, cut down to the job's hosts: the cluster's [topology];
`job_topology`). A rank is client LOCAL_RANK (or SLURM_LOCALID) of the daemon at
`<cluster>.<host>` (`client_endpoint`); RDMASCHED_SPIN_US, when set, is its reader's spin
after a message, us (`client_spin_us`; docs/CLIENT.md, "Spinning"); RDMASCHED_SLICE_US, its
threads' EEVDF slice, us (`client_slice_us`; docs/CLIENT.md, "The slice").

Starting a host's daemon is this module's too: `host_node()` is this host's `Node`, and
`serve(node)` what a started node runs to be the host's daemon (`rdmasched daemon` calls
it): the client hub for the host's ranks and, given a port, the metrics server
(`serve_metrics`). A node on its own (`Node(...)`) serves neither.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rdmasched.clientproto import endpoint_name, up_lane
from rdmasched.cluster import MAX_NODES, ClusterConfig, env_int, env_token
from rdmasched.errors import ConfigError
from rdmasched.limits import EXEC_SLOTS_MAX

if TYPE_CHECKING:
    from rdmasched.daemon.clients import ClientHub
    from rdmasched.daemon.node import Node
    from rdmasched.telemetry.metrics import MetricsServer

__all__ = [
    "client_endpoint",
    "client_slice_us",
    "client_spin_us",
    "cluster_name",
    "daemon_running",
    "host_cluster",
    "host_name",
    "host_node",
    "serve",
    "serve_metrics",
    "session_name",
    "slurm_hosts",
    "spawn_daemon",
]

SLURM_PORT = 29650
_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    return env_int(env, key, default)  # one rule per variable: cluster.ENV_BOUNDS


def _int_if_set(env: Mapping[str, str], key: str) -> int | None:
    """Variable `key` as `_int` reads it, or None when it is unset or empty."""
    return _int(env, key) if env.get(key) else None


def cluster_name(env: Mapping[str, str] | None = None) -> str:
    """The cluster (job) name: RDMASCHED_CLUSTER, else job<SLURM_JOB_ID>, else the torchrun
    run id, else `joblocal`; characters other than letters, digits, '_', '.', '-' become '-'."""
    env = _env(env)
    name = env.get("RDMASCHED_CLUSTER")
    if not name:
        job = env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or "local"
        name = _BAD.sub("-", f"job{job}")[:40]
    return name


def session_name(env: Mapping[str, str] | None = None) -> str:
    """This rank's session: RDMASCHED_SESSION if set, else the launcher's run:
    `torchelastic:<TORCHELASTIC_RUN_ID>:<TORCHELASTIC_RESTART_COUNT>` under torchrun (a
    restart is a new session), else `slurm:<SLURM_JOB_ID>.<SLURM_STEP_ID>` under Slurm (each
    srun step one), else "" (no launcher). The daemon keys sync groups by (session, group)
    (docs/CLIENT.md, "Sessions"): every rank of a session must have the same one."""
    env = _env(env)
    if env.get("RDMASCHED_SESSION"):
        return env["RDMASCHED_SESSION"]
    run = env.get("TORCHELASTIC_RUN_ID")
    if run:
        return f"torchelastic:{run}:{env.get('TORCHELASTIC_RESTART_COUNT') or 0}"
    job = env.get("SLURM_JOB_ID")
    if job:
        return f"slurm:{job}.{env.get('SLURM_STEP_ID') or 0}"
    return ""


def slurm_hosts(env: Mapping[str, str] | None = None) -> tuple[list[str], int] | None:
    """(the job's hosts, this host's index) from SLURM_JOB_NODELIST and SLURM_NODEID; None
    when Slurm did not launch this process."""
    from rdmasched.slurm import expand_hostlist

    env = _env(env)
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    if "SLURM_NODEID" not in env:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r} is set but SLURM_NODEID is not")
    hosts = expand_hostlist(nodelist)
    me = _int(env, "SLURM_NODEID")
    if not 0 <= me < len(hosts):
        raise ConfigError(
            f"SLURM_NODEID={me} is not an index of SLURM_JOB_NODELIST ({len(hosts)} hosts)"
        )
    if len(set(hosts)) != len(hosts):
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r} names a host twice")
    return hosts, me


def host_name(env: Mapping[str, str] | None = None) -> str:
    """This host's node name: RDMASCHED_HOST, else its entry in the Slurm node list, else
    SLURMD_NODENAME, else the short host name."""
    env = _env(env)
    if env.get("RDMASCHED_HOST"):
        return env["RDMASCHED_HOST"]
    slurm = slurm_hosts(env)
    if slurm is not None:
        return slurm[0][slurm[1]]
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def client_endpoint(env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(this host's daemon endpoint `<cluster>.<host>`, this rank's client index: LOCAL_RANK,
    else SLURM_LOCALID, else 0)."""
    env = _env(env)
    index = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else _int(env, "SLURM_LOCALID", 0)
    if not 0 <= index <= 254:
        raise ConfigError(f"the local rank must be 0..254, not {index}")
    return endpoint_name(cluster_name(env), host_name(env)), index


def client_spin_us(env: Mapping[str, str] | None = None) -> int | None:
    """RDMASCHED_SPIN_US: how long a rank's client reader spins after a message before it
    sleeps, us (None: unset, the client's default)."""
    return _int_if_set(_env(env), "RDMASCHED_SPIN_US")


def client_slice_us(env: Mapping[str, str] | None = None) -> int | None:
    """RDMASCHED_SLICE_US: the EEVDF slice a rank's threads on the control path ask for, us
    (None: unset, the kernel's default; daemon/tuning.py)."""
    return _int_if_set(_env(env), "RDMASCHED_SLICE_US")


def _slots(env: Mapping[str, str]) -> int:
    if env.get("RDMASCHED_SLOTS"):
        return _int(env, "RDMASCHED_SLOTS")
    if env.get("LOCAL_WORLD_SIZE"):
        return _int(env, "LOCAL_WORLD_SIZE")
    per = env.get("SLURM_NTASKS_PER_NODE", "")
    if not per:
        return 1
    m = re.fullmatch(r"(\d+)(\(x\d+\))?(,\d+(\(x\d+\))?)*", per)  # "2", "2(x3)", "2,1"
    if m is None or not 1 <= int(m.group(1)) <= EXEC_SLOTS_MAX:
        raise ConfigError(
            f"SLURM_NTASKS_PER_NODE={per!r} must be a number of tasks per node in "
            f"1..{EXEC_SLOTS_MAX} (as 2, or 2(x3)): it gives this host's execution slots"
        )
    return int(m.group(1))


def _address(env: Mapping[str, str], host: str) -> str:
    addr = env.get("RDMASCHED_ADDR")
    if addr:
        return addr
    try:
        return socket.gethostbyname(host if host != "localhost" else socket.gethostname())
    except OSError:
        return socket.gethostbyname(socket.gethostname())


#: where Slurm's topology/tree plugin reads the switch tree from, by default (beside
#: slurm.conf: with SLURM_CONF set, its directory's topology.conf instead)
SLURM_TOPOLOGY_CONF = "/etc/slurm/topology.conf"


def job_topology(env: Mapping[str, str], names: list[str]) -> dict[str, Any] | None:
    """The [topology] of a Slurm job: the switch tree of RDMASCHED_TOPOLOGY (a Slurm
    topology.conf; default the one Slurm reads, beside slurm.conf: in SLURM_CONF's directory
    when that is set, else /etc/slurm/topology.conf, when it exists) cut down to the job's
    hosts `names`, as `[[topology.switch]]` tables. None without a topology.conf (a full
    mesh: docs/SCALE.md). A job host that no leaf switch lists is an error."""
    from rdmasched.slurm import parse_slurm

    path = env.get("RDMASCHED_TOPOLOGY", "")
    if not path:
        slurm_conf = env.get("SLURM_CONF", "")
        path = (
            os.path.join(os.path.dirname(slurm_conf), "topology.conf")
            if slurm_conf
            else SLURM_TOPOLOGY_CONF
        )
        if not os.path.exists(path):
            return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"RDMASCHED_TOPOLOGY {path}: {exc.strerror}") from None
    job = set(names)
    nodes: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    for sw in parse_slurm(text, path):
        nodes[sw.name] = [n for n in sw.nodes if n in job]
        children[sw.name] = list(sw.switches)
    listed = {n for ns in nodes.values() for n in ns}
    if job - listed:
        raise ConfigError(
            f"{path}: no leaf switch lists the job's host(s) {sorted(job - listed)[:5]}"
        )
    changed = True
    while changed:  # drop the switches with none of the job's hosts below them
        empty = {k for k in nodes if not nodes[k] and not children[k]}
        changed = bool(empty)
        for k in empty:
            del nodes[k], children[k]
        for k in children:
            children[k] = [c for c in children[k] if c not in empty]
    switch = []
    for k in nodes:
        entry: dict[str, Any] = {"name": k}
        if nodes[k]:
            entry["nodes"] = nodes[k]
        if children[k]:
            entry["switches"] = children[k]
        switch.append(entry)
    return {"switch": switch}


def _config(
    env: Mapping[str, str],
    hosts: list[dict[str, Any]],
    source: str,
    topology: dict[str, Any] | None = None,
) -> ClusterConfig:
    transport = env.get("RDMASCHED_TRANSPORT") or ("shm" if len(hosts) == 1 else "verbs")
    cluster: dict[str, Any] = {
        "name": cluster_name(env),
        "transport": transport,
        "token": env_token(env, transport, source),
    }
    for key in ("heartbeat_ms", "dead_after_ms"):
        var = f"RDMASCHED_{key.upper()}"
        if env.get(var):
            cluster[key] = _int(env, var)
    if len(hosts) > MAX_NODES:
        raise ConfigError(f"{source}: {len(hosts)} hosts, at most {MAX_NODES}")
    doc: dict[str, Any] = {"cluster": cluster, "node": hosts}
    if topology is not None:
        doc["topology"] = topology
    return ClusterConfig.from_dict(doc, source=source)


def host_cluster(env: Mapping[str, str] | None = None) -> tuple[ClusterConfig, int]:
    """The cluster of hosts and this host's node id, from the launcher (module doc)."""
    env = _env(env)
    domain = env.get("RDMASCHED_DOMAIN", "")
    slurm = slurm_hosts(env)
    if slurm is not None:
        names, me = slurm
        port = _int(env, "RDMASCHED_PORT", SLURM_PORT)
        slots = _slots(env)
        hosts = [
            {"name": h, "slots": slots, "domain": domain, "address": f"{h}:{port}"} for h in names
        ]
        if env.get("RDMASCHED_ADDR"):  # this host's own address, where names do not resolve
            hosts[me]["address"] = f"{env['RDMASCHED_ADDR']}:{port}"
        topology = job_topology(env, names)
        cluster = _config(env, hosts, "Slurm environment", topology)
        if topology is not None:  # node ids are positions in the topology (docs/CONFIG.md)
            me = cluster.node(names[me]).id
        return cluster, me
    if env.get("MASTER_ADDR") and ("GROUP_RANK" in env or "NODE_RANK" in env):
        return _from_store(env)
    name = host_name(env)
    one = {"name": name, "slots": _slots(env), "domain": domain, "address": ""}
    if env.get("RDMASCHED_TRANSPORT") == "verbs":
        one["address"] = f"{_address(env, name)}:{_int(env, 'RDMASCHED_PORT', SLURM_PORT)}"
    return _config(env, [one], "environment (one host)"), 0


def host_node(env: Mapping[str, str] | None = None, **kw: Any) -> Node:
    """This host's daemon, a `Node` of the cluster of hosts `host_cluster` finds (a node is
    a host: torchrun's hosts through its TCPStore, Slurm's through SLURM_JOB_NODELIST and
    SLURM_NODEID); `kw` as `Node`'s. The ranks are its clients (`Client.from_env()`). The
    old rank-per-node config is `Node(*ClusterConfig.from_env())`."""
    from rdmasched.daemon.node import Node

    cluster, node = host_cluster(env)
    return Node(cluster, node, **kw)


def serve(
    node: Node,
    *,
    max_clients: int | None = None,
    metrics_port: int | None = None,
    max_queued: int | None = None,
    metrics_addr: str = "127.0.0.1",
    metrics_token: bytes | None = None,
    spin_us: int | None = None,
) -> ClientHub:
    """Make a started `node` this host's daemon: serve its ranks (a `ClientHub` of
    `max_clients`, default one per slot, each holding at most `max_queued` tasks, default
    `limits.CLIENT_QUEUED_DEFAULT`) and, given `metrics_port` (0: any free port), its
    Prometheus metrics and probes on `metrics_addr` (`serve_metrics`). Both stop with the
    node. What `rdmasched daemon` runs (it serves the metrics before the node starts, so
    that /readyz answers while the node joins). `spin_us`: the hub reader's spin after a
    message, us (default `clients.HUB_SPIN_US`)."""
    from rdmasched.daemon.clients import HUB_SPIN_US, ClientHub

    spin = HUB_SPIN_US if spin_us is None else spin_us
    hub = ClientHub(node, max_clients=max_clients, max_queued=max_queued, spin_us=spin).open()
    if metrics_port is not None:
        serve_metrics(node, metrics_port, metrics_addr, token=metrics_token)
    return hub


def serve_metrics(
    node: Node, port: int, addr: str = "127.0.0.1", *, token: bytes | None = None
) -> MetricsServer:
    """Serve `node`'s Prometheus metrics, live events and probes (/healthz, /readyz) on
    `addr:port` (0: any free port; the server is `node.metrics`, its port
    `node.metrics.port`); with `token` (`telemetry.http.read_token`) /metrics and /events
    need it. It stops with the node (docs/TELEMETRY.md, "Metrics"). A node not started yet
    may be given one: it answers 503 until the node's loop runs."""
    from rdmasched.telemetry.metrics import serve as serve_http

    if node.metrics is None:
        node.metrics = serve_http(node, port, addr, token=token)
    server: MetricsServer = node.metrics
    return server


def _from_store(env: Mapping[str, str]) -> tuple[ClusterConfig, int]:
    """Every host's entry through the launcher's TCPStore (torchrun's rendezvous store)."""
    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        raise ConfigError(
            "torchrun's variables are set (MASTER_ADDR, GROUP_RANK) but torch is not "
            "importable: the hosts find each other through torchrun's TCPStore. Install "
            "torch, or give the cluster as a TOML file (rdmasched daemon --config)"
        ) from None
    me = _int(env, "GROUP_RANK") if "GROUP_RANK" in env else _int(env, "NODE_RANK")
    if env.get("GROUP_WORLD_SIZE"):
        n = _int(env, "GROUP_WORLD_SIZE")
    else:
        world, local = _int(env, "WORLD_SIZE", 1), _int(env, "LOCAL_WORLD_SIZE", 1)
        if local < 1 or world % local:
            raise ConfigError(
                f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local}: set "
                "GROUP_WORLD_SIZE (the number of hosts)"
            )
        n = world // local
    if not 0 <= me < n <= MAX_NODES:
        raise ConfigError(f"need 0 <= GROUP_RANK < hosts <= {MAX_NODES} (got {me} of {n})")
    master, mport = env["MASTER_ADDR"], _int(env, "MASTER_PORT", 29500)
    timeout = _int(env, "RDMASCHED_STORE_TIMEOUT_S", 300)
    name = host_name(env)
    entry = {
        "name": name,
        "slots": _slots(env),
        "domain": env.get("RDMASCHED_DOMAIN", ""),
        "address": f"{_address(env, name)}:{_int(env, 'RDMASCHED_PORT', mport + 100 + me)}",
    }
    try:
        store = TCPStore(master, mport, is_master=False, timeout=timedelta(seconds=timeout))
    except Exception as exc:  # torch raises RuntimeError/DistStoreError/TimeoutError
        raise ConfigError(
            f"cannot reach the launcher's rendezvous store at {master}:{mport} "
            f"(MASTER_ADDR:MASTER_PORT): {exc}"
        ) from None
    prefix = f"rdmasched/{cluster_name(env)}/host/"
    try:
        store.set(prefix + str(me), json.dumps(entry))
        hosts = [json.loads(store.get(prefix + str(h))) for h in range(n)]
    except Exception as exc:
        raise ConfigError(
            f"the hosts did not all register in the rendezvous store at {master}:{mport} "
            f"within {timeout} s: {exc}"
        ) from None
    return _config(env, hosts, f"rendezvous store {master}:{mport}"), me


def daemon_running(endpoint: str) -> bool:
    """A live daemon serves `endpoint` on this host (its first client lane is up, or is
    being created, or something holds its name): by the lane's liveness token, so a daemon
    of another PID namespace counts (docs/PROTOCOL.md section 9)."""
    from rdmasched.transport import shm

    try:
        e = shm.inspect(shm.lane_segment_name(up_lane(endpoint, 0)))
    except ValueError:
        return False
    return e is not None and e.state != "stale"


def spawn_daemon(env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start this host's daemon as a child process (`rdmasched daemon --exit-when-idle`):
    it exits once every client that connected has left."""
    env = dict(_env(env))
    return subprocess.Popen(
        [sys.executable, "-m", "rdmasched.cli", "daemon", "--exit-when-idle"],
        env=env,
        stdin=subprocess.DEVNULL,
    )
