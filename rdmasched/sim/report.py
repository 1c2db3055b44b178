"""`rdmasched sim`'s output: the table, the JSON document, the plot, the calibration."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rdmasched.errors import ArgumentError
from rdmasched.sim.linkmodel import preset
from rdmasched.sim.run import SimConfig, simulate

COLUMNS: list[tuple[str, str, str]] = [
    ("scheduler", "scheduler", "{}"),
    ("nodes", "N", "{}"),
    ("steps", "steps", "{}"),
    ("slot_idle_pct", "idle %", "{:.2f}"),
    ("device_idle_pct", "dev idle %", "{:.2f}"),
    ("step_time_ms", "step ms", "{:.3f}"),
    ("vs_exclusive.step_time_x", "x excl", "{:.2f}"),
    ("vs_rdmasched.step_time_x", "x rdms", "{:.2f}"),
    ("background_tasks_per_node_per_s", "bg/node/s", "{:.0f}"),
    ("steps_per_s", "steps/s", "{:.1f}"),
    ("sync_release_p50_us", "rel p50 us", "{:.1f}"),
    ("sync_release_p99_us", "rel p99 us", "{:.1f}"),
    ("msgs_per_node_per_step", "msgs/node/step", "{:.1f}"),
    ("lane_writes_per_node_per_step", "writes/node/step", "{:.1f}"),
    ("lanes_per_node", "lanes/node", "{}"),
    ("ring_bytes_per_node", "ring KiB/node", "{}"),
    ("decisions_per_node_per_s", "dec/node/s", "{:.0f}"),
    ("events_per_s", "events/s", "{}"),
    ("wall_s", "wall s", "{:.1f}"),
]


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    v: Any = row
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    if v is None:
        return "-"
    if key == "ring_bytes_per_node":
        return f"{v / 1024:.0f}"
    return fmt.format(v)


#: the rows every row is compared with, at its size: `exclusive` (what users run for
#: training today, the headline's reference) and rdmasched
REFERENCES = ("exclusive", "rdmasched")


def compare(rows: Sequence[dict[str, Any]]) -> None:
    """Each row against the reference rows at its size (if they ran and have a step time),
    as `vs_exclusive` and `vs_rdmasched`: step time as a multiple of the reference's, idle
    % as points above it, and the background tasks done as a multiple of the reference's
    (None when it did none)."""
    for ref in REFERENCES:
        base = {r["nodes"]: r for r in rows if r["scheduler"] == ref}
        for r in rows:
            b = base.get(r["nodes"])
            if b is None or r.get("step_time_ms") is None or not b.get("step_time_ms"):
                continue
            bg, bg_ref = r.get("background_tasks_done"), b.get("background_tasks_done")
            r[f"vs_{ref}"] = {
                "step_time_x": r["step_time_ms"] / b["step_time_ms"],
                "idle_pct_points": r["slot_idle_pct"] - b["slot_idle_pct"],
                "background_x": bg / bg_ref if bg is not None and bg_ref else None,
            }


def format_table(rows: Sequence[dict[str, Any]], not_run: Sequence[dict[str, Any]] = ()) -> str:
    head = [c[1] for c in COLUMNS]
    body = [[_cell(r, k, f) for k, _, f in COLUMNS] for r in rows]
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)
    ]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    for r, b in zip(rows, body, strict=True):
        line = "  ".join(c.rjust(w) for c, w in zip(b, widths, strict=True))
        notes = []
        if not r.get("finished", True):
            notes.append(r.get("stopped", "did not finish"))
        if r.get("killed"):
            notes.append(f"killed {len(r['killed'])}")
        if r.get("rejected"):
            notes.append(f"{r['rejected']} inputs rejected")
        lines.append(line + (f"  ({'; '.join(notes)})" if notes else ""))
    for r in not_run:
        lines.append(f"{r['scheduler']} at {r['nodes']} nodes: not run ({r['why']})")
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], path: str) -> None:
    """Idle % and step time against N, one line per scheduler (matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ArgumentError(
            "--plot needs matplotlib: pip install 'rdmasched[sim]' (or matplotlib)"
        ) from None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for sched in dict.fromkeys(r["scheduler"] for r in rows):
        pts = sorted(
            (r["nodes"], r["slot_idle_pct"], r["step_time_ms"])
            for r in rows
            if r["scheduler"] == sched and r["step_time_ms"] is not None
        )
        if not pts:
            continue
        xs = [p[0] for p in pts]
        a1.plot(xs, [p[1] for p in pts], marker="o", label=sched)
        a2.plot(xs, [p[2] for p in pts], marker="o", label=sched)
    for ax, title in ((a1, "slot idle %"), (a2, "step time (ms)")):
        ax.set_xscale("log")
        ax.set_xlabel("nodes")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    a2.set_yscale("log")
    fig.suptitle("rdmasched sim")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise ArgumentError(f"--plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def demo_cluster(n: int, full_mesh: bool = False) -> tuple[int | None, int, int]:
    """What `rdmasched demo --nodes n` runs by default: (nodes per leaf, None for a full
    mesh; heartbeat ms; dead-after ms). The calibration gives the simulator the same."""
    from rdmasched.demo import defaults

    hb, dead = defaults.liveness(n)
    return defaults.leaf(n, full_mesh=full_mesh), hb, dead


def calibrate(
    base: SimConfig,
    sizes: Sequence[int],
    real: Callable[[int], dict[str, Any]],
    progress: Callable[[str], None] | None = None,
    full_mesh: bool = False,
) -> list[dict[str, Any]]:
    """At each size: the simulator with the shm link model and a real `rdmasched demo`
    (both schedulers), side by side; the difference in % of the real figure. The simulated
    cluster is the demo's (`demo_cluster`): its topology (leaves of 8 unless `full_mesh`)
    and its liveness settings, which `real` must run too."""
    out = []
    shm = preset("shm")
    for n in sizes:
        leaf, hb, dead = demo_cluster(n, full_mesh)
        load_before = os.getloadavg()[0]
        demo = real(n)
        # the host's 1-minute load average around the real run: the real figures depend on it
        load = (round(load_before, 2), round(os.getloadavg()[0], 2))
        for sched, key in (("rdmasched", "rdmasched"), ("central", "central")):
            if progress:
                progress(f"sim {sched} at {n} nodes")
            cfg = replace(
                base,
                nodes=n,
                scheduler=sched,
                links=shm,
                full_mesh=leaf is None,
                leaf=leaf or base.leaf,
                heartbeat_ms=hb,
                dead_after_ms=dead,
            )
            sim = simulate(cfg)
            r = demo[key]
            steps = max(1, base.workload.steps)
            # messages per step: every write on a lane (a relayed message once per hop), as
            # the demo's nodes count what they write; and the same without heartbeats, whose
            # number per step grows with the step's wall time, not with the steps
            sim_hb = sim["msgs_by_kind"].get("HEARTBEAT", 0)
            sim_hb += sim.get("relays_by_kind", {}).get("HEARTBEAT", 0)
            sim_w = sim.get("lane_writes", sim["msgs"]) / steps
            real_per_node, kinds = r.get("msgs_per_node_step"), r.get("msgs_per_node_step_by_kind")
            real_w = real_per_node * n if real_per_node is not None else None
            real_hb = kinds.get("HEARTBEAT", 0.0) * n if isinstance(kinds, dict) else None
            row: dict[str, Any] = {
                "nodes": n,
                "scheduler": sched,
                "links": "full mesh" if leaf is None else f"leaves of {leaf}",
                "heartbeat_ms": hb,
                "dead_after_ms": dead,
                "sim_finished": sim["finished"],
                "loadavg_before_after_real": load,
            }
            if sched == "rdmasched":  # the same cluster on both sides: the same lanes
                row["sim_lanes_per_node"] = sim.get("lanes_per_node")
                row["real_lanes_per_node"] = r.get("lanes_max")
            for name, s_val, r_val in (
                ("step_time_ms", sim["step_time_ms"], r.get("step_time_ms")),
                ("slot_idle_pct", sim["slot_idle_pct"], r.get("slot_idle_pct")),
                ("msgs_per_step", sim_w, real_w),
                (
                    "msgs_per_step_no_hb",
                    sim_w - sim_hb / steps,
                    real_w - real_hb if real_w is not None and real_hb is not None else None,
                ),
            ):
                row[f"sim_{name}"] = s_val
                row[f"real_{name}"] = r_val
                row[f"diff_{name}_pct"] = (
                    100.0 * (s_val - r_val) / r_val if s_val is not None and r_val else None
                )
            out.append(row)
    return out


def format_calibration(rows: Sequence[dict[str, Any]]) -> str:
    head = f"{'N':>3}  {'scheduler':<9}  {'figure':<19}  {'sim':>10}  {'real':>10}  {'diff %':>7}"
    lines = [head]
    for r in rows:
        if r.get("links") and r["scheduler"] == "rdmasched":
            lines.append(
                f"{r['nodes']:>3}  nodes in {r['links']}, heartbeat {r['heartbeat_ms']} ms, "
                f"dead after {r['dead_after_ms']} ms (both sides); load average before/after "
                f"the real run {r['loadavg_before_after_real']}"
            )
        for name in ("step_time_ms", "slot_idle_pct", "msgs_per_step", "msgs_per_step_no_hb"):
            s, x, d = r[f"sim_{name}"], r[f"real_{name}"], r[f"diff_{name}_pct"]
            flag = "  > 15%" if d is not None and abs(d) > 15 else ""
            lines.append(
                f"{r['nodes']:>3}  {r['scheduler']:<9}  {name:<19}  "
                f"{_num(s):>10}  {_num(x):>10}  {_num(d):>7}{flag}"
            )
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"
