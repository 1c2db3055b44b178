"""`rdmasched sim`'s output: the table, the JSON document, the plot, the calibration."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rdmasched.errors import ArgumentError
from rdmasched.sim.hostmodel import FREE, HostModel
from rdmasched.sim.linkmodel import preset
from rdmasched.sim.run import SimConfig, simulate
from rdmasched.sim.table import cell, text_table

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
    if key == "ring_bytes_per_node" and row.get(key) is not None:
        return f"{row[key] / 1024:.0f}"
    return cell(row, key, fmt)


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
    notes = []
    for r in rows:
        why = []
        if not r.get("finished", True):
            why.append(r.get("stopped", "did not finish"))
        if r.get("killed"):
            why.append(f"killed {len(r['killed'])}")
        if r.get("rejected"):
            why.append(f"{r['rejected']} inputs rejected")
        notes.append(f"  ({'; '.join(why)})" if why else "")
    lines = [text_table(head, body, notes)]
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


#: what a calibration keeps of a real demo run (per scheduler)
REAL_KEYS = (
    "step_time_ms",
    "slot_idle_pct",
    "msgs_per_node_step",
    "msgs_per_node_step_by_kind",
    "lanes_max",
    "host",
)
#: the figures a calibration compares, and the ones a host model is fitted and scored on
FIGURES = (
    "step_time_ms",
    "slot_idle_pct",
    "msgs_per_step",
    "msgs_per_step_no_hb",
    "cpu_ms_per_step",
    "preemptions_per_step",
)
SCORED = ("step_time_ms", "slot_idle_pct", "msgs_per_step", "cpu_ms_per_step")


def real_runs(
    sizes: Sequence[int], real: Callable[[int], dict[str, Any]], rounds: int = 1
) -> dict[int, dict[str, Any]]:
    """A real `rdmasched demo` run at each size, one after the other (nothing of the
    calibration's own runs beside them), `rounds` times over, interleaved (4, 8, ..., 4,
    8, ...: this host's speed drifts from minute to minute, so each size sees the same
    drift): what the calibration compares of each scheduler (REAL_KEYS), each figure the
    median over the rounds, every round's record kept (`rounds`), and the host's 1-minute
    load average before the first and after the last run of each size."""
    if rounds < 1:
        raise ArgumentError(f"calibration rounds must be >= 1, not {rounds}")
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for _ in range(rounds):
        for n in sizes:
            before = os.getloadavg()[0]
            demo = real(n)
            runs[n].append({"load": (round(before, 2), round(os.getloadavg()[0], 2))} | {
                k: {x: demo[k].get(x) for x in REAL_KEYS} for k in ("rdmasched", "central")
            })  # fmt: skip
    out: dict[int, dict[str, Any]] = {}
    for n, rs in runs.items():
        med = {k: _median_of([r[k] for r in rs]) for k in ("rdmasched", "central")}
        load = (rs[0]["load"][0], rs[-1]["load"][1])
        out[n] = {"load": load, **med} | ({"rounds": rs} if rounds > 1 else {})
    return out


def _median_of(xs: list[Any]) -> Any:
    """The median of records alike: of numbers, the median (the upper of the middle two);
    of dicts, key by key; anything else, the first's."""
    first = xs[0]
    if isinstance(first, dict):
        return {
            k: _median_of([x.get(k) if isinstance(x, dict) else None for x in xs]) for k in first
        }
    nums = [x for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool)]
    if len(nums) != len(xs):
        return first
    return sorted(nums)[len(nums) // 2]


def reals_from(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The real runs of an earlier `rdmasched sim --calibrate --json` document."""
    out: dict[int, dict[str, Any]] = {}
    try:
        for row in doc["calibration"]:
            n = int(row["nodes"])
            r = out.setdefault(n, {"load": tuple(row["loadavg_before_after_real"])})
            r[row["scheduler"]] = {x: row["real"].get(x) for x in REAL_KEYS}
    except (KeyError, TypeError, ValueError) as exc:
        raise ArgumentError(
            f"not a calibration document with its real runs (rdmasched sim --calibrate "
            f"--json): {exc!r}"
        ) from None
    return out


def _sim_config(base: SimConfig, n: int, sched: str, full_mesh: bool) -> SimConfig:
    leaf, hb, dead = demo_cluster(n, full_mesh)
    return replace(
        base,
        nodes=n,
        scheduler=sched,
        links=preset("shm"),
        full_mesh=leaf is None,
        leaf=leaf or base.leaf,
        heartbeat_ms=hb,
        dead_after_ms=dead,
    )


def _figures(sim: dict[str, Any], steps: int) -> dict[str, float | None]:
    """The simulated side of a calibration row: messages per step are every write on a
    lane (a relayed message once per hop), as the demo's nodes count what they write; and
    the same without heartbeats, whose number per step grows with the step's wall time,
    not with the steps."""
    hb = sim["msgs_by_kind"].get("HEARTBEAT", 0) + sim.get("relays_by_kind", {}).get("HEARTBEAT", 0)
    w = sim.get("lane_writes", sim["msgs"]) / steps
    host = sim.get("host_model")
    return {
        "step_time_ms": sim["step_time_ms"],
        "slot_idle_pct": sim["slot_idle_pct"],
        "msgs_per_step": w,
        "msgs_per_step_no_hb": w - hb / steps,
        # the host's CPU busy per step (handling and spinning): only a host model has one
        "cpu_ms_per_step": host["cpu_ms"] / steps if host else None,
        # turns cut by the slice, beside the real run's involuntary context switches
        "preemptions_per_step": host["preemptions"] / steps if host else None,
    }


def _real_figures(r: dict[str, Any], n: int) -> dict[str, float | None]:
    per_node, kinds = r.get("msgs_per_node_step"), r.get("msgs_per_node_step_by_kind")
    w = per_node * n if per_node is not None else None
    hb = kinds.get("HEARTBEAT", 0.0) * n if isinstance(kinds, dict) else None
    host = r.get("host")
    return {
        "step_time_ms": r.get("step_time_ms"),
        "slot_idle_pct": r.get("slot_idle_pct"),
        "msgs_per_step": w,
        "msgs_per_step_no_hb": w - hb if w is not None and hb is not None else None,
        # every process's CPU time per step (recorded since the demo measures it)
        "cpu_ms_per_step": host.get("cpu_ms_per_step") if isinstance(host, dict) else None,
        "preemptions_per_step": host.get("involuntary_switches_per_step")
        if isinstance(host, dict)
        else None,
    }


def _diff(s: float | None, r: float | None) -> float | None:
    return 100.0 * (s - r) / r if s is not None and r else None


def calibrate(
    base: SimConfig,
    sizes: Sequence[int],
    real: Callable[[int], dict[str, Any]] | dict[int, dict[str, Any]],
    progress: Callable[[str], None] | None = None,
    full_mesh: bool = False,
    fitted_on: Sequence[int] = (),
    plain: bool = True,
) -> list[dict[str, Any]]:
    """At each size: the simulator with the shm link model beside a real `rdmasched demo`
    (both schedulers); the difference in % of the real figure. `real` runs the demo at a
    size, or holds the real runs already made (`real_runs`, `reals_from`). The simulated
    cluster is the demo's (`demo_cluster`): its topology (leaves of 8 unless `full_mesh`)
    and its liveness settings, which `real` must run too. With a host model in `base`
    the simulator runs with it and, beside it, without (`plain_sim_*`); `fitted_on`: the
    sizes whose real runs its free parameters were fitted on (each row says if it is one);
    `plain` False: not the run without it."""
    reals = real if isinstance(real, dict) else real_runs(sizes, real)
    steps = max(1, base.workload.steps)
    out = []
    for n in sizes:
        leaf, hb, dead = demo_cluster(n, full_mesh)
        rn = reals[n]
        for sched in ("rdmasched", "central"):
            if progress:
                progress(f"sim {sched} at {n} nodes")
            cfg = _sim_config(base, n, sched, full_mesh)
            sim = simulate(cfg)
            r = rn[sched]
            row: dict[str, Any] = {
                "nodes": n,
                "scheduler": sched,
                "links": "full mesh" if leaf is None else f"leaves of {leaf}",
                "heartbeat_ms": hb,
                "dead_after_ms": dead,
                "sim_finished": sim["finished"],
                "loadavg_before_after_real": list(rn["load"]),
                "real": r,
            }
            if "rounds" in rn:  # the medians' rounds, each as it was
                row["real_rounds"] = [
                    _real_figures(x[sched], n) | {"load": list(x["load"])} for x in rn["rounds"]
                ]
            if sched == "rdmasched":  # the same cluster on both sides: the same lanes
                row["sim_lanes_per_node"] = sim.get("lanes_per_node")
                row["real_lanes_per_node"] = r.get("lanes_max")
            sim_f, real_f = _figures(sim, steps), _real_figures(r, n)
            for name in FIGURES:
                row[f"sim_{name}"] = sim_f[name]
                row[f"real_{name}"] = real_f[name]
                row[f"diff_{name}_pct"] = _diff(sim_f[name], real_f[name])
            if base.host_model is not None:
                row["host_model"] = sim.get("host_model")
                row["fitted_on"] = n in fitted_on
            if base.host_model is not None and plain:
                plain_f = _figures(simulate(replace(cfg, host_model=None)), steps)
                for name in FIGURES:
                    row[f"plain_sim_{name}"] = plain_f[name]
                    row[f"plain_diff_{name}_pct"] = _diff(plain_f[name], real_f[name])
            out.append(row)
    return out


def score(rows: Sequence[dict[str, Any]], sizes: Sequence[int] | None = None) -> float:
    """The mean |difference| (% of the real figure) over the rows at `sizes` (None: all),
    both schedulers, the figures a host model is fitted on (SCORED)."""
    errs = [
        abs(r[f"diff_{name}_pct"])
        for r in rows
        if sizes is None or r["nodes"] in sizes
        for name in SCORED
        if r.get(f"diff_{name}_pct") is not None
    ]
    return sum(errs) / len(errs) if errs else math.inf


#: the values `fit_host_model` tries for each free parameter, us
FIT_GRID: dict[str, tuple[float, ...]] = {
    "msg_us": (2, 5, 10, 20, 30, 40, 60),
    "timer_us": (2, 5, 10, 20, 30, 40, 60),
    "post_us": (2, 5, 10, 20, 30, 40),
    "switch_us": (0, 10, 20, 40),
    "pass_us": (0, 10, 20, 40),
    "cold_us": (0, 5, 10, 15, 20, 30, 40),
    "cache_turns": (8, 12, 16, 20, 24, 28),
    "slice_us": (0, 250, 500, 1000, 2000, 4000),
    "wake_pct": (90, 95, 99, 100),
}


def fit_host_model(
    base: SimConfig,
    reals: dict[int, dict[str, Any]],
    sizes: Sequence[int],
    full_mesh: bool = False,
    rounds: int = 2,
    progress: Callable[[str], None] | None = None,
) -> tuple[HostModel, float, list[dict[str, Any]]]:
    """The host model's free parameters (FIT_GRID) fitted on the real runs at `sizes`: one
    parameter at a time, each set to the value of its grid that gives the lowest `score`
    at those sizes with the others held, `rounds` times over. Returns the model, its
    score there and every model tried (its parameters and score)."""
    hm = base.host_model
    if hm is None:
        raise ArgumentError("fitting needs a host model (--host-model)")
    tried: dict[tuple[float, ...], float] = {}

    def cost(m: HostModel) -> float:
        key = tuple(m.free().values())
        if key not in tried:
            rows = calibrate(
                replace(base, host_model=m), sizes, reals, full_mesh=full_mesh, plain=False
            )
            tried[key] = score(rows)
            if progress:
                progress(f"fit: {m.free()} -> {tried[key]:.1f}%")
        return tried[key]

    best = cost(hm)
    for _ in range(rounds):
        moved = False
        for key in FREE:
            for v in FIT_GRID[key]:
                m = hm.with_free(key, v)
                c = cost(m)
                if c < best - 1e-9:
                    hm, best, moved = m, c, True
        if not moved:
            break
    log = [dict(zip(FREE, k, strict=True)) | {"score_pct": v} for k, v in tried.items()]
    return hm, best, log


def format_calibration(rows: Sequence[dict[str, Any]]) -> str:
    """The calibration as a table; with a host model, the simulator without it beside it,
    and whether each size's real run was one the model was fitted on."""
    host = any("plain_sim_step_time_ms" in r for r in rows)
    head = f"{'N':>3}  {'scheduler':<9}  {'figure':<19}  {'sim':>10}  {'real':>10}  {'diff %':>7}"
    if host:
        head += f"  {'no host model':>13}  {'diff %':>7}"
    lines = [head]
    for r in rows:
        if r.get("links") and r["scheduler"] == "rdmasched":
            fit = ""
            if host:
                fit = "; fitted on this run" if r.get("fitted_on") else "; not fitted on it"
            lines.append(
                f"{r['nodes']:>3}  nodes in {r['links']}, heartbeat {r['heartbeat_ms']} ms, "
                f"dead after {r['dead_after_ms']} ms (both sides); load average before/after "
                f"the real run {r['loadavg_before_after_real']}{fit}"
            )
        for name in FIGURES:
            s, x, d = r[f"sim_{name}"], r[f"real_{name}"], r[f"diff_{name}_pct"]
            flag = "  > 15%" if d is not None and abs(d) > 15 else ""
            line = (
                f"{r['nodes']:>3}  {r['scheduler']:<9}  {name:<19}  "
                f"{_num(s):>10}  {_num(x):>10}  {_num(d):>7}"
            )
            if host:
                p, pd = r.get(f"plain_sim_{name}"), r.get(f"plain_diff_{name}_pct")
                line += f"  {_num(p):>13}  {_num(pd):>7}"
            lines.append(line + flag)
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"
