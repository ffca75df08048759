"""One ONNX node (of our QDQ export) -> TFLite operators, by the writer tables
(:data:`._tflite_writers.WRITERS`, :data:`._tflite_extra.EXTRA_WRITERS`,
:data:`._tflite_moves.MOVE_WRITERS`).

:func:`lower_node` decides whether the node is written integer (its activation inputs are
quantized tensors and each output is read by one QuantizeLinear alone) or float32 (behind
DEQUANTIZE), then calls the node's writer with a :class:`Node` context. Data movement
(:data:`MOVES`) keeps the input's grid either way: the values are moved, not computed.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from mpsearch.targets._gelu import Gelu
from mpsearch.targets._tflite_lower import TO_NHWC, Lowering, QParams, Value

__all__ = ["Node", "limits", "lower_node", "lower_qdq", "nhwc_const", "quantize", "refuse"]

#: Data movement: the output is on the input's grid.
MOVES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Gather",
                   "Identity", "Split", "Slice", "Pad", "MaxPool", "Expand", "ReduceMax",
                   "GlobalMaxPool", "DepthToSpace", "SpaceToDepth"})
#: Ops whose constant inputs are tensors of the computation (a float one keeps the node float).
CONSTANT_OPERANDS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "Mul",
                               "Div", "Max", "Min", "Concat", "PRelu", "LayerNormalization"})
#: TFLite integer kernels whose output grid is fixed: (int8 scale, zero), (int16 scale, zero).
FIXED = {"LOGISTIC": ((1 / 256, -128), (1 / 32768, 0)), "SOFTMAX": ((1 / 256, -128),
         (1 / 32768, 0)), "TANH": ((1 / 128, 0), (1 / 32768, 0))}


#: Where LOGISTIC and TANH are flat to int16 precision (tanh(16) = 1 - 3e-14).
_SATURATE = 16.0


@dataclass(slots=True)
class Node:
    """One node being written: its inputs as values, its outputs' grids (None: float)."""

    low: Lowering
    proto: onnx.NodeProto
    ins: list[Value | None]
    out_q: list[QParams | None]
    out_names: list[str]

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def quantized(self) -> bool:
        return self.out_q[0] is not None

    def attr(self, name: str, default: object = None) -> object:
        for a in self.proto.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def number(self, name: str, default: float) -> float:
        value = self.attr(name, default)
        return float(value) if isinstance(value, (int, float)) else default

    def integer(self, name: str, default: int) -> int:
        value = self.attr(name, default)
        return int(value) if isinstance(value, int) else default

    def ints(self, name: str, default: list[int]) -> list[int]:
        value = self.attr(name)
        return [int(v) for v in value] if isinstance(value, list) else default

    def x(self, i: int = 0, nhwc: bool | None = None) -> Value:
        """Input ``i`` as a TFLite tensor (float when the node is written float)."""
        value = self.ins[i]
        if value is None:
            raise ValueError(f"input {i} missing")
        if value.constant:
            if self.quantized and value.codes is not None and value.q is not None:
                index = self.low.const(f"{self.name}_k{i}", value.codes, value.q)
                return Value(shape=value.shape, index=index, q=value.q)
            value = self.low.as_float(value, self.name)
        elif not self.quantized:
            value = self.low.as_float(value, self.name)
        if nhwc is not None:
            value = self.low.relayout(value, nhwc, self.name)
        return value

    def const_array(self, i: int) -> np.ndarray | None:
        value = self.ins[i] if i < len(self.ins) else None
        return None if value is None or not value.constant else value.real()

    def kind(self, value: Value) -> str:
        """The TFLite dtype of a written value."""
        return "float32" if value.index is None else self.low.flat.tensors[value.index].dtype

    def output(self, i: int, shape: tuple[int, ...], nhwc: bool = False,
               q: QParams | None = None, dtype: str | None = None) -> Value:
        grid = q if q is not None else self.out_q[i]
        value = Value(shape=shape, q=grid, nhwc=nhwc and len(shape) == 4)
        index = self.low.tensor(self.out_names[i], self.low.tflite_shape(value), grid,
                                dtype=None if grid is not None else dtype)
        return Value(shape=shape, index=index, q=grid, nhwc=value.nhwc)

    def emit(self, code: str, inputs: tuple[int, ...], out: Value, options: str | None = None,
             **fields: object) -> Value:
        assert out.index is not None
        self.low.flat.op(code, inputs, (out.index,), self.name, options, **fields)
        return out

    def fixed(self, code: str, x: Value, shape: tuple[int, ...], options: str | None = None,
              **fields: object) -> Value:
        """An op whose integer output grid TFLite fixes; requantized to ours when it differs."""
        want = self.out_q[0]
        x = self._saturating_input(code, x)
        if want is None or x.index is None:
            return self.emit(code, (x.index or 0,), self.output(0, shape, x.nhwc), options,
                             **fields)
        scale, zero = FIXED[code][0 if want.dtype == "int8" else 1]
        grid = QParams(scale=np.array([scale], np.float32), zero=np.array([zero], want.zero.dtype),
                       dtype=want.dtype)
        return self.onto(code, (x.index,), grid, shape, x.nhwc, options, **fields)

    def onto(self, code: str, inputs: tuple[int, ...], grid: QParams | None,
             shape: tuple[int, ...], nhwc: bool, options: str | None = None,
             **fields: object) -> Value:
        """An op whose TFLite integer kernel writes ``grid`` whatever its output tensor says
        (AVERAGE_POOL_2D averages its input's codes without rescaling; LOGISTIC, TANH and
        SOFTMAX have fixed grids): written onto ``grid``, then a QUANTIZE onto the output's
        grid when that differs."""
        want = self.out_q[0]
        if want is None or grid is None or grid.same(want):
            return self.emit(code, inputs, self.output(0, shape, nhwc), options, **fields)
        mid = self.scratch(code.lower(), shape, grid, nhwc)
        self.emit(code, inputs, mid, options, **fields)
        return self.emit("QUANTIZE", (mid.index or 0,), self.output(0, shape, nhwc))

    def scratch(self, tag: str, shape: tuple[int, ...], grid: QParams | None,
                nhwc: bool) -> Value:
        """A new intermediate tensor of this node (float when ``grid`` is None)."""
        made = Value(shape=shape, q=grid, nhwc=nhwc and len(shape) == 4)
        index = self.low.tensor(f"{self.out_names[0]}_{tag}", self.low.tflite_shape(made), grid)
        return Value(shape=shape, index=index, q=grid, nhwc=made.nhwc)

    def on_grid(self, value: Value, grid: QParams) -> Value:
        """An integer ``value`` requantized onto ``grid`` (a QUANTIZE) when it is on another."""
        if value.q is None or value.index is None or value.q.same(grid):
            return value
        moved = Value(shape=value.shape, q=grid, nhwc=value.nhwc)
        index = self.low.tensor(f"{self.low.flat.tensors[value.index].name}_{self.name}",
                                self.low.tflite_shape(moved), grid)
        self.low.flat.op("QUANTIZE", (value.index,), (index,), self.name)
        return Value(shape=value.shape, index=index, q=grid, nhwc=value.nhwc)


    def _saturating_input(self, code: str, x: Value) -> Value:
        """An int16 LOGISTIC/TANH input requantized onto [-16, 16) when its grid is wider.

        TFLite's int16 kernels overflow for input scales of about 10 and more (measured: a
        TANH at input scale 10 is off by 2.0); both functions are flat to within an output
        step beyond |x| = 16, so the saturating requantization changes no result."""
        if (code not in ("LOGISTIC", "TANH") or x.q is None or x.q.dtype != "int16"
                or x.index is None or float(x.q.scale.max()) <= _SATURATE / 32768):
            return x
        grid = QParams(scale=np.array([_SATURATE / 32768], np.float32),
                       zero=np.zeros(1, np.int64), dtype="int16")
        narrow = Value(shape=x.shape, q=grid, nhwc=x.nhwc)
        index = self.low.tensor(f"{self.low.flat.tensors[x.index].name}_sat",
                                self.low.tflite_shape(narrow), grid)
        self.low.flat.op("QUANTIZE", (x.index,), (index,), self.name)
        return Value(shape=x.shape, index=index, q=grid, nhwc=x.nhwc)


Writer = Callable[[Node], "list[Value] | None"]


def lower_qdq(low: Lowering, node: onnx.NodeProto) -> None:
    """DequantizeLinear: a quantized constant, or the integer tensor it reads; QuantizeLinear:
    an alias when the value is already on its grid, else a QUANTIZE operator."""
    q = low.qparams(node)
    src, out = node.input[0], node.output[0]
    if src not in low.inits and src not in low.values and low.unsupported:
        return  # its producer has no TFLite equivalent: lower() names it and stops
    if node.op_type == "DequantizeLinear":
        if src in low.inits:
            codes = low.inits[src]
            low.values[out] = Value(shape=codes.shape, codes=codes, q=q)
        else:
            low.values[out] = low.values[src]
        return
    if node.name in low.fused:
        return
    if src not in low.values and src in low.inits:  # folded: e.g. a static length's positions
        array = low.inits[src]
        low.values[out] = Value(shape=array.shape, codes=quantize(array, q), q=q)
        return
    if src not in low.values:  # a producer the writer passed over without writing a value
        low.refuse(node, f"its input {src!r} was not written: its producer has no lowering")
        return
    value = low.values[src]
    if value.constant:
        low.values[out] = Value(shape=value.shape, codes=quantize(value.real(), q), q=q)
    elif value.q is not None and value.q.same(q):
        low.values[out] = value
    else:
        assert value.index is not None
        target = Value(shape=value.shape, q=q, nhwc=value.nhwc)
        index = low.tensor(out, low.tflite_shape(target), q)
        low.flat.op("QUANTIZE", (value.index,), (index,), node.name)
        low.values[out] = Value(shape=value.shape, index=index, q=q, nhwc=value.nhwc)


def _input(low: Lowering, tensor: str) -> Value | None:
    """A node input: a value written so far, or a plain initializer (shapes, indices, float
    parameters of a node the assignment keeps float); None for an omitted optional input."""
    if not tensor:
        return None
    if tensor in low.values:
        return low.values[tensor]
    if tensor in low.inits:
        array = low.inits[tensor]
        return Value(shape=array.shape, array=array.astype(np.float32)
                     if array.dtype.kind == "f" else array)
    raise _Refused(f"input '{tensor}' is neither computed before the node nor an initializer")


def limits(dtype: str) -> tuple[int, int]:
    """The integer range of ``dtype``."""
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def quantize(real: np.ndarray, q: QParams) -> np.ndarray:
    """Codes of ``real`` on ``q``, as QuantizeLinear computes them (round half to even,
    saturate)."""
    codes: np.ndarray = np.clip(np.round(real / q.scale) + q.zero, *limits(q.dtype)).astype(
        q.dtype)
    return codes


def _fused_grids(low: Lowering, node: onnx.NodeProto, outputs: Set[str]
                 ) -> list[onnx.NodeProto] | None:
    """The QuantizeLinear reading each output, when each output has exactly one reader and it
    is one; else None (the node is written float)."""
    found = []
    for out in node.output:
        readers = low.consumers.get(out, [])
        if out in outputs or len(readers) != 1 or readers[0].op_type != "QuantizeLinear":
            return None
        found.append(readers[0])
    return found


def lower_node(low: Lowering, node: onnx.NodeProto, outputs: Set[str]) -> None:
    """Write ``node`` (see the module docstring); records its outputs in ``low.values``."""
    from mpsearch.targets._tflite_extra import EXTRA_WRITERS
    from mpsearch.targets._tflite_moves import MOVE_WRITERS
    from mpsearch.targets._tflite_rnn import RNN_WRITERS
    from mpsearch.targets._tflite_writers import WRITERS

    writer = (EXTRA_WRITERS.get(node.op_type) or WRITERS.get(node.op_type)
              or MOVE_WRITERS.get(node.op_type) or RNN_WRITERS.get(node.op_type))
    if writer is None:
        low.refuse(node, "no TFLite builtin operator is written for this op type")
        return
    try:
        ins = [_input(low, t) for t in node.input]
    except _Refused as e:
        low.refuse(node, str(e))
        return
    activations = [v for v in ins if v is not None and not v.constant]
    quantized_in = bool(activations) and all(v.q is not None for v in activations)
    if node.op_type in MOVES:
        grid = activations[0].q if activations else None
        ctx = Node(low, node, ins, [grid] * len(node.output), list(node.output))
        _record(low, node, ctx, writer, list(node.output))
        return
    float_constant = node.op_type in CONSTANT_OPERANDS and any(
        v is not None and v.constant and v.codes is None for v in ins)
    readers = _fused_grids(low, node, outputs) if quantized_in and not float_constant else None
    if readers is None:
        ctx = Node(low, node, ins, [None] * len(node.output), list(node.output))
        _record(low, node, ctx, writer, list(node.output))
        return
    grids = [low.qparams(r) for r in readers]
    names = [r.output[0] for r in readers]
    wide = {v.q.dtype for v in activations if v.q is not None} | {g.dtype for g in grids}
    if (_mixed(low, node, writer, ins, grids, names) if len(wide) > 1  # one type a kernel
            else _record(low, node, Node(low, node, ins, list(grids), names), writer, names,
                         quiet=True)):
        low.fused.update(r.name for r in readers)
        return
    # no integer operator for it: float behind DEQUANTIZE, as ONNX Runtime computes the QDQ
    # node (the QuantizeLinear after it becomes QUANTIZE); Vela puts it on the CPU
    ctx = Node(low, node, ins, [None] * len(node.output), list(node.output))
    _record(low, node, ctx, writer, list(node.output))


def _mixed(low: Lowering, node: onnx.NodeProto, writer: Writer, ins: list[Value | None],
           grids: list[QParams], names: list[str]) -> bool:
    """A node whose integer inputs and outputs differ in type (an fp32 node between an int8
    producer and an int16 consumer): TFLite's kernels read and write one type, so the node is
    computed in int16. An int8 input is requantized exactly onto int16 (its codes times 128,
    zero point 0); an int8 output is computed onto int16 at 1/128 of its scale, then a
    QUANTIZE writes it (the int16 rounding is 128 times finer than the int8 one)."""
    def wide(q: QParams) -> QParams:
        return QParams(scale=(q.scale.astype(np.float64) / 128).astype(np.float32),
                       zero=np.zeros(q.scale.size, np.int64), dtype="int16")

    wider: list[Value | None] = []
    for v in ins:
        if v is None or v.constant or v.q is None or v.q.dtype == "int16" or v.index is None:
            wider.append(v)
            continue
        grid = wide(v.q)
        moved = Value(shape=v.shape, q=grid, nhwc=v.nhwc)
        index = low.tensor(f"{low.flat.tensors[v.index].name}_i16", low.tflite_shape(moved),
                           grid)
        low.flat.op("QUANTIZE", (v.index,), (index,), node.name)
        wider.append(Value(shape=v.shape, index=index, q=grid, nhwc=v.nhwc))
    mids = [g if g.dtype == "int16" else wide(g) for g in grids]
    inner = [n if g.dtype == "int16" else f"{n}__i16" for n, g in zip(names, grids, strict=True)]
    if not _record(low, node, Node(low, node, wider, list(mids), inner), writer, inner,
                   quiet=True):
        return False
    for name, mid, grid in zip(names, inner, grids, strict=True):
        if name == mid or mid not in low.values:
            continue
        value = low.values.pop(mid)
        out = Value(shape=value.shape, q=grid, nhwc=value.nhwc)
        index = low.tensor(name, low.tflite_shape(out), grid)
        low.flat.op("QUANTIZE", (value.index or 0,), (index,), node.name)
        low.values[name] = Value(shape=value.shape, index=index, q=grid, nhwc=value.nhwc)
    return True


def lower_gelu(low: Lowering, div: onnx.NodeProto, gelu: Gelu, outputs: Set[str]) -> None:
    """One GELU operator for a matched erf pattern (:mod:`._gelu`): integer from the
    input's grid to the QuantizeLinear after the pattern, else float."""
    x = low.values.get(gelu.x)
    if x is None:
        low.refuse(div, f"its input {gelu.x!r} was not written: its producer has no lowering")
        return
    if x.constant:
        low.refuse(div, "GELU of a constant")
        return
    readers = low.consumers.get(gelu.output, [])
    single_q = (len(readers) == 1 and readers[0].op_type == "QuantizeLinear"
                and gelu.output not in outputs)
    if x.q is not None and single_q:
        grid, name = low.qparams(readers[0]), readers[0].output[0]
        low.fused.add(readers[0].name)
    else:
        grid, name = None, gelu.output
    n = Node(low, div, [x], [grid], [name])
    value = n.x(0)
    out = n.emit("GELU", (value.index or 0,), n.output(0, value.shape, value.nhwc),
                 "GeluOptions", approximate=False)
    low.flat.ops[-1].also = gelu.nodes[1:]
    low.values[name] = out


def _record(low: Lowering, node: onnx.NodeProto, ctx: Node, writer: Writer,
            names: list[str], *, quiet: bool = False) -> bool:
    """Write ``node`` with ``writer``; a refusal is recorded unless ``quiet`` (the caller then
    writes the node otherwise)."""
    try:
        made = writer(ctx)
    except _Refused as e:
        if not quiet:
            low.refuse(node, str(e))
        return False
    for name, value in zip(names, made or [], strict=False):
        low.values[name] = value
    return True


class _Refused(Exception):
    """A writer cannot express this node (the message says why)."""


def refuse(why: str) -> _Refused:
    return _Refused(why)


def nhwc_const(array: np.ndarray, rank: int, nhwc: bool) -> np.ndarray:
    """A broadcast constant reshaped to ``rank`` dimensions, transposed when the other operand
    is NHWC."""
    full = array.reshape((1,) * (rank - array.ndim) + array.shape)
    return np.ascontiguousarray(full.transpose(TO_NHWC)) if nhwc and rank == 4 else full

