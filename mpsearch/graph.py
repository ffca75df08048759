"""ONNX model -> normalized :class:`ModelGraph` (a networkx DiGraph of ONNX nodes).

Consumes an ONNX file path or a ``ModelProto``; produces a frozen :class:`ModelGraph` holding the
normalized model, its nodes in topological order with their quantization roles, inferred tensor
shapes and the list of normalizations applied. Every later stage reads the model through it.

Normalizations (each reported in ``ModelGraph.changes``):
  * opset < 13 is converted to 13 first (per-axis Q/DQ needs it);
  * the rewrites of :mod:`mpsearch._normalize`: unique node names and topological order (after
    the opset converter, which adds unnamed nodes, and again after the last rewrite),
    ``Constant`` nodes as initializers, no initializers among the inputs, constant subgraphs
    folded, zero ``Pad`` nodes fused into the Convs reading them, inference
    ``BatchNormalization`` folded into the Conv or Gemm before it;
  * shapes are inferred; symbolic dimensions (a dynamic batch) stay symbolic; declared output
    shapes that contradict inference are dropped;
  * the result is checked with ``onnx.checker`` (a failure is logged as a warning).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import networkx as nx
import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference, version_converter

from mpsearch import _normalize
from mpsearch.errors import ModelError

__all__ = ["QUANTIZABLE_OPS", "ModelGraph", "Node", "TensorInfo", "default_opset", "load_model",
           "node_model"]

logger = logging.getLogger(__name__)

MIN_OPSET = 13
_OLDEST_CONVERTIBLE_OPSET = 7
Dim = int | str | None

#: Op types that runtimes quantize, with the input positions that carry activations.
#: ``None`` means every input. Weights are the initializer inputs among the positions in
#: ``_WEIGHT_INPUTS``; biases are in ``_BIAS_INPUT``.
QUANTIZABLE_OPS: Mapping[str, tuple[int, ...] | None] = MappingProxyType(
    {
        "Conv": (0,),
        "ConvTranspose": (0,),
        "Gemm": (0, 1),
        "MatMul": (0, 1),
        "Add": (0, 1),
        "Sub": (0, 1),
        "Mul": (0, 1),
        "Div": (0, 1),
        "Concat": None,
        "MaxPool": (0,),
        "AveragePool": (0,),
        "GlobalAveragePool": (0,),
        "GlobalMaxPool": (0,),
        "ReduceMean": (0,),
        "Relu": (0,),
        "LeakyRelu": (0,),
        "Clip": (0,),
        "Sigmoid": (0,),
        "HardSigmoid": (0,),
        "HardSwish": (0,),
        "Tanh": (0,),
        "Softmax": (0,),
        "Gelu": (0,),
        "LayerNormalization": (0,),
        "Resize": (0,),
    }
)
_WEIGHT_INPUTS: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {"Conv": (1,), "ConvTranspose": (1,), "Gemm": (1,), "MatMul": (0, 1),
     "LayerNormalization": (1,)}
)
_BIAS_INPUT: Mapping[str, int] = MappingProxyType({"Conv": 2, "ConvTranspose": 2, "Gemm": 2})
_DATA_MOVEMENT = frozenset(
    {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Split", "Slice", "Gather",
     "Identity", "Expand", "Tile", "Pad", "DepthToSpace", "SpaceToDepth"}
)
#: Ops that only read a weight table: a float initializer at input 0 of one of them (an embedding
#: ``Gather``, a sliced or expanded positional table) is stored quantized, weight-only: the op
#: reads the dequantized table and its output stays float (as ORT's quantizer stores
#: ``Gather`` tables).
_WEIGHT_ONLY_OPS = frozenset({"Gather", "GatherElements", "Slice", "Expand", "Tile"})
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16})


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorInfo:
    """A graph input or output: name, shape (ints, symbolic names or None) and numpy dtype."""

    name: str
    shape: tuple[Dim, ...] | None
    dtype: np.dtype[Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One ONNX node with its quantization roles.

    ``activation_inputs`` are the float non-constant inputs that get Q/DQ when the node is
    quantized; ``weights`` the float initializer inputs stored quantized; ``bias`` the initializer
    stored as int32 where the format says so. ``reason`` says why a node is not quantizable.
    ``weight_only``: a data-movement node reading a float weight table (an embedding
    ``Gather``): quantizing it stores the table quantized; it has no activation Q/DQ.
    """

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: Mapping[str, Any]
    activation_inputs: tuple[str, ...] = ()
    weights: tuple[str, ...] = ()
    bias: str | None = None
    quantizable: bool = False
    reason: str = ""
    weight_only: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelGraph:
    """A normalized ONNX model and its graph of nodes (edges are tensors)."""

    model: onnx.ModelProto
    path: str | None
    nodes: Mapping[str, Node]
    order: tuple[str, ...]
    initializers: Mapping[str, np.ndarray]
    shapes: Mapping[str, tuple[Dim, ...] | None]
    elem_types: Mapping[str, int]
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    opset: int
    changes: tuple[str, ...]
    fingerprint: str
    subgraph_nodes: tuple[Node, ...] = ()
    digraph: nx.DiGraph[str] = field(repr=False, compare=False, default_factory=nx.DiGraph)
    producers: Mapping[str, str] = field(repr=False, compare=False, default_factory=dict)
    consumer_map: Mapping[str, tuple[str, ...]] = field(
        repr=False, compare=False, default_factory=dict
    )

    @property
    def name(self) -> str:
        return Path(self.path).name if self.path else (self.model.graph.name or "model")

    def producer(self, tensor: str) -> str | None:
        """Name of the node producing ``tensor`` (None for graph inputs and initializers)."""
        return self.producers.get(tensor)

    def consumers(self, tensor: str) -> tuple[str, ...]:
        """Names of the nodes reading ``tensor``, in topological order."""
        return self.consumer_map.get(tensor, ())

    def proto(self, name: str) -> onnx.NodeProto:
        """The normalized ONNX node ``name`` (read it; build new protos, never edit it)."""
        proto: onnx.NodeProto = self.digraph.nodes[name]["proto"]
        return proto

    def quantizable_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes.values() if n.quantizable)

    def is_float(self, tensor: str) -> bool:
        return self.elem_types.get(tensor) in _FLOAT_TYPES

    def activation_tensors(self) -> tuple[str, ...]:
        """Float activation tensors that quantization needs ranges for, in topological order."""
        seen: dict[str, None] = {}
        for node in self.quantizable_nodes():
            if node.weight_only:
                continue
            for tensor in (*node.activation_inputs, *node.outputs):
                if tensor and self.is_float(tensor) and tensor not in self.initializers:
                    seen.setdefault(tensor, None)
        return tuple(seen)


def node_model(graph: ModelGraph, node: Node) -> onnx.ModelProto:
    """A one-node model: ``node`` with its initializers; its other inputs become graph inputs."""
    inputs = list(dict.fromkeys(node.inputs))
    feeds = [t for t in inputs if t and t not in graph.initializers]
    inits = [numpy_helper.from_array(graph.initializers[t], t)
             for t in inputs if t in graph.initializers]

    def info(tensor: str) -> onnx.ValueInfoProto:
        elem = graph.elem_types.get(tensor) or onnx.TensorProto.FLOAT
        return helper.make_tensor_value_info(tensor, elem, graph.shapes.get(tensor))

    body = helper.make_graph([graph.proto(node.name)], node.name, [info(t) for t in feeds],
                             [info(t) for t in node.outputs if t], initializer=inits)
    return helper.make_model(body, opset_imports=list(graph.model.opset_import),
                             ir_version=graph.model.ir_version)


def load_model(source: str | os.PathLike[str] | onnx.ModelProto) -> ModelGraph:
    """Load, normalize and analyse an ONNX model from a path or a ``ModelProto``."""
    path = None if isinstance(source, onnx.ModelProto) else os.fspath(source)
    model = _read(path) if path is not None else _copy(source)  # type: ignore[arg-type]
    label = path or "<model>"
    _check_names(model.graph, label)
    _check_initializers(model.graph, label)
    _check_single_assignment(model.graph, label)
    _check_loops(model.graph, label)
    _check_input_shapes(model.graph, label)
    changes: list[str] = []
    model = _upgrade_opset(model, label, changes)
    _normalize.name_nodes(model, changes)
    _sort(model, label, changes)
    _normalize.constants_to_initializers(model, changes)
    _normalize.drop_initializer_inputs(model, changes)
    _normalize.fold_constants(model, changes)
    _normalize.fuse_pads(model, changes)
    _normalize.fold_batch_norms(model, changes)
    _normalize.name_nodes(model, changes)
    _sort(model, label, changes)
    model = _infer_shapes(model, label, path, changes)
    _check(model, label)
    return _build(model, path, tuple(changes))


#: A Loop whose trip count is a constant above this, and whose condition cannot end it
#: sooner, is refused: ONNX Runtime would run it for hours (10**12 iterations never end).
MAX_LOOP_TRIPS = 10**6


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                yield from _graphs(sub)


def _check_names(graph: onnx.GraphProto, label: str) -> None:
    """Names are text: protobuf hands bytes back for a name that is not valid UTF-8."""
    for sub in _graphs(graph):
        for index, node in enumerate(sub.node):
            for what, value in (("name", node.name), ("op_type", node.op_type),
                                ("domain", node.domain), *(("input", v) for v in node.input),
                                *(("output", v) for v in node.output)):
                if isinstance(value, bytes):
                    raise ModelError(f"{label}: node {index} of graph '{_text(sub.name)}': its "
                                     f"{what} {value[:40]!r} is not UTF-8; rename it and "
                                     "re-export the model")
        for kind, values in (("input", sub.input), ("output", sub.output),
                             ("value_info", sub.value_info), ("initializer", sub.initializer)):
            for value in values:
                if isinstance(value.name, bytes):
                    raise ModelError(f"{label}: a graph {kind} name is not UTF-8 "
                                     f"({value.name[:40]!r}); rename it and re-export the model")


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _check_initializers(graph: onnx.GraphProto, label: str) -> None:
    """Every initializer holds as many bytes (or values) as its dims and type declare."""
    for sub in _graphs(graph):
        for tensor in sub.initializer:
            if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
                continue
            if any(d < 0 for d in tensor.dims):
                raise ModelError(f"{label}: initializer '{tensor.name}' has a negative "
                                 f"dimension {list(tensor.dims)}; re-export the model")
            count = int(np.prod(tensor.dims, dtype=np.float64)) if tensor.dims else 1
            try:
                itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
            except (KeyError, TypeError, ValueError):
                continue  # an exotic type: onnx.checker and ONNX Runtime judge it
            if tensor.HasField("raw_data"):
                need = count * itemsize
                if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
                    need = (count + 1) // 2
                if len(tensor.raw_data) != need:
                    raise ModelError(f"{label}: initializer '{tensor.name}' holds "
                                     f"{len(tensor.raw_data)} bytes but its dims "
                                     f"{list(tensor.dims)} need {need}; the file is truncated "
                                     "or malformed, re-export the model")


def _check_input_shapes(graph: onnx.GraphProto, label: str) -> None:
    """Every graph input that is not an initializer has a shape (onnx.checker requires one;
    without it no QDQ model of this graph passes the checker)."""
    constants = {t.name for t in graph.initializer}
    for value in graph.input:
        if value.name not in constants and value.type.HasField("tensor_type") \
                and not value.type.tensor_type.HasField("shape"):
            raise ModelError(f"{label}: input '{value.name}' has no shape (onnx.checker "
                             "requires one); re-export the model with input shapes, or set "
                             "them with onnx.tools.update_model_dims.update_inputs_outputs_dims")


def _check_single_assignment(graph: onnx.GraphProto, label: str) -> None:
    """Each tensor is written once: by one node, or as a graph input or initializer."""
    writers: dict[str, str] = {v.name: "graph input" for v in graph.input}
    writers.update({t.name: "initializer" for t in graph.initializer})
    for index, node in enumerate(graph.node):
        me = f"node '{node.name}'" if node.name else f"node {index} ({node.op_type})"
        for tensor in node.output:
            if not tensor:
                continue
            if tensor in writers:
                raise ModelError(f"{label}: tensor '{tensor}' is written by both "
                                 f"{writers[tensor]} and {me}; an ONNX graph writes each "
                                 "tensor once: re-export the model")
            writers[tensor] = me


def _check_loops(graph: onnx.GraphProto, label: str) -> None:
    """Refuse a Loop that would run more than :data:`MAX_LOOP_TRIPS` iterations for sure: a
    constant trip count and a condition the body passes through unchanged (or none)."""
    constants = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "Loop" or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        if not node.input[0] and body is not None and _condition_fixed(body) and (
                len(node.input) < 2 or not node.input[1] or node.input[1] in constants):
            raise ModelError(f"{label}: node '{node.name}' (Loop) has no trip count and a "
                             "condition that never changes: it never ends; re-export the model")
        count = constants.get(node.input[0])
        if count is None or count.data_type not in (onnx.TensorProto.INT64,
                                                    onnx.TensorProto.INT32):
            continue
        trips = numpy_helper.to_array(count).reshape(-1)
        if trips.size != 1 or body is None or int(trips[0]) <= MAX_LOOP_TRIPS:
            continue
        if _condition_fixed(body):
            raise ModelError(f"{label}: node '{node.name}' (Loop) runs {int(trips[0])} "
                             f"iterations (limit {MAX_LOOP_TRIPS}) with nothing to end it "
                             "sooner; the file is malformed or hostile, re-export the model")


def _condition_fixed(body: onnx.GraphProto) -> bool:
    """The body's condition output is its condition input (or a constant), through Identity
    nodes only: the loop runs its full trip count."""
    if len(body.input) < 2 or not body.output:
        return False
    producers = {o: n for n in body.node for o in n.output}
    constants = {t.name for t in body.initializer}
    name = body.output[0].name
    for _ in range(len(body.node) + 1):
        if name == body.input[1].name or name in constants:
            return True
        node = producers.get(name)
        if node is None:
            return False
        if node.op_type == "Constant":
            return True
        if node.op_type != "Identity" or not node.input:
            return False
        name = node.input[0]
    return False


def _sort(model: onnx.ModelProto, label: str, changes: list[str]) -> None:
    try:
        _normalize.sort_nodes(model, changes)
    except ValueError as e:
        raise ModelError(f"{label}: graph '{model.graph.name}' has a cycle ({e}); ONNX graphs "
                         "must be acyclic: re-export the model") from e


def _check(model: onnx.ModelProto, label: str) -> None:
    """The normalized model passes ``onnx.checker`` (logged, not raised: ORT may run a model
    the checker rejects, and the user can do nothing about an exporter's quirk)."""
    if model.ByteSize() >= 2**31 - 2**20:
        return  # the in-memory checker cannot take > 2 GB; shape inference already ran
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        logger.warning("%s: the normalized model fails onnx.checker: %s", label, _first_line(e))


def _read(path: str) -> onnx.ModelProto:
    if not os.path.isfile(path):
        raise ModelError(f"{path}: no such file; check the path to the ONNX model")
    try:
        model = onnx.load(path, load_external_data=True)
    except Exception as e:  # protobuf raises DecodeError, onnx raises ValueError/OSError
        raise ModelError(
            f"{path}: not a readable ONNX model ({type(e).__name__}: {_first_line(e)}); "
            "re-export it or check the file was copied completely"
        ) from e
    if not model.graph.node:
        raise ModelError(f"{path}: the ONNX graph has no nodes (empty or truncated file); "
                         "re-export the model")
    return model


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else "no detail"


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default (``ai.onnx``) domain ``model`` imports; 0 when none."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


def _upgrade_opset(model: onnx.ModelProto, label: str, changes: list[str]) -> onnx.ModelProto:
    opset = default_opset(model)
    if opset >= MIN_OPSET:
        return model
    if opset < _OLDEST_CONVERTIBLE_OPSET:
        raise ModelError(f"{label}: opset {opset} is not supported (need >= "
                         f"{_OLDEST_CONVERTIBLE_OPSET}); re-export with opset 13 or newer")
    try:
        upgraded = version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:
        raise ModelError(f"{label}: cannot upgrade opset {opset} to {MIN_OPSET} "
                         f"({_first_line(e)}); re-export with opset 13 or newer") from e
    changes.append(f"upgraded opset {opset} -> {MIN_OPSET}")
    return upgraded


def _infer_shapes(
    model: onnx.ModelProto, label: str, path: str | None, changes: list[str]
) -> onnx.ModelProto:
    try:
        return _run_inference(model, path)
    except Exception as first:  # declared shapes may contradict inference: drop and retry
        logger.debug("shape inference failed with declared shapes: %s", first)
    stripped = _copy(model)
    del stripped.graph.value_info[:]
    for output in stripped.graph.output:
        output.type.tensor_type.ClearField("shape")
    try:
        inferred = _run_inference(stripped, None)
    except Exception as e:
        raise ModelError(f"{label}: ONNX shape inference failed ({_first_line(e)}); "
                         "check the model with onnx.checker") from e
    changes.append("dropped declared intermediate/output shapes that contradicted inference")
    return inferred


def _run_inference(model: onnx.ModelProto, path: str | None) -> onnx.ModelProto:
    try:
        return shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except ValueError as e:
        if "2GB" not in str(e) and "2 GB" not in str(e):
            raise
    # Models over 2 GB: onnx infers shapes file-to-file.
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in.onnx")
        dst = os.path.join(tmp, "out.onnx")
        onnx.save(model, src, save_as_external_data=True, location="in.data")
        shape_inference.infer_shapes_path(src, dst, strict_mode=True, data_prop=True)
        return onnx.load(dst, load_external_data=True)


def _shape_of(value: onnx.ValueInfoProto) -> tuple[Dim, ...] | None:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims: list[Dim] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value >= 0:
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or None)  # Paddle writes -1 for a dynamic batch
    return tuple(dims)


def _fingerprint(model: onnx.ModelProto) -> str:
    """sha256 of the graph, part by part: a model past protobuf's 2 GB limit is never
    serialized whole (each initializer is; weights larger than 2 GB each are not supported)."""
    digest = hashlib.sha256()
    graph = model.graph
    for part in (*graph.node, *graph.input, *graph.output, *graph.value_info,
                 *graph.initializer, *graph.sparse_initializer):
        data = part.SerializeToString(deterministic=True)
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:16]


def _build(model: onnx.ModelProto, path: str | None, changes: tuple[str, ...]) -> ModelGraph:
    graph = model.graph
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    shapes: dict[str, tuple[Dim, ...] | None] = {}
    elem_types: dict[str, int] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        shapes[value.name] = _shape_of(value)
        elem_types[value.name] = value.type.tensor_type.elem_type
    for name, array in initializers.items():
        shapes[name] = tuple(int(d) for d in array.shape)
        elem_types[name] = helper.np_dtype_to_tensor_dtype(array.dtype)
    digraph, order = _topology(graph)
    nodes = {}
    for name in order:
        proto = digraph.nodes[name]["proto"]
        nodes[name] = _describe(proto, initializers, elem_types)
        digraph.nodes[name]["node"] = nodes[name]
    consumers: dict[str, list[str]] = {}
    for node in nodes.values():
        for tensor in dict.fromkeys(node.inputs):
            if tensor:
                consumers.setdefault(tensor, []).append(node.name)
    return ModelGraph(
        model=model,
        path=path,
        nodes=MappingProxyType(nodes),
        order=order,
        initializers=MappingProxyType(initializers),
        shapes=MappingProxyType(shapes),
        elem_types=MappingProxyType(elem_types),
        inputs=tuple(_tensor_info(v) for v in graph.input),
        outputs=tuple(_tensor_info(v) for v in graph.output),
        opset=default_opset(model),
        changes=changes,
        fingerprint=_fingerprint(model),
        subgraph_nodes=tuple(_subgraph_nodes(graph)),
        digraph=digraph,
        producers=MappingProxyType({t: n.name for n in nodes.values() for t in n.outputs if t}),
        consumer_map=MappingProxyType({t: tuple(v) for t, v in consumers.items()}),
    )


def _tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    elem = value.type.tensor_type.elem_type
    dtype = helper.tensor_dtype_to_np_dtype(elem) if elem else np.dtype(np.float32)
    return TensorInfo(name=value.name, shape=_shape_of(value), dtype=np.dtype(dtype))


def _topology(graph: onnx.GraphProto) -> tuple[nx.DiGraph[str], tuple[str, ...]]:
    """The node graph keyed by name, built from node positions (names are unique after
    :func:`mpsearch._normalize.name_nodes`; a duplicate here is a bug, not a cycle)."""
    names = [node.name for node in graph.node]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise ModelError(f"graph '{graph.name}': node name '{duplicate}' is not unique after "
                         "normalization; please report this model")
    producers: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for output in node.output:
            if output:
                producers[output] = index
    digraph: nx.DiGraph[str] = nx.DiGraph()
    for index, node in enumerate(graph.node):
        digraph.add_node(node.name, proto=node, index=index)
    for index, node in enumerate(graph.node):
        for tensor in node.input:
            source = producers.get(tensor)
            if source is not None:
                digraph.add_edge(names[source], names[index], tensor=tensor)
    if not nx.is_directed_acyclic_graph(digraph):
        raise ModelError(f"graph '{graph.name}' has a cycle; ONNX graphs must be acyclic")
    order = nx.lexicographical_topological_sort(digraph, key=lambda n: digraph.nodes[n]["index"])
    return digraph, tuple(order)


def _describe(
    proto: onnx.NodeProto, initializers: Mapping[str, np.ndarray], elem_types: Mapping[str, int]
) -> Node:
    attributes = MappingProxyType(
        {a.name: helper.get_attribute_value(a) for a in proto.attribute
         if a.type != onnx.AttributeProto.GRAPH}
    )
    base = dict(name=proto.name, op_type=proto.op_type, domain=proto.domain,
                inputs=tuple(proto.input), outputs=tuple(proto.output), attributes=attributes)
    table = proto.input[0] if proto.input else ""
    if (proto.op_type in _WEIGHT_ONLY_OPS and proto.domain in ("", "ai.onnx")
            and table in initializers and initializers[table].dtype == np.float32):
        return Node(**base, weights=(table,), quantizable=True,  # type: ignore[arg-type]
                    weight_only=True)
    reason = _not_quantizable_reason(proto, initializers, elem_types)
    if reason:
        return Node(**base, reason=reason)  # type: ignore[arg-type]
    positions = QUANTIZABLE_OPS[proto.op_type]
    data = [t for i, t in enumerate(proto.input) if t and (positions is None or i in positions)]
    weight_positions = _WEIGHT_INPUTS.get(proto.op_type, ())
    weights = tuple(
        t for i, t in enumerate(proto.input)
        if i in weight_positions and t in initializers and initializers[t].dtype == np.float32
    )
    bias_index = _BIAS_INPUT.get(proto.op_type)
    bias = None
    if bias_index is not None and len(proto.input) > bias_index:
        candidate = proto.input[bias_index]
        bias = candidate if candidate in initializers else None
    return Node(
        **base,  # type: ignore[arg-type]
        activation_inputs=tuple(t for t in data if t not in weights),
        weights=weights,
        bias=bias,
        quantizable=True,
    )


def _not_quantizable_reason(
    proto: onnx.NodeProto, initializers: Mapping[str, np.ndarray], elem_types: Mapping[str, int]
) -> str:
    op = proto.op_type
    if op in _CONTROL_FLOW:
        return f"{op} is control flow; its subgraphs stay in float"
    microsoft_gelu = op == "Gelu" and proto.domain == "com.microsoft"
    if proto.domain not in ("", "ai.onnx") and not microsoft_gelu:
        return f"custom domain '{proto.domain}'"
    if op in _DATA_MOVEMENT:
        return f"{op} moves data; it runs at the precision of its input"
    if op not in QUANTIZABLE_OPS:
        return f"{op} has no quantized kernel in the supported runtimes"
    data = proto.input[0] if proto.input else ""
    if elem_types.get(data) not in _FLOAT_TYPES:
        return f"{op} works on non-float tensors (shape computation)"
    if op in ("Conv", "ConvTranspose", "Gemm") and proto.input[1] not in initializers:
        return f"{op} weight '{proto.input[1]}' is not a constant initializer"
    return ""


def _subgraph_nodes(graph: onnx.GraphProto) -> list[Node]:
    found: list[Node] = []
    for node in graph.node:
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                for inner in sub.node:
                    found.append(Node(
                        name=inner.name or f"{node.name}/{inner.op_type}",
                        op_type=inner.op_type, domain=inner.domain, inputs=tuple(inner.input),
                        outputs=tuple(inner.output), attributes=MappingProxyType({}),
                        reason=f"inside the '{attr.name}' subgraph of {node.op_type} "
                               f"'{node.name}'; control-flow bodies stay in float",
                    ))
                found.extend(_subgraph_nodes(sub))
    return found
