"""RDMASCHED_PUREPYTHON (rdmasched/_purepython.py): set, the scheduler's core and task and
the node core load from their Python sources even where they are built, and say so; unset,
the compiled modules load where they are built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rdmasched.scheduler import core

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("rdmasched.scheduler.core", "rdmasched.scheduler.task", "rdmasched.daemon.core")
# what the child reports: each module's IMPLEMENTATION and file, the packages' own, and a few
# decisions of a scheduler and of a node core
CHILD = (
    f"""
MODULES = {MODULES!r}
"""
    + """
import importlib, json
from rdmasched.daemon.core import NodeCore
from rdmasched.scheduler import IMPLEMENTATION, FakeClock, Scheduler, Start, Task
mods = {m: importlib.import_module(m) for m in MODULES}

def name(a):
    t = a.victim if hasattr(a, "victim") else a.task
    return f"{type(a).__name__}:{t.id}"

s = Scheduler(2, clock=FakeClock(), starvation_us=10**6)
acts = [s.dispatch(Task(i, 1, p, 1000)) for i, p in ((1, 10), (2, 20), (3, 30))]
acts.append(s.complete(2))
nc = NodeCore(0, {0: ""}, slots=1, inc=1, dead_after_ns=10**9, heartbeat_ns=10**8, now=0)
print(json.dumps({
    "impl": {m: mod.IMPLEMENTATION for m, mod in mods.items()},
    "files": {m: mod.__file__ for m, mod in mods.items()},
    "package": IMPLEMENTATION,
    "acts": [[name(a) for a in out] for out in acts],
    "start": type(acts[0][0]) is Start,
    "node": [type(e).__name__ for e in nc.dispatch(Task(7, 1, 5, 1000), 1)],
}))
"""
)


def _child(pure: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "RDMASCHED_PUREPYTHON"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if pure is not None:
        env["RDMASCHED_PUREPYTHON"] = pure
    r = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_set_it_loads_the_python_sources_and_they_decide() -> None:
    got = _child("1")
    assert got["impl"] == dict.fromkeys(MODULES, "python")
    assert got["package"] == "python"
    assert all(f.endswith(".py") for f in got["files"].values())
    # two slots: 1 and 2 start, 3 preempts 1 (the lowest priority) and starts in its slot
    assert got["acts"][:3] == [["Start:1"], ["Start:2"], ["Preempt:1", "Start:3"]]
    assert got["start"] is True
    assert got["node"][0] == "Start"


@pytest.mark.skipif(core.IMPLEMENTATION != "compiled", reason="compiled core not built")
@pytest.mark.parametrize("value", [None, "", "0"])
def test_unset_the_compiled_modules_load(value: str | None) -> None:
    got = _child(value)
    assert got["impl"] == dict.fromkeys(MODULES, "compiled")
    assert got["package"] == "compiled"


def test_both_take_the_same_decisions() -> None:
    pure, default = _child("1"), _child(None)
    assert (pure["acts"], pure["node"]) == (default["acts"], default["node"])
