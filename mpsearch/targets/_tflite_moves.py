"""Writers for data movement (the output keeps the input's grid), concatenation, and the float
decomposition of LayerNormalization (TFLite has no builtin for it)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from mpsearch.targets._tflite_lower import TO_NCHW, TO_NHWC, Value
from mpsearch.targets._tflite_ops import Node, nhwc_const, quantize, refuse

__all__ = ["MOVE_WRITERS", "layer_norm"]

_NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}


def _i32(n: Node, tag: str, values: object) -> int:
    return n.low.const(f"{n.name}_{tag}", np.asarray(values, np.int32))


def _reshape(n: Node) -> list[Value]:
    x = n.x(0, nhwc=False)
    shape = n.low.shape_of(n.proto.output[0])
    return [n.emit("RESHAPE", (x.index or 0, _i32(n, "shape", shape)),
                   n.output(0, shape, dtype=n.kind(x)))]


def _identity(n: Node) -> list[Value]:
    return [n.x(0)]


def _transpose(n: Node) -> list[Value]:
    x = n.x(0)
    perm = n.ints("perm", list(reversed(range(len(x.shape)))))
    if x.nhwc:
        perm = [TO_NCHW[p] for p in perm]
    shape = n.low.shape_of(n.proto.output[0])
    return [n.emit("TRANSPOSE", (x.index or 0, _i32(n, "perm", perm)),
                   n.output(0, shape, dtype=n.kind(x)))]


def _gather(n: Node) -> list[Value]:
    indices = n.const_array(1)
    x = n.x(0, nhwc=False)
    axis = n.integer("axis", 0)
    axis = axis + len(x.shape) if axis < 0 else axis
    if indices is None:  # computed (token ids): TFLite's GATHER takes int64 positions
        given = n.ins[1]
        if given is None or given.index is None or given.q is not None:
            raise refuse("Gather with computed indices that are not an integer tensor")
        where = given.index
    else:
        idx = np.where(indices < 0, indices + x.shape[axis], indices).astype(np.int32)
        where = n.low.const(f"{n.name}_idx", idx)
    shape = n.low.shape_of(n.proto.output[0])
    return [n.emit("GATHER", (x.index or 0, where),
                   n.output(0, shape, dtype=n.kind(x)), "GatherOptions", axis=axis, batch_dims=0)]


def _split(n: Node) -> list[Value]:
    x = n.x(0)
    rank = len(x.shape)
    axis = n.integer("axis", 0)
    axis = axis + rank if axis < 0 else axis
    shapes = [n.low.shape_of(o) for o in n.proto.output]
    sizes = [s[axis] for s in shapes]
    mapped = _NHWC_AXIS[axis] if x.nhwc and rank == 4 else axis
    outs = [n.output(i, s, nhwc=x.nhwc, dtype=n.kind(x)) for i, s in enumerate(shapes)]
    n.low.flat.op("SPLIT_V", (x.index or 0, _i32(n, "sizes", sizes),
                              _i32(n, "axis", mapped)),
                  tuple(o.index or 0 for o in outs), n.name, "SplitVOptions",
                  num_splits=len(outs))
    return outs


def _slice(n: Node) -> list[Value]:
    """STRIDED_SLICE in the input's layout (an NHWC input is sliced in place, not transposed
    back to ONNX order first)."""
    x = n.x(0)
    rank = len(x.shape)
    starts, ends = n.const_array(1), n.const_array(2)
    axes, steps = n.const_array(3), n.const_array(4)
    if starts is None or ends is None:
        raise refuse("Slice with computed bounds")
    begin, end, stride = [0] * rank, list(x.shape), [1] * rank
    for k, a in enumerate(range(rank) if axes is None else axes.reshape(-1)):
        a = int(a) + rank if int(a) < 0 else int(a)
        dim = x.shape[a]
        step = 1 if steps is None else int(steps.reshape(-1)[k])
        if step < 1:
            raise refuse("Slice with a negative step")
        stride[a] = step
        b, e = int(starts.reshape(-1)[k]), int(ends.reshape(-1)[k])
        begin[a] = max(0, min(dim, b + dim if b < 0 else b))
        end[a] = max(0, min(dim, e + dim if e < 0 else e))
    if x.nhwc:
        begin, end, stride = ([v[i] for i in TO_NHWC] for v in (begin, end, stride))
    shape = n.low.shape_of(n.proto.output[0])
    return [n.emit("STRIDED_SLICE", (x.index or 0, _i32(n, "begin", begin),
                                     _i32(n, "end", end), _i32(n, "stride", stride)),
                   n.output(0, shape, nhwc=x.nhwc, dtype=n.kind(x)), "StridedSliceOptions",
                   begin_mask=0, end_mask=0)]


def _pad(n: Node) -> list[Value]:
    if n.attr("mode", b"constant") != b"constant":
        raise refuse("Pad mode other than constant")
    pads, value = n.const_array(1), n.const_array(2)
    if pads is None or (value is not None and float(value.reshape(-1)[0]) != 0.0):
        raise refuse("Pad with computed pads or a non-zero value")
    x = n.x(0)
    rank = len(x.shape)
    pairs = [[int(pads[i]), int(pads[i + rank])] for i in range(rank)]
    if x.nhwc:
        pairs = [pairs[i] for i in (0, 2, 3, 1)]
    shape = n.low.shape_of(n.proto.output[0])
    return [n.emit("PAD", (x.index or 0, _i32(n, "pads", pairs)),
                   n.output(0, shape, nhwc=x.nhwc, dtype=n.kind(x)))]


def _concat(n: Node) -> list[Value]:
    """CONCATENATION. TFLite's integer kernel copies codes (int8 refuses inputs on another
    grid than the output's, int16 copies them unscaled), so an integer node reads every input
    on the output's grid: activations requantized onto it, constants' codes computed on it."""
    shape = n.low.shape_of(n.proto.output[0])
    rank = len(shape)
    acts = [v for v in n.ins if v is not None and not v.constant]
    nhwc = rank == 4 and any(v.nhwc for v in acts)
    grid = n.out_q[0]
    inputs = []
    for i, v in enumerate(n.ins):
        if v is None:
            continue
        if not v.constant:
            x = n.x(i, nhwc=nhwc)
            inputs.append((x if grid is None else n.on_grid(x, grid)).index or 0)
        elif grid is not None:
            inputs.append(n.low.const(f"{n.name}_k{i}", nhwc_const(
                quantize(v.real(), grid), rank, nhwc), grid))
        else:
            inputs.append(n.low.const(f"{n.name}_k{i}", nhwc_const(v.real(), rank, nhwc)))
    axis = n.integer("axis", 0)
    axis = axis + rank if axis < 0 else axis
    return [n.emit("CONCATENATION", tuple(inputs), n.output(0, shape, nhwc),
                   "ConcatenationOptions", axis=_NHWC_AXIS[axis] if nhwc else axis,
                   fused_activation_function=0)]


def layer_norm(n: Node) -> list[Value]:
    """float LayerNormalization over the last axis as MEAN, SQUARED_DIFFERENCE, RSQRT, MUL, ADD
    (TFLite has no builtin; an integer one would need our own requantization choices)."""
    if n.quantized:
        raise refuse("integer LayerNormalization has no TFLite builtin")
    x = n.x(0, nhwc=False)
    rank = len(x.shape)
    axis = n.integer("axis", -1)
    if (axis + rank if axis < 0 else axis) != rank - 1:
        raise refuse("LayerNormalization over an axis other than the last")
    eps = n.number("epsilon", 1e-5)
    stat = x.shape[:-1] + (1,)
    low = n.low

    def temp(tag: str, shape: tuple[int, ...]) -> int:
        return low.tensor(f"{n.name}_{tag}", shape, None)

    def op(code: str, ins: tuple[int, ...], out: int, options: str | None = None,
           **fields: object) -> int:
        low.flat.op(code, ins, (out,), n.name, options, **fields)
        return out

    axes = _i32(n, "axes", [rank - 1])
    xi = x.index or 0
    mean = op("MEAN", (xi, axes), temp("mean", stat), "ReducerOptions", keep_dims=True)
    sq = op("SQUARED_DIFFERENCE", (xi, mean), temp("sq", x.shape))
    var = op("MEAN", (sq, axes), temp("var", stat), "ReducerOptions", keep_dims=True)
    var = op("ADD", (var, low.const(f"{n.name}_eps", np.array([eps], np.float32))),
             temp("var_eps", stat), "AddOptions", fused_activation_function=0)
    inv = op("RSQRT", (var,), temp("inv", stat))
    centred = op("SUB", (xi, mean), temp("centred", x.shape), "SubOptions",
                 fused_activation_function=0)
    y = op("MUL", (centred, inv), temp("norm", x.shape), "MulOptions",
           fused_activation_function=0)
    gamma, beta = n.const_array(1), n.const_array(2)
    if gamma is not None:
        y = op("MUL", (y, low.const(f"{n.name}_gamma", gamma.astype(np.float32))),
               temp("scaled", x.shape), "MulOptions", fused_activation_function=0)
    out = n.output(0, x.shape)
    bias = np.zeros(x.shape[-1], np.float32) if beta is None else beta.astype(np.float32)
    op("ADD", (y, low.const(f"{n.name}_beta", bias)), out.index or 0, "AddOptions",
       fused_activation_function=0)
    return [out]


def _expand(n: Node) -> list[Value]:
    x = n.x(0, nhwc=False)
    shape = n.low.shape_of(n.proto.output[0])
    return [n.emit("BROADCAST_TO", (x.index or 0, _i32(n, "shape", shape)),
                   n.output(0, shape, dtype=n.kind(x)))]


def _reduce_max(n: Node) -> list[Value]:
    """REDUCE_MAX (ReduceMax, GlobalMaxPool): the maximum keeps the input's grid."""
    x = n.x(0)
    rank = len(x.shape)
    if n.proto.op_type == "GlobalMaxPool":
        axes, keep = list(range(2, rank)), True
    else:
        given = n.const_array(1)
        axes = n.ints("axes", []) if given is None else [int(a) for a in given.reshape(-1)]
        axes, keep = axes or list(range(rank)), bool(n.integer("keepdims", 1))
    axes = sorted(a + rank if a < 0 else a for a in axes)
    if x.nhwc and not (keep or axes == [2, 3]):
        x = n.x(0, nhwc=False)
    mapped = [_NHWC_AXIS[a] if x.nhwc else a for a in axes]
    out = n.output(0, n.low.shape_of(n.proto.output[0]), nhwc=x.nhwc and keep,
                   dtype=n.kind(x))
    return [n.emit("REDUCE_MAX", (x.index or 0, _i32(n, "axes", mapped)), out,
                   "ReducerOptions", keep_dims=keep)]


def _equal(n: Node) -> list[Value]:
    if n.quantized:
        raise refuse("Equal on quantized tensors")
    shape = n.low.shape_of(n.proto.output[0])
    ins = []
    for i, v in enumerate(n.ins):
        if v is not None and v.constant:
            ins.append(n.low.const(f"{n.name}_k{i}", nhwc_const(v.real(), len(shape), False)))
        else:
            ins.append(n.x(i, nhwc=False).index or 0)
    return [n.emit("EQUAL", tuple(ins), n.output(0, shape, dtype="bool"))]


def _cast(n: Node) -> list[Value]:
    x = n.x(0)
    to = onnx.helper.tensor_dtype_to_np_dtype(n.integer("to", onnx.TensorProto.FLOAT))
    if n.quantized or str(to) not in ("float32", "int32", "int8", "int16", "bool", "int64"):
        raise refuse(f"Cast to {to}")
    return [n.emit("CAST", (x.index or 0,), n.output(0, x.shape, x.nhwc, dtype=str(to)))]


MOVE_WRITERS: dict[str, Callable[[Node], list[Value]]] = {
    "Reshape": _reshape, "Flatten": _reshape, "Squeeze": _reshape, "Unsqueeze": _reshape,
    "Identity": _identity, "Transpose": _transpose, "Gather": _gather, "Split": _split,
    "Slice": _slice, "Pad": _pad, "Concat": _concat, "Expand": _expand,
    "ReduceMax": _reduce_max, "GlobalMaxPool": _reduce_max, "Equal": _equal, "Cast": _cast,
    "LayerNormalization": layer_norm,
}
