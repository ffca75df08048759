"""Our QDQ ONNX export -> an integer TFLite model (:class:`~._tflite_flat.FlatModel`).

The lowering reads the scales and zero points the search chose, not a re-quantization:

* a DequantizeLinear of an integer initializer is a quantized constant (weights per channel,
  int32 biases); of an activation, the integer tensor its QuantizeLinear wrote;
* a node whose activation inputs are all such tensors and whose every output is read by one
  QuantizeLinear alone becomes one integer TFLite operator writing that QuantizeLinear's grid;
* data movement (Reshape, Transpose, Gather...) on a quantized tensor stays integer on the same
  grid (exact: the values are moved, not computed); a QuantizeLinear of a tensor already on
  another grid becomes a QUANTIZE (requantize) operator;
* any other node is written as a float32 operator behind DEQUANTIZE, as the assignment asked
  (the toolchain then reports it on the CPU); a node with no TFLite builtin raises one line.

Rank-4 activations are kept NHWC: weights are transposed at write time, axes are remapped,
and graph inputs and outputs are NHWC (``Signature`` says which, so callers transpose).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mpsearch.errors import TargetError
from mpsearch.targets._tflite_flat import FlatModel, FlatTensor

__all__ = ["Lowering", "Signature", "Value", "lower"]

_QDQ = ("QuantizeLinear", "DequantizeLinear")
#: How a node refused only because an input's producer was not written says so.
_UNWRITTEN = ("is neither computed before the node nor an initializer",
              "was not written: its producer has no lowering")
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


@dataclass(frozen=True, slots=True, kw_only=True)
class QParams:
    """A grid: scale and zero point (per channel along ``axis`` when longer than one)."""

    scale: np.ndarray
    zero: np.ndarray
    dtype: str
    axis: int | None = None

    def same(self, other: QParams) -> bool:
        return (self.dtype == other.dtype and self.scale.shape == other.scale.shape
                and np.array_equal(self.scale, other.scale)
                and np.array_equal(self.zero, other.zero))


@dataclass(frozen=True, slots=True, kw_only=True)
class Value:
    """An ONNX float tensor as the TFLite model holds it: a tensor index (integer when ``q``
    is set, NHWC when ``nhwc``) or a constant (``codes`` on ``q``, or float ``array``)."""

    shape: tuple[int, ...]
    index: int | None = None
    q: QParams | None = None
    nhwc: bool = False
    array: np.ndarray | None = None   # float constant
    codes: np.ndarray | None = None   # quantized constant (on ``q``)

    @property
    def constant(self) -> bool:
        return self.index is None

    def real(self) -> np.ndarray:
        """A constant's float values (dequantized when stored quantized)."""
        if self.array is not None:
            return self.array
        if self.codes is None or self.q is None:
            raise ValueError("not a constant")
        scale, zero = self.q.scale, self.q.zero
        if self.q.axis is not None and scale.size > 1:
            shape = [1] * self.codes.ndim
            shape[self.q.axis] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        real: np.ndarray = (self.codes.astype(np.float64) - zero) * scale
        return real.astype(np.float32)


@dataclass(frozen=True, slots=True, kw_only=True)
class Signature:
    """The TFLite model's inputs and outputs in ONNX terms: names, and which are NHWC."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nhwc_inputs: tuple[bool, ...]
    nhwc_outputs: tuple[bool, ...]

    def to_dict(self) -> dict[str, list[str] | list[bool]]:
        return {"inputs": list(self.inputs), "outputs": list(self.outputs),
                "nhwc_inputs": list(self.nhwc_inputs), "nhwc_outputs": list(self.nhwc_outputs)}


@dataclass(slots=True)
class Lowering:
    """The state of one lowering: the model written so far and the ONNX values it holds."""

    model: onnx.ModelProto
    shapes: Mapping[str, tuple[int, ...]]
    flat: FlatModel = field(default_factory=FlatModel)
    values: dict[str, Value] = field(default_factory=dict)
    consumers: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)
    inits: dict[str, np.ndarray] = field(default_factory=dict)
    dequantized: dict[int, int] = field(default_factory=dict)  # int tensor -> its float copy
    fused: set[str] = field(default_factory=set)  # Q nodes folded into their producer
    unsupported: list[str] = field(default_factory=list)
    names: set[str] = field(default_factory=set)

    # -- tensors ------------------------------------------------------------------------
    def unique(self, name: str) -> str:
        out, n = name, 1
        while out in self.names:
            n += 1
            out = f"{name}_{n}"
        self.names.add(out)
        return out

    def tensor(self, name: str, shape: tuple[int, ...], q: QParams | None, *,
               data: np.ndarray | None = None, dtype: str | None = None) -> int:
        kind = dtype or (q.dtype if q is not None else "float32")
        axis = q.axis if q is not None and q.axis is not None else 0
        return self.flat.add(FlatTensor(
            name=self.unique(name), shape=tuple(int(d) for d in shape), dtype=kind, data=data,
            scale=None if q is None else q.scale.astype(np.float32).reshape(-1),
            zero=None if q is None else q.zero.astype(np.int64).reshape(-1), axis=axis))

    def const(self, name: str, array: np.ndarray, q: QParams | None = None) -> int:
        return self.tensor(name, array.shape, q, data=array, dtype=str(array.dtype))

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name in self.values:
            return self.values[name].shape
        if name not in self.shapes:
            raise TargetError(f"tensor '{name}' has no static shape after shape inference; "
                              "fix the model's dynamic dimensions")
        return self.shapes[name]

    def qparams(self, node: onnx.NodeProto) -> QParams:
        scale = self.inits[node.input[1]]
        zero = (self.inits[node.input[2]] if len(node.input) > 2 and node.input[2]
                else np.zeros(scale.shape, np.uint8))
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        return QParams(scale=scale.astype(np.float32), zero=zero, dtype=str(zero.dtype),
                       axis=axis if scale.size > 1 else None)

    # -- layout and float copies --------------------------------------------------------
    def tflite_shape(self, value: Value) -> tuple[int, ...]:
        s = value.shape
        return tuple(s[i] for i in TO_NHWC) if value.nhwc else s

    def as_float(self, value: Value, node: str) -> Value:
        """``value`` as a float32 tensor (a DEQUANTIZE of an integer one, made once)."""
        if value.constant:
            arr = value.real()
            return Value(shape=value.shape, index=self.const(f"{node}_const", arr))
        if value.q is None or value.index is None:
            return value
        if value.index not in self.dequantized:
            name = self.flat.tensors[value.index].name
            out = self.tensor(f"{name}_f32", self.tflite_shape(value), None)
            self.flat.op("DEQUANTIZE", (value.index,), (out,), node)
            self.dequantized[value.index] = out
        return Value(shape=value.shape, index=self.dequantized[value.index], nhwc=value.nhwc)

    def relayout(self, value: Value, nhwc: bool, node: str) -> Value:
        """``value`` with rank-4 data NHWC (``nhwc``) or in ONNX order; a TRANSPOSE when the
        orders differ in memory, a RESHAPE when only the shape does."""
        if value.nhwc == nhwc or len(value.shape) != 4 or value.constant:
            return value
        assert value.index is not None
        src = self.flat.tensors[value.index]
        target = Value(shape=value.shape, q=value.q, nhwc=nhwc)
        out_shape = self.tflite_shape(target)
        out = self.tensor(f"{src.name}_{'nhwc' if nhwc else 'nchw'}", out_shape, value.q)
        n, c, h, w = value.shape
        if c == 1 or h * w == 1:
            self.flat.op("RESHAPE", (value.index, self.const(f"{src.name}_shape", np.array(
                out_shape, np.int32))), (out,), node)
        else:
            perm = np.array(TO_NHWC if nhwc else TO_NCHW, np.int32)
            self.flat.op("TRANSPOSE", (value.index, self.const(f"{src.name}_perm", perm)),
                         (out,), node)
        return Value(shape=value.shape, index=out, q=value.q, nhwc=nhwc)

    def refuse(self, node: onnx.NodeProto, why: str) -> None:
        self.unsupported.append(f"{node.op_type} '{node.name}': {why}")


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            inits[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return inits


def _fold(low: Lowering, node: onnx.NodeProto) -> bool:
    """Evaluate ``node`` now when its inputs are constants (or it is a Shape of a static
    tensor): shape arithmetic is not written to the TFLite model."""
    if node.op_type in _QDQ or not node.input:
        return False
    if node.op_type == "Shape":
        source = node.input[0]
        constant = source in low.inits and source not in low.values
        shape = np.array(low.inits[source].shape if constant else low.shape_of(source),
                         np.int64)
        start = next((a.i for a in node.attribute if a.name == "start"), 0)
        end = next((a.i for a in node.attribute if a.name == "end"), len(shape))
        low.inits[node.output[0]] = shape[start:end]
        return True
    if not all(not t or (t in low.inits and t not in low.values) for t in node.input):
        return False
    from onnx.reference import ReferenceEvaluator

    feeds = {t: low.inits[t] for t in node.input if t}
    infos = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for t, a in feeds.items()]
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
            for o in node.output]
    graph = helper.make_graph([node], "fold", infos, outs)
    folded = helper.make_model(graph, opset_imports=list(low.model.opset_import))
    for name, value in zip(node.output, ReferenceEvaluator(folded).run(None, feeds),
                           strict=True):
        low.inits[name] = np.asarray(value)
    return True


def lower(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> tuple[
        FlatModel, Signature, dict[int, str]]:
    """Lower a static-shaped QDQ ``model``; returns the TFLite model, its signature, and the
    ONNX node each TFLite operator came from (by operator index).

    Raises :class:`TargetError` naming every node that has no TFLite builtin."""
    from mpsearch.targets._gelu import find_gelu
    from mpsearch.targets._tflite_ops import lower_gelu, lower_node, lower_qdq

    low = Lowering(model=model, shapes=shapes, inits=_initializers(model))
    for node in model.graph.node:
        for t in node.input:
            low.consumers.setdefault(t, []).append(node)
    outputs = {o.name for o in model.graph.output}
    nhwc_in = _inputs(low)
    gelus = {g.nodes[0]: g for g in find_gelu(model, low.inits)}
    inside = {n for g in gelus.values() for n in (*g.nodes[1:], *g.skipped)}
    for node in model.graph.node:
        if node.op_type == "Constant" or node.name in inside:
            continue
        if node.name in gelus:
            lower_gelu(low, node, gelus[node.name], outputs)
            continue
        if _fold(low, node):
            continue
        if node.op_type in _QDQ:
            lower_qdq(low, node)
        else:
            lower_node(low, node, outputs)
    if low.unsupported:
        after = [u for u in low.unsupported if any(m in u for m in _UNWRITTEN)]
        roots = [u for u in low.unsupported if u not in after] or after
        tail = f"; {len(after)} node(s) after them not written" if len(roots) < len(
            low.unsupported) else ""
        raise TargetError(f"{len(roots)} node(s) have no TFLite equivalent: "
                          + "; ".join(roots) + tail)
    nhwc_out = []
    for out in model.graph.output:
        value = low.values[out.name]
        if value.constant or value.index is None:
            raise TargetError(f"output '{out.name}' is a constant; nothing to compile")
        low.flat.outputs.append(value.index)
        nhwc_out.append(value.nhwc)
    sig = Signature(inputs=tuple(i.name for i in _graph_inputs(model)),
                    outputs=tuple(o.name for o in model.graph.output),
                    nhwc_inputs=tuple(nhwc_in), nhwc_outputs=tuple(nhwc_out))
    return low.flat, sig, {i: op.node for i, op in enumerate(low.flat.ops)}


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _inputs(low: Lowering) -> list[bool]:
    """Graph inputs become TFLite inputs: integer when a single QuantizeLinear reads them (the
    usual int8 deployment), float otherwise; rank 4 as NHWC."""
    nhwc = []
    for inp in _graph_inputs(low.model):
        shape = low.shape_of(inp.name)
        readers = low.consumers.get(inp.name, [])
        four = len(shape) == 4
        if len(readers) == 1 and readers[0].op_type == "QuantizeLinear":
            q = low.qparams(readers[0])
            value = Value(shape=shape, q=q, nhwc=four)
            index = low.tensor(inp.name, low.tflite_shape(value), q)
            low.values[readers[0].output[0]] = Value(shape=shape, index=index, q=q, nhwc=four)
            low.fused.add(readers[0].name)
        else:
            value = Value(shape=shape, nhwc=four)
            kind = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
            index = low.tensor(inp.name, low.tflite_shape(value), None, dtype=str(kind))
            low.values[inp.name] = Value(shape=shape, index=index, nhwc=four)
        low.flat.inputs.append(index)
        nhwc.append(four)
    return nhwc
