"""The one latency clock: interleaved rounds, the median and its order-statistic interval."""

from __future__ import annotations

import pytest

from mpsearch.clock import ROUNDS, median_interval, time_runs


def test_median_interval_order_statistics() -> None:
    times = [9.0, 1.0, 8.0, 2.0, 7.0, 3.0, 6.0, 4.0, 5.0]  # n = 9: the 2nd and 8th, 96.1 %
    assert median_interval(times) == (2.0, 8.0)
    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0, 7.0, 6.0]) == (1.0, 7.0)  # n = 7: ends
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few for 95 %: the ends
    with pytest.raises(ValueError, match="no times"):
        median_interval([])


def test_time_runs_interleaves_every_configuration() -> None:
    calls: list[str] = []
    timings = time_runs([lambda: calls.append("a"), lambda: calls.append("b")], rounds=3)
    # one warm-up each, then three rounds, the order rotated each round
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert [t.runs for t in timings] == [3, 3]
    assert all(t.low <= t.seconds <= t.high for t in timings)
    prior = time_runs([lambda: calls.append("c")], prior=[[1.0] * ROUNDS])  # already timed
    assert calls[-1] == "b" and prior[0].seconds == 1.0 and prior[0].interval_ms == (1e3, 1e3)
