"""Graph rewrites applied to every model at load, before shapes are inferred.

Each pass takes the ``ModelProto`` (edited in place) and the list of changes, and appends one
line saying what it did when it did anything. :func:`mpsearch.graph.load_model` composes them in
order. Every pass preserves the model's outputs exactly (constant folding runs the ONNX
reference implementation; fusing a zero Pad into a Conv's own padding is exact arithmetic).

  * :func:`name_nodes`: unnamed or duplicate node names get unique names (``Conv_3``); run
    after every rewrite that adds nodes (the opset converter adds unnamed ones), so no later
    stage meets two nodes with one name;
  * :func:`sort_nodes`: nodes in topological order (stable: file order where it is free), so
    passes that read the graph front to back see producers first; a real cycle is an error;
  * :func:`constants_to_initializers`: ``Constant`` nodes (Paddle, TF, PyTorch exports) become
    initializers, so weights and shape constants are visible as such;
  * :func:`drop_initializer_inputs`: initializers also listed as graph inputs (IR < 4) are not
    inputs any more;
  * :func:`fold_constants`: nodes whose inputs are all initializers (exporters' pad and reshape
    arithmetic, transposed or cast weights) are computed once and replaced by their results;
  * :func:`fuse_pads`: a zero ``Pad`` read only by Convs becomes the Convs' own ``pads`` (the
    "same" padding of TF and EfficientNet exports), so the Conv quantizes without a float Pad
    between a DequantizeLinear and a QuantizeLinear;
  * :func:`fold_batch_norms`: an inference ``BatchNormalization`` that alone reads a Conv's
    (or a plain Gemm's) output is folded into its weights and bias (Paddle exports keep them
    apart after Convs, PyTorch after Linear layers: BatchNorm1d), as
    ONNX Runtime does at inference and every quantizer's pre-processing does: the weights are
    then quantized as they run, no Q/DQ pair sits between the Conv and its normalization, and
    bias correction has a bias to correct. Exact up to float32 rounding of the folded weights
    (computed in float64).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from mpsearch._names import Namer
from mpsearch.errors import ModelError

__all__ = [
    "constants_to_initializers",
    "drop_initializer_inputs",
    "fold_batch_norms",
    "fold_constants",
    "fuse_pads",
    "name_nodes",
    "sort_nodes",
]

logger = logging.getLogger(__name__)

#: Ops never folded: their result is not a function of their inputs (random), they are the
#: quantization of an already-quantized model, or they carry subgraphs.
_NOT_FOLDED = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
    "Bernoulli", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "If", "Loop",
    "Scan", "Constant",
})


def name_nodes(model: onnx.ModelProto, changes: list[str]) -> None:
    """Give every node a unique name: the first holder of a name keeps it, unnamed nodes and
    later holders get ``<op>_<index>`` (suffixed until no name in the model has it)."""
    nodes = model.graph.node
    taken: set[str] = set()
    namer = Namer.of_model(model)
    keeps = [False] * len(nodes)
    for index, node in enumerate(nodes):
        if node.name and node.name not in taken:
            taken.add(node.name)
            keeps[index] = True
    renamed = 0
    for index, node in enumerate(nodes):
        if keeps[index]:
            continue
        node.name = namer.fresh(f"{node.op_type}_{index}")
        renamed += 1
    if renamed:
        changes.append(f"named {renamed} unnamed or duplicate nodes")


def sort_nodes(model: onnx.ModelProto, changes: list[str]) -> None:
    """Reorder the nodes topologically (Kahn's algorithm, lowest file index first).

    Identity is the node's position, never its name. Raises ``ValueError`` naming a node on
    a cycle when the graph has one (an invalid ONNX graph)."""
    nodes = list(model.graph.node)
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.output:
            if name:
                producer[name] = index
    readers: list[set[int]] = [set() for _ in nodes]
    waiting = [0] * len(nodes)
    for index, node in enumerate(nodes):
        sources = {producer[t] for t in _inputs_with_subgraphs(node) if t in producer}
        for source in sources:
            readers[source].add(index)
        waiting[index] = len(sources)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for reader in readers[index]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, reader)
    if len(order) < len(nodes):
        stuck = next(nodes[i] for i, count in enumerate(waiting) if count > 0)
        raise ValueError(f"node '{stuck.name}' ({stuck.op_type}) is on a cycle")
    if order != sorted(order):
        _replace_nodes(model.graph, [nodes[i] for i in order])
        changes.append("sorted the nodes topologically")


def _inputs_with_subgraphs(node: onnx.NodeProto) -> set[str]:
    """The node's inputs and the outer-scope names its subgraphs read."""
    names = {name for name in node.input if name}
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for sub in graphs:
            names |= {name for inner in _all_nodes(sub) for name in inner.input if name}
    return names


def constants_to_initializers(model: onnx.ModelProto, changes: list[str]) -> None:
    graph = model.graph
    keep, moved = [], 0
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute):
            attr = node.attribute[0]
            if attr.name == "value":
                tensor = onnx.TensorProto()
                tensor.CopyFrom(attr.t)
            elif attr.name in ("value_float", "value_int", "value_floats", "value_ints"):
                array = np.array(helper.get_attribute_value(attr),
                                 dtype=np.float32 if "float" in attr.name else np.int64)
                tensor = numpy_helper.from_array(array)
            else:
                keep.append(node)
                continue
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
            moved += 1
        else:
            keep.append(node)
    if moved:
        _replace_nodes(graph, keep)
        changes.append(f"moved {moved} Constant nodes into initializers")


def drop_initializer_inputs(model: onnx.ModelProto, changes: list[str]) -> None:
    names = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in names]
    dropped = len(model.graph.input) - len(inputs)
    if dropped:
        del model.graph.input[:]
        model.graph.input.extend(inputs)
        changes.append(f"removed {dropped} initializers from the graph inputs")


#: Largest output (bytes) constant folding computes; a bigger one stays a node in the graph.
FOLD_MAX_BYTES = 64 << 20
#: A constant-only node computing more than this, and more than BOMB_RATIO x the bytes it
#: reads, is refused (ModelError): no exporter writes that; a decompression bomb does.
BOMB_MIN_BYTES = 1 << 30
BOMB_RATIO = 64
#: Initializers up to this many elements are given to shape inference as values (shape math).
_DATA_PROPAGATED = 4096
#: Ops whose output size follows from input values, not shapes: unsized, they are not folded.
_GENERATING = frozenset({
    "ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Upsample", "Pad", "OneHot",
    "CenterCropPad", "Col2Im",
})


def fold_constants(model: onnx.ModelProto, changes: list[str]) -> None:
    """Replace every default-domain node whose inputs are all initializers by its outputs.

    Nodes are visited in (topological) file order, so chains fold completely. A node the
    reference implementation cannot run, or whose output would exceed :data:`FOLD_MAX_BYTES`
    (or cannot be sized before computing it, for ops that generate data from a shape) is left
    in place (logged at debug level): a 200-byte ``ConstantOfShape`` must not allocate GBs.
    Raises :class:`ModelError` for an output over ``BOMB_MIN_BYTES`` that is also ``BOMB_RATIO``
    times what the node reads (ONNX Runtime would otherwise compute it at session creation).
    """
    graph = model.graph
    opsets = {e.domain or "": int(e.version) for e in model.opset_import}
    values = {t.name: t for t in graph.initializer}
    graph_outputs = {o.name for o in graph.output}
    keep, folded = [], 0
    for node in graph.node:
        if not _foldable(node, values, graph_outputs) or not _small_enough(
                node, values, opsets, graph.name):
            keep.append(node)
            continue
        results = _evaluate(node, values, opsets)
        if results is None:
            keep.append(node)
            continue
        for name, array in zip(node.output, results, strict=True):
            values[name] = numpy_helper.from_array(np.asarray(array), name)
        folded += 1
    if not folded:
        return
    _replace_nodes(graph, keep)
    read = _names_read(graph)
    live = [t for name, t in values.items() if name in read]
    del graph.initializer[:]
    graph.initializer.extend(live)
    changes.append(f"folded {folded} nodes computed only from constants into initializers")


def fuse_pads(model: onnx.ModelProto, changes: list[str]) -> None:
    """Fold each constant zero ``Pad`` whose only readers are Convs into the Convs' ``pads``."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    removed: set[int] = set()
    for node in graph.node:
        pads = _spatial_zero_pads(node, initializers)
        if pads is None or node.output[0] in graph_outputs:
            continue
        convs = readers.get(node.output[0], [])
        if not convs or not all(_accepts_pads(conv, node.output[0], len(pads)) for conv in convs):
            continue
        for conv in convs:
            _add_conv_pads(conv, pads)
            conv.input[0] = node.input[0]
        removed.add(id(node))
    if not removed:
        return
    _replace_nodes(graph, [n for n in graph.node if id(n) not in removed])
    read = _names_read(graph) | graph_outputs
    live = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(live)
    changes.append(f"fused {len(removed)} zero Pad nodes into the padding of the Convs reading "
                   "them")


def fold_batch_norms(model: onnx.ModelProto, changes: list[str]) -> None:
    """Fold each inference BatchNormalization into the Conv or Gemm whose output only it reads:
    ``W' = W * s`` per output channel and ``b' = (b - mean) * s + beta``, with
    ``s = scale / sqrt(var + epsilon)``. A weight or bias another node also reads is copied."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    reads: dict[str, int] = {}
    for node in _all_nodes(graph):
        for name in node.input:
            reads[name] = reads.get(name, 0) + 1
    graph_outputs = {o.name for o in graph.output}
    removed: set[int] = set()
    gone: set[str] = set()
    namer = Namer.of_model(model)
    for bn in graph.node:
        conv = producers.get(bn.input[0]) if bn.input else None
        if conv is None or bn.input[0] in graph_outputs or reads.get(bn.input[0]) != 1:
            continue
        folded = _folded_conv(conv, bn, initializers)
        if folded is None:
            continue
        for position, array, role in ((1, folded[0], "weight"), (2, folded[1], "bias")):
            old = conv.input[position] if len(conv.input) > position else ""
            name = (old if old and reads.get(old) == 1
                    else namer.fresh(f"{conv.name}__bn_{role}"))
            initializers[name] = numpy_helper.from_array(array, name)
            if len(conv.input) <= position:
                conv.input.append(name)
            conv.input[position] = name
        gone.add(conv.output[0])
        conv.output[0] = bn.output[0]
        removed.add(id(bn))
    if not removed:
        return
    _replace_nodes(graph, [n for n in graph.node if id(n) not in removed])
    shapes = [v for v in graph.value_info if v.name not in gone]
    del graph.value_info[:]
    graph.value_info.extend(shapes)
    read = _names_read(graph)
    del graph.initializer[:]
    graph.initializer.extend(t for name, t in initializers.items() if name in read)
    changes.append(f"folded {len(removed)} BatchNormalization nodes into the Convs/Gemms "
                   "before them")


def _folded_conv(conv: onnx.NodeProto, bn: onnx.NodeProto,
                 initializers: dict[str, onnx.TensorProto]
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """The Conv's (or Gemm's) folded (weight, bias), or None when ``bn`` cannot be folded
    into it. A Gemm folds when it computes ``A B' + C`` plainly (alpha = beta = 1, A not
    transposed): its output channels are B's rows (``transB``) or columns."""
    standard = ("", "ai.onnx")
    if (conv.op_type not in ("Conv", "Gemm") or conv.domain not in standard
            or bn.domain not in standard or bn.op_type != "BatchNormalization"
            or len(bn.input) != 5 or any(bn.output[1:]) or len(conv.input) < 2):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in bn.attribute}
    if attrs.get("training_mode", 0) or not attrs.get("spatial", 1):
        return None
    layer = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    gemm = conv.op_type == "Gemm"
    if gemm and (layer.get("transA", 0) or layer.get("alpha", 1.0) != 1.0
                 or layer.get("beta", 1.0) != 1.0):
        return None
    tensors = [initializers.get(name) for name in (conv.input[1], *bn.input[1:])]
    bias_name = conv.input[2] if len(conv.input) > 2 else ""
    if bias_name:
        tensors.append(initializers.get(bias_name))
    if any(t is None or t.data_type != onnx.TensorProto.FLOAT for t in tensors):
        return None
    weight, scale, beta, mean, var, *bias = (
        numpy_helper.to_array(t).astype(np.float64) for t in tensors)  # type: ignore[arg-type]
    axis = 1 if gemm and not layer.get("transB", 0) else 0  # the output-channel axis
    if weight.ndim != 2 if gemm else weight.ndim < 3:
        return None
    channels = weight.shape[axis]
    if any(a.shape != (channels,) for a in (scale, beta, mean, var, *bias)):
        return None
    factor = scale / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
    shape = [1] * weight.ndim
    shape[axis] = channels
    folded = weight * factor.reshape(shape)
    shift = (bias[0] if bias else 0.0) - mean
    return folded.astype(np.float32), (shift * factor + beta).astype(np.float32)


def _foldable(node: onnx.NodeProto, values: dict[str, onnx.TensorProto],
              graph_outputs: set[str]) -> bool:
    inputs = [name for name in node.input if name]
    return (node.domain in ("", "ai.onnx") and node.op_type not in _NOT_FOLDED
            and bool(inputs) and all(name in values for name in inputs)
            and not any(name in graph_outputs for name in node.output))


def _small_enough(node: onnx.NodeProto, values: dict[str, onnx.TensorProto],
                  opsets: dict[str, int], graph_name: str) -> bool:
    """True when ONNX shape inference sizes every output of ``node`` within FOLD_MAX_BYTES
    (an unsized output passes unless the op generates data from a shape or from values)."""
    inputs, small = [], []
    for name in dict.fromkeys(n for n in node.input if n):
        tensor = values[name]
        if int(np.prod(tensor.dims, dtype=np.int64)) <= _DATA_PROPAGATED:
            small.append(tensor)  # shape arithmetic: inference reads the values
        else:
            inputs.append(helper.make_tensor_value_info(name, tensor.data_type, tensor.dims))
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
               for o in node.output if o]
    model = helper.make_model(
        helper.make_graph([node], "fold", inputs, outputs, small),
        opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as e:  # inference failed: size unknown
        logger.debug("cannot size %s (%s) before folding: %s", node.name, node.op_type, e)
        inferred = model
    for value in inferred.graph.output:
        kind = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim]
        if not kind.HasField("shape") or any(d < 0 for d in dims) or not kind.elem_type:
            if node.op_type in _GENERATING:
                logger.debug("not folding %s (%s): output size unknown before computing it",
                             node.name, node.op_type)
                return False
            continue
        itemsize = (0 if kind.elem_type == onnx.TensorProto.STRING
                    else helper.tensor_dtype_to_np_dtype(kind.elem_type).itemsize)
        size = float(np.prod(dims, dtype=np.float64)) * itemsize
        read = sum(_nbytes(values[n]) for n in node.input if n)
        if size > BOMB_MIN_BYTES and size > BOMB_RATIO * read:
            raise ModelError(
                f"ONNX graph '{graph_name}': node '{node.name}' ({node.op_type}) would compute a "
                f"{size / 2**30:.1f} GiB tensor from {read} bytes of constants (limit "
                f"{BOMB_MIN_BYTES / 2**30:.0f} GiB); the file is malformed or hostile, "
                "re-export the model")
        if size > FOLD_MAX_BYTES:
            logger.debug("not folding %s (%s): its output %s would take %d bytes (limit %d)",
                         node.name, node.op_type, value.name, size, FOLD_MAX_BYTES)
            return False
    return True


def _nbytes(tensor: onnx.TensorProto) -> int:
    if tensor.data_type == onnx.TensorProto.STRING:
        return int(tensor.ByteSize())
    itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def _evaluate(node: onnx.NodeProto, values: dict[str, onnx.TensorProto],
              opsets: dict[str, int]) -> list[np.ndarray] | None:
    inputs = {name: numpy_helper.to_array(values[name]) for name in node.input if name}
    try:
        return list(ReferenceEvaluator(node, opsets=opsets).run(None, inputs))
    except Exception as e:  # an op the reference implementation lacks stays in the graph
        logger.debug("not folding %s (%s): %s", node.name, node.op_type, e)
        return None


def _spatial_zero_pads(node: onnx.NodeProto,
                       initializers: dict[str, onnx.TensorProto]) -> list[int] | None:
    """The Pad's pads on dims 2.. as ``[begins..., ends...]``, or None when it cannot fuse."""
    if node.op_type != "Pad" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("mode", b"constant") != b"constant" or node.input[1] not in initializers:
        return None
    if len(node.input) > 3 and node.input[3]:  # explicit axes (opset 18): leave alone
        return None
    if len(node.input) > 2 and node.input[2]:
        value = initializers.get(node.input[2])
        if value is None or np.any(numpy_helper.to_array(value) != 0):
            return None
    pads = [int(p) for p in numpy_helper.to_array(initializers[node.input[1]]).ravel()]
    rank = len(pads) // 2
    begins, ends = pads[:rank], pads[rank:]
    if rank < 3 or any(p < 0 for p in pads) or any(begins[:2]) or any(ends[:2]):
        return None
    return begins[2:] + ends[2:]


def _accepts_pads(node: onnx.NodeProto, tensor: str, n_pads: int) -> bool:
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or node.input[0] != tensor:
        return False
    if tensor in node.input[1:]:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("auto_pad", b"NOTSET") != b"NOTSET":
        return False
    return len(attrs.get("pads", [0] * n_pads)) == n_pads


def _add_conv_pads(node: onnx.NodeProto, pads: list[int]) -> None:
    old = next((a for a in node.attribute if a.name == "pads"), None)
    current = list(old.ints) if old is not None else [0] * len(pads)
    if old is not None:
        node.attribute.remove(old)
    node.attribute.append(helper.make_attribute("pads", [a + b for a, b in zip(
        current, pads, strict=True)]))


def _replace_nodes(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    del graph.node[:]
    graph.node.extend(nodes)


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name read by a node of ``graph`` or of its subgraphs, and its outputs."""
    return {name for node in _all_nodes(graph) for name in node.input} | {
        o.name for o in graph.output}


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _all_nodes(sub)
