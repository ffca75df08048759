"""The writers: one function per ONNX op type, each emitting TFLite operators for one node.

A writer gets a :class:`~._tflite_ops.Node` (inputs as values, outputs' grids) and returns
the output values; it raises :func:`~._tflite_ops.refuse` with the reason when TFLite has no
builtin for what the node asks. Weights are transposed to TFLite's layouts here (CONV_2D: OHWI,
DEPTHWISE_CONV_2D: 1HWO, FULLY_CONNECTED: (out, in)).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from mpsearch.graph import default_opset
from mpsearch.targets._tflite_lower import QParams, Value
from mpsearch.targets._tflite_ops import Node, limits, nhwc_const, quantize, refuse

__all__ = ["WRITERS"]

_NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}
SAME, VALID = 0, 1


def _i32(n: Node, tag: str, values: object) -> int:
    return n.low.const(f"{n.name}_{tag}", np.asarray(values, np.int32))


def _axis(axis: int, rank: int, nhwc: bool) -> int:
    axis = axis + rank if axis < 0 else axis
    return _NHWC_AXIS[axis] if nhwc and rank == 4 else axis


def _out_shape(n: Node, i: int = 0) -> tuple[int, ...]:
    return n.low.shape_of(n.proto.output[i])


def _padding(n: Node, x: Value, kernel: list[int], strides: list[int], dil: list[int]
             ) -> tuple[int, list[int]]:
    """(TFLite padding, explicit pads [t, l, b, r] still to apply: zeros when none)."""
    pads = n.ints("pads", [0, 0, 0, 0])
    auto = n.attr("auto_pad", b"NOTSET")
    if auto in (b"VALID",) or not any(pads) and auto in (b"NOTSET", None):
        return VALID, [0, 0, 0, 0]
    begin, end = [], []
    for size, k, s, d in zip(x.shape[2:], kernel, strides, dil, strict=True):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        begin.append(total // 2)
        end.append(total - total // 2)
    if auto == b"SAME_UPPER" or pads == begin + end:
        return SAME, [0, 0, 0, 0]
    if auto == b"SAME_LOWER":
        raise refuse("auto_pad SAME_LOWER has no TFLite padding")
    return VALID, pads


def _pad(n: Node, x: Value, pads: list[int]) -> Value:
    """An explicit PAD (zero in real terms: TFLite pads integer tensors with the zero point)."""
    if not any(pads):
        return x
    t, left, b, r = pads
    shape = (x.shape[0], x.shape[1], x.shape[2] + t + b, x.shape[3] + left + r)
    padded = Value(shape=shape, q=x.q, nhwc=True)
    index = n.low.tensor(f"{n.name}_padded", n.low.tflite_shape(padded), x.q)
    assert x.index is not None
    n.low.flat.op("PAD", (x.index, _i32(n, "pads", [[0, 0], [t, b], [left, r], [0, 0]])),
                  (index,), n.name)
    return Value(shape=shape, index=index, q=x.q, nhwc=True)


def _weight(n: Node, i: int) -> tuple[np.ndarray, QParams | None]:
    w = n.ins[i]
    if w is None or not w.constant:
        raise refuse("the weight is not a constant")
    if n.quantized:
        if w.codes is None or w.q is None:
            raise refuse("the weight is float in an integer node")
        return w.codes, w.q
    return w.real().astype(np.float32), None


def _regrid(q: QParams | None, axis: int) -> QParams | None:
    if q is None:
        return None
    return QParams(scale=q.scale.reshape(-1), zero=np.zeros(q.scale.size, np.int64),
                   dtype=q.dtype, axis=axis if q.scale.size > 1 else None)


def _bias(n: Node, x: Value, i: int, wq: QParams | None, channels: int) -> int:
    value = n.ins[i] if i < len(n.ins) else None
    if not n.quantized:
        arr = np.zeros(channels, np.float32) if value is None else value.real()
        return n.low.const(f"{n.name}_bias", arr.reshape(-1).astype(np.float32))
    assert x.q is not None and wq is not None
    wide = np.int64 if x.q.dtype == "int16" else np.int32  # 16x8 kernels take 64-bit biases
    scale = (x.q.scale.astype(np.float64) * wq.scale.astype(np.float64)).reshape(-1)
    if value is None:
        codes = np.zeros(channels, wide)
    elif value.codes is None or value.codes.dtype != np.int32:
        raise refuse("the bias is not stored as int32 codes")
    else:
        codes = value.codes.reshape(-1).astype(wide)
    grid = QParams(scale=np.broadcast_to(scale, (channels,)).astype(np.float32)
                   if scale.size > 1 else scale.astype(np.float32),
                   zero=np.zeros(channels if scale.size > 1 else 1, np.int64),
                   dtype=str(np.dtype(wide)), axis=0 if scale.size > 1 else None)
    return n.low.const(f"{n.name}_bias", codes, grid)


def _conv(n: Node) -> list[Value]:
    codes, wq = _weight(n, 1)
    if codes.ndim != 4:
        raise refuse(f"a {codes.ndim - 2}-D convolution has no TFLite builtin written here")
    x = n.x(0, nhwc=True)
    group, channels = n.integer("group", 1), x.shape[1]
    strides, dil = n.ints("strides", [1, 1]), n.ints("dilations", [1, 1])
    mode, pads = _padding(n, x, list(codes.shape[2:]), strides, dil)
    x = _pad(n, x, pads)
    out = n.output(0, _out_shape(n), nhwc=True)
    common = dict(padding=mode, stride_w=strides[1], stride_h=strides[0],
                  dilation_w_factor=dil[1], dilation_h_factor=dil[0],
                  fused_activation_function=0)
    if group == 1:
        w = n.low.const(f"{n.name}_w", np.ascontiguousarray(codes.transpose(0, 2, 3, 1)),
                        _regrid(wq, 0))
        b = _bias(n, x, 2, wq, codes.shape[0])
        return [n.emit("CONV_2D", (x.index or 0, w, b), out, "Conv2DOptions", **common)]
    if group == channels and codes.shape[0] % channels == 0:
        w = n.low.const(f"{n.name}_w", np.ascontiguousarray(codes.transpose(1, 2, 3, 0)),
                        _regrid(wq, 3))
        b = _bias(n, x, 2, wq, codes.shape[0])
        return [n.emit("DEPTHWISE_CONV_2D", (x.index or 0, w, b), out,
                       "DepthwiseConv2DOptions", depth_multiplier=codes.shape[0] // channels,
                       **common)]
    raise refuse(f"grouped convolution (group={group}) has no TFLite builtin")


def _fully_connected(n: Node, x: Value, codes: np.ndarray, wq: QParams | None,
                     bias: int | None, keep: bool) -> list[Value]:
    w = n.low.const(f"{n.name}_w", np.ascontiguousarray(codes), _regrid(wq, 0))
    b = _bias(n, x, 2, wq, codes.shape[0]) if bias is None else bias
    out = n.output(0, _out_shape(n))
    return [n.emit("FULLY_CONNECTED", (x.index or 0, w, b), out, "FullyConnectedOptions",
                   fused_activation_function=0, keep_num_dims=keep)]


def _per_axis(wq: QParams | None, axis: int) -> bool:
    return wq is not None and wq.scale.size > 1 and wq.axis != axis


def _gemm(n: Node) -> list[Value]:
    if n.attr("transA", 0) or n.number("alpha", 1.0) != 1.0 or n.number("beta", 1.0) != 1.0:
        raise refuse("Gemm with transA or alpha/beta != 1 has no FULLY_CONNECTED form")
    codes, wq = _weight(n, 1)
    if not n.attr("transB", 0):
        codes = codes.T
        wq = wq if wq is None or wq.scale.size == 1 else QParams(
            scale=wq.scale, zero=wq.zero, dtype=wq.dtype, axis=0 if wq.axis == 1 else 1)
    if _per_axis(wq, 0):
        raise refuse("per-channel weight scales along the input dimension")
    return _fully_connected(n, n.x(0, nhwc=False), codes, wq, None, keep=False)


def _matmul(n: Node) -> list[Value]:
    other = n.ins[1]
    if other is not None and other.constant and len(other.shape) == 2:
        codes, wq = _weight(n, 1)
        wq = wq if wq is None or wq.scale.size == 1 else QParams(
            scale=wq.scale, zero=wq.zero, dtype=wq.dtype, axis=0 if wq.axis == 1 else 1)
        if _per_axis(wq, 0):
            raise refuse("per-channel weight scales along the input dimension")
        x = n.x(0, nhwc=False)
        b = _bias(n, x, 2, wq, codes.shape[1])
        return _fully_connected(n, x, codes.T, wq, b, keep=True)
    a, b2 = n.x(0, nhwc=False), n.x(1, nhwc=False)
    return [n.emit("BATCH_MATMUL", (a.index or 0, b2.index or 0), n.output(0, _out_shape(n)),
                   "BatchMatMulOptions", adj_x=False, adj_y=False)]


def _elementwise(code: str, options: str | None = None, *, on_output_grid: bool = False,
                 **fields: object) -> Callable[[Node], list[Value]]:
    """A broadcasting elementwise operator. ``on_output_grid``: an integer node reads every
    input on the output's grid (activations on another grid requantized onto it, constants'
    codes computed on it), for kernels that compare and copy codes without rescaling."""
    def write(n: Node) -> list[Value]:
        shape = _out_shape(n)
        acts = [v for v in n.ins if v is not None and not v.constant]
        nhwc = len(shape) == 4 and any(v.nhwc for v in acts)
        if nhwc and any(len(v.shape) != 4 for v in acts):
            raise refuse("broadcast between a rank-4 tensor and a lower-rank one")
        grid = n.out_q[0] if on_output_grid else None
        inputs = []
        for i, v in enumerate(n.ins):
            if v is None:
                continue
            if not v.constant:
                x = n.x(i, nhwc=nhwc if len(v.shape) == 4 else None)
                inputs.append((x if grid is None else n.on_grid(x, grid)).index or 0)
            elif grid is not None:
                inputs.append(n.low.const(f"{n.name}_k{i}", nhwc_const(
                    quantize(v.real(), grid), len(shape), nhwc), grid))
            elif n.quantized:
                if v.codes is None or v.q is None:
                    raise refuse("a float constant in an integer node")
                inputs.append(n.low.const(f"{n.name}_k{i}", nhwc_const(v.codes, len(shape),
                                                                         nhwc), v.q))
            else:
                inputs.append(n.low.const(f"{n.name}_k{i}", nhwc_const(
                    v.real().astype(np.float32), len(shape), nhwc)))
        return [n.emit(code, tuple(inputs), n.output(0, shape, nhwc), options, **fields)]
    return write


def _extremum(code: str) -> Callable[[Node], list[Value]]:
    """MAXIMUM / MINIMUM. TFLite's integer kernels compare and copy codes without rescaling,
    so an integer node reads every input on the output's grid. The one rounding per value is
    ONNX Runtime's QuantizeLinear after the float extremum (rounding is monotonic)."""
    return _elementwise(code, on_output_grid=True)


def _unary(code: str, options: str | None = None, **fields: object
           ) -> Callable[[Node], list[Value]]:
    def write(n: Node) -> list[Value]:
        x = n.x(0)
        if code in ("LOGISTIC", "TANH"):
            return [n.fixed(code, x, x.shape)]
        return [n.emit(code, (x.index or 0,), n.output(0, x.shape, x.nhwc), options, **fields)]
    return write


def _gelu(n: Node) -> list[Value]:
    approximate = n.attr("approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    return _unary("GELU", "GeluOptions", approximate=approximate == "tanh")(n)


def _softmax(n: Node) -> list[Value]:
    """SOFTMAX works on the last axis: another axis (YOLOv8's DFL) is moved there and back
    by TRANSPOSEs, which move values without computing them."""
    x = n.x(0, nhwc=False)
    rank = len(x.shape)
    axis = _axis(n.integer("axis", -1), rank, False)
    if axis == rank - 1:
        return [n.fixed("SOFTMAX", x, x.shape, "SoftmaxOptions", beta=1.0)]
    if default_opset(n.low.model) < 13:
        raise refuse("Softmax over an axis other than the last before opset 13 (which "
                     "flattens the axes after it)")
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    shape = tuple(x.shape[p] for p in perm)
    moved = n.emit("TRANSPOSE", (x.index or 0, _i32(n, "to_last", perm)),
                   n.scratch("to_last", shape, x.q, False))
    last = Node(n.low, n.proto, n.ins, n.out_q, [f"{n.out_names[0]}_last"])
    y = last.fixed("SOFTMAX", moved, shape, "SoftmaxOptions", beta=1.0)
    return [n.emit("TRANSPOSE", (y.index or 0, _i32(n, "back", perm)), n.output(0, x.shape))]



def _mean(n: Node, x: Value, axes: list[int], keep: bool, code: str = "MEAN") -> list[Value]:
    rank = len(x.shape)
    axes = sorted(a + rank if a < 0 else a for a in axes)
    if x.nhwc and not keep and axes != [2, 3]:
        x = n.x(0, nhwc=False)
    mapped = [_axis(a, rank, x.nhwc) for a in axes]
    out = n.output(0, _out_shape(n), nhwc=x.nhwc and keep)
    return [n.emit(code, (x.index or 0, _i32(n, "axes", mapped)), out, "ReducerOptions",
                   keep_dims=keep)]


def _global_pool(n: Node) -> list[Value]:
    return _mean(n, n.x(0, nhwc=True), [2, 3], True)


def _reduce(code: str) -> Callable[[Node], list[Value]]:
    def write(n: Node) -> list[Value]:
        axes = n.ints("axes", [])
        given = n.const_array(1)
        if given is not None:
            axes = [int(a) for a in given.reshape(-1)]
        x = n.x(0)
        return _mean(n, x, axes or list(range(len(x.shape))), bool(n.integer("keepdims", 1)),
                     code)
    return write


def _reciprocal(n: Node) -> list[Value]:
    if n.quantized:
        raise refuse("integer Reciprocal has no TFLite builtin")
    x = n.x(0)
    one = n.low.const(f"{n.name}_one", np.ones((1,) * len(x.shape), np.float32))
    return [n.emit("DIV", (one, x.index or 0), n.output(0, x.shape, x.nhwc), "DivOptions",
                   fused_activation_function=0)]


def _hard_sigmoid(n: Node) -> list[Value]:
    """HardSigmoid, max(0, min(1, alpha * x + beta)), as MUL, ADD and a clamp (TFLite has no
    HARD_SIGMOID builtin). Integer: the MUL by alpha (code 1 on scale alpha) writes x's codes
    onto the grid (alpha * s_x, z_x), an exact relabelling, so the ADD of beta onto the output
    grid is the one rounding, as in ONNX Runtime's float HardSigmoid before its QuantizeLinear.
    The clamp is RELU_0_TO_1 on the output grid; int16, which TFLite's RELU_0_TO_1 does not
    take, clamps with the ADD's fused RELU and, when the grid reaches above 1, a MINIMUM with
    1's code (both exact: rounding is monotonic)."""
    alpha, beta = n.number("alpha", 0.2), n.number("beta", 0.5)
    x, want = n.x(0), n.out_q[0]
    rank, shape, nhwc = len(x.shape), x.shape, x.nhwc

    def k(tag: str, value: float, grid: QParams | None = None) -> int:
        kind = np.float32 if grid is None else np.dtype(grid.dtype)
        return n.low.const(f"{n.name}_{tag}", np.full((1,) * rank, value, kind), grid)

    add = {"fused_activation_function": 0, "pot_scale_int16": False}
    if x.q is None or want is None:
        scaled = n.emit("MUL", (x.index or 0, k("alpha", alpha)),
                        n.scratch("scaled", shape, None, nhwc), "MulOptions",
                        fused_activation_function=0)
        shifted = n.emit("ADD", (scaled.index or 0, k("beta", beta)),
                         n.scratch("shifted", shape, None, nhwc), "AddOptions", **add)
        return [n.emit("RELU_0_TO_1", (shifted.index or 0,), n.output(0, shape, nhwc))]
    if alpha <= 0 or x.q.dtype != want.dtype:
        raise refuse("integer HardSigmoid with alpha <= 0 or from one integer type to another")
    hi = limits(want.dtype)[1]

    def grid(scale: float, zero: np.ndarray | int = 0) -> QParams:
        return QParams(scale=np.array([scale], np.float32),
                       zero=np.asarray(zero, np.int64).reshape(-1), dtype=want.dtype)

    relabelled = grid(float(x.q.scale.reshape(-1)[0]) * alpha, x.q.zero)
    scaled = n.emit("MUL", (x.index or 0, k("alpha", 1, grid(alpha))),
                    n.scratch("scaled", shape, relabelled, nhwc), "MulOptions",
                    fused_activation_function=0)
    beta_k = k("beta", float(np.sign(beta) * hi), grid(abs(beta) / hi if beta else alpha))
    if want.dtype != "int16":
        shifted = n.emit("ADD", (scaled.index or 0, beta_k),
                         n.scratch("shifted", shape, want, nhwc), "AddOptions", **add)
        return [n.emit("RELU_0_TO_1", (shifted.index or 0,), n.output(0, shape, nhwc))]
    one = int(quantize(np.ones(1), want)[0])
    if one >= hi:  # the grid ends at or below 1: saturation is the upper clamp
        return [n.emit("ADD", (scaled.index or 0, beta_k), n.output(0, shape, nhwc),
                       "AddOptions", **{**add, "fused_activation_function": 1})]
    shifted = n.emit("ADD", (scaled.index or 0, beta_k), n.scratch("shifted", shape, want, nhwc),
                     "AddOptions", **{**add, "fused_activation_function": 1})
    return [n.emit("MINIMUM", (shifted.index or 0, k("one", one, want)),
                   n.output(0, shape, nhwc))]


def _pool(code: str) -> Callable[[Node], list[Value]]:
    def write(n: Node) -> list[Value]:
        x = n.x(0, nhwc=True)
        kernel, strides = n.ints("kernel_shape", [1, 1]), n.ints("strides", [1, 1])
        if n.ints("dilations", [1, 1]) != [1, 1] or n.attr("ceil_mode", 0):
            raise refuse("pooling with dilations or ceil_mode")
        mode, pads = _padding(n, x, kernel, strides, [1, 1])
        if any(pads) or (code == "AVERAGE_POOL_2D" and mode == SAME
                         and n.attr("count_include_pad", 0)):
            raise refuse("pooling pads that TFLite's SAME/VALID cannot express")
        return [n.onto(code, (x.index or 0,), x.q, _out_shape(n), True, "Pool2DOptions",
                       padding=mode, stride_w=strides[1], stride_h=strides[0],
                       filter_width=kernel[1], filter_height=kernel[0],
                       fused_activation_function=0)]
    return write


WRITERS: dict[str, Callable[[Node], list[Value]]] = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul,
    "Add": _elementwise("ADD", "AddOptions", fused_activation_function=0, pot_scale_int16=False),
    "Sub": _elementwise("SUB", "SubOptions", fused_activation_function=0, pot_scale_int16=False),
    "Mul": _elementwise("MUL", "MulOptions", fused_activation_function=0),
    "Div": _elementwise("DIV", "DivOptions", fused_activation_function=0),
    "Max": _extremum("MAXIMUM"), "Min": _extremum("MINIMUM"),
    "Relu": _unary("RELU"), "Sigmoid": _unary("LOGISTIC"),
    "Tanh": _unary("TANH"), "Gelu": _gelu,
    "HardSigmoid": _hard_sigmoid,
    "Exp": _unary("EXP"),
    "Abs": _unary("ABS"), "Sqrt": _unary("SQRT"),
    "Softmax": _softmax, "GlobalAveragePool": _global_pool, "ReduceMean": _reduce("MEAN"),
    "ReduceSum": _reduce("SUM"), "Reciprocal": _reciprocal,
    "AveragePool": _pool("AVERAGE_POOL_2D"), "MaxPool": _pool("MAX_POOL_2D"),
    "LeakyRelu": lambda n: _unary("LEAKY_RELU", "LeakyReluOptions",
                                  alpha=n.number("alpha", 0.01))(n),
}
