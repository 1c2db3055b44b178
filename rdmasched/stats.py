"""Latency statistics: the project's one percentile implementation.

Every figure rdmasched prints as a percentile (benchmarks, the demo, a node's preemption
reaction times, the freezer) comes from a `Histogram`: an HdrHistogram (the `hdrhistogram`
package, the format perftest-style tools and wrk2 use) of nanosecond values, 1 ns to one hour,
3 significant digits (a reported value is within 0.1% of the true sample). Histograms merge
exactly (`merge`), so percentiles over several rounds, or several nodes, are those of all
their samples, not an average of percentiles. `mean` and `stddev` are exact (a running
sum and sum of squares beside the histogram).

Percentile convention: HdrHistogram's. The q-th percentile of n samples is the sample of
rank max(1, floor(n q / 100 + 1/2)) in sorted order (to 0.1%); the 100th is the maximum.
`min` and `max` are exact.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from hdrh.histogram import HdrHistogram

#: 1 ns .. 1 hour, 3 significant digits
LOWEST_NS = 1
HIGHEST_NS = 3_600 * 10**9
DIGITS = 3
#: the percentiles every summary carries, and how they are named in JSON and CSV
PERCENTILES: Mapping[str, float] = {
    "p50": 50.0,
    "p90": 90.0,
    "p99": 99.0,
    "p999": 99.9,
    "p9999": 99.99,
}


class Histogram:
    """Nanosecond values; percentiles, mean and standard deviation in microseconds."""

    __slots__ = ("_h", "_max", "_min", "_sum", "_sumsq")

    def __init__(self, values_ns: Iterable[int] = ()) -> None:
        self._h = HdrHistogram(LOWEST_NS, HIGHEST_NS, DIGITS)
        self._min = 0
        self._max = 0
        #: exact sum and sum of squares of the values, for the mean and standard deviation
        self._sum = 0
        self._sumsq = 0
        self.record_all(values_ns)

    # ---- recording -----------------------------------------------------------------------------
    def record(self, ns: int, count: int = 1) -> None:
        """A value (ns), `count` times. Values below 1 ns count as 1 ns; above an hour,
        as an hour."""
        v = LOWEST_NS if ns < LOWEST_NS else HIGHEST_NS if ns > HIGHEST_NS else int(ns)
        if not self._h.total_count:
            self._min = self._max = v
        elif v < self._min:
            self._min = v
        elif v > self._max:
            self._max = v
        self._h.record_value(v, count)
        self._sum += v * count
        self._sumsq += v * v * count

    def record_all(self, values_ns: Iterable[int]) -> None:
        """Many values (ns): equal values are recorded once with their count (latency
        samples repeat a lot, and a single record costs about a microsecond)."""
        for v, n in Counter(values_ns).items():
            self.record(v, n)

    def merge(self, other: Histogram) -> Histogram:
        """Add `other`'s samples to this one (exact); returns self."""
        if other.count:
            if not self.count:
                self._min, self._max = other._min, other._max
            else:
                self._min = min(self._min, other._min)
                self._max = max(self._max, other._max)
            self._h.add(other._h)
            self._sum += other._sum
            self._sumsq += other._sumsq
        return self

    @classmethod
    def merged(cls, parts: Iterable[Histogram]) -> Histogram:
        out = cls()
        for p in parts:
            out.merge(p)
        return out

    # ---- reading -------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return int(self._h.total_count)

    def __len__(self) -> int:
        return self.count

    def percentile_us(self, q: float) -> float | None:
        """The `q`-th percentile (0 < q <= 100), us; None without samples."""
        if not 0.0 < q <= 100.0:
            raise ValueError(f"percentile must be in (0, 100], got {q}")
        if not self.count:
            return None
        if q == 100.0:
            return self._max / 1000.0
        v = int(self._h.get_value_at_percentile(q))
        return min(max(v, self._min), self._max) / 1000.0

    def min_us(self) -> float | None:
        return self._min / 1000.0 if self.count else None

    def max_us(self) -> float | None:
        return self._max / 1000.0 if self.count else None

    def mean_us(self) -> float | None:
        """The exact mean (us) of the values recorded."""
        n = self.count
        return self._sum / n / 1000.0 if n else None

    def stddev_us(self) -> float | None:
        """The exact (population) standard deviation (us) of the values recorded."""
        n = self.count
        if not n:
            return None
        var = max(0.0, (self._sumsq - self._sum * self._sum / n) / n)
        return float(var**0.5) / 1000.0

    def summary(self) -> dict[str, Any]:
        """n, min, mean, stddev, p50, p90, p99, p999, p9999, max (us); ValueError if empty."""
        if not self.count:
            raise ValueError("no samples")
        out: dict[str, Any] = {
            "n": self.count,
            "min": self.min_us(),
            "mean": self.mean_us(),
            "stddev": self.stddev_us(),
        }
        for name, q in PERCENTILES.items():
            out[name] = self.percentile_us(q)
        out["max"] = self.max_us()
        return out

    def cdf(self) -> list[tuple[float, float]]:
        """(value us, fraction of samples <= it) at each recorded bucket, for plots."""
        out: list[tuple[float, float]] = []
        total = self.count
        if not total:
            return out
        seen = 0
        for item in self._h.get_recorded_iterator():
            seen += item.count_at_value_iterated_to
            out.append((item.value_iterated_to / 1000.0, seen / total))
        return out

    # ---- exchange ------------------------------------------------------------------------------
    def encode(self) -> str:
        """The compressed HdrHistogram encoding (base64 text, as in an HdrHistogram log)."""
        raw = self._h.encode()
        return raw.decode("ascii") if isinstance(raw, bytes) else str(raw)

    @classmethod
    def decode(cls, text: str) -> Histogram:
        """A histogram from `encode()`'s text (min/max to the histogram's precision)."""
        base64.b64decode(text, validate=True)  # a clear error for text that is not base64
        out = cls()
        h = HdrHistogram.decode(text)
        out._h.add(h)
        if out.count:
            out._min = int(h.get_min_value())
            out._max = int(h.get_max_value())
            # the encoding keeps buckets, not values: mean and deviation to its precision
            mean, sd, n = float(h.get_mean_value()), float(h.get_stddev()), out.count
            out._sum = round(mean * n)
            out._sumsq = round((sd * sd + mean * mean) * n)
        return out


def percentile_us(values_ns: Iterable[int], q: float) -> float | None:
    """The `q`-th percentile (0 < q <= 100) of `values_ns`, us; None if there are none."""
    return Histogram(values_ns).percentile_us(q)


__all__ = ["DIGITS", "HIGHEST_NS", "LOWEST_NS", "PERCENTILES", "Histogram", "percentile_us"]
