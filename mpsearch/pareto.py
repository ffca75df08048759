"""The one Pareto rule of mpsearch: dominance, dominated flags, front thinning, hypervolume.

Consumes points ``(metric, size, latency)``: the metric in its own direction
(``higher_is_better``), the size in bytes and the latency in any one unit (both lower is better),
the latency None (or NaN) when unknown; produces flags, indices and areas. The search, its
exploration and patience stop, the held-out front, the progress chart of ``mpsearch serve`` and
the benchmarks all judge points here, so they agree on every tie.

The rule (a point ``a`` is *no worse* than ``b`` when all three hold):

* metric: ``a``'s is at least ``b``'s (a NaN metric is worse than any number);
* size: ``a``'s is at most ``b``'s times ``1 + SIZE_TIE``: sizes within 0.1 % tie, so a few
  bytes of 16-bit zero points do not keep a less accurate configuration beside a better one;
* latency: compared only when both points have one. A missing latency is no evidence either
  way: such a point is judged on metric and size alone. Where timed latencies come with their
  spreads (``spreads``: ``[fastest, slowest]`` per batch timed), ``a`` is no worse than ``b``
  unless it is *measurably* slower at some batch (its fastest run slower than ``b``'s slowest):
  timing noise never makes one point beat another.

``a`` *dominates* ``b`` when ``a`` is no worse than ``b`` and ``b`` is not no worse than ``a``
(``a`` is better beyond the tie on at least one objective).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["SIZE_TIE", "Point", "dominated_flags", "dominates", "dominators", "hypervolume",
           "matched", "nondominated", "thin"]

#: Sizes within this fraction of each other tie.
SIZE_TIE = 1e-3

#: (metric, size, latency or None).
Point = tuple[float, float, float | None]

#: A point's latency spreads, ``(fastest, slowest)`` per batch timed, None where untimed.
Spreads = Sequence[tuple[float, float] | None]


def _spread_array(spreads: Sequence[Spreads]) -> np.ndarray:
    """``spreads`` as an array ``[point, batch, (fastest, slowest)]``, NaN where untimed."""
    width = max((len(s) for s in spreads), default=0)
    out = np.full((len(spreads), width, 2), math.nan)
    for i, per_batch in enumerate(spreads):
        for k, spread in enumerate(per_batch):
            if spread is not None:
                out[i, k] = spread
    return out


def _no_worse(points: Sequence[Point], others: Sequence[Point], *, higher_is_better: bool,
              metric_margin: float = 0.0, size_tie: float = SIZE_TIE,
              latency_tie: float = 0.0,
              spreads: tuple[Sequence[Spreads], Sequence[Spreads]] | None = None
              ) -> np.ndarray:
    """``[i, j]``: whether ``points[i]`` is no worse than ``others[j]`` (module doc), with
    ``metric_margin`` (metric units) and ``size_tie``/``latency_tie`` (fractions) of slack;
    ``spreads`` (of ``points``, of ``others``) replace the latencies by their spreads."""
    def columns(pts: Sequence[Point]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sign = 1.0 if higher_is_better else -1.0
        arr = np.array([(m, s, math.nan if lat is None else lat) for m, s, lat in pts],
                       dtype=float).reshape(-1, 3)
        good = sign * arr[:, 0]
        good[np.isnan(good)] = -math.inf
        return good, arr[:, 1], arr[:, 2]

    ga, sa, la = columns(points)
    gb, sb, lb = columns(others)
    metric = ga[:, None] >= gb[None, :] - metric_margin
    size = sa[:, None] <= sb[None, :] * (1.0 + size_tie)
    if spreads is not None:
        mine, theirs = _spread_array(spreads[0]), _spread_array(spreads[1])
        width = min(mine.shape[1], theirs.shape[1])
        with np.errstate(invalid="ignore"):
            slower = mine[:, None, :width, 0] > theirs[None, :, :width, 1]
        return np.asarray(metric & size & ~slower.any(axis=2))
    known = ~np.isnan(la)[:, None] & ~np.isnan(lb)[None, :]
    with np.errstate(invalid="ignore"):
        latency = ~known | (la[:, None] <= lb[None, :] * (1.0 + latency_tie))
    return np.asarray(metric & size & latency)


def dominates(a: Point, b: Point, *, higher_is_better: bool) -> bool:
    """Whether ``a`` dominates ``b`` (module doc)."""
    no_worse = _no_worse([a, b], [a, b], higher_is_better=higher_is_better)
    return bool(no_worse[0, 1] and not no_worse[1, 0])


def _beats(points: Sequence[Point], by: Sequence[Point], higher_is_better: bool,
           spreads: tuple[Sequence[Spreads], Sequence[Spreads]] | None = None) -> np.ndarray:
    """``[i, j]``: whether candidate ``i`` (``by``, then ``points``) dominates ``points[j]``;
    ``spreads``: those of ``points`` and of ``by``, when latencies are judged by them."""
    candidates = [*by, *points]
    pair = None if spreads is None else ([*spreads[1], *spreads[0]], spreads[0])
    forward = _no_worse(candidates, points, higher_is_better=higher_is_better, spreads=pair)
    backward = _no_worse(points, candidates, higher_is_better=higher_is_better,
                         spreads=None if pair is None else (pair[1], pair[0]))
    return np.asarray(forward & ~backward.T)


def dominated_flags(points: Sequence[Point], *, higher_is_better: bool,
                    by: Sequence[Point] = (),
                    spreads: tuple[Sequence[Spreads], Sequence[Spreads]] | None = None
                    ) -> tuple[bool, ...]:
    """For each point, whether another of ``points`` or one of ``by`` (extra candidates, such
    as the uniform baselines) dominates it; ``spreads`` as in :func:`dominators`."""
    if not points:
        return ()
    beats = _beats(points, by, higher_is_better, spreads)
    return tuple(bool(v) for v in np.any(beats, axis=0).tolist())


def dominators(points: Sequence[Point], *, higher_is_better: bool, by: Sequence[Point] = (),
               spreads: tuple[Sequence[Spreads], Sequence[Spreads]] | None = None
               ) -> tuple[int | None, ...]:
    """For each point, the index of a candidate that dominates it, else None; candidates are
    ``by`` first (indices ``0..len(by) - 1``), then ``points`` (``len(by) + i``). Among several
    the one named is one of ``by`` if any, else one no candidate dominates if any; of those the
    first with the best metric. ``spreads`` (those of ``points``, then of ``by``) judge latency
    by measurable differences only (module doc)."""
    if not points:
        return ()
    beats = _beats(points, by, higher_is_better, spreads)
    beaten = [False] * len(by) + [bool(v) for v in np.any(beats, axis=0).tolist()]
    sign = 1.0 if higher_is_better else -1.0
    good = [sign * m if m == m else -math.inf for m, _, _ in [*by, *points]]
    out: list[int | None] = []
    for j in range(len(points)):
        winners = [int(i) for i in np.flatnonzero(beats[:, j])]
        pool = ([i for i in winners if i < len(by)] or [i for i in winners if not beaten[i]]
                or winners)
        out.append(max(pool, key=lambda i: (good[i], -i)) if pool else None)
    return tuple(out)


def nondominated(points: Sequence[Point], *, higher_is_better: bool) -> tuple[int, ...]:
    """Indices of the points no other point dominates, in input order."""
    flags = dominated_flags(points, higher_is_better=higher_is_better)
    return tuple(i for i, flag in enumerate(flags) if not flag)


def matched(point: Point, others: Sequence[Point], *, higher_is_better: bool,
            metric_margin: float, relative: float, latency_relative: float | None = None
            ) -> bool:
    """Whether one of ``others`` is no worse than ``point`` within ``metric_margin`` on the
    metric, the fraction ``relative`` on size and ``latency_relative`` (default ``relative``)
    on latency: ``point`` did not move the front (the search's patience stop)."""
    if not others:
        return False
    latency_tie = relative if latency_relative is None else latency_relative
    no_worse = _no_worse(others, [point], higher_is_better=higher_is_better,
                         metric_margin=metric_margin, size_tie=relative, latency_tie=latency_tie)
    return bool(no_worse.any())


def thin(sizes: Sequence[float], metrics: Sequence[float], limit: int) -> tuple[int, ...]:
    """At most ``limit`` (>= 2) indices of a front sorted by size: the smallest and the largest
    point, and between them the points nearest to evenly spaced marks along the front's length
    in (log size, metric), each axis scaled to [0, 1]."""
    if len(sizes) <= limit:
        return tuple(range(len(sizes)))
    xs = np.log(np.maximum(np.asarray(sizes, dtype=float), 1.0))
    ys = np.nan_to_num(np.asarray(metrics, dtype=float))
    span = [max(float(v.max() - v.min()), 1e-12) for v in (xs, ys)]
    steps = np.hypot(np.diff(xs) / span[0], np.diff(ys) / span[1])
    length = np.concatenate([[0.0], np.cumsum(steps)])
    chosen: list[int] = []
    for mark in np.linspace(0.0, length[-1], limit):
        order = np.argsort(np.abs(length - mark), kind="stable")
        chosen.append(next((int(i) for i in order if int(i) not in chosen), int(order[0])))
    return tuple(sorted(set(chosen)))


def hypervolume(points: Sequence[tuple[float, float]], ref_metric: float, ref_size: float, *,
                higher_is_better: bool = True) -> float:
    """Area that ``(metric, size)`` points dominate inside the box from the reference point
    ``(ref_metric, ref_size)`` (a worse metric, a larger size): metric better, size smaller.
    Points outside the box add nothing."""
    sign = 1.0 if higher_is_better else -1.0
    ref = sign * ref_metric
    inside = sorted((size, sign * metric) for metric, size in points
                    if sign * metric > ref and size < ref_size)
    area, best = 0.0, ref
    for i, (size, good) in enumerate(inside):
        best = max(best, good)
        right = inside[i + 1][0] if i + 1 < len(inside) else ref_size
        area += (right - size) * (best - ref)
    return area
