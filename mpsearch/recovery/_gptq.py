"""GPTQ weight rounding (Frantar et al., GPTQ, ICLR 2023, after OBQ, NeurIPS 2022): a weight's
integer codes on the builder's own grid, rounded one input column at a time, each column's
rounding error spread over the columns not rounded yet, so that the layer's output on the
calibration inputs moves least.

Contract
--------
:func:`input_hessians` runs the FP32 model once over at most :data:`HESSIAN_SAMPLES` calibration
samples and keeps, for every node whose weight :func:`weight_rows` can lay out (Conv; Gemm
without transA; MatMul with a 2-D weight) and that node alone reads, ``H = sum x x^T``
[groups, K, K] over the vectors its weight multiplies: every output position's input window of
a Conv (zero padding included; K = C_in / group * prod(kernel)), every input row of a Gemm or
MatMul (K = the inner dimension). A Conv's sum stops early, after at least
:data:`MIN_SAMPLES` samples, once its samples' input positions reach
:data:`VECTORS_PER_DIMENSION` per dimension K (3x3 windows over 112 x 112 positions: after
those 16 samples; a 1x1 Conv with 320 inputs over 7 x 7 positions: all 128). Nodes reading one
tensor through the same window share one Hessian; nodes are taken in graph order while the
Hessians fit :data:`HESSIAN_BUDGET_BYTES`.

:func:`gptq_codes` rounds a weight laid out as [groups, rows, K] on a given grid (a scale and
zero point per row, a code range) from its Hessian, in descending order of the Hessian's
diagonal; with a diagonal Hessian it is round-to-nearest. :func:`round_weight` does the layout.
:class:`~mpsearch.recovery.CorrectedQuantizer` uses it for every integer weight of at most 8 bits
that has a Hessian and is quantized per output channel or per tensor, so every build (the
search's and the export) stores these codes; scales, zero points and the graph are the plain
builder's, so the result is a plain QDQ model. 16-bit weights keep round-to-nearest: their
rounding steps are 256 times finer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from mpsearch.data import Dataset
from mpsearch.graph import ModelGraph, Node
from mpsearch.kernels import gptq_block
from mpsearch.recovery._activations import Reduce, Reduced, reduce_activations
from mpsearch.recovery._bias_correction import conv_windows

__all__ = ["FACTOR_BUDGET_BYTES", "HESSIAN_BUDGET_BYTES", "HESSIAN_SAMPLES", "InputHessians",
           "gptq_codes", "gptq_factor", "input_hessians", "round_weight", "weight_rows"]

logger = logging.getLogger(__name__)

#: Calibration samples the Hessians are summed over (the GPTQ paper's 128).
HESSIAN_SAMPLES = 128
#: A Conv's Hessian stops once its samples' input positions reach this many per dimension ...
VECTORS_PER_DIMENSION = 256
#: ... but sums at least this many samples.
MIN_SAMPLES = 16
#: Memory the Hessians (float64) may take together; nodes past it keep round-to-nearest.
HESSIAN_BUDGET_BYTES = 512 * 2**20
#: Memory the memoized inverse-Hessian factors may take together (float64, each as large as its
#: Hessian); past it, a weight's factor is computed again at its next grid.
FACTOR_BUDGET_BYTES = 192 * 2**20
#: Damping added to the Hessian's diagonal, as a fraction of its mean (the paper's 0.01).
DAMPING = 0.01
#: Columns rounded between two updates of the remaining ones (the paper's lazy batches).
BLOCK = 128
#: Largest block of Conv input windows (float32 elements) summed at once.
_CHUNK_ELEMENTS = 16 * 2**20

#: A Hessian's column order and the upper Cholesky factor of its inverse (:func:`gptq_factor`).
Factor = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True, slots=True, kw_only=True)
class InputHessians:
    """Per node, ``sum x x^T`` [groups, K, K] of the vectors its weight multiplies.

    ``codes`` memoizes the GPTQ codes rounded from these Hessians, per node and grid: every
    builder sharing them (recovery's candidates, then the run's) rounds each weight once.
    ``factors`` memoizes :func:`gptq_factor` per Hessian (by identity) within
    :data:`FACTOR_BUDGET_BYTES`: the weights reading one tensor share a factorization, and so
    do a weight's grids (x86's 7-bit and 8-bit weights); :meth:`release_factors` frees them
    once the grids in use are rounded."""

    model_fingerprint: str
    samples: int
    hessians: Mapping[str, np.ndarray]
    codes: dict[tuple[object, ...], np.ndarray | None] = field(
        default_factory=dict, compare=False, repr=False)
    factors: dict[int, Factor | None] = field(default_factory=dict, compare=False, repr=False)

    def factor(self, hessian: np.ndarray) -> Factor | None:
        """:func:`gptq_factor` of ``hessian`` (one of :attr:`hessians`), memoized while the
        memo fits :data:`FACTOR_BUDGET_BYTES`; None where the damped Hessian is singular."""
        key = id(hessian)
        if key in self.factors:
            return self.factors[key]
        try:
            found: Factor | None = gptq_factor(hessian)
        except np.linalg.LinAlgError:
            found = None
        held = sum(f[1].nbytes for f in self.factors.values() if f is not None)
        if found is None or held + found[1].nbytes <= FACTOR_BUDGET_BYTES:
            self.factors[key] = found
        return found

    def release_factors(self) -> None:
        """Free the memoized factors (the codes stay)."""
        self.factors.clear()


# -- layout ---------------------------------------------------------------------------------
def _output_axis(node: Node, rank: int) -> int | None:
    """The weight axis of ``node``'s output channels; None where GPTQ does not apply."""
    if node.op_type == "Conv" and rank >= 3:
        return 0
    if node.op_type == "Gemm" and not node.attributes.get("transA", 0) and rank == 2:
        return 0 if node.attributes.get("transB", 0) else 1
    if node.op_type == "MatMul" and rank == 2:
        return 1
    return None


def weight_rows(node: Node, array: np.ndarray) -> np.ndarray | None:
    """``node``'s weight as [groups, output channels per group, K], K ordered as the vectors
    :func:`input_hessians` sums over (a Conv's input channel, then its kernel taps); None for
    a node GPTQ does not apply to."""
    axis = _output_axis(node, array.ndim)
    if axis is None:
        return None
    if node.op_type == "Conv":
        group = int(node.attributes.get("group", 1))
        rows: np.ndarray = array.reshape(group, array.shape[0] // group, -1)
        return rows
    matrix: np.ndarray = array if axis == 0 else array.T
    return matrix[None]


def _from_rows(node: Node, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The inverse of :func:`weight_rows`."""
    if node.op_type == "Conv":
        return rows.reshape(shape)
    matrix: np.ndarray = rows[0] if _output_axis(node, len(shape)) == 0 else rows[0].T
    return matrix


# -- statistics -----------------------------------------------------------------------------
def _window(node: Node, weight: np.ndarray) -> tuple[object, ...]:
    """What ``node``'s Hessian depends on besides the tensor it reads."""
    if node.op_type != "Conv":
        rows = weight_rows(node, weight)
        assert rows is not None
        return ("rows", rows.shape[2])
    attrs = node.attributes
    return ("conv", tuple(weight.shape[1:]), int(attrs.get("group", 1)),
            tuple(attrs.get("strides", ())), tuple(attrs.get("dilations", ())),
            tuple(attrs.get("pads", ())), attrs.get("auto_pad", b"NOTSET"))


def _conv_gram(node: Node, weight: np.ndarray) -> Reduce:
    kernel = tuple(int(k) for k in weight.shape[2:])
    group = int(node.attributes.get("group", 1))

    def gram_of(windows: np.ndarray | None) -> np.ndarray:
        if windows is None:
            raise ValueError(f"{node.name}: its padding is not understood")
        batch, channels, taps, positions = windows.shape
        cols = windows.reshape(batch, group, channels // group * taps, positions)
        gram: np.ndarray = np.matmul(cols, cols.swapaxes(2, 3)).sum(axis=0, dtype=np.float64)
        return gram

    def gram(value: np.ndarray) -> np.ndarray:
        value = value.astype(np.float32, copy=False)
        first = conv_windows(value[:1], node, kernel)
        total = gram_of(first)
        assert first is not None
        step = max(1, _CHUNK_ELEMENTS // first[0].size)
        for start in range(1, len(value), step):
            total += gram_of(conv_windows(value[start:start + step], node, kernel))
        return total
    return gram


def _rows_gram(inner: int) -> Reduce:
    def gram(value: np.ndarray) -> np.ndarray:
        flat = value.astype(np.float32, copy=False).reshape(-1, inner)
        product: np.ndarray = (flat.T @ flat).astype(np.float64)[None]
        return product
    return gram


def _capped(gram: Reduce, shape: tuple[int, int, int], samples: int) -> Reduce:
    """A Conv's ``gram`` of its first samples up to its own limit (see
    :data:`VECTORS_PER_DIMENSION`; input positions per sample from the first batch), zeros
    after."""
    seen, needed = 0, samples

    def capped(value: np.ndarray) -> np.ndarray:
        nonlocal seen, needed
        if seen == 0 and len(value):
            positions = int(np.prod(value.shape[2:]))
            wanted = -(-VECTORS_PER_DIMENSION * shape[1] // max(positions, 1))
            needed = min(samples, max(MIN_SAMPLES, wanted))
        take = min(len(value), max(needed - seen, 0))
        seen += len(value)
        return gram(value[:take]) if take else np.zeros(shape)
    return capped


def _targets(graph: ModelGraph) -> list[Node]:
    """Nodes GPTQ applies to, in graph order, each the only reader of its float weight."""
    out = []
    for name in graph.order:
        node = graph.nodes[name]
        if node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        weight = graph.initializers.get(node.inputs[1])
        if (weight is None or weight.dtype != np.float32 or node.inputs[0] in graph.initializers
                or len(graph.consumers(node.inputs[1])) != 1):
            continue
        if weight_rows(node, weight) is not None:
            out.append(node)
    return out


def input_hessians(graph: ModelGraph, data: Dataset, *, samples: int = HESSIAN_SAMPLES,
                   batch_size: int = 16, threads: int = 2) -> InputHessians:
    """One FP32 pass over the first ``samples`` of ``data``: the :class:`InputHessians` of
    every node GPTQ applies to (see the module docstring)."""
    count = min(samples, len(data))
    reduce, finish = hessians_reduction(graph, count)
    return finish(reduce_activations(
        graph, data.take(count), sorted(reduce), reduce=reduce, combine=np.add,
        batch_size=batch_size, threads=threads, label=f"{graph.name} (GPTQ Hessians)"))


def hessians_reduction(graph: ModelGraph, count: int
                       ) -> tuple[dict[str, Reduce], Callable[[Reduced], InputHessians]]:
    """What :func:`input_hessians` sums per tensor over ``count`` samples (a Conv's sum stops
    at its own limit; the pass must not run more than ``count``), and what makes the
    :class:`InputHessians` of those sums (for a pass shared with other statistics:
    :func:`~mpsearch.recovery._activations.sum_together`)."""
    shared: dict[tuple[str, tuple[object, ...]], list[Node]] = {}
    shapes: dict[tuple[str, tuple[object, ...]], tuple[int, int, int]] = {}
    budget, left_out = HESSIAN_BUDGET_BYTES, 0
    for node in _targets(graph):
        weight = graph.initializers[node.inputs[1]]
        key = (node.inputs[0], _window(node, weight))
        if key not in shared:
            rows = weight_rows(node, weight)
            assert rows is not None
            shape = (rows.shape[0], rows.shape[2], rows.shape[2])
            if 8 * int(np.prod(shape)) > budget:
                left_out += 1
                continue
            budget -= 8 * int(np.prod(shape))
            shared[key], shapes[key] = [], shape
        shared[key].append(node)
    by_tensor: dict[str, list[tuple[object, ...]]] = {}
    for tensor, window in shared:
        by_tensor.setdefault(tensor, []).append(window)

    def reducer(tensor: str) -> Reduce:
        grams = []
        for window in by_tensor[tensor]:
            node, shape = shared[tensor, window][0], shapes[tensor, window]
            if node.op_type == "Conv":
                weight = graph.initializers[node.inputs[1]]
                grams.append(_capped(_conv_gram(node, weight), shape, count))
            else:
                grams.append(_rows_gram(shape[1]))
        if len(grams) == 1:
            return lambda value: grams[0](value).reshape(-1)
        return lambda value: np.concatenate([gram(value).reshape(-1) for gram in grams])

    def finish(reduced: Reduced) -> InputHessians:
        hessians: dict[str, np.ndarray] = {}
        for tensor, windows in by_tensor.items():
            flat, offset = reduced.summaries[tensor], 0
            for window in windows:
                shape = shapes[tensor, window]
                hessian = flat[offset:offset + int(np.prod(shape))].reshape(shape)
                offset += hessian.size
                for node in shared[tensor, window]:
                    hessians[node.name] = hessian
        logger.info("GPTQ: Hessians of %d nodes on %d samples%s", len(hessians),
                    reduced.samples, f"; {left_out} past the memory budget keep "
                    "round-to-nearest" if left_out else "")
        return InputHessians(model_fingerprint=graph.fingerprint, samples=reduced.samples,
                             hessians=MappingProxyType(hessians))
    return {tensor: reducer(tensor) for tensor in by_tensor}, finish


# -- rounding -------------------------------------------------------------------------------
def gptq_factor(hessian: np.ndarray) -> Factor:
    """The column order [G, K] (descending diagonal) of ``hessian`` [G, K, K] and the upper
    Cholesky factor [G, K, K] of its inverse in that order, damped by :data:`DAMPING` (an input
    that is always zero gets a unit diagonal): row i of the factor holds how column i's
    rounding error moves the later ones. Raises ``numpy.linalg.LinAlgError`` when the damped
    Hessian is singular."""
    h = np.array(hessian, dtype=np.float64)
    groups, inner = h.shape[0], h.shape[1]
    diag = np.arange(inner)
    dead = h[:, diag, diag] <= 0
    h[:, diag, diag] += np.where(dead, 1.0, 0.0)
    h[:, diag, diag] += DAMPING * h[:, diag, diag].mean(axis=1, keepdims=True)
    order = np.argsort(-h[:, diag, diag], axis=1, kind="stable")
    picked = np.arange(groups)[:, None]
    h = h[picked[:, :, None], order[:, :, None], order[:, None, :]]
    upper = np.ascontiguousarray(np.linalg.cholesky(np.linalg.inv(h)).transpose(0, 2, 1))
    return order, upper


def gptq_codes(rows: np.ndarray, hessian: np.ndarray, scale: np.ndarray, zero: np.ndarray,
               qmin: int, qmax: int, *, factor: Factor | None = None) -> np.ndarray:
    """Integer codes (float64) in [qmin, qmax] of ``rows`` [G, R, K] on the grid ``scale``,
    ``zero`` [G, R], rounded column by column with the error fed forward through the inverse
    of ``hessian`` [G, K, K] (:func:`gptq_factor`, unless its ``factor`` is given). Raises
    ``numpy.linalg.LinAlgError`` when the damped Hessian is singular."""
    order, upper = gptq_factor(hessian) if factor is None else factor
    inner = rows.shape[2]
    weights = np.take_along_axis(np.array(rows, dtype=np.float64), order[:, None, :], axis=2)
    scale = np.asarray(scale, np.float64)
    zero = np.asarray(zero, np.float64)
    codes = np.empty_like(weights)
    for begin in range(0, inner, BLOCK):
        end = min(begin + BLOCK, inner)
        block = np.ascontiguousarray(weights[:, :, begin:end])
        errors = np.empty_like(block)
        gptq_block(block, upper, begin, scale, zero, qmin, qmax, codes, errors)
        weights[:, :, end:] -= np.matmul(errors, upper[:, begin:end, end:])
    restored: np.ndarray = np.take_along_axis(codes, np.argsort(order, axis=1)[:, None, :],
                                              axis=2)
    return restored


def round_weight(node: Node, array: np.ndarray, hessian: np.ndarray, scale: np.ndarray,
                 zero: np.ndarray, axis: int | None, qmin: int, qmax: int, *,
                 memo: InputHessians | None = None) -> np.ndarray | None:
    """GPTQ codes (float64, ``array``'s shape) of ``node``'s weight on the grid ``scale``,
    ``zero`` (per tensor, or along ``axis``, which must be the output-channel axis); None
    where GPTQ does not apply or the Hessian is not finite or singular (the caller rounds to
    nearest). ``memo``: the :class:`InputHessians` ``hessian`` is one of, whose factor memo
    serves it."""
    rows = weight_rows(node, array)
    if rows is None or (axis is not None and axis != _output_axis(node, array.ndim)):
        return None
    groups, count, inner = rows.shape
    if hessian.shape != (groups, inner, inner):
        return None
    if not np.isfinite(hessian).all():
        logger.warning("GPTQ: %s's input overflows float32 on the calibration data; its "
                       "weight is rounded to nearest", node.name)
        return None

    def per_row(value: np.ndarray) -> np.ndarray:
        flat = np.asarray(value, np.float64).reshape(-1)
        return np.broadcast_to(flat, (groups * count,)).reshape(groups, count)
    try:
        factor = None if memo is None else memo.factor(hessian)
        if memo is not None and factor is None:
            raise np.linalg.LinAlgError("singular")
        codes = gptq_codes(rows, hessian, per_row(scale), per_row(zero), qmin, qmax,
                           factor=factor)
    except np.linalg.LinAlgError:
        logger.warning("GPTQ: %s's Hessian is singular; its weight is rounded to nearest",
                       node.name)
        return None
    return _from_rows(node, codes, array.shape)
