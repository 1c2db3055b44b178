"""`rdmasched bench latency`'s outputs, as perftest users expect them: JSON with the version,
the configuration and the machine; CSV; an HdrHistogram log; a plot; a metadata-size sweep;
a duration mode. Small counts: these check what is written, not how fast anything is."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from rdmasched import __version__
from rdmasched.bench.output import read_hdr_log
from rdmasched.cli import main

ROWS = ["--rows", "rdmasched-shm", "c-shm-floor"]


def test_json_csv_hdr_log_and_plot_from_one_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = {k: tmp_path / f"lat.{k}" for k in ("csv", "hlog", "png")}
    args = ["--iterations", "600", "--warmup", "50", "--rounds", "2", "--sizes", "0,64,4096"]
    files = ["--csv", str(out["csv"]), "--hdr-log", str(out["hlog"]), "--plot", str(out["png"])]
    code = main(["bench", "latency", *ROWS, *args, "--json", *files])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in doc["results"]]
    assert names == [
        "rdmasched-shm@0B",
        "rdmasched-shm@64B",
        "rdmasched-shm@4096B",
        "c-shm-floor",
    ]
    assert doc["version"] == __version__
    assert doc["config"]["sizes"] == [0, 64, 4096] and doc["config"]["rounds"] == 2
    assert doc["machine"]["nproc"] >= 1 and "commit" in doc
    for r in doc["results"]:
        assert r["n"] == 600 and r["min_us"] <= r["p50_us"] <= r["p99_us"] <= r["max_us"]
        assert r["stddev_us"] >= 0 and r["min_us"] <= r["mean_us"] <= r["max_us"]
    # a row's ratio to the floor, per round then the median; the sized rows have one each
    assert set(doc["ratios_p50_median_of_rounds"]["rdmasched-shm@64B"]) == {"c-shm-floor"}

    lines = list(csv.DictReader(out["csv"].open()))
    assert [x["round"] for x in lines] == ["1"] * 4 + ["2"] * 4 + ["all"] * 4
    sized = {x["name"]: int(x["meta_bytes"]) for x in lines}
    assert sized["rdmasched-shm@4096B"] == 4096 and sized["c-shm-floor"] == 0
    merged = {x["name"]: x for x in lines if x["round"] == "all"}
    assert int(merged["c-shm-floor"]["n"]) == 600
    assert float(merged["c-shm-floor"]["p50_over_floor"]) == 1.0

    logged = read_hdr_log(str(out["hlog"]))
    assert [tag for tag, _ in logged] == names * 2  # one interval per row and round
    assert all(h.count == 300 for _, h in logged)

    png = out["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_duration_mode_sizes_the_rows_by_time(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "latency", *ROWS, "--duration", "0.2", "--rounds", "1", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    by = {r["name"]: r for r in doc["results"]}
    # the count follows from the time: the floor is far faster, so it gets far more samples
    assert by["c-shm-floor"]["n"] > by["rdmasched-shm"]["n"] > 100
    assert doc["config"]["duration"] == 0.2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sizes", "3"], "must be 0 or 5..4096"),
        (["--sizes", "5000"], "must be 0 or 5..4096"),
        (["--sizes", "x"], "must be 'all'"),
        (["--sizes", "4096", "--lane-slots", "64"], "needs --lane-slots >= 164"),
        (["--duration", "0"], "must be a finite number"),
    ],
)
def test_bad_options_get_one_clear_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "latency", *args]) == 2
    assert message in capsys.readouterr().err
