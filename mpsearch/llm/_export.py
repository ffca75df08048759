"""Write a float ONNX LLM with its MatMul weights in weight-only formats.

Consumes a float ``ModelProto`` and an assignment ``{weight initializer: format or quantized
weight}``; produces a new ``ModelProto`` where each assigned integer MatMul weight's MatMul is a
``com.microsoft`` ``MatMulNBits`` node (packed ``B``, ``scales``, ``zero_points`` when
asymmetric; attributes ``K``, ``N``, ``bits``, ``block_size``, ``accuracy_level``), each fp16
weight is a float16 initializer behind a ``Cast`` to float (folded once at session load, so the
file halves and the kernels stay fp32), and fp32 weights stay as they are. An embedding table
(the data of a ``Gather``) becomes ``GatherBlockQuantized``; a tied ``lm_head`` (a MatMul by
``Transpose(table)``) becomes a ``MatMulNBits`` that shares the table's packed blocks, which the
gather reads through a ``Reshape``. Every name it adds is fresh: checked against all names of
the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mpsearch._names import Namer
from mpsearch.errors import QuantizationError
from mpsearch.llm._formats import BlockFormat, Quantized
from mpsearch.llm._quant import rtn

__all__ = ["ACCURACY_LEVELS", "export_weight_only", "matmul_nbits_node"]

#: MatMulNBits accuracy_level: the minimum precision of A in the kernel (0 unset, 1 fp32,
#: 2 fp16, 3 bf16, 4 int8)
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
_MS = "com.microsoft"


def matmul_nbits_node(quantized: Quantized, a: str, output: str, names: Iterable[str],
                      *, accuracy_level: int, node_name: str
                      ) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """One MatMulNBits node computing ``a @ W`` for the quantized ``W``; ``names``: the
    initializer names for ``B``, ``scales`` and ``zero_points``, in that order."""
    fmt = quantized.fmt
    tensors = [numpy_helper.from_array(value, name) for name, value
               in zip(names, quantized.packed().values(), strict=False)]
    node = helper.make_node(
        "MatMulNBits", [a, *(t.name for t in tensors)], [output], name=node_name,
        domain=_MS, K=quantized.k, N=quantized.n, bits=fmt.bits, block_size=fmt.block,
        accuracy_level=accuracy_level)
    return node, tensors


def _uses(graph: onnx.GraphProto, inits: Mapping[str, onnx.TensorProto]
          ) -> tuple[set[str], set[str], dict[str, str]]:
    """MatMul weights, Gather tables (axis 0) and ``{Transpose output: table}`` of tied heads."""
    weights = {n.input[1] for n in graph.node
               if n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in inits}
    tables = {n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in inits
              and all(a.i == 0 for a in n.attribute if a.name == "axis")}
    tied = {n.output[0]: n.input[0] for n in graph.node
            if n.op_type == "Transpose" and n.input[0] in tables
            and [list(a.ints) for a in n.attribute if a.name == "perm"] in ([], [[1, 0]])}
    return weights, tables, tied


def _resolve(name: str, choice: BlockFormat | Quantized, weight: np.ndarray
             ) -> BlockFormat | Quantized:
    """A float format, or a quantized ``[K, N]`` weight (RTN for a bare integer format)."""
    if weight.ndim != 2 or weight.dtype != np.float32:
        raise QuantizationError(f"weight '{name}' is {weight.dtype} of shape "
                                f"{list(weight.shape)}; weight-only formats need 2-D fp32")
    if isinstance(choice, Quantized):
        if (choice.k, choice.n) != weight.shape:
            raise QuantizationError(f"quantized weight for '{name}' is {choice.k}x{choice.n} "
                                    f"but the model's is {weight.shape[0]}x{weight.shape[1]}")
        return choice
    return choice if choice.is_float else rtn(weight, choice)


class _Writer:
    """Emits the replacement nodes and initializers of one export."""

    def __init__(self, graph: onnx.GraphProto, accuracy_level: int) -> None:
        self.graph, self.level, self.names = graph, accuracy_level, Namer.of_model(graph)
        self.nodes: list[onnx.NodeProto] = []
        self.packed: dict[str, list[str]] = {}  # weight -> its B, scales, zero_points names
        self.gathers: dict[str, list[str]] = {}  # table -> the Reshape outputs of its blocks

    def node(self, op: str, inputs: list[str], outputs: list[str], base: str,
             **attrs: Any) -> None:
        domain = _MS if op in ("MatMulNBits", "GatherBlockQuantized") else ""
        self.nodes.append(helper.make_node(op, inputs, outputs, name=self.names.fresh(base),
                                           domain=domain, **attrs))

    def const(self, value: np.ndarray, base: str) -> str:
        tensor = numpy_helper.from_array(value, self.names.fresh(base))
        self.graph.initializer.append(tensor)
        return tensor.name

    def half(self, name: str, weight: np.ndarray) -> str:
        """The Cast output standing for ``name`` stored as float16 (emitted once)."""
        if name not in self.packed:
            cast = self.names.fresh(name + "_cast")
            self.node("Cast", [self.const(weight.astype(np.float16), name + "_fp16")], [cast],
                      name + "_Cast", to=onnx.TensorProto.FLOAT)
            self.packed[name] = [cast]
        return self.packed[name][0]

    def blocks(self, name: str, q: Quantized) -> list[str]:
        """The MatMulNBits initializers of ``name`` (emitted once)."""
        if name not in self.packed:
            tags = ("Q" + str(q.fmt.bits), "scales", "zero_points")
            self.packed[name] = [self.const(v, f"{name}_{t}")
                                 for t, v in zip(tags, q.packed().values(), strict=False)]
        return self.packed[name]

    def matmul(self, node: onnx.NodeProto, name: str, q: Quantized) -> None:
        self.node("MatMulNBits", [node.input[0], *self.blocks(name, q)], [node.output[0]],
                  (node.name or name) + "_MatMulNBits", K=q.k, N=q.n, bits=q.fmt.bits,
                  block_size=q.fmt.block, accuracy_level=self.level)

    def gather(self, node: onnx.NodeProto, name: str, q: Quantized) -> None:
        """GatherBlockQuantized over the table's packed blocks, reshaped to rows (and sliced
        back to the table's width when its last block is padded)."""
        if q.fmt.zero == "float":
            raise QuantizationError(f"embedding '{name}': GatherBlockQuantized takes no float "
                                    f"zero points; use {q.fmt.name[:-1]}a or "
                                    f"{q.fmt.name[:-1]}s")
        if name not in self.gathers:
            rows = self.const(np.array([q.n, -1], np.int64), name + "_rows")
            self.gathers[name] = []
            for packed in self.blocks(name, q):
                self.gathers[name].append(self.names.fresh(packed + "_2d"))
                self.node("Reshape", [packed, rows], [self.gathers[name][-1]], packed + "_Reshape")
        padded = q.codes.shape[1] != q.k
        out = self.names.fresh(node.output[0] + "_padded") if padded else node.output[0]
        self.node("GatherBlockQuantized", [self.gathers[name][0], node.input[1],
                                           *self.gathers[name][1:]], [out],
                  (node.name or name) + "_GatherBlockQuantized", bits=q.fmt.bits,
                  block_size=q.fmt.block, gather_axis=0, quantize_axis=1)
        if padded:
            ends = [self.const(np.array([v], np.int64), f"{name}_slice{v}") for v in (0, q.k)]
            axes = self.const(np.array([-1], np.int64), name + "_slice_axis")
            self.node("Slice", [out, *ends, axes], [node.output[0]], name + "_Slice")


def export_weight_only(model: onnx.ModelProto,
                       assignment: Mapping[str, BlockFormat | Quantized],
                       *, accuracy_level: int = 4) -> onnx.ModelProto:
    """A copy of ``model`` with each assigned weight in its format. Keys are MatMul weight
    initializers (``[K, N]``) or embedding tables (``[vocab, d]``, quantized as ``table.T``
    so a tied head shares the blocks); integer formats given as a bare :class:`BlockFormat`
    are quantized by round to nearest."""
    if accuracy_level not in ACCURACY_LEVELS:
        raise QuantizationError(f"accuracy_level {accuracy_level} invalid; use one of "
                                f"{ACCURACY_LEVELS}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    weights, tables, tied = _uses(graph, inits)
    missing = sorted(set(assignment) - weights - tables)
    if missing:
        raise QuantizationError(f"no MatMul or Gather takes initializer(s) {missing} as its "
                                "weight; assign MatMul weights or embedding tables")
    both = sorted(set(assignment) & weights & tables)
    if both:
        raise QuantizationError(f"initializer(s) {both} are both a MatMul weight and a Gather "
                                "table; untie them before exporting")
    resolved = {}
    for name, choice in assignment.items():
        array = numpy_helper.to_array(inits[name])
        oriented = np.ascontiguousarray(array.T) if name in tables else array
        if not (isinstance(choice, BlockFormat) and choice.bits == 32):
            resolved[name] = (_resolve(name, choice, oriented), array)
    writer = _Writer(graph, accuracy_level)
    for node in graph.node:
        _rewrite(writer, node, resolved, tied)
    _drop_unused(graph, set(resolved), writer.nodes)
    if not any(o.domain == _MS for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(_MS, 1))
    return out


def _rewrite(writer: _Writer, node: onnx.NodeProto,
             resolved: Mapping[str, tuple[BlockFormat | Quantized, np.ndarray]],
             tied: Mapping[str, str]) -> None:
    """Emit ``node`` or what replaces it: a node reading an fp16 weight reads its Cast (a tied
    head's Transpose too); a MatMul by an integer weight, or by the Transpose of an integer
    table, becomes MatMulNBits; a Gather of an integer table, GatherBlockQuantized."""
    if any(isinstance(resolved[i][0], BlockFormat) for i in node.input if i in resolved):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for i, name in enumerate(node.input):
            if name in resolved and isinstance(resolved[name][0], BlockFormat):
                copy.input[i] = writer.half(name, resolved[name][1])
        writer.nodes.append(copy)
        return
    if node.op_type == "MatMul" and len(node.input) == 2:
        name = tied.get(node.input[1], node.input[1])
        choice = resolved[name][0] if name in resolved else None
        if isinstance(choice, Quantized):  # (an fp16 table's head reads the Cast's Transpose)
            writer.matmul(node, name, choice)
            return
    if node.op_type == "Gather" and node.input[0] in resolved:
        choice = resolved[node.input[0]][0]
        if isinstance(choice, Quantized):
            writer.gather(node, node.input[0], choice)
            return
    writer.nodes.append(node)


def _drop_unused(graph: onnx.GraphProto, replaced: set[str], nodes: list[onnx.NodeProto]
                 ) -> None:
    """Set ``nodes`` without Transposes nobody reads, and remove the replaced float weights
    no node still reads."""
    read = {i for n in nodes for i in n.input} | {o.name for o in graph.output}
    nodes = [n for n in nodes if not (n.op_type == "Transpose" and n.input[0] in replaced
                                      and n.output[0] not in read)]
    read = {i for n in nodes for i in n.input} | {o.name for o in graph.output}
    gone = replaced - read
    keep = [t for t in graph.initializer if t.name not in gone]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    inputs = [i for i in graph.input if i.name not in gone]
    del graph.input[:]
    graph.input.extend(inputs)
    del graph.node[:]
    graph.node.extend(nodes)
