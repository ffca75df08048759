"""Held-out intervals (mpsearch.analysis._uncertainty), and their run files."""

from __future__ import annotations

import csv
import math
from dataclasses import replace

import numpy as np
import pytest

from mpsearch.analysis import Z95, bootstrap_interval, wilson_interval
from mpsearch.evaluate import METRICS
from mpsearch.rundir import Baseline, Front, FrontPoint, RunDir


def test_wilson_interval_of_45_of_50_by_hand() -> None:
    """p = 0.9, z = 1.96: the roots of (0.9 - p)^2 = z^2 p (1 - p) / 50, i.e.
    p^2 (1 + z^2/50) - p (1.8 + z^2/50) + 0.81 = 0 -> p = 0.786398, 0.956524 (tables: 0.7864,
    0.9565)."""
    a, b = 1 + Z95**2 / 50, -(1.8 + Z95**2 / 50)
    root = math.sqrt(b * b - 4 * a * 0.81)
    low, high = wilson_interval(45, 50)
    assert (low, high) == pytest.approx(((-b - root) / (2 * a), (-b + root) / (2 * a)),
                                        abs=1e-12)
    assert (round(low, 4), round(high, 4)) == (0.7864, 0.9565)


def test_wilson_interval_at_the_ends_stays_in_the_unit_interval() -> None:
    assert wilson_interval(0, 50) == pytest.approx((0.0, 0.0713476), abs=1e-7)
    assert wilson_interval(50, 50) == pytest.approx((0.9286524, 1.0), abs=1e-7)
    with pytest.raises(ValueError, match="got 51 of 50"):
        wilson_interval(51, 50)


def test_bootstrap_interval_of_a_constant_metric_is_a_point() -> None:
    outputs = np.ones((20, 3))
    assert bootstrap_interval(METRICS["mse"].fn, outputs, outputs, None) == (0.0, 0.0)


def test_bootstrap_interval_of_agreement_matches_the_normal_approximation() -> None:
    """45 of 50 agree: normal approximation 0.9 +- 1.96 sqrt(0.09 / 50) = (0.8168, 0.9832);
    the bootstrap's quantiles move in steps of 1/50."""
    reference = np.eye(2)[np.zeros(50, dtype=int)]
    outputs = reference.copy()
    outputs[:5] = np.eye(2)[1]
    low, high = bootstrap_interval(METRICS["agreement"].fn, outputs, reference, None,
                                   rounds=2000, seed=3)
    assert abs(low - 0.8168) <= 0.021 and abs(high - 0.9832) <= 0.021
    assert bootstrap_interval(METRICS["agreement"].fn, outputs, reference, None,
                              rounds=2000, seed=3) == (low, high)  # seeded


def _front(points: tuple[FrontPoint, ...]) -> Front:
    return Front(metric="agreement", higher_is_better=True, objectives=("metric", "size"),
                 fp32=Baseline(metric=1.0, size=400), uniform={}, points=points,
                 evaluations=2, seconds=1.0)


def _point(index: int, metric: float, size: int, **extra: object) -> FrontPoint:
    return FrontPoint(index=index, trial=index, metric=metric, search_metric=metric, size=size,
                      latency=None, metrics={"agreement": metric}, assignment={"a": "int8"},
                      counts={"int8": 1}, differs_from_int8=(), source="seed",
                      **extra)  # type: ignore[arg-type]


def test_front_files_carry_interval_and_dominated(tmp_path: object) -> None:
    run = RunDir(tmp_path).create()  # type: ignore[arg-type]
    points = (_point(0, 0.9, 100, interval=wilson_interval(45, 50),
                     latency_ms=0.25, latency_ms_interval=(0.2, 0.3)),
              _point(1, 0.86, 120, interval=wilson_interval(43, 50), dominated=True,
                     shown=False, beaten_by="point 0"))
    front = replace(_front(points), recommended=0, recommendation="deploy point 0: ...")
    run.write_front(front)
    assert run.read_front() == front
    rows = list(csv.DictReader(run.front_csv.open()))
    assert [(r["metric"], r["metric_low"][:6], r["metric_high"][:6], r["dominated"],
             r["shown"], r["beaten_by"], r["latency_ms_low"], r["latency_ms_high"])
            for r in rows] == [("0.9", "0.7863", "0.9565", "False", "True", "", "0.2", "0.3"),
                               ("0.86", "0.7381", "0.9304", "True", "False", "point 0", "",
                                "")]


def test_front_json_without_intervals_still_reads() -> None:
    data = _point(0, 0.9, 100).to_dict()
    del data["interval"], data["dominated"], data["shown"], data["beaten_by"]
    del data["latency_ms_interval"], data["batch_latency_ms_interval"]
    point = FrontPoint.from_dict(data)
    assert (point.interval, point.dominated, point.shown, point.beaten_by) == (None, False,
                                                                               True, None)
    assert point.latency_ms_interval is None
