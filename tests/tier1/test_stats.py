"""rdmasched.stats: the one percentile implementation (HdrHistogram) every figure uses."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmasched.stats import Histogram, percentile_us


def exact(values: list[int], q: float) -> float:
    """The sample of rank max(1, floor(n q / 100 + 1/2)) in sorted order, us."""
    s = sorted(values)
    k = max(1, int(len(s) * q / 100 + 0.5))
    return s[min(k, len(s)) - 1] / 1000.0


@settings(deadline=None, max_examples=50)
@given(st.lists(st.integers(1, 10**10), min_size=1, max_size=400), st.sampled_from([50, 90, 99]))
def test_percentiles_are_within_a_thousandth_of_the_exact_ones(values: list[int], q: float) -> None:
    got = Histogram(values).percentile_us(q)
    assert got is not None
    assert abs(got - exact(values, q)) <= exact(values, q) * 1e-3 + 1e-3


@settings(deadline=None, max_examples=50)
@given(st.lists(st.integers(1, 10**9), min_size=1), st.lists(st.integers(1, 10**9), min_size=1))
def test_merged_rounds_are_the_histogram_of_all_samples(a: list[int], b: list[int]) -> None:
    merged = Histogram(a).merge(Histogram(b))
    whole = Histogram(a + b)
    assert merged.summary() == whole.summary()
    assert merged.min_us() == min(a + b) / 1000.0 and merged.max_us() == max(a + b) / 1000.0


def test_mean_and_stddev_sit_beside_the_percentiles() -> None:
    r = random.Random(7)
    values = [r.randint(1000, 3000) for _ in range(10_000)]
    s = Histogram(values).summary()
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    assert abs(s["mean"] - mean / 1000) < 0.01 and abs(s["stddev"] - sd / 1000) < 0.01
    assert s["n"] == 10_000 and s["min"] <= s["p50"] <= s["p99"] <= s["max"]


def test_empty_and_bad_input() -> None:
    assert Histogram().percentile_us(50) is None
    assert percentile_us([], 99) is None
    with pytest.raises(ValueError, match="no samples"):
        Histogram().summary()
    with pytest.raises(ValueError, match="percentile"):
        Histogram([1]).percentile_us(0)
    with pytest.raises(ValueError):
        Histogram.decode("not a histogram!")


def test_the_encoding_round_trips() -> None:
    h = Histogram([100, 200, 300, 5_000_000])
    back = Histogram.decode(h.encode())
    assert back.count == 4 and back.percentile_us(50) == h.percentile_us(50)


def test_the_cdf_ends_at_one() -> None:
    cdf = Histogram([1000, 2000, 2000, 9000]).cdf()
    assert cdf[-1][1] == 1.0 and [round(f, 2) for _, f in cdf] == [0.25, 0.75, 1.0]
