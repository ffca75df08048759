"""The one Pareto rule: ties, missing latency, NaN metrics, baselines, thinning, hypervolume."""

from __future__ import annotations

import math

import pytest

from mpsearch.pareto import (
    SIZE_TIE,
    dominated_flags,
    dominates,
    dominators,
    hypervolume,
    matched,
    nondominated,
    thin,
)


def test_sizes_within_the_tie_compare_as_equal() -> None:
    assert SIZE_TIE == 1e-3
    smaller, tied = (0.89, 1000.0, None), (0.90, 1000.9, None)  # 0.09 % larger: a tie
    assert dominates(tied, smaller, higher_is_better=True)
    assert not dominates(smaller, tied, higher_is_better=True)
    larger = (0.90, 1002.0, None)  # 0.2 % larger: a real trade-off
    assert not dominates(larger, smaller, higher_is_better=True)
    assert not dominates(smaller, larger, higher_is_better=True)
    assert not dominates(smaller, smaller, higher_is_better=True)  # identical: neither


def test_latency_counts_only_when_both_points_have_one() -> None:
    unknown, timed = (0.9, 100.0, None), (0.9, 100.0, 0.5)
    assert not dominates(unknown, timed, higher_is_better=True)
    assert not dominates(timed, unknown, higher_is_better=True)
    assert dominates((0.9, 100.0, 0.4), timed, higher_is_better=True)
    assert dominates((0.95, 100.0, None), timed, higher_is_better=True)  # metric decides
    assert dominates((0.95, 100.0, math.nan), timed, higher_is_better=True)  # NaN: unknown
    assert not dominates((0.95, 100.0, 0.6), timed, higher_is_better=True)  # a trade-off


def test_direction_and_nan_metrics() -> None:
    assert dominates((0.1, 100.0, None), (0.2, 100.0, None), higher_is_better=False)
    assert not dominates((0.1, 100.0, None), (0.2, 100.0, None), higher_is_better=True)
    nan = (math.nan, 100.0, None)  # a NaN metric is worse than any number
    assert dominates((0.1, 100.0, None), nan, higher_is_better=True)
    assert dominates((0.1, 100.0, None), nan, higher_is_better=False)
    assert not dominates((0.1, 200.0, None), (math.nan, 50.0, None), higher_is_better=True)


def test_flags_and_nondominated_use_the_same_rule() -> None:
    points = [(0.97, 43_200.0, None), (0.96, 43_210.0, None), (0.98, 60_000.0, None),
              (0.95, 40_000.0, None), (0.97, 50_000.0, None)]
    assert dominated_flags(points, higher_is_better=True) == (False, True, False, False, True)
    assert nondominated(points, higher_is_better=True) == (0, 2, 3)
    assert dominated_flags([], higher_is_better=True) == ()


def test_dominators_name_a_baseline_first_then_an_undominated_point() -> None:
    int8 = (0.90, 1000.0, 0.5)
    points = [(0.89, 1000.5, 0.6),   # beaten by int8 and by point 1
              (0.95, 1000.0, 0.5),   # beats point 0, beaten by nothing
              (0.94, 1200.0, 0.7),   # beaten by point 1
              (0.93, 1200.0, 0.7)]   # beaten by points 1 and 2 (2 is beaten: 1 is named)
    assert dominators(points, higher_is_better=True, by=[int8]) == (0, None, 2, 2)
    assert dominated_flags(points, higher_is_better=True, by=[int8]) == (True, False, True,
                                                                         True)


def test_matched_allows_the_patience_margins() -> None:
    point = (30.0, 1000.0, 1.0)  # SQNR dB, bytes, seconds
    assert matched(point, [(29.6, 1004.0, 1.004)], higher_is_better=True, metric_margin=0.5,
                   relative=0.005)
    assert not matched(point, [(29.4, 1000.0, 1.0)], higher_is_better=True, metric_margin=0.5,
                       relative=0.005)
    assert not matched(point, [(31.0, 1006.0, 1.0)], higher_is_better=True, metric_margin=0.5,
                       relative=0.005)
    assert not matched(point, [], higher_is_better=True, metric_margin=0.5, relative=0.005)
    slower = [(30.0, 1000.0, 1.08)]  # 8 % slower: a match only within a 10 % latency margin
    assert not matched(point, slower, higher_is_better=True, metric_margin=0.5, relative=0.005)
    assert matched(point, slower, higher_is_better=True, metric_margin=0.5, relative=0.005,
                   latency_relative=0.10)


def test_thin_keeps_the_ends_and_spreads_the_rest() -> None:
    sizes = [float(100 + 10 * i) for i in range(30)]
    metrics = [0.5 + 0.01 * i for i in range(30)]
    kept = thin(sizes, metrics, 6)
    assert len(kept) == 6 and kept[0] == 0 and kept[-1] == 29
    assert list(kept) == sorted(kept)
    assert thin(sizes[:4], metrics[:4], 6) == (0, 1, 2, 3)


def test_hypervolume_by_hand() -> None:
    # (size 5, metric 0.8) then (10, 0.9), box to (20, 0.5): 5 * 0.3 + 10 * 0.4 = 5.5
    assert hypervolume([(0.9, 10.0), (0.8, 5.0)], 0.5, 20.0) == pytest.approx(5.5)
    # a dominated point and points outside the box add nothing
    assert hypervolume([(0.9, 10.0), (0.8, 5.0), (0.85, 15.0), (0.4, 1.0), (0.99, 25.0)],
                       0.5, 20.0) == pytest.approx(5.5)
    # lower is better: the same shape mirrored
    assert hypervolume([(0.1, 10.0), (0.2, 5.0)], 0.5, 20.0,
                       higher_is_better=False) == pytest.approx(5.5)
    assert hypervolume([], 0.5, 20.0) == 0.0
    # one point: a rectangle, (20 - 4) * (0.75 - 0.5) = 4
    assert hypervolume([(0.75, 4.0)], 0.5, 20.0) == pytest.approx(4.0)


def test_latency_spreads_count_only_measurable_differences() -> None:
    same = [(0.9, 100.0, None)] * 3
    spreads = [[(1.0, 2.0), (10.0, 11.0)],     # 0: overlaps 2 at batch 1, slower at batch N
               [(3.0, 4.0), (3.0, 4.0)],       # 1: slower than 2 at batch 1, faster at N
               [(1.5, 2.5), (5.0, 6.0)]]       # 2
    # 2 beats 0 (faster at N, overlapping at 1); 1 and 2 trade batches: neither beats
    assert dominators(same, higher_is_better=True, spreads=(spreads, [])) == (2, None, None)
    # medians 0.7 % apart with overlapping spreads: nobody is beaten
    close = [[(0.40, 0.60), (10.0, 12.0)], [(0.41, 0.61), (10.1, 12.1)]]
    assert dominators(same[:2], higher_is_better=True, spreads=(close, [])) == (None, None)
    # a baseline (``by``) is judged by its spreads too, and a point untimed at a batch is
    # judged on the batches both were timed at
    base = [(0.9, 100.0, None)]
    assert dominators(same[:1], higher_is_better=True, by=base,
                      spreads=([[(1.0, 2.0), None]], [[(0.1, 0.2), (1.0, 2.0)]])) == (0,)
    assert dominators(same[:1], higher_is_better=True, by=base,
                      spreads=([[(1.0, 2.0), None]], [[(1.5, 2.2), (1.0, 2.0)]])) == (None,)
