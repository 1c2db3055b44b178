"""`rdmasched doctor`: can this machine run the verbs transport, and if not, why not.

Lists the RDMA devices, their ports, states and GIDs with their types (pyverbs, one GID-table
call per device: never a walk over the 1024 sysfs GID entries), whether the verbs extension
is built, and whether Soft-RoCE is usable here. Exit code 0 if a usable ACTIVE port exists
(ACTIVE, a GID rdmasched would route by, and the verbs extension built), else 1.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["diagnose", "main", "render"]

SYSFS_IB = "/sys/class/infiniband"


def _kernel_rxe(release: str, sys_module: str, modules_root: str) -> tuple[str, str]:
    """('loaded' | 'available' | 'missing', explanation) for the rdma_rxe module."""
    if os.path.isdir(os.path.join(sys_module, "rdma_rxe")):
        return "loaded", "rdma_rxe is loaded"
    mdir = os.path.join(modules_root, release)
    if not os.path.isdir(mdir):
        return "missing", (
            f"this kernel ({release}) has no modules directory ({mdir}): "
            "rdma_rxe cannot be loaded here"
        )
    for name in ("modules.builtin", "modules.dep"):
        try:
            with open(os.path.join(mdir, name)) as f:
                for line in f:
                    if "/rdma_rxe.ko" in line.split(":", 1)[0]:
                        return "available", f"rdma_rxe is available ({name}); not loaded"
        except OSError:
            continue
    return "missing", f"this kernel ({release}) has no rdma_rxe module (not in {mdir})"


def diagnose(
    sysfs_ib: str = SYSFS_IB,
    sys_module: str = "/sys/module",
    modules_root: str = "/lib/modules",
    release: str | None = None,
) -> dict[str, Any]:
    """Everything `rdmasched doctor` prints, as a dict (its --json)."""
    from rdmasched.transport import verbs

    rel = release or os.uname().release
    rep: dict[str, Any] = {
        "kernel": rel,
        "devices": [],
        "problems": [],
        "usable": False,
        "usable_port": None,
    }
    problems: list[str] = rep["problems"]

    try:
        from rdmasched import _verbs  # noqa: F401

        rep["verbs_extension"] = {"built": True}
    except ImportError as exc:
        rep["verbs_extension"] = {"built": False, "why": str(exc)}
        problems.append(
            f"the verbs extension rdmasched._verbs is not built ({exc}): install "
            "libibverbs-dev, then `python setup.py build_ext --inplace`"
        )
    try:
        import pyverbs  # noqa: F401

        rep["pyverbs"] = True
    except ImportError:
        rep["pyverbs"] = False
        problems.append("pyverbs is not installed: apt-get install python3-pyverbs")

    rxe, rxe_note = _kernel_rxe(rel, sys_module, modules_root)
    rep["rdma_rxe"] = {"state": rxe, "note": rxe_note}
    rep["memlock"] = verbs.memlock_note()
    rep["sysfs"] = os.path.isdir(sysfs_ib)
    if not rep["sysfs"]:
        problems.append(
            f"no {sysfs_ib}: this kernel has no RDMA support loaded (no RDMA device, no rdma_rxe)"
        )
        if rxe == "missing":
            problems.append(rxe_note)
        elif rxe == "available":
            problems.append("load it and create a device: soft-roce-setup.sh up")
    uverbs = (
        sorted(e for e in os.listdir("/dev/infiniband") if e.startswith("uverbs"))
        if os.path.isdir("/dev/infiniband")
        else []
    )
    rep["uverbs"] = uverbs

    if rep["sysfs"] and rep["pyverbs"]:
        names = verbs.list_devices()
        if not names:
            problems.append(f"{sysfs_ib} lists no device: create one with soft-roce-setup.sh up")
        for name in names:
            rep["devices"].append(_device(name, rep))
        if names and not uverbs:
            problems.append("no /dev/infiniband/uverbs*: user-space verbs cannot open the device")
    if rep["usable_port"] is None and rep["devices"]:
        problems.append(
            "no ACTIVE port with a routable GID (see the ports above); "
            "`soft-roce-setup.sh status` tells more"
        )
    rep["usable"] = rep["usable_port"] is not None and rep["verbs_extension"]["built"]
    if not rep["usable"]:
        problems.append("to run the verbs tier here anyway, use the VM: tests/vm/run-in-vm.sh")
    return rep


def _device(name: str, rep: dict[str, Any]) -> dict[str, Any]:
    import pyverbs.device as pd  # deferred: only where pyverbs exists

    from rdmasched.errors import RdmaschedError
    from rdmasched.transport import verbs

    out: dict[str, Any] = {"name": name, "ports": []}
    try:
        ctx = pd.Context(name=name)
    except Exception as exc:
        out["error"] = f"cannot open: {exc}"
        rep["problems"].append(f"{name}: cannot open ({exc})")
        return out
    try:
        attr = ctx.query_device()
        nports = int(attr.phys_port_cnt)
        out["max_qp_wr"] = int(attr.max_qp_wr)
        for port in range(1, nports + 1):
            pa = ctx.query_port(port)
            state = verbs.PORT_STATES.get(int(pa.state), str(pa.state))
            link = "InfiniBand" if int(pa.link_layer) == 1 else "Ethernet"
            gids = verbs.read_gids(ctx, port, int(pa.gid_tbl_len), nports)
            p: dict[str, Any] = {
                "port": port,
                "state": state,
                "link_layer": link,
                "active_mtu": verbs.MTU_BYTES.get(int(pa.active_mtu), 0),
                "gids": [
                    {
                        "index": g.index,
                        "gid": g.text,
                        "type": g.type,
                        "ipv4": g.ipv4,
                        "netdev": g.netdev,
                    }
                    for g in gids
                ],
                "default_gid_index": None,
            }
            try:
                p["default_gid_index"] = verbs.choose_gid(
                    gids, None, device=name, port=port, link_layer=link
                ).index
            except RdmaschedError as exc:
                p["gid_problem"] = str(exc)
            if (
                state == "ACTIVE"
                and p["default_gid_index"] is not None
                and rep["usable_port"] is None
            ):
                rep["usable_port"] = {
                    "device": name,
                    "port": port,
                    "gid_index": p["default_gid_index"],
                }
            out["ports"].append(p)
    finally:
        ctx.close()
    return out


def render(rep: dict[str, Any]) -> str:
    ext = rep["verbs_extension"]
    lines = [
        "rdmasched doctor",
        f"  kernel          {rep['kernel']}",
        f"  rdma_rxe        {rep['rdma_rxe']['note']}",
        f"  pyverbs         {'yes' if rep['pyverbs'] else 'NOT installed'}",
        f"  verbs extension {'built' if ext['built'] else 'NOT built: ' + ext.get('why', '')}",
        f"  memlock         {rep['memlock']}",
        f"  {SYSFS_IB:<15} {'present' if rep['sysfs'] else 'absent'}",
        f"  uverbs          {', '.join(rep['uverbs']) or 'none'}",
    ]
    if not rep["devices"]:
        lines.append("  RDMA devices    none")
    for d in rep["devices"]:
        lines.append(f"  device {d['name']}" + (f": {d['error']}" if "error" in d else ""))
        for p in d["ports"]:
            lines.append(
                f"    port {p['port']}: {p['state']}, {p['link_layer']}, "
                f"active MTU {p['active_mtu']}"
            )
            for g in p["gids"]:
                mark = "   <- default" if g["index"] == p["default_gid_index"] else ""
                dev = f" on {g['netdev']}" if g["netdev"] else ""
                lines.append(f"      GID [{g['index']}] {g['gid']} ({g['type']}{dev}){mark}")
            if "gid_problem" in p:
                lines.append(f"      {p['gid_problem']}")
    if rep["usable"]:
        u = rep["usable_port"]
        lines.append(f"  usable: yes: {u['device']} port {u['port']}, GID index {u['gid_index']}")
    else:
        lines.append("  usable: NO, because:")
        lines += [f"    - {p}" for p in rep["problems"]]
    return "\n".join(lines)


def main(as_json: bool = False) -> int:
    rep = diagnose()
    print(json.dumps(rep, indent=2) if as_json else render(rep))
    return 0 if rep["usable"] else 1
