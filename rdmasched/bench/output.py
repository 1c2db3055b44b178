"""What `rdmasched bench latency` writes besides its table: CSV, an HdrHistogram log, a plot,
and the run's description (version, configuration, machine, commit) that every JSON carries
(`run_info`; `bench all` writes the machine and the commit too)."""

from __future__ import annotations

import csv
import os
import platform
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rdmasched.bench.common import Row

#: the CSV columns, in order (us unless named otherwise)
CSV_COLUMNS = (
    "round",
    "name",
    "meta_bytes",
    "n",
    "min_us",
    "mean_us",
    "stddev_us",
    "p50_us",
    "p90_us",
    "p99_us",
    "p999_us",
    "p9999_us",
    "max_us",
    "msgs_per_s",
    "p50_over_floor",
)


def run_info(config: Mapping[str, Any]) -> dict[str, Any]:
    """The version, the configuration (every option as given or defaulted), the machine and
    the commit: what a figure needs so that someone else can rerun it."""
    from rdmasched import __version__

    return {
        "version": __version__,
        "config": {k: v for k, v in config.items() if _jsonable(v)},
        "machine": machine(),
        "commit": commit(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu_model": model or platform.processor(),
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_1_5_15": list(os.getloadavg()),
    }


def commit() -> dict[str, Any]:
    """The checkout's commit, and whether tracked files differ from it."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": head, "dirty": bool(dirty) if dirty is not None else None}


def _jsonable(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str, list, tuple))


def write_csv(
    path: str,
    merged: Sequence[Row],
    per_round: Sequence[Mapping[str, Row]],
    sizes: Mapping[str, int],
    floor: str | None,
) -> None:
    """One line per row and round, then one per row over all rounds (`round` = "all")."""

    def line(rnd: str, r: Row, ref: Row | None) -> list[Any]:
        s = r.hist.summary()
        ratio = r.p50_us / ref.p50_us if ref is not None and ref.p50_us > 0 else ""
        return [
            rnd,
            r.name,
            sizes.get(r.name, 0),
            s["n"],
            s["min"],
            s["mean"],
            s["stddev"],
            s["p50"],
            s["p90"],
            s["p99"],
            s["p999"],
            s["p9999"],
            s["max"],
            round(r.msgs_per_s, 1),
            ratio,
        ]

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for i, rnd in enumerate(per_round):
            ref = rnd.get(floor) if floor else None
            for r in rnd.values():
                w.writerow(line(str(i + 1), r, ref))
        ref_all = next((r for r in merged if r.name == floor), None)
        for r in merged:
            w.writerow(line("all", r, ref_all))


def write_hdr_log(path: str, per_round: Sequence[Mapping[str, Row]], started_s: float) -> None:
    """An HdrHistogram log (format 1.3): one interval histogram per row and round, tagged
    with the row's name; values in ns. HdrHistogram's tools (HistogramLogProcessor,
    hdr-plot) and `hdrh.log.HistogramLogReader` read it."""
    with open(path, "w") as f:
        f.write("#[Histogram log format version 1.3]\n")
        f.write(f"#[StartTime: {started_s:.3f} (seconds since epoch)]\n")
        f.write("#[rdmasched bench latency: round-trip samples in ns, one histogram per row]\n")
        f.write(
            '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"\n'
        )
        t = 0.0
        for rnd in per_round:
            for r in rnd.values():
                length = r.total_ns / 1e9
                max_ms = (r.max_us or 0.0) / 1000.0
                f.write(f"Tag={r.name},{t:.3f},{length:.3f},{max_ms:.3f},{r.hist.encode()}\n")
                t += length


def read_hdr_log(path: str) -> list[tuple[str, Any]]:
    """(tag, rdmasched.stats.Histogram) for each interval of a log written above."""
    from rdmasched.stats import Histogram

    out: list[tuple[str, Any]] = []
    with open(path) as f:
        for line in f:
            if not line.startswith("Tag="):
                continue
            tag, rest = line[4:].split(",", 1)
            out.append((tag, Histogram.decode(rest.rsplit(",", 1)[1].strip())))
    return out


def plot(path: str, rows: Sequence[Row], title: str) -> None:
    """Per row: its latency CDF (log-scaled x) and its histogram, in one PNG."""
    try:
        import matplotlib
    except ImportError as exc:
        from rdmasched.errors import ArgumentError

        raise ArgumentError(
            "--plot needs matplotlib: pip install 'rdmasched[plot]' (or matplotlib)"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cdf_ax, hist_ax) = plt.subplots(1, 2, figsize=(13, 5))
    for r in rows:
        pts = r.hist.cdf()
        if not pts:
            continue
        xs = [x for x, _ in pts]
        cdf_ax.step(xs, [y for _, y in pts], where="post", label=f"{r.name} (p50 {r.p50_us:.2f})")
        # the histogram: the CDF's increments, per recorded bucket
        prev = 0.0
        weights = []
        for _, y in pts:
            weights.append(y - prev)
            prev = y
        lo, hi = max(min(xs), 1e-3), max(xs)
        bins = _log_bins(lo, hi, 60)
        hist_ax.hist(xs, bins=bins, weights=weights, histtype="step", label=r.name)
    for ax in (cdf_ax, hist_ax):
        ax.set_xscale("log")
        ax.set_xlabel("round trip, us")
        ax.grid(True, which="both", alpha=0.3)
    cdf_ax.set_ylabel("fraction of samples <= x")
    cdf_ax.set_title("latency CDF")
    hist_ax.set_ylabel("fraction of samples")
    hist_ax.set_title("latency histogram")
    cdf_ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    tmp = f"{path}.{os.getpid()}.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def _log_bins(lo: float, hi: float, n: int) -> list[float]:
    if hi <= lo:
        hi = lo * 1.01
    ratio = (hi / lo) ** (1.0 / n)
    return [lo * ratio**i for i in range(n + 1)]
