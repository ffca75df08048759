"""A run's results shaped into the run directory's records (:mod:`mpsearch.pipeline`'s helper).

Consumes an :class:`~mpsearch.analysis.Analysis`, or a search's result and the held-out
split's measurer; produces the analysis files and the typed :class:`~mpsearch.rundir.Front`
(each point re-measured on held-out data, with its 95 % interval and a dominated flag).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from mpsearch.analysis import (
    PROPORTION_METRICS,
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
    uniform_assignment,
)
from mpsearch.errors import QuantizationError
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
                   held: Measurer, searched_by: Measurer) -> Front:
    """The searched front re-measured by the ``held`` measurer (the held-out split): each
    point with its 95 % interval and a dominated flag, the FP32 and uniform baselines."""
    graph, profile = held.quantizer.graph, held.quantizer.profile
    fp32_latency = estimate_latency(graph, summary, profile, {})
    fp32 = Baseline(metric=held.fp32().value, size=model_size(graph, profile, {}),
                    latency=1.0 if fp32_latency else None, latency_abs=fp32_latency)
    int8 = uniform_assignment(graph, profile, profile.lowest_formats()[0])
    searched = {n for g in group_nodes(graph, profile, spec.formats) for n in g.nodes}
    points = []
    for index, record in enumerate(result.front):
        assignment = make_assignment(graph, profile, record.assignment)
        measured = held.measure(assignment)
        latency = relative_latency(estimate_latency(graph, summary, profile, assignment), fp32)
        point = _point(record, index, measured.metrics, held.evaluator.primary.name, int8,
                       searched, latency)
        points.append(replace(point, interval=_interval(held, assignment, measured, spec.seed)))
    timed = "latency" in spec.objectives
    flags = dominated_flags([(p.metric, p.size, p.latency if timed else None) for p in points],
                            higher_is_better=held.higher_is_better)
    points = [replace(p, dominated=flag) for p, flag in zip(points, flags, strict=True)]
    uniform = {}
    for fmt in profile.formats:
        if fmt == profile.default_format:
            continue
        try:
            assignment = uniform_assignment(graph, profile, fmt)
        except QuantizationError:  # a format no node may take
            continue
        uniform[fmt] = Baseline(
            metric=held.measure(assignment).value, size=model_size(graph, profile, assignment),
            latency=relative_latency(estimate_latency(graph, summary, profile, assignment), fp32))
    return Front(metric=searched_by.evaluator.primary.name,
                 higher_is_better=searched_by.higher_is_better, objectives=spec.objectives,
                 fp32=fp32, uniform=uniform, points=tuple(points),
                 evaluations=result.evaluations, seconds=result.seconds, timing=result.timing)


def _interval(held: Measurer, assignment: Assignment, measured: Measurement, seed: int
              ) -> tuple[float, float] | None:
    """95 % interval of a held-out measurement: Wilson for accuracy-like metrics (k of n
    samples), else a bootstrap over the samples of a second pass of the built model."""
    value, samples = measured.value, measured.samples
    if value != value or samples <= 0:
        return None
    if measured.primary in PROPORTION_METRICS:
        return wilson_interval(round(value * samples), samples)
    evaluator = held.evaluator
    outputs = evaluator.outputs(held.quantizer.build(assignment))
    return bootstrap_interval(evaluator.primary.fn, outputs, evaluator.reference,
                              evaluator.data.labels, seed=seed)


def _point(record: TrialRecord, index: int, metrics: Mapping[str, float], primary: str,
           int8: Mapping[str, str], searched: set[str], latency: float | None) -> FrontPoint:
    counts: dict[str, int] = {}
    for node, fmt in record.assignment.items():
        if node in searched:
            counts[fmt] = counts.get(fmt, 0) + 1
    return FrontPoint(
        index=index, trial=record.trial, metric=metrics[primary], search_metric=record.metric,
        size=record.size, latency=latency, metrics=dict(metrics),
        assignment=dict(record.assignment), counts=counts,
        differs_from_int8=tuple(sorted(n for n, f in record.assignment.items()
                                       if int8.get(n) != f)),
        source=record.source)
