"""The committed figures (docs/figures/*.json) hold no count that cannot be: a number of
tasks, messages or events below zero is a defect of the run that wrote it (the traced
harvest's `background_tasks_done` read -416 until its figures were run again)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FIGURES = Path(__file__).resolve().parents[2] / "docs" / "figures"
#: keys whose values count something (by how they end, or begin): never negative
COUNTS = ("_done", "tasks", "msgs", "events", "preemptions", "_per_node_per_s")
COUNTS_FIRST = ("background_tasks", "msgs")


def _numbers(obj: Any, path: str = "") -> Iterator[tuple[str, str, float]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                yield f"{path}.{k}", k, v
            else:
                yield from _numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{path}[{i}]")


@pytest.mark.parametrize("name", sorted(p.name for p in FIGURES.glob("*.json")))
def test_no_figure_counts_below_zero(name: str) -> None:
    doc = json.loads((FIGURES / name).read_text())
    bad = [
        f"{where} = {v}"
        for where, key, v in _numbers(doc)
        if v < 0 and (key.endswith(COUNTS) or key.startswith(COUNTS_FIRST))
    ]
    assert not bad, f"{name}: {len(bad)} negative counts, e.g. {bad[:3]}"
