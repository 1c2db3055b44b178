"""Link models of the simulator: latency, bandwidth and per-message CPU cost per level.

A message from node `a` to node `b` travels over the level of the pair: ``host`` (both on
one host: shm), ``leaf`` (same leaf switch), ``pod`` (same pod, through a spine) or
``cross`` (another pod). It arrives ``latency + bytes / bandwidth`` after it leaves; the
receiver then spends ``cpu_ns`` of its one message-handling thread on it (messages queue
behind each other: a node handles one at a time). docs/SIM.md gives the source of every
default.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rdmasched.errors import ArgumentError
from rdmasched.topology import Topology

LEVELS = ("host", "leaf", "pod", "cross")
HOST, LEAF, POD, CROSS = range(4)


@dataclass(frozen=True)
class Level:
    #: one-way latency of a small message, ns
    latency_ns: int
    #: bytes per second a lane carries (a slot is 64 bytes; metadata adds slots)
    bandwidth: float


@dataclass(frozen=True)
class LinkModel:
    name: str
    levels: tuple[Level, Level, Level, Level]
    #: CPU time the receiving node spends on one message (decode + the core's decision), ns
    cpu_ns: int
    #: every node on one host (the shm model): every pair is at the host level
    one_host: bool
    source: str

    def level(self, topo: Topology | None, a: int, b: int) -> int:
        if self.one_host or topo is None:
            return HOST if self.one_host else LEAF
        la, lb = topo.node_leaf[a], topo.node_leaf[b]
        if la == lb:
            return LEAF
        return POD if topo.leaf_pod[la] == topo.leaf_pod[lb] else CROSS

    def with_cpu(self, cpu_ns: int) -> LinkModel:
        return replace(self, cpu_ns=cpu_ns)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "one_host": self.one_host,
            "cpu_ns": self.cpu_ns,
            "levels": {
                LEVELS[i]: {"latency_ns": lv.latency_ns, "bandwidth_Bps": lv.bandwidth}
                for i, lv in enumerate(self.levels)
            },
            "source": self.source,
        }


#: one switch traversal (port to port) added per switch level above the leaf, ns
SWITCH_NS = 300

#: CPU cost of one received message in the Python daemon, ns: the compiled scheduler's
#: 2.45 us per decision (docs/figures/bench-all.json, `bench scheduler`) plus half the
#: rdmasched-shm Python-API round trip, 0.48 us (the same file, `bench latency`), rounded.
DAEMON_CPU_NS = 3_000


def _tiers(base_ns: int, bw: float) -> tuple[Level, Level, Level, Level]:
    return (
        Level(base_ns, bw),
        Level(base_ns, bw),
        Level(base_ns + 2 * SWITCH_NS, bw),
        Level(base_ns + 4 * SWITCH_NS, bw),
    )


PRESETS: dict[str, LinkModel] = {
    # measured here: rdmasched-shm (Python API both sides) p50 RTT 0.962 us -> 481 ns one
    # way (docs/figures/bench-all.json); `bench throughput` 4.06M 64-byte msgs/s per lane.
    "shm": LinkModel(
        "shm",
        _tiers(481, 4.06e6 * 64),
        DAEMON_CPU_NS,
        True,
        "bench-all.json 2026-11-30: rdmasched-shm p50 RTT 0.962 us, 4.06M msgs/s",
    ),
    # measured here: Soft-RoCE (rdma_rxe) in a qemu VM, ib_write_lat t_typical 31-49 us one
    # way, ib_write_bw 13.5-15.8 MB/s (/work/shared/BASELINES.md): 40 us, 14.5 MB/s.
    "softroce": LinkModel(
        "softroce",
        _tiers(40_000, 14.5e6),
        DAEMON_CPU_NS,
        False,
        "BASELINES.md: rxe ib_write_lat typical 31-49 us one way, ib_write_bw 13.5-15.8 MB/s",
    ),
    # published: ~0.9 us one way for a small inline RDMA WRITE on mlx5 (perftest), 0.83 us
    # ib_send_lat RC 32 B (D. Potter, MSc thesis, TU Delft 2018, table mtu_performance);
    # 100 Gb/s links (12.5 GB/s).
    "ib": LinkModel(
        "ib",
        _tiers(900, 12.5e9),
        DAEMON_CPU_NS,
        False,
        "perftest ib_write_lat ~0.9 us (mlx5); ib_send_lat 0.83 us RC 32 B (Potter 2018)",
    ),
    # published: 1.5 us ib_write_lat on ConnectX-7 RoCE back to back (BASELINES.md); 100 Gb/s
    "roce": LinkModel(
        "roce",
        _tiers(1_500, 12.5e9),
        DAEMON_CPU_NS,
        False,
        "perftest ib_write_lat 1.5 us, ConnectX-7 RoCE back to back",
    ),
    # TCP-class (two-level's global scheduler, Ray's gRPC): issue 21's TCP-class figures,
    # 40 us one way and 20 us of CPU a message; a Python gRPC call between two EC2 hosts
    # measured 0.6-0.7 ms round trip over TLS (A. Vuorinen, "A crude gRPC benchmark",
    # 2021), so these favour the baseline; 25 Gb/s
    "tcp": LinkModel(
        "tcp",
        _tiers(40_000, 3.125e9),
        20_000,
        False,
        "issue 21: TCP-class 40 us one way, 20 us CPU a message; gRPC 0.6-0.7 ms RTT "
        "(Vuorinen 2021)",
    ),
}


def preset(name: str) -> LinkModel:
    try:
        return PRESETS[name]
    except KeyError:
        raise ArgumentError(
            f"unknown link model {name!r}; one of: {', '.join(sorted(PRESETS))}"
        ) from None
