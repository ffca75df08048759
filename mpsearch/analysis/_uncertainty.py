"""How sure a held-out measurement is: 95 % intervals.

Consumes a metric's value and sample count (accuracy-like metrics, which are proportions k / n)
or its per-sample outputs (any other metric); produces ``(low, high)`` intervals:

* :func:`wilson_interval`: the Wilson score interval of a binomial proportion (accuracy, top5,
  agreement, a user metric marked ``proportion``:
  :func:`mpsearch.evaluate.is_proportion`), which stays inside [0, 1] and is sensible at k = 0
  or k = n;
* :func:`bootstrap_interval`: the seeded percentile bootstrap over samples for every other
  metric (SQNR, MSE, cosine, other user metrics).

Which points another beats after the re-measure is :mod:`mpsearch.pareto`'s rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["Z95", "bootstrap_interval", "wilson_interval"]

#: The two-sided 95 % standard normal quantile.
Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of ``successes`` out of ``n`` (``n`` > 0)."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"Wilson interval: need 0 <= successes <= n and n > 0, got "
                         f"{successes} of {n}")
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_interval(
    metric: Callable[[np.ndarray, np.ndarray, np.ndarray | None], float],
    outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, *,
    rounds: int = 1000, level: float = 0.95, seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``metric(outputs, reference, labels)`` over samples
    (``rounds`` resamples with replacement, seeded)."""
    rng = np.random.default_rng(seed)
    n = len(outputs)
    values = np.empty(rounds)
    for r in range(rounds):
        pick = rng.integers(0, n, size=n)
        values[r] = metric(outputs[pick], reference[pick],
                           None if labels is None else labels[pick])
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return math.nan, math.nan
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)
