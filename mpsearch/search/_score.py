"""What a trial scores and what counts as better: the objective value the sampler optimizes and
the margins of the patience stop.

Spec ``evaluation.search_score``: the model output's SQNR against FP32 for ``agreement``
(continuous and stable across splits, where a count of 128 samples is not), else the metric; an
accuracy-like metric (k of n samples) carries a tie-break below one sample from the SQNR, so
that a larger, less noisy configuration with the same count is not dominated by a smaller,
noisier one. Pure: no Optuna here.
"""

from __future__ import annotations

import math

from mpsearch.analysis import Measurement
from mpsearch.evaluate import is_proportion

__all__ = ["FRONT_MARGIN_DB", "FRONT_MARGIN_LATENCY", "FRONT_MARGIN_RELATIVE", "SQNR_CAP",
           "front_margin", "score", "worse"]

#: Objective values in dB stay within +-SQNR_CAP (an output identical to FP32's is infinite).
SQNR_CAP = 1000.0

#: What moves the front, for the patience stop: a configuration no earlier one matches within
#: these margins. SQNR: 0.5 dB, above the disagreement of two data splits on one configuration;
#: a k-of-n metric: one sample; size: 0.5 %.
FRONT_MARGIN_DB = 0.5
FRONT_MARGIN_RELATIVE = 0.005
#: The latency margin of the patience stop: a trial's batch-1 time varies from run to run (load,
#: frequency scaling), so only a trial 10 % faster than every match moves the front.
FRONT_MARGIN_LATENCY = 0.10


def score(result: Measurement, *, higher: bool, by_sqnr: bool) -> float:
    """The objective value of ``result``: its output SQNR (dB, within +-SQNR_CAP) when the
    search scores ``by_sqnr``; else its metric (``higher`` is better or not), for an
    accuracy-like metric (``k`` of ``n`` samples, higher is better) plus ``t / n`` with
    ``t = s / (s + 30)`` in [0, 1) rising with the output SQNR ``s`` (dB, floored at 0): ``k``
    still decides; among equal counts the configuration with less output noise ranks higher."""
    sqnr = result.sqnr
    if by_sqnr:
        value = -SQNR_CAP if sqnr is None or math.isnan(sqnr) else sqnr
        return min(max(value, -SQNR_CAP), SQNR_CAP)
    if (not is_proportion(result.primary) or not higher or not result.samples
            or sqnr is None or math.isnan(sqnr)):
        return result.value
    s = max(sqnr, 0.0)
    tie = 1.0 if math.isinf(s) else s / (s + 30.0)
    return result.value + min(tie, 1.0 - 1e-9) / result.samples


def front_margin(*, by_sqnr: bool, primary: str, samples: int) -> float:
    """How much better than every earlier trial's objective value a trial must be to move the
    front (the patience stop): :data:`FRONT_MARGIN_DB` by SQNR, one of ``samples`` for a k-of-n
    ``primary`` metric, else any improvement."""
    if by_sqnr:
        return FRONT_MARGIN_DB
    if is_proportion(primary):
        return 1.0 / samples
    return 0.0


def worse(a: float, b: float, *, higher: bool) -> bool:
    """Whether metric ``a`` is strictly worse than ``b`` (``higher`` is better or not)."""
    return a < b if higher else a > b
