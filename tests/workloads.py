"""What a workload reader produced, as one string to pin: the SHA-256 of the full graph
(`Workload.to_dict()`: every step, every task with its fields and deps, the warnings and
the ignored counts) as canonical JSON. A test that pins it fails on any change in what a
reader builds; regenerate a pinned value only for a change that means to alter it."""

from __future__ import annotations

import hashlib
import json

from rdmasched.workload import Workload


def digest(wl: Workload) -> str:
    text = json.dumps(wl.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
