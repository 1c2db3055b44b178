"""`rdmasched demo`'s summary (issue 20 item 17): idle time, step time and preemption reaction
p50 of each scheduler the demo runs, with their ratio, printed and in --json."""

from __future__ import annotations

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
