"""Sensitivity analysis through the shared measurer: ranking, reverse view, curve, distributions.

Consumes the :class:`~mpsearch.analysis.Measurer` of a run (its quantizer holds the graph, the
profile and the calibration table; its data and cache are shared with the search); produces a
frozen :class:`Analysis`:

* one :class:`~mpsearch.analysis.NodeSensitivity` row per (node, format) quantized alone, the
  ranking per format, and the reverse view (everything quantized but one node);
* the node-by-node curve: nodes quantized cumulatively in topological and in sensitivity order
  (least sensitive first), metric and exact model size per step;
* distributions: histograms, statistics and flags per node (:mod:`._distributions`).

Every configuration goes through the measurer on the same first ``samples`` samples, so the
curve's first step, the reverse view's base and the search's single-group costs are cache hits
when the rows already measured them. Writing the files is the run directory's job
(:mod:`mpsearch.rundir`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mpsearch.analysis._distributions import NodeDistribution, analyze_distributions
from mpsearch.analysis._measure import Measurement, Measurer
from mpsearch.analysis._sensitivity import (
    NodeSensitivity,
    RestoreGain,
    Thresholds,
    lower_formats,
    measure_proxy,
    measure_reverse,
    measure_sensitivity,
    rank_sensitivity,
    severity,
    worsening,
)
from mpsearch.assignment import model_size
from mpsearch.errors import QuantizationError
from mpsearch.graph import Node
from mpsearch.profiles import HardwareProfile
from mpsearch.progress import Reporter, steps

__all__ = ["SCHEMA", "Analysis", "CurvePoint", "analyze", "analysis_formats", "measure_curve"]

logger = logging.getLogger(__name__)

SCHEMA = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class CurvePoint:
    """Step ``step`` of a cumulative curve: the first ``step`` nodes of ``order`` quantized.

    ``node`` is the node added at this step (None at step 0, the FP32 model) and ``format`` the
    format it took; ``drop`` is against FP32 (positive = worse); ``size`` is the exact model
    size in bytes and ``size_ratio`` its fraction of the FP32 size.
    """

    order: str
    step: int
    node: str | None
    op_type: str | None
    format: str | None
    metric: float
    drop: float
    sqnr: float | None
    size: int
    size_ratio: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Analysis:
    """Everything ``mpsearch analyze`` measures, for the report and the search.

    ``sensitivity``: one row per (node, format), topological order. ``reverse``: the gain of
    restoring each node to FP32 from ``reverse_base`` (each node in its lowest analyzed format).
    ``notes`` names the views computed on a subset. ``mode`` is ``end_to_end`` or ``proxy``.
    ``timing`` holds the mean seconds per
    configuration (``build_s``, ``session_s``, ``eval_s``) of the configurations measured.
    """

    model: str
    profile: str
    metric: str
    higher_is_better: bool
    fp32: Mapping[str, float]
    samples: int
    mode: str
    formats: tuple[str, ...]
    thresholds: Thresholds
    sensitivity: tuple[NodeSensitivity, ...]
    reverse_base: Mapping[str, Any] | None
    reverse: tuple[RestoreGain, ...]
    curve: tuple[CurvePoint, ...]
    distributions: tuple[NodeDistribution, ...]
    evaluations: int
    seconds: float
    timing: Mapping[str, float] = field(default_factory=dict)
    key: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def ranking(self, fmt: str | None = None) -> tuple[str, ...]:
        """Node names, most sensitive first, for ``fmt`` (default: the lowest analyzed format)."""
        chosen = fmt or self.formats[0]
        rows = sorted((r for r in self.sensitivity if r.format == chosen), key=lambda r: r.rank)
        return tuple(r.node for r in rows)

    def most_sensitive(self, count: int = 10) -> tuple[NodeSensitivity, ...]:
        """The ``count`` most sensitive (node, format) rows of the lowest analyzed format."""
        rows = [r for r in self.sensitivity if r.format == self.formats[0]]
        return tuple(sorted(rows, key=lambda r: r.rank)[:count])

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "model": self.model, "profile": self.profile,
            "metric": self.metric, "higher_is_better": self.higher_is_better,
            "fp32": dict(self.fp32), "samples": self.samples, "mode": self.mode,
            "formats": list(self.formats), "thresholds": self.thresholds.to_dict(),
            "ranking": {f: list(self.ranking(f)) for f in self.formats},
            "nodes": [r.to_dict() for r in self.sensitivity],
            "reverse": {"base": None if self.reverse_base is None else dict(self.reverse_base),
                        "rows": [r.to_dict() for r in self.reverse]},
            "evaluations": self.evaluations, "seconds": self.seconds,
            "timing": dict(self.timing), "key": dict(self.key), "notes": list(self.notes),
        }


def measure_curve(
    measurer: Measurer, target: Mapping[str, str], orders: Mapping[str, Sequence[str]], *,
    samples: int | None = None, max_steps: int | None = None,
    progress: Reporter | None = None,
) -> tuple[CurvePoint, ...]:
    """Nodes quantized cumulatively (node -> ``target`` format) in each named order, on the
    first ``samples`` samples.

    Step 0 is the FP32 model; step k quantizes the first k nodes of the order. With
    ``max_steps``, only that many steps of each order are measured, evenly spaced, the last
    (every node quantized) included; a point's ``node`` is the last node its step added.
    """
    graph, profile = measurer.quantizer.graph, measurer.quantizer.profile
    fp32 = measurer.fp32(samples)
    higher = measurer.higher_is_better
    fp32_size = model_size(graph, profile, {})

    def point(order: str, step: int, node: str | None, m: Measurement,
              formats: Mapping[str, str]) -> CurvePoint:
        size = model_size(graph, profile, formats)
        return CurvePoint(
            order=order, step=step, node=node,
            op_type=None if node is None else graph.nodes[node].op_type,
            format=None if node is None else formats[node], metric=m.value,
            drop=worsening(fp32.value, m.value, higher), sqnr=m.sqnr, size=size,
            size_ratio=size / fp32_size if fp32_size else math.nan)

    points = []
    for name, sequence in orders.items():
        points.append(point(name, 0, None, fp32, {}))
        chosen = curve_steps(len(sequence), max_steps)
        for step in steps(chosen, f"curve ({name})", progress, unit="cfg"):
            current = {node: target[node] for node in sequence[:step]}
            points.append(point(name, step, sequence[step - 1],
                                measurer.measure(current, samples=samples), current))
    return tuple(points)


def curve_steps(count: int, max_steps: int | None) -> list[int]:
    """Steps 1..``count``, or ``max_steps`` of them evenly spaced with the last one kept."""
    if max_steps is None or count <= max_steps:
        return list(range(1, count + 1))
    spaced = {round(1 + i * (count - 1) / (max_steps - 1)) for i in range(max_steps)}
    return sorted(spaced | {count})


def analysis_formats(profile: HardwareProfile, formats: Sequence[str] | None
                     ) -> tuple[str, ...]:
    """The lower-precision formats to analyze, by rank: ``formats`` checked, or every format
    of ``profile`` below FP32."""
    if formats is None:
        names = [n for n, f in profile.formats.items()
                 if f.activation.dtype != "float32" or f.weight.dtype != "float32"]
    else:
        names = list(dict.fromkeys(formats))
        for name in names:
            fmt = profile.format(name)  # unknown name: ProfileError listing the valid ones
            if fmt.activation.dtype == "float32" and fmt.weight.dtype == "float32":
                raise QuantizationError(f"--formats: '{name}' is the float reference, not a "
                                        "lower precision; list formats such as int8,int16")
    return tuple(sorted(names, key=lambda n: (profile.format(n).rank, n)))


def _targets(measurer: Measurer, formats: Sequence[str]) -> list[tuple[Node, tuple[str, ...]]]:
    graph, profile = measurer.quantizer.graph, measurer.quantizer.profile
    targets = [(node, lower_formats(profile, node, formats)) for node in graph.nodes.values()]
    found = [(n, f) for n, f in targets if f]
    if not found:
        raise QuantizationError(
            f"{graph.name}: no node can take {', '.join(formats) or 'a lower precision'} under "
            f"profile '{profile.name}'; check --formats or the profile's op_rules")
    return found



def _timing(rows: Sequence[NodeSensitivity]) -> dict[str, float]:
    count = len(rows)
    return {"configurations": float(count),
            "seconds": sum(r.seconds for r in rows) / count} if count else {}


def _proxy_rows(measurer: Measurer, targets: Sequence[tuple[Node, tuple[str, ...]]],
                samples: int, order: Mapping[str, int], progress: Reporter | None
                ) -> tuple[NodeSensitivity, ...]:
    """Proxy rows from the measurer's cache, measuring only the missing (node, format) pairs."""
    quantizer, cache = measurer.quantizer, measurer.cache
    sample = measurer.data.take(min(samples, len(measurer.data)))

    def key(node: str, fmt: str) -> str:
        return f"proxy{len(sample)}:{node}:{fmt}"

    missing = [(n, tuple(f for f in fmts if key(n.name, f) not in cache)) for n, fmts in targets]
    missing = [(n, f) for n, f in missing if f]
    if missing:
        for row in measure_proxy(quantizer.graph, quantizer.table, quantizer.profile, missing,
                                 sample, order, method=quantizer.method,
                                 batch_size=measurer.batch_size, threads=measurer.threads,
                                 progress=progress):
            cache[key(row.node, row.format)] = {"sqnr": row.proxy_sqnr, "seconds": row.seconds}
    rows = []
    for node, fmts in targets:
        for fmt in fmts:
            entry = cache[key(node.name, fmt)]
            sqnr = math.inf if entry["sqnr"] is None else float(entry["sqnr"])
            rows.append(NodeSensitivity(node=node.name, op_type=node.op_type, format=fmt,
                                        index=order[node.name], proxy_sqnr=sqnr,
                                        seconds=float(entry["seconds"])))
    return tuple(rows)


def analyze(
    measurer: Measurer, *, formats: Sequence[str] | None = None, proxy: bool = False,
    reverse: bool | None = None, curve: bool | None = None, distributions: bool = True,
    thresholds: Thresholds | None = None, samples: int | None = None, proxy_samples: int = 32,
    reverse_top: int | None = None, curve_max_steps: int | None = None,
    measure_above: float | None = None, progress: Reporter | None = None,
) -> Analysis:
    """Per-node sensitivity (end to end, or the fast ``proxy``), reverse view, curve and
    distributions, every configuration measured by ``measurer`` on its first ``samples``
    samples (all by default).

    ``formats`` defaults to every lower-precision format of the profile. ``reverse`` and
    ``curve`` default to on, except in proxy mode (meant for models too large for them).
    ``reverse_top`` restores only that many nodes, the most sensitive first,
    ``curve_max_steps`` measures that many evenly spaced steps of each curve, and
    ``measure_above`` measures a node's next format up only where the one below costs that
    fraction of the worst node's (:func:`measure_sensitivity`): bounded views, named in
    :attr:`Analysis.notes`.
    """
    start = time.perf_counter()
    before, partial = measurer.evaluations, measurer.partial_runs
    thresholds = thresholds or Thresholds()
    quantizer = measurer.quantizer
    graph, profile = quantizer.graph, quantizer.profile
    listed = analysis_formats(profile, formats)
    targets = _targets(measurer, listed)
    wanted = tuple(f for f in listed if any(f in taken for _, taken in targets))  # some node's
    order = {name: i for i, name in enumerate(graph.order)}
    if proxy:
        rows = _proxy_rows(measurer, targets, proxy_samples, order, progress)
    else:
        rows = measure_sensitivity(measurer, targets, order, samples=samples,
                                   measure_above=measure_above, progress=progress)
    rows = rank_sensitivity(rows, thresholds)
    lowest = {node.name: fmts[0] for node, fmts in targets}
    orders = _orders(rows, lowest, order)
    notes = []
    if samples is not None and samples < len(measurer.data):
        notes.append(f"every configuration measured on the first {samples} of "
                     f"{len(measurer.data)} samples")
    pairs = sum(len(fmts) for _, fmts in targets)
    if not proxy and len(rows) < pairs:
        notes.append(f"a higher format measured only where the one below costs at least "
                     f"{measure_above:.0%} of the worst node's ({len(rows)} of {pairs} rows)")
    restored = [n for n, _ in targets]
    if reverse_top is not None and reverse_top < len(restored):
        top = set(orders["sensitivity"][::-1][:reverse_top])
        restored = [n for n in restored if n.name in top]
        notes.append(f"reverse view: the {reverse_top} most sensitive of {len(targets)} nodes")
    base, gains = (_reverse(measurer, lowest, restored, order, samples, progress)
                   if (reverse if reverse is not None else not proxy) else (None, ()))
    points: tuple[CurvePoint, ...] = ()
    if curve if curve is not None else not proxy:
        points = measure_curve(measurer, lowest, orders, samples=samples,
                               max_steps=curve_max_steps, progress=progress)
        if curve_max_steps is not None and curve_max_steps < len(lowest):
            notes.append(f"curves: {curve_max_steps} evenly spaced of {len(lowest)} steps")
    dists = (analyze_distributions(graph, profile, quantizer.table, formats=wanted,
                                   method=quantizer.method) if distributions else ())
    if measurer.partial_runs > partial:
        notes.append(f"{measurer.partial_runs - partial} configurations ran only the nodes they "
                     "change, fed with FP32 tensors (the whole model's values up to float "
                     "rounding)")
    fp32 = measurer.fp32(samples)
    analysis = Analysis(
        model=graph.name, profile=profile.name, metric=fp32.primary,
        higher_is_better=measurer.higher_is_better, fp32=dict(fp32.metrics),
        samples=fp32.samples, mode="proxy" if proxy else "end_to_end", formats=wanted,
        thresholds=thresholds, sensitivity=rows, reverse_base=base, reverse=gains,
        curve=points, distributions=dists, evaluations=measurer.evaluations - before,
        seconds=time.perf_counter() - start, timing=_timing(rows), notes=tuple(notes))
    logger.info("analyzed %d (node, format) pairs of %s in %.1f s (%d evaluations)",
                len(rows), graph.name, analysis.seconds, analysis.evaluations)
    return analysis


def _reverse(measurer: Measurer, lowest: Mapping[str, str], nodes: Sequence[Node],
             order: Mapping[str, int], samples: int | None, progress: Reporter | None
             ) -> tuple[dict[str, Any], tuple[RestoreGain, ...]]:
    reference, gains = measure_reverse(measurer, lowest, nodes, order, samples=samples,
                                       progress=progress)
    base = {"formats": dict(lowest), "metric": reference.value, "sqnr": reference.sqnr,
            "metrics": dict(reference.metrics), "kl": reference.kl}
    return base, gains


def _orders(rows: Sequence[NodeSensitivity], lowest: Mapping[str, str],
            order: Mapping[str, int]) -> dict[str, list[str]]:
    """Topological order, and sensitivity order (least sensitive first) in each node's lowest
    analyzed format."""
    own = [r for r in rows if lowest.get(r.node) == r.format]
    by_severity = sorted(own, key=lambda r: (severity(r), r.index), reverse=True)
    return {"topological": sorted(lowest, key=order.__getitem__),
            "sensitivity": [r.node for r in by_severity]}
