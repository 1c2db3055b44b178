"""`rdmasched demo`'s summary (issue 20 item 17): idle time, step time and preemption reaction
p50 of each scheduler the demo runs, with their ratio, printed and in --json."""

from __future__ import annotations

import copy
import io
from typing import Any

from rdmasched.demo.runner import DemoConfig, print_report, summary


def mode(idle: float, step: float, react: float) -> dict[str, Any]:
    return {
        "slot_idle_pct": idle,
        "step_time_ms": step,
        "preempt_reaction_p50_us": react,
        "nodes": [],
        "msgs_per_node_step_by_kind": {},
    }


RES = {"rdmasched": mode(2.0, 7.0, 10.0), "central": mode(8.0, 8.4, 150.0)}


def test_summary_figures_and_ratios() -> None:
    s = summary(RES)
    assert s["slot_idle_pct"] == {"rdmasched": 2.0, "central": 8.0, "central/rdmasched": 4.0}
    assert s["step_time_ms"]["central/rdmasched"] == 1.2
    assert s["preempt_reaction_p50_us"]["central/rdmasched"] == 15.0
    none = summary({"rdmasched": mode(0.0, 7.0, 10.0), "central": mode(8.0, 8.4, 150.0)})
    assert none["slot_idle_pct"]["central/rdmasched"] is None  # no ratio to 0


def test_the_summary_lines_name_each_figure() -> None:
    out = io.StringIO()
    print_report(DemoConfig(), {k: dict(v) for k, v in RES.items()}, file=out)
    text = out.getvalue()
    tail = text[text.index("summary") :]
    for line, want in (
        ("idle", ("rdmasched 2.00%", "central 8.00%", "4.00x", "75% less idle time")),
        ("step time", ("rdmasched 7.00 ms", "central 8.40 ms", "1.20x")),
        ("reaction p50", ("rdmasched 10.0 us", "central 150.0 us", "15.00x")),
    ):
        row = next(x for x in tail.splitlines() if line in x)
        for w in want:
            assert w in row, (w, row)


def test_the_report_shows_what_the_host_gave_each_run() -> None:
    res = {k: dict(v) for k, v in RES.items()}
    res["rdmasched"]["host"] = {
        "cpus": 2,
        "cpu_ms_per_step": 4.25,
        "cpu_busy_pct": 33.3,
        "cpu_us_per_task": 120.5,
        "voluntary_switches_per_step": 40.0,
        "involuntary_switches_per_step": 3.5,
        "msgs_per_batch": 1.2,
        "coordinator_msgs_per_batch": None,
    }
    res["central"]["host"] = dict(res["rdmasched"]["host"], cpu_ms_per_step=8.5)
    out = io.StringIO()
    print_report(DemoConfig(), res, file=out)
    text = out.getvalue()
    row = next(x for x in text.splitlines() if x.startswith("host CPU ms per step"))
    assert "4.25" in row and "8.50" in row and "2.00x" in row
    assert any(x.startswith("host CPU busy % (2 CPUs)") and "33.3" in x for x in text.splitlines())
    row = next(x for x in text.splitlines() if x.startswith("coordinator msgs per pass"))
    assert "-" in row  # rdmasched has no coordinator
    # a result without the host's figures (an older JSON) still prints
    print_report(DemoConfig(), {k: dict(v) for k, v in RES.items()}, file=io.StringIO())


def test_the_report_leaves_the_result_it_prints_as_it_was() -> None:
    res = {k: dict(v) for k, v in RES.items()}
    res["rdmasched"]["host"] = {"cpus": 2, "cpu_ms_per_step": 4.25}
    before = copy.deepcopy(res)
    print_report(DemoConfig(), res, file=io.StringIO())
    assert res == before  # (a --json written after the report gets the run's own fields)
