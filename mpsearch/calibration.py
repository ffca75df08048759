"""One streaming ONNX Runtime pass over calibration data -> :class:`CalibrationTable`.

Consumes a :class:`~mpsearch.graph.ModelGraph` and a :class:`~mpsearch.data.Dataset`; runs the
model once with every activation tensor that quantization needs exposed as an output, and
streams each batch into per-tensor collectors (min, max, moments and a histogram whose range
grows by powers of two, merged exactly), so memory does not depend on the number of samples.
Produces a frozen :class:`CalibrationTable` from which every range method (``minmax``,
``percentile``, ``entropy``, ``mse``; 8 or 16 bits; symmetric or not) is derived on demand, saved
as ``calibration.npz`` + ``calibration.json`` and keyed by the model and data fingerprints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from mpsearch import kernels
from mpsearch._data_limits import CORRUPT, Limits, read_npz
from mpsearch._io import atomic_write, json_finite, load_json
from mpsearch.data import Dataset, check_finite, check_signature
from mpsearch.errors import CalibrationError, DataError
from mpsearch.evaluate import fitting_batch
from mpsearch.graph import ModelGraph
from mpsearch.progress import Progress, Reporter
from mpsearch.runtime import create_session
from mpsearch.spec import MAX_THREADS, METHODS, machine_threads

__all__ = ["METHODS", "CalibrationTable", "TensorStats", "WeightStats", "calibrate",
           "calibrate_cached", "load_table", "weight_stats"]

logger = logging.getLogger(__name__)

TABLE_JSON = "calibration.json"
TABLE_NPZ = "calibration.npz"
_FORMAT = 2
#: A Softmax input's values more than this far below their row's maximum weigh less than
#: exp(-20) = 2e-9 of it: their range is clipped there (see ``TensorStats.softmax_row_max``).
SOFTMAX_SPAN = 20.0
#: Decoded bytes a saved table's histograms may take (they are int64, one row a tensor).
TABLE_LIMITS = Limits(data_bytes=256 << 20)


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorStats:
    """Streaming statistics of one activation tensor; ``hist`` spans [hist_lo, hist_hi]."""

    name: str
    count: int
    min: float
    max: float
    mean: float
    std: float
    hist: np.ndarray = field(repr=False, compare=False)
    hist_lo: float
    hist_hi: float
    #: For a tensor read only by Softmax: the smallest row maximum (along the Softmax axis)
    #: seen. Values below it minus :data:`SOFTMAX_SPAN` carry no weight after the Softmax in
    #: any row, so the range's lower end is clipped there: an additive attention mask of
    #: -10000 does not share an 8-bit scale with the scores. None otherwise.
    softmax_row_max: float | None = None

    @property
    def lo(self) -> float:
        return self.hist_lo

    @property
    def hi(self) -> float:
        return self.hist_hi

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "min": self.min, "max": self.max, "mean": self.mean,
                "std": self.std, "hist_lo": self.hist_lo, "hist_hi": self.hist_hi,
                "softmax_row_max": self.softmax_row_max}


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightStats:
    """Per-tensor and per-channel (along ``axis``; None for 1-D weights) min/max of a weight."""

    name: str
    shape: tuple[int, ...]
    axis: int | None
    min: float
    max: float
    channel_min: np.ndarray = field(repr=False, compare=False)
    channel_max: np.ndarray = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationTable:
    """Activation statistics of one (model, data) pair; ``range`` derives any method's range."""

    model_fingerprint: str
    data_fingerprint: str
    method: str
    samples: int
    bins: int
    percentile: float
    tensors: Mapping[str, TensorStats]
    _ranges: dict[tuple[Any, ...], tuple[float, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def range(self, tensor: str, *, bits: int = 8, symmetric: bool = False,
              method: str | None = None, percentile: float | None = None) -> tuple[float, float]:
        """Clip range of ``tensor`` for ``bits``-bit quantization (cached). Symmetric ranges
        are (-a, a). The quantizer widens every range to contain 0."""
        method = method or self.method
        if method not in METHODS:
            raise CalibrationError(f"calibration method '{method}' is unknown; use one of "
                                   f"{', '.join(METHODS)}")
        stats = self.tensors.get(tensor)
        if stats is None:
            raise CalibrationError(f"the calibration table has no statistics for tensor "
                                   f"'{tensor}'; recalibrate with the model being quantized")
        p = float(self.percentile if percentile is None else percentile)
        key = (tensor, method, int(bits), bool(symmetric), p if method == "percentile" else 0)
        if key not in self._ranges:
            self._ranges[key] = _derive(stats, method, int(bits), bool(symmetric), p)
        return self._ranges[key]

    def ranges(self, *, bits: int = 8, symmetric: bool = False,
               method: str | None = None) -> dict[str, tuple[float, float]]:
        """:meth:`range` of every tensor."""
        return {t: self.range(t, bits=bits, symmetric=symmetric, method=method)
                for t in self.tensors}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the histograms live in the npz file)."""
        return {"format": _FORMAT, "model_fingerprint": self.model_fingerprint,
                "data_fingerprint": self.data_fingerprint, "method": self.method,
                "samples": self.samples, "bins": self.bins, "percentile": self.percentile,
                "tensors": {name: s.to_dict() for name, s in self.tensors.items()}}

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write ``calibration.npz`` then ``calibration.json`` into ``directory``, each
        atomically (temp file + rename); the JSON records a digest of the npz."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        names = list(self.tensors)
        hists = (np.stack([self.tensors[n].hist for n in names]) if names
                 else np.zeros((0, self.bins), np.int64))
        hists = hists.astype(np.int64)
        atomic_write(folder / TABLE_NPZ, lambda f: np.savez(f, hists=hists))
        meta = self.to_dict()
        meta["order"] = names
        meta["hist_digest"] = _digest(hists)
        text = json.dumps(json_finite(meta), indent=1)
        atomic_write(folder / TABLE_JSON, text.encode())


def _derive(s: TensorStats, method: str, bits: int, symmetric: bool,
            p: float) -> tuple[float, float]:
    a, b = _derive_method(s, method, bits, symmetric, p)
    if s.softmax_row_max is None:
        return a, b
    floor = s.softmax_row_max - SOFTMAX_SPAN
    if symmetric:
        t = min(b, max(abs(max(s.min, floor)), abs(s.max)))
        return (-t, t)
    return (min(max(a, floor), b), b)


def _derive_method(s: TensorStats, method: str, bits: int, symmetric: bool,
                   p: float) -> tuple[float, float]:
    amax = max(abs(s.min), abs(s.max))
    if s.count == 0 or not s.hist_hi > s.hist_lo or s.max <= s.min:
        return (-amax, amax) if symmetric else (s.min, s.max)
    if method == "minmax":
        return (-amax, amax) if symmetric else (s.min, s.max)
    hist, lo, hi = s.hist, s.hist_lo, s.hist_hi
    if method == "mse":
        a, b = kernels.mse_threshold(hist, lo, hi, bits, symmetric=symmetric,
                                     data_range=(s.min, s.max))
        return (a, b)
    if method == "percentile":
        a, b = kernels.percentile_range(hist, lo, hi, p, symmetric=symmetric)
    else:
        t = min(kernels.entropy_threshold(hist, lo, hi, bits), amax)
        a, b = -t, t
    if symmetric:
        t = min(max(-a, b), amax)
        return (-t, t)
    return (max(a, s.min), min(b, s.max))


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


def load_table(directory: str | os.PathLike[str]) -> CalibrationTable:
    """Read a table written by :meth:`CalibrationTable.save`, under the input budget (its JSON
    capped, bounded in depth and finite; its npz decoded against :data:`TABLE_LIMITS`, no link
    followed); CalibrationError naming the file when it is missing or damaged."""
    folder = Path(directory)
    fix = "delete it and recalibrate"
    try:
        meta = load_json(folder / TABLE_JSON, CalibrationError, links=False, fix=fix)
        _regular(folder / TABLE_NPZ, fix)
        hists = read_npz(folder / TABLE_NPZ, TABLE_LIMITS)["hists"]
    except FileNotFoundError as e:
        raise CalibrationError(f"{folder}: no calibration table ({e.filename} is missing); run "
                               "'mpsearch calibrate' first") from e
    except DataError as e:
        raise CalibrationError(f"{e}; {fix}") from e
    except (*CORRUPT, KeyError) as e:
        raise CalibrationError(f"{folder / TABLE_NPZ}: the calibration table is unreadable "
                               f"({type(e).__name__}: {str(e)[:200]}); {fix}") from e
    if (not isinstance(meta, dict) or meta.get("format") != _FORMAT
            or hists.ndim != 2 or hists.dtype != np.int64
            or meta.get("hist_digest") != _digest(hists)):
        raise CalibrationError(f"{folder}: the calibration table is from another version or "
                               f"half-written; {fix}")
    try:
        return _table(meta, hists)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise CalibrationError(f"{folder / TABLE_JSON}: the calibration table is malformed "
                               f"({type(e).__name__}: {str(e)[:200]}); {fix}") from e


def _regular(path: Path, fix: str) -> None:
    """CalibrationError unless ``path`` is a regular file (not a link, a pipe or a device)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise CalibrationError(f"{path}: is a link or not a regular file, which mpsearch does "
                               f"not read inside a run directory; {fix}")


def _table(meta: Mapping[str, Any], hists: np.ndarray) -> CalibrationTable:
    order = meta["order"]
    if not isinstance(order, list) or len(order) != len(hists):
        raise ValueError(f"{len(hists)} histograms for {len(order)} tensors")
    tensors = {}
    for row, name in enumerate(order):
        d = meta["tensors"][name]
        hist = hists[row].copy()
        hist.flags.writeable = False
        tensors[name] = TensorStats(
            name=name, count=int(d["count"]), min=_num(d["min"], math.inf),
            max=_num(d["max"], -math.inf), mean=_num(d["mean"], 0.0), std=_num(d["std"], 0.0),
            hist=hist, hist_lo=float(d["hist_lo"]), hist_hi=float(d["hist_hi"]),
            softmax_row_max=None if d.get("softmax_row_max") is None
            else float(d["softmax_row_max"]))
    return CalibrationTable(
        model_fingerprint=meta["model_fingerprint"], data_fingerprint=meta["data_fingerprint"],
        method=meta["method"], samples=int(meta["samples"]), bins=int(meta["bins"]),
        percentile=float(meta["percentile"]), tensors=MappingProxyType(tensors))


def _num(value: Any, default: float) -> float:
    return default if value is None else float(value)


# ------------------------------------------------------------------ streaming collection
def _pow2_ceil(value: float) -> float:
    mantissa, exponent = math.frexp(value)
    return value if mantissa == 0.5 else math.ldexp(1.0, exponent)


class _Collector:
    """Streaming state of one tensor. Its histogram spans [0, A] while every value seen is
    >= 0, else [-A, A], with A the smallest power of two >= max |x| so far: A only ever
    doubles, old bins merge exactly into new ones, and the final histogram does not depend on
    the batch size or order."""

    __slots__ = ("axis", "bins", "count", "hist", "lo", "hi", "max", "min", "pending",
                 "row_max", "sum", "sumsq")

    def __init__(self, bins: int, softmax_axis: int | None = None) -> None:
        self.bins = bins
        self.axis = softmax_axis  # set for a tensor read only by Softmax (along this axis)
        self.row_max = math.inf
        self.count = 0
        self.sum = self.sumsq = 0.0
        self.min, self.max = math.inf, -math.inf
        self.lo = self.hi = 0.0
        self.hist: np.ndarray | None = None
        self.pending = 0  # zeros seen before the first non-zero value fixed a range

    def add(self, x: np.ndarray) -> bool:
        """Add one batch; False when it holds NaN or Inf (nothing is added then)."""
        ready = self.hist is not None
        lo, hi = (self.lo, self.hi) if ready else (0.0, 1.0)
        mn, mx, s, ss, hist = kernels.tensor_stats(x, lo, hi, self.bins)
        if not math.isfinite(ss):
            return False
        self.count += x.size
        self.sum += s
        self.sumsq += ss
        self.min, self.max = min(self.min, mn), max(self.max, mx)
        if self.axis is not None and x.size:
            self.row_max = min(self.row_max, float(x.max(axis=self.axis).min()))
        if ready and lo <= mn and mx <= hi:
            assert self.hist is not None
            self.hist += hist
            return True
        if not self._widen(x.size):
            return True
        assert self.hist is not None
        self.hist += kernels.tensor_stats(x, self.lo, self.hi, self.bins)[4]
        return True

    def _widen(self, size: int) -> bool:
        """Grow the range to cover [min, max]; False while every value seen is 0."""
        need = max(-self.min, self.max)
        signed = self.min < 0
        if need <= 0:
            self.pending += size
            return False
        n = self.bins
        if self.hist is None:
            top = _pow2_ceil(need)
            self.hist = np.zeros(n, np.int64)
            self.lo, self.hi = (-top if signed else 0.0), top
            self.hist[n // 2 if signed else 0] += self.pending
            return True
        width = self.hi
        while width < need:
            width *= 2.0
        factor = int(round(width / self.hi))
        i = np.arange(n)
        if self.lo < 0:  # signed -> signed
            target = n // 2 + (i - n // 2) // factor
        elif signed:  # [0, A] -> [-A', A']: new bins are 2 * factor old ones wide
            target = n // 2 + i // (2 * factor)
        else:
            target = i // factor
        self.hist = np.bincount(target, weights=self.hist, minlength=n).round().astype(np.int64)
        self.lo, self.hi = (-width if signed else 0.0), width
        return True

    def stats(self, name: str) -> TensorStats:
        hist = np.zeros(self.bins, np.int64) if self.hist is None else self.hist
        if self.hist is None:
            hist[0] = self.pending
        hist.flags.writeable = False
        mean = self.sum / self.count if self.count else 0.0
        var = max(0.0, self.sumsq / self.count - mean * mean) if self.count else 0.0
        row_max = self.row_max if self.axis is not None and self.count else None
        return TensorStats(name=name, count=self.count, min=self.min, max=self.max, mean=mean,
                           std=math.sqrt(var), hist=hist, hist_lo=self.lo, hist_hi=self.hi,
                           softmax_row_max=row_max)


def softmax_axes(graph: ModelGraph) -> dict[str, int]:
    """{tensor: axis} for the activations read only by Softmax nodes over one same axis (the
    graph is at opset >= 13, where Softmax normalizes along ``axis``, default -1)."""
    out: dict[str, int] = {}
    outputs = {o.name for o in graph.outputs}
    for tensor in graph.activation_tensors():
        if tensor in outputs:
            continue
        readers = [graph.nodes[n] for n in graph.consumers(tensor)]
        if not readers or any(r.op_type != "Softmax" or r.domain not in ("", "ai.onnx")
                              or r.inputs[0] != tensor for r in readers):
            continue
        axes = {int(r.attributes.get("axis", -1)) for r in readers}
        if len(axes) == 1:
            out[tensor] = axes.pop()
    return out


def _fixed_batch(graph: ModelGraph) -> int | None:
    fixed = [i.shape[0] for i in graph.inputs if i.shape and isinstance(i.shape[0], int)]
    return int(min(fixed)) if fixed else None


#: Bytes of exposed activations one calibration batch may hold when the batch is chosen
#: automatically (the session runs without an arena, so they are freed after each batch).
ACTIVATION_BUDGET = 128 << 20
#: The largest automatic calibration batch.
MAX_AUTO_BATCH = 64


#: Histogram bins per tensor, at most: every activation keeps one int64 histogram (512 kB).
MAX_BINS = 1 << 16
#: Samples per calibration batch, at most.
MAX_BATCH = 1 << 16


def auto_batch(bytes_per_sample: int, budget: int = ACTIVATION_BUDGET) -> int:
    """Samples per calibration batch whose exposed activations fit ``budget`` bytes."""
    return max(1, min(MAX_AUTO_BATCH, budget // max(bytes_per_sample, 1)))


def calibrate(
    graph: ModelGraph, data: Dataset, *, batch_size: int | None = None, bins: int = 2048,
    threads: int = 2, progress: Reporter | None = None, method: str = "minmax",
    percentile: float = 99.999, optimize: bool = True,
    activation_budget: int = ACTIVATION_BUDGET,
) -> CalibrationTable:
    """Run ``data`` through ``graph`` once and collect every activation's statistics.

    ``batch_size`` None (the default) chooses the batch from a memory budget: the first sample
    runs alone, its exposed activations are weighed, and the rest runs in batches whose
    activations fit ``activation_budget`` bytes (at most :data:`MAX_AUTO_BATCH` samples).

    ``method`` and ``percentile`` are the defaults :meth:`CalibrationTable.range` uses; every
    method is available from the table. ``optimize`` runs the graph with ONNX Runtime's
    optimizations, as it runs at inference (and faster than unoptimized); the
    activations, hence min-max ranges, then differ from ONNX Runtime's own calibrators, which
    run the graph unoptimized, in the last bits (~1e-6 relative). ``optimize=False`` matches
    those bit for bit.
    """
    if method not in METHODS:
        raise CalibrationError(f"calibration method '{method}' is unknown; use one of "
                               f"{', '.join(METHODS)}")
    if bins < 2 or bins % 2 or bins > MAX_BINS:
        raise CalibrationError(f"histogram bins {bins} must be an even number from 2 to "
                               f"{MAX_BINS} (e.g. 2048)")
    if batch_size is not None and not 1 <= batch_size <= MAX_BATCH:
        raise CalibrationError(f"calibration batch size {batch_size} must be from 1 to "
                               f"{MAX_BATCH}")
    if not 1 <= threads <= MAX_THREADS:
        raise CalibrationError(f"threads {threads} must be from 1 to {MAX_THREADS}")
    threads = machine_threads(threads)
    if not 0.0 < percentile <= 100.0:
        raise CalibrationError(f"percentile {percentile} is outside (0, 100]; use e.g. 99.99")
    if len(data) == 0:
        raise CalibrationError(f"{data.source}: no samples to calibrate on")
    check_signature(data, graph)
    fixed = _fixed_batch(graph)
    if fixed and batch_size is not None and fixed != batch_size:
        logger.info("the model's batch is fixed to %d; calibrating in batches of %d", fixed,
                    fixed)
    tensors = graph.activation_tensors()
    inputs = {i.name for i in graph.inputs}
    exposed = [t for t in tensors if t not in inputs]
    fit = fitting_batch(graph, None, "calibration", tensors=tuple(exposed))
    session = create_session(graph.model, threads=threads, extra_outputs=exposed,
                             optimize=optimize, label=graph.name, arena=False)
    kernels.set_threads(threads)
    axes = softmax_axes(graph)
    collectors = {t: _Collector(bins, axes.get(t)) for t in tensors}
    start = time.perf_counter()

    def collect(feeds: Mapping[str, np.ndarray], index: int, first: int) -> int:
        n = len(next(iter(feeds.values())))
        check_finite(feeds, source=data.source, batch=index, batch_size=n, first=first)
        outputs = session.run(feeds, exposed) if exposed else {}
        for name, collector in collectors.items():
            value = feeds[name] if name in inputs else outputs[name]
            if not collector.add(value):
                raise CalibrationError(
                    f"{graph.name}: tensor '{name}' holds NaN or Inf in batch {index} "
                    f"(samples {first}-{first + n - 1}) although the inputs are finite; the "
                    "model overflows on this data, check it in float32")
        if progress is not None:
            progress(Progress(stage="calibrate", done=first + n, total=len(data),
                              unit="sample"))
        return sum(int(v.nbytes) for v in outputs.values()) + sum(
            int(v.nbytes) for v in feeds.values())

    seen = 0
    if fixed:
        size = fixed
    elif batch_size is not None:
        size = min(max(1, int(batch_size)), fit)
    else:  # weigh one sample's activations, then fill the budget
        per_sample = collect(next(data.batches(1)), 0, 0)
        seen = 1
        size = min(auto_batch(per_sample, activation_budget), fit)
        logger.info("calibration batch %d: %.1f MB of activations per sample, budget %.0f MB",
                    size, per_sample / 1e6, activation_budget / 1e6)
    for index, feeds in enumerate(data.batches(size, start=seen), start=1 if seen else 0):
        n = len(next(iter(feeds.values())))
        if fixed and n < fixed:
            logger.warning("skipping the last %d sample(s): the model's batch is fixed to %d",
                           n, fixed)
            break
        collect(feeds, index, seen)
        seen += n
    logger.info("calibrated %d tensors on %d samples in %.2f s", len(tensors), len(data),
                time.perf_counter() - start)
    return CalibrationTable(
        model_fingerprint=graph.fingerprint, data_fingerprint=data.fingerprint, method=method,
        samples=len(data), bins=bins, percentile=percentile,
        tensors=MappingProxyType({t: c.stats(t) for t, c in collectors.items()}))


def calibrate_cached(graph: ModelGraph, data: Dataset, directory: str | os.PathLike[str],
                     **options: Any) -> CalibrationTable:
    """The table saved in ``directory`` when its model, data and bins match, else a fresh
    :func:`calibrate` (saved there). ``options`` go to :func:`calibrate`."""
    folder = Path(directory)
    if (folder / TABLE_JSON).exists():
        try:
            table = load_table(folder)
        except CalibrationError as e:
            logger.warning("%s; recalibrating", e)
        else:
            if (table.model_fingerprint == graph.fingerprint
                    and table.data_fingerprint == data.fingerprint
                    and table.bins == options.get("bins", table.bins)):
                logger.info("loaded the calibration table from %s", folder)
                return replace(table, method=options.get("method", table.method),
                               percentile=options.get("percentile", table.percentile))
            logger.info("%s holds a table for another model or data; recalibrating", folder)
    table = calibrate(graph, data, **options)
    table.save(folder)
    return table


# ------------------------------------------------------------------ weights
def _weight_axis(op_type: str, attributes: Mapping[str, Any], ndim: int) -> int | None:
    if ndim < 2:
        return None
    if op_type == "ConvTranspose":
        return 1
    if op_type == "Gemm":
        return 0 if attributes.get("transB", 0) else 1
    if op_type == "MatMul":
        return ndim - 1
    if op_type in ("Gather", "GatherElements"):
        return int(attributes.get("axis", 0)) % ndim
    return 0


def weight_stats(graph: ModelGraph) -> Mapping[str, WeightStats]:
    """Min/max of every quantizable weight, per tensor and per output channel."""
    out: dict[str, WeightStats] = {}
    for node in graph.nodes.values():
        for name in node.weights:
            if name in out:
                continue
            w = np.asarray(graph.initializers[name], dtype=np.float32)
            axis = _weight_axis(node.op_type, node.attributes, w.ndim)
            if axis is None or w.size == 0:
                cmin = np.array([w.min(initial=0)], np.float32)
                cmax = np.array([w.max(initial=0)], np.float32)
            else:
                moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
                cmin, cmax = moved.min(axis=1), moved.max(axis=1)
            out[name] = WeightStats(name=name, shape=tuple(int(d) for d in w.shape), axis=axis,
                                    min=float(cmin.min()), max=float(cmax.max()),
                                    channel_min=cmin, channel_max=cmax)
    return MappingProxyType(out)
