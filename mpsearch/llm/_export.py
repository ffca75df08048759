"""Write a float ONNX LLM with its MatMul weights in weight-only formats.

Consumes a float ``ModelProto`` and an assignment ``{MatMul weight initializer: format or
quantized weight}``; produces a new ``ModelProto`` where each assigned integer weight's MatMul is
a ``com.microsoft`` ``MatMulNBits`` node (packed ``B``, ``scales``, ``zero_points`` when
asymmetric; attributes ``K``, ``N``, ``bits``, ``block_size``, ``accuracy_level``), each fp16
weight is a float16 initializer behind a ``Cast`` to float (folded once at session load, so the
file halves and the kernels stay fp32), and fp32 weights stay as they are. Every name it adds is
fresh: checked against all names of the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mpsearch.errors import QuantizationError
from mpsearch.llm._formats import BlockFormat, Quantized
from mpsearch.llm._quant import rtn

__all__ = ["ACCURACY_LEVELS", "export_weight_only", "matmul_nbits_node"]

#: MatMulNBits accuracy_level: the minimum precision of A in the kernel (0 unset, 1 fp32,
#: 2 fp16, 3 bf16, 4 int8)
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
_MS = "com.microsoft"


class _Names:
    """Every name of a graph (tensors, nodes, initializers, inputs, outputs); hands out fresh
    ones by appending ``_1``, ``_2``, ... to a base taken."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.taken: set[str] = set()
        for node in graph.node:
            self.taken.update((node.name, *node.input, *node.output))
        for values in (graph.initializer, graph.input, graph.output, graph.value_info):
            self.taken.update(v.name for v in values)

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name


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


def _resolve(name: str, choice: BlockFormat | Quantized, weight: np.ndarray
             ) -> BlockFormat | Quantized:
    """A format to quantize by round to nearest, or a quantized weight checked to fit."""
    if isinstance(choice, Quantized):
        if (choice.k, choice.n) != weight.shape:
            raise QuantizationError(f"quantized weight for '{name}' is {choice.k}x{choice.n} "
                                    f"but the model's is {weight.shape[0]}x{weight.shape[1]}")
        return choice
    return choice if choice.is_float else rtn(weight, choice)


def export_weight_only(model: onnx.ModelProto,
                       assignment: Mapping[str, BlockFormat | Quantized],
                       *, accuracy_level: int = 4) -> onnx.ModelProto:
    """A copy of ``model`` with each assigned MatMul weight in its format (integer formats
    given as a bare :class:`BlockFormat` are quantized by round to nearest)."""
    if accuracy_level not in ACCURACY_LEVELS:
        raise QuantizationError(f"accuracy_level {accuracy_level} invalid; use one of "
                                f"{ACCURACY_LEVELS}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    weights = {n.input[1] for n in graph.node
               if n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in inits}
    missing = sorted(set(assignment) - weights)
    if missing:
        raise QuantizationError(f"no MatMul takes initializer(s) {missing} as its weight; "
                                "assign only MatMul weight initializers")
    names = _Names(graph)
    nodes: list[onnx.NodeProto] = []
    replaced: set[str] = set()
    for node in graph.node:
        is_matmul = node.op_type == "MatMul" and len(node.input) == 2
        choice = assignment.get(node.input[1]) if is_matmul else None
        if choice is None or (isinstance(choice, BlockFormat) and choice.bits == 32):
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(inits[node.input[1]])
        if weight.ndim != 2 or weight.dtype != np.float32:
            raise QuantizationError(f"weight '{node.input[1]}' is {weight.dtype} of shape "
                                    f"{list(weight.shape)}; weight-only formats need 2-D fp32")
        resolved = _resolve(node.input[1], choice, weight)
        base = node.input[1]
        if isinstance(resolved, BlockFormat):  # fp16: float16 initializer, Cast to float
            half = numpy_helper.from_array(weight.astype(np.float16), names.fresh(base + "_fp16"))
            graph.initializer.append(half)
            cast = names.fresh(base + "_cast")
            nodes.append(helper.make_node("Cast", [half.name], [cast], to=onnx.TensorProto.FLOAT,
                                          name=names.fresh((node.name or base) + "_Cast")))
            nodes.append(helper.make_node("MatMul", [node.input[0], cast], list(node.output),
                                          name=node.name))
        else:
            tensor_names = [names.fresh(f"{base}_{s}")
                            for s in ("Q" + str(resolved.fmt.bits), "scales", "zero_points")]
            new, tensors = matmul_nbits_node(
                resolved, node.input[0], node.output[0], tensor_names,
                accuracy_level=accuracy_level,
                node_name=names.fresh((node.name or base) + "_MatMulNBits"))
            graph.initializer.extend(tensors)
            nodes.append(new)
        replaced.add(base)
    _drop_unused(graph, replaced, nodes)
    if not any(o.domain == _MS for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(_MS, 1))
    return out


def _drop_unused(graph: onnx.GraphProto, replaced: set[str], nodes: list[onnx.NodeProto]
                 ) -> None:
    """Set ``nodes`` and remove the replaced float weights no node still reads."""
    still = {i for n in nodes for i in n.input} | {o.name for o in graph.output}
    gone = replaced - still
    keep = [t for t in graph.initializer if t.name not in gone]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    inputs = [i for i in graph.input if i.name not in gone]
    del graph.input[:]
    graph.input.extend(inputs)
    del graph.node[:]
    graph.node.extend(nodes)
