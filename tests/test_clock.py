"""The one latency clock: interleaved rounds, the median and the spread of the runs."""

from __future__ import annotations

from mpsearch.clock import ROUNDS, time_runs


def test_time_runs_interleaves_every_configuration() -> None:
    calls: list[str] = []
    timings = time_runs([lambda: calls.append("a"), lambda: calls.append("b")], rounds=3)
    # one warm-up each, then three rounds, the order rotated each round
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert [t.runs for t in timings] == [3, 3]
    assert all(t.low <= t.seconds <= t.high for t in timings)
    spread = time_runs([lambda: None], prior=[[3.0, 1.0, 2.0, 9.0, 4.0, 5.0, 6.0, 7.0, 8.0]])
    assert (spread[0].seconds, spread[0].low, spread[0].high) == (5.0, 1.0, 9.0)
    prior = time_runs([lambda: calls.append("c")], prior=[[1.0] * ROUNDS])  # already timed
    assert calls[-1] == "b" and prior[0].seconds == 1.0 and prior[0].interval_ms == (1e3, 1e3)
