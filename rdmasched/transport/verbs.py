"""verbs transport: lanes over RDMA (InfiniBand, RoCE, Soft-RoCE) reliable-connected QPs.

Python owns the policy here, Cython (rdmasched._verbs) the per-message path:

- `Device` opens an RDMA device with pyverbs, checks the port is ACTIVE and picks the GID
  (default: the port's RoCE v2 IPv4 GID; or an index the user names).
- `Endpoint` is one node on one device: its protection domain, the connections to its peers,
  and each peer's inbound lane, which outlives a connection so that a reconnecting sender's
  old messages are drained before its new epoch starts.
- `Connection` is one peer pair: one RC queue pair (this node's outbound slots and the credit
  writes of its inbound lane share it), a 64-byte control block the peer writes credits into,
  the shadow ring the outbound slots are encoded in, and the two lanes, `tx` and `rx`.

Memory regions: the inbound ring (REMOTE_WRITE, its rkey goes to that one peer only), the
control block (REMOTE_WRITE, its own rkey), the shadow ring (local only). One protection
domain per endpoint; a peer holds only the rkeys of its own lane and control block.

Every resource has one owner: the queue pair, the control block and the shadow ring the
Connection, the ring its RxLane, the protection domain and the completion channel the
Endpoint, the context the Device. The order they are freed in is the handles' own
(_verbs.VerbsObject): a parent closes its children first, so a queue pair (and its CQs) goes
before the memory regions, the PD and the completion channel, and the context last, whoever
closes first. What this module decides is when: a connection's resources go when both its
lanes are closed, a reconnected peer's old queue pair once its lane has switched.

Errors: DeviceError (no device, inactive port, a verbs call failed, memlock), ConfigError (a
GID that cannot be used), BootstrapError (handshake), PeerDeadError (the peer went away).
docs/VERBS.md tells the whole story.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import ipaddress
import logging
import os
import random
import resource
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from rdmasched import bootstrap
from rdmasched.errors import BootstrapError, ConfigError, DeviceError, RdmaschedError
from rdmasched.limits import (
    DSCP_DEFAULT,
    SERVICE_LEVEL_DEFAULT,
    check_lane_slots,
    check_traffic_class,
)
from rdmasched.wire import VERSION as WIRE_VERSION

__all__ = [
    "DEFAULT_NSLOTS",
    "Connection",
    "Descriptor",
    "Device",
    "Endpoint",
    "GidEntry",
    "LaneSet",
    "check_route",
    "choose_gid",
    "list_devices",
    "memlock_note",
]

_log = logging.getLogger("rdmasched.verbs")

SETUP_HINT = (
    "set up Soft-RoCE with `soft-roce-setup.sh up` (needs a kernel with the rdma_rxe module), "
    "or run inside the test VM: tests/vm/run-in-vm.sh"
)
DEFAULT_NSLOTS = 256
DEFAULT_GRACE_US = 50_000
DEFAULT_KEEPALIVE_MS = 100
#: the RC local ACK timeout's exponent: a WRITE not acknowledged within 4.096 us * 2**14
#: (67 ms) is resent, `retry_cnt` (6) times: a silent peer fails the QP after about 0.5 s
DEFAULT_QP_TIMEOUT = 14
DEFAULT_RETRY_CNT = 6


def qp_timeout_for(patience_ms: float, retry_cnt: int = DEFAULT_RETRY_CNT) -> int:
    """The smallest ACK timeout exponent (at least DEFAULT_QP_TIMEOUT, at most 31) whose
    retry budget, 1 + `retry_cnt` tries of 4.096 us * 2**t, lasts `patience_ms`: so that
    the QP never fails a peer that the caller's own liveness rule (a daemon's
    `dead_after_ms`, a benchmark's timeout) still waits for. A peer stalled for less (a
    busy host, a VM descheduled) is then a late ACK, not a failed connection."""
    for t in range(DEFAULT_QP_TIMEOUT, 32):
        if 4.096e-3 * (1 << t) * (1 + retry_cnt) >= patience_ms:
            return t
    return 31


GID_TYPES = {0: "IB", 1: "RoCE v1", 2: "RoCE v2"}
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}


# ---- GIDs: pure functions, tested without RDMA --------------------------------------------------
@dataclass(frozen=True)
class GidEntry:
    """One entry of a port's GID table."""

    index: int
    gid: bytes  # 16 bytes, network order
    type: str  # "IB", "RoCE v1", "RoCE v2"
    port: int = 1
    netdev: str | None = None

    @property
    def text(self) -> str:
        v4 = self.ipv4
        return f"::ffff:{v4}" if v4 is not None else str(ipaddress.IPv6Address(self.gid))

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
        mapped = ipaddress.IPv6Address(self.gid).ipv4_mapped
        return str(mapped) if mapped is not None else None

    def describe(self) -> str:
        dev = f" on {self.netdev}" if self.netdev else ""
        return f"[{self.index}] {self.text} ({self.type}{dev})"


def gid_from_text(text: str) -> bytes:
    """A GID as libibverbs prints it (8 groups of 4 hex digits) or any IPv6 text -> 16 bytes."""
    t = text.strip()
    digits = t.replace(":", "")
    if len(digits) == 32 and all(c in "0123456789abcdefABCDEF" for c in digits):
        return bytes.fromhex(digits)
    return ipaddress.IPv6Address(t).packed


def choose_gid(
    entries: list[GidEntry],
    index: int | None = None,
    *,
    device: str = "?",
    port: int = 1,
    link_layer: str = "Ethernet",
) -> GidEntry:
    """The GID to route by: `index` if given, else the port's RoCE v2 IPv4 GID (Ethernet) or
    index 0 (InfiniBand). ConfigError, listing what the port has, when there is none."""
    table = "; ".join(e.describe() for e in entries) or "none"
    if index is not None:
        for e in entries:
            if e.index == index:
                if e.gid == bytes(16):
                    break
                return e
        raise ConfigError(
            f"GID index {index} of {device} port {port} is empty or does not "
            f"exist (the port's GIDs: {table}); pick another with --gid-index "
            "or RDMASCHED_GID_INDEX"
        )
    if link_layer == "InfiniBand":
        for e in entries:
            if e.index == 0 and e.gid != bytes(16):
                return e
    for e in entries:
        if e.type == "RoCE v2" and e.ipv4 is not None:
            return e
    raise ConfigError(
        f"{device} port {port} has no RoCE v2 GID with an IPv4 address (its "
        f"GIDs: {table}): give its netdev an IPv4 address (soft-roce-setup.sh up "
        "does), or name a GID index with --gid-index / RDMASCHED_GID_INDEX"
    )


def check_route(local: GidEntry, remote_gid: bytes, *, device: str = "?") -> None:
    """ConfigError if `local` cannot reach `remote_gid` (RoCE: the address families differ,
    or the peer sent no GID)."""
    if len(remote_gid) != 16 or remote_gid == bytes(16):
        raise ConfigError(
            f"the peer sent an empty GID: it cannot be routed to from "
            f"{device} GID {local.describe()}"
        )
    remote = ipaddress.IPv6Address(remote_gid)
    if local.type == "IB":
        return
    if (local.ipv4 is None) != (remote.ipv4_mapped is None):
        mine = "IPv4" if local.ipv4 else "IPv6"
        theirs = "IPv4" if remote.ipv4_mapped else "IPv6"
        raise ConfigError(
            f"GID {local.describe()} of {device} ({mine}) cannot route to the "
            f"peer's GID {remote} ({theirs}): use GIDs of the same family on "
            "both nodes (RDMASCHED_GID_INDEX)"
        )
    local_ll = ipaddress.IPv6Address(local.gid).is_link_local
    if local.ipv4 is None and remote.is_link_local != local_ll:
        raise ConfigError(
            f"GID {local.describe()} of {device} cannot route to the peer's "
            f"GID {remote}: one is link-local, the other is not"
        )


def memlock_note() -> str:
    """The locked-memory limit as a sentence, for errors and `rdmasched doctor`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)

    def fmt(v: int) -> str:
        return "unlimited" if v == resource.RLIM_INFINITY else f"{v // 1024} KiB"

    cap = _has_cap_ipc_lock()
    capnote = " (this process has CAP_IPC_LOCK, so the kernel does not enforce it)" if cap else ""
    return f"RLIMIT_MEMLOCK (`ulimit -l`) is {fmt(soft)} soft, {fmt(hard)} hard{capnote}"


def _has_cap_ipc_lock() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 14))
    except OSError:
        pass
    return False


# ---- pyverbs -----------------------------------------------------------------------------------
def _pyverbs() -> Any:
    try:
        import pyverbs.device as dev
        import pyverbs.enums as enums
        from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
    except ImportError as exc:
        raise DeviceError(
            f"pyverbs is not installed ({exc}): apt-get install python3-pyverbs "
            "(it comes with the distribution's rdma-core)"
        ) from exc

    class _NS:
        pass

    ns = _NS()
    ns.dev, ns.enums = dev, enums  # type: ignore[attr-defined]
    ns.Error, ns.RDMAError = PyverbsError, PyverbsRDMAError  # type: ignore[attr-defined]
    return ns


def _errno_of(exc: BaseException) -> int | None:
    code = getattr(exc, "error_code", None)
    return int(code) if isinstance(code, int) and code > 0 else None


def list_devices() -> list[str]:
    """Names of the RDMA devices libibverbs sees; [] when there are none."""
    pv = _pyverbs()
    if not os.path.isdir("/sys/class/infiniband"):
        return []
    try:
        return [d.name.decode() for d in pv.dev.get_device_list()]
    except pv.Error:
        return []


_VERBS: Any = None


def LaneSet() -> Any:
    """A set of verbs inbound lanes whose `wait` sleeps when idle (_verbs.VerbsLaneSet):
    drain, spin up to `spin_us`, then block on the endpoints' completion channels until a
    sender wakes it (write-with-immediate) or `timeout_us` passes."""
    return _verbs_module().VerbsLaneSet()


def _verbs_module() -> Any:
    global _VERBS
    if _VERBS is not None:
        return _VERBS
    try:
        from rdmasched import _verbs
    except ImportError as exc:
        raise DeviceError(
            f"the verbs extension rdmasched._verbs is not built ({exc}): install "
            "libibverbs-dev and run `python setup.py build_ext --inplace`"
        ) from exc
    _VERBS = _verbs
    return _verbs


class Device:
    """An open RDMA device port: the pyverbs Context, the port's state, the chosen GID."""

    def __init__(
        self, name: str | None = None, port: int = 1, gid_index: int | None = None
    ) -> None:
        pv = _pyverbs()
        names = list_devices()
        if not names:
            why = (
                "there is no /sys/class/infiniband (this kernel has no RDMA support loaded)"
                if not os.path.isdir("/sys/class/infiniband")
                else "libibverbs lists none"
            )
            raise DeviceError(f"no RDMA device found: {why}; {SETUP_HINT}")
        if name is None:
            name = names[0]
        elif name not in names:
            raise DeviceError(
                f"RDMA device {name!r} not found (devices: {', '.join(names)}); {SETUP_HINT}"
            )
        self.name = name
        self.port = port
        self.context: Any = None
        try:
            probe = pv.dev.Context(name=name)
        except pv.Error as exc:
            raise DeviceError(
                f"cannot open RDMA device {name!r}: {exc}; {SETUP_HINT}", _errno_of(exc)
            ) from exc
        try:
            self._probe(probe, gid_index)
        finally:
            probe.close()
        # The data path's own context (see _verbs.DeviceContext for why not pyverbs').
        self.context = _verbs_module().DeviceContext(name)

    def _probe(self, ctx: Any, gid_index: int | None) -> None:
        attr = ctx.query_device()
        if not 1 <= self.port <= attr.phys_port_cnt:
            raise DeviceError(f"{self.name} has {attr.phys_port_cnt} port(s), not port {self.port}")
        self.max_qp_wr = int(attr.max_qp_wr)
        pa = ctx.query_port(self.port)
        self.state = PORT_STATES.get(int(pa.state), str(pa.state))
        self.link_layer = "InfiniBand" if int(pa.link_layer) == 1 else "Ethernet"
        self.active_mtu = int(pa.active_mtu)
        if self.state != "ACTIVE":
            raise DeviceError(
                f"{self.name} port {self.port} is {self.state}, not ACTIVE: is "
                "its network interface up? (`soft-roce-setup.sh status`; "
                "`soft-roce-setup.sh up` brings Soft-RoCE up)"
            )
        self.gids = read_gids(ctx, self.port, int(pa.gid_tbl_len), int(attr.phys_port_cnt))
        self.gid = choose_gid(
            self.gids, gid_index, device=self.name, port=self.port, link_layer=self.link_layer
        )

    @property
    def closed(self) -> bool:
        return self.context is None

    def close(self) -> None:
        """Close the context, and whatever is still open on it first. Safe twice."""
        if self.context is not None:
            self.context.close()
            self.context = None

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Device({self.name!r}, port={self.port}, gid={self.gid.describe()})"


def read_gids(context: Any, port: int, table_len: int, ports: int = 1) -> list[GidEntry]:
    """The port's non-empty GIDs in one ibv_query_gid_table call (never 1024 sysfs reads).

    `table_len` is the port's gid_tbl_len; the table call wants room for every port's."""
    pv = _pyverbs()
    out: list[GidEntry] = []
    try:
        entries = context.query_gid_table(max(table_len, 1) * max(ports, 1))
    except pv.Error:
        entries = None
    if entries is not None:
        for e in entries:
            if int(e.port_num) != port:
                continue
            text = e.gid_str() if callable(e.gid_str) else e.gid_str
            gid = gid_from_text(text)
            if gid == bytes(16):
                continue
            out.append(
                GidEntry(
                    int(e.gid_index),
                    gid,
                    GID_TYPES.get(int(e.gid_type), "?"),
                    port,
                    _ifname(int(e.ndev_ifindex)),
                )
            )
        return sorted(out, key=lambda g: g.index)
    for i in range(min(table_len, 16)):  # old kernels: the first few, one by one
        try:
            ex = context.query_gid_ex(port, i)
            gid = gid_from_text(ex.gid_str() if callable(ex.gid_str) else ex.gid_str)
            gtype = GID_TYPES.get(int(ex.gid_type), "?")
        except pv.Error:
            continue
        if gid != bytes(16):
            out.append(GidEntry(i, gid, gtype, port))
    return out


def _ifname(ifindex: int) -> str | None:
    if ifindex <= 0:
        return None
    try:
        return str(__import__("socket").if_indextoname(ifindex))
    except OSError:
        return None


# ---- descriptors ------------------------------------------------------------------------------
def wire_version_problem(d: Any, peer: str) -> str | None:
    """Why a peer's lane descriptor `d` is of another wire protocol version (a v1 peer
    sends no "wire" key), or None if it speaks this node's."""
    v = d.get("wire", 1) if isinstance(d, dict) else None
    if v == WIRE_VERSION and type(v) is int:
        return None
    return (
        f"bootstrap peer {peer} speaks wire protocol version {v!r}, this node version "
        f"{WIRE_VERSION}: run the same rdmasched version on every node (docs/PROTOCOL.md)"
    )


@dataclass(frozen=True)
class Descriptor:
    """What one side of a connection tells the other (the "desc" bootstrap message)."""

    node: int
    gid: bytes
    gid_index: int
    qpn: int
    psn: int
    mtu: int  # ibv_mtu: 1..5 (256..4096 bytes)
    lane_addr: int  # my inbound ring: you write your slots here
    lane_rkey: int
    nslots: int
    epoch: int  # the epoch you send with
    ctl_addr: int  # my control block: you write the credit of your inbound lane here
    ctl_rkey: int
    #: the wire protocol version of the slots in my lanes (docs/PROTOCOL.md); a v1 peer
    #: sends no "wire" key
    wire: int = WIRE_VERSION

    def to_wire(self) -> dict[str, Any]:
        return {
            "wire": self.wire,
            "node": self.node,
            "gid": self.gid,
            "gid_index": self.gid_index,
            "qpn": self.qpn,
            "psn": self.psn,
            "mtu": self.mtu,
            "lane": {
                "addr": self.lane_addr,
                "rkey": self.lane_rkey,
                "nslots": self.nslots,
                "epoch": self.epoch,
            },
            "ctl": {"addr": self.ctl_addr, "rkey": self.ctl_rkey},
        }

    @classmethod
    def from_wire(cls, d: Any, peer: str = "?") -> Descriptor:
        """Validate a descriptor from the wire; BootstrapError naming the bad field."""

        def need(m: Any, key: str, lo: int, hi: int) -> int:
            v = m.get(key) if isinstance(m, dict) else None
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise BootstrapError(
                    f"bootstrap peer {peer} sent a bad lane descriptor: "
                    f"{key}={v!r} (expected {lo}..{hi})"
                )
            return v

        if not isinstance(d, dict):
            raise BootstrapError(f"bootstrap peer {peer} sent no lane descriptor")
        problem = wire_version_problem(d, peer)
        if problem is not None:
            raise BootstrapError(problem)
        gid = d.get("gid")
        if not isinstance(gid, bytes) or len(gid) != 16:
            raise BootstrapError(f"bootstrap peer {peer} sent a bad lane descriptor: gid")
        lane, ctl = d.get("lane"), d.get("ctl")
        u32, u64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
        try:
            nslots = check_lane_slots(lane.get("nslots") if isinstance(lane, dict) else None)
        except ValueError as exc:
            raise BootstrapError(
                f"bootstrap peer {peer} sent a bad lane descriptor: nslots {exc}"
            ) from None
        return cls(
            node=need(d, "node", 0, 0xFFFF),
            gid=gid,
            gid_index=need(d, "gid_index", 0, 0xFFFF),
            qpn=need(d, "qpn", 1, 0xFFFFFF),
            psn=need(d, "psn", 0, 0xFFFFFF),
            mtu=need(d, "mtu", 1, 5),
            lane_addr=need(lane, "addr", 1, u64),
            lane_rkey=need(lane, "rkey", 0, u32),
            nslots=nslots,
            epoch=need(lane, "epoch", 1, u32),
            ctl_addr=need(ctl, "addr", 1, u64),
            ctl_rkey=need(ctl, "rkey", 0, u32),
        )


def _their_descriptor(ch: bootstrap.Channel) -> Descriptor:
    """The peer's descriptor; a peer of another wire version is told why (error `version`)."""
    d = ch.recv("desc").get("desc")
    problem = wire_version_problem(d, ch.peer)
    if problem is not None:
        ch.fail("version", problem)
        raise BootstrapError(problem)
    return Descriptor.from_wire(d, ch.peer)


# ---- connections --------------------------------------------------------------------------------
class Connection:
    """One peer pair on one RC queue pair: `tx` (to the peer) and `rx` (from it).

    Made by `Endpoint.connect` / `Endpoint.accept`. Closing it tells the peer (its sends stop
    with PeerDeadError, its receiver raises PeerDeadError once drained) and frees the queue
    pair and the memory regions. Closing both lanes closes it.
    """

    def __init__(self, endpoint: Endpoint, peer_node: int, peer_addr: str) -> None:
        self.endpoint = endpoint
        self.peer_node = peer_node
        self.peer_addr = peer_addr
        self.qp: Any = None
        self.ctl_mr: Any = None
        self.shadow_mr: Any = None
        self.tx: Any = None
        self.rx: Any = None
        self.remote: Descriptor | None = None
        self.psn = random.getrandbits(24)
        self._closed = False
        self._retired = False  # the peer reconnected: the rx lane moved on, QP in ERR
        self._fresh_rx = True
        self._lock = threading.Lock()

    # ---- building (Endpoint calls these during the bootstrap) ------------------------------
    def _build(self, rx: Any | None, epoch: int, nslots: int) -> Descriptor:
        ep = self.endpoint
        v = _verbs_module()
        pv = _pyverbs()
        remote_w = int(pv.enums.IBV_ACCESS_LOCAL_WRITE | pv.enums.IBV_ACCESS_REMOTE_WRITE)
        # The peer's sleeping receiver READs our published tail from the control block.
        ctl_access = remote_w | int(pv.enums.IBV_ACCESS_REMOTE_READ)
        self.ctl_mr = ep._register(v.CTL_BYTES, ctl_access, "the control block")
        self.qp = v.QueuePair(
            ep.pd,
            self.ctl_mr,
            ep.device.port,
            ep.sq_depth,
            ep.signal_every,
            ep.max_inline,
            int(ep.cq_timeout_s * 1e9),
            ep.keepalive_ms * 1_000_000,
            ep.channel,
        )
        self.qp.modify_init()
        if rx is None:
            mr = ep._register(
                nslots * 64, remote_w, f"the {nslots}-slot lane from node {self.peer_node}"
            )
            try:
                rx = v.VerbsRxLane._create(
                    f"{ep.name}<-node{self.peer_node}", mr, nslots, epoch, ep.grace_us * 1000
                )
            except BaseException:
                mr.close()
                raise
            rx.attach(self.qp)
            self._fresh_rx = True
        else:
            self._fresh_rx = False
        self.rx = rx
        self._new_epoch = epoch
        mr = rx.memory_region
        return Descriptor(
            node=ep.node,
            gid=ep.device.gid.gid,
            gid_index=ep.device.gid.index,
            qpn=self.qp.qpn,
            psn=self.psn,
            mtu=ep.device.active_mtu,
            lane_addr=mr.buf,
            lane_rkey=mr.rkey,
            nslots=rx.nslots,
            epoch=epoch,
            ctl_addr=self.ctl_mr.buf,
            ctl_rkey=self.ctl_mr.rkey,
        )

    def _connect(self, remote: Descriptor) -> None:
        ep = self.endpoint
        v = _verbs_module()
        self.remote = remote
        check_route(ep.device.gid, remote.gid, device=ep.device.name)
        self.qp.set_peer_ctl(remote.ctl_addr, remote.ctl_rkey)
        rc = self.qp.modify_rtr(
            remote.qpn,
            remote.psn,
            remote.gid,
            ep.device.gid.index,
            min(remote.mtu, ep.device.active_mtu),
            service_level=ep.service_level,
            traffic_class=ep.dscp << 2,
        )
        if rc:
            raise ConfigError(
                f"cannot route to node {remote.node} ({self.peer_addr}): ibv_modify_qp to RTR "
                f"with its GID {GidEntry(remote.gid_index, remote.gid, '?').text} from "
                f"{ep.device.name} GID {ep.device.gid.describe()} failed: [Errno {rc}] "
                f"{os.strerror(rc)}; pick a routable GID index (RDMASCHED_GID_INDEX)"
            )
        self.qp.modify_rts(self.psn, ep.qp_timeout, ep.retry_cnt)
        pv = _pyverbs()
        self.shadow_mr = ep._register(
            remote.nslots * 64,
            int(pv.enums.IBV_ACCESS_LOCAL_WRITE),
            f"the {remote.nslots}-slot shadow ring to node {remote.node}",
        )
        self.tx = v.VerbsTxLane._create(
            f"{ep.name}->node{remote.node}",
            self.qp,
            self.shadow_mr,
            remote.nslots,
            remote.epoch,
            remote.lane_addr,
            remote.lane_rkey,
            ep.node,
        )
        self.tx.timeout_ns = ep.timeout_us * 1000
        self.tx._explain = self._explain_tx
        self.tx._on_close = self._tx_closed

    def _abort(self, keep_rx: bool) -> None:
        """Undo a half-built connection (the handshake failed); a reused inbound lane stays
        with the connection it came from."""
        self._closed = True
        if self.tx is not None:
            self.tx._on_close = None
            self.tx.close()
        if self.qp is not None:
            self.qp.close()
        if self.rx is not None and not keep_rx:
            self.rx._on_close = None
            self.rx.close()
        for mr in (self.ctl_mr, self.shadow_mr):
            if mr is not None:
                mr.close()

    def _go(self, prior: Connection | None) -> None:
        """Both queue pairs are RTS: open for traffic."""
        self.rx._explain = self._explain_rx
        self.rx._on_close = self._rx_closed
        if self._fresh_rx:
            self.rx.publish()  # the first credit: the sender's epoch is accepted
        else:
            assert prior is not None
            prior._retire()  # the old sender's writes stop landing here
            self.rx.reconnect(self.qp, self._new_epoch)

    def _retire(self) -> None:
        """The peer reconnected: our lane to its old incarnation dies; the inbound lane moves
        to the new connection; this QP stays (in ERR) until the poller has switched."""
        with self._lock:
            self._retired = True
            if self.qp is not None:
                self.qp.modify_error()
                self.qp.mark_closed()
            if self.tx is not None:
                self.tx.kill()

    # ---- errors ------------------------------------------------------------------------------
    def _qp_story(self) -> str:
        f = self.qp.failure() if self.qp is not None else None
        if self._retired:
            return "it reconnected as a new incarnation (this connection was replaced)"
        if self.qp is not None and self.qp.peer_closed:
            return "it closed the connection"
        if f is None:
            return "its receiving end closed the lane"
        v = _verbs_module()
        if f["kind"] == v.FAIL_WC_ERROR:
            return (
                f"the queue pair failed: a work request completed with "
                f"'{f['wc_status_str']}' (ibv_wc_status {f['wc_status']}); the peer "
                "stopped answering (process or node gone, or the network is down)"
            )
        if f["kind"] == v.FAIL_POST_ERROR:
            return f"posting to the queue pair failed: [Errno {f['errno']}] {f['strerror']}"
        if f["kind"] == v.FAIL_SQ_TIMEOUT:
            return (
                f"no send completion within {self.endpoint.cq_timeout_s:g} s: the "
                "peer stopped acknowledging"
            )
        if f["kind"] == v.FAIL_CLOSED:
            return "the connection was closed here"
        return f"the queue pair failed ({f})"

    def _who(self) -> str:
        return f"node {self.peer_node} ({self.peer_addr})"

    def _explain_tx(self, code: int) -> str:
        return f"lane {self.tx.name!r}: peer {self._who()} is gone: {self._qp_story()}"

    def _explain_rx(self, code: int) -> str:
        v = _verbs_module()
        story = "it closed the connection" if code == v.RX_DEAD_GONE else self._qp_story()
        return (
            f"lane {self.rx.name!r}: peer {self._who()} is gone ({story}); every message "
            "that had landed was delivered"
        )

    # ---- closing ------------------------------------------------------------------------------
    def _tx_closed(self, lane: Any) -> None:
        if self.rx is None or self.rx.closed or self._retired:
            self.close()

    def _rx_closed(self, lane: Any) -> None:
        v = _verbs_module()
        if self.qp is not None and not self.qp.closed and not self._retired:
            self.qp.notify(v.CTL_RX_CLOSED)  # the peer's sender stops: PeerDeadError
        if self.tx is None or self.tx.closed:
            self.close()
        # else: the ring stays registered until the QP is gone (a late write must not hit a
        # deregistered region: that would fail the QP that our tx lane still uses)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Tell the peer, close both lanes, free the QP and the MRs. Safe twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        v = _verbs_module() if self.qp is not None else None
        if v is not None and not self._retired and not self.qp.closed:
            self.qp.notify(v.CTL_RX_CLOSED)
            self.qp.notify(v.CTL_GONE)
        if self.tx is not None:
            self.tx._on_close = None
            self.tx.close()
        # A retired connection's inbound lane lives on in the peer's new connection.
        moved = self._retired and self.rx is not None and not self.rx.closed
        if self.rx is not None and not moved and not self.rx.closed:
            self.rx._on_close = _keep_memory
            self.rx.close()
        if moved:
            # Its poller may post credits on this QP until it switches to the new sender;
            # the endpoint destroys the QP then.
            self.endpoint._retire_later(self)
            return
        self._teardown(release_ring=self.rx is not None)

    def _teardown(self, release_ring: bool) -> None:
        if self.qp is not None:
            self.qp.close()  # before the ring: no write of the peer lands in it any more
        if release_ring and self.rx is not None:
            self.rx.release_memory()
        for mr in (self.ctl_mr, self.shadow_mr):
            if mr is not None:
                mr.close()
        self.ctl_mr = self.shadow_mr = None
        self.endpoint._forget(self)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(
                f"verbs connection to node {self.peer_node} was not closed", ResourceWarning, 2
            )
            with contextlib.suppress(Exception):
                self.close()

    def stats(self) -> dict[str, Any]:
        return {
            "peer_node": self.peer_node,
            "qp_state": self.qp.query_state(),
            "tx": self.tx.vstats() if self.tx is not None else None,
            "rx": self.rx.vstats() if self.rx is not None else None,
        }


def _keep_memory(lane: Any) -> None:
    """on_close for an inbound lane whose connection frees its ring after the QP."""


class Endpoint:
    """One node on one RDMA device: its protection domain, connections and inbound lanes.

    `node` is this node's id (0..65535, stamped as `src` on every message it sends). Peers
    prove they share `token` at bootstrap. A peer that connects again with the same node id
    is a new incarnation of it: its inbound lane is kept, drained, and continues with the
    next epoch; the lane to its old incarnation dies.
    """

    def __init__(
        self,
        device: Device | str | None = None,
        node: int = 0,
        *,
        token: str | bytes,
        nslots: int = DEFAULT_NSLOTS,
        port: int = 1,
        gid_index: int | None = None,
        sq_depth: int = 512,
        signal_every: int = 64,
        max_inline: int = 256,
        grace_us: int = DEFAULT_GRACE_US,
        timeout_us: int = 1_000_000,
        keepalive_ms: int = DEFAULT_KEEPALIVE_MS,
        qp_timeout: int = DEFAULT_QP_TIMEOUT,
        retry_cnt: int = DEFAULT_RETRY_CNT,
        cq_timeout_s: float = 10.0,
        bootstrap_timeout_s: float = bootstrap.DEFAULT_TIMEOUT_S,
        service_level: int = SERVICE_LEVEL_DEFAULT,
        dscp: int = DSCP_DEFAULT,
    ) -> None:
        from rdmasched._ring import check_nslots

        if not 0 <= node <= 0xFFFF:
            raise ConfigError(f"node id must be 0..65535, not {node}")
        try:
            check_traffic_class(service_level, dscp)
        except ValueError as exc:
            raise ConfigError(f"the verbs lanes' class: {exc}") from None
        check_nslots(nslots)
        bootstrap._token_bytes(token)
        if not 1 <= signal_every <= sq_depth - 3:
            raise ConfigError(
                f"signal_every ({signal_every}) must be 1..sq_depth-3 "
                f"({sq_depth - 3}): a full send queue must hold a signalled "
                "request"
            )
        self._closed = True
        self._own_device = not isinstance(device, Device)
        self.device = (
            device if isinstance(device, Device) else Device(device, port=port, gid_index=gid_index)
        )
        if sq_depth > self.device.max_qp_wr:
            if self._own_device:
                self.device.close()
            raise ConfigError(
                f"sq_depth {sq_depth} is over {self.device.name}'s max_qp_wr "
                f"{self.device.max_qp_wr}"
            )
        self.node = node
        self.name = f"node{node}"
        self.token = token
        self.nslots = nslots
        self.sq_depth, self.signal_every, self.max_inline = sq_depth, signal_every, max_inline
        self.grace_us, self.timeout_us, self.keepalive_ms = grace_us, timeout_us, keepalive_ms
        self.qp_timeout, self.retry_cnt, self.cq_timeout_s = qp_timeout, retry_cnt, cq_timeout_s
        self.bootstrap_timeout_s = bootstrap_timeout_s
        #: every QP's class (docs/VERBS.md, "Traffic class"): the SL, and the GRH's traffic
        #: class byte, DSCP << 2 (ECN's two bits 0)
        self.service_level, self.dscp = service_level, dscp
        self._conns: dict[int, Connection] = {}
        self._retired: list[Connection] = []
        self._listener: bootstrap.Listener | None = None
        self._lock = threading.RLock()
        try:
            self.pd = _verbs_module().ProtectionDomain(self.device.context)
            # Every connection's receive CQ reports here: a VerbsLaneSet sleeps on it.
            self.channel = _verbs_module().CompletionChannel(self.device.context)
        except BaseException:
            if getattr(self, "pd", None) is not None:
                self.pd.close()
            if self._own_device:
                self.device.close()
            raise
        self._closed = False

    # ---- memory -----------------------------------------------------------------------------
    def _register(self, length: int, access: int, what: str) -> Any:
        try:
            mr = self.pd.register(length, access)
        except DeviceError as exc:
            err = exc.errno_value
            if err in (_errno.ENOMEM, _errno.EAGAIN, _errno.EPERM):
                raise DeviceError(
                    f"registering {length} bytes for {what} failed: {exc}. Registered memory "
                    f"is locked memory: {memlock_note()}; raise it with `ulimit -l unlimited` "
                    "(or LimitMEMLOCK= in a systemd unit, memlock in "
                    "/etc/security/limits.conf)"
                ) from exc
            raise DeviceError(f"registering {length} bytes for {what} failed: {exc}") from exc
        if mr.buf % 64:
            mr.close()
            raise DeviceError(f"registered buffer for {what} is not 64-byte aligned")
        return mr

    # ---- bootstrap ----------------------------------------------------------------------------
    def listen(self, host: str = "127.0.0.1", port: int = 0) -> bootstrap.Listener:
        """Start accepting bootstrap connections on host:port (0: any free port).

        The listener authenticates connections in the background from now on; its
        `stats()` counts the ones that failed (docs/VERBS.md, "Deadlines and hostile
        connections")."""
        self._check_open()
        if self._listener is None:
            self._listener = bootstrap.Listener(
                host, port, token=self.token, node=self.node, timeout_s=self.bootstrap_timeout_s
            )
        return self._listener

    def accept(self, timeout_s: float | None = None, *, nslots: int | None = None) -> Connection:
        """Wait for the next peer that passes the bootstrap handshake on `listen()`'s socket;
        the connection. Connections that fail the handshake (garbage, a wrong token, too
        slow) are logged and counted by the listener, never an error here."""
        self._check_open()
        if self._listener is None:
            raise ConfigError("call listen() before accept()")
        ch = self._listener.accept(timeout_s)
        with ch:
            return self._establish(ch, initiator=False, nslots=nslots or self.nslots)

    def connect(
        self,
        host: str,
        port: int,
        *,
        nslots: int | None = None,
        timeout_s: float | None = None,
        connect_timeout_s: float = 2.0,
        attempts: int = 5,
    ) -> Connection:
        """Connect to a peer's bootstrap listener; the connection."""
        self._check_open()
        ch = bootstrap.dial(
            host,
            port,
            token=self.token,
            node=self.node,
            timeout_s=timeout_s or self.bootstrap_timeout_s,
            connect_timeout_s=connect_timeout_s,
            attempts=attempts,
        )
        with ch:
            return self._establish(ch, initiator=True, nslots=nslots or self.nslots)

    def _establish(self, ch: bootstrap.Channel, *, initiator: bool, nslots: int) -> Connection:
        peer = ch.peer_node
        if peer == self.node:
            ch.fail("node", f"both ends claim node id {peer}")
            raise BootstrapError(f"bootstrap peer {ch.peer} has our node id {peer}")
        with self._lock:
            self._maintain()
            prior = self._conns.get(peer)
            reuse = (
                prior.rx
                if (
                    prior is not None
                    and prior.rx is not None
                    and not prior.rx.closed
                    and not prior._retired
                )
                else None
            )
            epoch = 1
            if reuse is not None:
                epoch = max(int(reuse.epoch), int(reuse.pending_epoch)) + 1
                if epoch > 0xFFFFFFFF:
                    epoch = 2  # 1 means "a new lane" (accepted in advance), never a reuse
            conn = Connection(self, peer, ch.peer)
            try:
                local = conn._build(reuse, epoch, nslots)
                if initiator:
                    ch.send({"t": "desc", "desc": local.to_wire()})
                    remote = _their_descriptor(ch)
                else:
                    remote = _their_descriptor(ch)
                    ch.send({"t": "desc", "desc": local.to_wire()})
                if remote.node != peer:
                    raise BootstrapError(
                        f"bootstrap peer {ch.peer}: descriptor of node "
                        f"{remote.node}, handshake said {peer}"
                    )
                conn._connect(remote)
                if initiator:
                    ch.send({"t": "up"})
                    ch.recv("up")
                else:
                    ch.recv("up")
                    ch.send({"t": "up"})
            except RdmaschedError as exc:
                if not isinstance(exc, BootstrapError):
                    ch.fail("setup", str(exc))
                conn._abort(keep_rx=reuse is not None)
                raise
            except BaseException:
                conn._abort(keep_rx=reuse is not None)
                raise
            conn._go(prior)
            self._conns[peer] = conn
            if prior is not None:
                # The old incarnation's connection: its QP stops (ERR), its lane to the peer
                # stays open but dead (sends raise PeerDeadError saying why) until closed;
                # the QP, CQ and memory go once the inbound lane has switched.
                if not prior._retired:
                    prior._retire()
                self._retire_later(prior)
            return conn

    # ---- bookkeeping --------------------------------------------------------------------------
    def _retire_later(self, conn: Connection) -> None:
        with self._lock:
            if conn not in self._retired:
                self._retired.append(conn)
            self._conns = {k: c for k, c in self._conns.items() if c is not conn}
        self._maintain()

    def _maintain(self) -> None:
        """Destroy retired queue pairs that no inbound lane posts on any more (its poller
        switched to the reconnected sender, or the lane was closed)."""
        with self._lock:
            keep = []
            for old in self._retired:
                cur = self._conns.get(old.peer_node)
                used = (
                    cur is not None
                    and cur.rx is old.rx
                    and not cur.rx.closed
                    and cur.rx.queue_pair is old.qp
                )
                if used and cur is not None:
                    cur.rx.promote()
                    used = cur.rx.queue_pair is old.qp
                if used:
                    keep.append(old)
                else:
                    old._teardown(release_ring=False)
            self._retired = keep

    def _forget(self, conn: Connection) -> None:
        with self._lock:
            if self._conns.get(conn.peer_node) is conn:
                del self._conns[conn.peer_node]

    def connections(self) -> list[Connection]:
        return list(self._conns.values())

    def _check_open(self) -> None:
        if self._closed:
            raise DeviceError(f"endpoint {self.name} is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close every connection, then the protection domain, then (if it opened it) the
        device. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._conns.values())
            retired = list(self._retired)
        for c in conns:
            c.close()
        for c in retired + [c for c in self._retired if c not in retired]:
            c._closed = True
            if c.tx is not None and not c.tx.closed:
                c.tx._on_close = None
                c.tx.close()
            c._teardown(release_ring=False)
        self._retired = []
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.channel.close()
        self.pd.close()
        if self._own_device:
            self.device.close()

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(f"verbs endpoint {self.name} was not closed", ResourceWarning, 2)
            with contextlib.suppress(Exception):
                self.close()
