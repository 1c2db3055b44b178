"""The one bounded wait of the test suite: poll a condition until it holds or a generous
deadline passes (tests are never timed; a deadline only turns a hang into a failure that
says what was awaited)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], object], what: str = "condition", timeout_s: float = 60.0) -> None:
    """Return once `cond()` is true; fail naming `what` after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s:g} s: {what}")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
