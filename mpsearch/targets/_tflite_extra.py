"""More writers: ConvTranspose, Resize, PRelu, Pow, Erf, float BatchNormalization and
ReduceL2, float HardSwish and Clip bounds TFLite has no activation for (or no int16 kernel of).

Each is a TFLite builtin, or an exact decomposition into builtins: float HARD_SWISH, which Vela
5.2.0 cannot parse, is x * relu6(x + 3) / 6; Clip is MAXIMUM and MINIMUM on the output's grid
(one rounding, as ONNX Runtime's float Clip before its QuantizeLinear: rounding is monotonic);
Erf, which TFLite lacks, is Abramowitz and Stegun 7.1.26 in float32 operators (largest error
1.5e-7, below float32's step near 1).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import NodeProto, helper

from mpsearch.targets._tflite_lower import QParams, Value
from mpsearch.targets._tflite_ops import Node, nhwc_const, quantize, refuse
from mpsearch.targets._tflite_writers import _bias, _conv, _out_shape, _regrid, _unary, _weight

__all__ = ["EXTRA_WRITERS"]

VALID = 1
#: Abramowitz and Stegun 7.1.26: erf(x) = 1 - t (a1 + t (a2 + ...)) exp(-x^2), t = 1/(1 + p x).
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _k(n: Node, tag: str, value: float, rank: int, grid: QParams | None = None) -> int:
    kind = np.float32 if grid is None else np.dtype(grid.dtype)
    array = np.full((1,) * rank, value, kind)
    return n.low.const(f"{n.name}_{tag}", array, grid)


def _conv_transpose(n: Node) -> list[Value]:
    """TRANSPOSE_CONV (weights OHWI from ONNX's (in, out, kH, kW)), no padding or groups."""
    codes, wq = _weight(n, 1)
    if codes.ndim != 4 or n.integer("group", 1) != 1:
        raise refuse("ConvTranspose other than 2-D with group 1")
    if any(n.ints("pads", [0, 0, 0, 0])) or any(n.ints("output_padding", [0, 0])) or n.ints(
            "dilations", [1, 1]) != [1, 1] or n.attr("auto_pad", b"NOTSET") != b"NOTSET":
        raise refuse("ConvTranspose with pads, output_padding, dilations or auto_pad")
    if wq is not None and wq.scale.size > 1 and wq.axis != 1:
        raise refuse("per-channel ConvTranspose weights not along the output channels")
    x = n.x(0, nhwc=True)
    strides = n.ints("strides", [1, 1])
    shape = _out_shape(n)
    w = n.low.const(f"{n.name}_w", np.ascontiguousarray(codes.transpose(1, 2, 3, 0)),
                    None if wq is None else _regrid(wq, 0))
    b = _bias(n, x, 2, wq, codes.shape[1])
    size = n.low.const(f"{n.name}_size", np.array([shape[0], shape[2], shape[3], shape[1]],
                                                  np.int32))
    return [n.emit("TRANSPOSE_CONV", (size, w, x.index or 0, b), n.output(0, shape, True),
                   "TransposeConvOptions", padding=VALID, stride_w=strides[1],
                   stride_h=strides[0], fused_activation_function=0)]


def _resize(n: Node) -> list[Value]:
    """RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR of H and W; the integer kernels move or
    interpolate codes on the input's grid (a QUANTIZE follows when the output's differs)."""
    x = n.x(0, nhwc=True)
    shape = _out_shape(n)
    if len(shape) != 4 or shape[:2] != x.shape[:2]:
        raise refuse("Resize of other than the two spatial dimensions of a 4-D tensor")
    mode = n.attr("mode", b"nearest")
    transform = n.attr("coordinate_transformation_mode", b"half_pixel")
    size = n.low.const(f"{n.name}_size", np.array(shape[2:], np.int32))
    if mode == b"nearest":
        whole = all(o % i == 0 for o, i in zip(shape[2:], x.shape[2:], strict=True))
        floor = transform == b"asymmetric" and n.attr("nearest_mode", b"round_prefer_floor") in (
            b"floor",)
        if not (floor or (whole and transform in (b"half_pixel", b"asymmetric")
                          and n.attr("nearest_mode", b"round_prefer_floor")
                          == b"round_prefer_floor")):
            raise refuse("nearest Resize other than whole upscaling or asymmetric floor")
        return [n.onto("RESIZE_NEAREST_NEIGHBOR", (x.index or 0, size), x.q, shape, True,
                       "ResizeNearestNeighborOptions", align_corners=False,
                       half_pixel_centers=False)]
    if mode == b"linear" and transform in (b"half_pixel", b"asymmetric", b"align_corners"):
        return [n.onto("RESIZE_BILINEAR", (x.index or 0, size), x.q, shape, True,
                       "ResizeBilinearOptions", align_corners=transform == b"align_corners",
                       half_pixel_centers=transform == b"half_pixel")]
    raise refuse(f"Resize mode {mode!r} with {transform!r} has no TFLite builtin")


def _prelu(n: Node) -> list[Value]:
    x = n.x(0)
    slope = n.ins[1]
    if slope is None or not slope.constant:
        raise refuse("PRelu with a computed slope")
    rank = len(x.shape)
    if n.quantized:
        if slope.codes is None or slope.q is None or slope.q.scale.size != 1:
            raise refuse("integer PRelu needs a per-tensor quantized slope")
        alpha = n.low.const(f"{n.name}_slope", nhwc_const(slope.codes, rank, x.nhwc), slope.q)
    else:
        alpha = n.low.const(f"{n.name}_slope", nhwc_const(
            slope.real().astype(np.float32), rank, x.nhwc))
    return [n.emit("PRELU", (x.index or 0, alpha), n.output(0, x.shape, x.nhwc))]


def _hard_swish(n: Node) -> list[Value]:
    """Integer: HARD_SWISH (int8: Vela 5.2.0 cannot parse an int16 one, which is then written
    float). Float: x * relu6(x + 3) / 6 (Vela cannot parse a float HARD_SWISH either)."""
    if n.quantized:
        x = n.ins[0]
        if (x is not None and x.q is not None and x.q.dtype == "int16") or (
                n.out_q[0] is not None and n.out_q[0].dtype == "int16"):
            raise refuse("Vela 5.2.0 cannot parse an int16 HARD_SWISH")
        return _unary("HARD_SWISH")(n)
    x = n.x(0)
    shape, nhwc, rank = x.shape, x.nhwc, len(x.shape)
    add = n.emit("ADD", (x.index or 0, _k(n, "three", 3.0, rank)),
                 n.scratch("plus3", shape, None, nhwc), "AddOptions",
                 fused_activation_function=3, pot_scale_int16=False)  # RELU6
    gated = n.emit("MUL", (x.index or 0, add.index or 0), n.scratch("gated", shape, None, nhwc),
                   "MulOptions", fused_activation_function=0)
    return [n.emit("MUL", (gated.index or 0, _k(n, "sixth", 1.0 / 6.0, rank)),
                   n.output(0, shape, nhwc), "MulOptions", fused_activation_function=0)]


def _clip(n: Node) -> list[Value]:
    """RELU / RELU6 / RELU_N1_TO_1 / RELU_0_TO_1 where TFLite has the kernel (int16 has only
    RELU and RELU6), else MAXIMUM and MINIMUM with the bounds on the output's grid."""
    lo, hi = n.const_array(1), n.const_array(2)
    bounds: tuple[float | None, float | None] = (None if lo is None else float(lo),
                                                 None if hi is None else float(hi))
    codes: dict[tuple[float | None, float | None], str] = {
        (0.0, None): "RELU", (0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1",
        (0.0, 1.0): "RELU_0_TO_1"}
    want = n.out_q[0]
    code = codes.get(bounds)
    if code is not None and (want is None or want.dtype != "int16" or code in ("RELU",
                                                                                "RELU6")):
        return _unary(code)(n)
    x = n.x(0)
    if want is not None:
        x = n.on_grid(x, want)
    rank, value = len(x.shape), x
    for i, (bound, op) in enumerate(zip(bounds, ("MAXIMUM", "MINIMUM"), strict=True)):
        if bound is None:
            continue
        k = (_k(n, op.lower(), bound, rank) if want is None else n.low.const(
            f"{n.name}_{op.lower()}", quantize(np.full((1,) * rank, bound), want), want))
        last = i == 1 or bounds[1] is None
        out = (n.output(0, x.shape, x.nhwc) if last
               else n.scratch(op.lower(), x.shape, want, x.nhwc))
        value = n.emit(op, (value.index or 0, k), out)
    if value is x:
        return _unary("RELU")(n) if bounds == (None, None) else [value]
    return [value]


def _pow(n: Node) -> list[Value]:
    """POW (float); an integer square is MUL(x, x), which TFLite rescales onto the output."""
    exponent = n.const_array(1)
    x = n.x(0)
    if n.quantized:
        if exponent is None or exponent.size != 1 or float(exponent.reshape(-1)[0]) != 2.0:
            raise refuse("integer Pow other than a square")
        return [n.emit("MUL", (x.index or 0, x.index or 0), n.output(0, x.shape, x.nhwc),
                       "MulOptions", fused_activation_function=0)]
    if exponent is None:
        e = n.x(1)
        if e.nhwc != x.nhwc and len(e.shape) == 4:
            raise refuse("Pow of two tensors in different layouts")
        power = e.index or 0
    else:
        power = n.low.const(f"{n.name}_exp", nhwc_const(exponent.astype(np.float32),
                                                        len(x.shape), x.nhwc))
    return [n.emit("POW", (x.index or 0, power), n.output(0, x.shape, x.nhwc))]


def _erf(n: Node) -> list[Value]:
    """Float Erf as Abramowitz and Stegun 7.1.26 (TFLite has no ERF; an integer one is not
    written: quantize around it)."""
    if n.quantized:
        raise refuse("integer Erf has no TFLite builtin (its float form is written)")
    x = n.x(0)
    shape, nhwc, rank = x.shape, x.nhwc, len(x.shape)

    def op(code: str, ins: tuple[int, ...], tag: str, options: str | None = None,
           **fields: object) -> int:
        return n.emit(code, ins, n.scratch(tag, shape, None, nhwc), options, **fields).index or 0

    mul = {"fused_activation_function": 0}
    add = {"fused_activation_function": 0, "pot_scale_int16": False}
    ax = op("ABS", (x.index or 0,), "abs")
    den = op("ADD", (op("MUL", (ax, _k(n, "p", _AS_P, rank)), "px", "MulOptions", **mul),
                     _k(n, "one", 1.0, rank)), "den", "AddOptions", **add)
    t = op("DIV", (_k(n, "one_n", 1.0, rank), den), "t", "DivOptions", **mul)
    poly = _k(n, "a5", _AS_A[4], rank)
    for i in (3, 2, 1, 0):
        poly = op("MUL", (poly, t), f"pt{i}", "MulOptions", **mul)
        poly = op("ADD", (poly, _k(n, f"a{i + 1}", _AS_A[i], rank)), f"pa{i}", "AddOptions",
                  **add)
    poly = op("MUL", (poly, t), "poly", "MulOptions", **mul)
    square = op("MUL", (x.index or 0, x.index or 0), "sq", "MulOptions", **mul)
    gauss = op("EXP", (op("NEG", (square,), "negsq"),), "gauss")
    tail = op("MUL", (poly, gauss), "tail", "MulOptions", **mul)
    magnitude = op("SUB", (_k(n, "one_s", 1.0, rank), tail), "mag", "SubOptions", **add)
    sign = op("SIGN", (x.index or 0,), "sign")
    return [n.emit("MUL", (magnitude, sign), n.output(0, shape, nhwc), "MulOptions", **mul)]


def _batch_norm(n: Node) -> list[Value]:
    """A BatchNormalization not folded into a convolution, float: MUL and ADD per channel."""
    if n.quantized:
        raise refuse("integer BatchNormalization (only its float form is written)")
    x = n.x(0)
    arrays = [n.const_array(i) for i in range(1, 5)]
    if any(a is None for a in arrays) or len(x.shape) < 2:
        raise refuse("BatchNormalization with computed statistics")
    gamma, beta, mean, var = (np.asarray(a, np.float64).reshape(-1) for a in arrays)
    scale = gamma / np.sqrt(var + n.number("epsilon", 1e-5))
    shift = beta - mean * scale
    rank, shape = len(x.shape), (-1,) + (1,) * (len(x.shape) - 2)

    def channel(tag: str, values: np.ndarray) -> int:
        return n.low.const(f"{n.name}_{tag}", nhwc_const(
            values.astype(np.float32).reshape(shape), rank, x.nhwc))

    mul = n.emit("MUL", (x.index or 0, channel("scale", scale)),
                 n.scratch("scaled", x.shape, None, x.nhwc), "MulOptions",
                 fused_activation_function=0)
    return [n.emit("ADD", (mul.index or 0, channel("shift", shift)),
                   n.output(0, x.shape, x.nhwc), "AddOptions", fused_activation_function=0,
                   pot_scale_int16=False)]


def _reduce_l2(n: Node) -> list[Value]:
    """Float ReduceL2 as SQRT(SUM(x * x))."""
    if n.quantized:
        raise refuse("integer ReduceL2 (only its float form is written)")
    x = n.x(0, nhwc=False)
    axes = n.ints("axes", [])
    given = n.const_array(1)
    if given is not None:
        axes = [int(a) for a in given.reshape(-1)]
    rank = len(x.shape)
    axes = sorted(a + rank if a < 0 else a for a in (axes or range(rank)))
    keep = bool(n.integer("keepdims", 1))
    square = n.emit("MUL", (x.index or 0, x.index or 0), n.scratch("sq", x.shape, None, False),
                    "MulOptions", fused_activation_function=0)
    shape = _out_shape(n)
    total = n.emit("SUM", (square.index or 0, n.low.const(f"{n.name}_axes",
                                                          np.array(axes, np.int32))),
                   n.scratch("sum", shape, None, False), "ReducerOptions", keep_dims=keep)
    return [n.emit("SQRT", (total.index or 0,), n.output(0, shape))]


def _neg(n: Node) -> list[Value]:
    """NEG, float only: TFLite's integer NEG negates codes without their zero point (measured:
    an int8 chain off by the whole output range), so an integer one is written float."""
    if n.quantized:
        raise refuse("TFLite's integer NEG ignores the zero point")
    return _unary("NEG")(n)


def _depth_space(code: str, options: str) -> Callable[[Node], list[Value]]:
    """DEPTH_TO_SPACE (ONNX's DCR mode) / SPACE_TO_DEPTH in NHWC, on the input's grid."""
    def write(n: Node) -> list[Value]:
        if n.attr("mode", b"DCR") != b"DCR":
            raise refuse("DepthToSpace in CRD mode has no TFLite builtin")
        x, shape = n.x(0, nhwc=True), _out_shape(n)
        size = {"block_size": n.integer("blocksize", 1)}
        if x.q is None or x.q.dtype != "int16":
            return [n.emit(code, (x.index or 0,), n.output(0, shape, True, dtype=n.kind(x)),
                           options, **size)]
        # TFLite has no int16 kernel: moved in float between a DEQUANTIZE and a QUANTIZE onto
        # the same grid (exact: the values are moved, not computed)
        moved = n.emit(code, (n.low.as_float(x, n.name).index or 0,),
                       n.scratch("moved", shape, None, True), options, **size)
        return [n.emit("QUANTIZE", (moved.index or 0,), n.output(0, shape, True))]
    return write


def _instance_norm(n: Node) -> list[Value]:
    """Float InstanceNormalization of a 4-D tensor as MEAN, SQUARED_DIFFERENCE, RSQRT, SUB,
    MUL and ADD over H and W (NHWC)."""
    if n.quantized:
        raise refuse("integer InstanceNormalization (only its float form is written)")
    x = n.x(0, nhwc=True)
    gamma, beta = n.const_array(1), n.const_array(2)
    if len(x.shape) != 4 or gamma is None or beta is None:
        raise refuse("InstanceNormalization of other than a 4-D tensor with constant scale")
    stat = (x.shape[0], x.shape[1], 1, 1)
    axes = n.low.const(f"{n.name}_axes", np.array([1, 2], np.int32))
    mul, add = {"fused_activation_function": 0}, {"fused_activation_function": 0,
                                                  "pot_scale_int16": False}

    def op(code: str, ins: tuple[int, ...], tag: str, shape: tuple[int, ...],
           options: str | None = None, **fields: object) -> int:
        return n.emit(code, ins, n.scratch(tag, shape, None, True), options, **fields).index or 0

    def channel(tag: str, values: np.ndarray) -> int:
        return n.low.const(f"{n.name}_{tag}", nhwc_const(
            values.astype(np.float32).reshape(-1, 1, 1), 4, True))

    xi = x.index or 0
    mean = op("MEAN", (xi, axes), "mean", stat, "ReducerOptions", keep_dims=True)
    var = op("MEAN", (op("SQUARED_DIFFERENCE", (xi, mean), "sq", x.shape), axes), "var", stat,
             "ReducerOptions", keep_dims=True)
    var = op("ADD", (var, _k(n, "eps", n.number("epsilon", 1e-5), 4)), "var_eps", stat,
             "AddOptions", **add)
    norm = op("MUL", (op("SUB", (xi, mean), "centred", x.shape, "SubOptions", **add),
                      op("RSQRT", (var,), "inv", stat)), "norm", x.shape, "MulOptions", **mul)
    scaled = op("MUL", (norm, channel("gamma", gamma)), "scaled", x.shape, "MulOptions", **mul)
    return [n.emit("ADD", (scaled, channel("beta", beta)), n.output(0, x.shape, True),
                   "AddOptions", **add)]


def _any_conv(n: Node) -> list[Value]:
    """A 1-D Conv as CONV_2D of height 1 between RESHAPEs; others as :func:`._conv`."""
    w = n.ins[1]
    if w is None or len(w.shape) != 3:
        return _conv(n)
    x = n.x(0, nhwc=False)
    (batch, channels, length), out = x.shape, _out_shape(n)
    four = n.low.tensor(f"{n.name}_in2d", (batch, channels, 1, length), x.q,
                        dtype=None if x.q is not None else n.kind(x))
    n.low.flat.op("RESHAPE", (x.index or 0, n.low.const(f"{n.name}_in2d_shape", np.array(
        [batch, channels, 1, length], np.int32))), (four,), n.name)
    weight = (Value(shape=(*w.shape[:2], 1, w.shape[2]), q=w.q,
                    codes=None if w.codes is None else w.codes[:, :, None, :],
                    array=None if w.array is None else w.array[:, :, None, :]))
    proto = NodeProto()
    proto.CopyFrom(n.proto)
    proto.output[0] = f"{n.out_names[0]}__2d"
    del proto.attribute[:]
    begin, end = n.ints("pads", [0, 0])
    ints = {"kernel_shape": [1, w.shape[2]], "strides": [1, *n.ints("strides", [1])],
            "dilations": [1, *n.ints("dilations", [1])], "pads": [0, begin, 0, end]}
    for key in ("kernel_shape", "strides", "dilations", "pads"):
        proto.attribute.append(helper.make_attribute(key, ints[key]))
    proto.attribute.append(helper.make_attribute("group", n.integer("group", 1)))
    auto = n.attr("auto_pad")
    if auto is not None:
        proto.attribute.append(helper.make_attribute("auto_pad", auto))
    n.low.values[proto.output[0]] = Value(shape=(out[0], out[1], 1, out[2]))  # its shape
    x4 = Value(shape=(batch, channels, 1, length), index=four, q=x.q)
    sub = Node(n.low, proto, [x4, weight, *n.ins[2:]], n.out_q, [proto.output[0]])
    y4 = n.low.relayout(_conv(sub)[0], False, n.name)
    del n.low.values[proto.output[0]]
    y = n.output(0, out)
    n.low.flat.op("RESHAPE", (y4.index or 0, n.low.const(f"{n.name}_out1d_shape", np.array(
        out, np.int32))), (y.index or 0,), n.name)
    return [y]


EXTRA_WRITERS: dict[str, Callable[[Node], list[Value]]] = {
    "Conv": _any_conv,
    "Neg": _neg, "DepthToSpace": _depth_space("DEPTH_TO_SPACE", "DepthToSpaceOptions"),
    "SpaceToDepth": _depth_space("SPACE_TO_DEPTH", "SpaceToDepthOptions"),
    "BatchNormalization": _batch_norm, "ReduceL2": _reduce_l2,
    "InstanceNormalization": _instance_norm,
    "ConvTranspose": _conv_transpose, "Resize": _resize, "PRelu": _prelu,
    "HardSwish": _hard_swish, "Clip": _clip, "Pow": _pow, "Erf": _erf,
}
