"""Layer-wise sensitivity: one node quantized (forward), one node restored (reverse), the curve.

Consumes a :class:`~mpsearch.quantize.Quantizer` and an :class:`~mpsearch.evaluate.Evaluator`
(wrapped in a :class:`Measurer`, which builds, opens and scores one assignment per call and
caches the result by assignment); produces frozen result rows:

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

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from tqdm import tqdm

from mpsearch import kernels
from mpsearch.calibration import CalibrationTable
from mpsearch.data import Dataset
from mpsearch.errors import SpecError
from mpsearch.evaluate import Evaluator, resolve_metric
from mpsearch.graph import ModelGraph, Node, load_model
from mpsearch.profiles import HardwareProfile
from mpsearch.quantize import Quantizer
from mpsearch.runtime import create_session

__all__ = [
    "CLASSES",
    "Measurement",
    "Measurer",
    "NodeSensitivity",
    "RestoreGain",
    "Thresholds",
    "assignment_key",
    "kendall_tau",
    "lower_formats",
    "measure_proxy",
    "measure_reverse",
    "measure_sensitivity",
    "node_model",
    "output_kl",
    "rank_sensitivity",
    "severity",
    "worsening",
]

logger = logging.getLogger(__name__)

CLASSES = ("low", "medium", "high")


@dataclass(frozen=True, slots=True, kw_only=True)
class Thresholds:
    """When a (node, format) is classed ``high``, ``medium`` or ``low`` sensitivity.

    ``high`` when its metric drop is at least ``high_drop`` or the model-output SQNR is below
    ``high_sqnr`` dB; else ``medium`` when the drop is at least ``medium_drop`` or the SQNR is
    below ``medium_sqnr``; else ``low``. Drops are in units of the primary metric (0.01 = one
    accuracy point). In proxy mode the SQNR is the node's own output SQNR (there is no drop).
    """

    high_drop: float = 0.01
    medium_drop: float = 0.002
    high_sqnr: float = 20.0
    medium_sqnr: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.medium_drop <= self.high_drop:
            raise SpecError(f"thresholds: need 0 <= medium_drop <= high_drop, got medium_drop="
                            f"{self.medium_drop}, high_drop={self.high_drop}; swap or fix them")
        if self.high_sqnr > self.medium_sqnr:
            raise SpecError(f"thresholds: need high_sqnr <= medium_sqnr (dB), got high_sqnr="
                            f"{self.high_sqnr}, medium_sqnr={self.medium_sqnr}; swap them")

    def classify(self, drop: float | None, sqnr: float | None) -> str:
        """``low``, ``medium`` or ``high`` for a metric drop and an output SQNR (either None)."""
        d = -math.inf if drop is None or math.isnan(drop) else drop
        s = math.inf if sqnr is None or math.isnan(sqnr) else sqnr
        if d >= self.high_drop or s < self.high_sqnr:
            return "high"
        if d >= self.medium_drop or s < self.medium_sqnr:
            return "medium"
        return "low"

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """Metrics of one assignment against FP32, with where the time went."""

    metrics: Mapping[str, float]
    primary: str
    kl: float | None = None
    samples: int = 0
    build_s: float = 0.0
    session_s: float = 0.0
    eval_s: float = 0.0

    @property
    def value(self) -> float:
        return self.metrics[self.primary]

    @property
    def sqnr(self) -> float | None:
        return self.metrics.get("sqnr")

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": dict(self.metrics), "primary": self.primary, "kl": self.kl,
                "samples": self.samples, "build_s": self.build_s,
                "session_s": self.session_s, "eval_s": self.eval_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """Inverse of :meth:`to_dict` after a JSON round trip (null SQNR is +inf)."""
        metrics = {k: (math.inf if k == "sqnr" else math.nan) if v is None else float(v)
                   for k, v in data["metrics"].items()}
        return cls(metrics=MappingProxyType(metrics), primary=str(data["primary"]),
                   kl=data.get("kl"), samples=int(data.get("samples", 0)),
                   build_s=float(data.get("build_s", 0.0)),
                   session_s=float(data.get("session_s", 0.0)),
                   eval_s=float(data.get("eval_s", 0.0)))


def output_kl(reference: np.ndarray, outputs: np.ndarray) -> float | None:
    """Mean KL(softmax(reference) || softmax(outputs)) over samples, for [N, classes] outputs.

    Outputs that are already probabilities (non-negative rows summing to 1) are used as they
    are. None for outputs that are not class scores.
    """
    if reference.ndim != 2 or reference.shape[1] < 2:
        return None
    ref, out = reference.astype(np.float64), outputs.astype(np.float64)
    if (ref >= 0).all() and np.allclose(ref.sum(axis=1), 1.0, atol=1e-3):
        logp = np.log(np.clip(ref, 1e-12, None))
        logq = np.log(np.clip(out, 1e-12, None))
    else:
        logp = ref - ref.max(axis=1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
        logq = out - out.max(axis=1, keepdims=True)
        logq -= np.log(np.exp(logq).sum(axis=1, keepdims=True))
    return float(np.mean(np.sum(np.exp(logp) * (logp - logq), axis=1)))


def assignment_key(formats: Mapping[str, str]) -> str:
    """Short stable key of the quantized part of an assignment (node -> format)."""
    text = json.dumps(sorted(formats.items()), separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:20]


class Measurer:
    """Scores assignments end to end: one build, one session and one pass per assignment.

    ``cache`` maps :func:`assignment_key` to :meth:`Measurement.to_dict` rows (the run
    directory's cache); ``evaluator`` is a zero-argument factory called on the first miss, so a
    fully cached rerun never runs the FP32 model. ``on_new`` is called after each new entry.
    """

    def __init__(
        self, quantizer: Quantizer, evaluator: Callable[[], Evaluator],
        cache: MutableMapping[str, Any] | None = None,
        on_new: Callable[[], None] | None = None,
    ) -> None:
        self.quantizer = quantizer
        self._factory = evaluator
        self._evaluator: Evaluator | None = None
        self.cache: MutableMapping[str, Any] = {} if cache is None else cache
        self.on_new = on_new
        self.evaluations = 0

    @property
    def evaluator(self) -> Evaluator:
        if self._evaluator is None:
            self._evaluator = self._factory()
        return self._evaluator

    @property
    def higher_is_better(self) -> bool:
        """Direction of the primary metric."""
        if self._evaluator is not None:
            return self._evaluator.primary.higher_is_better
        return resolve_metric(self.fp32().primary).higher_is_better

    def fp32(self) -> Measurement:
        """The FP32 model's own metrics (the evaluator's ``fp32()``; SQNR +inf)."""
        key = "fp32"
        if key not in self.cache:
            evaluation = self.evaluator.fp32()
            self.cache[key] = Measurement(
                metrics=MappingProxyType(dict(evaluation.metrics)), primary=evaluation.primary,
                kl=0.0, samples=evaluation.samples).to_dict()
        return Measurement.from_dict(self.cache[key])

    def measure(self, formats: Mapping[str, str]) -> Measurement:
        """Metrics of the model with ``formats`` (node -> format; other nodes FP32)."""
        key = assignment_key(formats)
        if key in self.cache:
            return Measurement.from_dict(self.cache[key])
        evaluator = self.evaluator
        start = time.perf_counter()
        model = self.quantizer.build(formats)
        built = time.perf_counter()
        session = evaluator.session(model)
        opened = time.perf_counter()
        parts = [session.run(feeds, [evaluator.output])[evaluator.output]
                 for feeds in evaluator.data.batches(evaluator.batch_size)]
        outputs = np.concatenate(parts, axis=0)
        result = Measurement(
            metrics=MappingProxyType(evaluator.metrics(outputs)), primary=evaluator.primary.name,
            kl=output_kl(evaluator.reference, outputs), samples=len(outputs),
            build_s=built - start, session_s=opened - built,
            eval_s=time.perf_counter() - opened)
        self.evaluations += 1
        self.cache[key] = result.to_dict()
        if self.on_new is not None:
            self.on_new()
        return result


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


def _bar(items: Sequence[Any], desc: str, progress: bool) -> Iterable[Any]:
    bar: Iterable[Any] = tqdm(items, desc=desc, unit="cfg", disable=not progress, leave=False)
    return bar


def measure_sensitivity(
    measurer: Measurer, targets: Sequence[tuple[Node, tuple[str, ...]]],
    order: Mapping[str, int], *, progress: bool = False,
) -> tuple[NodeSensitivity, ...]:
    """Each (node, format) of ``targets`` quantized alone; unranked rows in topological order."""
    fp32 = measurer.fp32()
    higher = measurer.higher_is_better
    pairs = [(node, fmt) for node, fmts in targets for fmt in fmts]
    rows = []
    for node, fmt in _bar(pairs, "sensitivity", progress):
        m = measurer.measure({node.name: fmt})
        rows.append(NodeSensitivity(
            node=node.name, op_type=node.op_type, format=fmt, index=order[node.name],
            metric=m.value, drop=worsening(fp32.value, m.value, higher), sqnr=m.sqnr,
            mse=m.metrics.get("mse"), cosine=m.metrics.get("cosine"), kl=m.kl,
            seconds=m.build_s + m.session_s + m.eval_s))
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
    order: Mapping[str, int], *, progress: bool = False,
) -> tuple[Measurement, tuple[RestoreGain, ...]]:
    """The all-quantized ``base`` and, per node of ``nodes``, the gain of restoring it to FP32."""
    higher = measurer.higher_is_better
    reference = measurer.measure(base)
    rows = []
    for node in _bar(nodes, "reverse", progress):
        m = measurer.measure({k: v for k, v in base.items() if k != node.name})
        gain = -worsening(reference.value, m.value, higher)
        sqnr_gain = (None if m.sqnr is None or reference.sqnr is None
                     or math.isinf(m.sqnr) or math.isinf(reference.sqnr)
                     else m.sqnr - reference.sqnr)
        rows.append(RestoreGain(
            node=node.name, op_type=node.op_type, format=base[node.name],
            index=order[node.name], metric=m.value, gain=gain, sqnr=m.sqnr,
            sqnr_gain=sqnr_gain, mse=m.metrics.get("mse"), kl=m.kl,
            seconds=m.build_s + m.session_s + m.eval_s))
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
def node_model(graph: ModelGraph, node: Node) -> onnx.ModelProto:
    """A one-node model: ``node`` with its initializers; its other inputs become graph inputs."""
    proto = graph.digraph.nodes[node.name]["proto"]
    inputs = list(dict.fromkeys(node.inputs))
    feeds = [t for t in inputs if t and t not in graph.initializers]
    inits = [numpy_helper.from_array(graph.initializers[t], t)
             for t in inputs if t in graph.initializers]

    def info(tensor: str) -> onnx.ValueInfoProto:
        elem = graph.elem_types.get(tensor) or onnx.TensorProto.FLOAT
        return helper.make_tensor_value_info(tensor, elem, graph.shapes.get(tensor))

    body = helper.make_graph([proto], node.name, [info(t) for t in feeds],
                             [info(t) for t in node.outputs if t], initializer=inits)
    return helper.make_model(body, opset_imports=list(graph.model.opset_import),
                             ir_version=graph.model.ir_version)


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
                                 label=f"{node.name} {fmt}")
        test = np.concatenate([session.run({t: b[t] for t in feeds}, [output])[output]
                               for b in batches], axis=0)
        errors.append(kernels.error_stats(reference, test)[1])
    return errors


def measure_proxy(
    graph: ModelGraph, table: CalibrationTable, profile: HardwareProfile,
    targets: Sequence[tuple[Node, tuple[str, ...]]], data: Dataset, order: Mapping[str, int],
    *, method: str | None = None, batch_size: int = 32, threads: int = 2,
    budget_bytes: int = 256 << 20, progress: bool = False,
) -> tuple[NodeSensitivity, ...]:
    """Fast proxy: each (node, format) quantized in a one-node model fed with FP32 inputs.

    The FP32 model's inputs and outputs of each node are captured on ``data`` (keep it a few
    batches) in groups that fit ``budget_bytes``; ``proxy_sqnr`` is the SQNR of the node's
    quantized output against its FP32 output. Unranked rows in topological order.
    """
    formats = {node.name: fmts for node, fmts in targets}
    rows: list[NodeSensitivity] = []
    bar = tqdm(total=sum(len(f) for f in formats.values()), desc="proxy", unit="cfg",
               disable=not progress, leave=False)
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
            bar.update(len(errors))
    bar.close()
    return tuple(rows)
