"""Racing: a trial's metric is measured on a first chunk of the search split, then on twice as
many samples, and so on up to all of them; a trial that cannot reach the front is pruned at the
first stage that shows it, so hopeless configurations cost a fraction of a full measurement.

Racing by SQNR compares scores against a slack calibrated on the model's own completed trials
(:func:`sqnr_slack`). Pure: no Optuna here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from mpsearch.analysis import Measurement, wilson_interval
from mpsearch.evaluate import is_proportion
from mpsearch.search._score import score, worse

__all__ = ["RACE_CALIBRATION", "RACE_FLOOR_DB", "RACE_SAFETY", "SQNR_SLACK_DB",
           "SQNR_SLACK_SAMPLES", "hopeless", "race_stages", "sqnr_slack"]

#: Racing by SQNR: a trial measured on ``n`` samples is pruned when a finished one at no larger
#: size beats it by more than a slack (:func:`sqnr_slack`): SQNR_SLACK_DB *
#: sqrt(SQNR_SLACK_SAMPLES / n) dB until RACE_CALIBRATION completed trials passed that stage,
#: then RACE_SAFETY times the largest rise from the stage to the final score they showed, at
#: least RACE_FLOOR_DB, so the race is as tight as the model's own sample-to-sample noise
#: allows.
SQNR_SLACK_DB = 3.0
SQNR_SLACK_SAMPLES = 32
RACE_CALIBRATION = 10
RACE_SAFETY = 1.5
RACE_FLOOR_DB = 0.5


def race_stages(total: int, chunks: int) -> tuple[int, ...]:
    """Sample counts a trial is measured on, in order: ``total // chunks``, doubling, then
    ``total`` (just ``total`` when ``chunks`` is 1)."""
    stages = [total]
    if chunks > 1:
        stage = max(1, total // chunks)
        while stage < total:
            stages.insert(-1, stage)
            stage *= 2
    return tuple(stages)


def sqnr_slack(samples: int, gains: Mapping[int, Sequence[float]]) -> float:
    """How far below a finished trial's SQNR a trial measured on its first ``samples`` samples
    may score and still race on. ``gains``: per stage, how much each completed trial's score
    rose from that stage to its final one. Calibrated on the model once
    :data:`RACE_CALIBRATION` completed trials passed this stage: :data:`RACE_SAFETY` times the
    largest rise seen (at least :data:`RACE_FLOOR_DB`); before that SQNR_SLACK_DB *
    sqrt(SQNR_SLACK_SAMPLES / n). The first samples of the search split can be easier or harder
    than the rest for every configuration alike: a shift the fixed rule misjudges, in both
    directions."""
    rises = gains.get(samples, ())
    if len(rises) >= RACE_CALIBRATION:
        return max(RACE_FLOOR_DB, RACE_SAFETY * max(rises))
    return SQNR_SLACK_DB * math.sqrt(SQNR_SLACK_SAMPLES / samples)


def hopeless(partial: Measurement, *, size: float, higher: bool, by_sqnr: bool,
             min_metric: float | None, gains: Mapping[int, Sequence[float]],
             finished: Iterable[tuple[float, float, float]]) -> bool:
    """Whether ``partial`` (a trial's measurement on part of the search split, its model
    ``size`` bytes) cannot reach the front: it misses ``min_metric``, or a ``finished`` trial
    (objective value, size, metric) at no larger size beats it by a clear margin. Its metric
    beats the optimistic end of this one's interval at three standard errors (Wilson's for
    accuracy-like metrics, k of n samples; else a proportion's widest), or by SQNR its score
    beats this one's by more than :func:`sqnr_slack`. A strict beat on the metric, not
    dominance: an equal count must race on, since the score's SQNR tie-break may still rank it
    above the smaller trial."""
    metric, samples = partial.value, partial.samples
    if is_proportion(partial.primary) and higher:
        optimistic = wilson_interval(round(metric * samples), samples, z=3.0)[1]
    else:
        slack = 3.0 * math.sqrt(0.25 / samples)
        optimistic = metric + slack if higher else metric - slack
    if min_metric is not None and worse(optimistic, min_metric, higher=higher):
        return True
    if by_sqnr:  # beaten in SQNR by more than its slack at this sample count
        best = score(partial, higher=higher, by_sqnr=True) + sqnr_slack(samples, gains)
        return any(other_size <= size and value > best for value, other_size, _ in finished)
    return any(other_size <= size and worse(optimistic, other, higher=higher)
               for _, other_size, other in finished)
