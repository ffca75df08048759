"""Layer-wise sensitivity: one node quantized (forward), one node restored (reverse), the curve.

Consumes the shared :class:`~mpsearch.analysis.Measurer` (which builds, opens and scores one
assignment per call and caches the result by assignment); produces frozen result rows:

* :class:`NodeSensitivity` -- the node alone in a lower-precision format, the rest FP32: metric
  drop against the evaluator's FP32 metric and the deviation of the model output (SQNR, MSE,
  cosine, KL of the softmax), ranked per format and classified ``low``/``medium``/``high``
  by :class:`Thresholds`;
* :class:`RestoreGain` -- everything quantized except this node: the gain when it is restored;
* :class:`CurvePoint` -- nodes quantized cumulatively in a given order, metric and model size at
  each step.

Drops and gains are oriented so that positive means "worse when quantized" whatever the metric's
direction. The SQNR of identical outputs is ``inf`` (serialized as null).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from mpsearch import kernels
from mpsearch.analysis._measure import Measurement, Measurer
from mpsearch.calibration import CalibrationTable
from mpsearch.data import Dataset
from mpsearch.graph import ModelGraph, Node, load_model, node_model
from mpsearch.profiles import HardwareProfile, runs_fused_int8
from mpsearch.progress import Progress, Reporter, steps
from mpsearch.quantize import Quantizer
from mpsearch.runtime import create_session
from mpsearch.spec import Thresholds

__all__ = [
    "CLASSES",
    "NodeSensitivity",
    "RestoreGain",
    "Thresholds",
    "kendall_tau",
    "lower_formats",
    "measure_proxy",
    "measure_reverse",
    "measure_sensitivity",
    "node_model",
    "rank_sensitivity",
    "severity",
    "worsening",
]

logger = logging.getLogger(__name__)

CLASSES = ("low", "medium", "high")


def worsening(fp32: float, value: float, higher_is_better: bool) -> float:
    """How much worse ``value`` is than ``fp32`` (positive = worse), for either direction."""
    return fp32 - value if higher_is_better else value - fp32


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSensitivity:
    """One node quantized alone in ``format``, the rest FP32.

    ``metric`` is the primary metric, ``drop`` FP32 minus it (positive = worse), ``sqnr`` (dB),
    ``mse``, ``cosine`` and ``kl`` compare the model output with FP32. In proxy mode those are
    None and ``proxy_sqnr`` (the node's own output SQNR) is set. ``rank`` is 1 for the most
    sensitive node of this format; ``index`` is the node's topological position.
    """

    node: str
    op_type: str
    format: str
    index: int
    metric: float | None = None
    drop: float | None = None
    sqnr: float | None = None
    mse: float | None = None
    cosine: float | None = None
    kl: float | None = None
    proxy_sqnr: float | None = None
    cls: str = "low"
    rank: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class RestoreGain:
    """Everything in its lowest format except ``node`` (kept FP32): the gain of restoring it.

    ``gain`` is the metric improvement over the all-quantized base (positive = better),
    ``sqnr_gain`` the output SQNR improvement in dB; ``rank`` 1 is the most useful restore.
    """

    node: str
    op_type: str
    format: str
    index: int
    metric: float
    gain: float
    sqnr: float | None
    sqnr_gain: float | None
    mse: float | None
    kl: float | None
    rank: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def lower_formats(
    profile: HardwareProfile, node: Node, formats: Sequence[str] | None = None
) -> tuple[str, ...]:
    """Formats below FP32 that ``profile`` allows for ``node`` (and ``formats`` lists), by rank."""
    allowed = profile.formats_for_node(node) if node.quantizable else ()
    lower = [f for f in allowed if profile.format(f).activation.dtype != "float32"
             or profile.format(f).weight.dtype != "float32"]
    return tuple(f for f in lower if formats is None or f in formats)


def measure_sensitivity(
    measurer: Measurer, targets: Sequence[tuple[Node, tuple[str, ...]]],
    order: Mapping[str, int], *, samples: int | None = None, measure_above: float | None = None,
    progress: Reporter | None = None,
) -> tuple[NodeSensitivity, ...]:
    """Each (node, format) of ``targets`` quantized alone, on the first ``samples`` samples;
    unranked rows in topological order.

    With ``measure_above``, a node's next format up is measured only where the format below it
    costs (:meth:`Measurement.cost`) at least that fraction of the largest lowest-format cost:
    a node that barely notices INT8 has no INT16 row, one that INT16 already fixes no row above.
    """
    fp32 = measurer.fp32(samples)
    higher = measurer.higher_is_better
    lowest = [(node, fmts[0]) for node, fmts in targets]
    measured = {(n.name, f): measurer.measure({n.name: f}, samples=samples)
                for n, f in steps(lowest, "sensitivity", progress, unit="cfg")}

    def cost(node: Node, fmt: str) -> float:
        return measured[(node.name, fmt)].cost(fp32.value, higher)

    floor = 0.0 if measure_above is None else measure_above * max(
        (cost(n, f) for n, f in lowest), default=0.0)
    for level in range(1, max((len(fmts) for _, fmts in targets), default=0)):
        upper = [(node, fmts[level]) for node, fmts in targets if level < len(fmts)
                 and (node.name, fmts[level - 1]) in measured
                 and (measure_above is None or (cost(node, fmts[level - 1]) >= floor
                                                and cost(node, fmts[level - 1]) > 0))]
        stage = f"sensitivity ({'/'.join(sorted({f for _, f in upper}))})"
        for node, fmt in steps(upper, stage, progress, unit="cfg"):
            measured[(node.name, fmt)] = measurer.measure({node.name: fmt}, samples=samples)
    rows = []
    for node, fmts in targets:
        for fmt in fmts:
            m = measured.get((node.name, fmt))
            if m is None:
                continue
            rows.append(NodeSensitivity(
                node=node.name, op_type=node.op_type, format=fmt, index=order[node.name],
                metric=m.value, drop=worsening(fp32.value, m.value, higher), sqnr=m.sqnr,
                mse=m.metrics.get("mse"), cosine=m.metrics.get("cosine"), kl=m.kl,
                seconds=m.seconds))
    return tuple(rows)


def severity(row: NodeSensitivity) -> tuple[float, float]:
    """Sort key, most sensitive first: larger drop, then lower (model or node) output SQNR."""
    drop = row.drop if row.drop is not None and not math.isnan(row.drop) else 0.0
    sqnr = row.sqnr if row.sqnr is not None else row.proxy_sqnr
    return -drop, math.inf if sqnr is None or math.isnan(sqnr) else sqnr


def rank_sensitivity(
    rows: Sequence[NodeSensitivity], thresholds: Thresholds
) -> tuple[NodeSensitivity, ...]:
    """Rows with ``rank`` (per format, 1 = most sensitive) and ``cls`` set, in input order."""
    ranks: dict[tuple[str, str], int] = {}
    for fmt in dict.fromkeys(r.format for r in rows):
        ordered = sorted((r for r in rows if r.format == fmt), key=lambda r: (severity(r),
                                                                             r.index))
        ranks.update({(r.node, fmt): i + 1 for i, r in enumerate(ordered)})
    return tuple(replace(r, rank=ranks[(r.node, r.format)],
                         cls=thresholds.classify(r.drop, r.sqnr if r.sqnr is not None
                                                 else r.proxy_sqnr)) for r in rows)


def measure_reverse(
    measurer: Measurer, base: Mapping[str, str], nodes: Sequence[Node],
    order: Mapping[str, int], *, samples: int | None = None, progress: Reporter | None = None,
) -> tuple[Measurement, tuple[RestoreGain, ...]]:
    """The all-quantized ``base`` and, per node of ``nodes``, the gain of restoring it to FP32
    (on the first ``samples`` samples)."""
    higher = measurer.higher_is_better
    reference = measurer.measure(base, samples=samples)
    rows = []
    for node in steps(nodes, "reverse", progress, unit="cfg"):
        m = measurer.measure({k: v for k, v in base.items() if k != node.name}, samples=samples)
        gain = -worsening(reference.value, m.value, higher)
        sqnr_gain = (None if m.sqnr is None or reference.sqnr is None
                     or math.isinf(m.sqnr) or math.isinf(reference.sqnr)
                     else m.sqnr - reference.sqnr)
        rows.append(RestoreGain(
            node=node.name, op_type=node.op_type, format=base[node.name],
            index=order[node.name], metric=m.value, gain=gain, sqnr=m.sqnr,
            sqnr_gain=sqnr_gain, mse=m.metrics.get("mse"), kl=m.kl, seconds=m.seconds))
    ordered = sorted(rows, key=lambda r: (-r.gain, -(r.sqnr_gain or 0.0), r.index))
    ranks = {r.node: i + 1 for i, r in enumerate(ordered)}
    return reference, tuple(replace(r, rank=ranks[r.node]) for r in rows)


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b rank correlation of two equally long sequences (nan if undefined)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"kendall_tau: {a.size} vs {b.size} values; give equal lengths")
    if a.size < 2:
        return math.nan
    i, j = np.triu_indices(a.size, k=1)
    da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    n1, n2 = np.count_nonzero(da), np.count_nonzero(db)
    if n1 == 0 or n2 == 0:
        return math.nan
    return float(np.sum(da * db) / math.sqrt(float(n1) * float(n2)))


# -- proxy: the node's own output SQNR, from a few batches --------------------------------
def _chunks(graph: ModelGraph, nodes: Sequence[Node], samples: int,
            budget_bytes: int) -> list[list[Node]]:
    """Groups of nodes whose captured inputs and outputs fit ``budget_bytes`` together."""
    chunks: list[list[Node]] = [[]]
    used = 0
    for node in nodes:
        tensors = [t for t in (*node.inputs, *node.outputs) if t and t not in graph.initializers]
        size = 4 * samples * sum(
            int(np.prod([d if isinstance(d, int) and d > 0 else 1
                         for d in graph.shapes.get(t) or ()])) for t in tensors)
        if chunks[-1] and used + size > budget_bytes:
            chunks.append([])
            used = 0
        chunks[-1].append(node)
        used += size
    return [c for c in chunks if c]


def _capture(graph: ModelGraph, nodes: Sequence[Node], data: Dataset, batch_size: int,
             threads: int) -> list[dict[str, np.ndarray]]:
    """FP32 values of the nodes' inputs and outputs, one dict per batch of ``data``."""
    inputs = {i.name for i in graph.inputs}
    wanted = [t for n in nodes for t in (*n.inputs, *n.outputs)
              if t and t not in graph.initializers]
    extra = [t for t in dict.fromkeys(wanted) if t not in inputs]
    session = create_session(graph.model, threads=threads, extra_outputs=extra,
                             label=graph.name)
    return [{**dict(feeds), **session.run(feeds, extra)} for feeds in data.batches(batch_size)]


def _proxy_error(graph: ModelGraph, node: Node, formats: Sequence[str], table: CalibrationTable,
                 profile: HardwareProfile, method: str | None,
                 batches: Sequence[Mapping[str, np.ndarray]], threads: int) -> list[float]:
    single = load_model(node_model(graph, node))
    quantizer = Quantizer(single, table, profile, method=method)
    output = next(t for t in node.outputs if t)
    feeds = [t.name for t in single.inputs]
    reference = np.concatenate([b[output] for b in batches], axis=0)
    errors = []
    for fmt in formats:
        session = create_session(quantizer.build({node.name: fmt}), threads=threads,
                                 label=f"{node.name} {fmt}", fused_int8=runs_fused_int8(profile))
        test = np.concatenate([session.run({t: b[t] for t in feeds}, [output])[output]
                               for b in batches], axis=0)
        errors.append(kernels.error_stats(reference, test)[1])
    return errors


def measure_proxy(
    graph: ModelGraph, table: CalibrationTable, profile: HardwareProfile,
    targets: Sequence[tuple[Node, tuple[str, ...]]], data: Dataset, order: Mapping[str, int],
    *, method: str | None = None, batch_size: int = 32, threads: int = 2,
    budget_bytes: int = 256 << 20, progress: Reporter | None = None,
) -> tuple[NodeSensitivity, ...]:
    """Fast proxy: each (node, format) quantized in a one-node model fed with FP32 inputs.

    The FP32 model's inputs and outputs of each node are captured on ``data`` (keep it a few
    batches) in groups that fit ``budget_bytes``; ``proxy_sqnr`` is the SQNR of the node's
    quantized output against its FP32 output. Unranked rows in topological order.
    """
    formats = {node.name: fmts for node, fmts in targets}
    rows: list[NodeSensitivity] = []
    total, done = sum(len(f) for f in formats.values()), 0
    for chunk in _chunks(graph, [n for n, _ in targets], len(data), budget_bytes):
        batches = _capture(graph, chunk, data, batch_size, threads)
        for node in chunk:
            start = time.perf_counter()
            errors = _proxy_error(graph, node, formats[node.name], table, profile, method,
                                  batches, threads)
            seconds = (time.perf_counter() - start) / max(len(errors), 1)
            rows.extend(NodeSensitivity(node=node.name, op_type=node.op_type, format=fmt,
                                        index=order[node.name], proxy_sqnr=sqnr,
                                        seconds=seconds)
                        for fmt, sqnr in zip(formats[node.name], errors, strict=True))
            done += len(errors)
            if progress is not None:
                progress(Progress(stage="proxy", done=done, total=total, unit="cfg"))
    return tuple(rows)
