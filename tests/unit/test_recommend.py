"""The recommendation rule (mpsearch._recommend) on fronts built by hand."""

from __future__ import annotations

from mpsearch._recommend import Limits, recommend
from mpsearch.rundir import Baseline, Front, FrontPoint


def _point(index: int, metric: float, size: int, b1: tuple[float, float] | None = None,
           bn: tuple[float, float] | None = None) -> FrontPoint:
    return FrontPoint(index=index, trial=index, metric=metric, search_metric=metric, size=size,
                      latency=None if b1 is None else sum(b1) / 2, metrics={"accuracy": metric},
                      assignment={}, counts={}, differs_from_int8=(), source="search",
                      interval=(metric - 0.01, min(1.0, metric + 0.01)),
                      latency_ms=None if b1 is None else sum(b1) / 2, latency_ms_interval=b1,
                      batch_latency_ms=None if bn is None else sum(bn) / 2,
                      batch_latency_ms_interval=bn)


def _front(*points: FrontPoint) -> Front:
    fp32 = Baseline(metric=0.97, size=1000, latency=1.0, latency_ms=1.0,
                    latency_ms_interval=(0.9, 1.1), batch_latency_ms=50.0,
                    batch_latency_ms_interval=(45.0, 55.0))
    return Front(metric="accuracy", higher_is_better=True, objectives=("metric", "size"),
                 fp32=fp32, uniform={}, points=points, evaluations=1, seconds=1.0,
                 latency_source="measured", latency_batch=64)


def test_smallest_point_whose_interval_meets_the_constraint() -> None:
    front = _front(_point(0, 0.90, 300), _point(1, 0.965, 400), _point(2, 0.97, 600))
    index, line = recommend(front, Limits(max_metric_drop=0.02))
    assert index == 1  # point 0's interval [0.89, 0.91] misses 0.95; point 1's [0.955, ...] meets
    assert line.startswith("deploy point 1: 400 B (2.5x smaller than FP32)")
    assert line.endswith("stopped: trial budget used")


def test_a_point_slower_than_fp32_at_every_batch_is_passed_over() -> None:
    slow = _point(0, 0.97, 400, b1=(2.0, 2.5), bn=(60.0, 70.0))     # slower at both batches
    mixed = _point(1, 0.97, 401, b1=(1.2, 1.3), bn=(15.0, 20.0))    # slower at 1, faster at 64
    index, line = recommend(_front(slow, mixed), Limits(max_metric_drop=0.02))
    assert index == 1
    assert "1.25 ms at batch 1" in line


def test_only_slow_points_still_get_a_recommendation() -> None:
    slow = _point(0, 0.97, 400, b1=(2.0, 2.5), bn=(60.0, 70.0))
    index, _ = recommend(_front(slow), Limits(max_metric_drop=0.02))
    assert index == 0


def test_overlapping_spreads_are_not_slower() -> None:
    near = _point(0, 0.97, 400, b1=(1.05, 1.4), bn=(50.0, 60.0))   # overlaps FP32 at both
    quick = _point(1, 0.97, 500, b1=(0.5, 0.6), bn=(20.0, 25.0))
    assert recommend(_front(near, quick), Limits(max_metric_drop=0.02))[0] == 0


def test_no_point_meets_the_constraint() -> None:
    index, line = recommend(_front(_point(0, 0.80, 300)), Limits(max_metric_drop=0.02))
    assert index is None
    assert line.startswith("no recommendation: no shown point meets the constraints "
                           "(accuracy >= 0.9500)")
