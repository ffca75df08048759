"""The one latency clock: repeated, interleaved runs; a median and an interval.

Consumes zero-argument callables (each runs one configuration once, e.g. an ONNX Runtime session
on one batch); produces a :class:`Timing` per callable. Every latency mpsearch reports is timed
here, with one repeat policy: a warm-up run each, then :data:`ROUNDS` rounds, each running every
configuration once, in an order rotated from round to round, so that load on the machine (other
processes, frequency scaling) falls on every configuration alike. The median is the latency;
the interval is the distribution-free 95 % interval of that median (order statistics).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ROUNDS", "Timing", "median_interval", "time_runs"]

#: Timed runs of each configuration (after one warm-up run): nine is the fewest whose median's
#: 95 % order-statistic interval leaves out the fastest and the slowest run (the second and the
#: eighth: 96.1 % coverage), so that one run a burst of load slowed does not set it.
ROUNDS = 9


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Seconds of one run of a configuration: the median of ``runs`` runs and its 95 %
    interval ``(low, high)``."""

    seconds: float
    low: float
    high: float
    runs: int

    @property
    def interval_ms(self) -> tuple[float, float]:
        return 1e3 * self.low, 1e3 * self.high


def median_interval(times: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The order-statistic interval ``(x_(k), x_(n+1-k))`` of the median of ``times``, with
    the largest ``k`` whose two-sided coverage is at least ``level`` (at n < 7 no order
    statistics reach 95 %: the fastest and the slowest run)."""
    ordered = sorted(times)
    n = len(ordered)
    if n == 0:
        raise ValueError("median_interval: no times")
    tail, k, below = (1.0 - level) / 2, 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2.0 ** n  # P(fewer than k + 1 runs below the median)
        if below > tail:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def time_runs(runs: Sequence[Callable[[], object]], *, rounds: int = ROUNDS,
              warmup: bool = True, prior: Sequence[Sequence[float]] = ()) -> tuple[Timing, ...]:
    """Time each of ``runs`` :data:`ROUNDS` times, interleaved (module doc); ``prior[i]``:
    seconds of warm runs of ``runs[i]`` already made, which count towards its rounds (the
    latest first), and skip its warm-up."""
    times: list[list[float]] = [list(prior[i])[-rounds:] if i < len(prior) else []
                                for i in range(len(runs))]
    if warmup:
        for run, done in zip(runs, times, strict=True):
            if not done:
                run()
    for r in range(rounds):
        order = list(range(len(runs)))
        order = order[r % len(order):] + order[:r % len(order)] if order else order
        for i in order:
            if len(times[i]) >= rounds:
                continue
            start = time.perf_counter()
            runs[i]()
            times[i].append(time.perf_counter() - start)
    out = []
    for seconds in times:
        low, high = median_interval(seconds)
        out.append(Timing(seconds=float(np.median(seconds)), low=low, high=high,
                          runs=len(seconds)))
    return tuple(out)
