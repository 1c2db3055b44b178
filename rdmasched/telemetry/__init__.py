"""Decision telemetry: trace records, Perfetto export, Prometheus metrics (docs/TELEMETRY.md).

The events themselves are recorded by the scheduler (rdmasched/scheduler/events.py has
their layout); this package writes, reads, exports and serves them.
"""

from __future__ import annotations

from rdmasched.telemetry.records import (
    FORMAT,
    NodeTrace,
    TraceError,
    anchor,
    dump,
    header,
    read_dir,
    read_file,
    write,
)

__all__ = [
    "FORMAT",
    "NodeTrace",
    "TraceError",
    "anchor",
    "dump",
    "header",
    "read_dir",
    "read_file",
    "write",
]
