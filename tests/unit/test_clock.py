"""The one latency clock: interleaved rounds, runs of a least duration, feeds placed anew each
round, the median and the spread of the runs."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from mpsearch.clock import OFFSETS, ROUNDS, placed_at, time_runs

FEEDS = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}


def test_time_runs_interleaves_every_configuration() -> None:
    calls: list[str] = []
    timings = time_runs([lambda f: calls.append("a"), lambda f: calls.append("b")], FEEDS,
                        rounds=3, min_run=0)
    # a warm-up and a probe each, then three rounds, the order rotated each round
    assert calls == ["a", "a", "b", "b", "a", "b", "b", "a", "a", "b"]
    assert [(t.runs, t.calls) for t in timings] == [(3, 1), (3, 1)]
    assert all(t.low <= t.seconds <= t.high for t in timings)
    assert time_runs([], FEEDS) == ()


def test_each_round_places_the_feeds_at_the_next_offset() -> None:
    seen: list[tuple[int, np.ndarray]] = []

    def run(feeds: Mapping[str, np.ndarray]) -> None:
        seen.append((feeds["x"].ctypes.data % 4096, feeds["x"].copy()))

    time_runs([run], FEEDS, rounds=ROUNDS, min_run=0)
    timed = seen[2:]  # after the warm-up and the probe
    assert [offset for offset, _ in timed] == list(OFFSETS)
    assert len(set(OFFSETS)) == ROUNDS and all(o % 16 == 0 for o in OFFSETS)
    assert all(np.array_equal(x, FEEDS["x"]) for _, x in seen)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.bool_, np.float16])
def test_placed_feeds_are_equal_copies_at_the_offset(dtype: type) -> None:
    array = (np.arange(30) % 7).astype(dtype).reshape(5, 6)
    placed = placed_at({"a": array, "s": np.array(["x", "y"], dtype=object)}, 1056)
    assert placed["a"].ctypes.data % 4096 == 1056
    assert placed["a"].dtype == array.dtype and np.array_equal(placed["a"], array)
    assert placed["s"].tolist() == ["x", "y"]


def test_the_median_and_the_spread_of_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe of 10 s, then nine runs of a fake clock: 3, 1, 2, 9, 4, 5, 6, 7, 8 s -> median
    5, spread [1, 9]."""
    ticks = iter([0.0, 10.0,
                  10.0, 13.0, 13.0, 14.0, 14.0, 16.0, 16.0, 25.0, 25.0, 29.0, 29.0, 34.0, 34.0,
                  40.0, 40.0, 47.0, 47.0, 55.0])
    monkeypatch.setattr("mpsearch.clock.time.perf_counter", lambda: next(ticks))
    (timing,) = time_runs([lambda f: None], FEEDS, min_run=1.0)
    assert (timing.seconds, timing.low, timing.high, timing.runs) == (5.0, 1.0, 9.0, ROUNDS)
    assert timing.calls == 1
    assert timing.interval_ms == (1e3, 9e3)


def test_a_fast_configuration_runs_several_calls_per_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call takes 0.25 s on a fake clock and the least run is 1 s: four calls per run, and
    a run reports the mean call."""
    now = [0.0]
    calls: list[float] = []

    def call(feeds: Mapping[str, np.ndarray]) -> None:
        calls.append(now[0])
        now[0] += 0.25

    monkeypatch.setattr("mpsearch.clock.time.perf_counter", lambda: now[0])
    (timing,) = time_runs([call], FEEDS, rounds=2, min_run=1.0)
    assert timing.calls == 4
    assert len(calls) == 2 + 2 * 4  # the warm-up, the probe, two runs of four calls
    assert (timing.seconds, timing.low, timing.high, timing.runs) == (0.25, 0.25, 0.25, 2)


def test_the_rounds_go_on_for_the_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls of 0.1 s, two rounds asked, a span of 1 s: rounds until 1 s has passed."""
    now = [0.0]

    def call(feeds: Mapping[str, np.ndarray]) -> None:
        now[0] += 0.1

    monkeypatch.setattr("mpsearch.clock.time.perf_counter", lambda: now[0])
    (timing,) = time_runs([call], FEEDS, rounds=2, min_run=0, span=1.0)
    assert timing.runs == 10


def test_runs_may_take_feeds_of_their_own() -> None:
    """Two batches timed in the same rounds: each run gets its own feeds, placed anew."""
    small, large = {"x": np.zeros((1, 3), np.float32)}, {"x": np.zeros((8, 3), np.float32)}
    seen: dict[str, set[int]] = {"a": set(), "b": set()}
    time_runs([lambda f: seen["a"].add(len(f["x"])), lambda f: seen["b"].add(len(f["x"]))],
              [small, large], rounds=3, min_run=0)
    assert seen == {"a": {1}, "b": {8}}
    with pytest.raises(ValueError, match="2 runs but 1 feeds"):
        time_runs([print, print], [small])
