"""The one latency clock: interleaved rounds, the median and the spread of the runs."""

from __future__ import annotations

import pytest

from mpsearch.clock import ROUNDS, time_runs


def test_time_runs_interleaves_every_configuration() -> None:
    calls: list[str] = []
    timings = time_runs([lambda: calls.append("a"), lambda: calls.append("b")], rounds=3)
    # one warm-up each, then three rounds, the order rotated each round
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert [t.runs for t in timings] == [3, 3]
    assert all(t.low <= t.seconds <= t.high for t in timings)
    assert time_runs([]) == ()


def test_the_median_and_the_spread_of_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nine runs of a fake clock: 3, 1, 2, 9, 4, 5, 6, 7, 8 s -> median 5, spread [1, 9]."""
    ticks = iter([0.0, 3.0, 3.0, 4.0, 4.0, 6.0, 6.0, 15.0, 15.0, 19.0, 19.0, 24.0, 24.0, 30.0,
                  30.0, 37.0, 37.0, 45.0])
    monkeypatch.setattr("mpsearch.clock.time.perf_counter", lambda: next(ticks))
    (timing,) = time_runs([lambda: None])
    assert (timing.seconds, timing.low, timing.high, timing.runs) == (5.0, 1.0, 9.0, ROUNDS)
    assert timing.interval_ms == (1e3, 9e3)
