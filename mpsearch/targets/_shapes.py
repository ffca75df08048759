"""Static shapes of every tensor of a QDQ model, with dynamic input dimensions fixed.

Toolchains compile static graphs. A dynamic dimension takes the calibration data's size, except
the leading (batch) one, which is fixed to 1: one sample per inference, as a device runs it.
Q/DQ nodes (standard or ``com.microsoft``) are read as Identity for the shape pass, so 16-bit
grids at any opset infer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mpsearch.errors import TargetError

__all__ = ["fixed_input_shapes", "static_shapes"]

_INTEGERS = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16,
                       onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.BOOL})
#: Float constants folded at most this many elements (an anchor grid, not a weight).
_SMALL = 1 << 16


def fixed_input_shapes(model: onnx.ModelProto,
                       calibration: Sequence[Mapping[str, np.ndarray]]
                       ) -> dict[str, tuple[int, ...]]:
    """Each graph input's static shape: its own dims, dynamic ones from the first calibration
    sample (batch fixed to 1)."""
    inits = {i.name for i in model.graph.initializer}
    sample = calibration[0] if calibration else {}
    shapes = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        dims = inp.type.tensor_type.shape.dim
        data = sample.get(inp.name)
        fixed = []
        for k, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                fixed.append(int(d.dim_value))
            elif k == 0:
                fixed.append(1)
            elif data is not None and data.ndim == len(dims):
                fixed.append(int(data.shape[k]))
            else:
                raise TargetError(f"input '{inp.name}' dimension {k} is dynamic and no "
                                  "calibration sample gives its size; pass calibration data")
        shapes[inp.name] = tuple(fixed)
    return shapes


def static_shapes(model: onnx.ModelProto, inputs: Mapping[str, tuple[int, ...]]
                  ) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape after ONNX shape inference on ``inputs``' shapes.

    Shape arithmetic ONNX's data propagation does not follow (Paddle2ONNX's ``Shape -> Cast
    int32 -> Slice -> Cast int64 -> Concat`` target of a Reshape) is evaluated and inference
    run again, until every tensor's shape is known or nothing more folds."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    inits = {i.name: i for i in graph.initializer}
    placeholders = set()  # zeros standing in for dequantized constants: shapes only
    nodes = []
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            if node.op_type == "DequantizeLinear" and node.input[0] in inits:
                dims = tuple(inits[node.input[0]].dims)
                graph.initializer.append(numpy_helper.from_array(
                    np.zeros(dims, np.float32), node.output[0]))
                placeholders.add(node.output[0])
                continue
            nodes.append(helper.make_node("Identity", [node.input[0]], list(node.output),
                                          name=node.name))
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    for inp in graph.input:
        if inp.name in inputs:
            for d, size in zip(inp.type.tensor_type.shape.dim, inputs[inp.name], strict=True):
                d.Clear()
                d.dim_value = size
    del graph.value_info[:]
    for out in graph.output:
        out.type.tensor_type.ClearField("shape")
    while True:
        shapes = _infer(copy)
        if all(o in shapes for n in graph.node for o in n.output if o) or not _fold_constants(
                copy, shapes, placeholders):
            return shapes


def _infer(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as e:
        raise TargetError(f"shape inference failed on the fixed input shapes: {e}") from e
    shapes: dict[str, tuple[int, ...]] = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape") and all(d.HasField("dim_value")
                                                           for d in dims):
            shapes[info.name] = tuple(int(d.dim_value) for d in dims)
    for init in inferred.graph.initializer:
        shapes.setdefault(init.name, tuple(init.dims))
    return shapes


def _fold_constants(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]],
                    placeholders: Set[str]) -> bool:
    """Replace by initializers the nodes computing integer tensors, or small float ones, from
    such constants (Shape of a statically shaped tensor, Constant, initializers): shape
    arithmetic, and a detector's anchor grid (Range over a length cast to float), whose size
    shape inference cannot know. The ``placeholders`` (zeros for dequantized constants) are
    not folded through. True when any node was replaced."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    known = {i.name: numpy_helper.to_array(i) for i in graph.initializer
             if i.name not in placeholders and _foldable(i)}
    kept, folded = [], False
    for node in graph.node:
        value: list[np.ndarray] | None = None
        if node.op_type == "Shape" and node.input[0] in shapes:
            shape = np.array(shapes[node.input[0]], np.int64)
            start = next((a.i for a in node.attribute if a.name == "start"), 0)
            end = next((a.i for a in node.attribute if a.name == "end"), len(shape))
            value = [shape[start:end]]
        elif node.op_type == "Constant":
            attr = node.attribute[0] if node.attribute else None
            if attr is not None and attr.name == "value" and _foldable(attr.t):
                value = [numpy_helper.to_array(attr.t)]
        elif node.input and all(not t or t in known for t in node.input) and node.domain in (
                "", "ai.onnx"):
            single = helper.make_model(helper.make_graph(
                [node], "fold", [], [helper.make_tensor_value_info(
                    o, onnx.TensorProto.UNDEFINED, None) for o in node.output],
                [numpy_helper.from_array(known[t], t) for t in node.input if t]),
                opset_imports=list(model.opset_import))
            value = [np.asarray(v) for v in ReferenceEvaluator(single).run(None, {})]
        if value is None or not all(v.dtype.kind in "iub" or (v.dtype.kind == "f" and v.size
                                                              <= _SMALL) for v in value):
            kept.append(node)
            continue
        for name, array in zip(node.output, value, strict=True):
            known[name] = array
            graph.initializer.append(numpy_helper.from_array(array, name))
        folded = True
    del graph.node[:]
    graph.node.extend(kept)
    return folded


def _foldable(tensor: onnx.TensorProto) -> bool:
    """Whether a constant is folded through: integer, or small (:data:`_SMALL`)."""
    return tensor.data_type in _INTEGERS or int(np.prod(tensor.dims)) <= _SMALL
