"""Empirical bias correction (Nagel et al., DFQ, ICCV 2019, section 4.2): a pure edit of a built
QDQ model, ``onnx.ModelProto -> onnx.ModelProto``.

Contract
--------
:func:`input_means` runs the FP32 model once over calibration data and keeps, for every Conv and
Gemm with a float initializer weight, the mean input each weight tap multiplies (Conv: the mean
over samples and output positions of the padded input window, shape [C_in, *kernel]; Gemm: the
mean input row). :func:`correct_biases` takes a QDQ model built from that graph (node names kept,
as :class:`~mpsearch.quantize.Quantizer` keeps them) and, for every such node whose weight is
read through a DequantizeLinear of constants, subtracts the expected output shift
``E[W_q x] - E[W x] = sum_taps (W_q - W) * mean_tap`` per output channel from its bias, so the
quantized layer's mean output equals the FP32 layer's on the calibration data. The corrected
bias (the FP32 bias minus the shift) is rounded once on the int32 bias's own grid, or replaces a
float bias. Nodes without a bias, or whose weight is
float, are left as they are. The result is still a plain QDQ model (only initializer values
change).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx
from onnx import numpy_helper

from mpsearch._names import Namer
from mpsearch.data import Dataset
from mpsearch.graph import ModelGraph, Node
from mpsearch.recovery._activations import Reduce, Reduced, reduce_activations

__all__ = ["InputMeans", "conv_tap_means", "conv_windows", "correct_biases", "input_means",
           "output_shift"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class InputMeans:
    """Per node, the mean input each weight tap multiplies (see the module docstring)."""

    model_fingerprint: str
    samples: int
    taps: Mapping[str, np.ndarray]


def _pads(node: Node, spatial: tuple[int, ...], kernel: tuple[int, ...],
          strides: tuple[int, ...], dilations: tuple[int, ...]) -> tuple[int, ...] | None:
    auto = node.attributes.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    rank = len(spatial)
    if auto in ("NOTSET", ""):
        return tuple(int(p) for p in node.attributes.get("pads", (0,) * (2 * rank)))
    if auto == "VALID":
        return (0,) * (2 * rank)
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else large)
        ends.append(large if auto == "SAME_UPPER" else small)
    return (*begins, *ends)


def conv_windows(value: np.ndarray, node: Node, kernel: tuple[int, ...]) -> np.ndarray | None:
    """[B, C, taps, positions]: for each sample of ``value`` [B, C, *spatial], input channel,
    kernel tap (row-major) and output position of Conv ``node``, the input value that tap reads
    (zero padding included; a view of ``value`` for a pointwise Conv); None where the padding
    is not understood."""
    spatial = tuple(int(d) for d in value.shape[2:])
    rank = len(spatial)
    strides = tuple(int(s) for s in node.attributes.get("strides", (1,) * rank))
    dilations = tuple(int(d) for d in node.attributes.get("dilations", (1,) * rank))
    pads = _pads(node, spatial, kernel, strides, dilations)
    if pads is None or len(kernel) != rank:
        return None
    batch, channels = value.shape[:2]
    if not any(pads) and set(kernel) == {1} and set(strides) == {1}:  # pointwise: a view
        return value.reshape(batch, channels, 1, -1)
    padded = np.pad(value, [(0, 0), (0, 0), *zip(pads[:rank], pads[rank:], strict=True)])
    outs = [(padded.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
            for i in range(rank)]
    windows = np.empty((batch, channels, int(np.prod(kernel)), int(np.prod(outs))),
                       value.dtype)
    for index, tap in enumerate(np.ndindex(*kernel)):
        window = (slice(None), slice(None), *(slice(t * d, t * d + s * (o - 1) + 1, s)
                                              for t, d, s, o in
                                              zip(tap, dilations, strides, outs, strict=True)))
        windows[:, :, index] = padded[window].reshape(batch, channels, -1)
    return windows


def conv_tap_means(mean: np.ndarray, node: Node, kernel: tuple[int, ...]) -> np.ndarray | None:
    """[C, *kernel]: for each input channel and kernel tap, the mean over output positions of
    the input value that tap reads (zero padding included), from the mean input ``mean``
    [C, *spatial]. ``sum(dW * taps)`` is then the exact mean output shift of a weight change."""
    windows = conv_windows(mean[None].astype(np.float64), node, kernel)
    if windows is None:
        return None
    taps: np.ndarray = windows[0].mean(axis=2).reshape(mean.shape[0], *kernel)
    return taps


def _targets(graph: ModelGraph) -> dict[str, str]:
    """Node -> the activation tensor whose mean it needs (Conv, and Gemm without transA)."""
    out = {}
    for node in graph.nodes.values():
        if node.domain not in ("", "ai.onnx") or len(node.inputs) < 3 or not node.inputs[2]:
            continue
        weight = graph.initializers.get(node.inputs[1])
        if weight is None or weight.dtype != np.float32 or node.inputs[0] in graph.initializers:
            continue
        if node.op_type == "Conv" or (node.op_type == "Gemm"
                                      and not node.attributes.get("transA", 0)):
            out[node.name] = node.inputs[0]
    return out


def _batch_sum(value: np.ndarray) -> np.ndarray:
    total: np.ndarray = value.astype(np.float64).sum(axis=0)
    return total


def input_means(graph: ModelGraph, data: Dataset, *, batch_size: int = 16,
                threads: int = 2) -> InputMeans:
    """One FP32 pass over ``data``: the :class:`InputMeans` of every correctable node."""
    reduce, finish = means_reduction(graph)
    return finish(reduce_activations(  # per batch: Conv [C, *spatial]; Gemm [K]
        graph, data, sorted(reduce), reduce=reduce, combine=np.add, batch_size=batch_size,
        threads=threads, label=f"{graph.name} (bias correction means)"))


def means_reduction(graph: ModelGraph
                    ) -> tuple[dict[str, Reduce], Callable[[Reduced], InputMeans]]:
    """What :func:`input_means` sums per tensor, and what makes the means of those sums (for
    a pass shared with other statistics: :func:`~mpsearch.recovery._activations.sum_together`)."""
    targets = _targets(graph)

    def finish(sums: Reduced) -> InputMeans:
        taps: dict[str, np.ndarray] = {}
        for node_name, tensor in targets.items():
            node = graph.nodes[node_name]
            mean = sums.summaries[tensor] / max(sums.rows[tensor], 1)
            if node.op_type == "Gemm":
                taps[node_name] = mean.reshape(-1)
                continue
            kernel = tuple(int(k) for k in graph.initializers[node.inputs[1]].shape[2:])
            found = conv_tap_means(mean, node, kernel)
            if found is not None:
                taps[node_name] = found
        logger.info("bias correction: input means of %d nodes on %d samples", len(taps),
                    sums.samples)
        return InputMeans(model_fingerprint=graph.fingerprint, samples=sums.samples,
                          taps=MappingProxyType(taps))
    return dict.fromkeys(set(targets.values()), _batch_sum), finish


def output_shift(node: Node, delta: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """Mean output shift per output channel of weight change ``delta`` on inputs whose tap
    means are ``taps`` (Conv: grouped; Gemm: ``alpha * mean @ delta`` in B's layout)."""
    if node.op_type == "Gemm":
        matrix = delta.T if node.attributes.get("transB", 0) else delta
        shift: np.ndarray = float(node.attributes.get("alpha", 1.0)) * (taps @ matrix)
        return shift
    group = int(node.attributes.get("group", 1))
    cout, cin_g = delta.shape[0], delta.shape[1]
    d = delta.reshape(group, cout // group, cin_g, -1)
    t = taps.reshape(group, cin_g, -1)
    shift = np.einsum("gock,gck->go", d, t).reshape(-1)
    return shift


def _of_constants(inits: Mapping[str, onnx.TensorProto], dq: onnx.NodeProto) -> bool:
    """Whether ``dq`` dequantizes initializers only (codes, scale and any zero point)."""
    return len(dq.input) >= 2 and all(t in inits for t in dq.input if t)


def _dequantize(inits: Mapping[str, onnx.TensorProto], dq: onnx.NodeProto) -> np.ndarray | None:
    if not _of_constants(inits, dq):
        return None
    codes = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float64)
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
    zero = (numpy_helper.to_array(inits[dq.input[2]]).astype(np.float64)
            if len(dq.input) > 2 and dq.input[2] else np.zeros_like(scale))
    if scale.ndim == 1 and codes.ndim > 1:
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        shape = [1] * codes.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    values: np.ndarray = (codes - zero) * scale
    return values


def correct_biases(model: onnx.ModelProto, graph: ModelGraph, means: InputMeans, *,
                   shifts: dict[tuple[str, bytes], np.ndarray] | None = None
                   ) -> onnx.ModelProto:
    """A copy of the QDQ ``model`` with the biases corrected (see the module docstring).
    ``shifts`` memoizes each node's output shift by its quantized weight (a digest of its
    codes, scale, zero point and axis), for a builder that corrects the same weights build
    after build."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    producers = {o: n for n in out.graph.node for o in n.output}
    readers: dict[str, int] = {}
    for n in out.graph.node:
        for t in n.input:
            readers[t] = readers.get(t, 0) + 1
    namer = Namer.of_model(out)
    fixed = 0
    for proto in out.graph.node:
        node, taps = graph.nodes.get(proto.name), means.taps.get(proto.name)
        if node is None or taps is None or len(proto.input) < 3 or node.op_type != proto.op_type:
            continue
        dq = producers.get(proto.input[1])
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        key = None if shifts is None else _weight_key(inits, proto.name, dq)
        shift = None if key is None or shifts is None else shifts.get(key)
        if shift is None:
            shift = _shift(inits, dq, node, graph, taps)
            if shift is None:
                continue
            if key is not None and shifts is not None:
                shifts[key] = shift
        original = graph.initializers.get(node.inputs[2])
        if original is not None:
            fixed += _fold(out, proto, inits, producers, readers,
                           original.astype(np.float64) - shift, namer)
    logger.debug("bias correction: %d biases corrected", fixed)
    return out


def _shift(inits: Mapping[str, onnx.TensorProto], dq: onnx.NodeProto, node: Node,
           graph: ModelGraph, taps: np.ndarray) -> np.ndarray | None:
    """The mean output shift of ``node``'s weight as ``dq`` dequantizes it (None: not of
    constants)."""
    quantized = _dequantize(inits, dq)
    if quantized is None:
        return None
    delta = quantized - graph.initializers[node.inputs[1]].astype(np.float64)
    shift = output_shift(node, delta, taps)
    if node.op_type == "Gemm":
        shift = shift / float(node.attributes.get("beta", 1.0))
    return shift


def _weight_key(inits: Mapping[str, onnx.TensorProto], name: str, dq: onnx.NodeProto
                ) -> tuple[str, bytes] | None:
    """(``name``, a digest of the constants ``dq`` reads and its axis); None when it reads
    anything else."""
    if not _of_constants(inits, dq):
        return None
    digest = hashlib.blake2b(digest_size=16)
    for tensor in dq.input:
        if tensor:
            digest.update(numpy_helper.to_array(inits[tensor]).tobytes())
    digest.update(str(next((a.i for a in dq.attribute if a.name == "axis"), 1)).encode())
    return name, digest.digest()


def _fold(model: onnx.ModelProto, proto: onnx.NodeProto, inits: dict[str, onnx.TensorProto],
          producers: Mapping[str, onnx.NodeProto], readers: Mapping[str, int],
          target: np.ndarray, namer: Namer) -> int:
    """Store ``target`` (the FP32 bias minus the shift) as ``proto``'s bias: rounded once on
    the int32 grid of its DequantizeLinear, or as a new float initializer."""
    bias = proto.input[2]
    dq = producers.get(bias)
    if dq is not None and dq.op_type == "DequantizeLinear" and readers.get(bias) == 1:
        codes_name = dq.input[0]
        if codes_name not in inits or readers.get(codes_name) != 1:
            return 0
        scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
        zero = (numpy_helper.to_array(inits[dq.input[2]]).astype(np.float64)
                if len(dq.input) > 2 and dq.input[2] else 0.0)
        if numpy_helper.to_array(inits[codes_name]).shape != target.shape:
            return 0
        codes = np.clip(np.round(target / np.broadcast_to(scale, target.shape) + zero),
                        -(2**31), 2**31 - 1).astype(np.int32)
        inits[codes_name].CopyFrom(numpy_helper.from_array(codes, codes_name))
        return 1
    if bias in inits:  # read by its header only: it may stand in for data in another file
        stored = inits[bias]
        if tuple(stored.dims) != target.shape:
            return 0
        dtype = onnx.helper.tensor_dtype_to_np_dtype(stored.data_type)
        name = namer.fresh(f"{bias}__bc_{proto.name}")
        model.graph.initializer.append(numpy_helper.from_array(target.astype(dtype), name))
        proto.input[2] = name
        return 1
    return 0

