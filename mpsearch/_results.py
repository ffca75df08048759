"""A run's results shaped into the run directory's records (:mod:`mpsearch.pipeline`'s helper).

Consumes an :class:`~mpsearch.analysis.Analysis`, or a search's result and the held-out
split's measurer; produces the analysis files and the typed :class:`~mpsearch.rundir.Front`
(each point re-measured on held-out data, with its 95 % interval and a dominated flag).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypedDict

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
    dominated_flags,
    wilson_interval,
)
from mpsearch.assignment import (
    Assignment,
    estimate_latency,
    make_assignment,
    model_size,
    table_format,
    uniform_assignment,
)
from mpsearch.errors import QuantizationError
from mpsearch.evaluate import is_proportion
from mpsearch.profiles import measures_latency
from mpsearch.progress import Progress, Reporter
from mpsearch.rundir import Baseline, Front, FrontPoint, RunDir
from mpsearch.search import SearchResult, TrialRecord, group_nodes
from mpsearch.spec import SearchSpec
from mpsearch.summary import ModelSummary

__all__ = ["held_out_front", "relative_latency", "write_analysis"]


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
    point with its 95 % interval, its latency (timed where this host runs the profile's
    target, the estimate beside it) and a dominated flag; the FP32 and uniform baselines.
    ``progress`` hears stage ``held-out``, one step a front point."""
    graph, profile = held.quantizer.graph, held.quantizer.profile
    clock = _Clock(held, summary, spec.batch_size)
    fp32 = Baseline(metric=held.fp32().value, size=model_size(graph, profile, {}),
                    latency_abs=clock.fp32_abs,
                    **clock.latencies({}, runs=_searched_runs(searched_by, held, {})))
    int8 = uniform_assignment(graph, profile, profile.lowest_formats()[0])
    searched = {n for g in group_nodes(graph, profile, spec.formats) for n in g.nodes}
    points = []
    total = len(result.front)
    for index, record in enumerate(result.front):
        if progress is not None:
            progress(Progress(stage="held-out", done=index, total=total, unit="point"))
        assignment = make_assignment(graph, profile, record.assignment)
        measured = held.measure(assignment)
        latencies = clock.latencies(assignment, runs=_searched_runs(searched_by, held,
                                                                   assignment))
        point = _point(record, index, measured.metrics, held.evaluator.primary.name, int8,
                       searched)
        points.append(replace(point, interval=_interval(held, assignment, measured, spec.seed),
                              **latencies))
    timed = "latency" in spec.objectives
    flags = dominated_flags([(p.metric, p.size, p.latency if timed else None) for p in points],
                            higher_is_better=held.higher_is_better)
    points = [replace(p, dominated=flag) for p, flag in zip(points, flags, strict=True)]
    uniform = {}
    for fmt in profile.formats:
        if fmt == profile.default_format:
            continue
        if table_format(graph, profile, fmt):
            continue
        try:
            assignment = uniform_assignment(graph, profile, fmt)
        except QuantizationError:  # a format the profile forbids where it would go
            continue
        if fmt not in assignment.values():  # a format no node of this model takes
            continue
        metric = held.measure(assignment).value
        uniform[fmt] = Baseline(metric=metric, size=model_size(graph, profile, assignment),
                                **clock.latencies(assignment, runs=_searched_runs(
                                    searched_by, held, assignment)))
    return Front(metric=searched_by.evaluator.primary.name,
                 higher_is_better=searched_by.higher_is_better, objectives=spec.objectives,
                 fp32=fp32, uniform=uniform, points=tuple(points),
                 evaluations=result.evaluations, seconds=result.seconds, timing=result.timing,
                 latency_source=clock.source, latency_batch=clock.batch if clock.timed else None,
                 stopped=result.stopped)


def _searched_runs(searched_by: Measurer, held: Measurer, assignment: Mapping[str, str]
                   ) -> tuple[float, ...]:
    """:meth:`~mpsearch.analysis.Measurer.timed_runs` of ``searched_by`` (a trial of the
    search split, or FP32's reference runs) when its batches are ``held``'s size: they time
    the held-out latency at that batch too."""
    if searched_by.batch_size != held.batch_size or searched_by.threads != held.threads:
        return ()
    return searched_by.timed_runs(assignment)


class _Latencies(TypedDict, total=False):
    """The latency fields of a :class:`Baseline` or :class:`FrontPoint`."""

    latency: float | None
    latency_estimate: float | None
    latency_ms: float | None
    batch_latency_ms: float | None


class _Clock:
    """Latencies of assignments relative to FP32: timed in ONNX Runtime (median of batch-1
    runs, and of runs at the spec's batch size) where this host runs the profile's target,
    with the profile's estimate beside them; the estimate alone elsewhere."""

    def __init__(self, held: Measurer, summary: ModelSummary, batch: int) -> None:
        self.held, self.summary = held, summary
        self.profile = held.quantizer.profile
        self.batch = held.count(batch)
        self.timed = measures_latency(self.profile)
        self.fp32_estimate = estimate_latency(held.quantizer.graph, summary, self.profile, {})
        self.fp32_seconds = held.latency({}) if self.timed else None

    @property
    def source(self) -> str | None:
        if self.timed:
            return "measured"
        return "estimated" if self.fp32_estimate else None

    @property
    def fp32_abs(self) -> float | None:
        """FP32's latency in the unit of the trials' latency objective."""
        return self.fp32_seconds if self.timed else self.fp32_estimate

    def latencies(self, assignment: Mapping[str, str], runs: Sequence[float] = ()
                  ) -> _Latencies:
        """``assignment``'s latencies; ``runs``: seconds of full batches another measurer of
        the spec's batch size timed (the search split's measurement of a front point)."""
        graph = self.held.quantizer.graph
        estimate = estimate_latency(graph, self.summary, self.profile, assignment)
        relative = (estimate / self.fp32_estimate
                    if estimate is not None and self.fp32_estimate else None)
        if not self.timed or not self.fp32_seconds:
            return {"latency": relative, "latency_estimate": relative}
        seconds = self.held.latency(assignment)
        batch = self.held.latency(assignment, batch=self.batch, repeat=3, runs=runs)
        return {"latency": seconds / self.fp32_seconds, "latency_estimate": relative,
                "latency_ms": 1e3 * seconds, "batch_latency_ms": 1e3 * batch}


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
