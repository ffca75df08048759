"""The one point a search recommends deploying, and its line for people.

Consumes a judged :class:`~mpsearch.rundir.Front` (held-out metrics with their 95 % intervals,
sizes, latencies, shown points) and the user's constraints; produces the index of a shown point
(or None) and the line the CLI, the report and the web page print.

The rule (docs/results.md, "The recommendation"):

1. Candidates: the shown points within the size limit (``constraints.max_size_bytes``, and the
   profile's memory budget when ``constraints.memory_budget`` is on).
2. With a metric constraint (``min_metric``, or FP32's held-out metric minus
   ``max_metric_drop``): the candidates whose whole 95 % interval meets it; if none, those whose
   held-out metric meets it; if none still, no recommendation. Without one: the candidates
   whose interval reaches the best candidate's metric (not measurably worse than it).
3. Where latency is measured, drop the points measurably slower than FP32 (their fastest run
   slower than FP32's slowest) at batch 1 and at the spec's batch alike, unless that leaves
   none: a point slower than the model it replaces at every batch is no deployment answer.
4. Of those, the smallest (sizes within 0.1 % tie); among ties the faster, then the better
   metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mpsearch.pareto import SIZE_TIE
from mpsearch.rundir import Front, FrontPoint, format_bytes, versus_fp32

__all__ = ["Limits", "recommend", "recommendation_line"]

#: Rounding slack of metric comparisons (a Wilson bound of k = n computes to 1 - 1e-16).
_EPS = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The user's constraints on held-out data and why the search ended."""

    min_metric: float | None = None
    max_metric_drop: float | None = None
    max_size: int | None = None
    #: Why the search ended ("the front did not change ...", "trial budget used ...").
    stop: str = "trial budget used"


def recommend(front: Front, limits: Limits) -> tuple[int | None, str]:
    """The index of the point to deploy (module doc) and the line saying so."""
    sign = 1.0 if front.higher_is_better else -1.0
    candidates = [p for p in front.shown
                  if limits.max_size is None or p.size <= limits.max_size]
    floor = _floor(front, limits)
    if floor is not None:
        chosen = [p for p in candidates if sign * _worst(p, sign) >= sign * floor - _EPS] or \
            [p for p in candidates if sign * p.metric >= sign * floor - _EPS]
    elif candidates:
        best = max(candidates, key=lambda p: sign * p.metric)
        chosen = [p for p in candidates
                  if p is best or sign * _best(p, sign) >= sign * best.metric - _EPS]
    else:
        chosen = []
    if not chosen:
        why = (f"no shown point meets the constraints ({_constraints(front, limits, floor)})"
               if candidates else "no point is shown")
        return None, f"no recommendation: {why}; stopped: {limits.stop}"
    point = _pick([p for p in chosen if not _slower(p, front)] or chosen, sign)
    return point.index, recommendation_line(front, point, limits.stop)


def _floor(front: Front, limits: Limits) -> float | None:
    """The metric every recommended point must reach (None: no metric constraint)."""
    floors = [] if limits.min_metric is None else [limits.min_metric]
    if limits.max_metric_drop is not None:
        fp32 = front.fp32.metric
        floors.append(fp32 - limits.max_metric_drop if front.higher_is_better
                      else fp32 + limits.max_metric_drop)
    if not floors:
        return None
    return max(floors) if front.higher_is_better else min(floors)


def _worst(point: FrontPoint, sign: float) -> float:
    """The pessimistic end of ``point``'s 95 % interval (its metric when unknown)."""
    if point.interval is None or point.interval[0] != point.interval[0]:
        return point.metric
    return point.interval[0] if sign > 0 else point.interval[1]


def _best(point: FrontPoint, sign: float) -> float:
    """The optimistic end of ``point``'s 95 % interval (its metric when unknown)."""
    if point.interval is None or point.interval[0] != point.interval[0]:
        return point.metric
    return point.interval[1] if sign > 0 else point.interval[0]


def _pick(points: Sequence[FrontPoint], sign: float) -> FrontPoint:
    """The smallest of ``points`` (sizes within SIZE_TIE tie), then the fastest, then the
    best metric."""
    smallest = min(p.size for p in points)
    tied = [p for p in points if p.size <= smallest * (1 + SIZE_TIE)]
    return min(tied, key=lambda p: (_speed(p), -sign * p.metric, p.size, p.index))


def _slower(point: FrontPoint, front: Front) -> bool:
    """Whether ``point`` is measurably slower than FP32 at every batch both were timed at."""
    fp32 = front.fp32
    pairs = [(point.latency_ms_interval, fp32.latency_ms_interval),
             (point.batch_latency_ms_interval, fp32.batch_latency_ms_interval)]
    timed = [(mine, theirs) for mine, theirs in pairs if mine is not None and theirs is not None]
    return bool(timed) and all(mine[0] > theirs[1] for mine, theirs in timed)


def _speed(point: FrontPoint) -> float:
    latency = point.latency_ms if point.latency_ms is not None else point.latency
    return float("inf") if latency is None else latency


def _constraints(front: Front, limits: Limits, floor: float | None) -> str:
    parts = []
    if floor is not None:
        parts.append(f"{front.metric} {'>=' if front.higher_is_better else '<='} {floor:.4f}")
    if limits.max_size is not None:
        parts.append(f"size <= {format_bytes(limits.max_size)}")
    return ", ".join(parts) or "none"


def recommendation_line(front: Front, point: FrontPoint, stop: str) -> str:
    """"deploy point K: X kB (Nx smaller than FP32), Y ms (Mx faster than FP32), metric V
    (-D vs FP32, 95 % CI [lo, hi]); stopped: <why>"."""
    fp32 = front.fp32
    size = f"{format_bytes(point.size)} ({fp32.size / max(point.size, 1):.1f}x smaller than FP32)"
    if point.latency_ms is not None:
        latency = f"{point.latency_ms:.3g} ms at batch 1 ({versus_fp32(point.latency)})"
    elif point.latency is not None:
        latency = f"latency {versus_fp32(point.latency)} (the profile's estimate)"
    else:
        latency = "latency unknown"
    drop = point.metric - fp32.metric
    interval = ("" if point.interval is None else
                f", 95 % CI [{point.interval[0]:.4f}, {point.interval[1]:.4f}]")
    return (f"deploy point {point.index}: {size}, {latency}, {front.metric} "
            f"{point.metric:.4f} ({drop:+.4f} vs FP32{interval}); stopped: {stop}")
