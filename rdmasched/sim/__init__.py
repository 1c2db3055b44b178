"""`rdmasched sim`: a discrete-event simulator of a cluster whose every node runs the real
node core (docs/SIM.md)."""

from rdmasched.sim.linkmodel import PRESETS, LinkModel, preset
from rdmasched.sim.run import SCHEDULERS, Run, SimConfig, measure_central_call_ns, simulate

__all__ = [
    "PRESETS",
    "SCHEDULERS",
    "LinkModel",
    "Run",
    "SimConfig",
    "measure_central_call_ns",
    "preset",
    "simulate",
]
