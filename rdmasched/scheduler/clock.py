"""Clocks for the scheduler: a clock is any ``Callable[[], int]`` returning nanoseconds.

The daemon passes ``time.monotonic_ns``; tests and the benchmark pass a ``FakeClock``, which
only moves when told to, so every rule can be tested at exact instants.
"""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], int]


class FakeClock:
    """A manual clock in nanoseconds: ``clock()`` reads it, ``advance*`` moves it."""

    __slots__ = ("now_ns",)

    def __init__(self, start_ns: int = 0) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, ns: int) -> int:
        """Move forward by ``ns`` nanoseconds and return the new time."""
        if ns < 0:
            raise ValueError("a clock does not go back")
        self.now_ns += ns
        return self.now_ns

    def advance_us(self, us: int) -> int:
        """Move forward by ``us`` microseconds and return the new time."""
        return self.advance(us * 1000)
