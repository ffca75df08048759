"""Weight and activation distributions per node: histograms, statistics and actionable flags.

Consumes a graph, a hardware profile and its calibration table (with the range method);
produces one :class:`NodeDistribution` per quantizable node: the FP32 histogram of each weight
next to its dequantized histogram in every analyzed format (per-channel ranges included), the
histograms of the node's activations from the calibration table with the clipping range each
format uses, statistics (:data:`STAT_FIELDS`) and flags a person can act on (:class:`FlagRules`).

Activation statistics come from the calibration histogram (values taken as uniform inside each
bin); weight statistics from the weights themselves. SQNR figures are in dB, 8-bit grids.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from mpsearch import kernels
from mpsearch.assignment import weight_channels
from mpsearch.calibration import CalibrationTable
from mpsearch.graph import ModelGraph, Node
from mpsearch.profiles import HardwareProfile, TensorFormat
from mpsearch.quantize import qparams

__all__ = ["BINS", "FlagRules", "NodeDistribution", "STAT_COLUMNS", "STAT_FIELDS",
           "TensorDistribution", "analyze_distributions", "tensor_flags"]

BINS = 64
#: Bins of the fine weight histogram the outlier and span statistics are read from.
FINE_BINS = 2048
#: Statistics of every tensor (None where they do not apply).
STAT_FIELDS = ("count", "min", "max", "mean", "std", "skew", "kurtosis", "outlier_ratio",
               "clipped", "channel_range_ratio", "levels_used", "sqnr_symmetric",
               "sqnr_asymmetric")
#: Columns of ``distributions.csv`` (one row per node and tensor).
STAT_COLUMNS = ("node", "op_type", "role", "tensor", *STAT_FIELDS, "codes")


@dataclass(frozen=True, slots=True, kw_only=True)
class FlagRules:
    """When a tensor is flagged (each flag names the tensor, the figure and what to do).

    ``heavy_tails``: excess kurtosis above ``kurtosis``. ``outliers``: the full range is more
    than ``outlier_span`` times the span of the central 99.9 % of the values. ``narrow``: the
    central 99 % of the values span fewer than ``narrow_levels`` of the 256 INT8 levels.
    ``skewed``: |skew| above ``skew``, or one-sided values on a symmetric grid.
    ``channel_ranges``: largest / median per-channel weight range above ``channel_ratio``.
    ``clipping``: more than ``clipped`` of the values fall outside the chosen range.
    """

    kurtosis: float = 10.0
    outlier_span: float = 4.0
    narrow_levels: float = 16.0
    skew: float = 2.0
    channel_ratio: float = 10.0
    clipped: float = 0.001

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorDistribution:
    """One tensor's histogram (``edges``, ``fp32`` counts) and its quantized twin.

    ``quantized`` / ``clip`` are for ``format`` (the lowest analyzed one); ``formats`` holds
    ``{quantized, clip, sqnr, clipped}`` for every analyzed format. ``channels`` (weights):
    ``{axis, min, max}`` per output channel.
    """

    tensor: str
    role: str
    format: str | None
    edges: tuple[float, ...]
    fp32: tuple[float, ...]
    quantized: tuple[float, ...] | None
    clip: tuple[float, float] | None
    stats: Mapping[str, float | None]
    formats: Mapping[str, Mapping[str, Any]]
    channels: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "role": self.role, "format": self.format,
                "edges": list(self.edges), "fp32": list(self.fp32),
                "quantized": None if self.quantized is None else list(self.quantized),
                "clip": None if self.clip is None else list(self.clip),
                "stats": dict(self.stats), "formats": {k: dict(v) for k, v in
                                                       self.formats.items()},
                "channels": None if self.channels is None else dict(self.channels)}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeDistribution:
    """Distributions of one node: ``weight`` (first weight), ``activation`` (first output),
    ``inputs`` (activation inputs) and the ``flags`` (sentences) with their short ``codes``."""

    node: str
    op_type: str
    index: int
    weight: TensorDistribution | None
    activation: TensorDistribution | None
    inputs: tuple[TensorDistribution, ...]
    flags: tuple[str, ...]
    codes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "op_type": self.op_type, "index": self.index,
                "weight": None if self.weight is None else self.weight.to_dict(),
                "activation": None if self.activation is None else self.activation.to_dict(),
                "inputs": [t.to_dict() for t in self.inputs], "flags": list(self.flags),
                "codes": list(self.codes)}

    def rows(self) -> list[dict[str, Any]]:
        """One CSV row per tensor (:data:`STAT_COLUMNS`)."""
        tensors = [t for t in (self.weight, self.activation, *self.inputs) if t is not None]
        return [{"node": self.node, "op_type": self.op_type, "role": t.role,
                 "tensor": t.tensor, **t.stats, "codes": list(self.codes)} for t in tensors]


_SMALL = 1 << 16  # below this many elements the NumPy twins beat the parallel kernels


def _error_mse(ref: np.ndarray, test: np.ndarray) -> float:
    fn = kernels.error_stats_numpy if ref.size < _SMALL else kernels.error_stats
    return float(fn(ref, test)[0])


def _tensor_stats(x: np.ndarray, lo: float, hi: float, bins: int
                  ) -> tuple[float, float, float, float, np.ndarray]:
    fn = kernels.tensor_stats_numpy if x.size < _SMALL else kernels.tensor_stats
    return fn(x, lo, hi, bins)


def _central_moments(x: np.ndarray, mean: float) -> tuple[float, float, float]:
    fn = kernels.central_moments_numpy if x.size < _SMALL else kernels.central_moments
    return fn(x, mean)


def _fake_quantize(x: np.ndarray, scale: float, zero: float, qmin: int, qmax: int) -> np.ndarray:
    fn = kernels.fake_quantize_numpy if x.size < _SMALL else kernels.fake_quantize
    return fn(x, scale, zero, qmin, qmax)


def _compact(values: Any) -> list[float]:
    """Floats at 7 significant digits (keeps distributions.json small)."""
    return [float(f"{v:.7g}") for v in np.asarray(values, dtype=np.float64).ravel()]


# -- statistics ----------------------------------------------------------------------------
def _moments(values: np.ndarray, weights: np.ndarray) -> dict[str, float | None]:
    """Count, mean, standard deviation, skew and excess kurtosis of 1-D float64 ``values``,
    each counted ``weights`` times (a histogram's bin centers and counts)."""
    total = float(weights.sum())
    if total <= 0:
        return _from_sums(0.0, 0.0, 0.0, 0.0, 0.0)
    mean = float(np.dot(weights, values) / total)
    d = values - mean
    weighted = weights * d * d
    return _from_sums(total, mean, float(weighted.sum()), float(np.dot(weighted, d)),
                      float(np.dot(weighted, d * d)))


def _from_sums(count: float, mean: float, s2: float, s3: float, s4: float
               ) -> dict[str, float | None]:
    """The moments of ``count`` values from their mean and the sums of the 2nd to 4th powers
    of their deviations from it."""
    if count <= 0:
        return {"count": 0.0, "mean": None, "std": None, "skew": None, "kurtosis": None}
    var = s2 / count
    if var <= 0:
        return {"count": count, "mean": mean, "std": 0.0, "skew": 0.0, "kurtosis": 0.0}
    return {"count": count, "mean": mean, "std": math.sqrt(var),
            "skew": s3 / count / var**1.5, "kurtosis": s4 / count / var**2 - 3.0}


def _hist_stats(hist: np.ndarray, lo: float, hi: float) -> dict[str, float | None]:
    """Moments, outlier ratio and quantile spans of histogram values (uniform in each bin)."""
    edges = np.linspace(lo, hi, hist.size + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    out = _moments(centers, hist.astype(np.float64))
    if not out["count"]:
        return out
    q1, q3 = kernels.percentile_range(hist, lo, hi, 50.0)
    fence = 3.0 * (q3 - q1)
    cdf = np.concatenate(([0.0], np.cumsum(hist, dtype=np.float64)))
    inside = np.interp(q3 + fence, edges, cdf) - np.interp(q1 - fence, edges, cdf)
    out["outlier_ratio"] = float(max(0.0, 1.0 - inside / cdf[-1])) if fence > 0 else 0.0
    a, b = kernels.percentile_range(hist, lo, hi, 99.9)
    out["span999"] = b - a
    a, b = kernels.percentile_range(hist, lo, hi, 99.0)
    out["span99"] = b - a
    return out


def _sqnr(power: float, mse: float) -> float:
    if mse <= 0:
        return math.inf
    return 10.0 * math.log10(power / mse) if power > 0 else -math.inf


def tensor_flags(tensor: str, stats: Mapping[str, Any], rules: FlagRules,
                 symmetric: bool) -> list[tuple[str, str]]:
    """(code, sentence) flags of one tensor from its statistics (see :class:`FlagRules`)."""
    flags = []
    kurt, lo, hi = stats.get("kurtosis"), stats.get("min"), stats.get("max")
    if kurt is not None and kurt > rules.kurtosis:
        flags.append(("heavy_tails", f"{tensor}: heavy tails (excess kurtosis {kurt:.1f}); "
                                     "try INT16 or a percentile/MSE range"))
    span, full = stats.get("span999"), (hi - lo) if lo is not None and hi is not None else None
    if span and full and full > rules.outlier_span * span:
        flags.append(("outliers", f"{tensor}: range set by rare outliers ({full / span:.0f}x the "
                                  "central 99.9 %); clip them (percentile/MSE) or use INT16"))
    levels = stats.get("levels_used")
    if levels is not None and levels < rules.narrow_levels:
        flags.append(("narrow", f"{tensor}: 99 % of values use only {levels:.0f} of 256 INT8 "
                                "levels; INT16 or a tighter range keeps them"))
    skew = stats.get("skew")
    one_sided = lo is not None and hi is not None and (lo >= 0 or hi <= 0) and hi > lo
    if symmetric and one_sided:
        flags.append(("skewed", f"{tensor}: one-sided values on a symmetric grid waste half the "
                                "levels; prefer an asymmetric format"))
    elif skew is not None and abs(skew) > rules.skew:
        flags.append(("skewed", f"{tensor}: skewed (skew {skew:.1f}); asymmetric ranges fit "
                                "better"))
    ratio = stats.get("channel_range_ratio")
    if ratio is not None and ratio > rules.channel_ratio:
        flags.append(("channel_ranges", f"{tensor}: channel ranges differ {ratio:.0f}x; keep "
                                        "per-channel weights, or INT16 if per-tensor"))
    clipped = stats.get("clipped")
    if clipped is not None and clipped > rules.clipped:
        flags.append(("clipping", f"{tensor}: {100 * clipped:.2f} % of values clipped by the "
                                  "chosen range; widen it (minmax) or use INT16"))
    return flags


# -- weights -------------------------------------------------------------------------------
def _fake_weight(array: np.ndarray, fmt: TensorFormat, channels: int, axis: int | None,
                 symmetric: bool) -> np.ndarray:
    """The dequantized weight as the QDQ builder stores it (min/max per tensor or channel)."""
    if axis is None:
        lo, hi = np.array([array.min()]), np.array([array.max()])
    else:
        moved = np.moveaxis(array, axis, 0).reshape(channels, -1)
        lo, hi = moved.min(axis=1), moved.max(axis=1)
    scale, zero = qparams(lo, hi, fmt.dtype, symmetric=symmetric, scale_form=fmt.scale,
                          narrow_range=fmt.narrow_range)
    qmin, qmax = fmt.qmin, fmt.qmax
    if axis is None:
        return _fake_quantize(array, float(scale[0]), float(zero[0]), qmin, qmax)
    fn = (kernels.fake_quantize_per_channel_numpy if array.size < _SMALL
          else kernels.fake_quantize_per_channel)
    return fn(array, scale, zero.astype(np.float32), axis, qmin, qmax)


def _weight_distribution(graph: ModelGraph, profile: HardwareProfile, node: Node, weight: str,
                         formats: Sequence[str], bins: int) -> TensorDistribution:
    """The weight's histograms and statistics, each a kernel's pass over the weight (no
    float64 copy: a language model's embedding has tens of millions of weights)."""
    array = np.ascontiguousarray(graph.initializers[weight], dtype=np.float32)
    lo, hi = float(array.min()), float(array.max())
    top = hi if hi > lo else lo + 1.0
    _, _, total, squares, fine = _tensor_stats(array, lo, top, FINE_BINS)
    mean = total / array.size
    stats: dict[str, float | None] = {"min": lo, "max": hi, **_from_sums(
        float(array.size), mean, *_central_moments(array, mean))}
    stats.update({k: v for k, v in _hist_stats(fine.astype(np.float64), lo, top).items()
                  if k in ("outlier_ratio", "span999", "span99")})
    power = squares / array.size
    per_format: dict[str, dict[str, Any]] = {}
    done: dict[TensorFormat, dict[str, Any]] = {}
    channels_info = None
    for name in formats:
        fmt = profile.weight_format(node.op_type, name)
        if fmt.is_float:
            continue
        channels, axis = weight_channels(graph, profile, node, weight, fmt)
        if fmt not in done:
            fake = np.clip(_fake_weight(array, fmt, channels, axis, fmt.symmetric), lo, top)
            done[fmt] = {"quantized": _compact(_tensor_stats(fake, lo, top, bins)[4]),
                         "clip": [lo, hi], "sqnr": _sqnr(power, _error_mse(array, fake)),
                         "clipped": 0.0, "granularity": fmt.granularity, "dtype": fmt.dtype}
        per_format[name] = done[fmt]
        if channels_info is None:
            channels_info = _channel_ranges(array, graph, profile, node, weight, fmt)
            sym = _fake_weight(array, _as_int8(fmt), channels, axis, True)
            asym = _fake_weight(array, _as_int8(fmt), channels, axis, False)
            stats["sqnr_symmetric"] = _sqnr(power, _error_mse(array, sym))
            stats["sqnr_asymmetric"] = _sqnr(power, _error_mse(array, asym))
    stats["clipped"] = 0.0  # weights take their min/max range: nothing is clipped
    stats["channel_range_ratio"] = None if channels_info is None else channels_info["ratio"]
    stats["levels_used"] = _levels(stats, lo, hi)
    first = next(iter(per_format), None)
    shown = None if first is None else per_format[first]
    return TensorDistribution(
        tensor=weight, role="weight", format=first,
        edges=tuple(_compact(np.linspace(lo, top, bins + 1))),
        fp32=tuple(_compact(_tensor_stats(array, lo, top, bins)[4])),
        quantized=None if shown is None else tuple(shown["quantized"]),
        clip=None if shown is None else (lo, hi), stats=stats, formats=per_format,
        channels=channels_info)


def _as_int8(fmt: TensorFormat) -> TensorFormat:
    return replace(fmt, dtype="int8", narrow_range=False)


def _channel_ranges(array: np.ndarray, graph: ModelGraph, profile: HardwareProfile, node: Node,
                    weight: str, fmt: TensorFormat) -> dict[str, Any] | None:
    if array.ndim < 2:
        return None
    axis = fmt.axis if fmt.axis is not None else profile.weight_axis(
        node.op_type, node.attributes, weight_rank=array.ndim)
    axis %= array.ndim
    moved = np.moveaxis(array, axis, 0).reshape(array.shape[axis], -1)
    lo, hi = moved.min(axis=1), moved.max(axis=1)
    spans = hi - lo
    median = float(np.median(spans))
    ratio = float(spans.max() / median) if median > 0 else (math.inf if spans.max() > 0
                                                             else 1.0)
    return {"axis": axis, "min": _compact(lo), "max": _compact(hi), "ratio": ratio}


def _levels(stats: Mapping[str, Any], lo: float, hi: float) -> float | None:
    span = stats.get("span99")
    full = max(hi, 0.0) - min(lo, 0.0)
    return None if span is None or full <= 0 else float(255.0 * span / full)


# -- activations ---------------------------------------------------------------------------
def _activation_hist(table: CalibrationTable, tensor: str
                     ) -> tuple[np.ndarray, float, float, float, float] | None:
    """(histogram, its lo, its hi, data min, data max) of ``tensor`` from the table."""
    stats = table.tensors.get(tensor)
    if stats is None:
        return None
    hist = np.asarray(stats.hist, dtype=np.float64)
    lo, hi = float(stats.lo), float(stats.hi)
    if hist.sum() <= 0 or not hi > lo:
        return None
    return hist, lo, hi, float(stats.min), float(stats.max)


def _activation_distribution(prepared: _Inputs, node: Node, tensor: str, role: str,
                             formats: Sequence[str], bins: int) -> TensorDistribution | None:
    found = _activation_hist(prepared.table, tensor)
    if found is None:
        return None
    hist, lo, hi, dmin, dmax = found
    stats: dict[str, float | None] = {"min": dmin, "max": dmax, **_hist_stats(hist, lo, hi)}
    top = dmax if dmax > dmin else dmin + 1.0
    edges = np.linspace(dmin, top, bins + 1)
    counts = kernels.histogram_rebin(hist, lo, hi, dmin, top, bins)
    width = (hi - lo) / hist.size
    centers = (lo + (np.arange(hist.size) + 0.5) * width).astype(np.float32)
    cdf = np.concatenate(([0.0], np.cumsum(hist)))
    fine_edges = lo + np.arange(hist.size + 1) * width
    power = (stats["std"] or 0.0) ** 2 + (stats["mean"] or 0.0) ** 2
    per_format: dict[str, dict[str, Any]] = {}
    for name in formats:
        act = prepared.profile.format(name).activation
        if act.is_float:
            continue
        fixed = prepared.profile.fixed_qparams(node.op_type, name) if role == "output" else None
        a, b = prepared.table.range(tensor, bits=act.bits, symmetric=act.symmetric,
                                    method=prepared.method)
        if fixed is not None:
            scale, zero = float(fixed[0]), float(fixed[1])
        else:
            s, z = qparams(a, b, act.dtype, symmetric=act.symmetric, scale_form=act.scale)
            scale, zero = float(s), float(z)
        grid = ((act.qmin - zero) * scale, (act.qmax - zero) * scale)
        fake = _fake_quantize(centers, scale, zero, act.qmin, act.qmax)
        quantized = np.histogram(np.clip(fake, dmin, top), bins=bins, range=(dmin, top),
                                 weights=hist)[0]
        # values within half a step of the grid round onto its ends: only beyond is clipped
        inside = (np.interp(grid[1] + scale / 2, fine_edges, cdf)
                  - np.interp(grid[0] - scale / 2, fine_edges, cdf))
        mse = kernels.range_mse(hist, lo, hi, grid[0], grid[1], min(act.bits, 16))
        per_format[name] = {"quantized": _compact(quantized), "clip": list(grid),
                            "sqnr": _sqnr(power, mse),
                            "clipped": float(max(0.0, 1.0 - inside / cdf[-1]))}
    first = next(iter(per_format), None)
    stats["clipped"] = None if first is None else per_format[first]["clipped"]
    stats["channel_range_ratio"] = None
    sym = prepared.table.range(tensor, bits=8, symmetric=True, method=prepared.method)
    asym = prepared.table.range(tensor, bits=8, symmetric=False, method=prepared.method)
    stats["sqnr_symmetric"] = _sqnr(power, kernels.range_mse(hist, lo, hi, *sym, 8))
    stats["sqnr_asymmetric"] = _sqnr(power, kernels.range_mse(hist, lo, hi, *asym, 8))
    symmetric = first is not None and prepared.profile.format(first).activation.symmetric
    stats["levels_used"] = _levels(stats, *(sym if symmetric else asym))
    shown = None if first is None else per_format[first]
    return TensorDistribution(
        tensor=tensor, role=role, format=first, edges=tuple(_compact(edges)),
        fp32=tuple(_compact(counts)),
        quantized=None if shown is None else tuple(shown["quantized"]),
        clip=None if shown is None else (shown["clip"][0], shown["clip"][1]), stats=stats,
        formats=per_format)


def _public(stats: Mapping[str, Any]) -> dict[str, float | None]:
    return {k: stats.get(k) for k in STAT_FIELDS}


def _node_distribution(prepared: _Inputs, node: Node, index: int, formats: Sequence[str],
                       rules: FlagRules, bins: int) -> NodeDistribution:
    graph, profile = prepared.graph, prepared.profile
    weight = None
    if node.weights:
        weight = _weight_distribution(graph, profile, node, node.weights[0], formats, bins)
    outputs = [t for t in node.outputs if t and graph.is_float(t)]
    activation = (_activation_distribution(prepared, node, outputs[0], "output", formats, bins)
                  if outputs else None)
    inputs = tuple(d for t in dict.fromkeys(node.activation_inputs)
                   if t not in graph.initializers
                   and (d := _activation_distribution(prepared, node, t, "input", formats,
                                                      bins)) is not None)
    flags: list[tuple[str, str]] = []
    lowest = profile.format(formats[0]) if formats else None
    for dist in (weight, activation, *inputs):
        if dist is None:
            continue
        symmetric = lowest is not None and (lowest.weight.symmetric if dist.role == "weight"
                                            else lowest.activation.symmetric)
        flags += [f for f in tensor_flags(dist.tensor, dist.stats, rules, symmetric)
                  if f not in flags]
    return NodeDistribution(
        node=node.name, op_type=node.op_type, index=index,
        weight=None if weight is None else _strip(weight),
        activation=None if activation is None else _strip(activation),
        inputs=tuple(_strip(d) for d in inputs), flags=tuple(f[1] for f in flags),
        codes=tuple(dict.fromkeys(f[0] for f in flags)))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Inputs:
    """What every helper below reads: the graph, the profile, the table and its range method."""

    graph: ModelGraph
    profile: HardwareProfile
    table: CalibrationTable
    method: str | None


def _strip(dist: TensorDistribution) -> TensorDistribution:
    return replace(dist, stats=_public(dist.stats))


def analyze_distributions(
    graph: ModelGraph, profile: HardwareProfile, table: CalibrationTable, *,
    formats: Sequence[str], method: str | None = None, rules: FlagRules | None = None,
    bins: int = BINS,
) -> tuple[NodeDistribution, ...]:
    """Distributions of every node that takes one of ``formats``, in topological order;
    activation ranges by ``method`` (the table's default when None)."""
    rules = rules or FlagRules()
    prepared = _Inputs(graph=graph, profile=profile, table=table, method=method)
    out = []
    for index, node in enumerate(prepared.graph.nodes.values()):
        allowed = [f for f in formats if node.quantizable
                   and f in prepared.profile.formats_for_node(node)]
        if allowed:
            out.append(_node_distribution(prepared, node, index, allowed, rules, bins))
    return tuple(out)
