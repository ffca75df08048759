"""A run's results shaped into the run directory's records (:mod:`mpsearch.pipeline`'s helper).

Consumes an :class:`~mpsearch.analysis.Analysis`, or a search's result and the held-out
split's measurer; produces the analysis files and the typed :class:`~mpsearch.rundir.Front`
(each point re-measured on held-out data, with its 95 % interval, timed with the baselines by
:mod:`mpsearch.clock`, judged against them by :mod:`mpsearch.pareto`, and one recommended).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypedDict

from mpsearch._recommend import Limits, formats_used, recommend
from mpsearch._wording import measurably_slower
from mpsearch.analysis import (
    SCHEMA,
    STAT_COLUMNS,
    Analysis,
    CurvePoint,
    Measurement,
    Measurer,
    NodeSensitivity,
    RestoreGain,
    bootstrap_interval,
    wilson_interval,
)
from mpsearch.assignment import (
    Assignment,
    assignment_key,
    estimate_latency,
    make_assignment,
    model_size,
    table_format,
    uniform_assignment,
)
from mpsearch.clock import SPREAD_SECONDS, Timing, time_runs
from mpsearch.errors import QuantizationError
from mpsearch.evaluate import activation_budget, is_proportion, metric_floor
from mpsearch.graph import ModelGraph
from mpsearch.pareto import SIZE_TIE, dominators
from mpsearch.profiles import HardwareProfile, measures_latency
from mpsearch.progress import Progress, Reporter
from mpsearch.rundir import Baseline, Front, FrontPoint, RunDir
from mpsearch.search import SearchResult, TrialRecord, group_nodes
from mpsearch.spec import Constraints, SearchSpec
from mpsearch.summary import ModelSummary

__all__ = ["collapse_ties", "held_out_front", "judge", "relative_latency", "timing_groups",
           "write_analysis"]


def write_analysis(run: RunDir, analysis: Analysis, fp32_size: int) -> None:
    """The analysis files of ``analysis`` (see the README's "Run directory"); ``fp32_size``
    is the FP32 model's weight bytes, the curve's reference."""
    data = analysis.to_dict()
    orders: dict[str, list[dict[str, Any]]] = {}
    for point in analysis.curve:
        orders.setdefault(point.order, []).append(point.to_dict())
    curve = {"schema": SCHEMA, "metric": analysis.metric,
             "higher_is_better": analysis.higher_is_better,
             "fp32_metric": analysis.fp32.get(analysis.metric),
             "fp32_size": fp32_size, "orders": orders}
    distributions = {"schema": SCHEMA, "nodes": [d.to_dict() for d in analysis.distributions]}
    run.write_analysis(data, curve=curve, distributions=distributions, tables={
        "sensitivity": (list(NodeSensitivity.__dataclass_fields__), data["nodes"]),
        "reverse": (list(RestoreGain.__dataclass_fields__), data["reverse"]["rows"]),
        "curve": (list(CurvePoint.__dataclass_fields__), [p.to_dict() for p in analysis.curve]),
        "distributions": (list(STAT_COLUMNS),
                          [r for d in analysis.distributions for r in d.rows()]),
    })


def relative_latency(latency: float | None, fp32: Baseline) -> float | None:
    """``latency`` as a fraction of FP32's (None when either is unknown)."""
    return None if latency is None or not fp32.latency_abs else latency / fp32.latency_abs


def held_out_front(summary: ModelSummary, spec: SearchSpec, result: SearchResult,
                   held: Measurer, searched_by: Measurer, progress: Reporter | None = None
                   ) -> Front:
    """The searched front re-measured by the ``held`` measurer (the held-out split): each
    point with its 95 % interval and its latency (timed where this host runs the profile's
    target, the estimate beside it), judged together with the FP32 and uniform baselines
    (:func:`judge`), and the recommended point (:func:`mpsearch._recommend.recommend`).
    ``progress`` hears stage ``held-out``, one step a front point and one for the timing."""
    graph, profile = held.quantizer.graph, held.quantizer.profile
    int8 = uniform_assignment(graph, profile, profile.lowest_formats()[0])
    searched = {n for g in group_nodes(graph, profile, spec.formats) for n in g.nodes}
    uniforms = _uniform_assignments(graph, profile)
    records = _with_uniform_trials(result, uniforms, held,
                                   _feasible(spec.constraints, profile, searched_by))
    points = []
    total = len(records) + 1
    for index, record in enumerate(records):
        if progress is not None:
            progress(Progress(stage="held-out", done=index, total=total, unit="step"))
        assignment = make_assignment(graph, profile, record.assignment)
        measured = held.measure(assignment)
        point = _point(record, index, measured.metrics, held.evaluator.primary.name, int8,
                       searched)
        points.append(replace(point, interval=_interval(held, assignment, measured, spec.seed)))
    metrics = {fmt: held.measure(assignment).value for fmt, assignment in uniforms.items()}
    if progress is not None:
        progress(Progress(stage="held-out", done=total - 1, total=total, unit="step"))
    held.release()  # the last point's session and outputs: the clock opens its own
    clock = _Clock(held, summary, spec.evaluation.batch_size)
    by_latency = "latency" in spec.objectives
    assignments = [{}, *uniforms.values(), *(p.assignment for p in points)]
    count = 1 + len(uniforms)

    def baselines(latencies: Sequence[_Latencies]) -> dict[str, Baseline]:
        fp32 = Baseline(metric=held.fp32().value, size=model_size(graph, profile, {}),
                        latency_abs=clock.fp32_abs, **latencies[0])
        return {"fp32": fp32, **{
            fmt: Baseline(metric=metrics[fmt], size=model_size(graph, profile, assignment),
                          **latencies[1 + i])
            for i, (fmt, assignment) in enumerate(uniforms.items())}}

    timed = None
    if not by_latency:  # which points are shown needs no latency: time the baselines and those
        unseen = judge(points, baselines([{}] * count), higher_is_better=held.higher_is_better,
                       timed=False)
        timed = [True] * count + [p.shown for p in unseen]
    latencies = clock.latencies(assignments, timed)
    named = baselines(latencies)
    points = [replace(p, **latencies[count + i]) for i, p in enumerate(points)]
    points = judge(points, named, higher_is_better=held.higher_is_better, timed=by_latency)
    fp32, uniform = named["fp32"], {k: v for k, v in named.items() if k != "fp32"}
    front = Front(metric=searched_by.evaluator.primary.name,
                  higher_is_better=searched_by.higher_is_better, objectives=spec.objectives,
                  fp32=fp32, uniform=uniform, points=tuple(points),
                  evaluations=result.evaluations, seconds=result.seconds, timing=result.timing,
                  latency_source=clock.source,
                  latency_batch=clock.batch if clock.timed else None, stopped=result.stopped)
    if progress is not None:
        progress(Progress(stage="held-out", done=total, total=total, unit="step"))
    chosen, line = recommend(front, _limits(spec, profile, result))
    return replace(front, recommended=chosen, recommendation=line)


def _with_uniform_trials(result: SearchResult, uniforms: Mapping[str, Assignment],
                         held: Measurer, feasible: Callable[[TrialRecord], bool]
                         ) -> list[TrialRecord]:
    """The searched front plus the search's own completed, ``feasible`` trials of the uniform
    baselines it left off (on the search split a same-size neighbour can push one off), by
    size: a baseline is a candidate of the front itself, and may well be the answer."""
    records = list(result.front)
    have = {assignment_key(held.canonical(r.assignment)) for r in records}
    wanted = {assignment_key(held.canonical(a)) for a in uniforms.values()}
    for record in result.trials:
        key = assignment_key(held.canonical(record.assignment))
        if (record.state == "complete" and key in wanted and key not in have
                and feasible(record)):
            records.append(record)
            have.add(key)
    return sorted(records, key=lambda r: (r.size, r.trial))


def _feasible(constraints: Constraints, profile: HardwareProfile, searched_by: Measurer
              ) -> Callable[[TrialRecord], bool]:
    """Whether a trial met the spec's constraints on the search split, as the search judged
    its front: the metric floor (``min_metric``, FP32's minus ``max_metric_drop``) and the
    size limit."""
    higher = searched_by.higher_is_better
    floor = metric_floor(searched_by.fp32().value, higher, min_metric=constraints.min_metric,
                         max_metric_drop=constraints.max_metric_drop)
    max_size = profile.size_limit(constraints.max_size_bytes, constraints.memory_budget)

    def feasible(record: TrialRecord) -> bool:
        if record.metric is None or (max_size is not None and record.size > max_size):
            return False
        return floor is None or (record.metric >= floor if higher else record.metric <= floor)
    return feasible


def _limits(spec: SearchSpec, profile: HardwareProfile, result: SearchResult) -> Limits:
    """The spec's constraints, and why the search ended, for :func:`recommend`."""
    constraints, budget = spec.constraints, spec.budget
    finished = sum(r.state in ("complete", "pruned") for r in result.trials)
    if result.stopped:
        stop = result.stopped
    elif finished < budget.trials and budget.timeout_s is not None:
        stop = (f"time budget used ({finished} of {budget.trials} trials in budget.timeout_s "
                f"{budget.timeout_s:g} s)")
    else:
        stop = f"trial budget used ({finished} trials)"
    return Limits(min_metric=constraints.min_metric,
                  max_metric_drop=constraints.max_metric_drop,
                  max_size=profile.size_limit(constraints.max_size_bytes,
                                              constraints.memory_budget), stop=stop,
                  accelerator=profile.toolchain is not None)


def _uniform_assignments(graph: ModelGraph, profile: HardwareProfile) -> dict[str, Assignment]:
    """The uniform baselines: every format of the profile but its float one, applied wherever
    the profile allows it (those no node of this model takes, and table formats, left out)."""
    uniform = {}
    for fmt in profile.formats:
        if fmt == profile.default_format or table_format(graph, profile, fmt):
            continue
        try:
            assignment = uniform_assignment(graph, profile, fmt)
        except QuantizationError:  # a format the profile forbids where it would go
            continue
        if fmt in assignment.values():
            uniform[fmt] = assignment
    return uniform


def judge(points: Sequence[FrontPoint], baselines: Mapping[str, Baseline], *,
          higher_is_better: bool, timed: bool) -> list[FrontPoint]:
    """``points`` with ``dominated``, ``shown`` and ``beaten_by`` set: a point that one of
    ``baselines`` or another point beats on held-out metric, size and (``timed``: the latency
    objective is on) latency, by :mod:`mpsearch.pareto`'s rule, is not shown; a baseline is
    named before a point when both beat it. Timed latencies with spreads count only where they
    differ measurably. Then shown points that tie (:func:`collapse_ties`) become one."""
    names = list(baselines)
    by = [(b.metric, float(b.size), b.latency if timed else None) for b in baselines.values()]
    spreads = None
    if timed and all(e.latency_ms_interval is not None for e in points) and all(
            b.latency_ms_interval is not None for b in baselines.values()):
        spreads = ([_spreads(p) for p in points], [_spreads(b) for b in baselines.values()])
    winners = dominators([(p.metric, float(p.size), p.latency if timed else None)
                          for p in points], higher_is_better=higher_is_better, by=by,
                         spreads=spreads)
    out = []
    for point, winner in zip(points, winners, strict=True):
        beaten_by = (None if winner is None else names[winner] if winner < len(names)
                     else f"point {points[winner - len(names)].index}")
        out.append(replace(point, dominated=winner is not None, shown=winner is None,
                           beaten_by=beaten_by))
    return collapse_ties(out, higher_is_better=higher_is_better, timed=timed)


def _spreads(entry: Baseline | FrontPoint) -> tuple[tuple[float, float] | None, ...]:
    return entry.latency_ms_interval, entry.batch_latency_ms_interval


def collapse_ties(points: Sequence[FrontPoint], *, higher_is_better: bool, timed: bool
                  ) -> list[FrontPoint]:
    """``points`` where shown points within the size tie and within each other's 95 %
    metric interval are one shown point: the one no tied point is measurably faster than
    (``timed``: latency is an objective), else the simpler (fewer formats), the better metric,
    the smaller, the lower index. The others are kept, not shown, ``beaten_by`` the kept one."""
    sign = 1.0 if higher_is_better else -1.0
    shown = [p for p in points if p.shown]

    def faster_peers(p: FrontPoint) -> int:
        if not timed:
            return 0
        return sum(1 for q in shown if _ties(p, q) and any(
            measurably_slower(mine, theirs) for mine, theirs in zip(
                _spreads(p), _spreads(q), strict=True)) and not any(
            measurably_slower(theirs, mine) for mine, theirs in zip(
                _spreads(p), _spreads(q), strict=True)))

    order = sorted(shown, key=lambda p: (faster_peers(p), formats_used(p), -sign * p.metric,
                                         p.size, p.index))
    kept: list[FrontPoint] = []
    under: dict[int, int] = {}
    for p in order:
        keeper = next((k for k in kept if _ties(p, k)), None)
        if keeper is None:
            kept.append(p)
        else:
            under[p.index] = keeper.index
    return [replace(p, shown=False, beaten_by=f"point {under[p.index]}")
            if p.index in under else p for p in points]


def _ties(a: FrontPoint, b: FrontPoint) -> bool:
    """Whether ``a`` and ``b`` tie: sizes within SIZE_TIE, each metric inside the other's
    95 % interval (equal metrics where an interval is unknown)."""
    if max(a.size, b.size) > min(a.size, b.size) * (1.0 + SIZE_TIE):
        return False
    return _inside(a.metric, b) and _inside(b.metric, a)


def _inside(value: float, point: FrontPoint) -> bool:
    interval = point.interval
    if interval is None or interval[0] != interval[0]:
        return value == point.metric
    return interval[0] - 1e-9 <= value <= interval[1] + 1e-9


class _Latencies(TypedDict, total=False):
    """The latency fields of a :class:`Baseline` or :class:`FrontPoint`."""

    latency: float | None
    latency_estimate: float | None
    latency_ms: float | None
    batch_latency_ms: float | None
    latency_ms_interval: tuple[float, float] | None
    batch_latency_ms_interval: tuple[float, float] | None


class _Clock:
    """Latencies of assignments relative to FP32: timed in ONNX Runtime where this host runs
    the profile's target (:mod:`mpsearch.clock`: at batch 1 and at a throughput batch, the
    spec's batch size up to :data:`CLOCK_BATCH`, as far as it fits the memory budget; the
    configurations interleaved in groups whose sessions fit :data:`CLOCK_SHARE` of it, each
    group with FP32, the reference of its ratios), with the profile's estimate beside them;
    the estimate alone elsewhere."""

    def __init__(self, held: Measurer, summary: ModelSummary, batch: int) -> None:
        self.held, self.summary = held, summary
        self.profile = held.quantizer.profile
        self.batch = held.count(min(batch, held.evaluator.batch_size, CLOCK_BATCH))
        self.timed = measures_latency(self.profile)
        self.fp32_estimate = estimate_latency(held.quantizer.graph, summary, self.profile, {})
        self.fp32_seconds: float | None = None

    @property
    def source(self) -> str | None:
        if self.timed:
            return "measured"
        return "estimated" if self.fp32_estimate else None

    @property
    def fp32_abs(self) -> float | None:
        """FP32's latency in the unit of the trials' latency objective (seconds at batch 1
        when measured); known once :meth:`latencies` ran."""
        return self.fp32_seconds if self.timed else self.fp32_estimate

    def latencies(self, assignments: Sequence[Mapping[str, str]],
                  timed: Sequence[bool] | None = None) -> list[_Latencies]:
        """The latencies of ``assignments``, the first of which is FP32 (``{}``, always
        timed: the reference of the ratios); ``timed`` says which to time (all by default):
        the others keep the profile's estimate alone, with no measured latency, unless they
        share a timed one's configuration."""
        graph = self.held.quantizer.graph
        out: list[_Latencies] = []
        for assignment in assignments:
            estimate = estimate_latency(graph, self.summary, self.profile, assignment)
            relative = (estimate / self.fp32_estimate
                        if estimate is not None and self.fp32_estimate else None)
            out.append({"latency": relative, "latency_estimate": relative})
        if not self.timed:
            return out
        if timed is None:
            timed = [True] * len(assignments)
        # One timing per distinct model: a front point that is a baseline's own configuration
        # gets the baseline's very figures, so timing noise never makes one beat the other.
        keys = [assignment_key(self.held.canonical(a)) for a in assignments]
        distinct = {key: a for key, a, wanted in zip(keys, assignments, timed, strict=True)
                    if wanted}
        timings = self._time(distinct, keys[0])
        self.fp32_seconds = timings[keys[0]][0].seconds
        for entry, key in zip(out, keys, strict=True):
            if key not in timings:
                entry["latency"] = None
                continue
            t1, tn, reference = timings[key]
            entry["latency"] = t1.seconds / reference.seconds
            entry["latency_ms"], entry["latency_ms_interval"] = 1e3 * t1.seconds, t1.interval_ms
            entry["batch_latency_ms"] = 1e3 * tn.seconds
            entry["batch_latency_ms_interval"] = tn.interval_ms
        return out

    def _time(self, distinct: Mapping[str, Mapping[str, str]], fp32: str
              ) -> dict[str, tuple[Timing, Timing, Timing]]:
        """Each of ``distinct``'s configurations timed at batch 1 and at :attr:`batch`, with
        the FP32 timing at batch 1 of its group (:func:`timing_groups`); FP32's from the
        first group. Only one group's sessions are open at a time."""
        held, profile = self.held, self.profile
        graph = held.quantizer.graph
        fp32_bytes = model_size(graph, profile, {})
        costs = {key: fp32_bytes + model_size(graph, profile, held.canonical(a))
                 for key, a in distinct.items()}
        one = next(iter(held.data.batches(1, stop=1)))
        many = next(iter(held.data.batches(self.batch, stop=self.batch)))
        out: dict[str, tuple[Timing, Timing, Timing]] = {}
        for group in timing_groups(costs, fp32, int(CLOCK_SHARE * activation_budget())):
            sessions = [held.evaluator.session(held.quantizer.build(
                held.canonical(distinct[key]), stand_ins=held.evaluator.stand_ins))
                for key in group]
            n = len(sessions)
            timings = time_runs([s.run for s in sessions] * 2, [one] * n + [many] * n,
                                span=SPREAD_SECONDS)
            del sessions
            for i, key in enumerate(group):
                if key != fp32 or key not in out:
                    out[key] = (timings[i], timings[n + i], timings[0])
        return out


#: The largest batch latency is timed at besides batch 1: every timed configuration (the
#: baselines and the shown points) is run about a dozen times at each batch, so the timing
#: batch, not the data, sets what the timing costs; at batch 64 it was the largest stage of
#: most searches on 150 samples.
CLOCK_BATCH = 8

#: The share of the activation budget (:func:`mpsearch.evaluate.activation_budget`) the
#: sessions timed together may hold, estimated from their weights (:func:`timing_groups`).
CLOCK_SHARE = 0.25


def timing_groups(costs: Mapping[str, int], reference: str, budget: int) -> list[list[str]]:
    """The configurations of ``costs`` (key -> bytes its session holds) in groups to time
    together, each led by ``reference`` (FP32: every ratio is taken against runs interleaved
    with it) and filled in order while the group's costs fit ``budget``; a configuration over
    it alone still gets a group with the reference. Only the reference when it is alone."""
    groups: list[list[str]] = []
    used = budget + 1
    for key, cost in costs.items():
        if key == reference:
            continue
        if used + cost > budget or not groups:
            groups.append([reference])
            used = costs[reference]
        groups[-1].append(key)
        used += cost
    return groups or [[reference]]


def _interval(held: Measurer, assignment: Assignment, measured: Measurement, seed: int
              ) -> tuple[float, float] | None:
    """95 % interval of a held-out measurement: Wilson for accuracy-like metrics (k of n
    samples), else a bootstrap over the samples of the outputs that measurement gathered."""
    value, samples = measured.value, measured.samples
    if value != value or samples <= 0:
        return None
    if is_proportion(measured.primary):
        return wilson_interval(round(value * samples), samples)
    evaluator = held.evaluator
    return bootstrap_interval(evaluator.primary.fn, held.outputs(assignment), evaluator.reference,
                              evaluator.data.labels, seed=seed)


def _point(record: TrialRecord, index: int, metrics: Mapping[str, float], primary: str,
           int8: Mapping[str, str], searched: set[str]) -> FrontPoint:
    counts: dict[str, int] = {}
    for node, fmt in record.assignment.items():
        if node in searched:
            counts[fmt] = counts.get(fmt, 0) + 1
    return FrontPoint(
        index=index, trial=record.trial, metric=metrics[primary], search_metric=record.metric,
        size=record.size, latency=None, metrics=dict(metrics),
        assignment=dict(record.assignment), counts=counts,
        differs_from_int8=tuple(sorted(n for n, f in record.assignment.items()
                                       if int8.get(n) != f)),
        source=record.source)
