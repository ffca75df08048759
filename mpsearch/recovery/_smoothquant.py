"""SmoothQuant-style activation-to-weight scale migration (Xiao et al., "SmoothQuant", ICML
2023), folded into the LayerNorm: a pure graph transformation ``ModelGraph -> ModelGraph``.

Contract
--------
Consumes a normalized :class:`~mpsearch.graph.ModelGraph` and the per-channel absolute maxima
of the LayerNorm outputs over the calibration data (:func:`channel_maxima`, one FP32 pass);
produces a new graph whose FP32 outputs equal the input's up to float rounding. A LayerNorm is
a ``LayerNormalization`` node normalizing the last axis, or the decomposed form exporters write
(``Sub(x, ReduceMean(x, last axis)) / ... -> Mul(gamma) [-> Add(beta)]``, as in Paddle's SVTR).
For each LayerNorm whose output ``X`` is read only by MatMul/Gemm nodes with a constant 2-D
weight ``W`` (``[in, out]``; Gemm with ``transB``: ``[out, in]``) on their data input (and by
``Shape``, which reads no value), input channel ``j`` gets

    s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)

with ``max|W_j|`` the largest weight of row ``j`` over every reader (the Q, K and V
projections of one LayerNorm share one ``s``). Then ``gamma_j /= s_j``, ``beta_j /= s_j`` and
every reader's ``W_j *= s_j``: the activation's outlier channels shrink, the weights absorb
them, and no node is added. A channel whose activation or weight maximum is 0 keeps ``s = 1``.
:func:`smoothing_groups` reports the LayerNorms it smooths and, as data, each one it leaves
alone with the reason (another reader, a shared or non-constant weight, a graph output).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from mpsearch.data import Dataset
from mpsearch.errors import ModelError
from mpsearch.graph import ModelGraph, Node, load_model
from mpsearch.recovery._activations import reduce_activations
from mpsearch.recovery._rewrite import with_weights

__all__ = ["ChannelMaxima", "SmoothGroup", "SmoothSkipped", "channel_maxima", "smooth",
           "smoothing_groups"]

logger = logging.getLogger(__name__)

_STANDARD = ("", "ai.onnx")
#: Readers whose result does not depend on the tensor's values.
_SHAPE_READERS = frozenset({"Shape"})


@dataclass(frozen=True, slots=True, kw_only=True)
class SmoothGroup:
    """A LayerNorm and the MatMul/Gemm readers smoothed together."""

    norm: str  # the LayerNormalization node, or the decomposed form's last node
    output: str  # the tensor the readers read
    gamma: str
    beta: str | None
    readers: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SmoothSkipped:
    """A LayerNorm that is not smoothed, and why."""

    norm: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelMaxima:
    """Per LayerNorm output tensor, max |x| of each channel (last axis) over the data."""

    model_fingerprint: str
    samples: int
    maxima: Mapping[str, np.ndarray]


def _init(graph: ModelGraph, tensor: str) -> np.ndarray | None:
    array = graph.initializers.get(tensor)
    return array if array is not None and array.dtype == np.float32 else None


def _per_channel(graph: ModelGraph, tensor: str, channels: int | None) -> bool:
    """``tensor`` is a float constant broadcasting along the last axis only ([C], [1, .., C])."""
    array = _init(graph, tensor)
    return (array is not None and array.ndim >= 1 and array.size == array.shape[-1]
            and (channels is None or array.shape[-1] == channels) and array.shape[-1] > 1)


def _producer(graph: ModelGraph, tensor: str, op: str) -> Node | None:
    name = graph.producer(tensor)
    node = None if name is None else graph.nodes[name]
    return node if node is not None and node.op_type == op and node.domain in _STANDARD else None


def _split_constant(graph: ModelGraph, node: Node) -> tuple[str, str] | None:
    """(data input, per-channel constant) of a binary Mul/Add, or None."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if _per_channel(graph, b, None) and a not in graph.initializers:
        return a, b
    if _per_channel(graph, a, None) and b not in graph.initializers:
        return b, a
    return None


def _is_normalized(graph: ModelGraph, tensor: str) -> bool:
    """``tensor`` = Div(Sub(x, ReduceMean(x over the last axis)), ...): a decomposed LayerNorm
    before its affine part."""
    div = _producer(graph, tensor, "Div")
    sub = None if div is None else _producer(graph, div.inputs[0], "Sub")
    mean = None if sub is None else _producer(graph, sub.inputs[1], "ReduceMean")
    if sub is None or mean is None or mean.inputs[0] != sub.inputs[0]:
        return False
    axes = mean.attributes.get("axes")
    if axes is None and len(mean.inputs) > 1:
        constant = graph.initializers.get(mean.inputs[1])
        axes = None if constant is None else constant.reshape(-1).tolist()
    return axes is not None and len(axes) == 1 and _is_last(graph, mean.inputs[0], axes[0])


def _is_last(graph: ModelGraph, tensor: str, axis: int) -> bool:
    """``axis`` is the last axis of ``tensor`` (-1, or rank - 1 when the rank is known)."""
    shape = graph.shapes.get(tensor)
    return int(axis) == -1 or (shape is not None and int(axis) == len(shape) - 1)


_Norm = tuple[Node, str, "str | None", "str | None"]


def _norms(graph: ModelGraph) -> list[_Norm]:
    """Every LayerNorm as (node producing its output, gamma, beta or None, why it cannot be
    smoothed or None)."""
    found: list[_Norm] = []
    for node in graph.nodes.values():
        if node.domain not in _STANDARD:
            continue
        if node.op_type == "LayerNormalization" and len(node.inputs) >= 2:
            axis = int(node.attributes.get("axis", -1))
            reason = (None if _is_last(graph, node.inputs[0], axis) else
                      f"it normalizes from axis {axis}, not the last axis alone")
            beta = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
            found.append((node, node.inputs[1], beta, reason))
        elif node.op_type == "Mul":
            split = _split_constant(graph, node)
            if split is None or not _is_normalized(graph, split[0]):
                continue
            readers = graph.consumers(node.outputs[0])
            alone = len(readers) == 1 and all(o.name != node.outputs[0] for o in graph.outputs)
            add = graph.nodes[readers[0]] if alone else None
            tail = None if add is None or add.op_type != "Add" else _split_constant(graph, add)
            if add is not None and tail is not None and tail[0] == node.outputs[0]:
                found.append((add, split[1], tail[1], None))
            else:
                found.append((node, split[1], None, None))
    return found


def _weight_of(graph: ModelGraph, reader: Node, tensor: str) -> tuple[str, bool] | str:
    """(weight, transposed) of a MatMul/Gemm reading ``tensor`` as data, or why not."""
    what = f"{reader.op_type} '{reader.name}'"
    if reader.op_type not in ("MatMul", "Gemm") or reader.domain not in _STANDARD:
        return f"its output is read by {what}, not only by MatMul/Gemm"
    if reader.inputs[0] != tensor or tensor in reader.inputs[1:]:
        return f"{what} reads its output as a weight, not as its data input"
    if reader.op_type == "Gemm" and reader.attributes.get("transA", 0):
        return f"{what} transposes its input (transA)"
    weight = reader.inputs[1]
    array = _init(graph, weight)
    if array is None or array.ndim != 2:
        return f"the weight of {what} is not a constant 2-D float initializer"
    if len(graph.consumers(weight)) != 1:
        return f"the weight '{weight}' of {what} is read by other nodes too"
    return weight, bool(reader.op_type == "Gemm" and reader.attributes.get("transB", 0))


def _check(graph: ModelGraph, node: Node, gamma: str, beta: str | None
           ) -> tuple[tuple[str, ...], str | None]:
    """(MatMul/Gemm readers, None) when the LayerNorm can be smoothed, else ((), reason)."""
    output = node.outputs[0]
    if any(o.name == output for o in graph.outputs):
        return (), f"its output '{output}' is a graph output"
    channels = graph.initializers[gamma].shape[-1] if gamma in graph.initializers else None
    for tensor in (gamma, beta):
        if tensor is not None and not _per_channel(graph, tensor, channels):
            return (), f"'{tensor}' is not a constant of one value per channel"
        if tensor is not None and len(graph.consumers(tensor)) != 1:
            return (), f"'{tensor}' is read by other nodes too"
    readers = [graph.nodes[r] for r in graph.consumers(output)]
    matmuls = [r for r in readers if r.op_type not in _SHAPE_READERS]
    if not matmuls:
        return (), "its output is read by no MatMul/Gemm"
    for reader in matmuls:
        found = _weight_of(graph, reader, output)
        if isinstance(found, str):
            return (), found
        rows = graph.initializers[found[0]].shape[1 if found[1] else 0]
        if rows != channels:
            return (), f"the weight of '{reader.name}' has {rows} input rows, not {channels}"
    return tuple(r.name for r in matmuls), None


def smoothing_groups(graph: ModelGraph
                     ) -> tuple[tuple[SmoothGroup, ...], tuple[SmoothSkipped, ...]]:
    """The LayerNorms :func:`smooth` smooths, and those it leaves alone with the reason."""
    groups, skipped = [], []
    for node, gamma, beta, unfit in _norms(graph):
        readers, reason = ((), unfit) if unfit else _check(graph, node, gamma, beta)
        if reason is not None:
            skipped.append(SmoothSkipped(norm=node.name, reason=reason))
        else:
            groups.append(SmoothGroup(norm=node.name, output=node.outputs[0], gamma=gamma,
                                      beta=beta, readers=readers))
    return tuple(groups), tuple(skipped)


def _channel_max(value: np.ndarray) -> np.ndarray:
    flat = np.abs(value.astype(np.float64)).reshape(-1, value.shape[-1])
    largest: np.ndarray = flat.max(axis=0)
    return largest


def channel_maxima(graph: ModelGraph, data: Dataset, *, batch_size: int = 16,
                   threads: int = 2) -> ChannelMaxima:
    """One FP32 pass over ``data``: max |x| per channel of every smoothable LayerNorm output
    (no pass when there is none)."""
    tensors = sorted({g.output for g in smoothing_groups(graph)[0]})
    maxima: dict[str, np.ndarray] = {}
    count = 0
    if tensors:
        reduced = reduce_activations(
            graph, data, tensors, reduce=_channel_max, combine=np.maximum,
            batch_size=batch_size, threads=threads, label=f"{graph.name} (SmoothQuant maxima)")
        maxima, count = reduced.summaries, reduced.samples
    logger.info("SmoothQuant: channel maxima of %d LayerNorm outputs on %d samples",
                len(maxima), count)
    return ChannelMaxima(model_fingerprint=graph.fingerprint, samples=count,
                         maxima=MappingProxyType(maxima))


def _weight_rows(array: np.ndarray, transposed: bool) -> np.ndarray:
    rows: np.ndarray = np.abs(array.T if transposed else array).max(axis=1)
    return rows


def _scales(x_max: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    """``s_j = x_max_j ** alpha / w_max_j ** (1 - alpha)``; 1 where either maximum is 0."""
    ok = (x_max > 0) & (w_max > 0) & np.isfinite(x_max) & np.isfinite(w_max)
    x, w = np.where(ok, x_max, 1.0), np.where(ok, w_max, 1.0)
    scales: np.ndarray = np.where(ok, x ** alpha / w ** (1.0 - alpha), 1.0)
    return scales


def smooth(graph: ModelGraph, maxima: ChannelMaxima, *, alpha: float = 0.5) -> ModelGraph:
    """``graph`` with every group of :func:`smoothing_groups` smoothed with migration strength
    ``alpha`` (see the module docstring); ``graph`` itself when there is none."""
    if not 0.0 < alpha <= 1.0:
        raise ModelError(f"SmoothQuant: alpha must be in (0, 1], got {alpha}")
    if maxima.model_fingerprint != graph.fingerprint:
        raise ModelError(f"SmoothQuant: the channel maxima are of model "
                         f"{maxima.model_fingerprint}, not of {graph.name} ({graph.fingerprint});"
                         " compute them on the model smoothed")
    groups, skipped = smoothing_groups(graph)
    for skip in skipped:
        logger.debug("SmoothQuant skips %s: %s", skip.norm, skip.reason)
    groups = tuple(g for g in groups if g.output in maxima.maxima)
    if not groups:
        return graph
    arrays: dict[str, np.ndarray] = {}
    for group in groups:
        weights = [_weight_of(graph, graph.nodes[r], group.output) for r in group.readers]
        pairs = [w for w in weights if not isinstance(w, str)]
        w_max = np.max([_weight_rows(graph.initializers[w].astype(np.float64), t)
                        for w, t in pairs], axis=0)
        s = _scales(maxima.maxima[group.output].astype(np.float64), w_max, alpha)
        for name in (group.gamma, group.beta):
            if name is not None:
                array = graph.initializers[name].astype(np.float64)
                arrays[name] = array / s.reshape(array.shape)
        for weight, transposed in pairs:
            array = graph.initializers[weight].astype(np.float64)
            arrays[weight] = array * (s[None, :] if transposed else s[:, None])
    return _rebuild(graph, arrays, len(groups), alpha)


def _rebuild(graph: ModelGraph, arrays: Mapping[str, np.ndarray], count: int,
             alpha: float) -> ModelGraph:
    model = with_weights(graph, arrays)
    changed = load_model(model)
    note = f"SmoothQuant: {count} LayerNorms folded into their MatMul/Gemm readers (alpha {alpha})"
    return replace(changed, path=graph.path, changes=(*graph.changes, note))
