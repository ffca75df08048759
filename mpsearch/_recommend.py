"""The one point a search recommends deploying, and its line for people.

Consumes a judged :class:`~mpsearch.rundir.Front` (held-out metrics with their 95 % intervals,
sizes, latencies with their spreads, shown points) and the user's constraints; produces the
index of a shown point (or None) and the line the CLI, the report and the web page print.

The rule (docs/results.md, "The recommendation"):

1. Candidates: the shown points within the size limit (``constraints.max_size_bytes``, and the
   profile's memory budget when ``constraints.memory_budget`` is on) that the target's
   verification did not reject (``target_failure``); for an accelerator profile, not the
   points its toolchain placed wholly on the CPU (those are "keep it on the CPU" answers).
2. With a metric constraint (``min_metric``, or FP32's held-out metric minus
   ``max_metric_drop``): the candidates whose whole 95 % interval meets it; if none, those whose
   held-out metric meets it; if none still, FP32 is the answer ("keep FP32: nothing quantized
   meets ..."). Without one: the candidates whose interval reaches the best candidate's metric.
3. Only where latency is one of the spec's objectives, and only by measurable differences
   (spreads that do not overlap): drop the points measurably slower than FP32 at batch 1 and at
   the timing batch alike, unless that leaves none.
4. Of those, the smallest (sizes within 0.1 % tie); among ties, where latency is an objective,
   those no other tied point is measurably faster than at the timing batch, then at batch 1;
   then the better metric, the fewer distinct formats, the lower index.

A chosen point no smaller than FP32 (beyond the tie) is FP32 itself, and the line says so,
unless the profile's toolchain ran it on the accelerator (HTP and RKNN run float as fp16):
that point is deployed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mpsearch._wording import format_bytes, measurably_slower
from mpsearch.pareto import SIZE_TIE
from mpsearch.rundir import Front, FrontPoint

__all__ = ["Limits", "formats_used", "recommend", "recommendation_line"]

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
    #: The profile's target is an accelerator (FP32 would then run on the CPU).
    accelerator: bool = False


def recommend(front: Front, limits: Limits) -> tuple[int | None, str]:
    """The index of the point to deploy (module doc) and the line saying so."""
    sign = 1.0 if front.higher_is_better else -1.0
    sized = [p for p in front.shown if limits.max_size is None or p.size <= limits.max_size]
    candidates = [p for p in sized if p.target_failure is None
                  and not (limits.accelerator and _all_on_cpu(p))]
    if sized and not any(p.target_failure is None for p in sized):
        reasons = sorted({str(p.target_failure) for p in sized})
        return None, f"no verified point: {'; '.join(reasons)}; stopped: {limits.stop}"
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
        return None, _nothing(front, limits, floor, bool(front.shown))
    timed = "latency" in front.objectives
    if timed:
        chosen = [p for p in chosen if not _slower_than_fp32(p, front)] or chosen
    point = _pick(chosen, sign, timed)
    if not _quantized(point, front) and not (limits.accelerator and _on_accelerator(point)):
        return point.index, _keep_fp32(front, limits, floor, f"point {point.index} is FP32 "
                                       "itself")
    return point.index, recommendation_line(front, point, limits.stop)


def _all_on_cpu(point: FrontPoint) -> bool:
    """Whether the target's toolchain placed every node of ``point`` on the CPU (False when
    the point was not placed)."""
    placed = point.target_placement or {}
    return bool(placed.get("nodes")) and not placed.get("on_accelerator")


#: Float precisions in a placement's counts ("accelerator:fp16", "cpu:fp32", ...).
_FLOATS = ("fp16", "fp32", "bf16")


def _on_accelerator(point: FrontPoint) -> bool:
    """Whether the target's toolchain ran most of ``point``'s float nodes on its accelerator:
    an FP32-sized point the HTP or the RKNN NPU runs in fp16 is a deployment there, one whose
    float nodes Vela leaves to the CPU is "keep FP32 on the CPU"."""
    counts = (point.target_placement or {}).get("counts") or {}

    def floats(unit: str) -> int:
        return sum(int(n) for key, n in counts.items()
                   if key.split(":")[0] == unit and key.split(":")[-1] in _FLOATS)

    return floats("accelerator") > floats("cpu")


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


def _quantized(point: FrontPoint, front: Front) -> bool:
    """Whether ``point`` is smaller than FP32 beyond the size tie (else it is FP32 itself)."""
    return point.size * (1.0 + SIZE_TIE) < front.fp32.size


def formats_used(point: FrontPoint) -> int:
    """How many distinct formats ``point`` gives its searched nodes (fewer is simpler)."""
    return sum(1 for n in point.counts.values() if n > 0)


def _pick(points: Sequence[FrontPoint], sign: float, timed: bool) -> FrontPoint:
    """The smallest of ``points`` (sizes within SIZE_TIE tie); then, with ``timed`` (latency
    is an objective), those no other is measurably faster than at the timing batch, then at
    batch 1; then the best metric, the fewest formats, the lowest index."""
    smallest = min(p.size for p in points)
    tied = [p for p in points if p.size <= smallest * (1 + SIZE_TIE)]
    if timed:
        for spread in (_batch_spread, _one_spread):
            tied = [p for p in tied
                    if not any(measurably_slower(spread(p), spread(q)) for q in tied)] or tied
    return min(tied, key=lambda p: (-sign * p.metric, formats_used(p), p.index))


def _one_spread(point: FrontPoint) -> tuple[float, float] | None:
    return point.latency_ms_interval


def _batch_spread(point: FrontPoint) -> tuple[float, float] | None:
    return point.batch_latency_ms_interval


def _slower_than_fp32(point: FrontPoint, front: Front) -> bool:
    """Whether ``point`` is measurably slower than FP32 at every batch both were timed at."""
    fp32 = front.fp32
    pairs = [(point.latency_ms_interval, fp32.latency_ms_interval),
             (point.batch_latency_ms_interval, fp32.batch_latency_ms_interval)]
    timed = [(mine, theirs) for mine, theirs in pairs if mine is not None and theirs is not None]
    return bool(timed) and all(measurably_slower(mine, theirs) for mine, theirs in timed)


def _constraints(front: Front, limits: Limits, floor: float | None) -> str:
    parts = []
    if floor is not None:
        parts.append(f"{front.metric} {'>=' if front.higher_is_better else '<='} {floor:.4f}")
    if limits.max_size is not None:
        parts.append(f"size <= {format_bytes(limits.max_size)}")
    return ", ".join(parts)


def _nothing(front: Front, limits: Limits, floor: float | None, any_candidate: bool) -> str:
    """The line when no point meets the constraints (``any_candidate``: some point is shown):
    keep FP32 where FP32 meets them."""
    sign = 1.0 if front.higher_is_better else -1.0
    fp32_fits = ((floor is None or sign * front.fp32.metric >= sign * floor - _EPS)
                 and (limits.max_size is None or front.fp32.size <= limits.max_size))
    if any_candidate and fp32_fits:
        return _keep_fp32(front, limits, floor, None)
    why = (f"no shown point meets the constraints ({_constraints(front, limits, floor)})"
           if any_candidate else "no point is shown")
    return f"no recommendation: {why}; stopped: {limits.stop}"


def _keep_fp32(front: Front, limits: Limits, floor: float | None, note: str | None) -> str:
    """"keep FP32: nothing quantized meets <constraints>" (on the CPU, for an accelerator)."""
    constraints = _constraints(front, limits, floor) or (
        f"{front.metric} within the 95 % interval of the best point found")
    where = ("keep FP32 on the CPU: no point that runs on the accelerator meets"
             if limits.accelerator else "keep FP32: nothing quantized meets")
    fp32 = f"FP32: {front.metric} {front.fp32.metric:.4f}, {format_bytes(front.fp32.size)}"
    return (f"{where} {constraints} ({fp32}{'' if note is None else '; ' + note}); "
            f"stopped: {limits.stop}")


def recommendation_line(front: Front, point: FrontPoint, stop: str) -> str:
    """"deploy point K: X kB (Nx smaller than FP32), metric V (-D vs FP32, 95 % CI [lo, hi]);
    latency <words>; stopped: <why>", the latency in :func:`latency_words`'s words, saying when
    latency did not count (not one of the objectives)."""
    fp32 = front.fp32
    size = f"{format_bytes(point.size)} ({fp32.size / max(point.size, 1):.1f}x smaller than FP32)"
    drop = point.metric - fp32.metric
    interval = ("" if point.interval is None else
                f", 95 % CI [{point.interval[0]:.4f}, {point.interval[1]:.4f}]")
    latency = front.latency_words(point)
    if "latency" not in front.objectives:
        latency += " (latency did not count: not one of the objectives)"
    return (f"deploy point {point.index}: {size}, {front.metric} {point.metric:.4f} "
            f"({drop:+.4f} vs FP32{interval}); latency {latency}; stopped: {stop}")

