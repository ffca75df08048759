"""Sensitivity analysis of a prepared model: ranking, reverse view, curve and distributions.

Consumes a :class:`~mpsearch.pipeline.Prepared` model (graph, profile, calibration table and
validation data); produces a frozen :class:`Analysis` and, given ``run_dir``, the run
directory's analysis files (all written atomically; non-finite numbers as null):

* ``sensitivity.json`` / ``sensitivity.csv`` -- one row per (node, format) quantized alone
  (:class:`~mpsearch.sensitivity.NodeSensitivity`), the ranking per format, the reverse view
  (``reverse.csv`` too) and the cost per configuration;
* ``curve.json`` / ``curve.csv`` -- nodes quantized cumulatively in topological and in
  sensitivity order (least sensitive first): metric and exact model size per step;
* ``distributions.json`` / ``distributions.csv`` -- histograms, statistics and flags per node
  (:mod:`mpsearch.distributions`);
* ``summary.json``, ``profile.json`` and ``cache/analysis.json`` (every measurement, keyed by
  the model, calibration table, data, profile and metric fingerprints, so a rerun is free).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mpsearch import __version__
from mpsearch._io import atomic_write, write_json
from mpsearch.analysis._distributions import STAT_COLUMNS, NodeDistribution, analyze_distributions
from mpsearch.analysis._sensitivity import (
    Measurement,
    Measurer,
    NodeSensitivity,
    RestoreGain,
    Thresholds,
    assignment_key,
    lower_formats,
    measure_proxy,
    measure_reverse,
    measure_sensitivity,
    rank_sensitivity,
    severity,
    worsening,
)
from mpsearch.assignment import model_size
from mpsearch.data import Dataset
from mpsearch.errors import QuantizationError
from mpsearch.evaluate import Evaluator
from mpsearch.graph import Node
from mpsearch.pipeline import Prepared
from mpsearch.profiles import HardwareProfile
from mpsearch.quantize import Quantizer

__all__ = ["Analysis", "CurvePoint", "analyze", "measure_curve", "write_analysis"]

logger = logging.getLogger(__name__)

SCHEMA = 1
_FLUSH_SECONDS = 5.0


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
    ``mode`` is ``end_to_end`` or ``proxy``. ``timing`` holds the mean seconds per
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
            "timing": dict(self.timing), "key": dict(self.key),
        }


def measure_curve(
    measurer: Measurer, prepared: Prepared, target: Mapping[str, str],
    orders: Mapping[str, Sequence[str]], *, progress: bool = False,
) -> tuple[CurvePoint, ...]:
    """Nodes quantized cumulatively (node -> ``target`` format) in each named order.

    Step 0 is the FP32 model; step k quantizes the first k nodes of the order.
    """
    graph, profile = prepared.graph, prepared.profile
    fp32 = measurer.fp32()
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
        current: dict[str, str] = {}
        bar = tqdm(sequence, desc=f"curve ({name})", unit="cfg", disable=not progress,
                   leave=False)
        for step, node in enumerate(bar, start=1):
            current[node] = target[node]
            points.append(point(name, step, node, measurer.measure(current), current))
    return tuple(points)


class _Store:
    """The run directory's measurement cache: ``cache/analysis.json`` (None: memory only)."""

    def __init__(self, run_dir: Path | None, key: Mapping[str, Any]) -> None:
        self.path = None if run_dir is None else run_dir / "cache" / "analysis.json"
        self.key = dict(key)
        self.entries: dict[str, Any] = {}
        self.last = time.monotonic()
        if self.path is not None and self.path.is_file():
            try:
                stored = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                logger.warning("%s: unreadable analysis cache (%s); measuring again",
                               self.path, e)
                return
            if stored.get("key") == self.key:
                self.entries = dict(stored.get("entries", {}))
                logger.info("%s: %d cached measurements", self.path, len(self.entries))
            else:
                logger.info("%s: cache is for other inputs; measuring again", self.path)

    def changed(self) -> None:
        if time.monotonic() - self.last > _FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        self.last = time.monotonic()
        if self.path is not None:
            write_json(self.path, {"key": self.key, "entries": self.entries})


def _fingerprint(obj: object) -> str | None:
    value = getattr(obj, "fingerprint", None)
    value = value() if callable(value) else value
    return None if value is None else str(value)


def _table_key(table: object) -> str | None:
    """What identifies a calibration table: its own fingerprint, else its inputs and binning."""
    own = _fingerprint(table)
    if own is not None:
        return own
    parts = [getattr(table, k, None) for k in ("model_fingerprint", "data_fingerprint",
                                                "samples", "bins", "percentile")]
    return ":".join(str(p) for p in parts)


def _cache_key(prepared: Prepared, data: Dataset, metric: str | None) -> dict[str, Any]:
    profile_text = json.dumps(prepared.profile.to_dict(), sort_keys=True, default=str)
    return {
        "schema": SCHEMA, "mpsearch": __version__, "model": prepared.graph.fingerprint,
        "table": _table_key(prepared.table), "data": _fingerprint(data),
        "samples": len(data), "profile": prepared.profile.name,
        "profile_digest": hashlib.sha256(profile_text.encode()).hexdigest()[:16],
        "method": prepared.method, "metric": metric,
    }


def _check_formats(profile: HardwareProfile, formats: Sequence[str] | None) -> tuple[str, ...]:
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


def _targets(prepared: Prepared, formats: Sequence[str]) -> list[tuple[Node, tuple[str, ...]]]:
    graph, profile = prepared.graph, prepared.profile
    targets = [(node, lower_formats(profile, node, formats)) for node in graph.nodes.values()]
    found = [(n, f) for n, f in targets if f]
    if not found:
        raise QuantizationError(
            f"{graph.name}: no node can take {', '.join(formats) or 'a lower precision'} under "
            f"profile '{profile.name}'; check --formats or the profile's op_rules")
    return found


def _timing(measurer: Measurer, keys: Sequence[str]) -> dict[str, float]:
    rows = [Measurement.from_dict(measurer.cache[k]) for k in keys if k in measurer.cache]
    if not rows:
        return {}
    count = len(rows)
    return {"configurations": float(count),
            "build_s": sum(m.build_s for m in rows) / count,
            "session_s": sum(m.session_s for m in rows) / count,
            "eval_s": sum(m.eval_s for m in rows) / count}


def _proxy_timing(rows: Sequence[NodeSensitivity]) -> dict[str, float]:
    count = len(rows)
    return {"configurations": float(count),
            "proxy_s": sum(r.seconds for r in rows) / count} if count else {}


def _proxy_rows(prepared: Prepared, store: _Store,
                targets: Sequence[tuple[Node, tuple[str, ...]]], data: Dataset,
                order: Mapping[str, int], options: Mapping[str, Any]
                ) -> tuple[NodeSensitivity, ...]:
    """Proxy rows from the cache, measuring only the missing (node, format) pairs."""
    def key(node: str, fmt: str) -> str:
        return f"proxy{len(data)}:{node}:{fmt}"

    missing = [(n, tuple(f for f in fmts if key(n.name, f) not in store.entries))
               for n, fmts in targets]
    missing = [(n, f) for n, f in missing if f]
    if missing:
        for row in measure_proxy(prepared.graph, prepared.table, prepared.profile, missing,
                                 data, order, method=prepared.method, **options):
            store.entries[key(row.node, row.format)] = {"sqnr": row.proxy_sqnr,
                                                        "seconds": row.seconds}
        store.flush()
    rows = []
    for node, fmts in targets:
        for fmt in fmts:
            entry = store.entries[key(node.name, fmt)]
            sqnr = math.inf if entry["sqnr"] is None else float(entry["sqnr"])
            rows.append(NodeSensitivity(node=node.name, op_type=node.op_type, format=fmt,
                                        index=order[node.name], proxy_sqnr=sqnr,
                                        seconds=float(entry["seconds"])))
    return tuple(rows)


def analyze(
    prepared: Prepared, *, data: Dataset | None = None, metric: str | None = None,
    formats: Sequence[str] | None = None, proxy: bool = False, reverse: bool | None = None,
    curve: bool | None = None, distributions: bool = True,
    thresholds: Thresholds | None = None, limit: int | None = None, proxy_samples: int = 32,
    batch_size: int = 64, threads: int = 2, run_dir: str | Path | None = None,
    progress: bool = False,
) -> Analysis:
    """Per-node sensitivity (end to end, or the fast ``proxy``), reverse view, curve and
    distributions of ``prepared``; writes the analysis files when ``run_dir`` is given.

    ``data`` defaults to the validation split, cut to its first ``limit`` samples. ``formats``
    defaults to every lower-precision format of the profile. ``reverse`` and ``curve``
    default to on, except in proxy mode (meant for models too large for them).
    """
    start = time.perf_counter()
    thresholds = thresholds or Thresholds()
    graph = prepared.graph
    wanted = _check_formats(prepared.profile, formats)
    targets = _targets(prepared, wanted)
    dataset = data if data is not None else prepared.validation
    dataset = dataset.take(limit) if limit is not None and limit < len(dataset) else dataset
    out = None if run_dir is None else Path(run_dir)
    store = _Store(out, _cache_key(prepared, dataset, metric))
    quantizer = Quantizer(graph, prepared.table, prepared.profile, method=prepared.method)
    measurer = Measurer(quantizer, _evaluator_factory(prepared, dataset, metric, batch_size,
                                                      threads),
                        cache=store.entries, on_new=store.changed)
    order = {name: i for i, name in enumerate(graph.order)}
    if proxy:
        sample = dataset.take(min(proxy_samples, len(dataset)))
        rows = _proxy_rows(prepared, store, targets, sample, order,
                           {"batch_size": batch_size, "threads": threads, "progress": progress})
    else:
        rows = measure_sensitivity(measurer, targets, order, progress=progress)
    rows = rank_sensitivity(rows, thresholds)
    lowest = {node.name: fmts[0] for node, fmts in targets}
    base, gains = (_reverse(measurer, lowest, targets, order, progress)
                   if (reverse if reverse is not None else not proxy) else (None, ()))
    points: tuple[CurvePoint, ...] = ()
    if curve if curve is not None else not proxy:
        points = measure_curve(measurer, prepared, lowest, _orders(rows, lowest, order),
                               progress=progress)
    dists = analyze_distributions(prepared, formats=wanted) if distributions else ()
    store.flush()
    fp32 = measurer.fp32()
    analysis = Analysis(
        model=graph.name, profile=prepared.profile.name, metric=fp32.primary,
        higher_is_better=measurer.higher_is_better, fp32=dict(fp32.metrics),
        samples=fp32.samples, mode="proxy" if proxy else "end_to_end", formats=wanted,
        thresholds=thresholds, sensitivity=rows, reverse_base=base, reverse=gains,
        curve=points, distributions=dists, evaluations=measurer.evaluations,
        seconds=time.perf_counter() - start,
        timing=(_proxy_timing(rows) if proxy else
                _timing(measurer, [assignment_key({r.node: r.format}) for r in rows])),
        key=store.key)
    if out is not None:
        write_analysis(analysis, out, prepared)
    logger.info("analyzed %d (node, format) pairs of %s in %.1f s (%d evaluations)",
                len(rows), graph.name, analysis.seconds, measurer.evaluations)
    return analysis


def _reverse(measurer: Measurer, lowest: Mapping[str, str],
             targets: Sequence[tuple[Node, tuple[str, ...]]], order: Mapping[str, int],
             progress: bool) -> tuple[dict[str, Any], tuple[RestoreGain, ...]]:
    reference, gains = measure_reverse(measurer, lowest, [n for n, _ in targets], order,
                                       progress=progress)
    base = {"formats": dict(lowest), "metric": reference.value, "sqnr": reference.sqnr,
            "metrics": dict(reference.metrics), "kl": reference.kl}
    return base, gains


def _evaluator_factory(prepared: Prepared, data: Dataset, metric: str | None, batch_size: int,
                       threads: int) -> Callable[[], Evaluator]:
    def make() -> Evaluator:
        return Evaluator(prepared.graph, data, metric=metric, batch_size=batch_size,
                         threads=threads)
    return make


def _orders(rows: Sequence[NodeSensitivity], lowest: Mapping[str, str],
            order: Mapping[str, int]) -> dict[str, list[str]]:
    """Topological order, and sensitivity order (least sensitive first) in each node's lowest
    analyzed format."""
    own = [r for r in rows if lowest.get(r.node) == r.format]
    by_severity = sorted(own, key=lambda r: (severity(r), r.index), reverse=True)
    return {"topological": sorted(lowest, key=order.__getitem__),
            "sensitivity": [r.node for r in by_severity]}


# -- files ---------------------------------------------------------------------------------
def _write_csv(path: Path, rows: Sequence[Mapping[str, Any]], header: Sequence[str]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(header), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    atomic_write(path, buffer.getvalue().encode())


def _cell(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, (list, tuple)):
        return "; ".join(str(v) for v in value)
    return value


def write_analysis(analysis: Analysis, run_dir: str | Path, prepared: Prepared) -> None:
    """Write the analysis files of ``analysis`` into ``run_dir`` (see the module docstring)."""
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "summary.json", prepared.summary.to_dict())
    write_json(out / "profile.json", prepared.profile.to_dict())
    data = analysis.to_dict()
    write_json(out / "sensitivity.json", data)
    _write_csv(out / "sensitivity.csv", data["nodes"], list(NodeSensitivity.__dataclass_fields__))
    _write_csv(out / "reverse.csv", data["reverse"]["rows"],
               list(RestoreGain.__dataclass_fields__))
    orders: dict[str, list[dict[str, Any]]] = {}
    for point in analysis.curve:
        orders.setdefault(point.order, []).append(point.to_dict())
    write_json(out / "curve.json", {
        "schema": SCHEMA, "metric": analysis.metric,
        "higher_is_better": analysis.higher_is_better,
        "fp32_metric": analysis.fp32.get(analysis.metric),
        "fp32_size": model_size(prepared.graph, prepared.profile, {}),
        "orders": orders})
    _write_csv(out / "curve.csv", [p.to_dict() for p in analysis.curve],
               list(CurvePoint.__dataclass_fields__))
    entries = [d.to_dict() for d in analysis.distributions]
    write_json(out / "distributions.json", {"schema": SCHEMA, "nodes": entries})
    _write_csv(out / "distributions.csv", [r for d in analysis.distributions for r in d.rows()],
               STAT_COLUMNS)
