"""Evaluation: run a (quantized) model over data with ONNX Runtime and score it against FP32.

Consumes the FP32 :class:`~mpsearch.graph.ModelGraph`, a :class:`~mpsearch.data.Dataset` and
candidate models; produces :class:`Evaluation` results. The FP32 reference outputs are computed
once per :class:`Evaluator` and reused for every candidate.

Built-in metrics (``METRICS``), each with its direction: ``accuracy`` and ``top5`` (need labels),
``agreement`` (top-1 agreement with FP32), ``sqnr`` (dB), ``cosine`` and ``mse`` of the primary
output versus FP32. A user metric is ``"package.module:function"`` taking
``(outputs, reference, labels)`` and returning a float; set ``function.higher_is_better = False``
for a loss, and ``function.proportion = True`` when it returns the share of samples that pass
(k of n), as ``accuracy`` does: its held-out interval is then Wilson's and the search breaks
ties below one sample by output SQNR.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import onnx

from mpsearch import kernels
from mpsearch.data import Dataset, check_finite
from mpsearch.errors import DataError, SpecError
from mpsearch.graph import ModelGraph
from mpsearch.runtime import Session, SharedWeights, create_session

__all__ = ["METRICS", "Evaluation", "Evaluator", "Metric", "evaluation_batch", "is_proportion",
           "metric_floor", "resolve_metric"]

logger = logging.getLogger(__name__)

#: Candidates of a model with at least this many bytes of large float weights read the ones
#: they leave unchanged from a shared file (:class:`~mpsearch.runtime.SharedWeights`): below
#: it, serializing them costs little.
SHARE_WEIGHTS_ABOVE = 8 << 20
#: The environment variable that sets the activation memory (MB) of one batch.
ACTIVATION_ENV = "MPSEARCH_ACTIVATION_MB"
#: Activation memory of one batch by default: ONNX Runtime's working tensors of the largest
#: node, and for calibration every exposed activation (one sample of a document-layout model
#: exposes nearly this much, and calibration cannot yet split a sample's tensors over passes).
ACTIVATION_MB = 1024

#: The share of the activation budget one evaluation batch's working memory may take: a
#: measurer also keeps FP32 tensors for its prefix reuse (:mod:`mpsearch.analysis`, a quarter),
#: and the process's memory pool holds a batch's tensors with some fragmentation.
EVALUATION_SHARE = 0.5

MetricFn = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], float]


@dataclass(frozen=True, slots=True, kw_only=True)
class Metric:
    name: str
    higher_is_better: bool
    needs_labels: bool
    fn: MetricFn = field(repr=False)
    proportion: bool = False  # the share of samples that pass (k of n)


def _top1(outputs: np.ndarray) -> np.ndarray:
    top: np.ndarray = outputs.reshape(len(outputs), -1).argmax(axis=1)
    return top


def _accuracy(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> float:
    assert labels is not None  # guarded by needs_labels
    return float(np.mean(_top1(outputs) == labels.reshape(-1)))


def _top5(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> float:
    assert labels is not None
    flat = outputs.reshape(len(outputs), -1)
    top = np.argsort(-flat, axis=1)[:, :5]
    return float(np.mean((top == labels.reshape(-1, 1)).any(axis=1)))


def _agreement(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> float:
    return float(np.mean(_top1(outputs) == _top1(reference)))


def _error(index: int) -> MetricFn:
    def metric(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> float:
        return float(kernels.error_stats(reference, outputs)[index])
    return metric


METRICS: Mapping[str, Metric] = MappingProxyType({
    "accuracy": Metric(name="accuracy", higher_is_better=True, needs_labels=True, fn=_accuracy,
                       proportion=True),
    "top5": Metric(name="top5", higher_is_better=True, needs_labels=True, fn=_top5,
                   proportion=True),
    "agreement": Metric(name="agreement", higher_is_better=True, needs_labels=False,
                        fn=_agreement, proportion=True),
    "mse": Metric(name="mse", higher_is_better=False, needs_labels=False, fn=_error(0)),
    "sqnr": Metric(name="sqnr", higher_is_better=True, needs_labels=False, fn=_error(1)),
    "cosine": Metric(name="cosine", higher_is_better=True, needs_labels=False, fn=_error(2)),
})


def resolve_metric(name: str) -> Metric:
    """A built-in metric by name, or a user metric given as ``package.module:function``."""
    if name in METRICS:
        return METRICS[name]
    if ":" not in name:
        raise SpecError(f"unknown metric '{name}'; use one of {', '.join(METRICS)} "
                        "or 'package.module:function'")
    module_name, _, attr = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise SpecError(f"metric '{name}': cannot import {attr} from {module_name} ({e}); "
                        "check the module is on PYTHONPATH") from e
    return Metric(name=name, higher_is_better=bool(getattr(fn, "higher_is_better", True)),
                  needs_labels=False, fn=fn, proportion=bool(getattr(fn, "proportion", False)))


def metric_floor(fp32: float, higher: bool, *, min_metric: float | None,
                 max_metric_drop: float | None) -> float | None:
    """The metric a configuration must reach (None: any): ``min_metric`` and FP32's metric
    ``fp32`` less ``max_metric_drop``, whichever is stricter (``higher`` is better or not; a
    drop is a loss either way round)."""
    floors = [] if min_metric is None else [min_metric]
    if max_metric_drop is not None:
        floors.append(fp32 - max_metric_drop if higher else fp32 + max_metric_drop)
    return None if not floors else (max(floors) if higher else min(floors))


def is_proportion(metric: str) -> bool:
    """True when ``metric`` is the share of samples that pass (k of n samples)."""
    return resolve_metric(metric).proportion


#: The live :class:`SharedWeights` by graph fingerprint: the evaluators of one model's splits
#: (search, held-out) share one file. (Only equal bytes are ever read from it.)
_SHARED: weakref.WeakValueDictionary[str, SharedWeights] = weakref.WeakValueDictionary()


def _shared_weights(graph: ModelGraph) -> SharedWeights | None:
    """:class:`SharedWeights` of ``graph`` (the one already written, if it is alive), or None
    (sessions then carry every weight) when the temporary folder cannot be written."""
    shared = _SHARED.get(graph.fingerprint)
    if shared is not None:
        return shared
    try:
        shared = SharedWeights(graph.model)
    except OSError as e:
        logger.warning("%s: cannot write its weights to a temporary folder (%s); sessions will "
                       "carry them, which is slower", graph.name, e)
        return None
    _SHARED[graph.fingerprint] = shared
    return shared


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """Metrics of one model on one data set, with the primary metric singled out."""

    metrics: Mapping[str, float]
    primary: str
    samples: int
    seconds: float

    @property
    def value(self) -> float:
        return self.metrics[self.primary]

    def to_dict(self) -> dict[str, object]:
        return {"metrics": dict(self.metrics), "primary": self.primary,
                "samples": self.samples, "seconds": self.seconds}


class Evaluator:
    """Scores candidate models on ``data`` against the FP32 model's outputs (computed once).
    ``fused_int8`` False runs candidates' Q/DQ as written, where the host's fused int8 kernels
    would not compute what the target does (:func:`mpsearch.profiles.runs_fused_int8`)."""

    def __init__(
        self, graph: ModelGraph, data: Dataset, *, metric: str | None = None,
        batch_size: int = 64, threads: int = 2, fused_int8: bool = True,
    ) -> None:
        if len(data) == 0:
            raise DataError(f"{data.source}: no samples to evaluate on")
        self.graph = graph
        self.data = data
        batch_size = evaluation_batch(graph, batch_size)
        self.batch_size = batch_size
        self.threads = threads
        self.fused_int8 = fused_int8
        self.output = graph.outputs[0].name
        self.primary = resolve_metric(metric or ("accuracy" if data.labels is not None
                                                 else "agreement"))
        if self.primary.needs_labels and data.labels is None:
            raise DataError(f"{data.source}: metric '{self.primary.name}' needs labels; add a "
                            "'labels' array or use metric 'agreement'")
        for index, feeds in enumerate(data.batches(batch_size)):
            check_finite(feeds, source=data.source, batch=index, batch_size=batch_size)
        reference = create_session(graph.model, threads=threads, label=graph.name, pooled=True)
        self.fixed_batch = reference.fixed_batch
        large = sum(a.nbytes for a in graph.initializers.values() if a.nbytes >= 1 << 16)
        self.shared = _shared_weights(graph) if large >= SHARE_WEIGHTS_ABOVE else None
        self.reference = self._outputs(reference)
        _check_outputs(self.reference, f"{data.source}: the reference model {graph.name!r}",
                       "check the model and its inputs")

    def _outputs(self, session: Session, limit: int | None = None) -> np.ndarray:
        """``session``'s primary output on the first ``limit`` samples."""
        parts, seen = [], 0
        for feeds in self.data.batches(self.batch_size):
            parts.append(session.run(feeds, [self.output])[self.output])
            seen += len(parts[-1])
            if limit is not None and seen >= limit:
                break
        return np.concatenate(parts, axis=0)[:limit]

    def metrics(self, outputs: np.ndarray, *, start: int = 0) -> dict[str, float]:
        """Every applicable metric of ``outputs`` (rows ``start...`` of the data)."""
        stop = start + len(outputs)
        reference = self.reference[start:stop]
        labels = None if self.data.labels is None else self.data.labels[start:stop]
        out = {}
        for name, metric in METRICS.items():
            if metric.needs_labels and labels is None:
                continue
            out[name] = metric.fn(outputs, reference, labels)
        if self.primary.name not in out:
            out[self.primary.name] = self.primary.fn(outputs, reference, labels)
        return out

    @property
    def stand_ins(self) -> Mapping[str, onnx.TensorProto]:
        """References to the shared weights a build may emit for the float initializers it
        keeps (:meth:`mpsearch.quantize.Quantizer.build`); empty when nothing is shared.
        Models built with them open only through :meth:`session`."""
        return {} if self.shared is None else self.shared.stand_ins

    def session(self, model: onnx.ModelProto | bytes) -> Session:
        return create_session(model, threads=self.threads, label="candidate", shared=self.shared,
                              pooled=True, fused_int8=self.fused_int8)

    def outputs(self, model: onnx.ModelProto | bytes | Session) -> np.ndarray:
        """The primary output of ``model`` on every sample (rows aligned with ``reference``)."""
        return self._outputs(model if isinstance(model, Session) else self.session(model))

    def evaluate(
        self, model: onnx.ModelProto | bytes | Session, *, limit: int | None = None,
        require_finite: bool = False,
    ) -> Evaluation:
        """Score ``model`` on the first ``limit`` samples (all by default). With
        ``require_finite``, a NaN or Inf output is a :class:`DataError` instead of NaN metrics."""
        start = time.perf_counter()
        session = model if isinstance(model, Session) else self.session(model)
        outputs = self._outputs(session, limit)
        if require_finite:
            _check_outputs(outputs, f"{self.data.source}: the evaluated model",
                           "its quantization overflows or the model is broken")
        return Evaluation(metrics=self.metrics(outputs), primary=self.primary.name,
                          samples=len(outputs), seconds=time.perf_counter() - start)

    def fp32(self) -> Evaluation:
        """The FP32 model's own metrics (agreement 1, SQNR infinite)."""
        return Evaluation(metrics=self.metrics(self.reference), primary=self.primary.name,
                          samples=len(self.reference), seconds=0.0)


def _check_outputs(outputs: np.ndarray, what: str, fix: str) -> None:
    """DataError naming how many samples of ``outputs`` hold NaN or Inf, and the first."""
    if outputs.dtype.kind != "f":
        return
    bad = ~np.isfinite(outputs.reshape(len(outputs), -1)).all(axis=1)
    if bad.any():
        raise DataError(f"{what} outputs NaN or Inf for {int(bad.sum())} of {len(outputs)} "
                        f"samples (first: sample {int(np.argmax(bad))}); {fix}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationSize:
    """Bytes of one sample's activations, from the graph's inferred shapes (a leading symbolic
    dimension is the batch; tensors with other unknown dimensions are not counted).
    ``largest`` is the largest tensor, ``node`` the largest node's inputs and outputs together
    (what ONNX Runtime holds at once to run it), ``total`` every float activation given."""

    tensor: str
    largest: int
    node: int
    total: int


def activation_budget() -> int:
    """Bytes the activations of one batch may take: ``MPSEARCH_ACTIVATION_MB`` (MB), else
    :data:`ACTIVATION_MB`."""
    text = os.environ.get(ACTIVATION_ENV, "").strip()
    if not text:
        return ACTIVATION_MB * 1_000_000
    try:
        mb = int(text)
    except ValueError:
        mb = 0
    if not 1 <= mb <= 1 << 24:
        raise DataError(f"{ACTIVATION_ENV}={text!r} must be a whole number of MB from 1; "
                        f"unset it for the default {ACTIVATION_MB}")
    return mb * 1_000_000


def _per_sample(graph: ModelGraph, tensor: str) -> int | None:
    shape = graph.shapes.get(tensor)
    if shape is None or tensor in graph.initializers or tensor not in graph.elem_types:
        return None
    dims = [d for d in (shape[1:] if shape and not isinstance(shape[0], int) else shape)
            if isinstance(d, int) and d >= 0]
    if len(dims) != len(shape) - (1 if shape and not isinstance(shape[0], int) else 0):
        return None
    try:
        size = onnx.helper.tensor_dtype_to_np_dtype(graph.elem_types[tensor]).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return math.prod(dims) * int(size)


def activation_size(graph: ModelGraph, tensors: tuple[str, ...] = ()) -> ActivationSize:
    """One sample's activation bytes of ``graph``; ``total`` sums ``tensors``."""
    sizes = {t: b for t in graph.shapes if (b := _per_sample(graph, t)) is not None}
    tensor = max(sizes, key=lambda t: sizes[t], default="")
    node = max((sum(sizes.get(t, 0) for t in {*n.inputs, *n.outputs} if t)
                for n in graph.nodes.values()), default=0)
    return ActivationSize(tensor=tensor, largest=sizes.get(tensor, 0), node=node,
                          total=sum(sizes.get(t, 0) for t in tensors))


def fitting_batch(graph: ModelGraph, batch: int | None, what: str, *,
                  tensors: tuple[str, ...] = (), budget: int | None = None) -> int:
    """``batch`` (None: as many as fit) shrunk so one batch's activations fit the activation
    budget: twice the largest node's inputs and outputs (ONNX Runtime's arena holds about as
    much again), plus ``tensors`` held as outputs. DataError naming the largest tensor, its
    size and the setting to raise when one sample alone does not fit."""
    budget = activation_budget() if budget is None else budget
    size = activation_size(graph, tensors)
    per_sample = 2 * size.node + size.total
    if per_sample > budget:
        held = f" ({per_sample / 1e6:.0f} MB with ONNX Runtime's working copies and the " \
            f"activations held for {what})"
        raise DataError(f"{graph.name}: tensor '{size.tensor}' takes "
                        f"{size.largest / 1e6:.0f} MB per sample{held}, more than the "
                        f"{budget / 1e6:.0f} MB activations may use; raise {ACTIVATION_ENV} "
                        "(MB) if the machine has the memory, or feed smaller inputs")
    fit = max(1, budget // max(per_sample, 1))
    if batch is not None and fit < batch:
        logger.info("%s: batches of %d (not %d): %.1f MB of activations per sample fit %.0f "
                    "MB", what, fit, batch, per_sample / 1e6, budget / 1e6)
    return int(fit if batch is None else min(batch, fit))


def evaluation_batch(graph: ModelGraph, batch: int | None) -> int:
    """The batch of an evaluation: ``batch`` shrunk so its working memory fits
    :data:`EVALUATION_SHARE` of the activation budget (at least one sample; DataError, as
    :func:`fitting_batch`, only when one sample does not fit the whole budget)."""
    fit = fitting_batch(graph, batch, "evaluation")
    share = int(EVALUATION_SHARE * activation_budget())
    per_sample = 2 * activation_size(graph).node
    return max(1, min(fit, share // max(per_sample, 1)))
